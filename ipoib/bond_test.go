package ipoib

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bondRig is node a with two ports and bond0 over ib0 and ib1 (a fake host with
// 10.77.0.1/24 on the bond), and node b with ib0 up on 10.77.0.2/24.
type bondRig struct {
	r        *rig
	ea, eb   *Engine
	bonds    *Bonds
	bond     *Bond
	bh, hb   *fakeHost
	a0, a1   *Interface
	b0       *Interface
	seq      uint16
	primary  string
	miimonMS string
}

func newBondRig(t *testing.T, primary string) *bondRig {
	t.Helper()
	r := newRig(t)
	br := &bondRig{r: r, ea: r.engine("a", 2, Options{}), eb: r.engine("b", 1, Options{}), primary: primary}
	br.a0, br.a1, br.b0 = iface(t, br.ea, "ib0"), iface(t, br.ea, "ib1"), iface(t, br.eb, "ib0")
	br.hb = bringUp(t, br.b0, "10.77.0.2/24", "fd77::2/64")
	// The slaves have been up (with carrier, so their MTU is the broadcast group's), and
	// are brought down to be enslaved, as ifup does.
	for _, i := range []*Interface{br.a0, br.a1} {
		if err := i.SetUp(true); err != nil {
			t.Fatal(err)
		}
		waitFor(t, i.Name()+" carrier", i.Carrier)
		if err := i.SetUp(false); err != nil {
			t.Fatal(err)
		}
	}
	br.bonds = NewBonds(br.ea)
	t.Cleanup(br.bonds.Close)
	b, err := br.bonds.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	br.bond = b
	br.bh = &fakeHost{}
	b.AttachHost(br.bh)
	for _, o := range [][2]string{{"mode", "active-backup\n"}, {"miimon", "10\n"}, {"primary", primary + "\n"}} {
		if err := b.SetOption(o[0], o[1]); err != nil {
			t.Fatalf("%s %q: %v", o[0], o[1], err)
		}
	}
	for _, s := range []string{"+ib0\n", "+ib1\n"} {
		if err := b.SetOption("slaves", s); err != nil {
			t.Fatalf("slaves %q: %v", s, err)
		}
	}
	b.SetHostAddrs([]netip.Prefix{pfx("10.77.0.1/24"), pfx("fd77::1/64")})
	b.SetUp(true)
	// The first slave with a link becomes active: whichever joined its broadcast group
	// first. The tests start from ib0.
	waitFor(t, "both links up", func() bool {
		s0, _ := b.SlaveInfo(br.a0)
		s1, _ := b.SlaveInfo(br.a1)
		return s0.MIIStatus == "up" && s1.MIIStatus == "up"
	})
	if b.Active() != br.a0 {
		if err := b.SetOption("active_slave", "ib0\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "bond0 active on ib0 with carrier", func() bool {
		return b.Active() == br.a0 && b.Carrier() && br.bh.state().carrier && br.a1.Carrier()
	})
	return br
}

// ping sends an echo request out of the bond until b's host sees it, and b's reply
// until the bond's host sees it.
func (br *bondRig) ping(t *testing.T) {
	t.Helper()
	br.seq++
	seq := br.seq
	req := icmp4("10.77.0.1", "10.77.0.2", 8, seq, 56)
	rep := icmp4("10.77.0.2", "10.77.0.1", 0, seq, 56)
	deadline := time.Now().Add(5 * time.Second)
	for got := false; !got; {
		if time.Now().After(deadline) {
			t.Fatalf("echo %d never reached b", seq)
		}
		br.bond.Transmit([][]byte{req})
		for end := time.Now().Add(100 * time.Millisecond); !got && time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			got = len(br.hb.take(isICMP4(seq))) > 0
		}
	}
	for got := false; !got; {
		if time.Now().After(deadline) {
			t.Fatalf("echo reply %d never reached the bond", seq)
		}
		br.b0.Transmit([][]byte{rep})
		for end := time.Now().Add(100 * time.Millisecond); !got && time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			if p := br.bh.take(isICMP4(seq)); len(p) > 0 {
				if !bytes.Equal(p[0], rep) {
					t.Fatal("reply changed in flight")
				}
				got = true
			}
		}
	}
}

