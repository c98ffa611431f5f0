package ipoib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/soft"
	"ipoibfs/verbs/soft/partitions"
)

// An HCA with two ports gives two interfaces, ib0 on port 1 and ib1 on port 2, each
// with the port's own GID and a QP of its own. Their traffic is independent (each
// reaches the peer's interface on the same port, resolved to that port's address and
// path, counted on that interface only), and so are their groups: a group ib1 joins is
// joined by port 2 alone, and ib1 going down leaves port 2's memberships while ib0
// keeps its carrier, its memberships and its traffic.
func TestTwoPortsTwoIndependentInterfaces(t *testing.T) {
	r := newRig(t)
	ea, eb := r.engine("a", 2, Options{}), r.engine("b", 2, Options{})
	if got := len(ea.Interfaces()); got != 2 {
		t.Fatalf("%d interfaces on a two-port HCA, want 2", got)
	}
	a0, a1 := iface(t, ea, "ib0"), iface(t, ea, "ib1")
	b0, b1 := iface(t, eb, "ib0"), iface(t, eb, "ib1")
	if a0.Port() != 1 || a1.Port() != 2 {
		t.Fatalf("ports %d and %d, want 1 and 2", a0.Port(), a1.Port())
	}
	if a0.HWAddr().GID() == a1.HWAddr().GID() || a0.HWAddr().QPN() == a1.HWAddr().QPN() {
		t.Fatalf("ib0 %s and ib1 %s share a GID or QPN", a0.HWAddr(), a1.HWAddr())
	}
	bringUp(t, a0, "10.0.0.1/24")
	bringUp(t, a1, "10.1.0.1/24")
	h0 := bringUp(t, b0, "10.0.0.2/24")
	h1 := bringUp(t, b1, "10.1.0.2/24")
	bcast := a0.Broadcast().GID()
	for _, i := range []*Interface{a0, a1, b0, b1} {
		if st := r.joinState(bcast, i.HWAddr().GID()); st != mad.JoinFull {
			t.Fatalf("%s's port: broadcast join state %#x, want full", i.Name(), st)
		}
	}

	ping(t, a0, b0, h0, "10.0.0.1", "10.0.0.2", 1)
	ping(t, a1, b1, h1, "10.1.0.1", "10.1.0.2", 2)
	if n, _ := neighOf(a0, "10.0.0.2"); n.hw != b0.HWAddr() {
		t.Fatalf("a's ib0 resolved 10.0.0.2 to %s, want b's ib0 %s", n.hw, b0.HWAddr())
	}
	if n, _ := neighOf(a1, "10.1.0.2"); n.hw != b1.HWAddr() {
		t.Fatalf("a's ib1 resolved 10.1.0.2 to %s, want b's ib1 %s", n.hw, b1.HWAddr())
	}
	if _, ok := neighOf(a0, "10.1.0.2"); ok {
		t.Fatal("ib1's neighbour appears on ib0")
	}
	p0, p1 := a0.PathText(), a1.PathText()
	if !strings.Contains(p0, b0.HWAddr().GID().KernelString()) || strings.Contains(p0, b1.HWAddr().GID().KernelString()) ||
		!strings.Contains(p1, b1.HWAddr().GID().KernelString()) || strings.Contains(p1, b0.HWAddr().GID().KernelString()) {
		t.Fatalf("paths: ib0\n%s\nib1\n%s\nwant each to the peer's port of its own", p0, p1)
	}

	// Resolved, both send at once: 3 packets on ib0, 5 on ib1, each counted by its own
	// interface and received by the peer's interface on the same port only.
	seqIn := func(lo, hi uint16) func([]byte) bool {
		return func(p []byte) bool {
			return len(p) >= 28 && p[9] == 1 && binary.BigEndian.Uint16(p[26:]) >= lo && binary.BigEndian.Uint16(p[26:]) <= hi
		}
	}
	t0, t1 := a0.Stats().TxPackets, a1.Stats().TxPackets
	var on0, on1 [][]byte
	for k := range uint16(3) {
		on0 = append(on0, icmp4("10.0.0.1", "10.0.0.2", 8, 10+k, 56))
	}
	for k := range uint16(5) {
		on1 = append(on1, icmp4("10.1.0.1", "10.1.0.2", 8, 20+k, 56))
	}
	a0.Transmit(on0)
	a1.Transmit(on1)
	if d0, d1 := a0.Stats().TxPackets-t0, a1.Stats().TxPackets-t1; d0 != 3 || d1 != 5 {
		t.Fatalf("tx_packets +%d on ib0, +%d on ib1; want +3 and +5", d0, d1)
	}
	var got0, got1 int
	waitFor(t, "the packets at b", func() bool {
		got0 += len(h0.take(seqIn(10, 12)))
		got1 += len(h1.take(seqIn(20, 24)))
		return got0 >= 3 && got1 >= 5
	})
	if got0 != 3 || got1 != 5 {
		t.Fatalf("b's ib0 received %d of ib0's 3, ib1 %d of ib1's 5", got0, got1)
	}
	if x0, x1 := len(h0.take(seqIn(20, 24))), len(h1.take(seqIn(10, 12))); x0+x1 != 0 {
		t.Fatalf("crossed over: b's ib0 got %d of ib1's packets, b's ib1 %d of ib0's", x0, x1)
	}

	// ib1 joins a group: port 2 is a member, port 1 is not, and only ib1_mcg lists it.
	grp := netip.MustParseAddr("239.7.7.7")
	mgid := mgidForIP(grp, a1.Broadcast())
	a1.SetHostGroups([]netip.Addr{netip.MustParseAddr("224.0.0.1"), grp})
	waitFor(t, "a's port 2 in the group", func() bool { return r.joinState(mgid, a1.HWAddr().GID()) == mad.JoinFull })
	if st := r.joinState(mgid, a0.HWAddr().GID()); st != 0 {
		t.Fatalf("a's port 1 has join state %#x in ib1's group", st)
	}
	if mcgBlock(a0, mgid) != "" || mcgBlock(a1, mgid) == "" {
		t.Fatalf("ib0_mcg:\n%s\nib1_mcg:\n%s\nwant the group on ib1 only", a0.MCGText(), a1.MCGText())
	}

	bcastGroup := func(i *Interface) *mcastGroup {
		i.dmu.Lock()
		defer i.dmu.Unlock()
		return i.mcast[bcast]
	}
	g0, g1 := bcastGroup(a0), bcastGroup(a1)
	// The SM adds a P_Key to port 2's table (PKEY_CHANGE): ib1's own P_Key and index
	// are as they were, so nothing is flushed (update_parent_pkey: "Not flushing").
	conf := fmt.Sprintf("Default=0x7fff, ipoib : ALL=full;\nP1=0x8001, ipoib : %#x=full;\n", uint64(soft.GUIDFromName("a", 2)))
	parts, err := partitions.Parse("t.conf", strings.NewReader(conf))
	if err != nil {
		t.Fatal(err)
	}
	r.smh.SM().SetPartitions(parts)
	waitFor(t, "port 2's table with 0x8001", func() bool {
		_, ok := a1.e.dev.(*soft.HCA).SoftPort(2).FindPKey(0x8001)
		return ok
	})
	time.Sleep(100 * time.Millisecond) // the event reaches the engine
	if bcastGroup(a1) != g1 || !a1.Carrier() {
		t.Fatal("a P_Key added to port 2's table flushed ib1")
	}
	// A port event on port 2 alone (its link down and up again: PORT_ERR, ACTIVE)
	// flushes ib1, which leaves and rejoins its groups and forgets its paths; ib0 keeps
	// its groups and paths. The event loop flushes a port's interfaces side by side,
	// each taking its group table first thing, so a flush of ib0 would have replaced
	// ib0's by the time ib1 has left and joined again.
	for _, down := range []bool{true, false} {
		if err := r.smh.SM().SetLink("a", 2, down); err != nil {
			t.Fatal(err)
		}
		if down {
			waitFor(t, "ib1 without carrier", func() bool { return !a1.Carrier() })
		}
	}
	waitFor(t, "ib1 flushed and joined again", func() bool {
		g := bcastGroup(a1)
		_, hasPath := pathOf(a1, b1.HWAddr().GID())
		return g != nil && g != g1 && a1.Carrier() && !hasPath
	})
	if bcastGroup(a0) != g0 {
		t.Fatal("ib0's groups were flushed by an event on port 2")
	}
	if p, ok := pathOf(a0, b0.HWAddr().GID()); !ok || p.ah == nil {
		t.Fatal("ib0's path was flushed by an event on port 2")
	}

	// ib1 goes down: port 2's memberships are left; ib0 is untouched.
	if err := a1.SetUp(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's port 2 out of its groups", func() bool {
		return r.joinState(mgid, a1.HWAddr().GID()) == 0 && r.joinState(bcast, a1.HWAddr().GID()) == 0
	})
	if a1.Carrier() || !a0.Carrier() {
		t.Fatalf("carrier ib0 %v ib1 %v after ib1 went down, want on and off", a0.Carrier(), a1.Carrier())
	}
	if st := r.joinState(bcast, a0.HWAddr().GID()); st != mad.JoinFull {
		t.Fatalf("a's port 1 broadcast join state %#x after ib1 went down, want full", st)
	}
	ping(t, a0, b0, h0, "10.0.0.1", "10.0.0.2", 3)
}

