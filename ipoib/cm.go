package ipoib

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"syscall"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/mad"
)

// Connected mode (RFC 4755, the kernel's ipoib_cm.c): unicast to peers whose hardware
// address carries 0x80 goes over an RC connection set up through the CM with 8 bytes of
// private data (our UD QPN, our receive MTU); multicast and peers without the flag stay
// on UD, where packets above the broadcast group's MTU are dropped and the sender gets
// an ICMP error.
//
// One deliberate difference from the kernel: an interface in datagram mode rejects
// incoming connection requests (REJ, consumer defined), so a connected-mode peer falls
// back to UD for it and learns the UD path MTU, instead of receiving packets larger
// than the interface's own MTU.
const (
	cmServiceBase = 0x1000000000000000 // IPOIB_CM_IETF_ID
	cmMaxMTU      = 0x10000 - 0x10     // IPOIB_CM_MTU: 65520
	cmBufSize     = cmMaxMTU + encapLen
	// cmRxHeadroom is kept before each receive buffer, so that a FrameHost can put
	// its own header before a received packet instead of copying it (16 bytes with
	// the IPoIB header: a TUN device's virtio-net header needs 10).
	cmRxHeadroom = 12
	cmRxIdle     = 512 * time.Second // passive connections idle this long are torn down
	cmRejectHold = 30 * time.Second  // after a REJ the peer is reached over UD this long
)

// cmTx is an active (transmit) connection to one peer (struct ipoib_cm_tx).
type cmTx struct {
	hw       HWAddr
	qp       verbs.QP
	unsig    atomic.Int32 // sends posted since the last signalled one (signalEvery)
	conn     *cm.Conn
	up       bool
	mtu      int // the peer's receive size (IPoIB header included)
	queue    [][]byte
	rejected time.Time // non-zero: refused, use UD until then + cmRejectHold
}

// cmRx is a passive (receive) connection (struct ipoib_cm_rx).
type cmRx struct {
	qp   verbs.QP
	conn *cm.Conn // under dmu
	dead bool     // under dmu: destroyed (the RTU may still arrive)
	bufs [][]byte
	last time.Time
}

// cmSupported probes whether the device can create RC queue pairs.
func cmSupported(dev verbs.Device) bool {
	cq, err := dev.CreateCQ(verbs.CQAttr{Entries: 1})
	if err != nil {
		return false
	}
	defer cq.Close()
	qp, err := dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
	if err != nil {
		return false
	}
	qp.Close()
	return true
}

// cmInitLocked prepares connected mode for an interface whose port has a CM: the
// shared CQs, the receive loop and the listener on 0x1000000000000000 | UD QPN.
func (i *Interface) cmInit(mgr *cm.Manager) error {
	dev := i.e.dev
	var err error
	if i.cmScq, err = dev.CreateCQ(verbs.CQAttr{Entries: 4096}); err != nil {
		return err
	}
	// Passive connections share one receive queue where the device has them, as the
	// driver's ipoib_cm_dev_init prefers; without, each has its own. The queue itself
	// is made at the first passive connection (cmSharedRQ): a device may register its
	// buffers' memory when it is made, and most interfaces never take a connection.
	p := i.e.params
	if sd, ok := dev.(verbs.SRQDevice); ok {
		if srq, err := sd.CreateSRQ(verbs.SRQAttr{MaxWR: 1}); err == nil {
			_ = srq.Close()
			i.cmHasSRQ = true
		} else {
			i.e.tracef(1, "%s: no shared receive queue, one receive queue per connection: %v", i.Name(), err)
		}
	}
	// The receive CQ holds a completion for every buffer that can be posted: the
	// shared queue's, or a full receive queue on each of max_nonsrq_conn_qp
	// connections (the driver's ipoib_transport_dev_init sizes it the same way).
	entries := p.RecvQueueSize + 1
	if !i.cmHasSRQ {
		entries = p.RecvQueueSize*p.MaxNonSRQConnQP + 1
	}
	if i.cmRcq, err = dev.CreateCQ(verbs.CQAttr{Entries: entries, Handler: i.cmRxHandler}); err != nil {
		return err
	}
	i.cmMgr = mgr
	i.tx = map[HWAddr]*cmTx{}
	i.rx = map[verbs.QPN]*cmRx{}
	// The flag is set before the listener can call cmListen, which reads hw unlocked
	// (the private data of its REP).
	i.hw[0] |= FlagRC
	stop, err := mgr.Listen(cmServiceBase|uint64(i.qp.Num()), i.cmListen)
	if err != nil {
		return err
	}
	i.cmStop = stop
	return nil
}