func (br *bondRig) link(t *testing.T, port int, down bool) {
	t.Helper()
	if err := br.r.smh.SM().SetLink("a", port, down); err != nil {
		t.Fatal(err)
	}
}

// Active-backup over two ports: traffic goes through ib0; when port 1's link goes
// (sm/faults' link fault), the MII monitor sees ib0 lose its link, ib1 becomes active
// and announces itself with a gratuitous ARP, so b points 10.77.0.1 at ib1 before any
// new traffic, and replies reach the bond again. The bond's address follows the active
// slave, its carrier stays on. Port 1 coming back changes nothing without a primary.
func TestBondFailoverWithoutPrimary(t *testing.T) {
	br := newBondRig(t, "")
	br.ping(t)
	if n, _ := neighOf(br.b0, "10.77.0.1"); n.hw != br.a0.HWAddr() {
		t.Fatalf("b resolved the bond to %s, want ib0's %s", n.hw, br.a0.HWAddr())
	}
	if got := br.bond.HWAddrText(); got != br.a0.HWAddr().String() {
		t.Fatalf("bond address %s, want ib0's %s", got, br.a0.HWAddr())
	}
	// The backup answers no ARP for the bond's address, and has no addresses of its own.
	backupAddrs := len(br.a1.data().hostAddrs)
	if backupAddrs != 0 {
		t.Fatalf("the backup has %d of the bond's addresses", backupAddrs)
	}

	// b learns the bond's IPv6 address from ib0's solicitation.
	br.bond.Transmit([][]byte{icmp6Echo(netip.MustParseAddr("fd77::1"), netip.MustParseAddr("fd77::2"), 1)})
	waitFor(t, "b's IPv6 neighbour entry on ib0", func() bool {
		n, _ := neighOf(br.b0, "fd77::1")
		return n.valid && n.hw == br.a0.HWAddr()
	})

	br.link(t, 1, true)
	waitFor(t, "ib1 active", func() bool { return br.bond.Active() == br.a1 })
	waitFor(t, "b's neighbour entry on ib1 (gratuitous ARP)", func() bool {
		n, _ := neighOf(br.b0, "10.77.0.1")
		return n.hw == br.a1.HWAddr()
	})
	waitFor(t, "b's IPv6 neighbour entry on ib1 (unsolicited neighbour advertisement)", func() bool {
		n, _ := neighOf(br.b0, "fd77::1")
		return n.hw == br.a1.HWAddr()
	})
	if !br.bond.Carrier() || !br.bh.state().carrier {
		t.Fatal("the bond lost its carrier in a failover")
	}
	if got := br.bond.HWAddrText(); got != br.a1.HWAddr().String() {
		t.Fatalf("bond address %s after failover, want ib1's %s", got, br.a1.HWAddr())
	}
	if si, _ := br.bond.SlaveInfo(br.a0); si.MIIStatus != "down" || si.State != "backup" || si.LinkFailures != 1 {
		t.Fatalf("ib0 after losing its link: %+v", si)
	}
	br.ping(t)

	br.link(t, 1, false)
	waitFor(t, "ib0's link back", func() bool {
		si, _ := br.bond.SlaveInfo(br.a0)
		return si.MIIStatus == "up"
	})
	time.Sleep(50 * time.Millisecond)
	if br.bond.Active() != br.a1 {
		t.Fatal("without a primary, ib0 coming back took over")
	}
	br.ping(t)
}

