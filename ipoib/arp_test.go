package ipoib

import (
	"net/netip"
	"testing"
	"time"
)

// A neighbour that never answers: the packets for it wait in its queue (three at most,
// the rest dropped at once), arpRetries requests go out, and then the entry is given up
// with its queue dropped and counted. Nothing is left behind: once the address has an
// owner, the next packet resolves it afresh.
func TestARPGivesUpOnSilentNeighbour(t *testing.T) {
	r := newRig(t)
	ea := r.engine("a", 1, Options{})
	eb := r.engine("b", 1, Options{})
	setTimers(ea, func(tm *timers) { tm.arpInterval = 10 * time.Millisecond })
	a, b := iface(t, ea, "ib0"), iface(t, eb, "ib0")
	bringUp(t, a, "10.0.0.1/24")
	bh := bringUp(t, b, "10.0.0.2/24")

	before := a.Stats()
	pkts := make([][]byte, 5)
	for k := range pkts {
		pkts[k] = icmp4("10.0.0.1", "10.0.0.99", 8, uint16(k+1), 56)
	}
	a.Transmit(pkts)
	n, ok := neighOf(a, "10.0.0.99")
	if !ok || n.valid || len(n.queue) != maxPathQ {
		t.Fatalf("neighbour entry %v, valid %v, queue %d; want an unresolved entry holding %d", ok, n.valid, len(n.queue), maxPathQ)
	}
	if d := a.Stats().TxDropped - before.TxDropped; d != 5-maxPathQ {
		t.Fatalf("tx_dropped +%d for the packets beyond the queue, want +%d", d, 5-maxPathQ)
	}
	waitFor(t, "the neighbour given up", func() bool { _, ok := neighOf(a, "10.0.0.99"); return !ok })
	s := a.Stats()
	if d := s.TxDropped - before.TxDropped; d != 5 {
		t.Fatalf("tx_dropped +%d after the give-up, want +5 (every packet)", d)
	}
	// a sent nothing but its ARP requests (the task sends them before it gives up).
	if sent := s.TxPackets - before.TxPackets; sent != arpRetries {
		t.Fatalf("%d frames sent for the silent neighbour, want %d ARP requests", sent, arpRetries)
	}

	// The address gets an owner: the next packet asks again and gets through.
	b.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24"), pfx("10.0.0.99/24")})
	ping(t, a, b, bh, "10.0.0.1", "10.0.0.99", 100)
	if n, ok := neighOf(a, "10.0.0.99"); !ok || !n.valid || n.hw != b.HWAddr() {
		t.Fatalf("after the owner answered: entry %v valid %v hw %s, want b's %s", ok, n.valid, n.hw, b.HWAddr())
	}
}
