package ipoib

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/soft"
	"ipoibfs/verbs/soft/partitions"
)

// arpFrom hands i an ARP packet as if received.
func arpFrom(i *Interface, op uint16, senderIP string, senderHW HWAddr, targetIP string) {
	a := arpPacket{Op: op, SenderHW: senderHW, SenderIP: netip.MustParseAddr(senderIP), TargetIP: netip.MustParseAddr(targetIP)}
	i.handleARP(a.appendFrame(nil)[encapLen:])
}

// peerHW is a made-up unicast hardware address in i's subnet.
func peerHW(i *Interface, n uint64) HWAddr {
	return MakeHWAddr(0, verbs.QPN(0x1000+n), verbs.MakeGID(i.HWAddr().GID().Prefix(), verbs.GUID(0x0200000000c00000+n)))
}

// Only the sender of a request for one of our addresses makes a neighbour (the kernel
// with arp_accept off, RFC 4861 §7.2.5): an ARP reply nobody asked for, a gratuitous
// ARP or an advertisement for an unknown target makes none, and updates one that is
// there.
func TestNeighbourLearning(t *testing.T) {
	r := newRig(t)
	a := iface(t, r.engine("a", 1, Options{}), "ib0")
	bringUp(t, a, "10.0.0.1/24", "fd00::1/64")

	arpFrom(a, arpReply, "10.0.0.9", peerHW(a, 9), "10.0.0.1")
	arpFrom(a, arpRequest, "10.0.0.7", peerHW(a, 7), "10.0.0.7") // gratuitous
	arpFrom(a, arpRequest, "10.0.0.6", peerHW(a, 6), "10.0.0.99")
	na := a.ndFrame(icmpv6NA, netip.MustParseAddr("fd00::9"), netip.MustParseAddr("ff02::1"), netip.MustParseAddr("fd00::9"), ndOptTgtLL, naFlagOverrid)
	a.handleND(na[encapLen:])
	for _, ip := range []string{"10.0.0.9", "10.0.0.7", "10.0.0.6", "fd00::9"} {
		if _, ok := neighOf(a, ip); ok {
			t.Errorf("a neighbour for %s from a packet nobody asked for", ip)
		}
	}

	arpFrom(a, arpRequest, "10.0.0.8", peerHW(a, 8), "10.0.0.1")
	if n, ok := neighOf(a, "10.0.0.8"); !ok || !n.valid || n.hw != peerHW(a, 8) {
		t.Fatalf("the sender of a request for our address: %+v %v", n, ok)
	}
	arpFrom(a, arpReply, "10.0.0.8", peerHW(a, 18), "10.0.0.1")
	if n, _ := neighOf(a, "10.0.0.8"); n.hw != peerHW(a, 18) {
		t.Fatalf("a reply did not update the neighbour: %s", n.hw)
	}
	ns := a.ndFrame(icmpv6NS, netip.MustParseAddr("fd00::8"), solicitedNode(netip.MustParseAddr("fd00::1")), netip.MustParseAddr("fd00::1"), ndOptSrcLL, 0)
	a.handleND(ns[encapLen:])
	if n, ok := neighOf(a, "fd00::8"); !ok || !n.valid {
		t.Fatal("the sender of a solicitation for our address was not learned")
	}
}

// A resolved neighbour nobody sends to for two GC rounds is forgotten with its path
// (__ipoib_reap_neigh), and the next packet resolves it again; one sent to stays.
// Taking the interface down forgets them all (neigh_ifdown).
func TestNeighbourGC(t *testing.T) {
	clk := clock.NewMock(t)
	_, nodes := testFabricWith(t, "", func(c *soft.Config, o *Options) {
		if c.Name == "a" {
			o.Clock = clk
		}
	}, "a", "b")
	a, b := nodes[0], nodes[1]
	addressNodes(nodes)
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	bGID := b.ib0.HWAddr().GID()
	if _, ok := pathOf(a.ib0, bGID); !ok {
		t.Fatal("no path to b after a ping")
	}
	taskRound(t, a.ib0) // the GC's first round is planned now
	rounds := 0
	for ; rounds < 5; rounds++ {
		if _, ok := neighOf(a.ib0, "10.0.0.2"); !ok {
			break
		}
		clk.Advance(neighGC)
		taskRound(t, a.ib0)
	}
	// The round that finds it sent to, then two idle ones.
	if rounds != 3 {
		t.Fatalf("the idle neighbour went after %d GC rounds, want 3", rounds)
	}
	if _, ok := pathOf(a.ib0, bGID); ok {
		t.Fatal("the path stayed without its neighbour")
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 2)

	// Sent to between the rounds: it stays.
	for k := range 4 {
		ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", uint16(10+k))
		clk.Advance(neighGC)
		taskRound(t, a.ib0)
	}
	if n, ok := neighOf(a.ib0, "10.0.0.2"); !ok || !n.valid {
		t.Fatal("a neighbour in use was forgotten")
	}

	if err := a.ib0.SetUp(false); err != nil {
		t.Fatal(err)
	}
	a.ib0.dmu.Lock()
	left := len(a.ib0.neigh)
	a.ib0.dmu.Unlock()
	if left != 0 {
		t.Fatalf("%d neighbours left on a down interface", left)
	}
}