// With primary ib0, ib0 becomes active again as soon as its link is back (the
// driver's primary_reselect always), and announces itself again.
func TestBondFailoverBackToPrimary(t *testing.T) {
	br := newBondRig(t, "ib0")
	br.ping(t)
	br.link(t, 1, true)
	waitFor(t, "ib1 active", func() bool { return br.bond.Active() == br.a1 })
	br.ping(t)
	br.link(t, 1, false)
	waitFor(t, "ib0 active again", func() bool { return br.bond.Active() == br.a0 })
	waitFor(t, "b's neighbour entry back on ib0", func() bool {
		n, _ := neighOf(br.b0, "10.77.0.1")
		return n.hw == br.a0.HWAddr()
	})
	br.ping(t)
	if got, _ := br.bond.Option("primary"); got != "ib0\n" {
		t.Fatalf("primary %q", got)
	}
}

// Both links gone: no active slave, the bond loses its carrier and drops what it is
// given; one link back restores both.
func TestBondWithoutAnyLink(t *testing.T) {
	br := newBondRig(t, "")
	br.link(t, 1, true)
	br.link(t, 2, true)
	waitFor(t, "no active slave", func() bool { return br.bond.Active() == nil && !br.bh.state().carrier })
	if got, _ := br.bond.Option("mii_status"); got != "down\n" {
		t.Fatalf("mii_status %q", got)
	}
	d := br.bond.TxDropped()
	br.bond.Transmit([][]byte{icmp4("10.77.0.1", "10.77.0.2", 8, 900, 56)})
	if br.bond.TxDropped() != d+1 {
		t.Fatal("a packet without an active slave was not dropped")
	}
	br.link(t, 2, false)
	waitFor(t, "ib1 active", func() bool { return br.bond.Active() == br.a1 && br.bh.state().carrier })
	br.ping(t)
}

// Writing active_slave switches at once (and announces); releasing the active slave
// makes the other one active; the released interface is closed with its MTU back and
// its own addresses again.
func TestBondActiveSlaveAndRelease(t *testing.T) {
	br := newBondRig(t, "")
	br.ping(t) // b knows the bond's address: a gratuitous ARP updates, never creates, an entry
	if err := br.bond.SetOption("active_slave", "ib1\n"); err != nil {
		t.Fatal(err)
	}
	if br.bond.Active() != br.a1 {
		t.Fatal("active_slave ib1 did not switch")
	}
	waitFor(t, "b's neighbour entry on ib1", func() bool {
		n, _ := neighOf(br.b0, "10.77.0.1")
		return n.hw == br.a1.HWAddr()
	})
	br.ping(t)
	if err := br.bond.SetOption("slaves", "-ib1\n"); err != nil {
		t.Fatal(err)
	}
	if br.bond.Active() != br.a0 || br.a1.Master() != nil || br.a1.IsUp() {
		t.Fatalf("after releasing ib1: active %v, ib1 master %v up %v", br.bond.Active(), br.a1.Master(), br.a1.IsUp())
	}
	br.ping(t)
	if got, _ := br.bond.Option("slaves"); got != "ib0\n" {
		t.Fatalf("slaves %q", got)
	}
}

// The MTU: the slaves take the bond's; 65520 only when every slave is in connected
// mode (a datagram slave refuses it and the bond keeps its MTU).
func TestBondMTU(t *testing.T) {
	br := newBondRig(t, "")
	if br.bond.MTU() != br.a0.MTU() || br.bh.state().mtu != br.bond.MTU() {
		t.Fatalf("bond MTU %d (host %d), ib0 %d", br.bond.MTU(), br.bh.state().mtu, br.a0.MTU())
	}
	before := br.bond.MTU()
	if err := br.bond.SetMTU(65520); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("65520 over datagram slaves: %v, want EINVAL", err)
	}
	if br.bond.MTU() != before || br.a0.MTU() != before || br.a1.MTU() != before {
		t.Fatal("a refused MTU changed something")
	}
	for _, i := range []*Interface{br.a0, br.a1} {
		if err := i.SetMode(Connected); err != nil {
			t.Fatal(err)
		}
	}
	if err := br.bond.SetMTU(65520); err != nil {
		t.Fatal(err)
	}
	if br.a0.MTU() != 65520 || br.a1.MTU() != 65520 || br.bh.state().mtu != 65520 {
		t.Fatalf("MTU ib0 %d ib1 %d host %d, want 65520", br.a0.MTU(), br.a1.MTU(), br.bh.state().mtu)
	}
}