func (i *Interface) cmClose() {
	if i.cmMgr == nil {
		return
	}
	i.cmStop()
	i.cmEndAll()
}

// cmEndAll ends every connection, both ways (ipoib_cm_dev_stop for the passive ones;
// the transmit ones go with their neighbours in the driver).
func (i *Interface) cmEndAll() {
	i.dmu.Lock()
	txs, rxs := i.tx, i.rx
	i.tx, i.rx = map[HWAddr]*cmTx{}, map[verbs.QPN]*cmRx{}
	for _, t := range i.txGone { // a forced GC's, which the task may not end now
		txs[t.hw] = t
	}
	i.txGone = nil
	for _, t := range txs {
		i.dropTxQueueLocked(t)
	}
	i.dmu.Unlock()
	for _, t := range txs {
		i.cmTxDestroy(t)
	}
	for _, r := range rxs {
		i.cmRxDestroy(r)
	}
}

// dropTxQueueLocked drops and counts the frames waiting for a connection taken out of
// the table: a connect still under way that fails later must not send them (over UD,
// on an interface that may be down by then). Called with dmu held.
func (i *Interface) dropTxQueueLocked(t *cmTx) {
	i.stats.txDropped.Add(uint64(len(t.queue)))
	t.queue = nil
}

// cmAnnouncedMTU is the receive MTU the private data announces (a variable for the
// tests, which play a peer that takes less).
var cmAnnouncedMTU uint32 = cmBufSize

// cmPrivateData is the 8-byte REQ/REP private data: UD QPN, receive MTU.
func (i *Interface) cmPrivateData() []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, uint32(i.hw.QPN()))
	binary.BigEndian.PutUint32(b[4:], cmAnnouncedMTU)
	return b
}

