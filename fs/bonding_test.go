package fs

import (
	"errors"
	"fmt"
	"io"
	"log"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/ipoib"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// newBondEnv is a two-port node hosting its own subnet manager, ib0 and ib1 up with
// carrier, and a tree with the bonding files.
func newBondEnv(t testing.TB) (*Tree, *ipoib.Engine, *soft.HCA) {
	t.Helper()
	h, err := soft.New(soft.Config{Name: "n1", Ports: 2, Network: soft.NewMemNetwork(), HostSM: true, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	for n := 1; n <= 2; n++ {
		waitFor(t, "port active", func() bool { return h.SoftPort(n).Attr().State == verbs.PortActive })
	}
	e, err := ipoib.New(h, ipoib.Options{Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	for _, i := range e.Interfaces() {
		if err := i.SetUp(true); err != nil {
			t.Fatal(err)
		}
		waitFor(t, i.Name()+" carrier", i.Carrier)
	}
	bs := ipoib.NewBonds(e)
	t.Cleanup(bs.Close)
	bs.Load()
	return New(e, Options{SM: h.SM(), Bonds: bs}), e, h
}

// Without the bonding driver loaded there is no bonding_masters, as on a host without
// the module; loading it adds the file.
func TestBondingNeedsTheDriver(t *testing.T) {
	tr, e, _ := newBondEnv(t)
	bs := ipoib.NewBonds(e)
	t.Cleanup(bs.Close)
	bare := New(e, Options{Bonds: bs})
	if _, err := bare.Lookup("class/net/bonding_masters"); err == nil {
		t.Fatal("bonding_masters without the bonding driver")
	}
	bs.Load()
	if _, err := bare.Lookup("class/net/bonding_masters"); err != nil {
		t.Fatalf("bonding_masters after loading: %v", err)
	}
	if _, err := tr.Lookup("class/net/bonding_masters"); err != nil {
		t.Fatal(err)
	}
}

// The bonding files' rules, each named after the driver function it follows.
func TestBondingSysfsRules(t *testing.T) {
	tr, e, _ := newBondEnv(t)
	ib0, _ := e.Interface("ib0")
	const m, b, o = "class/net/bonding_masters", "class/net/bond0/", "class/net/bond0/bonding/"
	type check struct {
		follows string
		path    string
		write   string // "" reads the file instead
		want    string // read: the content; "=ib0" is ib0's address
		errno   syscall.Errno
	}
	steps := []check{
		{follows: "bonding_show_bonds: none", path: m, want: ""},
		{follows: "bonding_store_bonds: no command", path: m, write: "bond0\n", errno: syscall.EPERM},
		{follows: "bonding_store_bonds: dev_valid_name", path: m, write: "+bo/nd\n", errno: syscall.EPERM},
		{follows: "bonding_store_bonds: -ENODEV", path: m, write: "-bond0\n", errno: syscall.ENODEV},
		{follows: "bond_create", path: m, write: "+bond0\n"},
		{follows: "bond_create: -EEXIST", path: m, write: "+bond0\n", errno: syscall.EEXIST},
		{follows: "bond_create: register_netdevice -EEXIST", path: m, write: "+ib0\n", errno: syscall.EEXIST},
		{follows: "bonding_show_bonds", path: m, want: "bond0\n"},
		{follows: "bond_setup: ether_setup", path: b + "type", want: "1\n"},
		{follows: "bond_setup: ether_setup", path: b + "addr_len", want: "6\n"},
		{follows: "bond_setup: ether_setup", path: b + "mtu", want: "1500\n"},
		{follows: "bond_create: registered down", path: b + "flags", want: "0x1402\n"},
		{follows: "__dev_change_flags: IFF_MULTICAST as written", path: b + "flags", write: "0x402\n"},
		{follows: "__dev_change_flags: IFF_MULTICAST as written", path: b + "flags", want: "0x402\n"},
		{follows: "__dev_change_flags: IFF_MULTICAST as written", path: b + "flags", write: "0x1002\n"},
		{follows: "__dev_change_flags: IFF_BROADCAST, IFF_MASTER kept", path: b + "flags", want: "0x1402\n"},
		{follows: "carrier_show: not running", path: b + "carrier", errno: syscall.EINVAL},
		{follows: "carrier_store: no ndo_change_carrier, before change_carrier's running check", path: b + "carrier", write: "1\n", errno: syscall.EOPNOTSUPP},
		{follows: "bonding_show_mode", path: o + "mode", want: "active-backup 1\n"},
		{follows: "bonding_show_miimon: 100 without arp_interval", path: o + "miimon", want: "100\n"},
		{follows: "bonding_show_fail_over_mac", path: o + "fail_over_mac", want: "none 0\n"},
		{follows: "bonding_show_slaves: none", path: o + "slaves", want: ""},
		{follows: "bonding_show_active_slave: none", path: o + "active_slave", want: ""},
		{follows: "bonding_show_mii_status", path: o + "mii_status", want: "down\n"},
		{follows: "bond_opt_parse: a mode IPoIB slaves cannot have", path: o + "mode", write: "balance-rr\n", errno: syscall.EINVAL},
		{follows: "bond_opt_parse: a mode IPoIB slaves cannot have", path: o + "mode", write: "4\n", errno: syscall.EINVAL},
		{follows: "bond_opt_parse: no such mode", path: o + "mode", write: "backup\n", errno: syscall.EINVAL},
		{follows: "bond_opt_parse", path: o + "mode", write: "1\n"},
		{follows: "bond_opt_parse", path: o + "mode", write: "active-backup\n"},
		{follows: "bond_opt_parse: intmax table", path: o + "miimon", write: "-5\n", errno: syscall.EINVAL},
		{follows: "bond_opt_parse: intmax table", path: o + "miimon", write: "2147483648\n", errno: syscall.EINVAL},
		// Without link monitoring every slave counts as up (no race with the joins).
		{follows: "bond_option_miimon_set", path: o + "miimon", write: "0\n"},
		{follows: "bond_opt_parse: fail_over_mac table", path: o + "fail_over_mac", write: "sometimes\n", errno: syscall.EINVAL},
		{follows: "bond_option_slaves_set: no command", path: o + "slaves", write: "ib0\n", errno: syscall.EPERM},
		{follows: "bond_option_slaves_set: __dev_get_by_name", path: o + "slaves", write: "+eth0\n", errno: syscall.ENODEV},
		{follows: "bond_enslave: slave is up", path: o + "slaves", write: "+ib0\n", errno: syscall.EPERM},
		{follows: "bond_release: not a slave", path: o + "slaves", write: "-ib1\n", errno: syscall.EINVAL},
		{follows: "bond_option_active_slave_set: no such device", path: o + "active_slave", write: "eth0\n", errno: syscall.ENODEV},
		{follows: "bond_option_active_slave_set: not a slave", path: o + "active_slave", write: "ib1\n", errno: syscall.EINVAL},
		{follows: "bond_option_primary_set: recorded before enslaved", path: o + "primary", write: "ib0\n"},
		{follows: "bonding_show_primary: only an enslaved primary", path: o + "primary", want: ""},
		{follows: "ifenslave: the slave down first", path: "class/net/ib0/flags", write: "0x1002\n"},
		{follows: "ifenslave: the slave down first", path: "class/net/ib1/flags", write: "0x1002\n"},
		{follows: "bond_enslave", path: o + "slaves", write: "+ib0\n"},
		{follows: "bond_enslave", path: o + "slaves", write: "+ib1\n"},
		{follows: "bond_enslave: already a slave (rx handler busy)", path: o + "slaves", write: "+ib1\n", errno: syscall.EBUSY},
		{follows: "bonding_show_slaves", path: o + "slaves", want: "ib0 ib1\n"},
		{follows: "bond_enslave: IFF_SLAVE, the slave opened", path: "class/net/ib0/flags", want: "0x1803\n"},
		{follows: "dev_change_flags: IFF_SLAVE is not the writer's", path: "class/net/ib0/flags", write: "0x1003\n"},
		{follows: "dev_change_flags: IFF_SLAVE is not the writer's", path: "class/net/ib0/flags", want: "0x1803\n"},
		{follows: "bond_enslave: fail_over_mac active for IPoIB", path: o + "fail_over_mac", want: "active 1\n"},
		{follows: "bond_opt_check_deps: NOSLAVES", path: o + "fail_over_mac", write: "none\n", errno: syscall.ENOTEMPTY},
		{follows: "bond_opt_check_deps: NOSLAVES", path: o + "mode", write: "1\n", errno: syscall.ENOTEMPTY},
		{follows: "bond_setup_by_slave", path: b + "type", want: "32\n"},
		{follows: "bond_setup_by_slave", path: b + "addr_len", want: "20\n"},
		{follows: "bond_setup_by_slave copies no MTU: the bond keeps ether_setup's", path: b + "mtu", want: "1500\n"},
		{follows: "bond_enslave: dev_set_mtu(slave, the bond's MTU)", path: "class/net/ib0/mtu", want: "1500\n"},
		{follows: "bond_setup_by_slave: the slave's broadcast", path: b + "broadcast", want: "00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff\n"},
		{follows: "bond_set_dev_addr: the first slave's address", path: b + "address", want: "=ib0"},
		{follows: "bonding_show_primary", path: o + "primary", want: "ib0\n"},
		{follows: "bond_change_mtu: a datagram slave refuses 65520", path: b + "mtu", write: "65520\n", errno: syscall.EINVAL},
		{follows: "bond_change_mtu: unwound", path: "class/net/ib0/mtu", want: "1500\n"},
		{follows: "bond_change_mtu", path: b + "mtu", write: "2000\n"},
		{follows: "bond_change_mtu: every slave", path: "class/net/ib1/mtu", want: "2000\n"},
		{follows: "bond_open", path: b + "flags", write: "0x1403\n"},
		{follows: "bond_opt_check_deps: IFDOWN", path: o + "mode", write: "1\n", errno: syscall.ENOTEMPTY},
		{follows: "bond_option_active_slave_set: no device", path: o + "active_slave", write: "bond0\n", errno: syscall.EINVAL},
		{follows: "carrier_store: no ndo_change_carrier", path: b + "carrier", write: "1\n", errno: syscall.EOPNOTSUPP},
	}
	run := func(steps []check) {
		for _, c := range steps {
			if c.write != "" {
				if errno := write(tr, c.path, c.write); errno != c.errno {
					t.Errorf("%s: echo %q > %s: errno %v, want %v", c.follows, c.write, c.path, errno, c.errno)
				}
				continue
			}
			want := c.want
			if want == "=ib0" {
				want = ib0.HWAddr().String() + "\n"
			}
			got, errno := read(tr, c.path)
			if errno != c.errno || got != want {
				t.Errorf("%s: cat %s = %q, %v; want %q, %v", c.follows, c.path, got, errno, want, c.errno)
			}
		}
	}
	run(steps)
	waitFor(t, "bond0 active on ib0", func() bool {
		got, _ := read(tr, o+"active_slave")
		return got == "ib0\n"
	})
	run([]check{
		{follows: "bonding_show_mii_status", path: o + "mii_status", want: "up\n"},
		{follows: "bond_set_carrier", path: b + "carrier", want: "1\n"},
		{follows: "bond_set_carrier", path: b + "operstate", want: "up\n"},
		{follows: "bond_sysfs_slave: state", path: "class/net/ib0/bonding_slave/state", want: "active\n"},
		{follows: "bond_sysfs_slave: perm_hwaddr", path: "class/net/ib0/bonding_slave/perm_hwaddr", want: "=ib0"},
		{follows: "bond_sysfs_slave: mii_status", path: "class/net/ib0/bonding_slave/mii_status", want: "up\n"},
		{follows: "bond_sysfs_slave: link_failure_count", path: "class/net/ib0/bonding_slave/link_failure_count", want: "0\n"},
	})
	waitFor(t, "ib1's link up", func() bool {
		got, _ := read(tr, "class/net/ib1/bonding_slave/mii_status")
		return got == "up\n"
	})
	run([]check{
		{follows: "bond_option_active_slave_set", path: o + "active_slave", write: "ib1\n"},
		{follows: "bond_option_active_slave_set", path: o + "active_slave", want: "ib1\n"},
		{follows: "bond_sysfs_slave: state", path: "class/net/ib0/bonding_slave/state", want: "backup\n"},
		{follows: "fail_over_mac active: the active slave's address", path: b + "address", want: e.Interfaces()[1].HWAddr().String() + "\n"},
		{follows: "bond_option_slaves_set: release", path: o + "slaves", write: "-ib0\n"},
		{follows: "__bond_release_one: dev_close", path: "class/net/ib0/flags", want: "0x1002\n"},
		{follows: "__bond_release_one: original MTU", path: "class/net/ib0/mtu", want: "2044\n"},
		{follows: "bonding_store_bonds: unregister", path: m, write: "-bond0\n"},
		{follows: "bonding_show_bonds", path: m, want: ""},
		{follows: "unregistered", path: o + "mode", errno: syscall.ENOENT},
		{follows: "__bond_release_one: dev_close", path: "class/net/ib1/flags", want: "0x1002\n"},
	})
	if _, err := tr.Lookup("class/net/ib1/bonding_slave"); err == nil {
		t.Fatal("ib1 keeps bonding_slave/ after its bond is gone")
	}
	// Every bonding file that takes writes needs CAP_NET_ADMIN (the daemon's rule for
	// files that change the network), and the modes are the driver's.
	if errno := write(tr, m, "+bond1\n"); errno != 0 {
		t.Fatal(errno)
	}
	for path, perm := range map[string]uint32{m: 0644, "class/net/bond1/bonding/slaves": 0644, "class/net/bond1/bonding/mii_status": 0444,
		"class/net/bond1/mtu": 0644, "class/net/bond1/bonding/mode": 0644} {
		n, err := tr.Lookup(path)
		if err != nil {
			t.Fatal(err)
		}
		if n.Perm() != perm || n.NeedsNetAdmin() != (perm&0200 != 0) {
			t.Errorf("%s: mode %o net_admin %v", path, n.Perm(), n.NeedsNetAdmin())
		}
	}
	n, _ := tr.Lookup(m)
	h, err := n.Open(Caller{UID: 0, GIDs: []uint32{0}, Via: "test"}, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write([]byte("+bond2\n")); err != syscall.EPERM {
		t.Fatalf("bonding_masters without CAP_NET_ADMIN: %v, want EPERM", err)
	}
	h.Release()
}

var bondFormats = map[string]*regexp.Regexp{
	"bonding_masters": regexp.MustCompile(`^"([^\s/:]+( [^\s/:]+)*\\n)?"$`),
	"mode":            regexp.MustCompile(`^"active-backup 1\\n"$`),
	"miimon":          regexp.MustCompile(`^"\d+\\n"$`),
	"fail_over_mac":   regexp.MustCompile(`^"(none 0|active 1|follow 2)\\n"$`),
	"slaves":          regexp.MustCompile(`^"(ib[01]( ib[01])?\\n)?"$`),
	"active_slave":    regexp.MustCompile(`^"(ib[01]\\n)?"$`),
	"primary":         regexp.MustCompile(`^"(ib[01]\\n)?"$`),
	"mtu":             regexp.MustCompile(`^"\d+\\n"$`),
	// BROADCAST and MASTER always; UP, DEBUG, NOTRAILERS, NOARP, PROMISC, ALLMULTI,
	// MULTICAST, PORTSEL, AUTOMEDIA and DYNAMIC as the last flags write said.
	"flags": regexp.MustCompile(`^"0x[0-9a-f]?[4-7][028a][2367]\\n"$`),
}

// FuzzBondWrite writes random bytes to the bonding files: a failed write changes none
// of them, a successful one leaves every file in its format.
func FuzzBondWrite(f *testing.F) {
	for k, s := range []string{"+bond0", "-bond0\n", "+ib0", "-ib1\n", "1", "active-backup\n", "100", "maxval", "none",
		"ib0\n", "\n", "65520", "0x1003", "\x00\xff", "+bond0 +bond1"} {
		for idx := range 9 {
			f.Add(uint8(idx+k), []byte(s))
		}
	}
	var tr *Tree
	var e *ipoib.Engine
	f.Cleanup(func() {
		for k := len(fuzzCleanups) - 1; k >= 0; k-- {
			fuzzCleanups[k]()
		}
		fuzzCleanups = nil
	})
	files := []string{"class/net/bonding_masters", "bonding/mode", "bonding/miimon", "bonding/fail_over_mac", "bonding/slaves",
		"bonding/active_slave", "bonding/primary", "mtu", "flags"}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		if tr == nil {
			tr, e, _ = newBondEnv(&onceTB{TB: t})
			for _, i := range e.Interfaces() {
				_ = i.SetUp(false)
			}
		}
		if names := strings.Fields(e.Interfaces()[0].Name() + " " + mustRead(t, tr, "class/net/bonding_masters")); len(names) > 9 {
			for _, n := range names[1:] { // keep the number of bonds small
				_ = write(tr, "class/net/bonding_masters", "-"+n+"\n")
			}
		}
		if _, err := tr.Lookup("class/net/bond0"); err != nil {
			if errno := write(tr, "class/net/bonding_masters", "+bond0\n"); errno != 0 {
				t.Fatal(errno)
			}
		}
		target := files[int(which)%len(files)]
		if !strings.HasPrefix(target, "class/") {
			target = "class/net/bond0/" + target
		}
		state := func() map[string]string {
			out := map[string]string{}
			for _, p := range files {
				if !strings.HasPrefix(p, "class/") {
					p = "class/net/bond0/" + p
				}
				got, errno := read(tr, p)
				out[p] = fmt.Sprintf("%q %v", got, errno)
			}
			return out
		}
		before := state()
		errno := write(tr, target, string(data))
		after := state()
		if errno != 0 {
			for p := range before {
				// The link monitor moves active_slave by itself.
				if before[p] != after[p] && !strings.HasSuffix(p, "active_slave") {
					t.Fatalf("failed write (%v) of %q to %s changed %s: %s -> %s", errno, data, target, p, before[p], after[p])
				}
			}
			return
		}
		for p, s := range after {
			base := p[strings.LastIndex(p, "/")+1:]
			if strings.HasSuffix(s, " errno 0") {
				s = strings.TrimSuffix(s, " errno 0")
			} else {
				continue // bond0 deleted by this write
			}
			if re := bondFormats[base]; re != nil && !re.MatchString(s) {
				t.Fatalf("%s after %q to %s: %s", p, data, target, s)
			}
		}
	})
}

func mustRead(t testing.TB, tr *Tree, path string) string {
	got, errno := read(tr, path)
	if errno != 0 {
		t.Fatalf("cat %s: %v", path, errno)
	}
	return got
}

// A bond's files hold the bond, not its name: a descriptor opened before the bond is
// deleted never reaches a bond made again under the name.
func TestBondHandleHoldsItsBond(t *testing.T) {
	tr, _, _ := newBondEnv(t)
	if errno := write(tr, "class/net/bonding_masters", "+bond0\n"); errno != 0 {
		t.Fatal(errno)
	}
	n, err := tr.Lookup("class/net/bond0/bonding/miimon")
	if err != nil {
		t.Fatal(err)
	}
	h, err := n.Open(Internal, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	for _, cmd := range []string{"-bond0\n", "+bond0\n"} {
		if errno := write(tr, "class/net/bonding_masters", cmd); errno != 0 {
			t.Fatalf("%q: %v", cmd, errno)
		}
	}
	want := mustRead(t, tr, "class/net/bond0/bonding/miimon")
	if _, err := h.Write([]byte("250\n")); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("write through the deleted bond's descriptor: %v, want ENODEV", err)
	}
	if got := mustRead(t, tr, "class/net/bond0/bonding/miimon"); got != want {
		t.Errorf("the new bond0's miimon went from %q to %q", want, got)
	}
	if n2, _ := tr.Lookup("class/net/bond0/bonding/miimon"); n2.Ino() == n.Ino() {
		t.Errorf("the new bond0's miimon kept inode %d", n.Ino())
	}
}
