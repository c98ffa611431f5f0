package soft

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

// QP is a soft queue pair: UD, or RC (see rc.go).
type QP struct {
	hca    *HCA
	port   *Port
	num    verbs.QPN
	typ    verbs.QPType
	sendCQ *CQ
	recvCQ *CQ
	sigAll bool
	maxS   int
	maxR   int
	// src, when set, is the QP number this send-only QP's packets carry as their
	// source (verbs.QPAttr.SourceQPN), owner the QP that has it; it receives nothing.
	src   verbs.QPN
	owner *QP
	// shadows are the send-only QPs sending as this one (under hca.mu); closed is set
	// when it is destroyed, after which they cannot be brought up again.
	shadows []*QP
	closed  atomic.Bool

	mu     sync.Mutex
	state  verbs.QPState
	pkeyIx int
	qkey   uint32
	recvQ  []verbs.RecvWR // posted receive buffers, FIFO
	recvH  int            // head index into recvQ
	posted chan struct{}  // signalled by PostRecv and state changes, for awaitRecvLocked
	starve bool           // a wait for buffers ran out: drop at once until the next PostRecv
	psn    uint32

	sendMu  sync.Mutex // serialises PostSend so the scratch buffers can be reused
	scratch []byte
	dgrams  []Datagram
	spans   []udSpan
	comps   []verbs.WC

	rc  *rcConn // RC only
	srq *SRQ    // receive buffers come from here when set (RC only)
}

// CreateQP creates a queue pair in RESET.
func (h *HCA) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	fail := func(err error) (verbs.QP, error) {
		return nil, &verbs.Error{Op: "create_qp", Obj: h.cfg.Name, Err: err}
	}
	if attr.Type != verbs.QPTypeUD && attr.Type != verbs.QPTypeRC {
		return fail(fmt.Errorf("%w: QP type %v not supported yet", verbs.ErrInvalid, attr.Type))
	}
	if attr.Port < 1 || attr.Port > len(h.ports) {
		return fail(verbs.ErrNoPort)
	}
	scq, ok1 := attr.SendCQ.(*CQ)
	rcq, ok2 := attr.RecvCQ.(*CQ)
	if !ok1 || !ok2 || scq == nil || rcq == nil {
		return fail(fmt.Errorf("%w: send and receive CQs must be soft CQs", verbs.ErrInvalid))
	}
	var srq *SRQ
	if attr.SRQ != nil {
		var ok bool
		if srq, ok = attr.SRQ.(*SRQ); !ok || srq == nil || srq.hca != h {
			return fail(fmt.Errorf("%w: the SRQ must belong to this HCA", verbs.ErrInvalid))
		}
		if attr.Type != verbs.QPTypeRC {
			return fail(fmt.Errorf("%w: a shared receive queue on a %v QP is not supported", verbs.ErrInvalid, attr.Type))
		}
		attr.MaxRecvWR = 1 // unused: receives come from the SRQ
	}
	if attr.SourceQPN != 0 {
		if attr.Type != verbs.QPTypeUD {
			return fail(fmt.Errorf("%w: a source QPN on a %v QP", verbs.ErrInvalid, attr.Type))
		}
		attr.MaxRecvWR = 1 // unused: it receives nothing
	}
	if attr.MaxSendWR <= 0 || attr.MaxRecvWR <= 0 || attr.MaxSendWR > 1<<16 || attr.MaxRecvWR > 1<<16 {
		return fail(fmt.Errorf("%w: queue sizes %d/%d", verbs.ErrInvalid, attr.MaxSendWR, attr.MaxRecvWR))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fail(verbs.ErrClosed)
	}
	var owner *QP
	if attr.SourceQPN != 0 {
		// The number must be a receiving UD QP of this port: the packets' answers go
		// to it.
		owner = h.qps[attr.SourceQPN]
		if owner == nil || owner.typ != verbs.QPTypeUD || owner.src != 0 || owner.port != h.ports[attr.Port-1] {
			return fail(fmt.Errorf("%w: source QPN %#x is not a UD QP of port %d", verbs.ErrInvalid, uint32(attr.SourceQPN), attr.Port))
		}
	}
	if srq != nil {
		if err := srq.use(); err != nil {
			return fail(err)
		}
	}
	for h.qps[h.nextQPN] != nil || h.nextQPN < 2 {
		h.nextQPN = (h.nextQPN + 1) & 0xfffffe // never 0xffffff (multicast)
	}
	q := &QP{posted: make(chan struct{}, 1), hca: h, port: h.ports[attr.Port-1], num: h.nextQPN, typ: attr.Type, sendCQ: scq,
		recvCQ: rcq, sigAll: attr.SigAll, maxS: attr.MaxSendWR, maxR: attr.MaxRecvWR, srq: srq, src: attr.SourceQPN, owner: owner}
	if attr.Type == verbs.QPTypeRC {
		q.rc = newRC()
	}
	h.nextQPN++
	h.qps[q.num] = q
	if owner != nil {
		owner.shadows = append(owner.shadows, q)
	}
	return q, nil
}

