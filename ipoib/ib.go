package ipoib

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"

	"ipoibfs/verbs"
)

const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd
)

// outFrame is a frame ready to post: on UD its AH and destination QPN, in connected
// mode the connection.
type outFrame struct {
	ah    verbs.AH
	qpn   verbs.QPN
	tx    *cmTx
	frame [][]byte // gather list: the 4-byte header, then the packet
	size  int      // bytes, IPoIB header included
}

// Transmit sends IP packets the kernel routed out of this interface. Packets are
// batched into one post; packets waiting for a neighbour, path or join are copied into
// bounded queues, as the kernel driver does.
func (i *Interface) Transmit(pkts [][]byte) { i.TransmitQueue(0, pkts) }

// TransmitQueue is Transmit from the host's queue q (of SetSendQueues; a q beyond
// them wraps): the queues post in parallel, each batch in order within its queue.
func (i *Interface) TransmitQueue(q int, pkts [][]byte) {
	// ICMP errors for packets too long go to the host once the queue is released: the
	// host may be sending the next batch meanwhile.
	i.deliverICMP(i.transmit(i.lane(q), pkts))
}

// transmit classifies, resolves and posts a batch on send queue l and returns the
// ICMP errors it made.
func (i *Interface) transmit(l *txLane, pkts [][]byte) (icmp [][]byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.out[:0]
	if cap(l.hdr) < len(pkts) {
		l.hdr = make([][encapLen]byte, len(pkts))
	}
	hdrs := l.hdr[:len(pkts)]
	fb := framePool.Get().(*[][]byte)
	if cap(*fb) < 2*len(pkts) {
		*fb = make([][]byte, 2*len(pkts))
	}
	frames := (*fb)[:2*len(pkts)]
	defer func() {
		clear(frames) // no references to the caller's packets stay behind
		framePool.Put(fb)
	}()
	// The tables and the state they were made for (d) stay as they are while dmu is
	// held; the control path's lock is not taken.
	i.dmu.Lock()
	d := i.data()
	if !d.up || !d.carrier || !d.qpReady {
		i.dmu.Unlock()
		i.stats.txDropped.Add(uint64(len(pkts)))
		return nil
	}
	// The UD destination of the last unicast packet: the packets of one batch mostly
	// go to one peer (a large send's segments), and with dmu held its neighbour and
	// path stay as they are, so one lookup serves the run. In connected mode every
	// packet takes the full way (connections come and go by the clock).
	var last struct {
		dst netip.Addr
		ah  verbs.AH
		qpn verbs.QPN
	}
	cache := d.mode == Datagram
	for k, pkt := range pkts {
		et, dst, ok := classify(pkt)
		if !ok {
			i.stats.txDropped.Add(1)
			continue
		}
		if len(pkt) > d.mtu {
			i.tooLongLocked([][]byte{nil4[:], pkt})
			continue
		}
		if et == etherIPv6 && isNDMessage(pkt) {
			continue // the engine does ND itself; the kernel's own (a TUN has no link layer) is dropped
		}
		binary.BigEndian.PutUint16(hdrs[k][:], et)
		hdrs[k][2], hdrs[k][3] = 0, 0
		frame := frames[2*k : 2*k+2 : 2*k+2]
		frame[0], frame[1] = hdrs[k][:], pkt
		if last.ah != nil && dst == last.dst && len(pkt) <= d.mcastMTU {
			out = append(out, outFrame{ah: last.ah, qpn: last.qpn, frame: frame, size: len(pkt) + encapLen})
			continue
		}
		if mgid, ok := d.groupFor(dst); ok {
			if len(pkt) > d.mcastMTU { // connected mode: multicast stays on UD
				i.tooLongLocked(frame)
				continue
			}
			ah, ok := i.sendMulticastLocked(mgid, joinFrame(frame))
			if ok {
				out = append(out, outFrame{ah: ah, qpn: verbs.MulticastQPN, frame: frame, size: len(pkt) + encapLen})
			}
			continue
		}
		o, ok := i.sendUnicastLocked(dst, frame, len(pkt)+encapLen)
		if ok {
			out = append(out, o)
		}
		if cache && ok && o.tx == nil && o.ah != nil {
			last.dst, last.ah, last.qpn = dst, o.ah, o.qpn
		} else {
			last.ah = nil
		}
	}
	icmp, i.icmpOut = i.icmpOut, nil
	i.dmu.Unlock()
	i.post(l, out)
	clear(out)
	l.out = out[:0]
	return icmp
}

