package soft

// Reliable Connected queue pairs.
//
// An RC QP is a requester (send queue) and a responder (receive queue) joined to one
// peer QP. The behaviour follows the InfiniBand RC rules as rdma_rxe implements them,
// written from the specification's description, with the additions real HCAs make
// for lossy (RoCE) fabrics so that random loss costs throughput in proportion and the
// transfer stays exact:
//
// Requester. PostSend copies every message into its packets at once: the gather list is
// cut into PathMTU-sized payloads (SEND_FIRST, MIDDLE..., LAST or SEND_ONLY, the _IMM
// forms for immediate data), each packet gets the next 24-bit PSN, and the encoded
// packets (ICRC included) are kept until the peer acknowledges them, so the caller may
// reuse its buffers as soon as PostSend returns and a retransmission costs no encoding.
// Packets leave in batches (one endpoint Send per batch) bounded by a window of at most
// 1024 packets or 4 MiB in flight; messages beyond it wait in the QP. Inside that bound
// the window is adjusted like TCP's congestion window (slow start; back to the
// minimum on an ACK timeout; halved on a go-back, or when more than one packet in 16
// of a window is lost, but at most once per recovery episode, that is until the PSNs
// in flight at the cut are acknowledged), because the emulated fabric drops packets
// where a real InfiniBand link applies credit flow control. A lost packet alone does
// not cut it: selective repeat resends only that packet, and at 2% random loss a
// window halved at every loss would stay at its minimum. The window never falls below
// 32 packets.
//
// AckReq is set on the last packet of every message and on every packet whose PSN is
// 15 mod 16. With a window of at least 32 packets there are therefore always two
// packets asking for an ACK among those in flight, and a window-limited sender does
// not have to wait for a timeout to learn that its packets arrived when one ACK is lost.
//
// An ACK for PSN p acknowledges every packet up to p and completes the messages that
// end there (a completion only when the WR was signalled or the QP signals all; errors
// always). A NAK acknowledges the packets before its PSN. A PSN sequence error NAK
// makes the sender resend the packet it names at once, alone, with AckReq set, and
// twice, since a resend lost again would cost two round trips of waiting and the copy
// costs one packet (selective repeat, as the RoCE HCAs that keep out-of-order packets
// do): the responder kept what followed the gap, and its answer says how far that
// reaches. An ACK past the resent packet, or a NAK for a later gap, lets the sender go
// on; a NAK for the PSN right after what was just resent says a burst was lost (a
// receive queue that overflowed), and the sender resends a run from there up to a
// packet asking for an ACK, at least twice as long as the last; an ACK for the resent
// packets alone (at the end of the received batch) says the responder kept nothing
// after them (a responder without selective repeat, or those packets lost as well),
// and the sender goes back N from the next. The
// responder sends every sequence NAK twice, so the second copy of the NAK acted on is
// ignored (and so is a copy the fabric duplicated in the same batch); a NAK for the
// same PSN after that, once the resend is on the wire, means the resent packet was
// lost too and resends it again. An RNR NAK stops the sender for the delay its timer field encodes, then
// resends from its PSN, at first only up to the next packet that asks for an ACK so that
// a receiver without buffers is probed rather than flooded; RNRRetry 7 retries for
// ever, smaller values count down and, exhausted, complete the WR with
// WCRNRRetryExcErr. A remote invalid request NAK completes the WR with WCRemInvReqErr.
// Each fatal error completes the oldest outstanding WR with its status, flushes the
// rest and moves the QP to ERR.
//
// Timer. One timer per QP serves the ACK timeout, the RNR wait and early
// retransmission. It is not reset on every acknowledgement: progress only records its
// time, and when the timer fires before its deadline it re-arms itself for the rest.
// The local ACK timeout keeps its meaning: a timeout resends from the oldest
// unacknowledged PSN, and RetryCnt timeouts in a row without progress complete the
// oldest WR with WCRetryExcErr. Before it, like the adaptive retransmission of RoCE
// HCAs, the requester retransmits early when nothing has been acknowledged for two
// round trips (smoothed over packets sent once; at least 0.5 ms; before the first
// measurement a quarter of the ACK timeout, at most 2 ms) since the last progress or
// retransmission: it resends the oldest unacknowledged packets up to the next one
// asking for an ACK, without going back (the ACK or NAK they draw says where the
// responder is, and a responder that is only slow gets a few duplicates, not the window
// again), which recovers a lost ACK, NAK or resent packet in a round trip or two. Early
// retransmissions count no retry and do not delay the ACK timeout; each doubles the
// wait for the next, and they stop once that wait reaches the ACK timeout, so a peer
// that is gone still exhausts RetryCnt in the time the specification gives (with a few
// more packets sent than 1 + RetryCnt). There is none with an ACK timeout below 2 ms
// (Timeout 8 or less: short enough itself), nor with Timeout 0 (no ACK timeout).
//
// Responder. Packets are accepted in PSN order and copied straight into the head
// receive buffer; LAST or ONLY completes it. A duplicate (an older PSN) is acknowledged
// again and not delivered. A packet beyond the expected PSN is kept (copied, up to a
// window of 1024 packets past the expected PSN, within the HCA's budget of 64 MiB;
// beyond those it is dropped, and so is everything while an RNR NAK is outstanding,
// since the requester then goes back; kept requests whose gap has not filled for 2 s,
// a requester gone, are dropped then): when the expected one arrives, everything kept
// that follows on from it is accepted with it, and an ACK names the last (sent twice:
// the requester depends on it); if requests beyond were dropped or a kept one lies
// beyond another gap, that gap draws its NAK at once. A gap still open
// at the end of the batch (not one the fabric only made by swapping packets) draws a
// sequence error NAK carrying the expected PSN (sent twice, against its loss, and no
// ACK with it), after which later packets are kept silently until the expected PSN
// arrives, except that when the requester is seen going back (two packets in PSN order
// below the highest PSN since the NAK: early retransmissions, a timeout) while the
// expected PSN is still missing, the resent packet was lost as well and the NAK goes
// out once more. With Timeout 0 (no ACK timeout, so no early retransmission either) a
// requester whose two copies of a resend are both lost waits for ever, as the
// specification has it for any lost packet. A
// FIRST or ONLY without a posted receive buffer draws an RNR NAK (and the same
// silence). A message longer than its buffer, a wrong opcode sequence or a bad payload
// length draws a remote invalid request NAK, completes the receive with an error and
// moves the QP to ERR. ACKs (syndrome 0x1f: no end-to-end credits) carry the MSN and are
// coalesced: one is owed at a packet with AckReq, after every 16 accepted packets and
// for duplicates, and the owed ACK goes out once per received batch, naming the last
// PSN accepted so far, preceded by one for the first packet of the batch that owed it
// when that is an earlier PSN, so that one lost ACK does not stall the requester (not
// when the batch accepted kept packets: an ACK for the packet that filled the gap alone
// would say that nothing after it was kept).

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

const (
	rcMaxMsg       = 1 << 20 // largest message PostSend accepts
	rcWinMaxPkts   = 1024    // packets in flight at most
	rcWinMaxBytes  = 4 << 20 // payload bytes in flight at most
	rcWinMin       = 32      // never below: two packets asking for an ACK in every window
	rcWinInit      = 64      // starting window (slow start grows it)
	rcAckEvery     = 16      // the responder owes an ACK after this many packets
	rcAckReqSpace  = 16      // AckReq on every packet whose PSN is 15 mod 16
	rcMinRNRTimer  = 12      // RNR NAK timer field the responder advertises: 0.64 ms
	rcMinAckTimout = time.Millisecond
	rcMinEarly     = 500 * time.Microsecond // early retransmission never sooner
	rcLossCut      = 16                     // more than 1 in 16 of a window lost: cut it

	synACK      = 0x1f // ACK, no end-to-end credit information
	synRNR      = 0x20 // RNR NAK; the low 5 bits are the timer
	synNAKSeq   = 0x60 // NAK: PSN sequence error
	synNAKInv   = 0x61 // NAK: invalid request
	synNAKAcc   = 0x62 // NAK: remote access error
	synTypeMask = 0x60
)

// rnrDelays maps the 5-bit RNR NAK timer field to its delay in microseconds (0 is the
// longest, 655.36 ms).
var rnrDelays = [32]uint32{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640,
	960, 1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440,
	81920, 122880, 163840, 245760, 327680, 491520}

func rnrDelay(code uint8) time.Duration {
	return time.Duration(rnrDelays[code&0x1f]) * time.Microsecond
}

// ackTimeout is the local ACK timeout of a Timeout attribute: 4.096 µs × 2^Timeout as
// the specification defines it, but never below 1 ms, because the fabric is emulated by
// goroutines and sockets whose scheduling jitter reaches a millisecond on a loaded
// machine, where a smaller timeout would only resend packets that are on their way.
// Timeout 0 means no timeout at all, as in the specification: the requester then waits
// for ever for a lost packet.
func ackTimeout(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	d := time.Duration(4096) << (t & 0x1f) * time.Nanosecond
	return max(d, rcMinAckTimout)
}

// psnAdd returns a+n modulo 2^24.
func psnAdd(a uint32, n int) uint32 { return (a + uint32(n)) & wire.MaxPSN }

// psnDiff returns a-b in 24-bit serial arithmetic, in [-2^23, 2^23).
func psnDiff(a, b uint32) int { return int(int32((a-b)<<8) >> 8) }