// otherDevs is a namespace's devices that are not the engine's, by every name.
type otherDevs map[string]OtherDevice

func (otherDevs) CreateBond(*Bond) error { return nil }
func (otherDevs) DeleteBond(*Bond)       {}
func (o otherDevs) OtherDevice(name string) (OtherDevice, bool) {
	d, ok := o[name]
	return d, ok
}

// A write naming a device of the namespace that is not the engine's (lo, eth1) gets the
// driver's errno for it, which looks names up among all the namespace's devices, in
// bond_enslave's order: EPERM for a master that is not a bond, EBUSY for a device in
// use (a bridge port), EPERM for one that is up, EINVAL for one of another type beside
// slaves (and EOPNOTSUPP before any: the driver would make the bond that type), EINVAL
// to release or make active one that is no slave; only a name no device has is ENODEV.
// An alternative name of an engine interface's device names that interface.
func TestBondOtherDevicesErrnos(t *testing.T) {
	r := newRig(t)
	e := r.engine("a", 2, Options{})
	bs := NewBonds(e)
	t.Cleanup(bs.Close)
	bs.SetDevices(otherDevs{"lo": {Name: "lo", Up: true}, "eth1": {Name: "eth1"},
		"eql": {Name: "eql", Master: true}, "v0": {Name: "v0", Busy: true}, "v2": {Name: "v2", Up: true, Busy: true},
		"slot1": {Name: "ib1"}, "ib1": {Name: "ib1"}})
	b, err := bs.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bs.Create("bond1"); err != nil {
		t.Fatal(err)
	}
	check := func(name, val string, want syscall.Errno) {
		t.Helper()
		err := b.SetOption(name, val)
		var errno syscall.Errno
		if err != nil && !errors.As(err, &errno) {
			t.Fatalf("%s %q: %v is not an errno", name, val, err)
		}
		if errno != want {
			t.Errorf("%s %q: %v, want %v", name, val, err, want)
		}
	}
	check("slaves", "+lo\n", syscall.EPERM)
	check("slaves", "+eth1\n", syscall.EOPNOTSUPP)
	check("slaves", "+eql\n", syscall.EPERM)
	check("slaves", "+v0\n", syscall.EBUSY)
	check("slaves", "+v2\n", syscall.EBUSY)
	check("slaves", "+eth9\n", syscall.ENODEV)
	check("slaves", "-lo\n", syscall.EINVAL)
	check("slaves", "-bond1\n", syscall.EINVAL)
	check("slaves", "-eth9\n", syscall.ENODEV)
	check("active_slave", "lo\n", syscall.EINVAL)
	check("active_slave", "eth9\n", syscall.ENODEV)
	check("slaves", "+slot1\n", 0) // ib1's device by an alternative name
	check("slaves", "+eth1\n", syscall.EINVAL)
	check("slaves", "+v0\n", syscall.EBUSY)
	check("slaves", "+lo\n", syscall.EPERM)
	if got, _ := b.Option("slaves"); got != "ib1\n" {
		t.Errorf("slaves %q after the refused writes, want ib1", got)
	}
	check("slaves", "-slot1\n", 0)
	if got, _ := b.Option("slaves"); got != "" {
		t.Errorf("slaves %q after -slot1, want none", got)
	}
}