// framePool holds the gather lists (IPoIB header, packet) of Transmit batches: a
// packet costs no allocation on its way to the HCA.
var framePool = sync.Pool{New: func() any { return new([][]byte) }}

// nil4 stands in for the IPoIB header where only the packet matters.
var nil4 [encapLen]byte

// joinFrame flattens a gather list into one new buffer (for queueing).
func joinFrame(f [][]byte) []byte {
	n := 0
	for _, p := range f {
		n += len(p)
	}
	b := make([]byte, 0, n)
	for _, p := range f {
		b = append(b, p...)
	}
	return b
}

// post sends frames in one batch on send queue l. Called with l.mu held.
func (i *Interface) post(l *txLane, out []outFrame) {
	if len(out) == 0 {
		return
	}
	qkey := i.data().qkey
	wrs := l.wrs[:0]
	var bytes uint64
	for k := 0; k < len(out); k++ {
		o := out[k]
		if o.tx != nil {
			// Consecutive frames for one connection go in one post.
			rc := []verbs.SendWR{{Data: o.frame}}
			n := uint64(o.size)
			for k+1 < len(out) && out[k+1].tx == o.tx {
				k++
				rc = append(rc, verbs.SendWR{Data: out[k].frame})
				n += uint64(out[k].size)
			}
			i.cmPostWRs(o.tx, rc, n)
			continue
		}
		wrs = append(wrs, verbs.SendWR{AH: o.ah, RemoteQPN: o.qpn, RemoteQKey: qkey, Data: o.frame})
		bytes += uint64(o.size)
	}
	if len(wrs) == 0 {
		return
	}
	if dataDebug {
		i.e.dtracef("%s: tx %d frames, %d bytes", i.Name(), len(wrs), bytes)
	}
	// The slots of sends before the last signalled one come back; a send that failed
	// since is seen to (its QP moved out of SQE) before this batch goes where it would
	// be flushed.
	i.reapLane(l)
	sig := l.unsig+len(wrs) >= signalEvery(i.e.params.SendQueueSize)
	wrs[len(wrs)-1].Signaled = sig
	n, err := l.qp.PostSend(wrs)
	if sig && n == len(wrs) {
		l.unsig = 0
	} else {
		l.unsig += n
	}
	// A send of this batch that failed at once (the soft HCA completes in the post)
	// is seen to now, not at the next batch, which would be flushed.
	i.reapLane(l)
	switch {
	case errors.Is(err, verbs.ErrQueueFull):
		// The queue is busy, not broken (the driver stops its queue before the ring
		// fills, which the TUN cannot): what did not fit is dropped, as a
		// connection's full queue drops (cmPostWRs).
		i.stats.txDropped.Add(uint64(len(wrs) - n))
		bytes = postedBytes(wrs, n)
	case err != nil:
		// As ipoib_send's failed post: a warning, tx_errors and the packet freed,
		// neither sent (tx_packets, tx_bytes) nor dropped.
		i.sendWarnf(warnPost, "post_send failed: %v", err)
		i.stats.txErrors.Add(uint64(len(wrs) - n))
		bytes = postedBytes(wrs, n)
	}
	i.stats.txPackets.Add(uint64(n))
	i.stats.txBytes.Add(bytes)
	clear(wrs)
	l.wrs = wrs[:0]
}

// The send path's warnings, each limited on its own as each ipoib_warn call site is
// (the QP state's are the driver's pr_warn and pr_info, limited here all the same: a
// send that fails every time would log a line a batch).
type sendWarn int

const (
	warnPost    sendWarn = iota // a UD post the HCA refused
	warnTxEvent                 // a failed UD send completion
	warnQPState                 // a send queue's QP not brought back to RTS
	warnCMPost                  // a connected-mode post the HCA refused
	numSendWarns
)

var sendWarnNames = [numSendWarns]string{"post_send failed", "failed send event", "QP state", "IPoIB/CM:post_send failed"}

