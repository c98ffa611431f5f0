package soft

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/wire"
)

// gsiAgent is a port's QP1 general services agent: requests matched to responses by
// TID, handlers per management class, and RMPP for SA answers longer than one MAD in
// both directions, as the kernel's MAD layer does for its clients.
type gsiAgent struct {
	port    *Port
	mu      sync.Mutex
	pending map[uint32]pendingCall
	sending map[rmppKey]chan []byte // RMPP transfers this agent sends, by peer and TID
	tid     atomic.Uint32
	hmu     sync.RWMutex
	handler map[uint8]verbs.MADHandler
}

// pendingCall is a request waiting for its response: where it went and its class,
// which the response must come from and carry (the kernel MAD layer's
// rcv_has_same_gid and class match), so another port cannot answer for the SA.
type pendingCall struct {
	ch    chan []byte
	dlid  verbs.LID
	class uint8
}

type rmppKey struct {
	lid verbs.LID
	tid uint64
}

// RMPP sender timing: an ACK is awaited this long before the window is sent again,
// at most rmppRetries times without progress (the kernel's RMPP uses the response
// time of the MAD; the SA answers here within microseconds, so this only covers loss).
const (
	rmppAckTimeout = 200 * time.Millisecond
	rmppRetries    = 10
	// pendingDepth holds a whole RMPP window of segments arriving for one Call.
	pendingDepth = mad.RMPPWindow + 4
	// maxRMPPSending bounds the transfers an agent sends at once (each a goroutine and
	// its answer): GetTable requests from many peers, or a flood of them, wait for the
	// requesters' retries instead of growing without limit.
	maxRMPPSending = 64
)

// Call sends a request MAD to QP1 at dlid and waits for the matching response. An
// RMPP answer is joined up (ACKed as it arrives) and returned as one long MAD.
func (g *gsiAgent) Call(ctx context.Context, dlid verbs.LID, req []byte, timeout time.Duration, retries int) ([]byte, error) {
	if len(req) < 24 {
		return nil, &verbs.Error{Op: "mad_call", Obj: g.port.String(), Err: fmt.Errorf("%w: MAD of %d bytes", verbs.ErrInvalid, len(req))}
	}
	req = slices.Clone(req)
	// The low 32 bits of the TID identify the request on this agent, as the kernel MAD
	// layer does with its agent bits; the caller's high bits are kept.
	tid := g.tid.Add(1)
	binary.BigEndian.PutUint32(req[12:], tid)
	ch := make(chan []byte, pendingDepth)
	g.mu.Lock()
	g.pending[tid] = pendingCall{ch: ch, dlid: dlid, class: req[1]}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.pending, tid)
		g.mu.Unlock()
	}()
	var rx *mad.Reassembly
	var lastAck []byte
	for try := 0; try <= retries; try++ {
		// A lost request is sent again; in a transfer, the last ACK is (the sender
		// resends the window on its own too).
		resend := req
		if lastAck != nil {
			resend = lastAck
		}
		if err := g.send(dlid, verbs.GSIQPN, resend); err != nil {
			return nil, &verbs.Error{Op: "mad_call", Obj: g.port.String(), Err: err}
		}
		t := time.NewTimer(timeout)
	wait:
		for {
			select {
			case resp := <-ch:
				if mad.RMPPType(resp) != mad.RMPPTypeData {
					t.Stop()
					return resp, nil
				}
				if rx == nil {
					rx = &mad.Reassembly{}
				}
				ack, done, err := rx.Add(resp)
				if err != nil {
					t.Stop()
					return nil, &verbs.Error{Op: "mad_call", Obj: g.port.String(), Err: err}
				}
				if ack != nil {
					lastAck = ack
					_ = g.send(dlid, verbs.GSIQPN, ack)
				}
				if done {
					t.Stop()
					return rx.Long(), nil
				}
				try = 0 // progress: the retry budget is per silence, not per transfer
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
				break wait
			}
		}
	}
	return nil, &verbs.Error{Op: "mad_call", Obj: fmt.Sprintf("%s to LID %#x", g.port, dlid), Err: verbs.ErrTimeout}
}

// send transmits a MAD from QP1 to dqp at dlid.
func (g *gsiAgent) send(dlid verbs.LID, dqp verbs.QPN, mad []byte) error {
	p := g.port
	p.mu.RLock()
	var pkey verbs.PKey = verbs.DefaultPKey
	if len(p.pkeys) > 0 {
		pkey = p.pkeys[0]
	}
	sgid := p.gid0()
	p.mu.RUnlock()
	dst, dgid, ok := p.resolve(dlid, nil)
	if !ok {
		p.cnt.xmitDisc.Add(1)
		return fmt.Errorf("%w: no route to LID %#x", verbs.ErrPortDown, dlid)
	}
	if p.auth != nil && dqp == verbs.GSIQPN {
		mad = p.auth.seal(mad, 1, guidOf(dgid))
	}
	pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(pkey), DestQP: uint32(dqp)},
		DETH: wire.DETH{QKey: verbs.GSIQKey, SrcQP: uint32(verbs.GSIQPN)}, Payload: mad}
	b := pkt.AppendTo(nil, sgid, dgid)
	for i := range dst {
		dst[i].Data = b
	}
	p.cnt.xmitPkts.Add(uint64(len(dst)))
	p.cnt.xmitBytes.Add(uint64(len(b) * len(dst)))
	return p.ep.Send(dst)
}