func (h *HCA) qp(n verbs.QPN) *QP {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.qps[n]
}

func (q *QP) Num() verbs.QPN       { return q.num }
func (q *QP) Type() verbs.QPType   { return q.typ }
func (q *QP) String() string       { return fmt.Sprintf("%s qp %#x", q.port, uint32(q.num)) }
func (q *QP) State() verbs.QPState { q.mu.Lock(); defer q.mu.Unlock(); return q.state }

// receives reports whether a UD QP in state s takes datagrams: a send queue error
// (SQE) or drain (SQD) stops its sends, not its receives.
func receives(s verbs.QPState) bool {
	return s == verbs.QPRTR || s == verbs.QPRTS || s == verbs.QPSQD || s == verbs.QPSQE
}

// Modify applies a state transition with the UD rules: RESET->INIT needs P_Key index
// and Q_Key; INIT->RTR; RTR->RTS; any->ERR or RESET. RC QPs follow rcModify.
func (q *QP) Modify(m verbs.QPModify) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.rc != nil {
		return q.rcModify(m)
	}
	fail := func(format string, a ...any) error {
		return &verbs.Error{Op: "modify_qp", Obj: q.String(), Err: fmt.Errorf("%w: "+format, append([]any{verbs.ErrInvalidState}, a...)...)}
	}
	if m.Mask&verbs.QPMaskPKeyIndex != 0 {
		if m.PKeyIndex < 0 || m.PKeyIndex >= verbs.PKeyTableCapacity {
			return fail("P_Key index %d", m.PKeyIndex)
		}
	}
	next := q.state
	if m.Mask&verbs.QPMaskState != 0 {
		next = m.State
	}
	ok := false
	switch {
	case next == verbs.QPReset || next == verbs.QPErr:
		ok = true
	case q.state == verbs.QPReset && next == verbs.QPInit:
		ok = m.Mask&verbs.QPMaskPKeyIndex != 0 && m.Mask&verbs.QPMaskQKey != 0
		if q.owner != nil && q.owner.closed.Load() {
			return fail("the QP %#x it sends as is destroyed", uint32(q.src))
		}
	case q.state == verbs.QPInit && (next == verbs.QPInit || next == verbs.QPRTR):
		ok = true
	case q.state == verbs.QPRTR && next == verbs.QPRTS:
		ok = true
	case (q.state == verbs.QPRTS || q.state == verbs.QPSQE) && next == verbs.QPRTS:
		// SQE to RTS is how a consumer takes a UD QP out of the send queue error
		// state its failed send put it in (ipoib_qp_state_validate_work).
		ok = true
	}
	if !ok {
		return fail("%v -> %v", q.state, next)
	}
	if m.Mask&verbs.QPMaskPKeyIndex != 0 {
		q.pkeyIx = m.PKeyIndex
	}
	if m.Mask&verbs.QPMaskQKey != 0 {
		q.qkey = m.QKey
	}
	if m.Mask&verbs.QPMaskSQPSN != 0 {
		q.psn = m.SQPSN & 0xffffff
	}
	prev := q.state
	q.state = next
	switch next {
	case verbs.QPErr:
		q.flushLocked()
	case verbs.QPReset:
		q.recvQ, q.recvH = nil, 0
	}
	if !receives(next) {
		q.wakeReceiveLocked() // a receive waiting for buffers gives up now
	}
	_ = prev
	return nil
}