// sendWarnf logs a send path warning as ipoib_warn does: at most 100 of each kind in
// 10 s, the count of those held back logged when the next window opens.
func (i *Interface) sendWarnf(w sendWarn, format string, a ...any) {
	r := i.e.warn[w]
	ok, held := r.allow(i.e.clk.Now())
	if held > 0 {
		i.e.log.Printf("ipoib: %d %q warnings suppressed", held, r.what)
	}
	if ok {
		i.e.log.Printf("%s: "+format, append([]any{i.Name()}, a...)...)
	}
}

// postedBytes is the size of the first n work requests: what a post that took only
// those sent.
func postedBytes(wrs []verbs.SendWR, n int) uint64 {
	var b uint64
	for _, wr := range wrs[:n] {
		for _, d := range wr.Data {
			b += uint64(len(d))
		}
	}
	return b
}

// sendFrames posts already-encapsulated frames (flushed queues, ARP and ND replies).
func (i *Interface) sendFrames(frames [][]byte, ah verbs.AH, qpn verbs.QPN) {
	if len(frames) == 0 || ah == nil {
		return
	}
	out := make([]outFrame, len(frames))
	for k, f := range frames {
		out[k] = outFrame{ah: ah, qpn: qpn, frame: [][]byte{f}, size: len(f)}
	}
	i.tx0.mu.Lock()
	i.post(&i.tx0, out)
	i.tx0.mu.Unlock()
}

// reapSendCQ collects the send completions of the interface's send queues (only
// errors and signalled sends produce them), for the interface task: a failed one has
// its queue's QP checked (reapLane).
func (i *Interface) reapSendCQ() {
	for _, l := range *i.lanes.Load() {
		l.mu.Lock()
		i.reapLane(l)
		l.mu.Unlock()
	}
}

// reapLane reaps a send queue's CQ; a failed send has the queue's QP checked at once,
// as ipoib_ib_handle_tx_wc queues ipoib_qp_state_validate_work. Called with l.mu held.
func (i *Interface) reapLane(l *txLane) {
	if i.reapCQ(l.scq) && i.data().qpReady && (l == (*i.lanes.Load())[0] || l.ready.Load()) {
		i.validateQP(l.qp)
	}
}

// validateQP is the driver's ipoib_qp_state_validate_work: a UD send error moves a QP
// to SQE, where the HCA flushes every later send until the QP is moved back to RTS.
// A QP in another state is left as it is (a restart moves it), and said so unless it
// is sending (RTS). Called with the queue's mu held, on the post's path (a failed send
// is seen to before the next batch, which SQE would flush) or by the interface task
// (reapSendCQ). A restart (under the interface's mu) may move the QP meanwhile: the
// move back from SQE then fails, and says so.
func (i *Interface) validateQP(qp verbs.QP) {
	switch st := qp.State(); st {
	case verbs.QPRTS:
	case verbs.QPSQE:
		if err := qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPRTS}); err != nil {
			i.sendWarnf(warnQPState, "failed to move QP %#x from SQE to RTS: %v", uint32(qp.Num()), err)
			return
		}
		// Through the limit too: a send that fails every time moves it back each batch.
		i.sendWarnf(warnQPState, "QP %#x moved from SQE to RTS", uint32(qp.Num()))
	default:
		i.sendWarnf(warnQPState, "QP %#x will stay in state %v", uint32(qp.Num()), st)
	}
}

// reapCQ collects the completions of a UD send CQ. A failed one is logged, as
// ipoib_ib_handle_tx_wc warns of it (at most 100 in 10 s, as ipoib_warn), and counted
// nowhere else: the driver counts every send completion in tx_packets, failed or not
// (this engine counted the packet when it posted it), and tx_errors only for posts the
// HCA refused.
// It reports whether a send failed.
func (i *Interface) reapCQ(cq verbs.CQ) (failed bool) {
	var wc [32]verbs.WC
	for n := cq.Poll(wc[:]); n > 0; n = cq.Poll(wc[:]) {
		for _, c := range wc[:n] {
			if c.Status == verbs.WCSuccess || c.Status == verbs.WCWRFlushErr {
				continue
			}
			failed = true
			i.sendWarnf(warnTxEvent, "failed send event (status=%v, wrid=%d)", c.Status, c.WRID)
		}
	}
	return failed
}