// rcMsg is one posted send, encoded.
type rcMsg struct {
	id       uint64
	signaled bool
	length   int
	first    uint32    // PSN of the first packet
	n        int       // packets
	full     int       // encoded size of every packet but the last
	pkts     []byte    // the encoded packets back to back
	pool     *[]byte   // pkts's handle in pktBufPool (nil: not pooled)
	sgid     verbs.GID // the GIDs the ICRCs were computed for
	dgid     verbs.GID
}

func (m *rcMsg) last() uint32 { return psnAdd(m.first, m.n-1) }

func (m *rcMsg) pkt(k int) []byte {
	s := k * m.full
	if k == m.n-1 {
		return m.pkts[s:]
	}
	return m.pkts[s : s+m.full]
}

// fixICRC recomputes the ICRCs for a new pair of GIDs (the route to the peer changed
// since the message was encoded).
func (m *rcMsg) fixICRC(sgid, dgid verbs.GID) {
	for k := range m.n {
		b := m.pkt(k)
		c := wire.ICRC(b, sgid, dgid)
		b[len(b)-4], b[len(b)-3], b[len(b)-2], b[len(b)-1] = byte(c), byte(c>>8), byte(c>>16), byte(c>>24)
	}
	m.sgid, m.dgid = sgid, dgid
}

// rcReq is the requester state; reset on every move to RESET or ERR.
type rcReq struct {
	sq   []*rcMsg // posted, not completed; live from sq[h]
	h    int
	cur  int    // hint: index of the message holding nxt
	end  uint32 // PSN of the next message posted
	una  uint32 // oldest unacknowledged PSN
	nxt  uint32 // next PSN to transmit
	smax uint32 // one past the highest PSN transmitted

	cwnd, ssthresh, cwndAcc int
	recovering              bool   // the window was cut; not again before una passes recover
	recover                 uint32 //
	nakSeen                 bool   // a sequence NAK for nakPSN was acted on (duplicates are ignored)
	nakPSN                  uint32 //
	nakTwin                 bool   // the second copy of the NAK for nakPSN is still to come

	// Selective repeat: a sequence NAK resends the packet it names alone, asking for
	// an ACK, since the responder keeps what followed the gap. The answer says what
	// it kept: an acknowledgement past the resent packet (it kept that much), or an
	// ACK ending at it (it kept nothing after it: go back N from there).
	selOn   bool
	selPSN  uint32
	selEnd  uint32 // the last PSN resent with it (a run after a burst)
	selOwed bool   // the pump has yet to send it
	// A run resent after a burst, until acknowledged: a NAK inside it is the
	// responder's view before the rest of the run arrived.
	runOn  bool
	runEnd uint32
	// Such a NAK is put off, not dropped: if the packet it named is still the
	// oldest unacknowledged at deferAt, it is resent then.
	deferOn  bool
	deferPSN uint32
	deferAt  time.Time
	// Selective resends in the window from lossFrom (lossN of them): beyond
	// rcLossCut of a window the losses are congestion's, and the window is cut.
	lossFrom uint32
	lossN    int

	retryLeft, rnrLeft uint8
	rnrWait            bool // stopped by an RNR NAK until rnrUntil
	rnrUntil           time.Time
	rnrPSN             uint32
	probing            bool // after an RNR wait: send only up to probeEnd until progress
	probeEnd           uint32

	progressAt time.Time // last acknowledgement progress (or start of transmission)

	// Early retransmission: the round trip is measured on packets sent once
	// (smoothed in srtt), and when nothing is acknowledged for two of them the
	// requester resends una..resendEnd without counting a retry.
	srtt      time.Duration
	rttOn     bool // a measurement is running: rttPSN was sent at rttAt
	rttPSN    uint32
	rttAt     time.Time
	retxAt    time.Time // last go-back-N, selective resend or early retransmission
	earlyN    uint8     // early retransmissions since the last progress
	resend    bool      // an early retransmission of una..resendEnd is owed
	resendEnd uint32
}

// rcResp is the responder state.
type rcResp struct {
	epsn       uint32 // expected PSN
	msn        uint32 // messages completed
	nakSent    bool   // a NAK went out for epsn: no other until it arrives (or the requester goes back without it)
	rnrSent    bool   // that NAK was an RNR NAK: the requester goes back N, so nothing is kept
	nakHi      uint32 // highest PSN seen since the NAK
	nakBack    bool   // a PSN below nakHi arrived since: the requester may have gone back
	nakBackPSN uint32 // the last such PSN
	inMsg      bool   // between FIRST and LAST
	wr         verbs.RecvWR
	lastBuf    bool // wr was the last buffer posted (to the QP or its SRQ)
	n          int  // bytes received into wr
	unacked    int  // packets accepted since the last ACK
	ackPending bool
	ackFirst   bool   // an earlier accepted packet of the batch owed the ACK
	ackPSN     uint32 // that packet's PSN and the MSN then
	ackMSN     uint32
	ackTwice   bool     // the batch accepted kept requests: its ACK goes twice
	peer       ctlRoute // where the last accepted request came from

	// Requests that arrived beyond a gap, kept (copied, in PSN order, live from
	// oooH) until the gap fills, so that the requester resends only what was lost;
	// keptAt is when the first of them was kept (they go after rcKeepMax).
	ooo    []oooPkt
	oooH   int
	keptAt time.Time
	// gap: a request beyond epsn arrived and no NAK went out for it yet; the NAK
	// waits for the end of the batch, where a gap the fabric only made by swapping
	// packets has closed again.
	gap   bool
	gapHi uint32
	// dropHi is the highest request beyond a gap that was not kept (window or
	// budget), while dropped: once the gap fills, the gap is there again.
	dropped    bool
	dropHi     uint32
	gapDropped bool // gap is that of dropped requests
}

// oooPkt is a kept request; pkt.Payload is *buf.
type oooPkt struct {
	pkt wire.Packet
	buf *[]byte
}

// Kept requests take their payload buffers from a pool, and the HCA keeps at most
// rcOOOBudget bytes of them: a QP keeps at most a window (rcWinMaxPkts packets past
// the expected PSN), and beyond the budget requests are dropped as a responder
// without selective repeat drops them (the requester then goes back N).
const (
	oooBufCap    = 4096 // the largest path MTU's payload
	rcOOOBudget  = 64 << 20
	rcOOOKeepCap = 256 // kept slots a QP holds on to when none is in use
	// rcKeepMax bounds how long requests stay kept behind a gap that does not fill
	// (a requester gone, a peer's QP destroyed): far beyond any recovery.
	rcKeepMax = 2 * time.Second
)

var oooPool = sync.Pool{New: func() any { b := make([]byte, 0, oooBufCap); return &b }}

// rcStats counts the protocol events of one QP, for tests and diagnostics.
type rcStats struct {
	seqNAKs  uint64 // responder: PSN sequence errors NAKed
	reNAKs   uint64 // responder: NAKs repeated because a resent packet was lost too
	rnrNAKs  uint64 // responder: RNR NAKs (no receive buffer)
	kept     uint64 // responder: requests kept beyond a gap
	notKept  uint64 // responder: requests beyond a gap dropped (window or budget)
	expired  uint64 // responder: kept requests dropped after rcKeepMax
	goBacks  uint64 // requester: go-back-N on a sequence NAK (or a selective resend's ACK)
	selects  uint64 // requester: selective resends of a NAKed packet
	early    uint64 // requester: early retransmissions (no retry counted)
	timeouts uint64 // requester: local ACK timeouts
}

// rcConn is the RC part of a QP, guarded by QP.mu (the pump fields by its protocol).
type rcConn struct {
	// Connection attributes (RTR, RTS).
	dqpn     verbs.QPN
	ah       verbs.AHAttr
	mtu      int
	timeout  uint8
	retryCnt uint8
	rnrRetry uint8
	gen      uint64 // bumped on RESET and ERR

	req  rcReq
	resp rcResp

	ctl  []Datagram // ACKs and NAKs to send at the end of the receive batch
	kick bool       // the requester may send: pump at the end of the receive batch

	timer   clock.Timer
	timerAt time.Time // when the timer fires; zero if it is not armed

	stats rcStats

	// One goroutine at a time transmits (the pump); others leave it a note.
	pumping, pumpAgain bool
	xbatch             []Datagram // the pump's, used outside QP.mu
	// freeing holds the encoded packets of messages acknowledged while the pump was
	// sending: its batch may still point into them; they go back to the pool when it
	// has sent it.
	freeing []*[]byte
	rsv     []Datagram // resolve scratch
}

func newRC() *rcConn { return &rcConn{} }

// winMax is the largest window for the path MTU.
func (rc *rcConn) winMax() int { return max(rcWinMin, min(rcWinMaxPkts, rcWinMaxBytes/max(rc.mtu, 1))) }

func (q *QP) rcFail(op string, err error, format string, a ...any) error {
	return &verbs.Error{Op: op, Obj: q.String(), Err: fmt.Errorf("%w: "+format, append([]any{err}, a...)...)}
}

// ---- state transitions ----

// The attribute groups of the RC transitions.
const (
	rcInitAttrs = verbs.QPMaskPKeyIndex | verbs.QPMaskQKey
	rcRTRAttrs  = verbs.QPMaskDestQPN | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskRQPSN
	rcRTSAttrs  = verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry
)

// rcTransition is a modify_qp transition an RC QP allows: the attributes it needs and
// those it accepts.
type rcTransition struct{ required, allowed verbs.QPMask }