// The option rules, as bond_opt_parse and the set functions have them.
func TestBondOptionRules(t *testing.T) {
	r := newRig(t)
	e := r.engine("a", 2, Options{})
	if err := iface(t, e, "ib0").SetUp(true); err != nil {
		t.Fatal(err)
	}
	bs := NewBonds(e)
	t.Cleanup(bs.Close)
	b, err := bs.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := bs.Create("bond1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what, name, val string
		errno           syscall.Errno
	}{
		{"mode by name", "mode", "active-backup\n", 0},
		{"mode by number", "mode", "1\n", 0},
		{"mode by number with spaces", "mode", " 1 \n", 0},
		{"another mode", "mode", "balance-rr\n", syscall.EINVAL},
		{"another mode by number", "mode", "4\n", syscall.EINVAL},
		{"mode default is balance-rr", "mode", "default\n", syscall.EINVAL},
		{"no such mode", "mode", "active\n", syscall.EINVAL},
		{"no such mode number", "mode", "7\n", syscall.EINVAL},
		{"mode with trailing garbage", "mode", "1x\n", syscall.EINVAL},
		{"empty mode", "mode", "\n", syscall.EINVAL},
		{"miimon", "miimon", "100\n", 0},
		{"miimon off", "miimon", "off\n", 0},
		{"miimon maxval", "miimon", "maxval\n", 0},
		{"miimon beyond int", "miimon", "2147483648\n", syscall.EINVAL},
		{"miimon negative", "miimon", "-1\n", syscall.EINVAL},
		{"miimon word", "miimon", "fast\n", syscall.EINVAL},
		{"fail_over_mac none", "fail_over_mac", "none\n", 0},
		{"fail_over_mac follow", "fail_over_mac", "2\n", 0},
		{"fail_over_mac bad", "fail_over_mac", "3\n", syscall.EINVAL},
		{"slaves without command", "slaves", "ib0\n", syscall.EPERM},
		{"slaves with an empty name", "slaves", "+\n", syscall.EPERM},
		{"slaves with a bad name", "slaves", "+a/b\n", syscall.EPERM},
		{"slaves of no interface", "slaves", "+eth0\n", syscall.ENODEV},
		{"slave that is up", "slaves", "+ib0\n", syscall.EPERM},
		{"release of no interface", "slaves", "-eth0\n", syscall.ENODEV},
		{"release of a non-slave", "slaves", "-ib0\n", syscall.EINVAL},
		{"a bond as slave", "slaves", "+bond1\n", syscall.EPERM},
		{"itself as slave", "slaves", "+bond0\n", syscall.EPERM},
		{"active_slave of no interface", "active_slave", "eth0\n", syscall.ENODEV},
		{"active_slave not a slave", "active_slave", "ib0\n", syscall.EINVAL},
		{"active_slave cleared", "active_slave", "\n", 0},
		{"primary not enslaved", "primary", "ib1\n", 0},
		{"no such option", "xmit_hash_policy", "layer2\n", syscall.ENOENT},
	} {
		err := b.SetOption(tc.name, tc.val)
		var errno syscall.Errno
		if err != nil && !errors.As(err, &errno) {
			t.Fatalf("%s: %v is not an errno", tc.what, err)
		}
		if errno != tc.errno {
			t.Errorf("%s: %s %q: %v, want %v", tc.what, tc.name, tc.val, err, tc.errno)
		}
	}
	if got, _ := b.Option("fail_over_mac"); got != "follow 2\n" {
		t.Fatalf("fail_over_mac %q", got)
	}
	if got, _ := b.Option("primary"); got != "" {
		t.Fatalf("primary before it is enslaved %q, want empty", got)
	}
	// The first slave: fail_over_mac becomes active (IPoIB cannot change addresses),
	// the bond an InfiniBand device with its slave's address; the slave takes the
	// bond's MTU (bond_setup_by_slave copies none; bond_enslave's dev_set_mtu).
	ib1 := iface(t, e, "ib1")
	mtu := b.MTU()
	if err := b.SetOption("slaves", "+ib1"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"fail_over_mac": "active 1\n", "slaves": "ib1\n", "primary": "ib1\n", "mode": "active-backup 1\n"} {
		if got, _ := b.Option(name); got != want {
			t.Errorf("%s %q, want %q", name, got, want)
		}
	}
	if b.Type() != 32 || b.AddrLen() != 20 || b.MTU() != 1500 || mtu != 1500 || ib1.MTU() != 1500 || b.HWAddrText() != ib1.HWAddr().String() {
		t.Fatalf("type %d addr_len %d mtu %d (ib1 %d) address %s after the first slave", b.Type(), b.AddrLen(), b.MTU(), ib1.MTU(), b.HWAddrText())
	}
	for _, tc := range []struct {
		name, val string
		errno     syscall.Errno
	}{
		{"mode", "1\n", syscall.ENOTEMPTY},
		{"fail_over_mac", "active\n", syscall.ENOTEMPTY},
		{"slaves", "+ib1\n", syscall.EBUSY},
	} {
		if err := b.SetOption(tc.name, tc.val); !errors.Is(err, tc.errno) {
			t.Errorf("%s %q with a slave: %v, want %v", tc.name, tc.val, err, tc.errno)
		}
	}
	if err := c.SetOption("slaves", "+ib1\n"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("ib1 into a second bond: %v, want EBUSY", err)
	}
	if err := c.SetOption("active_slave", "ib1\n"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("another bond's slave as active_slave: %v, want EINVAL", err)
	}
	// A child of another partition cannot join ib1's bond.
	ib0 := iface(t, e, "ib0")
	ch, err := ib0.CreateChild(0x8005)
	if err == nil {
		err = ch.SetUp(false) // a child follows its parent up
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetOption("slaves", "+"+ch.Name()+"\n"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a slave of another partition: %v, want EINVAL", err)
	}
	c.SetUp(true)
	if err := c.SetOption("mode", "1\n"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("mode of an up bond: %v, want EBUSY", err)
	}

	for _, tc := range []struct {
		write string
		errno syscall.Errno
	}{
		{"+bond0\n", syscall.EEXIST},
		{"+ib0\n", syscall.EEXIST},
		{"bond2\n", syscall.EPERM},
		{"+\n", syscall.EPERM},
		{"-bond9\n", syscall.ENODEV},
		{"-ib0\n", syscall.ENODEV},
		{"+bond2\n", 0},
		{"-bond2\n", 0},
	} {
		err := bs.WriteMasters([]byte(tc.write))
		var errno syscall.Errno
		if err != nil {
			errors.As(err, &errno)
		}
		if errno != tc.errno {
			t.Errorf("bonding_masters %q: %v, want %v", tc.write, err, tc.errno)
		}
	}
	if got := bs.MastersText(); got != "bond0 bond1\n" {
		t.Fatalf("bonding_masters %q", got)
	}
	// Releasing the last slave through the slaves file keeps the bond, an InfiniBand
	// device still, with six random bytes in front of its last slave's address
	// (eth_hw_addr_random).
	if err := b.SetOption("slaves", "-ib1"); err != nil {
		t.Fatal(err)
	}
	if got, want := b.HWAddrText(), ib1.HWAddr().String(); b.Type() != 32 || len(got) != len(want) || got[18:] != want[18:] || got[:17] == want[:17] {
		t.Errorf("bond0 after its last slave: type %d address %s, want random in front of %s", b.Type(), got, want)
	}
	if err := ch.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if err := c.SetOption("slaves", "+"+ch.Name()); err != nil {
		t.Fatal(err)
	}
	if err := ib0.DeleteChild(0x8005); err != nil {
		t.Fatal(err)
	}
	// Deleting an InfiniBand bond's last slave destroys the bond
	// (bond_release_and_destroy, on NETDEV_UNREGISTER).
	waitFor(t, "bond1 destroyed with its deleted last slave", func() bool { return bs.MastersText() == "bond0\n" })
	if c.Listed() {
		t.Error("bond1 still listed")
	}
	if err := bs.WriteMasters([]byte("-bond0")); err != nil {
		t.Fatal(err)
	}
	if got := bs.MastersText(); got != "" {
		t.Fatalf("bonding_masters %q after deleting bond0", got)
	}
}

// parseBondOpt is bond_opt_parse: digits are numbers, anything else a word of the
// table; the newline ends the value.
func TestParseBondOpt(t *testing.T) {
	for _, tc := range []struct {
		tbl  []optValue
		in   string
		want uint64
		ok   bool
	}{
		{bondModeTbl, "active-backup", 1, true},
		{bondModeTbl, "active-backup\n", 1, true},
		{bondModeTbl, "active-backup trailing", 1, true},
		{bondModeTbl, "  6\n", 6, true},
		{bondModeTbl, "1 2", 1, true},
		{bondModeTbl, "99", 0, false},
		{bondModeTbl, "", 0, false},
		{bondModeTbl, "default", 0, true},
		{bondIntMaxTbl, "0", 0, true},
		{bondIntMaxTbl, "2147483647", 2147483647, true},
		{bondIntMaxTbl, "99999999999999999999999", 0, false},
		{bondIntMaxTbl, "maxval", 2147483647, true},
		{bondIntMaxTbl, "+5", 0, false},
		{bondFOMTbl, "follow\nactive", 2, true},
		{bondFOMTbl, "\nactive", 0, false},
	} {
		v, ok := parseBondOpt(tc.tbl, tc.in)
		if v != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.in, v, ok, tc.want, tc.ok)
		}
	}
}

