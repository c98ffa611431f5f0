package soft

import (
	"testing"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

// On virtual time, exactly: a requester whose peer is gone sends, then resends at each
// local ACK timeout RetryCnt times, and fails the request (retry exceeded, the QP in
// ERR) at the timeout after the last resend, not a nanosecond sooner. Timeout 8
// (1.05 ms) keeps early retransmission off, so every resend is a counted retry.
func TestRCRetryExhaustionOnVirtualTime(t *testing.T) {
	clk := clock.NewMock(t)
	_, _, nodes := fabricOn(t, clk, "", "a", "b")
	const timeout, retries = 8, 3
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{timeout: timeout, retryCnt: retries, rnrRetry: 7})
	b.postRecv(t, verbs.RecvWR{ID: 9, Buf: make([]byte, 100)})
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("hello")}, Signaled: true})
	if wc := pollN(t, a.scq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("first send %+v", wc)
	}
	nodes[1].Close()
	sent := func() uint64 { return nodes[0].SoftPort(1).Counters().XmitPackets }
	before := sent()
	a.post(t, verbs.SendWR{ID: 2, Data: [][]byte{[]byte("lost")}, Signaled: true}) // one packet
	waitFor(t, "the first transmission", func() bool { return sent() > before })
	base := sent()
	const T = 4096 * time.Nanosecond << timeout // IBA: 4.096 us x 2^Timeout
	for k := 1; k <= retries; k++ {
		clk.Advance(T - time.Nanosecond)
		if n := sent() - base; n != uint64(k-1) {
			t.Fatalf("%v before resend %d: %d resends", time.Duration(k)*T-time.Nanosecond, k, n)
		}
		clk.Advance(time.Nanosecond)
		waitFor(t, "a resend", func() bool { return sent()-base == uint64(k) })
	}
	clk.Advance(T - time.Nanosecond)
	if wc := make([]verbs.WC, 1); a.scq.Poll(wc) != 0 {
		t.Fatalf("completion %+v before the last timeout ran out", wc[0])
	}
	clk.Advance(time.Nanosecond)
	if wc := pollN(t, a.scq, 1, 5*time.Second)[0]; wc.WRID != 2 || wc.Status != verbs.WCRetryExcErr {
		t.Fatalf("completion %+v: want WR 2 retry exceeded", wc)
	}
	if st := a.qp.State(); st != verbs.QPErr {
		t.Errorf("QP %v after retry exhaustion, want ERR", st)
	}
	if n := sent() - base; n != retries {
		t.Errorf("%d resends, want %d", n, retries)
	}
}

// Kept requests do not outlive a gap that does not fill (a requester gone): on
// virtual time, three requests kept behind a gap are dropped rcKeepMax after the
// first was kept, not a nanosecond sooner, giving the HCA's budget back; when the
// gap's packet comes at last it is delivered, and the gap behind it is NAKed, as for
// requests dropped on arrival.
func TestRCKeptRequestsExpire(t *testing.T) {
	clk := clock.NewMock(t)
	_, _, nodes := fabricOn(t, clk, "", "a", "b")
	_, b := rcPair(t, nodes[0], nodes[1], rcOpts{psnA: 1000, psnB: 2000})
	for i := range 4 {
		b.postRecv(t, verbs.RecvWR{ID: uint64(i), Buf: make([]byte, 100)})
	}
	pb := nodes[1].SoftPort(1)
	send := func(psn uint32) Datagram {
		return Datagram{Addr: nodes[0].Endpoint(1), Data: craft(t, nodes[0], nodes[1], wire.Packet{BTH: wire.BTH{
			Opcode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: uint32(b.qp.Num()), PSN: psn, AckReq: true}, Payload: []byte("x")})}
	}
	pb.receive([]Datagram{send(1001), send(1002), send(1003)}, true)
	kept := func() int64 { return nodes[1].oooBytes.Load() }
	if n := kept(); n != 3*oooBufCap {
		t.Fatalf("%d bytes kept for three requests behind a gap", n)
	}
	clk.Advance(rcKeepMax - time.Nanosecond)
	if n := kept(); n != 3*oooBufCap {
		t.Fatalf("%d bytes kept %v after: dropped too soon", n, rcKeepMax-time.Nanosecond)
	}
	clk.Advance(time.Nanosecond)
	waitFor(t, "the kept requests dropped", func() bool { return kept() == 0 })
	st := rcStatsOf(b)
	if st.expired != 3 || st.seqNAKs != 1 {
		t.Fatalf("responder %+v: want 3 expired, one NAK", st)
	}
	// Two seconds at once on the fabric's clock may have made b forget a for a while
	// (its announcements are on the same clock): the gap's packet from a must be
	// taken for a's.
	waitFor(t, "b knowing a's endpoint", func() bool { _, ok := pb.source(nodes[0].Endpoint(1)); return ok })
	pb.receive([]Datagram{send(1000)}, true)
	if wc := pollN(t, b.rcq, 1, time.Second)[0]; wc.Status != verbs.WCSuccess || wc.WRID != 0 {
		t.Fatalf("the gap's packet: %+v", wc)
	}
	quiet(t, b.rcq, 20*time.Millisecond, "after the gap's packet: the expired requests")
	if st := rcStatsOf(b); st.seqNAKs != 2 {
		t.Fatalf("responder %+v: the gap behind the expired requests was not NAKed", st)
	}
}