// cmListen decides on an incoming REQ (ipoib_cm_req_handler).
func (i *Interface) cmListen(req *cm.Request) cm.Decision {
	i.dmu.Lock()
	mode, up, n := i.data().mode, i.data().up, len(i.rx)
	i.dmu.Unlock()
	if mode != Connected {
		i.e.tracef(1, "%s: rejecting a connection from LID %#x: interface in datagram mode", i.Name(), req.RemoteLID)
		return cm.Reject{Reason: mad.RejConsumerDefined}
	}
	if !up {
		// A down interface has no listener in the driver (ipoib_cm_dev_stop destroys
		// it): the CM answers such a REQ with "invalid service ID".
		i.e.tracef(1, "%s: rejecting a connection from LID %#x: interface down", i.Name(), req.RemoteLID)
		return cm.Reject{Reason: mad.RejInvalidServiceID}
	}
	if !i.startLoops() { // a peer may connect to an interface never brought up
		return cm.Reject{Reason: mad.RejNoQP}
	}
	if !i.cmHasSRQ && n >= i.e.params.MaxNonSRQConnQP {
		i.e.tracef(1, "%s: rejecting a connection: max_nonsrq_conn_qp (%d) reached", i.Name(), n)
		return cm.Reject{Reason: mad.RejNoQP}
	}
	var srq verbs.SRQ
	if i.cmHasSRQ {
		var err error
		if srq, err = i.cmSharedRQ(); err != nil {
			i.e.tracef(1, "%s: rejecting a connection: shared receive queue: %v", i.Name(), err)
			return cm.Reject{Reason: mad.RejNoQP}
		}
	}
	qp, err := i.e.dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: i.port, SendCQ: i.cmScq, RecvCQ: i.cmRcq,
		MaxSendWR: 1, MaxRecvWR: i.e.params.RecvQueueSize, SRQ: srq})
	if err != nil {
		return cm.Reject{Reason: mad.RejNoQP}
	}
	rx := &cmRx{qp: qp, last: i.e.clk.Now()}
	if srq == nil {
		rx.bufs = make([][]byte, i.e.params.RecvQueueSize)
	}
	i.dmu.Lock()
	if d := i.data(); !d.up || d.mode != Connected {
		// Went down (or to datagram mode) while the QP was made: its connections
		// were ended without this one.
		i.dmu.Unlock()
		_ = qp.Close()
		return cm.Reject{Reason: mad.RejInvalidServiceID}
	}
	i.rx[qp.Num()] = rx
	i.dmu.Unlock()
	return cm.Accept{QP: qp, PrivateData: i.cmPrivateData(), SRQ: srq != nil,
		Established: func(c *cm.Conn) {
			// Buffers are posted once the QP is past INIT (the manager moved it to RTS);
			// with a shared receive queue, its pool once, at the first connection.
			wrs := i.cmRxBuffers(rx, srq != nil)
			i.dmu.Lock()
			if rx.dead { // the interface closed while the connection was set up
				i.dmu.Unlock()
				go c.Disconnect()
				return
			}
			rx.conn = c
			i.dmu.Unlock()
			var err error
			if srq != nil {
				_, err = srq.PostRecv(wrs)
			} else {
				_, err = qp.PostRecv(wrs)
			}
			if err != nil {
				i.e.tracef(1, "%s: posting connected-mode receive buffers: %v", i.Name(), err)
			}
			go func() {
				<-c.Done()
				i.dmu.Lock()
				if i.rx[qp.Num()] == rx { // a QP number reused since is another's
					delete(i.rx, qp.Num())
				}
				i.dmu.Unlock()
				i.cmRxDestroy(rx)
			}()
		},
		Failed: func(error) {
			i.dmu.Lock()
			if i.rx[qp.Num()] == rx {
				delete(i.rx, qp.Num())
			}
			i.dmu.Unlock()
			i.cmRxDestroy(rx)
		}}
}

// cmSharedRQ returns the interface's shared receive queue, making it the first time.
func (i *Interface) cmSharedRQ() (verbs.SRQ, error) {
	i.dmu.Lock()
	srq := i.cmSRQ
	i.dmu.Unlock()
	if srq != nil {
		return srq, nil
	}
	made, err := i.e.dev.(verbs.SRQDevice).CreateSRQ(verbs.SRQAttr{MaxWR: i.e.params.RecvQueueSize})
	if err != nil {
		return nil, err
	}
	i.dmu.Lock()
	defer i.dmu.Unlock()
	if i.cmSRQ != nil { // another connection made it meanwhile
		_ = made.Close()
		return i.cmSRQ, nil
	}
	i.cmSRQ = made
	return made, nil
}

// cmRxBuffers makes the receive buffers a new passive connection posts: its own
// ring, or with a shared receive queue the pool, the first time only (nil after).
func (i *Interface) cmRxBuffers(rx *cmRx, shared bool) []verbs.RecvWR {
	bufs := rx.bufs
	if shared {
		i.dmu.Lock()
		claimed := i.cmSRQClaimed
		i.cmSRQClaimed = true
		i.dmu.Unlock()
		if claimed {
			return nil
		}
		bufs = make([][]byte, i.e.params.RecvQueueSize)
	}
	wrs := make([]verbs.RecvWR, len(bufs))
	for k := range bufs {
		// The buffer with its headroom; the HCA gets what follows it.
		bufs[k] = make([]byte, cmRxHeadroom+cmBufSize)
		wrs[k] = verbs.RecvWR{ID: uint64(k), Buf: bufs[k][cmRxHeadroom:]}
	}
	if shared { // published filled, before any of them is posted
		i.dmu.Lock()
		i.cmSRQBufs = bufs
		i.dmu.Unlock()
	}
	return wrs
}