// rcTransitions are the transitions between the working states. Any state may also
// move to RESET or ERR, with any attributes (ignored).
var rcTransitions = map[[2]verbs.QPState]rcTransition{
	{verbs.QPReset, verbs.QPInit}: {required: verbs.QPMaskPKeyIndex, allowed: rcInitAttrs},
	{verbs.QPInit, verbs.QPInit}:  {allowed: rcInitAttrs},
	{verbs.QPInit, verbs.QPRTR}:   {required: rcRTRAttrs, allowed: rcRTRAttrs | rcInitAttrs},
	{verbs.QPRTR, verbs.QPRTS}:    {required: rcRTSAttrs, allowed: rcRTSAttrs},
	{verbs.QPRTS, verbs.QPRTS}:    {allowed: verbs.QPMaskTimeout | verbs.QPMaskRetry},
}

// rcAttr is one attribute modify_qp sets on an RC QP: how its value is checked (nil:
// any value will do) and how it is applied.
type rcAttr struct {
	mask  verbs.QPMask
	check func(q *QP, m *verbs.QPModify) error
	apply func(q *QP, m *verbs.QPModify)
}

// rcAttrs are checked all before any is applied, each in this order.
var rcAttrs = []rcAttr{
	{verbs.QPMaskPKeyIndex, rcCheckPKeyIndex, func(q *QP, m *verbs.QPModify) { q.pkeyIx = m.PKeyIndex }},
	{verbs.QPMaskQKey, nil, func(q *QP, m *verbs.QPModify) { q.qkey = m.QKey }}, // not used by RC
	{verbs.QPMaskDestQPN, rcCheckDestQPN, func(q *QP, m *verbs.QPModify) { q.rc.dqpn = m.DestQPN }},
	{verbs.QPMaskAH, rcCheckAH, rcApplyAH},
	{verbs.QPMaskPathMTU, rcCheckPathMTU, func(q *QP, m *verbs.QPModify) { q.rc.mtu = m.PathMTU.Bytes() }},
	{verbs.QPMaskRQPSN, nil, func(q *QP, m *verbs.QPModify) { q.rcDropKeptLocked(); q.rc.resp = rcResp{epsn: m.RQPSN & wire.MaxPSN} }},
	{verbs.QPMaskTimeout, rcCheckTimeout, func(q *QP, m *verbs.QPModify) { q.rc.timeout = m.Timeout }},
	{verbs.QPMaskRetry, rcCheckRetry, rcApplyRetry},
	{verbs.QPMaskSQPSN, nil, rcApplySQPSN},
}

// rcModify applies a state transition with the RC rules. Called with q.mu held.
func (q *QP) rcModify(m verbs.QPModify) error {
	next := q.state
	if m.Mask&verbs.QPMaskState != 0 {
		next = m.State
	}
	attrs := m.Mask &^ verbs.QPMaskState
	switch next {
	case verbs.QPReset:
		q.rcResetLocked()
		q.state = verbs.QPReset
		return nil
	case verbs.QPErr:
		q.rcErrorLocked()
		return nil
	}
	tr, ok := rcTransitions[[2]verbs.QPState{q.state, next}]
	if !ok {
		return q.rcFail("modify_qp", verbs.ErrInvalidState, "%v -> %v", q.state, next)
	}
	if attrs&tr.required != tr.required || attrs&^tr.allowed != 0 {
		return q.rcFail("modify_qp", verbs.ErrInvalidState, "%v -> %v with attribute mask %#x (required %#x, allowed %#x)",
			q.state, next, uint32(attrs), uint32(tr.required), uint32(tr.allowed))
	}
	for _, a := range rcAttrs {
		if attrs&a.mask != 0 && a.check != nil {
			if err := a.check(q, &m); err != nil {
				return err
			}
		}
	}
	for _, a := range rcAttrs {
		if attrs&a.mask != 0 {
			a.apply(q, &m)
		}
	}
	q.state = next
	return nil
}

func (q *QP) rcBadAttr(format string, a ...any) error {
	return q.rcFail("modify_qp", verbs.ErrInvalid, format, a...)
}

func rcCheckPKeyIndex(q *QP, m *verbs.QPModify) error {
	if m.PKeyIndex < 0 || m.PKeyIndex >= verbs.PKeyTableCapacity {
		return q.rcBadAttr("P_Key index %d", m.PKeyIndex)
	}
	return nil
}

func rcCheckDestQPN(q *QP, m *verbs.QPModify) error {
	if m.DestQPN <= verbs.GSIQPN || m.DestQPN >= verbs.MulticastQPN {
		return q.rcBadAttr("destination QPN %#x", uint32(m.DestQPN))
	}
	return nil
}

func rcCheckAH(q *QP, m *verbs.QPModify) error {
	if m.AH.DLID == verbs.LIDReserved || m.AH.DLID.IsMulticast() {
		return q.rcBadAttr("DLID %#x", m.AH.DLID)
	}
	if m.AH.Port != 0 && m.AH.Port != q.port.num {
		return q.rcBadAttr("address handle for port %d on a QP of port %d", m.AH.Port, q.port.num)
	}
	return nil
}

func rcCheckPathMTU(q *QP, m *verbs.QPModify) error {
	q.port.mu.RLock()
	maxMTU := q.port.attr.MaxMTU
	q.port.mu.RUnlock()
	if m.PathMTU.Bytes() == 0 || m.PathMTU > maxMTU {
		return q.rcBadAttr("path MTU %d (port maximum %d)", m.PathMTU, maxMTU)
	}
	return nil
}

func rcCheckTimeout(q *QP, m *verbs.QPModify) error {
	if m.Timeout > 31 {
		return q.rcBadAttr("timeout %d", m.Timeout)
	}
	return nil
}

func rcCheckRetry(q *QP, m *verbs.QPModify) error {
	if m.RetryCnt > 7 || m.RNRRetry > 7 {
		return q.rcBadAttr("retry count %d, RNR retry %d", m.RetryCnt, m.RNRRetry)
	}
	return nil
}

// rcApplyAH connects the QP to the address handle's port, always through the QP's own.
func rcApplyAH(q *QP, m *verbs.QPModify) {
	q.rc.ah = m.AH
	q.rc.ah.Port = q.port.num
}

func rcApplyRetry(q *QP, m *verbs.QPModify) {
	rc := q.rc
	rc.retryCnt, rc.rnrRetry = m.RetryCnt, m.RNRRetry
	rc.req.retryLeft, rc.req.rnrLeft = m.RetryCnt, m.RNRRetry
}

// rcApplySQPSN starts the requester at the send PSN, with the initial window.
func rcApplySQPSN(q *QP, m *verbs.QPModify) {
	rc := q.rc
	psn := m.SQPSN & wire.MaxPSN
	r := &rc.req
	r.end, r.una, r.nxt, r.smax = psn, psn, psn, psn
	r.cwnd, r.ssthresh = min(rcWinInit, rc.winMax()), rc.winMax()
}

// rcResetLocked forgets everything, posted work requests included, without completions.
func (q *QP) rcResetLocked() {
	rc := q.rc
	rc.stopTimerLocked()
	rc.gen++
	rc.req = rcReq{}
	q.rcDropKeptLocked()
	rc.resp = rcResp{}
	rc.ctl, rc.kick = nil, false
	rc.dqpn, rc.ah, rc.mtu, rc.timeout, rc.retryCnt, rc.rnrRetry = 0, verbs.AHAttr{}, 0, 0, 0, 0
	q.recvQ, q.recvH = nil, 0
}

// rcErrorLocked moves the QP to ERR: every outstanding send and receive completes with
// a flush error.
func (q *QP) rcErrorLocked() {
	rc := q.rc
	rc.stopTimerLocked()
	rc.gen++
	r := &rc.req
	for _, m := range r.sq[r.h:] {
		q.sendCQ.push(verbs.WC{WRID: m.id, Status: verbs.WCWRFlushErr, Opcode: verbs.WCSend, QPN: q.num})
	}
	end := r.end
	*r = rcReq{end: end, una: end, nxt: end, smax: end}
	if rc.resp.inMsg {
		q.recvCQ.push(verbs.WC{WRID: rc.resp.wr.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.num})
	}
	rc.resp.inMsg, rc.resp.wr, rc.resp.ackPending, rc.resp.ackFirst = false, verbs.RecvWR{}, false, false
	q.rcDropKeptLocked()
	q.state = verbs.QPErr
	q.flushLocked()
}

// rcFailLocked ends the connection after a fatal requester error: the oldest
// outstanding WR completes with status, the others are flushed.
func (q *QP) rcFailLocked(status verbs.WCStatus) {
	r := &q.rc.req
	if r.h < len(r.sq) {
		m := r.sq[r.h]
		q.sendCQ.push(verbs.WC{WRID: m.id, Status: status, Opcode: verbs.WCSend, QPN: q.num})
		r.sq[r.h] = nil
		r.h++
	}
	q.rcErrorLocked()
}

// rcClose stops the timer of a destroyed QP.
func (q *QP) rcCloseLocked() {
	q.rc.stopTimerLocked()
	q.rc.gen++
	q.rc.req = rcReq{}
	q.rcDropKeptLocked()
	q.rc.resp = rcResp{}
}

// ---- requester: posting ----

// gatherer cuts a gather list into consecutive pieces without copying when a piece
// lies inside one segment.
type gatherer struct {
	segs    [][]byte
	scratch []byte
}

