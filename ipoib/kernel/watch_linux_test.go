//go:build linux

package kernel

import (
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"ipoibfs/internal/testenv"

	"golang.org/x/sys/unix"
)

// events collects what Watch reports.
type events struct {
	links  chan Link
	groups chan []netip.Addr
	addrs  chan []netip.Prefix
	gone   chan struct{}
	moved  chan error
}

func watch(d *Device) *events {
	e := &events{links: make(chan Link, 64), groups: make(chan []netip.Addr, 64), addrs: make(chan []netip.Prefix, 64), gone: make(chan struct{}, 1), moved: make(chan error, 4)}
	d.Watch(Events{
		Link:   func(l Link) { e.links <- l },
		Groups: func(g []netip.Addr) { e.groups <- g },
		Addrs:  func(a []netip.Prefix) { e.addrs <- a },
		Gone:   func() { e.gone <- struct{}{} },
		Moved:  func(err error) { e.moved <- err },
	})
	return e
}

// await receives from ch until ok holds or 10 s pass.
func await[T any](t *testing.T, ch chan T, what string, ok func(T) bool) T {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case v := <-ch:
			if ok(v) {
				return v
			}
		case <-timeout:
			t.Fatalf("no event with %s", what)
		}
	}
}

func TestWatchLink(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "w")
	d := open(t, Config{Name: uniq("w"), MTU: 2044, NetNS: ns})
	e := watch(d)
	await(t, e.links, "the initial state", func(l Link) bool { return l.MTU == 2044 && !l.Up && l.Name == d.Name() })

	// Our own changes are reported as ours.
	if err := d.SetMTU(1500); err != nil {
		t.Fatal(err)
	}
	l := await(t, e.links, "MTU 1500", func(l Link) bool { return l.MTU == 1500 })
	if l.MTUChanged {
		t.Errorf("SetMTU(1500) reported as someone else's change: %+v", l)
	}
	// Someone else's are not.
	ipMust(t, "-n", ns, "link", "set", d.Name(), "mtu", "4000")
	l = await(t, e.links, "MTU 4000", func(l Link) bool { return l.MTU == 4000 })
	if !l.MTUChanged {
		t.Errorf("ip link set mtu 4000 not reported as an outside change: %+v", l)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "up")
	l = await(t, e.links, "up", func(l Link) bool { return l.Up })
	if !l.UpChanged || l.Flags&1 == 0 {
		t.Errorf("ip link set up: %+v", l)
	}
	if err := d.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if l := await(t, e.links, "down", func(l Link) bool { return !l.Up }); l.UpChanged {
		t.Errorf("SetUp(false) reported as someone else's change: %+v", l)
	}
	// IFF_MULTICAST the same: ours is ours, someone's is reported.
	if err := d.SetMulticast(false); err != nil {
		t.Fatal(err)
	}
	if l := await(t, e.links, "multicast off", func(l Link) bool { return !l.Multicast }); l.MulticastChanged || l.Flags&unix.IFF_MULTICAST != 0 {
		t.Errorf("SetMulticast(false) reported as someone else's change: %+v", l)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "multicast", "on")
	if l := await(t, e.links, "multicast on", func(l Link) bool { return l.Multicast }); !l.MulticastChanged || l.PrevMulticast {
		t.Errorf("ip link set multicast on not reported as an outside change from off: %+v", l)
	}

	// txqueuelen the same: a report that crossed one of ours is not someone else's.
	if err := d.SetTxQueueLen(2000); err != nil {
		t.Fatal(err)
	}
	if l := await(t, e.links, "txqueuelen 2000", func(l Link) bool { return l.TxQLen == 2000 }); l.TxQLenChanged {
		t.Errorf("SetTxQueueLen(2000) reported as someone else's change: %+v", l)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "txqueuelen", "3000")
	if l := await(t, e.links, "txqueuelen 3000", func(l Link) bool { return l.TxQLen == 3000 }); !l.TxQLenChanged || l.PrevTxQLen != 2000 {
		t.Errorf("ip link set txqueuelen 3000 not reported as an outside change from 2000: %+v", l)
	}

	// The multicast list is the kernel's: all-hosts groups once up.
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	d.RefreshGroups()
	all4, all6 := netip.MustParseAddr("224.0.0.1"), netip.MustParseAddr("ff02::1")
	await(t, e.groups, "224.0.0.1 and ff02::1", func(g []netip.Addr) bool {
		return slices.Contains(g, all4) && slices.Contains(g, all6)
	})

	// The alias the same (up: the kernel announces an alias change only on an up
	// device, netdev_state_change).
	if err := d.SetAlias("ours"); err != nil {
		t.Fatal(err)
	}
	if l := await(t, e.links, "alias ours", func(l Link) bool { return l.Alias == "ours" }); l.AliasChanged {
		t.Errorf("SetAlias(ours) reported as someone else's change: %+v", l)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "alias", "theirs")
	theirs := await(t, e.links, "alias theirs", func(l Link) bool { return l.Alias == "theirs" })
	if !theirs.AliasChanged {
		t.Errorf("ip link set alias theirs not reported as an outside change: %+v", theirs)
	}
	// A report carries what the package held before it: what the engine had, if it
	// has not changed the device since (the engine's compare-and-set, AdoptAlias).
	if theirs.PrevAlias != "ours" {
		t.Errorf("the report of ip link set alias theirs after SetAlias(ours): PrevAlias %q", theirs.PrevAlias)
	}
	if err := d.SetAlias("newer"); err != nil {
		t.Fatal(err)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "alias", "theirs")
	if l := await(t, e.links, "alias theirs again", func(l Link) bool { return l.Alias == "theirs" }); l.PrevAlias != "newer" {
		t.Errorf("the report after SetAlias(newer): PrevAlias %q", l.PrevAlias)
	}
	// Down, an alias change is not announced: Alias reads it, and the watch then
	// reports it as the announcement would have.
	if err := d.SetUp(false); err != nil {
		t.Fatal(err)
	}
	await(t, e.links, "down", func(l Link) bool { return !l.Up })
	ipMust(t, "-n", ns, "link", "set", d.Name(), "alias", "quiet")
	if s, err := d.Alias(); err != nil || s != "quiet" {
		t.Errorf("Alias after ip link set alias on the device down: %q, %v", s, err)
	}
	if l := await(t, e.links, "alias quiet", func(l Link) bool { return l.Alias == "quiet" }); !l.AliasChanged {
		t.Errorf("the alias Alias read is not reported as an outside change: %+v", l)
	}

	// Deleted from outside: Gone.
	ipMust(t, "-n", ns, "link", "del", d.Name())
	select {
	case <-e.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("ip link del not reported")
	}
}