// setBounds lowers the tables' bounds for one test.
func setBounds(t *testing.T, neighs, unresolved, paths, sendOnly int) {
	old := [4]int{maxNeigh, maxUnresolved, maxPaths, maxSendOnly}
	maxNeigh, maxUnresolved, maxPaths, maxSendOnly = neighs, unresolved, paths, sendOnly
	t.Cleanup(func() { maxNeigh, maxUnresolved, maxPaths, maxSendOnly = old[0], old[1], old[2], old[3] })
}

// Nothing a peer or the host sends grows the tables past their bounds: requests for
// our address from ever new senders (a neighbour and a path each), sends to addresses
// nobody answers for, sends to ever new multicast groups. What does not fit is
// dropped and counted; a full table first forgets the neighbours not in use.
func TestNeighbourTablesBounded(t *testing.T) {
	setBounds(t, 16, 4, 16, 3)
	r := newRig(t)
	a := iface(t, r.engine("a", 1, Options{}), "ib0")
	bringUp(t, a, "10.0.0.1/24")
	sizes := func() (neighs, pending, paths, sendOnly int) {
		a.dmu.Lock()
		defer a.dmu.Unlock()
		for _, g := range a.mcast {
			if g.sendOnly {
				sendOnly++
			}
		}
		return len(a.neigh), len(a.pending), len(a.paths), sendOnly
	}
	for k := range uint64(100) {
		arpFrom(a, arpRequest, fmt.Sprintf("10.0.1.%d", k), peerHW(a, k), "10.0.0.1")
		if n, _, p, _ := sizes(); n > 16 || p > 16 {
			t.Fatalf("after %d requests: %d neighbours, %d paths (bounds 16, 16)", k+1, n, p)
		}
	}
	before := a.Stats().TxDropped
	for k := range 10 {
		a.Transmit([][]byte{icmp4("10.0.0.1", fmt.Sprintf("10.0.0.%d", 100+k), 8, uint16(k), 56)})
	}
	if _, pend, _, _ := sizes(); pend > 4 {
		t.Fatalf("%d neighbours being resolved, bound 4", pend)
	}
	if d := a.Stats().TxDropped - before; d < 6 {
		t.Fatalf("tx_dropped +%d for 10 sends to unresolved addresses with room for 4", d)
	}
	for k := range 10 {
		a.Transmit([][]byte{udp4("10.0.0.1", fmt.Sprintf("239.1.1.%d", k), 5000, make([]byte, 10))})
	}
	if _, _, _, so := sizes(); so != 3 {
		t.Fatalf("%d send-only groups, bound 3", so)
	}
}

// A connection that fails without a reject (here: the SA finds no path for it) sends
// the frames it held over UD, and the next packet tries again: it does not start
// connection after connection for the same frames.
func TestFailedConnectionFallsBackToUD(t *testing.T) {
	var cmQueries atomic.Int64
	a, b := cmPathFailing(t, func() { cmQueries.Add(1) })
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	time.Sleep(100 * time.Millisecond) // a loop would go on meanwhile
	if n := cmQueries.Load(); n > 30 {
		t.Fatalf("%d connection attempts for one ping", n)
	}
}

// A light flush (an SM's client reregister, GID or SM change) leaves and rejoins the
// groups without taking the carrier down or stopping unicast, as the driver's
// ipoib_mcast_dev_flush; a heavy one (PKEY_CHANGE) with the interface's P_Key and
// index unchanged does nothing; a normal one takes the carrier down and rejoins.
func TestFlushLevels(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	addressNodes(nodes)
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	bcast := a.ib0.data().bcast.GID()
	// group is the broadcast group's entry and whether it is joined (its address
	// handle made), read under the table's lock.
	group := func() (*mcastGroup, bool) {
		a.ib0.dmu.Lock()
		defer a.ib0.dmu.Unlock()
		g := a.ib0.mcast[bcast]
		return g, g != nil && g.ah != nil
	}
	before, _ := group()
	a.ib0.flush(flushHeavy)
	if g, _ := group(); g != before || !a.ib0.Carrier() {
		t.Fatal("a heavy flush with the P_Key unchanged flushed")
	}
	a.ib0.flush(flushLight)
	if !a.ib0.Carrier() || !a.host.state().carrier {
		t.Fatal("a light flush took the carrier down")
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 2) // unicast: the path stays
	waitFor(t, "the broadcast group joined again", func() bool { g, joined := group(); return joined && g != before })
	rejoined, _ := group()
	a.ib0.flush(flushNormal)
	waitFor(t, "rejoined after a normal flush", func() bool { g, joined := group(); return joined && g != rejoined && a.ib0.Carrier() })
}

