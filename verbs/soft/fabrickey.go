package soft

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"slices"
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
// MAD. The sequence is the sender's clock in nanoseconds when it sealed the message
// (one more than the last when the clock has not moved past it), so it says when a
// message was made: a receiver that has no state for a sender (it started, or forgot
// the sender) believes only a message sealed within authMaxSkew of its own clock and
// after it started (authBootSlack before, for clocks a little apart), so a message
// captured before a receiver restarted is not believed by it afterwards. For each
// sender a receiver keeps the sequences it accepted in the last authReorder of the
// sender's time, at most authWindow of them: a message is accepted once, in any order
// within that, and nothing older (as IPsec's anti-replay window, in time). A replayed,
// altered, truncated, stripped or misdirected message is dropped and counted, never
// acted on. The key is shared by the whole fabric, like a pre-shared key: it proves a
// message comes from a key holder, not which one.
//
// (The sequence was a counter from the sender's boot time: a receiver that started
// after a sender had run for authMaxSkew refused every message of that sender, and
// one that restarted believed a captured message up to authMaxSkew old.)
const (
	authTrailerLen = 8 + 8 + 8 + authMACLen
	authMACLen     = 16
	authWindow     = 64
	authReorder    = time.Second
	authMaxSkew    = 5 * time.Minute
	authBootSlack  = 2 * time.Second
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
	errAuthSigner = errors.New("signed by another port than the sender's")
	errAuthReplay = errors.New("replayed or too old")
	errAuthStale  = errors.New("first message of a sender outside the clock window")
)

type fabricAuth struct {
	key  []byte
	self verbs.GUID
	seq  atomic.Uint64 // the last sequence sealed
	now  func() time.Time

	mu    sync.Mutex
	peers map[verbs.GUID]*replayWindow
	// floor: a sender without state is believed only above it (this receiver's
	// start less authBootSlack, raised to the last sequence of a sender forgotten).
	floor uint64
}

type replayWindow struct {
	top    uint64   // highest sequence accepted
	floor  uint64   // at or below: refused (the oldest of recent dropped when full)
	recent []uint64 // sequences accepted above top-authReorder, at most authWindow
}

func newFabricAuth(key []byte, self verbs.GUID, now func() time.Time) *fabricAuth {
	if now == nil {
		now = time.Now
	}
	a := &fabricAuth{key: append([]byte(nil), key...), self: self, now: now, peers: map[verbs.GUID]*replayWindow{}}
	start := uint64(now().UnixNano())
	a.seq.Store(start)
	a.floor = start - uint64(authBootSlack)
	return a
}

// next returns the sequence of the next message sealed: the clock, or one more than
// the last when the clock has not passed it.
func (a *fabricAuth) next() uint64 {
	for {
		last := a.seq.Load()
		n := max(last+1, uint64(a.now().UnixNano()))
		if a.seq.CompareAndSwap(last, n) {
			return n
		}
	}
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
	seq := a.next()
	out := make([]byte, len(mad), len(mad)+authTrailerLen)
	copy(out, mad)
	out = binary.BigEndian.AppendUint64(out, uint64(a.self))
	out = binary.BigEndian.AppendUint64(out, uint64(dst))
	out = binary.BigEndian.AppendUint64(out, seq)
	return append(out, a.mac(qp, a.self, dst, seq, mad)...)
}

// open checks a received message for QP qp and returns the MAD without its trailer
// and the port that signed it. forUs says whether a destination GUID names this
// receiver; signer, when not nil, whether the signer may have sent this MAD (the port
// its source address belongs to, the port a hello registers), checked before the
// sequence is recorded, so that a key holder signing as another port cannot move that
// port's replay window.
func (a *fabricAuth) open(b []byte, qp uint8, forUs func(verbs.GUID) bool, signer func(verbs.GUID, []byte) bool) ([]byte, verbs.GUID, error) {
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
	if signer != nil && !signer(src, mad) {
		return nil, 0, errAuthSigner
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
	now := a.now().UnixNano()
	if d := int64(seq) - now; d > int64(authMaxSkew) {
		// Not yet signed, as far as this receiver's clock goes: taken, it would hold
		// the sender's window above every message it really sends.
		return errAuthStale
	}
	w := a.peers[src]
	if w == nil {
		if d := int64(seq) - now; d < -int64(authMaxSkew) || seq <= a.floor {
			return errAuthStale
		}
		if len(a.peers) >= authMaxPeers {
			for g, old := range a.peers {
				// What the forgotten sender sent is not believed again as a first
				// message: nothing at or below its top is.
				a.floor = max(a.floor, old.top)
				delete(a.peers, g)
				break
			}
			if seq <= a.floor {
				return errAuthStale
			}
		}
		a.peers[src] = &replayWindow{top: seq, floor: a.floor, recent: []uint64{seq}}
		return nil
	}
	return w.accept(seq)
}

// accept records seq if the window has not seen it and it is not older than what the
// window keeps.
func (w *replayWindow) accept(seq uint64) error {
	if seq <= w.floor || w.top > uint64(authReorder) && seq <= w.top-uint64(authReorder) {
		return errAuthReplay
	}
	if slices.Contains(w.recent, seq) {
		return errAuthReplay
	}
	if len(w.recent) == authWindow && seq < slices.Min(w.recent) {
		return errAuthReplay // older than all it keeps: refused, the window unchanged
	}
	if seq > w.top {
		w.top = seq
		if w.top > uint64(authReorder) {
			// Out of the time window: refused by the test above from now on.
			cut := w.top - uint64(authReorder)
			w.recent = slices.DeleteFunc(w.recent, func(s uint64) bool { return s <= cut })
		}
	}
	if len(w.recent) == authWindow {
		// Full: the oldest goes, and with it everything at or below it.
		k := 0
		for j, s := range w.recent {
			if s < w.recent[k] {
				k = j
			}
		}
		w.floor = max(w.floor, w.recent[k])
		w.recent = slices.Delete(w.recent, k, k+1)
	}
	w.recent = append(w.recent, seq)
	return nil
}

// guidOf is the port GUID in a port's GID (its interface ID).
func guidOf(g verbs.GID) verbs.GUID { return verbs.GUID(binary.BigEndian.Uint64(g[8:])) }