// An application's IP_ADD_MEMBERSHIP shows in the multicast list.
func TestWatchGroupsJoin(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "g")
	d := open(t, Config{Name: uniq("g"), MTU: 2044, NetNS: ns})
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	ipMust(t, "-n", ns, "addr", "add", "10.79.0.1/24", "dev", d.Name())
	e := watch(d)
	g := netip.MustParseAddr("239.1.2.3")
	// A socket in the namespace joins the group; closing it leaves.
	fd := joinIn(t, ns, g, netip.MustParseAddr("10.79.0.1"))
	d.RefreshGroups() // the bridge calls this when it sees the IGMP report
	await(t, e.groups, g.String(), func(l []netip.Addr) bool { return slices.Contains(l, g) })
	unix.Close(fd)
	d.RefreshGroups()
	await(t, e.groups, "no "+g.String(), func(l []netip.Addr) bool { return !slices.Contains(l, g) })
}

// After an MTU dip below 1280 the kernel rebuilds the device's IPv6 state with a random
// link-local address; EnsureLinkLocal puts the given one back and removes the other.
func TestEnsureLinkLocal(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "l")
	d := open(t, Config{Name: uniq("l"), MTU: 2044, NetNS: ns})
	ll := netip.MustParseAddr("fe80::2:c903:0:1234")
	if err := d.SetLinkLocal(ll); err != nil {
		t.Fatal(err)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	for _, mtu := range []int{1000, 2044} {
		if err := d.SetMTU(mtu); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.EnsureLinkLocal(ll); err != nil {
		t.Fatal(err)
	}
	addrs, err := d.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	var lls []netip.Addr
	for _, p := range addrs {
		if p.Addr().IsLinkLocalUnicast() {
			lls = append(lls, p.Addr())
		}
	}
	if !slices.Equal(lls, []netip.Addr{ll}) {
		t.Errorf("link-local addresses after an MTU dip: %v, want only %v", lls, ll)
	}
}

func ipMust(t *testing.T, args ...string) {
	t.Helper()
	if out, err := ipCmd(t, args...); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// joinIn opens a UDP socket in namespace ns joined to group on the interface with
// address local.
func joinIn(t *testing.T, ns string, group, local netip.Addr) int {
	t.Helper()
	return testenv.InNetns(t, ns, func() (int, error) {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		mreq := &unix.IPMreq{Multiaddr: group.As4(), Interface: local.As4()}
		if err := unix.SetsockoptIPMreq(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mreq); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	})
}

func TestParseIGMP(t *testing.T) {
	igmp := "Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n" +
		"1\tlo        :     1      V3\n\t\t\t\t010000E0     1 0:00000000\t\t0\n" +
		"7\tib0       :     2      V3\n\t\t\t\t030201EF     1 0:00000000\t\t0\n\t\t\t\t010000E0     1 0:00000000\t\t0\n"
	got := parseIGMP([]byte(igmp), 7)
	want := []netip.Addr{netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("224.0.0.1")}
	if !slices.Equal(got, want) {
		t.Errorf("parseIGMP = %v, want %v", got, want)
	}
	igmp6 := "1    lo              ff020000000000000000000000000001     1 0000000C 0\n" +
		"7    ib0             ff0200000000000000000001ff001234     1 00000004 0\n"
	got = parseIGMP6([]byte(igmp6), 7)
	if want := []netip.Addr{netip.MustParseAddr("ff02::1:ff00:1234")}; !slices.Equal(got, want) {
		t.Errorf("parseIGMP6 = %v, want %v", got, want)
	}
}

// ethtool -K on the device is read back; the speed set is what ethtool shows.
func TestDeviceFeaturesAndSpeed(t *testing.T) {
	prereqs(t)
	ethtool := testenv.Tool(t, "ethtool")
	ns := testNS(t, "e")
	d := open(t, Config{Name: uniq("e"), MTU: 2044, NetNS: ns, Offloads: Offloads{TxChecksum: true, TSO: true, GRO: true}})
	f, err := d.DeviceFeatures()
	if err != nil {
		t.Fatal(err)
	}
	if !f.TxChecksum || !f.TSO {
		t.Errorf("features after Open with checksum and TSO: %+v", f)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, ethtool, "-K", d.Name(), "tso", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K tso off: %v %s", err, out)
	}
	if f, err = d.DeviceFeatures(); err != nil || f.TSO || !f.TxChecksum {
		t.Errorf("after ethtool -K tso off: %+v %v", f, err)
	}
	// Offloads taken from the device (IfChanged) are not written back over a newer
	// ethtool -K: the device read as TSO off, then someone turned it on again.
	if _, err := d.linkState(); err != nil { // what the watch does: the device's features read
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, ethtool, "-K", d.Name(), "tso", "on").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K tso on: %v %s", err, out)
	}
	if err := d.SetOffloadsIfChanged(Offloads{TxChecksum: true, TSO: false, GRO: true}); err != nil {
		t.Fatal(err)
	}
	if f, err = d.DeviceFeatures(); err != nil || !f.TSO {
		t.Errorf("the older TSO off written back over ethtool -K tso on: %+v %v", f, err)
	}
	if err := d.SetOffloads(Offloads{TxChecksum: true, TSO: false, GRO: true}); err != nil {
		t.Fatal(err)
	}
	if f, err = d.DeviceFeatures(); err != nil || f.TSO {
		t.Errorf("SetOffloads with TSO off: %+v %v", f, err)
	}
	if err := d.SetSpeed(40000); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, ethtool, d.Name()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Speed: 40000Mb/s") {
		t.Errorf("ethtool after SetSpeed(40000): %v\n%s", err, out)
	}
}