// flushLocked completes every posted receive with a flush error.
func (q *QP) flushLocked() {
	for _, wr := range q.recvQ[q.recvH:] {
		q.recvCQ.push(verbs.WC{WRID: wr.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.num})
	}
	q.recvQ, q.recvH = nil, 0
}

// UD has no flow control: a datagram finding no receive buffer is dropped. The
// software wire, though, hands over bursts of thousands of packets at once (GRO batches)
// where a real link would spread them over time, and the consumer is a goroutine that
// the machine may not run for a while, so before dropping, the receive path waits for
// the consumer to post buffers, leaving the rest of the burst in the socket's buffer:
// up to rqWait per packet. Once such a wait has run out, the QP's consumer counts as
// gone and its datagrams are dropped at once until it posts again (a stalled consumer
// must not stall the port's other QPs for rqWait per packet).
const rqWait = 50 * time.Millisecond

// awaitRecvLocked waits (releasing q.mu) for a receive buffer; reports whether one is
// there. The signals the received batch cb holds back go out first: the wait may be
// long, and other QPs' consumers must not wait with it.
func (q *QP) awaitRecvLocked(cb *cqBatch) bool {
	if q.starve || q.posted == nil {
		return false
	}
	t := time.NewTimer(rqWait)
	defer t.Stop()
	for q.recvH == len(q.recvQ) {
		ch := q.posted
		q.mu.Unlock()
		if cb != nil {
			cb.flush()
		}
		timedOut := false
		select {
		case <-ch:
		case <-t.C:
			timedOut = true
		}
		q.mu.Lock()
		if !receives(q.state) {
			return false
		}
		if timedOut && q.recvH == len(q.recvQ) {
			q.starve = true
			return false
		}
	}
	return true
}

// wakeReceiveLocked tells a receive waiting in awaitRecvLocked to look again (buffers
// were posted, or the QP left RTR/RTS).
func (q *QP) wakeReceiveLocked() {
	if q.posted != nil {
		select {
		case q.posted <- struct{}{}:
		default:
		}
	}
}

// takeRecvLocked takes the next receive buffer: from the shared receive queue when
// the QP has one, else from its own.
func (q *QP) takeRecvLocked() (wr verbs.RecvWR, ok, last bool) {
	if q.srq != nil {
		return q.srq.take()
	}
	if q.recvH == len(q.recvQ) {
		return verbs.RecvWR{}, false, false
	}
	wr = q.recvQ[q.recvH]
	q.recvQ[q.recvH] = verbs.RecvWR{}
	q.recvH++
	return wr, true, q.recvH == len(q.recvQ)
}

// PostRecv queues receive buffers.
func (q *QP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	defer q.wakeReceiveLocked()
	if q.srq != nil {
		return 0, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: fmt.Errorf("%w: the QP receives from a shared receive queue", verbs.ErrInvalid)}
	}
	if q.src != 0 {
		return 0, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: fmt.Errorf("%w: a send-only QP (source QPN %#x) receives nothing", verbs.ErrInvalid, uint32(q.src))}
	}
	if q.state == verbs.QPReset || q.state == verbs.QPErr {
		return 0, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: verbs.ErrInvalidState}
	}
	if q.recvH > 0 && q.recvH == len(q.recvQ) {
		q.recvQ, q.recvH = q.recvQ[:0], 0
	}
	n := 0
	for _, wr := range wrs {
		if len(q.recvQ)-q.recvH >= q.maxR {
			return n, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: verbs.ErrQueueFull}
		}
		q.recvQ = append(q.recvQ, wr)
		q.starve = false
		n++
	}
	return n, nil
}