// Frames queued while a connection is made are checked against the receive MTU the
// peer announces in its REP, as a frame sent afterwards: one it cannot take is dropped
// with fragmentation-needed to the sender, instead of being posted and failing the
// connection at the responder.
func TestQueuedFramesCheckedAgainstThePeersMTU(t *testing.T) {
	old := cmAnnouncedMTU
	cmAnnouncedMTU = 8192 + encapLen
	t.Cleanup(func() { cmAnnouncedMTU = old })
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	connectedNodes(t, nodes)
	// The first packet to b waits for ARP, then for the connection it starts.
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 2, 20000)})
	waitFor(t, "fragmentation-needed for the 20000-byte packet", func() bool {
		fn := a.host.take(func(p []byte) bool { return len(p) >= 28 && p[9] == 1 && p[20] == 3 && p[21] == 4 })
		return len(fn) > 0 && int(binary.BigEndian.Uint16(fn[0][26:])) == 2044
	})
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 3)
	a.ib0.dmu.Lock()
	t0 := a.ib0.tx[b.ib0.HWAddr()]
	up := t0 != nil && t0.up
	a.ib0.dmu.Unlock()
	if !up {
		t.Fatal("the connection did not stay up")
	}
	if got := b.host.take(isICMP4(2)); len(got) != 0 {
		t.Fatal("the 20000-byte packet reached a peer that takes 8192")
	}
}

// Taking an interface down ends its connections both ways (ipoib_cm_dev_stop; the
// transmit ones go with the neighbours in the driver), and a down interface refuses
// connection requests, as one without a listener does.
func TestDownEndsConnections(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	connectedNodes(t, nodes)
	waitFor(t, "a 20000-byte packet over a connection", func() bool {
		a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 7, 20000)})
		time.Sleep(20 * time.Millisecond)
		return len(b.host.take(isICMP4(7))) > 0
	})
	conns := func(i *Interface) (tx, rx int) {
		i.dmu.Lock()
		defer i.dmu.Unlock()
		return len(i.tx), len(i.rx)
	}
	if tx, _ := conns(a.ib0); tx != 1 {
		t.Fatalf("a has %d transmit connections", tx)
	}
	if _, rx := conns(b.ib0); rx != 1 {
		t.Fatalf("b has %d passive connections", rx)
	}
	if err := b.ib0.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if tx, rx := conns(b.ib0); tx != 0 || rx != 0 {
		t.Fatalf("b down: %d transmit, %d passive connections", tx, rx)
	}
	if err := a.ib0.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if tx, rx := conns(a.ib0); tx != 0 || rx != 0 {
		t.Fatalf("a down: %d transmit, %d passive connections", tx, rx)
	}
	// a up again, b still down: a's connection to b is refused (it falls back to UD,
	// where b, down, takes nothing either).
	if err := a.ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's carrier", a.ib0.Carrier)
	hw := b.ib0.HWAddr()
	a.ib0.dmu.Lock()
	a.ib0.neigh[netip.MustParseAddr("10.0.0.2")] = &neigh{hw: hw, valid: true}
	a.ib0.dmu.Unlock()
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 8, 20000)})
	waitFor(t, "a's connection to the down b refused", func() bool {
		a.ib0.dmu.Lock()
		defer a.ib0.dmu.Unlock()
		t0 := a.ib0.tx[hw]
		return t0 != nil && !t0.rejected.IsZero()
	})
	if _, rx := conns(b.ib0); rx != 0 {
		t.Fatal("the down b accepted a connection")
	}
}

// Frames that wait for a group's join and are dropped with the group (a flush leaving
// every group) count in tx_dropped, as ipoib_mcast_free counts them.
func TestFramesOfDroppedGroupsCounted(t *testing.T) {
	release := make(chan struct{})
	h := &hookSA{join: func(ctx context.Context, n int, rec mad.MCMemberRecord) error {
		if rec.MGID[2] == 0xee { // the send-only group below: held until the flush
			select {
			case <-release:
			case <-ctx.Done():
			}
			return errors.New("held")
		}
		return nil
	}}
	r := newRig(t)
	a := iface(t, r.engine("a", 1, Options{wrapSA: h.wrap}), "ib0")
	bringUp(t, a, "10.0.0.1/24")
	defer close(release)
	mgid := verbs.GID{0xff, 0x12, 0xee, 1, 15: 9}
	frame := append([]byte{0x08, 0x00, 0, 0}, icmp4("10.0.0.1", "239.1.2.3", 8, 1, 56)...)
	a.dmu.Lock()
	for range 3 {
		a.sendMulticastLocked(mgid, frame)
	}
	queued := len(a.mcast[mgid].queue)
	a.dmu.Unlock()
	if queued != 3 {
		t.Fatalf("%d frames queued for the send-only group", queued)
	}
	before := a.Stats().TxDropped
	a.leaveAll(false)
	if d := a.Stats().TxDropped - before; d != 3 {
		t.Fatalf("tx_dropped +%d when a group with 3 frames waiting was left, want +3", d)
	}
}

