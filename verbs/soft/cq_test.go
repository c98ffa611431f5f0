package soft

import (
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

// A CQ's ring grows as completions pile up, keeps them in order across the growth
// (also when the ring has wrapped), holds exactly its capacity and counts the rest as
// overruns. A CQ that never had a completion holds no ring.
func TestCQGrowsToCapacity(t *testing.T) {
	const entries = 300
	c := newCQ(entries)
	if len(c.ring) != 0 {
		t.Fatalf("a new CQ of %d entries allocated %d up front, want none until a completion", entries, len(c.ring))
	}
	next, want := uint64(0), uint64(0)
	wcs := make([]verbs.WC, 7)
	// Wrap the small ring first: push 50, poll 40, so head is not 0 when it grows.
	for range 50 {
		c.push(verbs.WC{WRID: next})
		next++
	}
	for got := 0; got < 40; {
		n := c.Poll(wcs[:min(7, 40-got)])
		for _, wc := range wcs[:n] {
			if wc.WRID != want {
				t.Fatalf("completion %d polled as %d", want, wc.WRID)
			}
			want++
		}
		got += n
	}
	for c.n < entries {
		c.push(verbs.WC{WRID: next})
		next++
	}
	c.push(verbs.WC{WRID: next}) // one too many
	if c.Overruns() != 1 {
		t.Errorf("overruns %d after exceeding %d entries, want 1", c.Overruns(), entries)
	}
	for n := c.Poll(wcs); n > 0; n = c.Poll(wcs) {
		for _, wc := range wcs[:n] {
			if wc.WRID != want {
				t.Fatalf("completion %d polled as %d", want, wc.WRID)
			}
			want++
		}
	}
	if want != next {
		t.Errorf("polled up to %d, pushed %d (the last one overran)", want, next)
	}
}

// A receive CQ's handler runs where the HCA made the completions, once at the end of
// the received batch, in place of the Notify signal (a ping's packet reaches its
// consumer with no goroutine to wake); declined, the signal goes to Notify. A batch
// that leaves more than cqDeferMax completions is signalled as it comes, as is the
// completion that takes a QP's last posted buffer (its consumer must post more before
// the next packet waits for one).
func TestCQHandlerRunsAtTheEndOfAReceivedBatch(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	pb := nodes[1].SoftPort(1)
	var (
		mu     sync.Mutex
		accept = true
		calls  int
		polled int
		inRecv bool // the handler ran inside Port.receive
	)
	var rcq verbs.CQ
	handler := func() bool {
		mu.Lock()
		defer mu.Unlock()
		calls++
		inRecv = strings.Contains(string(debug.Stack()), "(*Port).receive")
		if !accept {
			return false
		}
		wc := make([]verbs.WC, 64)
		for n := rcq.Poll(wc); n > 0; n = rcq.Poll(wc) {
			polled += n
		}
		return true
	}
	qp, rcq := handlerQP(t, nodes[1], handler, 100)
	batch := udBatch(t, nodes[0], nodes[1], qp.Num())
	signalled := func() bool {
		select {
		case <-rcq.Notify():
			return true
		default:
			return false
		}
	}
	state := func() (int, int, bool) { mu.Lock(); defer mu.Unlock(); return calls, polled, inRecv }

	pb.receive(batch(1), true)
	if c, p, in := state(); c != 1 || p != 1 || !in {
		t.Fatalf("one packet: handler called %d times (in the receive: %v), polled %d; want once, in the receive, 1", c, in, p)
	}
	if signalled() {
		t.Fatal("one packet taken by the handler also signalled Notify")
	}
	pb.receive(batch(cqDeferMax), true)
	if c, p, _ := state(); c != 2 || p != 1+cqDeferMax {
		t.Fatalf("a batch of %d: handler called %d times in all, polled %d; want 2, %d", cqDeferMax, c, p, 1+cqDeferMax)
	}

	mu.Lock()
	accept = false
	mu.Unlock()
	pb.receive(batch(1), true)
	if c, _, _ := state(); c != 3 || !signalled() {
		t.Fatalf("declined: handler called %d times in all (want 3), Notify signalled: false", c)
	}
	wc := make([]verbs.WC, 64)
	if n := rcq.Poll(wc); n != 1 {
		t.Fatalf("declined: %d completions left for the poller, want 1", n)
	}

	mu.Lock()
	accept = true
	mu.Unlock()
	pb.receive(batch(cqDeferMax+4), true)
	if c, _, _ := state(); c != 3 || !signalled() {
		t.Fatalf("a batch of %d: handler called (%d in all, want 3) or Notify not signalled", cqDeferMax+4, c)
	}
	if n := rcq.Poll(wc); n != cqDeferMax+4 {
		t.Fatalf("a batch of %d: %d completions polled", cqDeferMax+4, n)
	}
}

// A QP with 4 buffers posted and a batch of 6 packets, whose consumer posts buffers
// when Notify says there are completions: the completion that took the last buffer
// was signalled at once, so the fifth packet finds a buffer instead of waiting for
// one until the QP gives up on it.
func TestCQHandlerSignalsTheLastBufferAtOnce(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	pb := nodes[1].SoftPort(1)
	qp, rcq := handlerQP(t, nodes[1], func() bool { return false }, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wc := make([]verbs.WC, 8)
		for got := 0; got < 6; {
			<-rcq.Notify()
			n := rcq.Poll(wc)
			got += n
			postBufs(t, qp, n)
		}
	}()
	drops := pb.Counters().RcvDropped
	pb.receive(udBatch(t, nodes[0], nodes[1], qp.Num())(6), true)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the consumer never got 6 completions (%d packets dropped waiting for a buffer)", pb.Counters().RcvDropped-drops)
	}
	if d := pb.Counters().RcvDropped - drops; d != 0 {
		t.Fatalf("%d packets dropped waiting for a buffer", d)
	}
}