// PostSend transmits UD sends. Sends to unknown LIDs complete successfully but are
// lost on the fabric, as on real UD; they are counted as port transmit discards.
//
// Each packet is encoded once, in the QP's send buffer: headers, the gather list
// copied in (the only copy of the payload before the socket), pad and ICRC. Nothing
// is allocated per packet, and one destination lookup serves a run of sends with the
// same address handle.
func (q *QP) PostSend(wrs []verbs.SendWR) (int, error) {
	if q.rc != nil {
		return q.rcPostSend(wrs)
	}
	// The state is read under sendMu: a post that waited behind a batch that moved
	// the QP to SQE is flushed, not sent.
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.mu.Lock()
	st, pkeyIx, qkey := q.state, q.pkeyIx, q.qkey
	q.mu.Unlock()
	if st != verbs.QPRTS && st != verbs.QPSQE {
		return 0, &verbs.Error{Op: "post_send", Obj: q.String(), Err: verbs.ErrInvalidState}
	}
	// As on a real HCA, a UD send that fails moves the QP to the send queue error
	// state (IBTA 10.3.1): the sends after it, in this batch and later ones, are
	// flushed until the consumer moves the QP back to RTS. Receives go on.
	sqe := st == verbs.QPSQE
	failed := false // this batch moves the QP to SQE, once it is posted
	p := q.port
	p.mu.RLock()
	var pkey verbs.PKey
	if pkeyIx < len(p.pkeys) {
		pkey = p.pkeys[pkeyIx]
	}
	sgid := p.gid0()
	mtu := p.attr.ActiveMTU.Bytes()
	p.mu.RUnlock()

	// The send buffer takes the whole batch without moving while it is filled.
	need := 0
	for i := range wrs {
		for _, d := range wrs[i].Data {
			need += len(d)
		}
		need += udMaxOverhead
	}
	q.scratch = slices.Grow(q.scratch[:0], need)
	q.dgrams = q.dgrams[:0]
	spans := q.spans[:0]
	comps := q.comps[:0]
	// The destinations of the last address handle resolved: q.dgrams[lastFrom:lastTo].
	var lastAH *AH
	var lastDGID verbs.GID
	lastFrom, lastTo := 0, 0
	var ic wire.ICRCCache // a batch's datagrams mostly go to one peer at one size
	for i := range wrs {
		wr := &wrs[i]
		n := 0
		for _, d := range wr.Data {
			n += len(d)
		}
		status := verbs.WCSuccess
		ah, _ := wr.AH.(*AH)
		switch {
		case sqe:
			status = verbs.WCWRFlushErr
		case ah == nil || ah.attr.Port != p.num:
			status = verbs.WCLocQPOpErr
		case n > mtu:
			status = verbs.WCLocLenErr
		case !pkey.Valid():
			// P_Key index points at an empty entry: the HCA cannot send.
			p.cnt.xmitDisc.Add(1)
		}
		if status == verbs.WCSuccess && pkey.Valid() {
			from := len(q.dgrams)
			var dgid verbs.GID
			var ok bool
			if ah == lastAH {
				q.dgrams = append(q.dgrams, q.dgrams[lastFrom:lastTo]...)
				dgid, ok = lastDGID, true
			} else {
				q.dgrams, dgid, ok = p.resolve(ah.attr.DLID, q.dgrams)
				lastAH, lastDGID, lastFrom, lastTo = ah, dgid, from, len(q.dgrams)
				if !ok {
					lastAH = nil
				}
			}
			if !ok {
				p.cnt.xmitDisc.Add(1)
			} else {
				if ah.attr.GRH && !ah.attr.DLID.IsMulticast() {
					dgid = ah.attr.DGID
				}
				rq := wr.RemoteQKey
				if rq&0x80000000 != 0 {
					rq = qkey // controlled Q_Key: use the QP's own
				}
				q.mu.Lock()
				psn := q.psn
				q.psn = (q.psn + 1) & 0xffffff
				q.mu.Unlock()
				op := uint8(wire.OpUDSendOnly)
				if wr.WithImm {
					op = wire.OpUDSendOnlyImm
				}
				off := len(q.scratch)
				q.scratch = appendUD(q.scratch, op, uint16(pkey), uint32(wr.RemoteQPN), psn, rq, uint32(q.sourceQPN()), wr.Imm,
					wr.Data, n, sgid, dgid, &ic)
				spans = append(spans, udSpan{from, len(q.dgrams), off, len(q.scratch)})
			}
		}
		if status != verbs.WCSuccess && !sqe {
			sqe, failed = true, true
		}
		if status != verbs.WCSuccess || wr.Signaled || q.sigAll {
			comps = append(comps, verbs.WC{WRID: wr.ID, Status: status, Opcode: verbs.WCSend, QPN: q.num, ByteLen: n})
		}
	}
	// Attach the data now, should the buffer have moved after all while it grew.
	var pkts, bytes uint64
	for _, s := range spans {
		for i := s.from; i < s.to; i++ {
			q.dgrams[i].Data = q.scratch[s.off:s.end:s.end]
			pkts++
			bytes += uint64(s.end - s.off)
		}
	}
	q.spans = spans[:0]
	p.cnt.xmitPkts.Add(pkts)
	p.cnt.xmitBytes.Add(bytes)
	q.comps = comps[:0]
	if len(q.dgrams) > 0 {
		if err := p.ep.Send(q.dgrams); err != nil {
			// Nothing posted: neither the completions nor the move to SQE.
			return 0, &verbs.Error{Op: "post_send", Obj: q.String(), Err: err}
		}
	}
	if failed {
		q.mu.Lock()
		if q.state == verbs.QPRTS { // not one a Modify moved meanwhile (to ERR, RESET)
			q.state = verbs.QPSQE
		}
		q.mu.Unlock()
	}
	for _, c := range comps {
		q.sendCQ.push(c)
	}
	return len(wrs), nil
}