func (g *gsiAgent) receive(src ctlRoute, srcQP verbs.QPN, m []byte) {
	if len(m) < 24 {
		g.port.cnt.malformed.Add(1)
		return
	}
	if m[3]&mad.MethodResp != 0 { // response
		tid := binary.BigEndian.Uint32(m[12:])
		g.mu.Lock()
		pc, ok := g.pending[tid]
		g.mu.Unlock()
		if ok {
			if pc.class != m[1] || pc.dlid != src.LID && pc.dlid != verbs.LIDPermissive {
				g.port.cnt.malformed.Add(1) // not from where the request went
				return
			}
			select {
			case pc.ch <- slices.Clone(m):
			default: // a duplicate, or more than a window: the sender resends
			}
			return
		}
	}
	if t := mad.RMPPType(m); t != 0 && t != mad.RMPPTypeData {
		// ACK, STOP or ABORT of a transfer this agent sends; never a request for the
		// class handler (an ACK carries the request's method).
		g.mu.Lock()
		ch := g.sending[rmppKey{src.LID, binary.BigEndian.Uint64(m[8:])}]
		g.mu.Unlock()
		if ch != nil {
			select {
			case ch <- slices.Clone(m):
			default:
			}
		}
		return
	}
	g.hmu.RLock()
	h := g.handler[m[1]]
	g.hmu.RUnlock()
	if h == nil {
		return
	}
	resp := h(verbs.MADSource{LID: src.LID, GID: src.GID, QPN: srcQP}, m)
	switch {
	case resp == nil:
	case len(resp) > mad.Size:
		g.sendRMPP(src.LID, srcQP, resp)
	default:
		_ = g.send(src.LID, srcQP, resp)
	}
}

// sendRMPP sends a long answer as an RMPP transfer in the background: the window the
// receiver grants, resent from the last ACKed segment when an ACK does not come.
func (g *gsiAgent) sendRMPP(dlid verbs.LID, dqp verbs.QPN, long []byte) {
	segs, err := mad.SplitRMPP(long)
	if err != nil {
		g.port.cnt.xmitDisc.Add(1)
		return
	}
	key := rmppKey{dlid, binary.BigEndian.Uint64(long[8:])}
	ch := make(chan []byte, pendingDepth)
	g.mu.Lock()
	if g.sending == nil {
		g.sending = map[rmppKey]chan []byte{}
	}
	if _, busy := g.sending[key]; busy {
		g.mu.Unlock()
		return // a resent request while its answer is still on the way
	}
	if len(g.sending) >= maxRMPPSending {
		g.mu.Unlock()
		g.port.cnt.xmitDisc.Add(1)
		return // bounded: the requester's MAD layer asks again after its timeout
	}
	g.sending[key] = ch
	g.mu.Unlock()
	h := g.port.hca
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer func() {
			g.mu.Lock()
			delete(g.sending, key)
			g.mu.Unlock()
		}()
		acked, window, sent := 0, 1, 0 // segments ACKed, allowed, sent (1-based counts)
		t := time.NewTimer(rmppAckTimeout)
		defer t.Stop()
		for silent := 0; silent <= rmppRetries; {
			for ; sent < min(window, len(segs)); sent++ {
				if err := g.send(dlid, dqp, segs[sent]); err != nil {
					return
				}
			}
			t.Reset(rmppAckTimeout)
			select {
			case <-h.stop:
				return
			case a := <-ch:
				last, win, ok := mad.RMPPAckOf(a)
				if !ok {
					return // STOP or ABORT from the receiver
				}
				if int(last) > acked {
					acked, silent = int(last), 0
				}
				if acked >= len(segs) {
					return
				}
				window = max(window, int(win))
				sent = max(sent, acked)
			case <-t.C:
				silent++
				sent = acked // resend the window from the first unACKed segment
			}
		}
	}()
}

// Send sends a MAD from QP1 to dqp at dlid.
func (g *gsiAgent) Send(dlid verbs.LID, dqp verbs.QPN, mad []byte) error {
	if err := g.send(dlid, dqp, mad); err != nil {
		return &verbs.Error{Op: "mad_send", Obj: g.port.String(), Err: err}
	}
	return nil
}

// Register installs the handler of a management class.
func (g *gsiAgent) Register(class uint8, h verbs.MADHandler) {
	g.hmu.Lock()
	defer g.hmu.Unlock()
	if h == nil {
		delete(g.handler, class)
		return
	}
	if g.handler == nil {
		g.handler = map[uint8]verbs.MADHandler{}
	}
	g.handler[class] = h
}
