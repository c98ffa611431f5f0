package soft

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/verbs"
)

// The fabric key authenticates management traffic: every QP0 control message between
// the ports and the subnet manager and every QP1 MAD (SA, CM) carries a trailer after
// the MAD, inside the UD payload (so the ICRC still covers it and tshark still decodes
// the MAD in front of it):
//
//	sender port GUID (8) | destination port GUID (8, 0 = "the subnet manager") |
//	sequence (8) | HMAC-SHA256 truncated to 16 bytes
//
// The MAC covers a domain string, the QP (0 or 1), both GUIDs, the sequence and the
// MAD. The sequence starts at the sender's boot time in nanoseconds and increases by
// one per message, so a restarted sender continues above what receivers saw. A
// receiver keeps, per sender, the highest sequence and a 64-message window below it
// (as IPsec's anti-replay window): a replayed, altered, truncated, stripped or
// misdirected message is dropped and counted, never acted on. A sender a receiver has
// no state for is accepted only if its sequence is within authMaxSkew of the
// receiver's clock. The key is shared by the whole fabric, like a pre-shared key: it
// proves a message comes from a key holder, not which one.
const (
	authTrailerLen = 8 + 8 + 8 + authMACLen
	authMACLen     = 16
	authWindow     = 64
	authMaxSkew    = 5 * time.Minute
	authMaxPeers   = 1 << 14 // senders remembered; more evict an arbitrary one
	authDomain     = "ipoibfs fabric key v1"
	// MinFabricKeyLen is the shortest key accepted.
	MinFabricKeyLen = 16
)

// Reasons a management message is rejected.
var (
	errAuthShort  = errors.New("no fabric-key trailer (stripped or truncated)")
	errAuthMAC    = errors.New("bad MAC (altered, or a different fabric key)")
	errAuthDest   = errors.New("addressed to another port")
	errAuthReplay = errors.New("replayed or too old")
	errAuthStale  = errors.New("first message of a sender outside the clock window")
)

type fabricAuth struct {
	key  []byte
	self verbs.GUID
	seq  atomic.Uint64
	now  func() time.Time

	mu    sync.Mutex
	peers map[verbs.GUID]*replayWindow
}

type replayWindow struct {
	top  uint64 // highest sequence accepted
	seen uint64 // bit k: top-k was accepted
}

func newFabricAuth(key []byte, self verbs.GUID, now func() time.Time) *fabricAuth {
	if now == nil {
		now = time.Now
	}
	a := &fabricAuth{key: append([]byte(nil), key...), self: self, now: now, peers: map[verbs.GUID]*replayWindow{}}
	a.seq.Store(uint64(now().UnixNano()))
	return a
}

func (a *fabricAuth) mac(qp uint8, src, dst verbs.GUID, seq uint64, mad []byte) []byte {
	m := hmac.New(sha256.New, a.key)
	var h [1 + 8 + 8 + 8]byte
	h[0] = qp
	binary.BigEndian.PutUint64(h[1:], uint64(src))
	binary.BigEndian.PutUint64(h[9:], uint64(dst))
	binary.BigEndian.PutUint64(h[17:], seq)
	m.Write([]byte(authDomain))
	m.Write(h[:])
	m.Write(mad)
	return m.Sum(nil)[:authMACLen]
}

// seal returns mad followed by its trailer, for the port dst on QP qp.
func (a *fabricAuth) seal(mad []byte, qp uint8, dst verbs.GUID) []byte {
	seq := a.seq.Add(1)
	out := make([]byte, len(mad), len(mad)+authTrailerLen)
	copy(out, mad)
	out = binary.BigEndian.AppendUint64(out, uint64(a.self))
	out = binary.BigEndian.AppendUint64(out, uint64(dst))
	out = binary.BigEndian.AppendUint64(out, seq)
	return append(out, a.mac(qp, a.self, dst, seq, mad)...)
}

// open checks a received message for QP qp and returns the MAD without its trailer
// and the port that signed it. forUs says whether a destination GUID names this
// receiver.
func (a *fabricAuth) open(b []byte, qp uint8, forUs func(verbs.GUID) bool) ([]byte, verbs.GUID, error) {
	if len(b) < authTrailerLen {
		return nil, 0, errAuthShort
	}
	mad, t := b[:len(b)-authTrailerLen], b[len(b)-authTrailerLen:]
	src := verbs.GUID(binary.BigEndian.Uint64(t))
	dst := verbs.GUID(binary.BigEndian.Uint64(t[8:]))
	seq := binary.BigEndian.Uint64(t[16:])
	if !hmac.Equal(t[24:], a.mac(qp, src, dst, seq, mad)) {
		return nil, 0, errAuthMAC
	}
	if !forUs(dst) {
		return nil, 0, errAuthDest
	}
	if err := a.fresh(src, seq); err != nil {
		return nil, 0, err
	}
	return mad, src, nil
}

// fresh applies the replay window of sender src to seq, recording it when accepted.
func (a *fabricAuth) fresh(src verbs.GUID, seq uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.peers[src]
	if w == nil {
		now := a.now().UnixNano()
		if d := int64(seq) - now; d > int64(authMaxSkew) || d < -int64(authMaxSkew) {
			return errAuthStale
		}
		if len(a.peers) >= authMaxPeers {
			for g := range a.peers {
				delete(a.peers, g)
				break
			}
		}
		a.peers[src] = &replayWindow{top: seq, seen: 1}
		return nil
	}
	switch {
	case seq > w.top:
		shift := seq - w.top
		if shift >= authWindow {
			w.seen = 0
		} else {
			w.seen <<= shift
		}
		w.top, w.seen = seq, w.seen|1
		return nil
	case w.top-seq >= authWindow:
		return errAuthReplay
	default:
		bit := uint64(1) << (w.top - seq)
		if w.seen&bit != 0 {
			return errAuthReplay
		}
		w.seen |= bit
		return nil
	}
}

// guidOf is the port GUID in a port's GID (its interface ID).
func guidOf(g verbs.GID) verbs.GUID { return verbs.GUID(binary.BigEndian.Uint64(g[8:])) }