// Going down or to datagram mode while a connection is being made drops the frames
// waiting for it, counted, and the connect failing afterwards sends none of them.
func TestDownDropsFramesWaitingForAConnection(t *testing.T) {
	for _, c := range []struct {
		name string
		do   func(i *Interface) error
	}{
		{"down", func(i *Interface) error { return i.SetUp(false) }},
		{"mode datagram", func(i *Interface) error { return i.SetMode(Datagram) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			release := make(chan struct{})
			var cmQueries atomic.Int64
			a, b := cmPathFailing(t, func() { cmQueries.Add(1); <-release }) // held until after c.do
			defer func() {
				select {
				case <-release:
				default:
					close(release)
				}
			}()
			a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 9, 20000)})
			waitFor(t, "the frame waiting for a connection", func() bool {
				a.ib0.dmu.Lock()
				defer a.ib0.dmu.Unlock()
				t0 := a.ib0.tx[b.ib0.HWAddr()]
				return cmQueries.Load() > 0 && t0 != nil && len(t0.queue) == 1
			})
			before := a.ib0.Stats().TxDropped
			if err := c.do(a.ib0); err != nil {
				t.Fatal(err)
			}
			if d := a.ib0.Stats().TxDropped - before; d != 1 {
				t.Fatalf("tx_dropped +%d for the frame that waited, want +1", d)
			}
			close(release)
			time.Sleep(100 * time.Millisecond) // the connect fails and would send what it held
			if got := b.host.take(isICMP4(9)); len(got) != 0 {
				t.Fatal("the frame was sent after it was dropped")
			}
		})
	}
}

// cmPathFailing makes nodes a and b in connected mode, where every path query a's
// connection manager makes (one with a deadline; UD's has none) runs query, then
// finds no path.
func cmPathFailing(t *testing.T, query func()) (a, b *node) {
	t.Helper()
	h := &hookSA{path: func(ctx context.Context, n int, dgid verbs.GID) error {
		if _, ok := ctx.Deadline(); ok {
			query()
			return errors.New("no path for the connection")
		}
		return nil
	}}
	_, nodes := testFabricWith(t, "", func(c *soft.Config, o *Options) {
		if c.Name == "a" {
			o.wrapSA = h.wrap
		}
	}, "a", "b")
	connectedNodes(t, nodes)
	return nodes[0], nodes[1]
}

// A port event flushes the port's interfaces side by side, as the driver's per-interface
// workqueues do: one waiting for a slow SA's answer to its leaves does not hold up the
// others' (in turn, a reregister reached the thousandth child after minutes).
func TestPortFlushIsParallel(t *testing.T) {
	const children = 6
	r := newRig(t)
	conf := "Default=0x7fff, ipoib : ALL=full;\n"
	for k := range children {
		conf += fmt.Sprintf("P%d=%#x, ipoib : ALL=full;\n", k, 0x8001+k)
	}
	parts, err := partitions.Parse("t.conf", strings.NewReader(conf))
	if err != nil {
		t.Fatal(err)
	}
	r.smh.SM().SetPartitions(parts)
	release := make(chan struct{})
	var held atomic.Int32
	e := r.engine("a", 1, Options{wrapSA: (&hookSA{leave: func(ctx context.Context, rec mad.MCMemberRecord) error {
		if rec.MGID[0] == 0xff && rec.MGID[1]&0x0f == 2 && rec.MGID[2] == 0x40 && rec.MGID[3] == 0x1b { // IPv4 groups
			held.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}}).wrap})
	ib0 := iface(t, e, "ib0")
	all := []*Interface{ib0}
	for k := range children {
		c, err := ib0.CreateChild(int64(0x8001 + k))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, c)
	}
	for _, i := range all {
		_ = i.SetUp(true)
	}
	for _, i := range all {
		waitFor(t, i.Name()+" carrier", i.Carrier)
	}
	done := make(chan struct{})
	go func() { defer close(done); e.flushPort(1, flushNormal) }()
	waitFor(t, "every interface's leave of its broadcast group under way at once", func() bool { return held.Load() >= int32(len(all)) })
	close(release)
	<-done
}
