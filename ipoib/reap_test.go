package ipoib

import (
	"bytes"
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

// Sending to a group the interface has not joined makes a send-only membership
// (ipoib_mcast_send): the packets wait in the group's queue while the join is under
// way and go out once it completes; the SA holds the port as a SendOnlyFullMember, the
// QP is not attached to the group, and a full member receives what is sent. Once
// nobody has sent to the group for the idle time, the membership is left at the SA and
// the entry goes (the kernel reaps it with its idle neighbour); new traffic joins
// again.
func TestSendOnlyJoinAndIdleReap(t *testing.T) {
	r := newRig(t)
	grp := netip.MustParseAddr("239.1.2.3")
	mgid := mgidForIP(grp, broadcastAddr(0xffff))
	started, release := make(chan struct{}, 1), make(chan struct{})
	h := &hookSA{join: func(ctx context.Context, n int, rec mad.MCMemberRecord) error {
		if rec.MGID == mgid && n == 1 {
			return holdUntil(ctx, started, release)
		}
		return nil
	}}
	ea := r.engine("a", 1, Options{wrapSA: h.wrap})
	eb := r.engine("b", 1, Options{})
	a, b := iface(t, ea, "ib0"), iface(t, eb, "ib0")
	bringUp(t, a, "10.0.0.1/24")
	bh := bringUp(t, b, "10.0.0.2/24")
	agid, bgid := a.HWAddr().GID(), b.HWAddr().GID()

	// b is a full member (its kernel joined the group).
	b.SetHostGroups([]netip.Addr{netip.MustParseAddr("224.0.0.1"), grp})
	waitFor(t, "b a full member", func() bool { return r.joinState(mgid, bgid) == mad.JoinFull })

	// a sends three datagrams: a send-only entry, its join in flight, the three queued.
	before := a.Stats()
	pkts := make([][]byte, 3)
	for k := range pkts {
		pkts[k] = udp4("10.0.0.1", grp.String(), 5000, fmt.Appendf(nil, "queued %d", k))
	}
	a.Transmit(pkts)
	inFlight(t, started, "the send-only join")
	g, ok := groupOf(a, mgid)
	if !ok || !g.sendOnly || g.ah != nil || len(g.queue) != 3 {
		t.Fatalf("after sending to an unjoined group: entry %v, send-only %v, complete %v, queue %d; want a send-only entry holding 3",
			ok, g.sendOnly, g.ah != nil, len(g.queue))
	}
	want := fmt.Sprintf("  queuelen: %9d\n  complete: %9s\n  send_only: %8s\n", 3, "no", "yes")
	if blk := mcgBlock(a, mgid); !strings.HasSuffix(blk, want) {
		t.Fatalf("ib0_mcg block of the send-only group:\n%s\nwant it to end with\n%s", blk, want)
	}
	if s := a.Stats(); s.TxPackets != before.TxPackets || s.TxDropped != before.TxDropped {
		t.Fatalf("while joining: tx_packets +%d tx_dropped +%d, want both +0", s.TxPackets-before.TxPackets, s.TxDropped-before.TxDropped)
	}

	// The join completes: the queue goes out, a is a send-only member, not attached.
	close(release)
	waitFor(t, "the queued datagrams sent", func() bool { return a.Stats().TxPackets == before.TxPackets+3 })
	if g, _ := groupOf(a, mgid); g.ah == nil || len(g.queue) != 0 || g.attached {
		t.Fatalf("joined send-only group: complete %v, queue %d, attached %v; want complete, empty, not attached", g.ah != nil, len(g.queue), g.attached)
	}
	if st := r.joinState(mgid, agid); st != mad.JoinSendOnlyFull {
		t.Fatalf("a's join state at the SA %#x, want SendOnlyFullMember %#x", st, mad.JoinSendOnlyFull)
	}
	// A full member receives what a sends to the group.
	pkt := udp4("10.0.0.1", grp.String(), 5000, []byte("send-only"))
	waitFor(t, "a's datagram at b", func() bool {
		a.Transmit([][]byte{pkt})
		time.Sleep(10 * time.Millisecond)
		return len(bh.take(func(p []byte) bool { return bytes.Equal(p, pkt) })) > 0
	})

	// Idle: the membership is left and the entry reaped; a's full memberships and b's
	// membership stay.
	setTimers(ea, func(tm *timers) { tm.sendOnlyIdle = 20 * time.Millisecond })
	waitFor(t, "the idle send-only group reaped", func() bool { _, ok := groupOf(a, mgid); return !ok })
	waitFor(t, "a's send-only membership left at the SA", func() bool { return r.joinState(mgid, agid) == 0 })
	if st := r.joinState(mgid, bgid); st != mad.JoinFull {
		t.Fatalf("b's join state %#x after a's reap, want full", st)
	}
	if st := r.joinState(a.Broadcast().GID(), agid); st != mad.JoinFull || !a.Carrier() {
		t.Fatalf("a's broadcast membership %#x, carrier %v after the reap", st, a.Carrier())
	}
	if blk := mcgBlock(a, mgid); blk != "" {
		t.Fatalf("ib0_mcg still lists the reaped group:\n%s", blk)
	}

	// New traffic makes a new send-only join.
	setTimers(ea, func(tm *timers) { tm.sendOnlyIdle = time.Hour })
	a.Transmit([][]byte{pkt})
	waitFor(t, "a send-only member again", func() bool { return r.joinState(mgid, agid) == mad.JoinSendOnlyFull })
	if n := h.joinCalls(mgid); n != 2 {
		t.Fatalf("%d joins of the group, want 2 (one before the reap, one after)", n)
	}
}

// A send-only join is tried twice; when both fail the queued packets are dropped and
// counted and the entry stays, joining no more until new traffic arrives, which
// starts the join again (the driver's IPOIB_MCAST_FLAG_SENDONLY retries).
func TestSendOnlyJoinFailsTwiceThenWaitsForTraffic(t *testing.T) {
	r := newRig(t)
	grp := netip.MustParseAddr("239.4.5.6")
	mgid := mgidForIP(grp, broadcastAddr(0xffff))
	h := &hookSA{join: func(ctx context.Context, n int, rec mad.MCMemberRecord) error {
		if rec.MGID == mgid && n <= 2 {
			return &sa.StatusError{Op: "join", Status: mad.StatusSANoResources}
		}
		return nil
	}}
	ea := r.engine("a", 1, Options{wrapSA: h.wrap})
	setTimers(ea, func(tm *timers) { tm.joinBackoff = 10 * time.Millisecond })
	a := iface(t, ea, "ib0")
	bringUp(t, a, "10.0.0.1/24")

	before := a.Stats()
	pkts := make([][]byte, 3)
	for k := range pkts {
		pkts[k] = udp4("10.0.0.1", grp.String(), 5000, fmt.Appendf(nil, "lost %d", k))
	}
	a.Transmit(pkts)
	waitFor(t, "the queue dropped after two failed joins", func() bool { return a.Stats().TxDropped == before.TxDropped+3 })
	g, ok := groupOf(a, mgid)
	if !ok || !g.sendOnly || g.ah != nil || len(g.queue) != 0 || g.tries != 2 {
		t.Fatalf("after two failures: entry %v, send-only %v, complete %v, queue %d, tries %d; want the entry kept, empty, tries 2",
			ok, g.sendOnly, g.ah != nil, len(g.queue), g.tries)
	}
	if n := h.joinCalls(mgid); n != 2 {
		t.Fatalf("%d joins, want 2", n)
	}
	// Even past its retry time, a round of the join task finds nothing due: no third
	// join without traffic.
	a.dmu.Lock()
	a.mcast[mgid].retryAt = time.Time{}
	a.dmu.Unlock()
	a.mcastRound()
	if g, _ := groupOf(a, mgid); g.joining || h.joinCalls(mgid) != 2 {
		t.Fatalf("a third join started without new traffic (joining %v, %d joins)", g.joining, h.joinCalls(mgid))
	}
	if s := a.Stats(); s.TxPackets != before.TxPackets {
		t.Fatalf("tx_packets +%d while the group was never joined", s.TxPackets-before.TxPackets)
	}

	// New traffic: the join starts again, succeeds, and the packet goes out.
	a.Transmit([][]byte{udp4("10.0.0.1", grp.String(), 5000, []byte("again"))})
	waitFor(t, "the packet sent after the new join", func() bool { return a.Stats().TxPackets == before.TxPackets+1 })
	if n := h.joinCalls(mgid); n != 3 {
		t.Fatalf("%d joins, want 3", n)
	}
	if st := r.joinState(mgid, a.HWAddr().GID()); st != mad.JoinSendOnlyFull {
		t.Fatalf("join state %#x, want send-only full", st)
	}
}

// A failed join is retried after the backoff by the join task itself: the broadcast
// join fails once and the carrier still comes (a failure used to leave the retry to
// whatever woke the task next).
func TestFailedJoinRetriedAfterBackoff(t *testing.T) {
	r := newRig(t)
	bcast := broadcastAddr(0xffff).GID()
	h := &hookSA{join: func(ctx context.Context, n int, rec mad.MCMemberRecord) error {
		if rec.MGID == bcast && n == 1 {
			return fmt.Errorf("sa join: %w", verbs.ErrTimeout)
		}
		return nil
	}}
	e := r.engine("a", 1, Options{wrapSA: h.wrap})
	setTimers(e, func(tm *timers) { tm.joinBackoff = 10 * time.Millisecond })
	a := iface(t, e, "ib0")
	bringUp(t, a, "10.0.0.1/24") // waits for the carrier
	if n := h.joinCalls(bcast); n != 2 {
		t.Fatalf("%d joins of the broadcast group, want 2 (one failed, one retried)", n)
	}
}