// classify returns the EtherType and destination of an IP packet.
// rxKind is what the receive paths (UD and connected mode alike, as the driver's both
// hand every protocol up) do with a received frame's payload.
type rxKind int

const (
	rxDrop rxKind = iota // neither IP nor ARP, or not a valid IP packet: dropped, counted
	rxARP                // the engine's: the TUN device has no link layer
	rxND                 // IPv6 neighbour discovery: the engine's, for the same reason
	rxUp                 // an IP packet for the host
)

// rxClassify sorts a frame with IPoIB ethertype et and payload pkt.
func rxClassify(et uint16, pkt []byte) rxKind {
	switch et {
	case etherARP:
		return rxARP
	case etherIPv4, etherIPv6:
	default:
		return rxDrop
	}
	if et == etherIPv6 && isNDMessage(pkt) {
		return rxND
	}
	if _, _, ok := classify(pkt); !ok {
		return rxDrop
	}
	return rxUp
}

func classify(pkt []byte) (uint16, netip.Addr, bool) {
	if len(pkt) < 1 {
		return 0, netip.Addr{}, false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return 0, netip.Addr{}, false
		}
		return etherIPv4, netip.AddrFrom4([4]byte(pkt[16:20])), true
	case 6:
		if len(pkt) < 40 {
			return 0, netip.Addr{}, false
		}
		return etherIPv6, netip.AddrFrom16([16]byte(pkt[24:40])), true
	}
	return 0, netip.Addr{}, false
}

// groupFor returns the MGID for multicast and broadcast destinations: IP multicast
// maps per RFC 4391; limited broadcast and the directed broadcast of the interface's
// IPv4 subnets go to the broadcast group, as the kernel resolves them to
// dev->broadcast.
func (d *dataState) groupFor(dst netip.Addr) (verbs.GID, bool) {
	if dst.IsMulticast() {
		return mgidForIP(dst, d.bcast), true
	}
	if !dst.Is4() {
		return verbs.GID{}, false
	}
	if dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return d.bcast.GID(), true
	}
	for _, p := range d.hostAddrs {
		if p.Addr().Is4() && p.Bits() < 31 && p.Contains(dst) && dst == lastAddr(p) {
			return d.bcast.GID(), true
		}
	}
	return verbs.GID{}, false
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a)
}

// recvLoop takes the receive completions the HCA signals on Notify; rxHandler takes
// those it hands over where it makes them (verbs.CQAttr.Handler: a ping's packet
// reaches the kernel on the thread that took it off the wire, with no goroutine to
// wake). Either drains the CQ holding udRx.mu, so batches reach the host in order.
func (i *Interface) recvLoop() {
	defer i.wg.Done()
	for {
		select {
		case <-i.stop:
			return
		case <-i.rcq.Notify():
		}
		i.udRx.mu.Lock()
		i.drainRxLocked()
		i.udRx.mu.Unlock()
	}
}

// rxHandler is the receive CQ's completion handler: it drains the CQ where the HCA
// made the completions unless a drain is under way (the loop's, which polls again
// once signalled) or the interface is closing.
func (i *Interface) rxHandler() bool {
	if !i.udRx.mu.TryLock() {
		return false
	}
	defer i.udRx.mu.Unlock()
	if i.udRx.closed {
		return false
	}
	i.drainRxLocked()
	return true
}

// rxState is what one drain of a receive CQ works with, kept between drains; mu makes
// the drains of the receive loop and of the completion handler one at a time (udRx:
// recvLoop and rxHandler; cmRxS: cmRecvLoop and cmRxHandler).
type rxState struct {
	mu     sync.Mutex
	closed bool // close has begun: the handler leaves the CQ alone
	// The arrays are made at the first completion: most children never get one
	// (about 4.6 MB per 1000 idle children, heap profile).
	wcs    []verbs.WC
	repost []verbs.RecvWR // the buffers to post again
	b      rxBatch        // UD; grows to what batches hold: most interfaces are idle
	local  []rxLocal
	// Connected mode's: the packets for the host, as frames with headroom, and their
	// buffers to post again after the host took them.
	frames [][]byte
	cmRe   []cmRepost
}