// The interface table is not held while a child's QP is made, so two parents may make
// children of one name at once: exactly one gets it, the other EEXIST, and the
// loser's interface is closed (the package's leak check sees its goroutines).
func TestChildNameTakenByOneOfTwoParents(t *testing.T) {
	e := newRig(t).engine("two", 2, Options{})
	ib0, _ := e.Interface("ib0")
	ib1, _ := e.Interface("ib1")
	for k := range 20 {
		name := fmt.Sprintf("dup%d", k)
		errs := make(chan error, 2)
		for _, p := range []*Interface{ib0, ib1} {
			go func() {
				_, err := p.AddLink(ChildSpec{Name: name, PKey: 0x8001})
				errs <- err
			}()
		}
		var ok, exist int
		for range 2 {
			switch err := <-errs; {
			case err == nil:
				ok++
			case errors.Is(err, syscall.EEXIST):
				exist++
			default:
				t.Fatalf("%s: %v", name, err)
			}
		}
		if ok != 1 || exist != 1 {
			t.Fatalf("%s made by two parents at once: %d made, %d EEXIST", name, ok, exist)
		}
		if c, found := e.Interface(name); !found || len(ib0.Children())+len(ib1.Children()) != k+1 || c.Parent() == nil {
			t.Fatalf("%s: in the table %v, children %d+%d", name, found, len(ib0.Children()), len(ib1.Children()))
		}
	}
}