// A NAK inside a run the requester resent after a burst is put off, not dropped: on
// virtual time, with no ACK timeout (so no early retransmission), the run's packet it
// names is resent alone two round trips later (rcMinEarly before any is measured),
// not a nanosecond sooner, when it is still the oldest unacknowledged.
func TestRCNAKInsideARunIsPutOff(t *testing.T) {
	clk := clock.NewMock(t)
	_, smh, nodes := fabricOn(t, clk, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU256, noTimeout: true, retryCnt: 7, rnrRetry: 7, psnA: 500})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 100)})
	setFaults(t, smh, nodes, Faults{Loss: 1}) // a's packets are lost; the NAKs are handed to a directly
	var wrs []verbs.SendWR
	for i := range 8 {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Data: [][]byte{{byte(i)}}})
	}
	a.post(t, wrs...) // PSNs 500..507
	pa := nodes[0].SoftPort(1)
	nak := func(psn uint32) uint64 {
		before := pa.Counters().XmitPackets
		pkt := craft(t, nodes[1], nodes[0], wire.Packet{BTH: wire.BTH{Opcode: wire.OpRCAck, PKey: 0xffff, DestQP: uint32(a.qp.Num()), PSN: psn},
			AETH: wire.AETH{Syndrome: 0x60}})
		pa.receive([]Datagram{{Addr: nodes[1].Endpoint(1), Data: pkt}}, true)
		return pa.Counters().XmitPackets - before
	}
	if n := nak(500); n != 2 {
		t.Fatalf("NAK 500: %d packets resent, want 500 twice", n)
	}
	if n := nak(501); n != 7 {
		t.Fatalf("NAK 501, right after the resend: %d packets resent, want the run 501..507", n)
	}
	if n := nak(503); n != 0 {
		t.Fatalf("NAK 503, inside the run: %d packets resent at once", n)
	}
	sent := func() uint64 { return pa.Counters().XmitPackets }
	base := sent()
	clk.Advance(rcMinEarly - time.Nanosecond)
	time.Sleep(10 * time.Millisecond) // a resend would be on its way by now
	if n := sent() - base; n != 0 {
		t.Fatalf("%d packets resent before the NAK's time", n)
	}
	clk.Advance(time.Nanosecond)
	waitFor(t, "503 resent alone", func() bool { return sent()-base == 2 })
	if st := rcStatsOf(a); st.selects != 3 || st.goBacks != 0 || st.timeouts != 0 {
		t.Fatalf("requester %+v: want three selective resends", st)
	}
}

// Requests kept by a QP that is only a responder yet (RTR) expire as well.
func TestRCKeptRequestsExpireInRTR(t *testing.T) {
	clk := clock.NewMock(t)
	_, _, nodes := fabricOn(t, clk, "", "a", "b")
	o := rcOpts{}
	o.defaults()
	a, b := newRCEnd(t, nodes[0], o), newRCEnd(t, nodes[1], o)
	for _, m := range []verbs.QPModify{
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit},
		{Mask: verbs.QPMaskState | verbs.QPMaskDestQPN | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskRQPSN,
			State: verbs.QPRTR, DestQPN: a.qp.Num(), AH: verbs.AHAttr{Port: 1, DLID: a.lid()}, PathMTU: o.mtu, RQPSN: 1000},
	} {
		if err := b.qp.Modify(m); err != nil {
			t.Fatal(err)
		}
	}
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 100)})
	var batch []Datagram
	for psn := uint32(1001); psn <= 1003; psn++ {
		batch = append(batch, Datagram{Addr: nodes[0].Endpoint(1), Data: craft(t, nodes[0], nodes[1], wire.Packet{BTH: wire.BTH{
			Opcode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: uint32(b.qp.Num()), PSN: psn, AckReq: true}, Payload: []byte("x")})})
	}
	nodes[1].SoftPort(1).receive(batch, true)
	if n := nodes[1].oooBytes.Load(); n != 3*oooBufCap {
		t.Fatalf("%d bytes kept in RTR for three requests behind a gap", n)
	}
	clk.Advance(rcKeepMax)
	waitFor(t, "the requests kept in RTR dropped", func() bool { return nodes[1].oooBytes.Load() == 0 })
	if st := b.qp.State(); st != verbs.QPRTR {
		t.Fatalf("QP in %v, want RTR", st)
	}
}