// FuzzParseIGMP: the kernel's multicast tables never make the parsers fail or return
// a group that is not multicast.
func FuzzParseIGMP(f *testing.F) {
	f.Add([]byte("Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n7\tib0       :     2      V3\n\t\t\t\t030201EF     1 0:00000000\t\t0\n"), 7)
	f.Add([]byte("7    ib0             ff0200000000000000000001ff001234     1 00000004 0\n"), 7)
	f.Fuzz(func(t *testing.T, b []byte, index int) {
		for _, g := range append(parseIGMP(b, index), parseIGMP6(b, index)...) {
			if !g.IsMulticast() {
				t.Fatalf("%v is not multicast", g)
			}
		}
	})
}

// A burst of outside link changes (ip -batch: 3000 of them on 20 devices) does not
// overflow the namespace's subscription: an overflow loses events, and the monitor
// then subscribes again and has every device read everything afresh, which with
// thousands of children takes seconds. The last change (an address) is awaited first,
// so the burst has been read when the count of subscriptions is checked.
func TestMonitorFollowsABurstWithoutResubscribing(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "b")
	var devs []*Device
	for range 20 {
		devs = append(devs, open(t, Config{Name: uniq("b"), MTU: 1500, NetNS: ns}))
	}
	addrs := make(chan []netip.Prefix, 64)
	devs[0].WatchAddrs(func(a []netip.Prefix) { addrs <- a })
	var batch strings.Builder
	for k := range 3000 {
		fmt.Fprintf(&batch, "link set dev %s txqueuelen %d\n", devs[k%len(devs)].Name(), 500+k)
	}
	fmt.Fprintf(&batch, "address add 10.89.0.1/24 dev %s\n", devs[0].Name())
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch: %v %s", err, out)
	}
	await(t, addrs, "10.89.0.1/24", func(a []netip.Prefix) bool {
		return slices.Contains(a, netip.MustParsePrefix("10.89.0.1/24"))
	})
	if n := devs[0].mon.subscriptions.Load(); n != 1 {
		t.Errorf("%d subscriptions for the namespace after the burst, want 1 (it overflowed)", n)
	}
}