// drainRxLocked is the receive completion handler (ipoib_ib_handle_rx_wc): it polls
// the CQ until it is empty, and hands each batch to the host. Called with udRx.mu held.
//
// The host takes the packets where they are, in the receive buffers, and copies them
// (a TUN write copies into the large buffers its GRO coalesces in, which the ring's
// MTU-sized buffers could not be), and the buffers go back to the receive queue
// after: one copy of each packet less than copying them out first, which was a third
// of the receiver's memmove (netbench -profile). While the host takes a batch the HCA
// has every other buffer of the queue (and waits briefly for more before it drops,
// see verbs/soft). A batch with ARP or ND in it is copied out as before, so that they
// are handled before its IP packets go up, as they came, and after rxMu is released
// (answering sends).
//
// A batch is polled, delivered (or copied) and re-posted under rxMu, so that a QP
// restart, which posts the whole ring afresh, cannot hand a buffer to the HCA while
// its packet is being read; completions of a ring from before a restart (their WR IDs
// carry its generation) are dropped, their buffers posted again already.
func (i *Interface) drainRxLocked() {
	r := &i.udRx
	if r.wcs == nil {
		r.wcs, r.repost = make([]verbs.WC, recvBatch), make([]verbs.RecvWR, 0, recvBatch)
	}
	for {
		i.rxMu.Lock()
		n := i.pollRxLocked(r.wcs)
		if n == 0 {
			i.rxMu.Unlock()
			return
		}
		var c rxCounts
		r.repost, r.local, c = i.sortRxLocked(r.wcs[:n], &r.b, r.repost[:0], r.local[:0])
		host := i.upperHost() // its own, or its bond's (bond.go)
		r.b.pkts = r.b.pkts[:0]
		switch {
		case len(r.b.frames) == 0:
		case host == nil: // an inactive bond slave's broadcasts: nobody takes them
			i.stats.rxDropped.Add(uint64(len(r.b.frames)))
		case len(r.local) == 0:
			// In the receive buffers; a FrameHost writes them from there with its
			// header in the GRH's room (a TUN device: only the packets its GRO
			// coalesces into are copied, into larger buffers).
			if fh, ok := host.(FrameHost); ok && fh.FrameHeadroom() <= udFrameOff {
				fh.DeliverFrames(r.b.frames, udFrameOff)
			} else {
				host.Deliver(r.b.packets())
				clear(r.b.pkts)
				r.b.pkts = r.b.pkts[:0]
			}
		default:
			r.b.copyOut() // ARP or ND come first, without rxMu
		}
		i.repostRecvLocked(r.repost)
		i.rxMu.Unlock()
		c.add(&i.stats)
		i.handleLocal(r.local)
		if len(r.b.pkts) > 0 {
			host.Deliver(r.b.pkts) // the copies of a batch with ARP or ND
		}
	}
}

// rxCounts are a received batch's statistics.
type rxCounts struct{ pkts, bytes, mcast, dropped uint64 }

func (c *rxCounts) add(s *stats) {
	if c.dropped > 0 {
		s.rxDropped.Add(c.dropped)
	}
	if c.mcast > 0 {
		s.multicast.Add(c.mcast)
	}
	if c.pkts > 0 {
		s.rxPackets.Add(c.pkts)
		s.rxBytes.Add(c.bytes)
	}
}