// sourceQPN is the QP number the QP's packets carry as their source.
func (q *QP) sourceQPN() verbs.QPN {
	if q.src != 0 {
		return q.src
	}
	return q.num
}

// udSpan says which datagrams carry which bytes of the send buffer.
type udSpan struct{ from, to, off, end int }

// udMaxOverhead is what a UD packet adds to its payload: BTH, DETH, ImmDt, pad, ICRC.
const udMaxOverhead = wire.BTHLen + wire.DETHLen + wire.ImmLen + 3 + wire.ICRCLen

// appendUD appends a UD SEND_ONLY packet (with ImmDt for OpUDSendOnlyImm) carrying the
// n bytes of data to b: the bytes wire.Packet.AppendTo encodes for the same fields
// (SE, MigReq, TVer, FECN, BECN and AckReq clear), the payload gathered in place.
func appendUD(b []byte, op uint8, pkey uint16, dqp, psn, qkey, sqp, imm uint32, data [][]byte, n int, sgid, dgid verbs.GID, ic *wire.ICRCCache) []byte {
	hl := wire.HeaderLen(op)
	pad := wire.PadLen(n)
	start := len(b)
	size := hl + n + pad + wire.ICRCLen
	b = slices.Grow(b, size)[:start+size]
	pkt := b[start:]
	pkt[0] = op
	pkt[1] = uint8(pad) << 4
	binary.BigEndian.PutUint16(pkt[2:], pkey)
	binary.BigEndian.PutUint32(pkt[4:], dqp&wire.MaxQPN)
	binary.BigEndian.PutUint32(pkt[8:], psn&wire.MaxPSN)
	binary.BigEndian.PutUint32(pkt[wire.BTHLen:], qkey)
	binary.BigEndian.PutUint32(pkt[wire.BTHLen+4:], sqp&wire.MaxQPN)
	if op == wire.OpUDSendOnlyImm {
		binary.BigEndian.PutUint32(pkt[wire.BTHLen+wire.DETHLen:], imm)
	}
	off := hl
	for _, d := range data {
		off += copy(pkt[off:], d)
	}
	clear(pkt[off : off+pad])
	binary.LittleEndian.PutUint32(pkt[size-wire.ICRCLen:], ic.ICRC(pkt, sgid, dgid))
	return b
}