// A watched device that is not changing runs no goroutine: one starts when the
// namespace's monitor marks a change and ends when it has reported it (thousands of
// children held a waiting goroutine each). Changes are still reported after the
// goroutine has ended.
func TestWatchRunsNoGoroutineAtRest(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "r")
	// atRest waits until no watch goroutine of ds runs.
	atRest := func(ds ...*Device) {
		t.Helper()
		running := func() bool {
			for _, d := range ds {
				d.wmuW.Lock()
				ws := d.watches
				d.wmuW.Unlock()
				for _, w := range ws {
					if w.running.Load() {
						return true
					}
				}
			}
			return false
		}
		for deadline := time.Now().Add(10 * time.Second); running(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("watch goroutines still running after 10 s")
			}
		}
	}
	// The first device starts the namespace's monitor and worker.
	first := open(t, Config{Name: uniq("r"), MTU: 2044, NetNS: ns})
	await(t, watch(first).links, "the first device's state", func(l Link) bool { return true })
	atRest(first)
	base := runtime.NumGoroutine()
	const n = 20
	evs := make([]*events, n)
	devs := make([]*Device, n)
	for k := range devs {
		devs[k] = open(t, Config{Name: uniq("r"), MTU: 2044, NetNS: ns})
		evs[k] = watch(devs[k])
	}
	for k := range devs {
		await(t, evs[k].links, "the initial state", func(l Link) bool { return l.MTU == 2044 })
	}
	atRest(devs...)
	// A goroutine of the runtime or the netlink library may come and go: a bound well
	// below one per device.
	if g := runtime.NumGoroutine(); g > base+n/4 {
		t.Fatalf("%d watched devices at rest: %d goroutines, %d with one", n, g, base)
	}
	ipMust(t, "-n", ns, "link", "set", devs[n-1].Name(), "mtu", "3000")
	if l := await(t, evs[n-1].links, "MTU 3000", func(l Link) bool { return l.MTU == 3000 }); !l.MTUChanged {
		t.Errorf("ip link set mtu 3000 not reported as an outside change: %+v", l)
	}
}