// handlerQP makes a UD QP in RTS on h's port 1 whose receive CQ has handler, with
// bufs receive buffers posted.
func handlerQP(t *testing.T, h *HCA, handler func() bool, bufs int) (verbs.QP, verbs.CQ) {
	t.Helper()
	rcq, _ := h.CreateCQ(verbs.CQAttr{Entries: 256, Handler: handler})
	scq, _ := h.CreateCQ(verbs.CQAttr{Entries: 256})
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: 1, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 128})
	if err != nil {
		t.Fatal(err)
	}
	if err := verbs.UDToRTS(qp, 0, 0x0b1b); err != nil {
		t.Fatal(err)
	}
	postBufs(t, qp, bufs)
	return qp, rcq
}

func postBufs(t *testing.T, qp verbs.QP, n int) {
	wrs := make([]verbs.RecvWR, n)
	for k := range wrs {
		wrs[k] = verbs.RecvWR{ID: uint64(k), Buf: make([]byte, 256)}
	}
	if _, err := qp.PostRecv(wrs); err != nil {
		t.Error(err)
	}
}

// udBatch returns a maker of received batches of n small UD packets from src to dst's qpn.
func udBatch(t *testing.T, src, dst *HCA, qpn verbs.QPN) func(n int) []Datagram {
	pkt := craft(t, src, dst, wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: uint32(qpn)},
		DETH: wire.DETH{QKey: 0x0b1b, SrcQP: 77}, Payload: []byte("ping")})
	return func(n int) []Datagram {
		b := make([]Datagram, n)
		for k := range b {
			b[k] = Datagram{Addr: src.Endpoint(1), Data: pkt}
		}
		return b
	}
}