func (g *gatherer) next(n int) []byte {
	for len(g.segs) > 0 && len(g.segs[0]) == 0 {
		g.segs = g.segs[1:]
	}
	if n == 0 {
		return nil
	}
	if len(g.segs[0]) >= n {
		b := g.segs[0][:n:n]
		g.segs[0] = g.segs[0][n:]
		return b
	}
	g.scratch = g.scratch[:0]
	for len(g.scratch) < n {
		s := g.segs[0]
		k := min(len(s), n-len(g.scratch))
		g.scratch = append(g.scratch, s[:k]...)
		g.segs[0] = s[k:]
		if len(g.segs[0]) == 0 {
			g.segs = g.segs[1:]
		}
	}
	return g.scratch
}

// rcPostSend queues RC sends. Each message is encoded into its packets here, so the
// caller's buffers are free again when PostSend returns.
func (q *QP) rcPostSend(wrs []verbs.SendWR) (int, error) {
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.mu.Lock()
	rc := q.rc
	switch q.state {
	case verbs.QPRTS:
	case verbs.QPErr:
		// A QP in ERR accepts work requests and flushes them.
		for _, wr := range wrs {
			q.sendCQ.push(verbs.WC{WRID: wr.ID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCSend, QPN: q.num})
		}
		q.mu.Unlock()
		return len(wrs), nil
	default:
		st := q.state
		q.mu.Unlock()
		return 0, q.rcFail("post_send", verbs.ErrInvalidState, "QP in %v", st)
	}
	room := q.maxS - (len(rc.req.sq) - rc.req.h)
	gen, psn, mtu, pkeyIx, dlid, dqpn := rc.gen, rc.req.end, rc.mtu, q.pkeyIx, rc.ah.DLID, rc.dqpn
	q.mu.Unlock()

	p := q.port
	p.mu.RLock()
	var pkey verbs.PKey
	if pkeyIx < len(p.pkeys) {
		pkey = p.pkeys[pkeyIx]
	}
	sgid := p.gid0()
	p.mu.RUnlock()
	var dgid verbs.GID
	q.dgrams, dgid, _ = p.resolve(dlid, q.dgrams[:0])

	var err error
	msgs := make([]*rcMsg, 0, min(len(wrs), max(room, 0)))
	var g gatherer
	g.scratch = q.scratch
	for i := range wrs {
		wr := &wrs[i]
		if i >= room {
			err = q.rcFail("post_send", verbs.ErrQueueFull, "%d work requests outstanding", q.maxS)
			break
		}
		n := 0
		for _, d := range wr.Data {
			n += len(d)
		}
		if n > rcMaxMsg {
			err = q.rcFail("post_send", verbs.ErrInvalid, "message of %d bytes exceeds %d", n, rcMaxMsg)
			break
		}
		g.segs = append(g.segs[:0], wr.Data...)
		m := encodeRC(wr, n, psn, mtu, pkey, dqpn, sgid, dgid, &g)
		psn = psnAdd(psn, m.n)
		msgs = append(msgs, m)
	}
	q.scratch = g.scratch
	clear(g.segs)

	q.mu.Lock()
	if rc.gen != gen || q.state != verbs.QPRTS {
		// A transition overtook us: ERR flushes these too, RESET forgets them.
		if q.state == verbs.QPErr {
			for _, m := range msgs {
				q.sendCQ.push(verbs.WC{WRID: m.id, Status: verbs.WCWRFlushErr, Opcode: verbs.WCSend, QPN: q.num})
			}
		}
		q.mu.Unlock()
		return len(msgs), err
	}
	r := &rc.req
	if r.h > 64 && r.h*2 > len(r.sq) {
		k := copy(r.sq, r.sq[r.h:])
		clear(r.sq[k:])
		r.sq = r.sq[:k]
		r.cur = max(r.cur-r.h, 0)
		r.h = 0
	}
	r.sq = append(r.sq, msgs...)
	r.end = psn
	q.mu.Unlock()
	q.rcPump()
	return len(msgs), err
}

// Encoded messages of connected mode (up to 64 KiB of IP packet, 16 packets of 4 KiB)
// take their buffer from a pool and give it back when acknowledged: a fresh 66 KiB
// buffer per message, zeroed and then collected, was 15-20% of the sending daemon's
// CPU in netbench's connected-mode profile (makeslice, memclr and the GC's scan).
// Smaller messages allocate as before.
const (
	pktBufMin = 32 << 10 // smaller messages would hold a buffer twice their size or more
	pktBufCap = 68 << 10 // a 65520-byte message in 4096-byte packets, with headers
)

// pktBufPool holds *[]byte of capacity pktBufCap; the pointer travels with the
// buffer (rcMsg.pool), so giving one back allocates nothing.
var pktBufPool = sync.Pool{New: func() any { b := make([]byte, 0, pktBufCap); return &b }}

// getPktBuf returns an empty buffer of at least size bytes' capacity, and its pool
// handle (nil if it was allocated for the message alone).
func getPktBuf(size int) ([]byte, *[]byte) {
	if size < pktBufMin || size > pktBufCap {
		return make([]byte, 0, size), nil
	}
	h := pktBufPool.Get().(*[]byte)
	return (*h)[:0], h
}

// putPktBuf gives a pooled buffer back. The caller guarantees nothing refers to it
// any more.
func putPktBuf(h *[]byte) {
	if h != nil {
		pktBufPool.Put(h)
	}
}

// rcFreeLocked gives back an acknowledged message's buffer, or holds it until the
// pump has sent its batch.
func (rc *rcConn) rcFreeLocked(m *rcMsg) {
	if m.pool == nil {
		return
	}
	if rc.pumping {
		rc.freeing = append(rc.freeing, m.pool)
	} else {
		putPktBuf(m.pool)
	}
	m.pkts, m.pool = nil, nil
}

// encodeRC builds the packets of one message starting at PSN first.
func encodeRC(wr *verbs.SendWR, n int, first uint32, mtu int, pkey verbs.PKey, dqpn verbs.QPN, sgid, dgid verbs.GID, g *gatherer) *rcMsg {
	np := max(1, (n+mtu-1)/mtu)
	full := wire.BTHLen + mtu + wire.ICRCLen
	lastPay := n - (np-1)*mtu
	lastLen := wire.BTHLen + lastPay + wire.PadLen(lastPay) + wire.ICRCLen
	if wr.WithImm {
		lastLen += wire.ImmLen
	}
	m := &rcMsg{id: wr.ID, signaled: wr.Signaled, length: n, first: first, n: np, full: full,
		sgid: sgid, dgid: dgid}
	m.pkts, m.pool = getPktBuf((np-1)*full + lastLen)
	var pkt wire.Packet
	var ic wire.ICRCCache // the full packets share their pseudo header's prefix
	pkt.BTH.PKey = uint16(pkey)
	pkt.BTH.DestQP = uint32(dqpn)
	for k := range np {
		last := k == np-1
		switch {
		case np == 1 && wr.WithImm:
			pkt.BTH.Opcode = wire.OpRCSendOnlyImm
		case np == 1:
			pkt.BTH.Opcode = wire.OpRCSendOnly
		case k == 0:
			pkt.BTH.Opcode = wire.OpRCSendFirst
		case last && wr.WithImm:
			pkt.BTH.Opcode = wire.OpRCSendLastImm
		case last:
			pkt.BTH.Opcode = wire.OpRCSendLast
		default:
			pkt.BTH.Opcode = wire.OpRCSendMiddle
		}
		psn := psnAdd(first, k)
		pkt.BTH.PSN = psn
		pkt.BTH.AckReq = last || psn%rcAckReqSpace == rcAckReqSpace-1
		pkt.Imm = 0
		if last {
			pkt.Imm = wr.Imm
			pkt.Payload = g.next(lastPay)
		} else {
			pkt.Payload = g.next(mtu)
		}
		m.pkts = pkt.AppendToCached(m.pkts, sgid, dgid, &ic)
	}
	return m
}

// ---- requester: transmission ----