// sortRxLocked sorts a batch of UD receive completions: the IP packets for the host
// go into b (in their receive buffers: copyOut copies them), ARP and ND into local
// (copies), and the buffers of the current ring into repost. Called with rxMu held.
func (i *Interface) sortRxLocked(wcs []verbs.WC, b *rxBatch, repost []verbs.RecvWR, local []rxLocal) ([]verbs.RecvWR, []rxLocal, rxCounts) {
	var c rxCounts
	clear(b.frames)
	b.arena, b.frames = b.arena[:0], b.frames[:0]
	d := i.data()
	ownQPN, ownGID, bgid := i.hw.QPN(), i.hw.GID(), d.bcast.GID()
	p, _ := i.e.dev.Port(i.port)
	ownLID := p.Attr().LID
	for _, wc := range wcs {
		if wc.Status == verbs.WCWRFlushErr || uint32(wc.WRID>>32) != d.qpGen {
			continue // QP reset, or a ring since posted afresh
		}
		buf := i.recvBufs[uint32(wc.WRID)]
		repost = append(repost, verbs.RecvWR{ID: wc.WRID, Buf: buf})
		if wc.Status != verbs.WCSuccess || wc.ByteLen < grhLen+encapLen {
			c.dropped++
			continue
		}
		if fromSelf(wc, buf, ownLID, ownQPN, ownGID) {
			continue // our own multicast looped back by the HCA
		}
		frame := buf[grhLen:wc.ByteLen]
		if dataDebug {
			i.e.dtracef("%s: rx %d bytes from LID %#x QPN %#x", i.Name(), len(frame), wc.SLID, wc.SrcQP)
		}
		dgid := verbs.GID(buf[24:40])
		et := binary.BigEndian.Uint16(frame)
		pkt := frame[encapLen:]
		kind := rxClassify(et, pkt)
		if kind == rxDrop {
			c.dropped++
			continue
		}
		if kind != rxUp { // ARP and ND: handled once rxMu is released (they send)
			local = append(local, rxLocal{et, b.copy(pkt)})
			continue
		}
		if dgid.IsMulticast() && dgid != bgid {
			c.mcast++
		}
		c.pkts++
		c.bytes += uint64(len(pkt))
		b.frames = append(b.frames, buf[:wc.ByteLen]) // the whole buffer's capacity: GRO may extend the packet in it
	}
	return repost, local, c
}

// udFrameOff is where a UD receive buffer's packet starts: after the GRH and the
// IPoIB header, room a FrameHost may write its own header into.
const udFrameOff = grhLen + encapLen

// rxLocal is a received ARP or ND packet, for the engine itself.
type rxLocal struct {
	et  uint16
	pkt []byte
}

// handleLocal answers and learns from received ARP and ND packets.
func (i *Interface) handleLocal(local []rxLocal) {
	for _, l := range local {
		if l.et == etherARP {
			i.handleARP(l.pkt)
		} else {
			i.handleND(l.pkt)
		}
	}
}

// repostRecvLocked gives received buffers back to the receive queue; none is posted
// while the QP is down (the next open posts the ring). Called with rxMu held, with
// buffers of the current ring generation.
func (i *Interface) repostRecvLocked(wrs []verbs.RecvWR) {
	if len(wrs) == 0 || !i.data().qpReady {
		return
	}
	if _, err := i.postRxLocked(wrs); err != nil {
		i.e.tracef(1, "%s: re-posting receive buffers: %v", i.Name(), err)
	}
}

// postRxLocked and pollRxLocked post receive buffers and poll their completions,
// keeping rxOut: every completion on rcq is one of the QP's receive buffers. Called
// with rxMu held.
func (i *Interface) postRxLocked(wrs []verbs.RecvWR) (int, error) {
	n, err := i.qp.PostRecv(wrs)
	i.rxOut += n
	return n, err
}

func (i *Interface) pollRxLocked(wcs []verbs.WC) int {
	n := i.rcq.Poll(wcs)
	i.rxOut -= n
	return n
}

// rxBatch is a batch of received packets: their receive buffers (frames), and the
// packets themselves, in those buffers (packets) or copied out into arena (copyOut).
type rxBatch struct {
	arena  []byte
	pkts   [][]byte
	frames [][]byte // the packets' receive buffers, each up to its packet's end (udFrameOff)
}

// packets returns the frames' packets, in place.
func (b *rxBatch) packets() [][]byte {
	for _, f := range b.frames {
		b.pkts = append(b.pkts, f[udFrameOff:len(f):len(f)])
	}
	return b.pkts
}

// copy appends a copy of p to the arena and returns it. A full arena is replaced, not
// grown: the copies already made keep the old one.
func (b *rxBatch) copy(p []byte) []byte {
	if len(b.arena)+len(p) > cap(b.arena) {
		b.arena = make([]byte, 0, max(2*cap(b.arena), 64<<10, len(p)))
	}
	off := len(b.arena)
	b.arena = append(b.arena, p...)
	return b.arena[off:len(b.arena):len(b.arena)]
}

// copyOut makes the batch's packets copies in the arena.
func (b *rxBatch) copyOut() {
	for _, f := range b.frames {
		b.pkts = append(b.pkts, b.copy(f[udFrameOff:]))
	}
}