// A batch holds a packet for X (whose CQ has a handler) and then one for Y, which has
// no buffer posted: the port waits for Y's consumer, and X's handler must not wait
// with it. Here Y's consumer posts only once X's handler has run, so Y's packet is
// received only if the held signal went out before the wait (else the wait times out
// and the packet is dropped).
func TestCQHandlerRunsBeforeAnotherQPWaitsForBuffers(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	pb := nodes[1].SoftPort(1)
	ran := make(chan struct{}, 1)
	var rcq verbs.CQ
	x, rcq := handlerQP(t, nodes[1], func() bool {
		rcq.Poll(make([]verbs.WC, 8))
		select {
		case ran <- struct{}{}:
		default:
		}
		return true
	}, 4)
	y, ycq := handlerQP(t, nodes[1], func() bool { return false }, 0)
	go func() {
		<-ran
		postBufs(t, y, 1)
	}()
	drops := pb.Counters().RcvDropped
	batch := append(udBatch(t, nodes[0], nodes[1], x.Num())(1), udBatch(t, nodes[0], nodes[1], y.Num())(1)...)
	pb.receive(batch, true)
	if d := pb.Counters().RcvDropped - drops; d != 0 {
		t.Fatalf("%d packets dropped: X's handler waited with Y's wait for a buffer", d)
	}
	if n := ycq.Poll(make([]verbs.WC, 8)); n != 1 {
		t.Fatalf("Y received %d packets, want 1", n)
	}
}

// A CQ's signal is held by one batch at a time: a completion another batch makes
// meanwhile (a CQ shared by QPs of two ports) signals at once instead of waiting for
// the first batch's end. And a handler that takes what moderation's timer was armed
// for stops the timer, which would wake the CQ's goroutine for nothing.
func TestCQHeldByOneBatch(t *testing.T) {
	c := newCQ(64)
	calls := 0
	c.handler = func() bool {
		calls++
		for c.Poll(make([]verbs.WC, 8)) > 0 {
		}
		return true
	}
	var b1, b2 cqBatch
	c.pushIn(verbs.WC{WRID: 1}, &b1)
	select {
	case <-c.Notify():
		t.Fatal("a held completion signalled")
	default:
	}
	c.pushIn(verbs.WC{WRID: 2}, &b2)
	select {
	case <-c.Notify():
	default:
		t.Fatal("a completion of a second batch waited for the first batch's end")
	}
	b2.flush()
	b1.flush()
	if calls != 0 {
		t.Fatalf("handler called %d times after the signal went to Notify", calls)
	}

	if n := c.Poll(make([]verbs.WC, 8)); n != 2 {
		t.Fatalf("%d completions for the poller, want 2", n)
	}
	if err := c.SetModeration(2, 1000); err != nil { // 2 completions or 1 ms
		t.Fatal(err)
	}
	var b3 cqBatch
	c.pushIn(verbs.WC{WRID: 3}, &b3) // arms the timer
	c.pushIn(verbs.WC{WRID: 4}, &b3) // the count: held for the batch's end
	b3.flush()
	c.mu.Lock()
	timer := c.timer
	c.mu.Unlock()
	if calls != 1 || timer != nil {
		t.Fatalf("handler calls %d (want 1), moderation timer still armed: %v", calls, timer != nil)
	}
}

// A packet that waited for a receive buffer is checked again once one is there: the
// consumer may have restarted the QP meanwhile with another Q_Key (an IPoIB interface
// taking another broadcast group's), and a packet the old one admitted must not land
// in the new ring.
func TestUDWaitForABufferChecksTheQKeyAgain(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	pb := nodes[1].SoftPort(1)
	y, ycq := handlerQP(t, nodes[1], func() bool { return false }, 0)
	go func() {
		// While the packet waits (rqWait, 50 ms) for a buffer; this sleep only places the
		// change inside the wait, the test cannot pass by its timing.
		time.Sleep(10 * time.Millisecond)
		if err := y.Modify(verbs.QPModify{Mask: verbs.QPMaskQKey, QKey: 0x1234}); err != nil {
			t.Error(err)
		}
		postBufs(t, y, 1)
	}()
	bad := pb.Counters().BadQKey
	pb.receive(udBatch(t, nodes[0], nodes[1], y.Num())(1), true)
	if n := ycq.Poll(make([]verbs.WC, 8)); n != 0 {
		t.Fatalf("%d packets of the old Q_Key received into the buffer posted after the change", n)
	}
	if d := pb.Counters().BadQKey - bad; d != 1 {
		t.Fatalf("bad Q_Key counted %d times, want 1", d)
	}
}