// rcPump transmits whatever the window allows. Only one goroutine transmits at a time,
// so packets leave in PSN order; a caller that finds the pump busy leaves it a note and
// returns at once.
func (q *QP) rcPump() {
	q.mu.Lock()
	rc := q.rc
	if rc.pumping {
		rc.pumpAgain = true
		q.mu.Unlock()
		return
	}
	rc.pumping = true
	p := q.port
	for {
		rc.pumpAgain = false
		batch := q.rcCollectLocked(rc.xbatch[:0])
		rc.xbatch = batch
		if len(batch) == 0 && !rc.pumpAgain {
			rc.pumping = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		if len(batch) > 0 {
			var bytes uint64
			for _, d := range batch {
				bytes += uint64(len(d.Data))
			}
			p.cnt.xmitPkts.Add(uint64(len(batch)))
			p.cnt.xmitBytes.Add(bytes)
			_ = p.ep.Send(batch) // a failed send is a lost packet: the timer recovers
			clear(batch)
		}
		q.mu.Lock()
		for i, b := range rc.freeing { // the batch is sent: nothing points into them
			putPktBuf(b)
			rc.freeing[i] = nil
		}
		rc.freeing = rc.freeing[:0]
	}
}

// rcCollectLocked appends the packets to transmit to dst: an early retransmission
// owed, then what the window allows from nxt, which it advances.
func (q *QP) rcCollectLocked(dst []Datagram) []Datagram {
	rc := q.rc
	r := &rc.req
	if q.state != verbs.QPRTS || r.rnrWait {
		return dst
	}
	limit := 0
	if psnDiff(r.nxt, r.end) < 0 {
		limit = min(r.cwnd-psnDiff(r.nxt, r.una), psnDiff(r.end, r.nxt))
		if r.probing {
			limit = min(limit, psnDiff(r.probeEnd, r.nxt)+1)
		}
	}
	resend := 0
	if r.resend {
		r.resend = false
		resend = min(psnDiff(r.resendEnd, r.una)+1, psnDiff(r.smax, r.una))
	}
	sel := r.selOwed && psnDiff(r.selPSN, r.una) >= 0 && psnDiff(r.selPSN, r.smax) < 0
	r.selOwed = false
	if limit <= 0 && resend <= 0 && !sel {
		return dst
	}
	p := q.port
	var dgid verbs.GID
	var ok bool
	rc.rsv, dgid, ok = p.resolve(rc.ah.DLID, rc.rsv[:0])
	var addr netip.AddrPort
	if ok {
		addr = rc.rsv[0].Addr
	}
	p.mu.RLock()
	sgid := p.gid0()
	p.mu.RUnlock()
	now := q.hca.cfg.Clock.Now()
	if psnDiff(r.una, r.smax) == 0 {
		r.progressAt = now // nothing was outstanding: the ACK timeout starts now
	}
	sent := 0
	if sel {
		// Twice: a resend lost again costs an early retransmission's wait
		// (two round trips at least), the copy only its packet.
		if ok {
			b := r.ackReqCopy(r.selPSN, sgid, dgid)
			dst = append(dst, Datagram{Addr: addr, Data: b}, Datagram{Addr: addr, Data: b})
		}
		sent += 2
	}
	if resend > 0 {
		dst, _ = r.appendPkts(dst, r.h, r.una, resend, addr, ok, sgid, dgid)
		sent += resend
	}
	if limit > 0 {
		if !r.rttOn && psnDiff(r.nxt, r.smax) >= 0 {
			// Time the first packet sent for the first time: the earliest is the
			// likeliest to be acknowledged before a go-back makes the sample moot.
			r.rttOn, r.rttPSN, r.rttAt = true, r.nxt, now
		}
		dst, r.cur = r.appendPkts(dst, max(r.cur, r.h), r.nxt, limit, addr, ok, sgid, dgid)
		r.nxt = psnAdd(r.nxt, limit)
		sent += limit
		if psnDiff(r.nxt, r.smax) > 0 {
			r.smax = r.nxt
		}
	}
	if !ok {
		// No route to the peer: the packets are lost on the fabric, as UD's are.
		p.cnt.xmitDisc.Add(uint64(sent))
	}
	q.rcArmLocked(now)
	return dst
}

// appendPkts appends the n packets from psn on, the first in r.sq[i] or a later
// message, addressed to addr (if send; otherwise they only count as sent), and
// returns the message index of the last.
func (r *rcReq) appendPkts(dst []Datagram, i int, psn uint32, n int, addr netip.AddrPort, send bool, sgid, dgid verbs.GID) ([]Datagram, int) {
	for n > 0 {
		for psnDiff(psn, r.sq[i].last()) > 0 {
			i++
		}
		m := r.sq[i]
		k := psnDiff(psn, m.first)
		cnt := min(n, m.n-k)
		if send {
			if m.dgid != dgid || m.sgid != sgid {
				m.fixICRC(sgid, dgid)
			}
			for j := k; j < k+cnt; j++ {
				dst = append(dst, Datagram{Addr: addr, Data: m.pkt(j)})
			}
		}
		psn = psnAdd(psn, cnt)
		n -= cnt
	}
	return dst, i
}

// ackReqCopy returns a copy of the sent packet psn that asks for an ACK, so that any
// responder answers its selective resend.
func (r *rcReq) ackReqCopy(psn uint32, sgid, dgid verbs.GID) []byte {
	i := r.h
	for psnDiff(psn, r.sq[i].last()) > 0 {
		i++
	}
	m := r.sq[i]
	b := append([]byte(nil), m.pkt(psnDiff(psn, m.first))...)
	b[8] |= 0x80 // BTH AckReq
	c := wire.ICRC(b, sgid, dgid)
	b[len(b)-4], b[len(b)-3], b[len(b)-2], b[len(b)-1] = byte(c), byte(c>>8), byte(c>>16), byte(c>>24)
	return b
}

// ---- timer ----

func (rc *rcConn) stopTimerLocked() {
	if rc.timer != nil {
		rc.timer.Stop()
	}
	rc.timerAt = time.Time{}
}

// rcArmLocked makes sure the timer fires no later than the next deadline: the end of
// an RNR wait, the ACK timeout counted from the last progress (or the early
// retransmission before it), or the end of the responder's keeping.
func (q *QP) rcArmLocked(now time.Time) {
	rc := q.rc
	r := &rc.req
	var want time.Time
	switch {
	case r.rnrWait:
		want = r.rnrUntil
	case psnDiff(r.una, r.smax) < 0:
		if rto := ackTimeout(rc.timeout); rto != 0 {
			want = r.progressAt.Add(rto)
			if e, ok := r.earlyAt(rto); ok && e.Before(want) {
				want = e
			}
		}
	}
	if s := &rc.resp; s.oooH < len(s.ooo) {
		if k := s.keptAt.Add(rcKeepMax); want.IsZero() || k.Before(want) {
			want = k
		}
	}
	if r.deferOn && (want.IsZero() || r.deferAt.Before(want)) {
		want = r.deferAt
	}
	if want.IsZero() {
		return // nothing to wait for: a running timer finds nothing to do
	}
	if !rc.timerAt.IsZero() && !want.Before(rc.timerAt) {
		return
	}
	rc.timerAt = want
	d := max(want.Sub(now), 0)
	if rc.timer == nil {
		rc.timer = q.hca.cfg.Clock.AfterFunc(d, q.rcOnTimer)
	} else {
		rc.timer.Reset(d)
	}
}

func (q *QP) rcOnTimer() {
	q.mu.Lock()
	rc := q.rc
	rc.timerAt = time.Time{} // not armed any more: rcArmLocked arms it again
	if q.state != verbs.QPRTS && q.state != verbs.QPRTR {
		q.mu.Unlock()
		return
	}
	r := &rc.req
	now := q.hca.cfg.Clock.Now()
	if s := &rc.resp; s.oooH < len(s.ooo) && !now.Before(s.keptAt.Add(rcKeepMax)) {
		// The gap has not filled for rcKeepMax: the requester is gone, or goes
		// back over it all anyway. Drop what was kept, as dropped requests (the
		// gap is NAKed again when its first packet comes).
		hi := s.ooo[len(s.ooo)-1].pkt.BTH.PSN
		rc.stats.expired += uint64(len(s.ooo) - s.oooH)
		dropped, dropHi := s.dropped, s.dropHi
		q.rcDropKeptLocked() // which forgets the dropped ones: these are not gone back over
		s.dropped, s.dropHi = dropped, dropHi
		s.noteDropped(hi)
	}
	if q.state != verbs.QPRTS { // RTR: a responder only
		q.rcArmLocked(now)
		q.mu.Unlock()
		return
	}
	kick := false
	if r.deferOn && !now.Before(r.deferAt) {
		// A NAK inside a run was put off: the run has arrived since, or should
		// have, and the packet it named is still missing.
		r.deferOn = false
		if r.una == r.deferPSN && !r.rnrWait {
			rc.stats.selects++
			r.selectPSN(r.deferPSN, now)
			kick = true
		}
	}
	switch {
	case r.rnrWait:
		if now.Before(r.rnrUntil) {
			break
		}
		// Resend from the PSN the receiver had no buffer for, probing.
		r.rnrWait = false
		r.nxt = r.rnrPSN
		r.cur = r.h
		r.probing, r.probeEnd = true, q.rcProbeEndLocked(r.rnrPSN)
		r.progressAt = now
		kick = true
	case psnDiff(r.una, r.smax) < 0:
		rto := ackTimeout(rc.timeout)
		if rto == 0 {
			break
		}
		if now.Before(r.progressAt.Add(rto)) {
			if e, ok := r.earlyAt(rto); ok && !now.Before(e) {
				// Nothing acknowledged for two round trips: an ACK, a NAK or a
				// resent packet was probably lost. Resend the oldest packets up to
				// one asking for an ACK, without counting a retry: the ACK or NAK
				// they draw tells where the responder is.
				rc.stats.early++
				r.earlyN++
				r.retxAt = now
				r.resend, r.resendEnd = true, q.rcProbeEndLocked(r.una)
				if r.rttOn && psnDiff(r.rttPSN, r.resendEnd) <= 0 {
					r.rttOn = false // the timed packet goes again: its ACK would be ambiguous
				}
				kick = true
			}
			break
		}
		if r.retryLeft == 0 {
			q.rcFailLocked(verbs.WCRetryExcErr)
			q.mu.Unlock()
			return
		}
		r.retryLeft--
		rc.stats.timeouts++
		r.goBack(r.una, now)
		r.ssthresh = max(r.cwnd/2, rcWinMin)
		r.cwnd, r.cwndAcc = rcWinMin, 0
		r.recovering, r.recover = true, r.smax
		r.progressAt = now
		kick = true
	}
	q.rcArmLocked(now)
	q.mu.Unlock()
	if kick {
		q.rcPump()
	}
}

// goBack rewinds the requester to resend from psn.
func (r *rcReq) goBack(psn uint32, now time.Time) {
	r.nxt, r.cur = psn, r.h
	r.selOn, r.selOwed, r.runOn, r.deferOn = false, false, false, false
	r.retxAt = now
	if r.rttOn && psnDiff(r.rttPSN, psn) >= 0 {
		r.rttOn = false // the timed packet goes again: its ACK would be ambiguous
	}
}

// lossy counts n packets lost from psn on and reports whether more than one in rcLossCut of
// the last window's packets were lost. Random loss on the fabric costs a selective
// resend only its lost packet, so it does not cut the window (at 2% loss a window cut
// at each loss would sit at rcWinMin, as TCP's would); a responder that drops much
// more than that is overrun, and the window is cut as for a go-back.
func (r *rcReq) lossy(psn uint32, n int) bool {
	if r.lossN == 0 || psnDiff(psn, psnAdd(r.lossFrom, r.cwnd)) >= 0 {
		r.lossFrom, r.lossN = psn, 0
	}
	r.lossN += n
	return r.lossN > max(r.cwnd/rcLossCut, 1)
}

// selectPSN makes the pump resend psn alone.
func (r *rcReq) selectPSN(psn uint32, now time.Time) {
	r.selOn, r.selPSN, r.selEnd, r.selOwed = true, psn, psn, true
	r.retxAt = now
	if r.rttOn && psnDiff(r.rttPSN, psn) >= 0 {
		r.rttOn = false // waits for the resend: the sample would measure the recovery
	}
}

// rcSelectiveDoneLocked ends a selective resend the responder has answered, at the end
// of the received batch (an ACK for the resent packet and one beyond it leave in one
// batch): if nothing after the resent packet was acknowledged, the responder kept
// nothing after it, and the requester goes back N from there.
func (q *QP) rcSelectiveDoneLocked() bool {
	rc := q.rc
	r := &rc.req
	if !r.selOn || r.selOwed || psnDiff(r.una, r.selPSN) <= 0 {
		return false
	}
	r.selOn = false
	if r.una != psnAdd(r.selEnd, 1) || psnDiff(r.smax, r.una) <= 0 || q.state != verbs.QPRTS || r.rnrWait {
		return false
	}
	rc.stats.goBacks++
	r.goBack(r.una, q.hca.cfg.Clock.Now())
	r.cut() // a responder out of budget is overloaded
	return true
}

// cut halves the window, at most once per recovery episode (until the PSNs in flight
// when it was cut are acknowledged).
func (r *rcReq) cut() {
	if r.recovering {
		return
	}
	r.ssthresh = max(r.cwnd/2, rcWinMin)
	r.cwnd, r.cwndAcc = r.ssthresh, 0
	r.recovering, r.recover = true, r.smax
}

// sampleRTT folds one round-trip measurement into the smoothed round trip.
func (r *rcReq) sampleRTT(d time.Duration) {
	if r.srtt == 0 {
		r.srtt = max(d, 1)
		return
	}
	r.srtt += (d - r.srtt) / 8
}

// earlyAt returns when the requester retransmits early if nothing is acknowledged by
// then: two round trips (at least rcMinEarly; before the first round trip is
// measured a quarter of the ACK timeout rto, at most 2 ms) after the last progress or
// retransmission,
// doubling with every early retransmission, and only while that is sooner than the
// ACK timeout. An ACK timeout below four times rcMinEarly is short enough itself:
// then there is none, and every transmission after the first is a retry.
func (r *rcReq) earlyAt(rto time.Duration) (time.Time, bool) {
	if rto < 4*rcMinEarly || r.earlyN >= 16 {
		return time.Time{}, false
	}
	d := min(rto/4, 4*rcMinEarly)
	if r.srtt > 0 {
		d = max(2*r.srtt, rcMinEarly)
	}
	if d<<r.earlyN >= rto {
		return time.Time{}, false
	}
	d <<= r.earlyN
	base := r.progressAt
	if r.retxAt.After(base) {
		base = r.retxAt
	}
	return base.Add(d), true
}

// rcProbeEndLocked returns the first PSN from psn on that asks for an ACK.
func (q *QP) rcProbeEndLocked(psn uint32) uint32 {
	r := &q.rc.req
	end := psnAdd(psn, int((rcAckReqSpace-1-psn%rcAckReqSpace)%rcAckReqSpace))
	for _, m := range r.sq[r.h:] {
		if d := psnDiff(psn, m.first); d >= 0 && d < m.n {
			if psnDiff(m.last(), end) < 0 {
				return m.last()
			}
			break
		}
	}
	return end
}

// ---- receive path ----

// rcTouched collects the RC QPs a receive batch touched, to flush their ACKs and run
// their requesters once per batch.
type rcTouched struct {
	few  [4]*QP
	n    int
	more []*QP
}

func (t *rcTouched) add(q *QP) {
	for _, o := range t.few[:t.n] {
		if o == q {
			return
		}
	}
	for _, o := range t.more {
		if o == q {
			return
		}
	}
	if t.n < len(t.few) {
		t.few[t.n] = q
		t.n++
		return
	}
	t.more = append(t.more, q)
}

func (t *rcTouched) flush() {
	for _, q := range t.few[:t.n] {
		q.rcFlush()
	}
	for _, q := range t.more {
		q.rcFlush()
	}
}

// receiveRC runs the checks of an RC packet and hands it to its QP. Drops are counted
// in the port counters UD uses: NoQP for a QPN that is not an RC QP of this port, a QP
// not ready (ACKs need RTS, requests RTR or RTS) or a packet from a port other than the
// connected peer; Malformed for an unknown source endpoint; BadICRC; BadPKey.
func (p *Port) receiveRC(d Datagram, pkt *wire.Packet, v *rxView, touched *rcTouched, ic *wire.ICRCCache, cb *cqBatch) {
	q := v.qp(verbs.QPN(pkt.BTH.DestQP))
	if q == nil || q.port != p || q.typ != verbs.QPTypeRC {
		p.cnt.noQP.Add(1)
		return
	}
	src, ok := v.source(d.Addr)
	if !ok {
		p.cnt.malformed.Add(1)
		return
	}
	dgid, pkeys := v.port()
	if !ic.CheckICRC(d.Data, src.GID, dgid) {
		p.cnt.badICRC.Add(1)
		return
	}
	if q.rcReceive(pkt, src, pkeys, cb) {
		touched.add(q)
	}
}

// rcReceive processes one checked packet of the received batch cb; it reports whether
// the QP has something to do at the end of the batch.
func (q *QP) rcReceive(pkt *wire.Packet, src ctlRoute, pkeys []verbs.PKey, cb *cqBatch) bool {
	p := q.port
	q.mu.Lock()
	defer q.mu.Unlock()
	rc := q.rc
	isAck := pkt.BTH.Opcode == wire.OpRCAck
	if !(q.state == verbs.QPRTS || q.state == verbs.QPRTR && !isAck) {
		p.cnt.noQP.Add(1)
		return false
	}
	if src.LID != rc.ah.DLID {
		// Not from the port this QP is connected to: for this sender the QP does not exist.
		p.cnt.noQP.Add(1)
		return false
	}
	if !q.pkeyAdmitsLocked(pkeys, pkt.BTH.PKey) {
		return false
	}
	if isAck {
		q.rcAckLocked(pkt)
	} else {
		q.rcRequestLocked(pkt, src, cb)
	}
	return true
}

// rcFlush sends the ACKs and NAKs a batch produced and lets the requester transmit.
func (q *QP) rcFlush() {
	q.mu.Lock()
	rc := q.rc
	s := &rc.resp
	if q.rcSelectiveDoneLocked() {
		rc.kick = true
	}
	if s.gap && !s.nakSent && q.state != verbs.QPErr {
		// The gap did not close in the batch: the expected packet was lost. The NAK
		// acknowledges what came before it, so no ACK goes with it.
		q.rcGapLocked(s.gapHi)
		s.ackPending, s.ackFirst, s.unacked, s.ackTwice = false, false, 0, false
		if s.gapDropped {
			// The gap behind dropped requests is NAKed this once: after that the
			// requester's resends come in order (a go-back over several batches),
			// and a NAK per batch would only draw duplicates.
			s.dropped = false
		}
	}
	s.gap, s.gapDropped = false, false
	ctl := rc.ctl
	rc.ctl = nil
	if s.ackPending && (q.state == verbs.QPRTR || q.state == verbs.QPRTS) {
		last := psnAdd(s.epsn, -1)
		if s.ackFirst && s.ackPSN != last {
			// Two ACKs, so that losing one does not leave the requester waiting with
			// its window full.
			ctl = append(ctl, q.rcCtlPacketLocked(synACK, s.ackPSN, s.ackMSN))
		}
		ctl = append(ctl, q.rcCtlPacketLocked(synACK, last, s.msn))
		if s.ackTwice {
			ctl = append(ctl, ctl[len(ctl)-1])
		}
		s.ackPending, s.ackFirst, s.unacked = false, false, 0
	}
	s.ackTwice = false
	kick := rc.kick
	rc.kick = false
	q.mu.Unlock()
	if len(ctl) > 0 {
		p := q.port
		var bytes uint64
		for _, d := range ctl {
			bytes += uint64(len(d.Data))
		}
		p.cnt.xmitPkts.Add(uint64(len(ctl)))
		p.cnt.xmitBytes.Add(bytes)
		_ = p.ep.Send(ctl)
	}
	if kick {
		q.rcPump()
	}
}

// rcCtlPacketLocked encodes an ACK or NAK to the peer the last request came from.
func (q *QP) rcCtlPacketLocked(syndrome uint8, psn, msn uint32) Datagram {
	rc := q.rc
	p := q.port
	p.mu.RLock()
	var pkey verbs.PKey
	if q.pkeyIx < len(p.pkeys) {
		pkey = p.pkeys[q.pkeyIx]
	}
	sgid := p.gid0()
	p.mu.RUnlock()
	pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpRCAck, PKey: uint16(pkey), DestQP: uint32(rc.dqpn), PSN: psn},
		AETH: wire.AETH{Syndrome: syndrome, MSN: msn}}
	return Datagram{Addr: rc.resp.peer.Addr, Data: pkt.AppendTo(make([]byte, 0, wire.BTHLen+wire.AETHLen+wire.ICRCLen), sgid, rc.resp.peer.GID)}
}

