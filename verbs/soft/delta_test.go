package soft

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

func TestCtlDeltaRoundTrip(t *testing.T) {
	d := ctlRoutesDelta{From: 7, DelUni: []verbs.LID{3, 9}, DelMulti: []verbs.LID{0xc001},
		Routes: ctlRoutes{Version: 8, Parts: 1, Faults: Faults{Loss: 0.5},
			Uni:   []ctlRoute{{LID: 4, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 4), Addr: netip.MustParseAddrPort("127.0.0.4:4791")}},
			Multi: []ctlMRoute{{MLID: 0xc002, MGID: verbs.GID{0xff, 0x12}, Members: []verbs.LID{1, 4}}}}}
	attr, body, err := parseCtl(d.append(putCtlHeader(nil, ctlAttrDelta, 0)))
	var d2 ctlRoutesDelta
	if err != nil || attr != ctlAttrDelta || d2.parse(body) != nil || !cmp.Equal(d, d2, addrCmp) {
		t.Fatalf("delta: %v %v", err, cmp.Diff(d, d2, addrCmp))
	}
	// A delta is one part; a count beyond the bytes is short.
	d.Routes.Parts = 2
	if err := d2.parse(d.append(nil)); err == nil {
		t.Error("a delta of 2 parts parsed")
	}
	if err := d2.parse([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0}); err == nil {
		t.Error("a delta announcing 65280 removals in 0 bytes parsed")
	}
}

// portTables is what a port's forwarding tables hold.
func portTables(p *Port) (uint64, map[verbs.LID]ctlRoute, map[verbs.LID]ctlMRoute, map[netip.AddrPort]verbs.LID) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	byAddr := map[netip.AddrPort]verbs.LID{}
	for a, r := range p.byAddr {
		byAddr[a] = r.LID
	}
	uni, multi := map[verbs.LID]ctlRoute{}, map[verbs.LID]ctlMRoute{}
	for l, r := range p.uni {
		uni[l] = r
	}
	for l, m := range p.multi {
		multi[l] = m
	}
	return p.routesV, uni, multi, byAddr
}

// Joins and leaves one at a time go out as deltas, not as the whole tables: after a
// sequence of them (groups created, joined by a second port, left, gone) every port's
// tables are exactly the SM's. A port that missed a delta keeps its tables, says so
// in its next hello, gets the whole tables (twice: a resend's tables are not a base
// for the next delta), and takes deltas again after.
func TestDeltasKeepEveryPortsTablesTheSMs(t *testing.T) {
	smh, nodes := slowBeatFabric(t, "a", "b", "c")
	sm := smh.SM()
	ctx := context.Background()
	pa, pb, pc := nodes[0].SoftPort(1), nodes[1].SoftPort(1), nodes[2].SoftPort(1)
	ga, _ := pa.GID(0)
	bcast := joinBroadcast(t, pa)
	ports := []*Port{smh.SoftPort(1), pa, pb, pc}
	same := func(when string) {
		t.Helper()
		r, _ := sm.routesTables()
		wantUni, wantMulti := map[verbs.LID]ctlRoute{}, map[verbs.LID]ctlMRoute{}
		wantAddr := map[netip.AddrPort]verbs.LID{}
		for _, u := range r.Uni {
			wantUni[u.LID], wantAddr[u.Addr] = u, u.LID
		}
		for _, m := range r.Multi {
			wantMulti[m.MLID] = m
		}
		for _, p := range ports {
			waitFor(t, fmt.Sprintf("%s: port %s at routes version %d", when, p.hca.Name(), r.Version), func() bool {
				v, _, _, _ := portTables(p)
				return v == r.Version
			})
			_, uni, multi, byAddr := portTables(p)
			if diff := cmp.Diff(wantUni, uni, addrCmp); diff != "" {
				t.Fatalf("%s: %s's unicast table differs from the SM's (-SM +port):\n%s", when, p.hca.Name(), diff)
			}
			if diff := cmp.Diff(wantMulti, multi); diff != "" {
				t.Fatalf("%s: %s's multicast table differs from the SM's (-SM +port):\n%s", when, p.hca.Name(), diff)
			}
			if diff := cmp.Diff(wantAddr, byAddr, addrCmp); diff != "" {
				t.Fatalf("%s: %s's address index differs (-SM +port):\n%s", when, p.hca.Name(), diff)
			}
		}
	}
	deltas, publishes := sm.deltas.Load(), sm.publishes.Load()
	for k := range 40 {
		if _, err := joinGroup(ctx, pa, groupMGID(k), bcast); err != nil {
			t.Fatal(err)
		}
		if k%4 == 0 {
			if _, err := joinGroup(ctx, pb, groupMGID(k), bcast); err != nil {
				t.Fatal(err)
			}
		}
	}
	gb, _ := pb.GID(0)
	for k := 0; k < 40; k += 8 { // b leaves (the group stays, a is in it); a leaves (it goes)
		for _, m := range []struct {
			p *Port
			g verbs.GID
		}{{pb, gb}, {pa, ga}} {
			if err := (&sa.Client{Port: m.p}).Leave(ctx, mad.MCMemberRecord{MGID: groupMGID(k), PortGID: m.g, JoinState: mad.JoinFull}, mad.LeaveMask); err != nil {
				t.Fatal(err)
			}
		}
	}
	same("after 50 joins and 10 leaves one at a time")
	passes := sm.publishes.Load() - publishes
	if got := sm.deltas.Load() - deltas; got < 4*passes/2 {
		t.Fatalf("%d passes sent %d deltas: most should have gone to the 4 ports as deltas", passes, got)
	}

	// c misses a delta: its tables stay at an older version.
	pc.mu.Lock()
	pc.routesV--
	stale := pc.routesV
	pc.mu.Unlock()
	if _, err := joinGroup(ctx, pa, groupMGID(100), bcast); err != nil {
		t.Fatal(err)
	}
	if v, _, multi, _ := portTables(pc); v != stale || slices.ContainsFunc(mapValues(multi), func(m ctlMRoute) bool { return m.MGID == groupMGID(100) }) {
		t.Fatalf("c applied a delta to tables of another version (now %d, was %d)", v, stale)
	}
	pc.sendHello() // its heartbeat: the SM sees the old version and sends the whole tables
	same("after c's hello")
	// The tables resent to c may hold changes later than their version: the next pass
	// sends c the whole tables again, the one after a delta.
	for k, want := range []uint64{3, 4} {
		d := sm.deltas.Load()
		if _, err := joinGroup(ctx, pa, groupMGID(101+k), bcast); err != nil {
			t.Fatal(err)
		}
		same(fmt.Sprintf("after join %d since c caught up", k+1))
		if got := sm.deltas.Load() - d; got != want {
			t.Fatalf("join %d since c caught up sent %d deltas, want %d", k+1, got, want)
		}
	}
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