// A batch's packets share one look-up of their QP (rxView), and a QP closed while the
// batch is handled is looked up again (its number may have gone to another QP, as it
// does here), never used.
func TestBatchViewFindsAClosedQPAgain(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	h := nodes[1]
	x, _ := handlerQP(t, h, func() bool { return false }, 1)
	v := rxView{p: h.SoftPort(1)}
	if q := v.qp(x.Num()); q != x {
		t.Fatalf("view found %v for X's number, want X", q)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if q := v.qp(x.Num()); q != nil {
		t.Fatalf("view found %v after X closed, want none", q)
	}
	h.mu.Lock()
	h.nextQPN = x.Num()
	h.mu.Unlock()
	x2, _ := handlerQP(t, h, func() bool { return false }, 1)
	if x2.Num() != x.Num() {
		t.Fatalf("X2 got number %#x, want X's %#x", x2.Num(), x.Num())
	}
	if q := v.qp(x.Num()); q != x2 {
		t.Fatalf("view found %v for the number X2 took, want X2", q)
	}
}

// A message of the SM in a batch starts the batch's view again: a P_Key it takes away
// refuses the packets after it in the same batch.
func TestBatchViewAfterTheSMsConfig(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	h := nodes[1]
	p := h.SoftPort(1)
	x, xcq := handlerQP(t, h, func() bool { return false }, 4)
	toX := udBatch(t, nodes[0], h, x.Num())
	c := configWithPKeys(p, 0x8001)
	mad := c.append(putCtlHeader(nil, ctlAttrConfig, 0))
	smi := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: uint32(verbs.SMIQPN)},
		DETH: wire.DETH{SrcQP: uint32(verbs.SMIQPN)}, Payload: mad}
	config := Datagram{Addr: smh.Endpoint(1), Data: smi.AppendTo(nil, verbs.GID{}, verbs.GID{})}
	bad := p.Counters().BadPKey
	p.receive(append(append(toX(1), config), toX(1)...), true)
	if pk := p.PKeyTable(); len(pk) != 1 || pk[0] != 0x8001 {
		t.Fatalf("the SM's config was not applied: P_Keys %v", pk)
	}
	if n := xcq.Poll(make([]verbs.WC, 8)); n != 1 {
		t.Errorf("%d packets received, want the one before the config", n)
	}
	if d := p.Counters().BadPKey - bad; d != 1 {
		t.Errorf("%d packets refused for their P_Key, want the one after the config", d)
	}
}

// A wait for a receive buffer starts the batch's view again: the P_Key table changed
// during the wait refuses the packets after it too, not only the one that waited.
func TestBatchViewAfterAWait(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	h := nodes[1]
	p := h.SoftPort(1)
	x, xcq := handlerQP(t, h, func() bool { return false }, 0)
	c := configWithPKeys(p, 0x8001)
	bad := p.Counters().BadPKey
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.receive(udBatch(t, nodes[0], h, x.Num())(2), true)
	}()
	time.Sleep(10 * time.Millisecond) // the first packet waits for a buffer (up to rqWait)
	p.applyConfig(&c)
	postBufs(t, x, 2)
	<-done
	if n := xcq.Poll(make([]verbs.WC, 8)); n != 0 {
		t.Errorf("%d packets received after their P_Key was taken away", n)
	}
	if d := p.Counters().BadPKey - bad; d != 2 {
		t.Errorf("%d packets refused for their P_Key, want both", d)
	}
}

// configWithPKeys is the port's configuration as its SM sends it, with the P_Key
// table replaced by pkeys.
func configWithPKeys(p *Port, pkeys ...verbs.PKey) ctlConfig {
	a := p.Attr()
	p.mu.RLock()
	defer p.mu.RUnlock()
	return ctlConfig{LID: a.LID, SMLID: a.SMLID, State: a.State, ActiveMTU: a.ActiveMTU, Rate: a.Rate,
		SMEpoch: a.SMEpoch, SMGID: p.smGID, GIDPrefix: a.GIDPrefix, PKeys: pkeys}
}