// rcNAKLocked queues a NAK for the end of the batch.
func (q *QP) rcNAKLocked(syndrome uint8, psn uint32) {
	q.rc.ctl = append(q.rc.ctl, q.rcCtlPacketLocked(syndrome, psn, q.rc.resp.msn))
}

// rcRequestLocked is the responder: one SEND packet from the peer.
func (q *QP) rcRequestLocked(pkt *wire.Packet, src ctlRoute, cb *cqBatch) {
	rc := q.rc
	s := &rc.resp
	s.peer = src
	psn := pkt.BTH.PSN
	switch d := psnDiff(psn, s.epsn); {
	case d < 0: // duplicate: acknowledge again, deliver nothing
		s.ackPending = true
		return
	case d > 0:
		q.rcKeepLocked(pkt, d)
		switch {
		case s.nakSent:
			q.rcGapLocked(psn)
		case !s.gap || psnDiff(psn, s.gapHi) > 0:
			s.gap, s.gapHi = true, psn
		}
		return
	}
	q.rcAcceptLocked(pkt, cb)
	if s.epsn != psnAdd(psn, 1) {
		// Not accepted after all (no receive buffer, or an error that moved the
		// QP to ERR): the requester goes back, so what was kept is of no use.
		q.rcDropKeptLocked()
		return
	}
	if s.oooH < len(s.ooo) {
		q.rcDrainLocked(cb)
	} else if s.gap && psnDiff(s.gapHi, s.epsn) < 0 {
		s.gap = false // the expected packet was only overtaken
	}
	if s.dropped {
		if psnDiff(s.dropHi, s.epsn) < 0 {
			s.dropped = false
		} else if !s.gap {
			// Requests beyond were dropped: the gap is still there.
			s.gap, s.gapHi, s.gapDropped = true, s.dropHi, true
		}
	}
}