// cmRxDestroy ends a passive connection once, whoever gets there first: the
// connection's end, a failed setup, the reaper or the interface closing.
func (i *Interface) cmRxDestroy(r *cmRx) {
	i.dmu.Lock()
	if r.dead {
		i.dmu.Unlock()
		return
	}
	r.dead = true
	conn := r.conn
	i.dmu.Unlock()
	if conn != nil {
		go conn.Disconnect()
	}
	// To the error state first, as ipoib_cm_stale_task and the DREQ handler move a
	// passive QP: the receives still posted on it come back flushed and are counted
	// in rx_dropped (none with the shared receive queue, whose buffers stay posted).
	_ = r.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr})
	r.qp.Close()
}

// cmTxDestroy ends a transmit connection already removed from i.tx. The connect
// goroutine may still be running, so the QP and connection are taken under the lock
// and whichever side takes them closes them.
func (i *Interface) cmTxDestroy(t *cmTx) {
	i.dmu.Lock()
	conn, qp := t.conn, t.takeQPLocked()
	t.conn = nil
	i.dmu.Unlock()
	if conn != nil {
		go conn.Disconnect()
	}
	if qp != nil {
		qp.Close()
	}
}

// takeQPLocked hands the connection's QP to the caller, who closes it.
func (t *cmTx) takeQPLocked() verbs.QP {
	qp := t.qp
	t.qp = nil
	return qp
}

// cmRouteLocked returns the connection to send a unicast frame to hw over, starting
// one if needed; ok=false means "use UD". queued=true means the frame was queued (or
// dropped) while the connection is being set up.
func (i *Interface) cmRouteLocked(hw HWAddr, frame [][]byte) (t *cmTx, queued, ok bool) {
	if i.data().mode != Connected || i.cmMgr == nil || hw.Flags()&FlagRC == 0 {
		return nil, false, false
	}
	t = i.tx[hw]
	if t != nil && !t.rejected.IsZero() {
		if i.e.clk.Since(t.rejected) < cmRejectHold {
			return nil, false, false
		}
		delete(i.tx, hw)
		t = nil
	}
	if t == nil {
		t = &cmTx{hw: hw}
		i.tx[hw] = t
		i.wg.Add(1)
		go i.cmConnect(t)
	}
	if t.up {
		return t, false, true
	}
	if len(t.queue) >= maxPathQ {
		i.stats.txDropped.Add(1)
	} else {
		t.queue = append(t.queue, joinFrame(frame))
	}
	return t, true, true
}

