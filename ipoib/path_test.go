package ipoib

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// learnFromARP hands the interface an ARP reply from ip at hw, as if received for a
// request it sent (the neighbour waiting for it: a reply alone makes none).
func learnFromARP(i *Interface, ip string, hw HWAddr) {
	i.dmu.Lock()
	if _, ok := i.neigh[netip.MustParseAddr(ip)]; !ok {
		n := &neigh{}
		i.neigh[netip.MustParseAddr(ip)] = n
		i.pending[netip.MustParseAddr(ip)] = n
	}
	i.dmu.Unlock()
	r := arpPacket{Op: arpReply, SenderHW: hw, SenderIP: netip.MustParseAddr(ip), TargetHW: i.HWAddr(), TargetIP: netip.MustParseAddr("10.0.0.1")}
	i.handleARP(r.appendFrame(nil)[encapLen:])
}

// A neighbour whose path the SA cannot find (a GID no port of the subnet has): the
// query fails with the SA's status, the packets queued for the path are dropped and
// counted, and the neighbour is given up (path_rec_completion ->
// ipoib_del_neighs_by_gid). Until the retry time nothing waits on the failed path: a
// packet for it is dropped and counted rather than queued behind no query.
func TestPathQueryErrorGivesUpNeighbour(t *testing.T) {
	r := newRig(t)
	h := &hookSA{}
	e := r.engine("a", 1, Options{wrapSA: h.wrap})
	setTimers(e, func(tm *timers) { tm.pathRetry = time.Hour })
	a := iface(t, e, "ib0")
	bringUp(t, a, "10.0.0.1/24")
	ghost := MakeHWAddr(0, 0x123456, verbs.MakeGID(a.HWAddr().GID().Prefix(), 0x0200000000c0ffee))
	learnFromARP(a, "10.0.0.7", ghost)
	if n, ok := neighOf(a, "10.0.0.7"); !ok || !n.valid {
		t.Fatal("the ARP reply was not learned")
	}

	before := a.Stats()
	pkts := make([][]byte, 5)
	for k := range pkts {
		pkts[k] = icmp4("10.0.0.1", "10.0.0.7", 8, uint16(k+1), 56)
	}
	a.Transmit(pkts)
	waitFor(t, "the neighbour given up", func() bool { _, ok := neighOf(a, "10.0.0.7"); return !ok })
	if d := a.Stats().TxDropped - before.TxDropped; d != 5 {
		t.Fatalf("tx_dropped +%d, want +5 (two beyond the path queue, three when the query failed)", d)
	}
	if n := h.pathCalls(); n != 1 {
		t.Fatalf("%d path queries, want 1", n)
	}
	p, ok := pathOf(a, ghost.GID())
	if !ok || p.ah != nil || p.querying || len(p.queue) != 0 {
		t.Fatalf("failed path: entry %v complete %v querying %v queue %d", ok, p.ah != nil, p.querying, len(p.queue))
	}
	if pt := a.PathText(); !strings.Contains(pt, "GID: "+ghost.GID().KernelString()+"\n  complete:     no\n") {
		t.Fatalf("ib0_path:\n%s", pt)
	}

	// Within the retry time: learned again, a packet is dropped, not parked.
	learnFromARP(a, "10.0.0.7", ghost)
	before = a.Stats()
	a.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.7", 8, 9, 56)})
	p, _ = pathOf(a, ghost.GID())
	if d := a.Stats().TxDropped - before.TxDropped; d != 1 || p.querying || len(p.queue) != 0 {
		t.Fatalf("packet for a failed path before its retry time: tx_dropped +%d, querying %v, queued %d; want dropped and counted",
			d, p.querying, len(p.queue))
	}
}

// The path query times out (the SA does not answer), then fails with an error status,
// then succeeds: each failure drops what waited for the path and gives the neighbour
// up, the next packet asks again, and once the path is resolved traffic flows and no
// further query is made.
func TestPathQueryRetriedAfterTimeoutAndError(t *testing.T) {
	r := newRig(t)
	started, release := make(chan struct{}, 1), make(chan struct{})
	errTimeout := fmt.Errorf("sa path record: %w", verbs.ErrTimeout)
	h := &hookSA{path: func(ctx context.Context, n int, _ verbs.GID) error {
		switch n {
		case 1: // in flight until the test says, then timed out
			if err := holdUntil(ctx, started, release); err != nil {
				return err
			}
			return errTimeout
		case 2:
			return &sa.StatusError{Op: "path record", Status: mad.StatusSANoRecords}
		}
		return nil
	}}
	ea := r.engine("a", 1, Options{wrapSA: h.wrap})
	setTimers(ea, func(tm *timers) { tm.pathRetry = 0 })
	eb := r.engine("b", 1, Options{})
	a, b := iface(t, ea, "ib0"), iface(t, eb, "ib0")
	bringUp(t, a, "10.0.0.1/24")
	bh := bringUp(t, b, "10.0.0.2/24")

	before := a.Stats()
	a.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 1, 56)}) // ARP, then the path query
	inFlight(t, started, "the path query")
	p, _ := pathOf(a, b.HWAddr().GID())
	if !p.querying || len(p.queue) != 1 {
		t.Fatalf("query in flight: querying %v, queue %d; want the first packet waiting", p.querying, len(p.queue))
	}
	var more [][]byte
	for seq := uint16(2); seq <= 5; seq++ {
		more = append(more, icmp4("10.0.0.1", "10.0.0.2", 8, seq, 56))
	}
	a.Transmit(more)
	if d := a.Stats().TxDropped - before.TxDropped; d != 2 {
		t.Fatalf("tx_dropped +%d with the path queue full, want +2", d)
	}
	close(release) // the query times out
	waitFor(t, "the neighbour given up after the timeout", func() bool { _, ok := neighOf(a, "10.0.0.2"); return !ok })
	if d := a.Stats().TxDropped - before.TxDropped; d != 5 {
		t.Fatalf("tx_dropped +%d after the timeout, want +5", d)
	}
	if got := bh.take(func(p []byte) bool { return len(p) >= 28 && p[9] == 1 }); len(got) != 0 {
		t.Fatalf("%d packets reached b without a path", len(got))
	}

	// The next packets ask again: one more failure (an error status), then the path.
	ping(t, a, b, bh, "10.0.0.1", "10.0.0.2", 6)
	if n := h.pathCalls(); n != 3 {
		t.Fatalf("%d path queries, want 3 (timeout, error, success)", n)
	}
	if p, _ := pathOf(a, b.HWAddr().GID()); p.ah == nil || p.rec.DLID == 0 {
		t.Fatal("the path is not complete after the successful query")
	}
	ping(t, a, b, bh, "10.0.0.1", "10.0.0.2", 7)
	if n := h.pathCalls(); n != 3 {
		t.Fatalf("%d path queries after the path was resolved, want still 3", n)
	}
}
