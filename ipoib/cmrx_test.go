package ipoib

import (
	"bytes"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"ipoibfs/verbs/soft"
)

// A peer in connected mode may send any protocol on its connection, ARP included (the
// kernel driver sends a unicast ARP reply there when a connection exists): the
// connected receive path sorts frames as the UD one does, so ARP and neighbour
// discovery reach the engine instead of being dropped or handed to the host.
func TestConnectedModeReceivesARP(t *testing.T) {
	a, b := connectedPair(t)
	a.ib0.dmu.Lock()
	tx := a.ib0.tx[b.ib0.HWAddr()]
	a.ib0.dmu.Unlock()
	if tx == nil || !tx.up {
		t.Fatal("no connection from a to b")
	}
	// An ARP request for b's address from a sender b does not know yet, on the
	// connection: b learns the sender (a request for one of its own addresses).
	sender := netip.MustParseAddr("10.0.0.9")
	req := arpPacket{Op: arpRequest, SenderHW: a.ib0.HWAddr(), SenderIP: sender, TargetIP: netip.MustParseAddr("10.0.0.2")}
	dropped := b.ib0.Stats().RxDropped
	a.ib0.cmPost(tx, [][]byte{req.appendFrame(nil)})
	waitFor(t, "b learning the ARP sender from the connection", func() bool {
		b.ib0.dmu.Lock()
		defer b.ib0.dmu.Unlock()
		_, ok := b.ib0.neigh[sender]
		return ok
	})
	if got := b.ib0.Stats().RxDropped; got != dropped {
		t.Errorf("b dropped %d frames", got-dropped)
	}
	if got := b.host.take(func(p []byte) bool { return len(p) > 0 && p[0]>>4 != 4 && p[0]>>4 != 6 }); len(got) != 0 {
		t.Errorf("the host got %d non-IP packets", len(got))
	}
}

// Passive connections idle for cmRxIdle (512 s in the driver, shortened here) are torn
// down as ipoib_cm_rx_reap does; the peer notices, and the next packet connects again.
func TestIdleConnectionReaped(t *testing.T) {
	a, b := connectedPair(t)
	passive := func() int {
		b.ib0.dmu.Lock()
		defer b.ib0.dmu.Unlock()
		return len(b.ib0.rx)
	}
	if passive() != 1 {
		t.Fatalf("%d passive connections on b after the first ping", passive())
	}
	setTimers(b.e, func(tm *timers) { tm.cmRxIdle = 200 * time.Millisecond })
	waitFor(t, "b's idle passive connection reaped", func() bool { return passive() == 0 })
	waitFor(t, "a's connection to b gone or down", func() bool {
		a.ib0.dmu.Lock()
		defer a.ib0.dmu.Unlock()
		tx := a.ib0.tx[b.ib0.HWAddr()]
		return tx == nil || !tx.up
	})
	setTimers(b.e, func(tm *timers) { tm.cmRxIdle = time.Hour })
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 2)
	if passive() != 1 {
		t.Fatalf("%d passive connections on b after pinging again", passive())
	}
}

// connectedPair is two nodes in connected mode, 10.0.0.1 and 10.0.0.2, after one ping
// from a to b (which brings a connection up).
func connectedPair(t *testing.T) (a, b *node) {
	t.Helper()
	_, nodes := testFabric(t, "", "a", "b")
	connectedNodes(t, nodes)
	a, b = nodes[0], nodes[1]
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	return a, b
}

// connectedNodes gives node k the address 10.0.0.k+1/24 and puts every ib0 in
// connected mode.
func connectedNodes(t *testing.T, nodes []*node) {
	t.Helper()
	addressNodes(nodes)
	for _, n := range nodes {
		if err := n.ib0.SetMode(Connected); err != nil {
			t.Fatal(err)
		}
	}
}

// addressNodes gives node k's ib0 the address 10.0.0.k+1/24.
func addressNodes(nodes []*node) {
	for k, n := range nodes {
		n.ib0.SetHostAddrs([]netip.Prefix{pfx(fmt.Sprintf("10.0.0.%d/24", k+1))})
	}
}

// frameHost is a fakeHost that takes packets in place (FrameHost), as the daemon's
// TUN bridge does: it checks the headroom, overwrites it as a device's header would,
// and records the packets.
type frameHost struct {
	*fakeHost
	calls, short atomic.Int64
}

func (h *frameHost) FrameHeadroom() int { return 10 }

func (h *frameHost) DeliverFrames(frames [][]byte, off int) {
	h.calls.Add(1)
	pkts := make([][]byte, len(frames))
	for k, f := range frames {
		if off < 10 {
			h.short.Add(1)
		}
		for j := max(off-10, 0); j < off; j++ {
			f[j] = 0xee // a device's header goes here
		}
		pkts[k] = f[off:]
	}
	h.Deliver(pkts)
}