// rcKeepLocked keeps a request d PSNs beyond the expected one, if the window and the
// HCA's budget allow; a copy of one kept already is ignored.
func (q *QP) rcKeepLocked(pkt *wire.Packet, d int) {
	rc := q.rc
	s := &rc.resp
	live := s.ooo[s.oooH:]
	psn := pkt.BTH.PSN
	i, found := slices.BinarySearchFunc(live, psn, func(e oooPkt, t uint32) int { return psnDiff(e.pkt.BTH.PSN, t) })
	if found {
		return
	}
	if s.rnrSent {
		return // the requester resends everything from the RNR NAK's PSN
	}
	if d > rcWinMaxPkts || len(live) >= rcWinMaxPkts || len(pkt.Payload) > oooBufCap {
		q.rcNotKeptLocked(psn)
		return
	}
	if q.hca.oooBytes.Add(oooBufCap) > rcOOOBudget {
		q.hca.oooBytes.Add(-oooBufCap)
		q.rcNotKeptLocked(psn)
		return
	}
	if len(live) == 0 {
		s.keptAt = q.hca.cfg.Clock.Now()
		defer q.rcArmLocked(s.keptAt)
	}
	rc.stats.kept++
	h := oooPool.Get().(*[]byte)
	e := oooPkt{pkt: *pkt, buf: h}
	e.pkt.Payload = append((*h)[:0], pkt.Payload...)
	if s.oooH > 0 && len(s.ooo) == cap(s.ooo) {
		// Move the live entries to the front rather than grow.
		n := copy(s.ooo, live)
		clear(s.ooo[n:])
		s.ooo, s.oooH = s.ooo[:n], 0
	}
	i += s.oooH
	s.ooo = slices.Insert(s.ooo, i, e)
}

// rcNotKeptLocked notes a request beyond a gap that could not be kept.
func (q *QP) rcNotKeptLocked(psn uint32) {
	q.rc.stats.notKept++
	q.rc.resp.noteDropped(psn)
}

// noteDropped records that requests up to psn beyond a gap are not kept.
func (s *rcResp) noteDropped(psn uint32) {
	if !s.dropped || psnDiff(psn, s.dropHi) > 0 {
		s.dropped, s.dropHi = true, psn
	}
}

// rcDrainLocked accepts the kept requests that now follow on from the expected PSN,
// and notes the gap if kept ones remain beyond another.
func (q *QP) rcDrainLocked(cb *cqBatch) {
	s := &q.rc.resp
	drained := false
	defer func() {
		if drained && q.state != verbs.QPErr {
			// One ACK, for the last packet accepted, sent twice: an ACK for the
			// packet that filled the gap alone would tell a selective requester
			// that nothing after it was kept, and a lost one would cost it two
			// round trips.
			s.ackPending, s.ackFirst, s.ackTwice = true, false, true
		}
	}()
	for s.oooH < len(s.ooo) {
		e := &s.ooo[s.oooH]
		d := psnDiff(e.pkt.BTH.PSN, s.epsn)
		if d > 0 {
			break
		}
		if d == 0 {
			psn := e.pkt.BTH.PSN
			q.rcAcceptLocked(&e.pkt, cb)
			if q.state == verbs.QPErr {
				return // moving to ERR dropped the rest
			}
			if s.epsn == psn { // no receive buffer: the requester goes back
				q.rcDropKeptLocked()
				return
			}
			drained = true
		}
		q.rcReleaseKept(e)
		s.oooH++
	}
	if s.oooH == len(s.ooo) {
		s.ooo, s.oooH = s.ooo[:0], 0
		if cap(s.ooo) > rcOOOKeepCap {
			s.ooo = nil // a connection that goes idle does not hold a window's slots
		}
		// Still a gap if a request beyond it was not kept.
		s.gap = s.gap && psnDiff(s.gapHi, s.epsn) >= 0
		return
	}
	if hi := s.ooo[len(s.ooo)-1].pkt.BTH.PSN; !s.gap || psnDiff(hi, s.gapHi) > 0 {
		s.gapHi = hi
	}
	s.gap = true
	if drained {
		// Recovery goes on: the keeping's time counts from here (a set that never
		// empties under steady loss must not expire in the middle of it).
		s.keptAt = q.hca.cfg.Clock.Now()
	}
}

// rcReleaseKept gives a kept request's buffer back.
func (q *QP) rcReleaseKept(e *oooPkt) {
	oooPool.Put(e.buf)
	q.hca.oooBytes.Add(-oooBufCap)
	*e = oooPkt{}
}

// rcDropKeptLocked forgets every kept request (and any dropped: the requester goes
// back over them).
func (q *QP) rcDropKeptLocked() {
	s := &q.rc.resp
	s.dropped = false
	for i := s.oooH; i < len(s.ooo); i++ {
		q.rcReleaseKept(&s.ooo[i])
	}
	clear(s.ooo[:s.oooH])
	s.ooo, s.oooH = s.ooo[:0], 0
}

// rcAcceptLocked is the responder's handling of the packet with the expected PSN, in
// the received batch cb (a message's completion is signalled at its end).
func (q *QP) rcAcceptLocked(pkt *wire.Packet, cb *cqBatch) {
	rc := q.rc
	s := &rc.resp
	psn := pkt.BTH.PSN
	op := pkt.BTH.Opcode
	first := op == wire.OpRCSendFirst || op == wire.OpRCSendOnly || op == wire.OpRCSendOnlyImm
	last := op != wire.OpRCSendFirst && op != wire.OpRCSendMiddle
	n := len(pkt.Payload)
	var lenOK bool
	switch op {
	case wire.OpRCSendFirst, wire.OpRCSendMiddle:
		lenOK = n == rc.mtu
	case wire.OpRCSendLast, wire.OpRCSendLastImm:
		lenOK = n >= 1 && n <= rc.mtu
	default: // ONLY
		lenOK = n <= rc.mtu
	}
	if first == s.inMsg || !lenOK {
		// Opcode out of sequence or a payload the path MTU does not allow.
		q.rcNAKLocked(synNAKInv, psn)
		if s.inMsg {
			q.recvCQ.push(q.rcRecvWC(verbs.WCRemInvReqErr, pkt))
			s.inMsg, s.wr = false, verbs.RecvWR{}
		}
		q.rcErrorLocked()
		return
	}
	if first {
		wr, ok, last := q.takeRecvLocked()
		if !ok {
			// No receive buffer: RNR NAK; the requester retries after the delay.
			s.nakSent, s.rnrSent, s.dropped = true, true, false
			s.nakHi, s.nakBack = psn, false
			rc.stats.rnrNAKs++
			q.rcNAKLocked(synRNR|rcMinRNRTimer, psn)
			return
		}
		s.wr, s.lastBuf = wr, last
		s.inMsg, s.n = true, 0
	}
	if s.n+n > len(s.wr.Buf) {
		// The message does not fit its buffer.
		q.rcNAKLocked(synNAKInv, psn)
		q.recvCQ.push(q.rcRecvWC(verbs.WCLocLenErr, pkt))
		s.inMsg, s.wr = false, verbs.RecvWR{}
		q.rcErrorLocked()
		return
	}
	copy(s.wr.Buf[s.n:], pkt.Payload)
	s.n += n
	s.epsn = psnAdd(s.epsn, 1)
	s.nakSent, s.rnrSent = false, false
	s.unacked++
	if last {
		if s.lastBuf {
			cb = nil // the last buffer: its consumer must hear now, to post more before an RNR NAK
		}
		q.recvCQ.pushIn(q.rcRecvWC(verbs.WCSuccess, pkt), cb)
		s.inMsg, s.wr = false, verbs.RecvWR{}
		s.msn = (s.msn + 1) & wire.MaxMSN
	}
	if (pkt.BTH.AckReq || s.unacked >= rcAckEvery) && !s.ackFirst {
		s.ackPending, s.ackFirst, s.ackPSN, s.ackMSN = true, true, psn, s.msn
	}
}