// cmConnect sets up a transmit connection (ipoib_cm_tx_init): path record, RC QP,
// REQ with our private data, and takes the peer's receive MTU from the REP.
func (i *Interface) cmConnect(t *cmTx) {
	defer i.wg.Done()
	fail := func(err error, rejected bool) {
		i.e.tracef(1, "%s: connection to %s failed: %v", i.Name(), t.hw, err)
		i.dmu.Lock()
		q := t.queue
		t.queue = nil
		if rejected && i.tx[t.hw] == t {
			t.rejected = i.e.clk.Now()
		} else if i.tx[t.hw] == t {
			delete(i.tx, t.hw) // the next packet tries again
		}
		qp := t.takeQPLocked()
		i.dmu.Unlock()
		if qp != nil {
			qp.Close()
		}
		// Frames queued for the connection go over UD when they fit (not through
		// the connected route, which would start another connection for them and,
		// failing the same way, again and again).
		fit := fitting(q, i.data().mcastMTU)
		i.stats.txDropped.Add(uint64(len(q) - len(fit)))
		i.resendVia(t.hw, fit, true)
	}
	sgid, pkey := i.hw.GID(), i.data().pkey
	ctx, cancel := context.WithTimeout(i.ctx, 30*time.Second)
	defer cancel()
	pr, err := i.sa.PathRecord(ctx, sgid, t.hw.GID(), pkey, 0)
	if err != nil {
		fail(err, false)
		return
	}
	qp, err := i.e.dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: i.port, SendCQ: i.cmScq, RecvCQ: i.cmRcq,
		MaxSendWR: i.e.params.SendQueueSize, MaxRecvWR: 1})
	if err != nil {
		fail(err, false)
		return
	}
	i.dmu.Lock()
	if i.tx[t.hw] != t { // the mode switched or the interface closed meanwhile
		i.dmu.Unlock()
		qp.Close()
		return
	}
	t.qp = qp
	i.dmu.Unlock()
	c, err := i.cmMgr.Connect(ctx, cm.ConnectParams{ServiceID: cmServiceBase | uint64(t.hw.QPN()), QP: qp,
		DLID: pr.DLID, DGID: t.hw.GID(), SL: pr.SL, PKey: pkey, PathMTU: pr.MTU,
		PrivateData: i.cmPrivateData(), RetryCount: 7, RNRRetry: 7, AckTimeout: 14, MaxCMRetries: 15,
		SRQ: i.cmHasSRQ}) // as ipoib_cm_send_req says whether this interface has one
	if err != nil {
		var rej *cm.RejectError
		fail(err, errors.As(err, &rej))
		return
	}
	mtu := 0
	if len(c.RemotePrivateData) >= 8 {
		mtu = int(binary.BigEndian.Uint32(c.RemotePrivateData[4:]))
	}
	if mtu <= encapLen { // the kernel refuses such a REP
		go c.Disconnect() // not waited for: up to 16 DREQ timeouts would hold the interface's close
		fail(errors.New("peer announced an unusable receive MTU"), true)
		return
	}
	i.dmu.Lock()
	if i.tx[t.hw] != t {
		q := t.takeQPLocked()
		i.dmu.Unlock()
		go c.Disconnect()
		if q != nil {
			q.Close()
		}
		return
	}
	t.conn, t.up, t.mtu = c, true, mtu
	// The frames that waited were queued before the peer's receive MTU was known:
	// what it cannot take is dropped with the ICMP error, as for a frame sent now
	// (ipoib_cm_rep_handler sends them again through the device, and so the check).
	var q [][]byte
	for _, f := range t.queue {
		if len(f) > mtu {
			i.tooLongLocked([][]byte{f})
			continue
		}
		q = append(q, f)
	}
	t.queue = nil
	icmp := i.icmpOut
	i.icmpOut = nil
	i.dmu.Unlock()
	i.deliverICMP(icmp)
	i.e.tracef(1, "%s: connected to %s (peer receive MTU %d)", i.Name(), t.hw, mtu)
	i.e.event("%s: connection to %s up", i.Name(), t.hw)
	i.cmPost(t, q)
	go func() {
		<-c.Done()
		i.e.event("%s: connection to %s down", i.Name(), t.hw)
		i.dmu.Lock()
		if i.tx[t.hw] == t {
			delete(i.tx, t.hw)
		}
		q := t.takeQPLocked()
		i.dmu.Unlock()
		if q != nil {
			q.Close()
		}
	}()
}

func fitting(frames [][]byte, mcastMTU int) [][]byte {
	out := frames[:0]
	for _, f := range frames {
		if len(f)-encapLen <= mcastMTU {
			out = append(out, f)
		}
	}
	return out
}

// cmPost sends frames on a connection, one message each.
func (i *Interface) cmPost(t *cmTx, frames [][]byte) {
	if len(frames) == 0 {
		return
	}
	wrs := make([]verbs.SendWR, len(frames))
	var bytes uint64
	for k, f := range frames {
		wrs[k] = verbs.SendWR{Data: [][]byte{f}}
		bytes += uint64(len(f))
	}
	i.cmPostWRs(t, wrs, bytes)
}

