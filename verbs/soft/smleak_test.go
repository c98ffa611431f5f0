package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// A node that restarts under another name at the same address brings a new port GUID
// there: the subnet manager forgets the port that was there as its sweep forgets a
// silent one. Its GID no longer resolves (no PathRecord), its group memberships leave
// the SA database (a group only it joined is deleted and leaves the tables), and the
// SM keeps no port by GUID that it does not have by address. On virtual time, so no
// sweep runs: only the new hello can make the SM forget the old port.
func TestSMForgetsThePortANewGUIDReplacesAtItsAddress(t *testing.T) {
	clk := clock.NewMock(t)
	n := NewMemNetwork()
	smh, err := New(Config{Name: "sm", Network: n, HostSM: true, Heartbeat: testHB, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	addr := netip.MustParseAddrPort("127.0.0.1:4792")
	start := func(name string) *HCA {
		t.Helper()
		h, err := New(Config{Name: name, Network: n, Listen: addr, SM: smh.Endpoint(1), Heartbeat: testHB, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		waitFor(t, name+" active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
		return h
	}
	sm := smh.SM()
	ctx := context.Background()

	a := start("a")
	pa := a.SoftPort(1)
	ga, _ := pa.GID(0)
	bcast := joinBroadcast(t, pa)
	own := groupMGID(0) // a group only a joins
	if _, err := joinGroup(ctx, pa, own, bcast); err != nil {
		t.Fatal(err)
	}
	ps := smh.SoftPort(1)
	gs, _ := ps.GID(0)
	waitFor(t, "a's group in the SM port's tables", func() bool { _, ok := ps.mlid(own); return ok })
	if _, err := (&sa.Client{Port: ps}).PathRecord(ctx, gs, ga, 0xffff, 0); err != nil {
		t.Fatalf("path to a while it runs: %v", err)
	}

	a.Close()
	b := start("b") // same address, another name: another port GUID
	pb := b.SoftPort(1)
	gb, _ := pb.GID(0)
	if gb.GUID() == ga.GUID() {
		t.Fatalf("b has a's port GUID %v", ga)
	}

	if _, ok := sm.portByGID(ga); ok {
		t.Errorf("the SM still resolves a's GID %v after b took its address", ga)
	}
	var se *sa.StatusError
	if pr, err := (&sa.Client{Port: ps}).PathRecord(ctx, gs, ga, 0xffff, 0); !errors.As(err, &se) {
		t.Errorf("PathRecord to a's GID after b took its address: %+v, %v; want an SA error", pr, err)
	}
	if _, err := (&sa.Client{Port: ps}).PathRecord(ctx, gs, gb, 0xffff, 0); err != nil {
		t.Errorf("path to b: %v", err)
	}
	if g, ok := sm.DB().Group(own); ok {
		t.Errorf("the group only a joined is still in the SA database: %+v", g)
	}
	for _, g := range sm.DB().Groups() {
		for _, m := range g.Members {
			if m.GID == ga {
				t.Errorf("a is still a member of %v", g.MGID)
			}
		}
	}
	sm.mu.Lock()
	nGUID, nAddr, stale := len(sm.byGUID), len(sm.ports), sm.byGUID[ga.GUID()]
	sm.mu.Unlock()
	if stale != nil || nGUID != nAddr || nGUID != 2 {
		t.Errorf("the SM has %d ports by GUID (a's: %v), %d by address; want the SM's and b's", nGUID, stale != nil, nAddr)
	}
	// The tables follow: the group leaves every port's multicast routes.
	waitFor(t, "a's group gone from the SM port's tables", func() bool { _, ok := ps.mlid(own); return !ok })
}

// LIDs are not spent for ever on GUIDs gone: a port GUID seen before gets its old LID
// back while no one else needed it, and when no LID is left the LIDs of the GUIDs not
// registered now are taken back, so ports cycling through many GUIDs keep getting
// LIDs. When live ports hold every LID a new port is left out (and that logged once)
// rather than given LID 0. The unicast LID space is lowered to 4 (the SM's port holds
// LID 1), and hellos are handed to the SM directly, from addresses nobody listens on.
func TestSMReclaimsLIDsOfGUIDsGone(t *testing.T) {
	clk := clock.NewMock(t)
	logs := &lockedBuffer{}
	smh, err := New(Config{Name: "sm", Network: NewMemNetwork(), HostSM: true, Heartbeat: testHB, Clock: clk,
		Logger: log.New(logs, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	sm := smh.SM()
	const lidLast = 4
	sm.mu.Lock()
	sm.lidLast = lidLast
	sm.mu.Unlock()

	hello := func(a netip.AddrPort, g verbs.GUID) {
		h := ctlHello{NodeGUID: g, PortGUID: g, PortNum: 1, NumPorts: 1, MaxMTU: verbs.MTU4096, Width: 4,
			LaneMbps: 10000, Epoch: sm.epoch, NodeDesc: fmt.Sprintf("node %#x", uint64(g))}
		sm.handleHello(a, &h)
	}
	// lidOf is the LID of the port registered under GUID g (ok false: none is).
	lidOf := func(g verbs.GUID) (verbs.LID, bool) {
		sm.mu.Lock()
		defer sm.mu.Unlock()
		if sp := sm.byGUID[g]; sp != nil {
			return sp.lid, true
		}
		return 0, false
	}
	// check: every port listed has its own LID in 1..lidLast, and the SM keeps no
	// port by GUID that it does not have by address.
	check := func(when string) {
		t.Helper()
		seen := map[verbs.LID]verbs.GUID{}
		for _, nd := range sm.Nodes() {
			if nd.LID == 0 || nd.LID > lidLast {
				t.Fatalf("%s: port %#x has LID %#x, not a unicast LID in 1..%d", when, uint64(nd.PortGUID), nd.LID, lidLast)
			}
			if o, dup := seen[nd.LID]; dup {
				t.Fatalf("%s: ports %#x and %#x share LID %#x", when, uint64(o), uint64(nd.PortGUID), nd.LID)
			}
			seen[nd.LID] = nd.PortGUID
		}
		sm.mu.Lock()
		nGUID, nAddr := len(sm.byGUID), len(sm.ports)
		sm.mu.Unlock()
		if nGUID != nAddr {
			t.Fatalf("%s: %d ports by GUID, %d by address", when, nGUID, nAddr)
		}
	}
	x := netip.MustParseAddrPort("192.0.2.1:4791")
	y := netip.MustParseAddrPort("192.0.2.2:4791")
	z := netip.MustParseAddrPort("192.0.2.3:4791")
	w := netip.MustParseAddrPort("192.0.2.4:4791")

	// A GUID back before LIDs ran out gets the LID it had.
	hello(x, 0x100)
	l1, _ := lidOf(0x100)
	hello(x, 0x101) // the port at x restarted under another GUID
	if _, ok := lidOf(0x100); ok {
		t.Fatalf("GUID 0x100 still registered after another took its address")
	}
	hello(x, 0x100)
	if l, ok := lidOf(0x100); !ok || l != l1 {
		t.Fatalf("GUID 0x100 back: LID %#x (registered %v), want its old LID %#x", l, ok, l1)
	}
	check("GUID 0x100 back")

	// Ports at x and y cycle through many more GUIDs than there are LIDs.
	for i := range 100 {
		a, g := x, verbs.GUID(0x1000+i)
		if i%2 == 1 {
			a = y
		}
		hello(a, g)
		if l, ok := lidOf(g); !ok || l == 0 {
			t.Fatalf("GUID %#x (number %d through x and y): LID %#x, registered %v", uint64(g), i+1, l, ok)
		}
		check(fmt.Sprintf("GUID %#x", uint64(g)))
	}

	// Live ports at x, y and z hold LIDs 2..4: a fourth is left out, logged once.
	hello(z, 0x2000)
	if _, ok := lidOf(0x2000); !ok {
		t.Fatalf("GUID 0x2000 at z got no LID with one left")
	}
	for range 3 {
		hello(w, 0x3000)
	}
	if l, ok := lidOf(0x3000); ok {
		t.Fatalf("GUID 0x3000 registered with LID %#x while live ports hold every LID", l)
	}
	for _, nd := range sm.Nodes() {
		if nd.Addr == w {
			t.Fatalf("the SM lists the port at w it has no LID for: %+v", nd)
		}
	}
	check("LIDs all held by live ports")
	if c := strings.Count(logs.String(), "no free unicast LID"); c != 1 {
		t.Fatalf("the refused port logged %d times, want once:\n%s", c, logs)
	}
	// The port at z restarts under another GUID: it gets the LID z's old GUID left.
	lz, _ := lidOf(0x2000)
	hello(z, 0x2001)
	if l, ok := lidOf(0x2001); !ok || l != lz {
		t.Fatalf("GUID 0x2001 at z: LID %#x (registered %v), want %#x, the LID of the port it replaced", l, ok, lz)
	}
	check("z restarted")
}

// The port that hosts the subnet manager takes its configuration from that SM alone:
// a Config or Routes message from the network (anyone can address QP0) is dropped,
// whatever source it claims, so nobody rewrites its P_Keys, LID or routes.
func TestSMPortIgnoresConfigFromTheNetwork(t *testing.T) {
	smh := lonelySM(t)
	p := smh.SoftPort(1)
	before, lid := p.PKeyTable(), p.Attr().LID
	forged := ctlConfig{LID: 0x99, SMLID: 0x99, State: verbs.PortActive, ActiveMTU: verbs.MTU4096, PKeys: []verbs.PKey{0x8123}}
	body := forged.append(putCtlHeader(nil, ctlAttrConfig, 0))
	for _, src := range []netip.AddrPort{netip.MustParseAddrPort("127.0.0.99:4791"), p.ep.Addr()} {
		malformed := p.cnt.malformed.Load()
		p.handleCtl(src, body, 0)
		if got := p.PKeyTable(); !slices.Equal(got, before) || p.Attr().LID != lid {
			t.Fatalf("a Config from %s was applied: P_Keys %v (were %v), LID %#x (was %#x)", src, got, before, p.Attr().LID, lid)
		}
		if p.cnt.malformed.Load() != malformed+1 {
			t.Errorf("a Config from %s was not counted as dropped", src)
		}
	}
}

// A hello from elsewhere claiming the SM port's GUID is dropped: the SM's port keeps
// its address and LID (everyone's SA traffic goes there).
func TestSMKeepsItsOwnGUID(t *testing.T) {
	smh := lonelySM(t)
	p := smh.SoftPort(1)
	sm := smh.SM()
	h := ctlHello{NodeGUID: 0x4242, PortGUID: p.guid, PortNum: 1, NumPorts: 1, MaxMTU: verbs.MTU4096, Width: 4,
		LaneMbps: 10000, Epoch: sm.epoch, NodeDesc: "impostor"}
	smh.SoftPort(1).handleCtl(netip.MustParseAddrPort("127.0.0.98:4791"), h.append(putCtlHeader(nil, ctlAttrHello, 0)), 0)
	sm.mu.Lock()
	own := sm.byGUID[p.guid]
	_, here := sm.ports[p.ep.Addr()]
	lid := sm.smLID()
	sm.mu.Unlock()
	if own == nil || own.addr != p.ep.Addr() || !here || lid != p.Attr().LID {
		t.Fatalf("after a hello claiming the SM's GUID: registered at %v, SM's address registered %v", own, here)
	}
}

// A response reaches a waiting request only from where the request went and in its
// class, as the kernel MAD layer checks: another port answering with a guessed TID
// (they count up from 1) is dropped.
func TestMADResponseFromElsewhereDropped(t *testing.T) {
	smh := lonelySM(t)
	g := &smh.SoftPort(1).gsi
	ch := make(chan []byte, 4)
	const tid = 77
	g.mu.Lock()
	g.pending[tid] = pendingCall{ch: ch, dlid: 5, class: mad.ClassSA}
	g.mu.Unlock()
	defer func() { g.mu.Lock(); delete(g.pending, tid); g.mu.Unlock() }()
	resp := func(class uint8) []byte {
		m := make([]byte, mad.Size)
		m[0], m[1], m[2], m[3] = 1, class, 2, mad.MethodGet|mad.MethodResp
		binary.BigEndian.PutUint32(m[12:], tid)
		return m
	}
	g.receive(ctlRoute{LID: 9}, 1, resp(mad.ClassSA))   // another port
	g.receive(ctlRoute{LID: 5}, 1, resp(mad.ClassPerf)) // another class
	if len(ch) != 0 {
		t.Fatalf("%d forged responses reached the request", len(ch))
	}
	g.receive(ctlRoute{LID: 5}, 1, resp(mad.ClassSA))
	if len(ch) != 1 {
		t.Fatal("the response from where the request went did not reach it")
	}
}

// lonelySM is an HCA hosting the subnet manager on a fabric of its own, its port active.
func lonelySM(t *testing.T) *HCA {
	t.Helper()
	smh, err := New(Config{Name: "sm", Network: NewMemNetwork(), HostSM: true, Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	waitFor(t, "the SM's port active", func() bool { return smh.SoftPort(1).Attr().State == verbs.PortActive })
	return smh
}