// FuzzBondOptions: the parsers of the bonding files (bond_opt_parse, the %16s of
// slaves and bonding_masters, dev_valid_name) never panic, and a parsed value is one
// of the table's or, for a table with a maximum, within it.
func FuzzBondOptions(f *testing.F) {
	for _, s := range []string{"active-backup\n", "1", "+ib0", "-ib0\n", "", "\n", "maxval", " 42 ", strings.Repeat("x", 40), "default"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, val string) {
		for _, tbl := range [][]optValue{bondModeTbl, bondFOMTbl, bondIntMaxTbl} {
			v, ok := parseBondOpt(tbl, val)
			if !ok {
				continue
			}
			in := false
			for _, e := range tbl {
				in = in || e.value == v || e.flags&valMax != 0 && v <= e.value
			}
			if !in {
				t.Fatalf("%q parsed to %d, outside the table", val, v)
			}
		}
		if w := scanWord(val, ifNameSize); len(w) > ifNameSize || strings.ContainsAny(w, " \t\n") {
			t.Fatalf("%q: word %q", val, w)
		}
		if devValidName(val) && (len(val) > 15 || strings.ContainsAny(val, "/: \n")) {
			t.Fatalf("%q passed as an interface name", val)
		}
	})
}

// DeleteBond deletes the bond it is given, not one that took its name since: a device
// deleted with ip link (whose handler runs after the delete) must not take a bond0
// made again in the meantime with it.
func TestDeleteBondIsByBond(t *testing.T) {
	r := newRig(t)
	bonds := NewBonds(r.engine("a", 1, Options{}))
	t.Cleanup(bonds.Close)
	old, err := bonds.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	if err := bonds.Delete("bond0"); err != nil {
		t.Fatal(err)
	}
	made, err := bonds.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	if err := bonds.DeleteBond(old); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("DeleteBond of a deleted bond: %v, want ENODEV", err)
	}
	if got := bonds.List(); len(got) != 1 || got[0] != made {
		t.Fatalf("bonds after deleting the old bond0 again: %v, want the new bond0", got)
	}
	if err := bonds.DeleteBond(made); err != nil || len(bonds.List()) != 0 {
		t.Fatalf("DeleteBond of the new bond0: %v, %d bonds left", err, len(bonds.List()))
	}
}