func (i *Interface) cmPostWRs(t *cmTx, wrs []verbs.SendWR, bytes uint64) {
	i.dmu.Lock()
	qp := t.qp
	i.dmu.Unlock()
	if qp == nil { // torn down since it was routed
		i.stats.txDropped.Add(uint64(len(wrs)))
		return
	}
	if dataDebug {
		i.e.cmdtracef("%s: cm tx %d messages, %d bytes to %s", i.Name(), len(wrs), bytes, t.hw)
	}
	// One send in signalEvery is signalled, so the provider gets its slots back
	// (cmSendLoop reaps the completion); posts to one connection from two send
	// queues may both signal, which costs a completion, not a slot.
	u := t.unsig.Load()
	sig := int(u)+len(wrs) >= signalEvery(i.e.params.SendQueueSize)
	wrs[len(wrs)-1].Signaled = sig
	n, err := qp.PostSend(wrs)
	// Counted as posted: a signalled send the QP did not take (a full queue, a
	// refused post) returns no slot, so the next post signals again. A signalled
	// one takes off what it covered (u), not what another queue added meanwhile.
	if sig && n == len(wrs) {
		t.unsig.Add(-u)
	} else {
		t.unsig.Add(int32(n))
	}
	switch {
	case errors.Is(err, verbs.ErrQueueFull):
		// The connection is busy, not broken (the driver stops its queue until
		// completions make room): what did not fit is dropped, TCP sends it again.
		i.stats.txDropped.Add(uint64(len(wrs) - n))
		bytes = postedBytes(wrs, n)
	case err != nil:
		// As ipoib_cm_send's failed post: a warning, tx_errors, the packet freed; the
		// connection stays. Only a QP that is not sending at all (no longer in RTS)
		// is torn down, to be made again by the next packet: on the driver's HCA
		// such a post is taken and flushed, and a connection left here would refuse
		// every packet to that peer for good.
		i.sendWarnf(warnCMPost, "IPoIB/CM:post_send to %s failed: %v", t.hw, err)
		i.stats.txErrors.Add(uint64(len(wrs) - n))
		bytes = postedBytes(wrs, n)
		if errors.Is(err, verbs.ErrInvalidState) {
			i.cmTxFailed(t)
		}
	}
	i.stats.txPackets.Add(uint64(n))
	i.stats.txBytes.Add(bytes)
}

// cmTxFailed tears a transmit connection down; the next packet rebuilds it.
func (i *Interface) cmTxFailed(t *cmTx) {
	i.dmu.Lock()
	if i.tx[t.hw] == t {
		delete(i.tx, t.hw)
	}
	conn := t.conn
	i.dmu.Unlock()
	if conn != nil {
		go conn.Disconnect()
	}
}

// cmSendLoop reaps send completions of all connections: an error tears the
// connection down (ipoib_cm_handle_tx_wc).
func (i *Interface) cmSendLoop() {
	defer i.wg.Done()
	var wcs []verbs.WC // made at the first completion, as recvLoop's
	for {
		select {
		case <-i.stop:
			return
		case <-i.cmScq.Notify():
		}
		if wcs == nil {
			wcs = make([]verbs.WC, 64)
		}
		for n := i.cmScq.Poll(wcs); n > 0; n = i.cmScq.Poll(wcs) {
			for _, wc := range wcs[:n] {
				i.cmTxCompleted(wc)
			}
		}
	}
}

// cmTxCompleted handles one send completion of a connection: a failed one tears the
// connection down, as ipoib_cm_handle_tx_wc does, and is counted nowhere else (the
// driver counts every completion in tx_packets, failed or not, with a FIXME asking
// whether it should; this engine counted the packet when it posted it).
func (i *Interface) cmTxCompleted(wc verbs.WC) {
	if wc.Status == verbs.WCSuccess || wc.Status == verbs.WCWRFlushErr {
		return
	}
	i.dmu.Lock()
	var bad *cmTx
	for _, t := range i.tx {
		if t.qp != nil && t.qp.Num() == wc.QPN {
			bad = t
		}
	}
	i.dmu.Unlock()
	if bad != nil {
		i.e.tracef(1, "%s: connected-mode send to %s failed: %v", i.Name(), bad.hw, wc.Status)
		i.cmTxFailed(bad)
	}
}

