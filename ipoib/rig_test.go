package ipoib

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/soft"
)

// rig is a fabric with a subnet manager on which a test starts engines with options of
// its own (testFabric's engines have the default options and one port each).
type rig struct {
	t   testing.TB
	net *soft.MemNetwork
	smh *soft.HCA
}

func newRig(t testing.TB) *rig {
	t.Helper()
	net := soft.NewMemNetwork()
	smh, err := soft.New(soft.Config{Name: "sm", Network: net, HostSM: true, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	return &rig{t, net, smh}
}

// engine starts an HCA with that many ports on the fabric and an engine on it; its
// interfaces are down.
func (r *rig) engine(name string, ports int, o Options) *Engine {
	t := r.t
	t.Helper()
	h, err := soft.New(soft.Config{Name: name, Ports: ports, Network: r.net, SM: r.smh.Endpoint(1), Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	for n := 1; n <= ports; n++ {
		waitFor(t, name+" port active", func() bool { return h.SoftPort(n).Attr().State == verbs.PortActive })
	}
	e, err := New(h, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// smEngine starts an engine on the subnet manager's own HCA; its interfaces are down.
func (r *rig) smEngine(o Options) *Engine {
	r.t.Helper()
	e, err := New(r.smh, o)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(e.Close)
	return e
}

// joinState is the join state of the port with gid in the group mgid at the SA, as
// joined by that port itself (0: not a member; a proxy join, made through another
// port, does not count).
func (r *rig) joinState(mgid, gid verbs.GID) uint8 {
	g, ok := r.smh.SM().DB().Group(mgid)
	if !ok {
		return 0
	}
	for _, m := range g.Members {
		if m.GID == gid && !m.ProxyJoin {
			return m.JoinState
		}
	}
	return 0
}

// iface returns the engine's interface by name.
func iface(t testing.TB, e *Engine, name string) *Interface {
	t.Helper()
	i, ok := e.Interface(name)
	if !ok {
		t.Fatalf("no interface %s", name)
	}
	return i
}

// bringUp attaches a fake host with these addresses, brings the interface up and waits
// for carrier.
func bringUp(t testing.TB, i *Interface, addrs ...string) *fakeHost {
	t.Helper()
	h := &fakeHost{}
	i.AttachHost(h)
	var p []netip.Prefix
	for _, a := range addrs {
		p = append(p, pfx(a))
	}
	i.SetHostAddrs(p)
	if err := i.SetUp(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, i.Name()+" carrier", func() bool { return i.Carrier() && h.state().carrier })
	return h
}

// setTimers changes an engine's intervals and wakes its interfaces, whose next round
// may have been planned with the old ones.
func setTimers(e *Engine, f func(*timers)) {
	tm := *e.tm.Load()
	f(&tm)
	e.tm.Store(&tm)
	for _, i := range e.Interfaces() {
		i.wake()
	}
}

// neighOf returns a copy of the neighbour entry for ip, and whether there is one.
func neighOf(i *Interface, ip string) (neigh, bool) {
	i.dmu.Lock()
	defer i.dmu.Unlock()
	n, ok := i.neigh[netip.MustParseAddr(ip)]
	if !ok {
		return neigh{}, false
	}
	return *n, true
}

// groupOf returns a copy of the interface's entry for mgid, and whether there is one.
func groupOf(i *Interface, mgid verbs.GID) (mcastGroup, bool) {
	i.dmu.Lock()
	defer i.dmu.Unlock()
	g, ok := i.mcast[mgid]
	if !ok {
		return mcastGroup{}, false
	}
	return *g, true
}

// pathOf returns a copy of the interface's path to dgid, and whether there is one.
func pathOf(i *Interface, dgid verbs.GID) (path, bool) {
	i.dmu.Lock()
	defer i.dmu.Unlock()
	p, ok := i.paths[dgid]
	if !ok {
		return path{}, false
	}
	return *p, true
}

// mcgBlock is the group's block of <if>_mcg ("" when the file does not list it).
func mcgBlock(i *Interface, mgid verbs.GID) string {
	for _, b := range strings.Split(i.MCGText(), "\n\n") {
		if strings.HasPrefix(b, "GID: "+mgid.KernelString()+"\n") {
			return b + "\n"
		}
	}
	return ""
}

// hookSA stands between an interface and its SA client (Options.wrapSA): it counts
// path queries and joins and lets the test hold or fail them. The hooks run before the
// real query; a non-nil error is the query's answer.
type hookSA struct {
	saClient
	path  func(ctx context.Context, n int, dgid verbs.GID) error         // n-th path query, from 1
	join  func(ctx context.Context, n int, rec mad.MCMemberRecord) error // n-th join of rec.MGID
	leave func(ctx context.Context, rec mad.MCMemberRecord) error

	mu    sync.Mutex
	paths int
	joins map[verbs.GID]int
}

// wrap is the Options.wrapSA of an engine with one interface.
func (h *hookSA) wrap(c saClient) saClient {
	h.saClient = c
	return h
}

func (h *hookSA) PathRecord(ctx context.Context, sgid, dgid verbs.GID, pkey verbs.PKey, tclass uint8) (mad.PathRecord, error) {
	h.mu.Lock()
	h.paths++
	n := h.paths
	h.mu.Unlock()
	if h.path != nil {
		if err := h.path(ctx, n, dgid); err != nil {
			return mad.PathRecord{}, err
		}
	}
	return h.saClient.PathRecord(ctx, sgid, dgid, pkey, tclass)
}

func (h *hookSA) Join(ctx context.Context, rec mad.MCMemberRecord, mask uint64) (mad.MCMemberRecord, error) {
	h.mu.Lock()
	if h.joins == nil {
		h.joins = map[verbs.GID]int{}
	}
	h.joins[rec.MGID]++
	n := h.joins[rec.MGID]
	h.mu.Unlock()
	if h.join != nil {
		if err := h.join(ctx, n, rec); err != nil {
			return mad.MCMemberRecord{}, err
		}
	}
	return h.saClient.Join(ctx, rec, mask)
}

func (h *hookSA) Leave(ctx context.Context, rec mad.MCMemberRecord, mask uint64) error {
	if h.leave != nil {
		if err := h.leave(ctx, rec); err != nil {
			return err
		}
	}
	return h.saClient.Leave(ctx, rec, mask)
}

func (h *hookSA) pathCalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.paths
}

func (h *hookSA) joinCalls(mgid verbs.GID) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.joins[mgid]
}

// holdUntil blocks a hooked query until release is closed (or the interface closes)
// and says on started that it is in flight.
func holdUntil(ctx context.Context, started chan<- struct{}, release <-chan struct{}) error {
	started <- struct{}{}
	select {
	case <-release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// inFlight waits (10 s at most) for a held query to say it started.
func inFlight(t *testing.T, started <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