// deliver runs the receive checks of one packet for this QP against the port's P_Key
// table pkeys and completes a receive, in the received batch cb. It reports whether
// it waited for a receive buffer.
func (q *QP) deliver(pkt *wire.Packet, src ctlRoute, dgid verbs.GID, pkeys []verbs.PKey, cb *cqBatch) (waited bool) {
	p := q.port
	q.mu.Lock()
	defer q.mu.Unlock()
	if !receives(q.state) || q.rc != nil || q.src != 0 {
		p.cnt.noQP.Add(1) // RC QPs take no datagrams, send-only ones nothing
		return
	}
	for {
		if !q.pkeyAdmitsLocked(pkeys, pkt.BTH.PKey) {
			return
		}
		if pkt.DETH.QKey != q.qkey {
			p.cnt.badQKey.Add(1)
			return
		}
		if q.recvH < len(q.recvQ) {
			break
		}
		waited = true
		if !q.awaitRecvLocked(cb) {
			p.cnt.rcvDrop.Add(1)
			return
		}
		// The wait released q.mu: the consumer may have restarted the QP with another
		// P_Key or Q_Key (its state the wait checked), and the new ring is not for a
		// packet the old ones admitted; the table may have changed too.
		pkeys = q.port.pkeyTable()
	}
	wr, _, last := q.takeRecvLocked() // there is one (UD QPs have no SRQ)
	if last {
		cb = nil // the last buffer: the consumer must hear now, to post more before the next packet waits for one
	}
	wc := verbs.WC{WRID: wr.ID, Opcode: verbs.WCRecv, QPN: q.num, SrcQP: verbs.QPN(pkt.DETH.SrcQP),
		SLID: src.LID, PKeyIndex: q.pkeyIx, GRH: true, WithImm: pkt.BTH.Opcode == wire.OpUDSendOnlyImm, Imm: pkt.Imm}
	need := grhLen + len(pkt.Payload)
	if len(wr.Buf) < need {
		wc.Status = verbs.WCLocLenErr
		q.recvCQ.pushIn(wc, cb)
		return
	}
	writeGRH(wr.Buf, len(pkt.Payload), src.GID, dgid)
	copy(wr.Buf[grhLen:], pkt.Payload)
	wc.ByteLen = need
	q.recvCQ.pushIn(wc, cb)
	return waited
}

// writeGRH fills a 40-byte GRH as a UD receive buffer carries it.
func writeGRH(b []byte, payload int, sgid, dgid verbs.GID) {
	b[0], b[1], b[2], b[3] = 0x60, 0, 0, 0
	b[4], b[5] = byte(payload>>8), byte(payload)
	b[6], b[7] = 0x1b, 0xff // next header: IBA transport; hop limit
	copy(b[8:24], sgid[:])
	copy(b[24:40], dgid[:])
}

// AttachMcast attaches the QP to a multicast group.
func (q *QP) AttachMcast(gid verbs.GID, lid verbs.LID) error {
	if !gid.IsMulticast() || !lid.IsMulticast() || q.rc != nil || q.src != 0 {
		return &verbs.Error{Op: "attach_mcast", Obj: q.String(), Err: fmt.Errorf("%w: %v / %#x", verbs.ErrInvalid, gid, lid)}
	}
	p := q.port
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range p.attached[gid] {
		if o == q {
			return nil
		}
	}
	p.attached[gid] = append(p.attached[gid], q)
	return nil
}