// cmRecvLoop takes the receive completions of all passive connections that the HCA
// signals on Notify; cmRxHandler those it hands over where it makes them, as
// recvLoop and rxHandler do for UD.
func (i *Interface) cmRecvLoop() {
	defer i.wg.Done()
	for {
		select {
		case <-i.stop:
			return
		case <-i.cmRcq.Notify():
		}
		i.cmRxS.mu.Lock()
		i.cmDrainRxLocked()
		i.cmRxS.mu.Unlock()
	}
}

// cmRxHandler is the connected-mode receive CQ's completion handler (rxHandler's twin).
func (i *Interface) cmRxHandler() bool {
	if !i.cmRxS.mu.TryLock() {
		return false
	}
	defer i.cmRxS.mu.Unlock()
	if i.cmRxS.closed {
		return false
	}
	i.cmDrainRxLocked()
	return true
}

// cmRepost is a receive buffer to post again once its packet is delivered: to the
// shared receive queue or to its connection's QP.
type cmRepost struct {
	to interface {
		PostRecv([]verbs.RecvWR) (int, error)
	}
	wr verbs.RecvWR
}

// cmDrainRxLocked polls the connected-mode receive CQ until it is empty and hands the
// packets to the host, in place where it can. Called with cmRxS.mu held.
func (i *Interface) cmDrainRxLocked() {
	r := &i.cmRxS
	if r.wcs == nil {
		r.wcs = make([]verbs.WC, recvBatch) // at the first completion, as the UD drain's
	}
	for n := i.cmRcq.Poll(r.wcs); n > 0; n = i.cmRcq.Poll(r.wcs) {
		frames, re, local := r.frames[:0], r.cmRe[:0], r.local[:0]
		now := i.e.clk.Now()
		i.dmu.Lock()
		host := i.upperHost() // its own, or its bond's (bond.go)
		for _, wc := range r.wcs[:n] {
			rx := i.rx[wc.QPN]
			var buf []byte
			switch {
			case i.cmSRQ != nil && int(wc.WRID) < len(i.cmSRQBufs):
				// A shared buffer goes back to the pool whatever became of the
				// connection it came in on (a flushed one too), or the pool shrinks.
				buf = i.cmSRQBufs[wc.WRID]
				re = append(re, cmRepost{i.cmSRQ, verbs.RecvWR{ID: wc.WRID, Buf: buf[cmRxHeadroom:]}})
			case rx == nil || wc.Status == verbs.WCWRFlushErr || int(wc.WRID) >= len(rx.bufs):
				// A buffer of a connection going or gone: not posted again. Each
				// failed completion (a teardown's flush of every posted buffer
				// too) counts in rx_dropped, as ipoib_cm_handle_rx_wc counts it.
				if wc.Status != verbs.WCSuccess || rx == nil {
					i.stats.rxDropped.Add(1)
				}
				continue
			default:
				buf = rx.bufs[wc.WRID]
				re = append(re, cmRepost{rx.qp, verbs.RecvWR{ID: wc.WRID, Buf: buf[cmRxHeadroom:]}})
			}
			if wc.Status != verbs.WCSuccess || wc.ByteLen < encapLen {
				i.stats.rxDropped.Add(1) // failed or flushed
				continue
			}
			// A packet that arrived before its connection went (reaped, or a DREQ)
			// is delivered, as the driver delivers until the drain: only a shared
			// buffer can be found once the connection is out of the table.
			if rx != nil {
				rx.last = now
			}
			frame := buf[cmRxHeadroom : cmRxHeadroom+wc.ByteLen]
			if dataDebug {
				i.e.cmdtracef("%s: cm rx %d bytes on QPN %#x", i.Name(), len(frame), wc.QPN)
			}
			et := binary.BigEndian.Uint16(frame)
			pkt := frame[encapLen:]
			switch rxClassify(et, pkt) {
			case rxARP, rxND: // handled once dmu is released (they take it)
				local = append(local, rxLocal{et, pkt})
				continue
			case rxDrop:
				i.stats.rxDropped.Add(1)
				continue
			}
			i.stats.rxPackets.Add(1)
			i.stats.rxBytes.Add(uint64(len(pkt)))
			frames = append(frames, buf[:cmRxHeadroom+wc.ByteLen])
		}
		i.dmu.Unlock()
		i.handleLocal(local) // before the buffers are posted again below
		if len(frames) > 0 {
			const off = cmRxHeadroom + encapLen // where each frame's packet starts
			if fh, ok := host.(FrameHost); ok && fh.FrameHeadroom() <= off {
				fh.DeliverFrames(frames, off) // in place: a 64 KiB copy less each
			} else if host != nil {
				for k := range frames {
					frames[k] = frames[k][off:] // the packets
				}
				host.Deliver(frames)
			} else {
				i.stats.rxDropped.Add(uint64(len(frames)))
			}
		}
		// Each run of buffers for one queue (all of them with the SRQ) in one post.
		for rest := re; len(rest) > 0; {
			to, wrs := rest[0].to, r.repost[:0]
			for len(rest) > 0 && rest[0].to == to {
				wrs, rest = append(wrs, rest[0].wr), rest[1:]
			}
			_, _ = to.PostRecv(wrs)
			r.repost = wrs
		}
		r.frames, r.cmRe, r.local = frames, re, local
	}
}

