package soft

import (
	"net/netip"
	"testing"

	"ipoibfs/verbs"
)

// FuzzSMHello feeds the subnet manager hellos (and anything else) from a handful of
// addresses, one fabric for the whole run, as a peer on the fabric could: no panic,
// and its tables stay consistent (every port registered under its GUID at its
// address, none with LID 0).
func FuzzSMHello(f *testing.F) {
	smh, err := New(Config{Name: "sm", Network: NewMemNetwork(), HostSM: true, Heartbeat: testHB})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { smh.Close() })
	sm := smh.SM()
	h := ctlHello{NodeGUID: 7, PortGUID: 7, PortNum: 1, NumPorts: 1, MaxMTU: verbs.MTU4096, Width: 4, LaneMbps: 10000, NodeDesc: "x"}
	f.Add(h.append(putCtlHeader(nil, ctlAttrHello, 0)), uint8(1))
	h.PortGUID = smh.SoftPort(1).guid
	f.Add(h.append(putCtlHeader(nil, ctlAttrHello, 0)), uint8(2))
	f.Add([]byte{1, 9, 1, 3}, uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, from uint8) {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 9, from % 8}), 4791)
		smh.SoftPort(1).handleCtl(src, b, 0)
		sm.mu.Lock()
		defer sm.mu.Unlock()
		for a, sp := range sm.ports {
			if sp.addr != a || sm.byGUID[sp.guid] != sp || sp.lid == 0 {
				t.Fatalf("port at %s: registered at %s, under its GUID %v, LID %#x", a, sp.addr, sm.byGUID[sp.guid] == sp, sp.lid)
			}
		}
		if len(sm.byGUID) != len(sm.ports) {
			t.Fatalf("%d ports by GUID, %d by address", len(sm.byGUID), len(sm.ports))
		}
	})
}

// FuzzPortCtl feeds a port control messages as from its subnet manager (Config,
// Routes in parts, Delta): no panic, and what it keeps of unfinished tables is bounded.
func FuzzPortCtl(f *testing.F) {
	net := NewMemNetwork()
	smh, err := New(Config{Name: "sm", Network: net, HostSM: true, Heartbeat: testHB})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { smh.Close() })
	h, err := New(Config{Name: "a", Network: net, SM: smh.Endpoint(1), Heartbeat: testHB})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { h.Close() })
	p := h.SoftPort(1)
	r := ctlRoutes{Version: 9, Uni: []ctlRoute{{LID: 1, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 1), Addr: netip.MustParseAddrPort("127.0.0.1:4791")}}}
	for _, part := range r.split() {
		f.Add(part.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	}
	r.Part, r.Parts = 3, 7
	f.Add(r.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	c := ctlConfig{LID: 5, SMLID: 1, State: verbs.PortActive, ActiveMTU: verbs.MTU2048, PKeys: []verbs.PKey{0xffff}}
	f.Add(c.append(putCtlHeader(nil, ctlAttrConfig, 0)))
	// Deltas on top of version 9 (the whole table above), and on one the port never had.
	d := ctlRoutesDelta{From: 9, DelUni: []verbs.LID{1}, Routes: ctlRoutes{Version: 10, Parts: 1,
		Uni: []ctlRoute{{LID: 2, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 2), Addr: netip.MustParseAddrPort("127.0.0.2:4791")}}}}
	f.Add(d.append(putCtlHeader(nil, ctlAttrDelta, 0)))
	d.From = 77
	f.Add(d.append(putCtlHeader(nil, ctlAttrDelta, 0)))
	f.Fuzz(func(t *testing.T, b []byte) {
		p.handleCtl(smh.Endpoint(1), b, 0)
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.partial) > maxRoutesParts {
			t.Fatalf("%d parts kept", len(p.partial))
		}
		// An address leads only to the route its LID has now.
		for a, r := range p.byAddr {
			if u, ok := p.uni[r.LID]; !ok || u != r || r.Addr != a {
				t.Fatalf("byAddr[%v] = %+v; uni[%d] = %+v, %v", a, r, r.LID, u, ok)
			}
		}
	})
}

// A route table or delta that lists one LID twice keeps its last route, and the
// address of the first no longer passes as that LID (source()).
func TestRoutesListingALIDTwice(t *testing.T) {
	// An SM address where nothing answers: no route table but the test's arrives.
	h, err := New(Config{Name: "a", Network: NewMemNetwork(), SM: netip.MustParseAddrPort("127.0.0.1:9"), Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p := h.SoftPort(1)
	gid := verbs.MakeGID(verbs.DefaultGIDPrefix, 7)
	a, b, c := netip.MustParseAddrPort("127.0.0.7:4791"), netip.MustParseAddrPort("127.0.0.8:4791"), netip.MustParseAddrPort("127.0.0.9:4791")
	p.applyRoutes(&ctlRoutes{Version: 3, Parts: 1, Uni: []ctlRoute{{LID: 7, GID: gid, Addr: a}, {LID: 7, GID: gid, Addr: b}}})
	if r, ok := p.source(a); ok {
		t.Errorf("whole table: the first address of LID 7 still passes as %+v", r)
	}
	if r, ok := p.source(b); !ok || r.LID != 7 {
		t.Errorf("whole table: LID 7's route: %+v, %v", r, ok)
	}
	p.applyDelta(&ctlRoutesDelta{From: 3, Routes: ctlRoutes{Version: 4, Parts: 1, Uni: []ctlRoute{{LID: 7, GID: gid, Addr: c}, {LID: 7, GID: gid, Addr: a}}}})
	for _, stale := range []netip.AddrPort{b, c} {
		if r, ok := p.source(stale); ok {
			t.Errorf("delta: %v still passes as %+v", stale, r)
		}
	}
	if r, ok := p.source(a); !ok || r.LID != 7 {
		t.Errorf("delta: LID 7's route: %+v, %v", r, ok)
	}
}