// DetachMcast detaches the QP from a group.
func (q *QP) DetachMcast(gid verbs.GID, lid verbs.LID) error {
	p := q.port
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.attached[gid]
	for i, o := range l {
		if o == q {
			l = append(l[:i], l[i+1:]...)
			if len(l) == 0 {
				delete(p.attached, gid)
			} else {
				p.attached[gid] = l
			}
			return nil
		}
	}
	return &verbs.Error{Op: "detach_mcast", Obj: q.String(), Err: fmt.Errorf("%w: not attached to %v", verbs.ErrInvalid, gid)}
}

// Close destroys the QP.
func (q *QP) Close() error {
	p := q.port
	p.mu.Lock()
	for g, l := range p.attached {
		for i, o := range l {
			if o == q {
				l = append(l[:i], l[i+1:]...)
				break
			}
		}
		if len(l) == 0 {
			delete(p.attached, g)
		} else {
			p.attached[g] = l
		}
	}
	p.mu.Unlock()
	q.closed.Store(true)
	q.hca.mu.Lock()
	live := q.hca.qps[q.num] == q // a second Close must not remove a QP that took the number since
	if live {
		delete(q.hca.qps, q.num)
	}
	shadows := q.shadows
	q.shadows = nil
	if o := q.owner; o != nil {
		o.shadows = slices.DeleteFunc(o.shadows, func(s *QP) bool { return s == q })
	}
	q.hca.mu.Unlock()
	// What sent as this QP stops: its number may go to another QP.
	for _, s := range shadows {
		s.mu.Lock()
		if s.state != verbs.QPReset {
			s.state = verbs.QPErr
		}
		s.mu.Unlock()
	}
	if live && q.srq != nil {
		q.srq.release()
	}
	q.mu.Lock()
	if q.rc != nil {
		q.rcCloseLocked()
	}
	q.state = verbs.QPReset
	q.recvQ, q.recvH = nil, 0
	q.wakeReceiveLocked()
	q.mu.Unlock()
	return nil
}

// ---- completion queue ----

// CQ is a soft completion queue with moderation.
type CQ struct {
	mu       sync.Mutex
	entries  int        // capacity
	ring     []verbs.WC // grows to entries as completions pile up
	head, n  int
	notify   chan struct{}
	count    uint16
	usecs    uint16
	timer    *time.Timer
	overruns atomic.Uint64
	closed   bool
	// handler is verbs.CQAttr.Handler. heldBy is the receive batch whose end the signal
	// waits for (cqBatch.flush), if any.
	handler func() bool
	heldBy  *cqBatch
}

// cqDeferMax is how many completions a CQ with a handler holds back until the end of
// a received batch: a few are the latency case (a ping, a request), taken on the
// receive goroutine at once; more are a stream, signalled as they come so the
// consumer's goroutine works beside the receive loop (and re-posts buffers before
// the ring runs dry: a QP waits rqWait for one).
const cqDeferMax = 16

// cqBatch holds the CQs whose signal a received batch deferred to its end.
type cqBatch struct {
	n   int
	cqs [8]*CQ
}

// flush runs the handlers of the CQs whose signal the batch holds, or signals their
// Notify where the handler declines. Called with no lock held.
func (b *cqBatch) flush() {
	for _, c := range b.cqs[:b.n] {
		c.mu.Lock()
		held := c.heldBy == b
		if held {
			c.heldBy = nil
		}
		run := held && c.n > 0 && !c.closed
		c.mu.Unlock()
		if !run {
			continue
		}
		handled := c.handler()
		c.mu.Lock()
		switch {
		case !handled:
			c.signal()
		case c.n == 0:
			// Moderation's timer, armed before the count was reached: what it would
			// signal has been taken.
			c.stopTimerLocked()
		}
		c.mu.Unlock()
	}
	b.n = 0
}

// cqInitial is a CQ's ring at its first completion: CQs are sized for the worst case
// (every buffer of every connection completed at once) and thousands of interfaces
// each have several, most never used, so memory is taken as completions actually pile
// up (a new CQ has no ring; four of 8 entries were 2.5 KiB per idle child).
const cqInitial = 8