// primary_reselect (bond_choose_primary_or_current): with failure, the primary's link
// coming back leaves the active slave; with better, too, when its speed is no higher
// (both ports here are alike); always, the default, takes the primary back at once,
// also when set.
func TestBondPrimaryReselect(t *testing.T) {
	br := newBondRig(t, "ib0")
	b := br.bond
	if got, _ := b.Option("primary_reselect"); got != "always 0\n" {
		t.Fatalf("primary_reselect %q, want the driver's default", got)
	}
	if err := b.SetOption("primary_reselect", "sometimes\n"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("primary_reselect sometimes: %v, want EINVAL", err)
	}
	if err := b.SetOption("primary_reselect", "failure\n"); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Option("primary_reselect"); got != "failure 2\n" {
		t.Fatalf("primary_reselect %q after failure", got)
	}
	br.link(t, 1, true)
	waitFor(t, "ib1 active", func() bool { return b.Active() == br.a1 })
	br.link(t, 1, false)
	monitorSaw := func() bool { s, _ := b.SlaveInfo(br.a0); return s.MIIStatus == "up" }
	waitFor(t, "the monitor seeing ib0's link back", monitorSaw)
	if b.Active() != br.a1 {
		t.Fatalf("primary_reselect failure: %s active once the primary's link is back, want ib1", b.Active().Name())
	}
	if err := b.SetOption("primary_reselect", "better"); err != nil {
		t.Fatal(err)
	}
	if b.Active() != br.a1 {
		t.Fatalf("primary_reselect better, equal speeds: %s active, want ib1", b.Active().Name())
	}
	if err := b.SetOption("primary_reselect", "0"); err != nil {
		t.Fatal(err)
	}
	if b.Active() != br.a0 {
		t.Fatalf("primary_reselect always: %s active, want the primary", b.Active().Name())
	}
	br.ping(t)
	// Naming an enslaved primary takes it at once, whatever primary_reselect says
	// (bond_option_primary_set's force_primary).
	if err := b.SetOption("primary_reselect", "failure"); err != nil {
		t.Fatal(err)
	}
	if err := b.SetOption("primary", "ib1\n"); err != nil {
		t.Fatal(err)
	}
	if b.Active() != br.a1 {
		t.Fatalf("primary ib1 written with primary_reselect failure: %s active, want ib1", b.Active().Name())
	}
}