// cmReap tears down passive connections idle for cmRxIdle (ipoib_cm_rx_reap).
func (i *Interface) cmReap() time.Duration {
	if i.cmMgr == nil {
		return time.Hour
	}
	idleFor := i.e.tm.Load().cmRxIdle
	now := i.e.clk.Now()
	var idle []*cmRx
	i.dmu.Lock()
	for q, r := range i.rx {
		// One never established (a REQ whose RTU never came) goes the same way, as
		// ipoib_cm_stale_task reaps every passive id: its QP must not stay for ever.
		if now.Sub(r.last) > idleFor {
			idle = append(idle, r)
			delete(i.rx, q)
		}
	}
	i.dmu.Unlock()
	for _, r := range idle {
		i.cmRxDestroy(r)
	}
	return idleFor / 4
}

// SetMode switches the transport mode with the kernel's side effects. To connected
// (only when the hardware address carries 0x80): checksum and large send off, MTU
// 65520 (the admin MTU is overwritten), paths flushed. To datagram: offloads allowed
// again, MTU = min(group MTU - 4, current), paths and connections flushed.
func (i *Interface) SetMode(m Mode) error {
	i.mu.Lock()
	d := i.data()
	if m == d.mode {
		i.mu.Unlock()
		return nil
	}
	if m == Connected && (i.hw[0]&FlagRC == 0 || i.cmMgr == nil) {
		i.mu.Unlock()
		return &Error{Op: "set_mode", If: i.Name(), Err: syscall.EINVAL, Detail: "the HCA does not support connected mode"}
	}
	// The mode and the tables change in one step: a Transmit sees the old mode and
	// its connections and paths, or the new one with none.
	i.dmu.Lock()
	i.publishLocked(func(d *dataState) { d.mode = m })
	txs := i.tx
	for _, t := range txs {
		i.dropTxQueueLocked(t) // ipoib_neigh_free counts what waited in tx_dropped
	}
	i.tx = map[HWAddr]*cmTx{}
	i.flushPathsLocked()
	i.dmu.Unlock()
	i.e.event("%s: mode %s", i.Name(), m)
	var mtuAct func()
	if m == Connected {
		i.e.log.Printf("%s: enabling connected mode will cause multicast packet drops", i.Name())
		mtuAct = i.setMTULocked(cmMaxMTU)
	} else {
		i.adminMTU = min(d.mcastMTU, d.mtu)
		mtuAct = i.setMTULocked(min(d.mcastMTU, i.adminMTU))
	}
	i.mu.Unlock()
	mtuAct()
	i.pushOffloads()
	for _, t := range txs {
		i.cmTxDestroy(t)
	}
	return nil
}