// A device deleted while the monitor's message about it was lost (an overrun: the
// monitor then marks every device's link) is reported gone at the next look at its
// link, not as a link change: the kernel unregistered it, whatever its index names
// now.
func TestReportSeesALostDeletion(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "g")
	d := open(t, Config{Name: uniq("g"), MTU: 2044, NetNS: ns})
	var gone, links int
	w := &watcher{ev: Events{Gone: func() { gone++ }, Link: func(Link) { links++ }}}
	if !d.report(w, dirtyLink) || links != 1 {
		t.Fatalf("the first report of a live device: links %d", links)
	}
	if err := nlHandle(t, ns).LinkDel(d.link); err != nil {
		t.Fatal(err)
	}
	if d.report(w, dirtyLink) || gone != 1 || links != 1 {
		t.Fatalf("after the deletion, a link report: gone %d, links %d; want gone 1 and no link event", gone, links)
	}
	d.Close()
	WaitReleased()
}

// A change someone else makes is reported even when the device's state is the one
// last reported: ip link set promisc on (reported), the engine's promisc off, and
// promisc on again before the watch runs leave the same state as the first report,
// and the engine must still hear that it changed (its off was undone).
func TestOutsideChangeToTheLastReportedState(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "o")
	d := open(t, Config{Name: uniq("o"), MTU: 2044, NetNS: ns})
	var got []Link
	w := &watcher{ev: Events{Link: func(l Link) { got = append(got, l) }}}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "promisc", "on")
	d.report(w, dirtyLink)
	if len(got) != 1 || got[0].UserFlags != unix.IFF_PROMISC || !got[0].UserFlagsChanged {
		t.Fatalf("after ip link set promisc on: %+v", got)
	}
	if err := d.SetUserFlags(0); err != nil {
		t.Fatal(err)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "promisc", "on")
	d.report(w, dirtyLink)
	if len(got) != 2 || got[1].UserFlags != unix.IFF_PROMISC || !got[1].UserFlagsChanged {
		t.Fatalf("promisc on again after the engine's off: reports %+v", got)
	}
}

// A device someone moves to another namespace (ip link set netns) is put back where it
// was made, up again (the move took it down), and its watch goes on: it is not taken
// for deleted.
func TestWatchPutsBackAMovedDevice(t *testing.T) {
	prereqs(t)
	ns, other := testNS(t, "m"), testNS(t, "o")
	ipMust(t, "netns", "add", other)
	d := open(t, Config{Name: uniq("m"), MTU: 1500, NetNS: ns})
	// No address of its own: the move comes before any, as a move right after
	// `ip link set up` does, and the addresses after it are the same (none: without
	// carrier the kernel makes no link-local after the move either).
	ipMust(t, "-n", ns, "link", "set", d.Name(), "addrgenmode", "none")
	e := watch(d)
	if err := d.SetCarrier(false); err != nil {
		t.Fatal(err)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	await(t, e.links, "up", func(l Link) bool { return l.Up })
	await(t, e.addrs, "no address", func(a []netip.Prefix) bool { return len(a) == 0 })
	ipMust(t, "-n", ns, "link", "set", d.Name(), "netns", other)
	select {
	case err := <-e.moved:
		if err != nil {
			t.Fatalf("not put back: %v", err)
		}
	case <-e.gone:
		t.Fatal("a moved device reported as deleted")
	case <-time.After(10 * time.Second):
		t.Fatal("the move was not reported")
	}
	if out, err := ipCmd(t, "-n", ns, "link", "show", d.Name()); err != nil || !strings.Contains(strings.SplitN(out, ">", 2)[0], ",UP") {
		t.Fatalf("after the move: %v %s", err, out)
	}
	// The addresses are reported again, though the same: the move took whatever the
	// user keeps on the device (the GUID-derived link-local), to be put back.
	if a := await(t, e.addrs, "the addresses after the move", func([]netip.Prefix) bool { return true }); len(a) != 0 {
		t.Fatalf("addresses after the move: %v, want none", a)
	}
	ipMust(t, "-n", ns, "link", "set", d.Name(), "mtu", "1400")
	await(t, e.links, "MTU 1400 from outside", func(l Link) bool { return l.MTU == 1400 && l.MTUChanged })
	select {
	case <-e.gone:
		t.Fatal("reported gone after it was put back")
	default:
	}
}