// A host that takes frames gets connected mode's packets in place, with the headroom
// it asked for before each, and writing over that headroom corrupts nothing: the
// packets arrive intact, again and again as the receive buffers are reused.
func TestConnectedModeDeliversFramesInPlace(t *testing.T) {
	a, b := connectedPair(t)
	fh := &frameHost{fakeHost: b.host}
	b.ib0.AttachHost(fh)
	for seq := uint16(100); seq < 140; seq++ {
		pkt := icmp4("10.0.0.1", "10.0.0.2", 8, seq, 20000+int(seq))
		var got [][]byte
		for try := 0; try < 50 && len(got) == 0; try++ {
			a.ib0.Transmit([][]byte{pkt})
			for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end) && len(got) == 0; time.Sleep(2 * time.Millisecond) {
				got = fh.take(isICMP4(seq))
			}
		}
		if len(got) == 0 || !bytes.Equal(got[0], pkt) {
			t.Fatalf("echo %d: %d packets, intact %v", seq, len(got), len(got) > 0 && bytes.Equal(got[0], pkt))
		}
	}
	if fh.calls.Load() == 0 || fh.short.Load() != 0 {
		t.Fatalf("DeliverFrames called %d times, %d frames with less than 10 bytes of headroom", fh.calls.Load(), fh.short.Load())
	}
}

// TestConnectedFullSendQueueKeepsConnection: a burst larger than the connection's send
// queue drops what does not fit, as a stopped queue would, and keeps the connection
// (it was torn down and rebuilt under load).
func TestConnectedFullSendQueueKeepsConnection(t *testing.T) {
	a, b := connectedPair(t)
	a.ib0.dmu.Lock()
	tx := a.ib0.tx[b.ib0.HWAddr()]
	a.ib0.dmu.Unlock()
	if tx == nil || !tx.up {
		t.Fatalf("no connection to b after a ping: %+v", tx)
	}
	burst := make([][]byte, 3*a.ib0.e.params.SendQueueSize)
	for k := range burst {
		burst[k] = icmp4("10.0.0.1", "10.0.0.2", 8, uint16(100+k), 1000)
	}
	dropped := a.ib0.Stats().TxDropped
	a.ib0.Transmit(burst)
	if d := a.ib0.Stats().TxDropped - dropped; d == 0 {
		t.Fatalf("a burst of %d into a send queue of %d dropped nothing", len(burst), a.ib0.e.params.SendQueueSize)
	}
	a.ib0.dmu.Lock()
	now := a.ib0.tx[b.ib0.HWAddr()]
	a.ib0.dmu.Unlock()
	if now != tx {
		t.Fatalf("the connection was torn down by a full send queue")
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 7)
}

// A passive connection's teardown counts each receive buffer it flushes in rx_dropped,
// as ipoib_cm_handle_rx_wc counts every failed completion; with the shared receive
// queue the buffers stay posted and nothing is counted.
func TestConnectionTeardownCountsFlushedReceives(t *testing.T) {
	for _, noSRQ := range []bool{false, true} {
		_, nodes := testFabricWith(t, "", func(c *soft.Config, _ *Options) { c.NoSRQ = noSRQ }, "a", "b")
		connectedNodes(t, nodes)
		a, b := nodes[0], nodes[1]
		ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
		passive := func() int {
			b.ib0.dmu.Lock()
			defer b.ib0.dmu.Unlock()
			return len(b.ib0.rx)
		}
		if b.ib0.cmHasSRQ == noSRQ || passive() != 1 {
			t.Fatalf("noSRQ %v: shared queue %v, %d passive connections", noSRQ, b.ib0.cmHasSRQ, passive())
		}
		before := b.ib0.Stats().RxDropped
		setTimers(b.e, func(tm *timers) { tm.cmRxIdle = 200 * time.Millisecond })
		waitFor(t, "b's idle passive connection reaped", func() bool { return passive() == 0 })
		want := uint64(0)
		if noSRQ {
			want = uint64(b.e.params.RecvQueueSize) // every posted buffer flushed
		}
		waitFor(t, fmt.Sprintf("noSRQ %v: rx_dropped up by %d", noSRQ, want), func() bool { return b.ib0.Stats().RxDropped-before == want })
		time.Sleep(100 * time.Millisecond) // and no more
		if got := b.ib0.Stats().RxDropped - before; got != want {
			t.Errorf("noSRQ %v: rx_dropped up by %d, want %d", noSRQ, got, want)
		}
	}
}
