package soft

import (
	"testing"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
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