// rcGapLocked handles a request packet beyond the expected PSN (kept or not). The
// first draws a sequence NAK; the following ones draw none, except that when the
// requester is seen going back (two packets in order below the highest PSN since the
// NAK: an early retransmission, a timeout's or a go-back's) and the expected PSN is
// still missing, the resent packet was lost too, and the NAK goes out again.
func (q *QP) rcGapLocked(psn uint32) {
	s := &q.rc.resp
	switch {
	case !s.nakSent:
		s.nakSent = true
		s.nakHi, s.nakBack = psn, false
		q.rc.stats.seqNAKs++
		q.rcNAKLocked(synNAKSeq, s.epsn)
		q.rcNAKLocked(synNAKSeq, s.epsn)
	case psnDiff(psn, s.nakHi) >= 0:
		s.nakHi, s.nakBack = psn, false
	case s.nakBack && psnDiff(psn, s.nakBackPSN) > 0:
		s.nakHi, s.nakBack = psn, false
		q.rc.stats.reNAKs++
		q.rcNAKLocked(synNAKSeq, s.epsn)
	default:
		s.nakBack, s.nakBackPSN = true, psn
	}
}

func (q *QP) rcRecvWC(status verbs.WCStatus, pkt *wire.Packet) verbs.WC {
	s := &q.rc.resp
	imm := pkt.BTH.Opcode == wire.OpRCSendLastImm || pkt.BTH.Opcode == wire.OpRCSendOnlyImm
	wc := verbs.WC{WRID: s.wr.ID, Status: status, Opcode: verbs.WCRecv, QPN: q.num, SrcQP: q.rc.dqpn,
		SLID: s.peer.LID, SL: q.rc.ah.SL, PKeyIndex: q.pkeyIx}
	if status == verbs.WCSuccess {
		wc.ByteLen, wc.WithImm = s.n, imm
		if imm {
			wc.Imm = pkt.Imm
		}
	}
	return wc
}

// rcAckLocked is the requester's side of an ACK or NAK.
func (q *QP) rcAckLocked(pkt *wire.Packet) {
	rc := q.rc
	r := &rc.req
	psn, syn := pkt.BTH.PSN, pkt.AETH.Syndrome
	// Only PSNs of packets we sent can be acknowledged or refused.
	inFlight := func(x uint32) bool { return psnDiff(x, r.una) >= 0 && psnDiff(x, r.smax) < 0 }
	switch syn & synTypeMask {
	case 0x00: // ACK
		q.rcAckToLocked(psn)
	case synRNR:
		q.rcAckToLocked(psnAdd(psn, -1))
		if !inFlight(psn) || r.rnrWait && psn == r.rnrPSN {
			return // stale or a duplicate of the NAK we are waiting out
		}
		if rc.rnrRetry != 7 {
			if r.rnrLeft == 0 {
				q.rcFailLocked(verbs.WCRNRRetryExcErr)
				return
			}
			r.rnrLeft--
		}
		now := q.hca.cfg.Clock.Now()
		r.rnrWait, r.rnrPSN, r.rnrUntil = true, psn, now.Add(rnrDelay(syn))
		r.goBack(psn, now)
		r.resend = false
		q.rcArmLocked(now)
	case synNAKSeq & synTypeMask:
		q.rcAckToLocked(psnAdd(psn, -1))
		if syn != synNAKSeq {
			if !inFlight(psn) {
				return
			}
			status := verbs.WCGeneralErr
			switch syn {
			case synNAKInv:
				status = verbs.WCRemInvReqErr
			case synNAKAcc:
				status = verbs.WCRemAccessErr
			}
			q.rcFailLocked(status)
			return
		}
		if !inFlight(psn) || r.rnrWait {
			return
		}
		if r.runOn && psnDiff(psn, r.runEnd) <= 0 && !(r.nakSeen && psn == r.nakPSN) {
			// Inside the run still arriving: the responder NAKed at the end of a
			// batch that held only part of it. Its acknowledgement stands, and the
			// resend is put off for two round trips: if the run brought the packet,
			// nothing is resent (a run crossing batches draws such NAKs).
			r.nakSeen, r.nakPSN, r.nakTwin = true, psn, true
			if !r.deferOn || r.deferPSN != psn {
				now := q.hca.cfg.Clock.Now()
				r.deferOn, r.deferPSN, r.deferAt = true, psn, now.Add(max(2*r.srtt, rcMinEarly))
				q.rcArmLocked(now)
			}
			return
		}
		if r.nakSeen && psn == r.nakPSN {
			// The responder sends a sequence NAK twice, so the second copy is no news.
			// A NAK for the same PSN after that, once the resend is on its way, says
			// the resent packet was lost too: resend it again.
			if r.nakTwin || r.selOwed || r.resend {
				r.nakTwin = false
				return
			}
		} else {
			r.nakTwin = true
		}
		r.nakSeen, r.nakPSN = true, psn
		rc.stats.selects++
		now := q.hca.cfg.Clock.Now()
		if r.selOn && psn == psnAdd(r.selEnd, 1) {
			// The packet after the last resend is missing too: a burst was lost
			// (a receive queue that overflowed). Resend a run up to a packet
			// asking for an ACK, at least twice as long as the last, rather than
			// one packet per round trip.
			n := min(max(2*(psnDiff(r.selEnd, r.selPSN)+1), rcAckReqSpace), r.cwnd)
			end := q.rcProbeEndLocked(psnAdd(psn, n-1))
			if psnDiff(end, r.smax) >= 0 {
				end = psnAdd(r.smax, -1)
			}
			r.selectPSN(psn, now)
			r.selEnd, r.selOwed = end, false
			r.resend, r.resendEnd = true, end
			r.runOn, r.runEnd = true, end
		} else {
			r.selectPSN(psn, now)
		}
		if r.lossy(psn, psnDiff(r.selEnd, psn)+1) {
			r.cut()
		}
		rc.kick = true
	}
}

// rcAckToLocked acknowledges every packet up to psn, completing the messages that end
// there.
func (q *QP) rcAckToLocked(psn uint32) {
	rc := q.rc
	r := &rc.req
	if psnDiff(psn, r.una) < 0 || psnDiff(psn, r.smax) >= 0 {
		return // old, or for a packet never sent
	}
	acked := psnDiff(psn, r.una) + 1
	r.una = psnAdd(psn, 1)
	if psnDiff(r.nxt, r.una) < 0 {
		r.nxt, r.cur = r.una, r.h
	}
	for r.h < len(r.sq) && psnDiff(r.una, r.sq[r.h].last()) > 0 {
		m := r.sq[r.h]
		if m.signaled || q.sigAll {
			q.sendCQ.push(verbs.WC{WRID: m.id, Status: verbs.WCSuccess, Opcode: verbs.WCSend, QPN: q.num, ByteLen: m.length})
		}
		rc.rcFreeLocked(m)
		r.sq[r.h] = nil
		r.h++
	}
	if r.h == len(r.sq) {
		r.sq, r.h, r.cur = r.sq[:0], 0, 0
	}
	if r.runOn && psnDiff(r.una, r.runEnd) > 0 {
		r.runOn = false
	}
	if r.deferOn && psnDiff(r.una, r.deferPSN) > 0 {
		r.deferOn = false // it came after all
	}
	now := q.hca.cfg.Clock.Now()
	if r.rttOn && psnDiff(psn, r.rttPSN) >= 0 {
		r.rttOn = false
		r.sampleRTT(now.Sub(r.rttAt))
	}
	r.progressAt = now
	r.earlyN = 0
	r.retryLeft, r.rnrLeft = rc.retryCnt, rc.rnrRetry
	r.probing = false
	if r.rnrWait && psnDiff(r.una, r.rnrPSN) > 0 {
		r.rnrWait = false // the receiver took the message after all
	}
	if r.recovering && psnDiff(r.una, r.recover) >= 0 {
		r.recovering = false
	}
	wmax := rc.winMax()
	if r.cwnd < r.ssthresh {
		r.cwnd = min(r.cwnd+acked, wmax)
	} else if r.cwnd < wmax {
		r.cwndAcc += acked
		for r.cwndAcc >= r.cwnd && r.cwnd < wmax {
			r.cwndAcc -= r.cwnd
			r.cwnd++
		}
	}
	rc.kick = true
}
