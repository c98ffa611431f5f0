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