// A release through the slaves file of a slave deleted between its look-up and the
// release (delete_child racing `-ib0.8005 > slaves`) finds it gone: ENODEV, as the
// driver answers once the device is unregistered, and an InfiniBand bond whose last
// slave it was goes with it (before, the release of a slave no longer listed
// panicked with the bond's lock held).
func TestBondReleaseOfASlaveDeletedMeanwhile(t *testing.T) {
	r := newRig(t)
	e := r.engine("a", 1, Options{})
	bs := NewBonds(e)
	t.Cleanup(bs.Close)
	b, err := bs.Create("bond1")
	if err != nil {
		t.Fatal(err)
	}
	ib0 := iface(t, e, "ib0")
	ch, err := ib0.CreateChild(0x8005)
	if err == nil {
		err = ch.SetUp(false)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetOption("slaves", "+"+ch.Name()); err != nil {
		t.Fatal(err)
	}
	// The bonds' watch of the engine stopped, so the deletion reaches only the
	// release, as when the release took the bond's lock first. (Close then finds it
	// done.)
	close(bs.stop)
	<-bs.done
	bs.stop = make(chan struct{})
	name := ch.Name()
	if err := ib0.DeleteChild(0x8005); err != nil {
		t.Fatal(err)
	}
	if err := b.release(ch, name); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("releasing a slave deleted meanwhile: %v, want ENODEV", err)
	}
	if b.Listed() {
		t.Error("bond1 still listed after its last slave went")
	}
}