func newCQ(entries int) *CQ {
	return &CQ{entries: entries, notify: make(chan struct{}, 1)}
}

// growLocked doubles the ring (up to entries), keeping the pending completions in order.
func (c *CQ) growLocked() {
	r := make([]verbs.WC, min(max(2*len(c.ring), cqInitial), c.entries))
	for k := 0; k < c.n; k++ {
		r[k] = c.ring[(c.head+k)%len(c.ring)]
	}
	c.ring, c.head = r, 0
}

func (c *CQ) push(wc verbs.WC) { c.pushIn(wc, nil) }

// pushIn adds a completion made while receiving the batch b (nil: elsewhere): a CQ
// with a handler signals at the end of the batch (b.flush) while it holds at most
// cqDeferMax completions.
func (c *CQ) pushIn(wc verbs.WC, b *cqBatch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if c.n == len(c.ring) && len(c.ring) < c.entries {
		c.growLocked()
	}
	if c.n == len(c.ring) {
		c.overruns.Add(1)
		return
	}
	c.ring[(c.head+c.n)%len(c.ring)] = wc
	c.n++
	// The signal waits for count completions or usecs after the first pending one,
	// whichever comes first (verbs.CQ): with usecs 0 that is at once, whatever count
	// says, as drivers treat rx-usecs 0 (a lone completion is never stranded).
	switch {
	case c.usecs == 0, c.count != 0 && c.n >= int(c.count):
		if c.handler != nil && b != nil && c.n <= cqDeferMax && b.hold(c) {
			return
		}
		c.heldBy = nil
		c.signal()
	case c.timer == nil:
		c.timer = time.AfterFunc(time.Duration(c.usecs)*time.Microsecond, func() {
			c.mu.Lock()
			c.timer = nil
			c.signal()
			c.mu.Unlock()
		})
	}
}

// hold defers c's signal to the end of the batch; false if the batch holds as many CQs
// as it can, or another batch holds c's (a CQ shared by QPs of two ports, or a batch
// handed to Port.receive beside the port's own): then c signals now. Called with c.mu
// held.
func (b *cqBatch) hold(c *CQ) bool {
	switch {
	case c.heldBy == b:
		return true
	case c.heldBy != nil, b.n == len(b.cqs):
		return false
	}
	b.cqs[b.n] = c
	b.n++
	c.heldBy = b
	return true
}

func (c *CQ) signal() {
	c.stopTimerLocked()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// stopTimerLocked stops moderation's timer, if armed.
func (c *CQ) stopTimerLocked() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// Poll moves up to len(wc) completions out.
func (c *CQ) Poll(wc []verbs.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := min(len(wc), c.n)
	for i := 0; i < k; i++ {
		wc[i] = c.ring[c.head]
		c.ring[c.head] = verbs.WC{}
		c.head = (c.head + 1) % len(c.ring)
	}
	c.n -= k
	return k
}

// Notify returns the readiness channel.
func (c *CQ) Notify() <-chan struct{} { return c.notify }

// SetModeration sets completion moderation; 0,0 signals every completion.
func (c *CQ) SetModeration(count, usecs uint16) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count, c.usecs = count, usecs
	return nil
}

// Overruns counts completions lost because the CQ was full.
func (c *CQ) Overruns() uint64 { return c.overruns.Load() }

// Close destroys the CQ.
func (c *CQ) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
	}
	return nil
}

// pkeyAdmitsLocked checks a received packet's P_Key against the QP's entry of the
// port's P_Key table pkeys (same partition, at least one full member) and counts a
// violation.
func (q *QP) pkeyAdmitsLocked(pkeys []verbs.PKey, pk uint16) bool {
	var mine verbs.PKey
	if q.pkeyIx < len(pkeys) {
		mine = pkeys[q.pkeyIx]
	}
	if !mine.CanTalk(verbs.PKey(pk)) {
		q.port.cnt.badPKey.Add(1)
		return false
	}
	return true
}
