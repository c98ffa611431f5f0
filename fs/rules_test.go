package fs

import (
	"fmt"
	"syscall"
	"testing"
)

// The kernel's small rules, each checked against the file it governs and named after
// the driver or core function it follows.
func TestKernelSmallRules(t *testing.T) {
	v := newEnv(t)
	if errno := write(v.tree, "class/net/ib0/create_child", "1\n"); errno != 0 {
		t.Fatalf("create_child 1: %v", errno)
	}
	const ib, ch = "class/net/ib0/", "class/net/ib0.8001/"
	type check struct {
		follows string // the kernel function whose behaviour this is
		path    string
		write   string // "" reads the file instead
		want    string // read: the content
		errno   syscall.Errno
	}
	for _, c := range []check{
		{follows: "ipoib_set_mode: strcmp(buf, \"connected\\n\")", path: ib + "mode", write: "connected", errno: syscall.EINVAL},
		{follows: "ipoib_set_mode: strcmp(buf, \"datagram\\n\")", path: ib + "mode", write: "datagram", errno: syscall.EINVAL},
		{follows: "ipoib_set_mode", path: ib + "mode", write: "datagram\n"},
		{follows: "carrier_store: no ndo_change_carrier", path: ib + "carrier", write: "1\n", errno: syscall.EOPNOTSUPP},
		{follows: "carrier_store: no ndo_change_carrier", path: ib + "carrier", write: "0\n", errno: syscall.EOPNOTSUPP},
		{follows: "carrier_store: no ndo_change_carrier comes before parsing", path: ib + "carrier", write: "up\n", errno: syscall.EOPNOTSUPP},
		{follows: "carrier_store: no ndo_change_carrier comes before change_carrier's running check", path: ch + "carrier", write: "1\n", errno: syscall.EOPNOTSUPP},
		{follows: "ipoib_add_port: dev_id = port - 1", path: ib + "dev_id", want: "0x0\n"},
		{follows: "__ipoib_vlan_add leaves dev_id at 0", path: ch + "dev_id", want: "0x0\n"},
		{follows: "__ipoib_vlan_add leaves dev_port at 0", path: ch + "dev_port", want: "0\n"},
		{follows: "netstat_attrs: rx_nohandler", path: ib + "statistics/rx_nohandler", want: "0\n"},
		{follows: "netstat_attrs: tx_window_errors", path: ch + "statistics/tx_window_errors", want: "0\n"},
		{follows: "param_set_int -> kstrtoint: -ERANGE", path: "module/ib_ipoib/parameters/debug_level", write: "2147483648\n", errno: syscall.ERANGE},
		{follows: "param_set_int -> kstrtoint: -ERANGE", path: "module/ib_ipoib/parameters/debug_level", write: "-2147483649\n", errno: syscall.ERANGE},
		{follows: "param_set_int -> kstrtoint: -EINVAL", path: "module/ib_ipoib/parameters/debug_level", write: "1x\n", errno: syscall.EINVAL},
		{follows: "param_set_int", path: "module/ib_ipoib/parameters/debug_level", write: "2147483647\n"},
		{follows: "param_set_int", path: "module/ib_ipoib/parameters/debug_level", want: "2147483647\n"},
		{follows: "param_set_int", path: "module/ib_ipoib/parameters/debug_level", write: "0\n"},
		{follows: "format_flags: dev->flags, not dev_get_flags", path: ib + "flags", want: "0x1003\n"},
		{follows: "ipoib_vlan_add: registered down", path: ch + "flags", want: "0x1002\n"},
		{follows: "change_flags -> dev_change_flags(IFF_UP)", path: ch + "flags", write: "0x1003\n"},
		{follows: "change_flags -> dev_change_flags(IFF_UP)", path: ch + "operstate", want: "down\n"}, // up, no carrier (P_Key absent), parent with carrier: default_operstate
		{follows: "netdev_store: kstrtoul base 0", path: ch + "flags", write: "4098\n"},               // 0x1002: down
		{follows: "netdev_store: kstrtoul base 0", path: ch + "flags", want: "0x1002\n"},
		{follows: "netdev_store: kstrtoul -EINVAL", path: ch + "flags", write: "up\n", errno: syscall.EINVAL},
		{follows: "__dev_change_flags: IFF_MULTICAST as written", path: ch + "flags", write: "0x3\n"},
		{follows: "__dev_change_flags: IFF_MULTICAST as written", path: ch + "flags", want: "0x3\n"},
		{follows: "__dev_change_flags: IFF_BROADCAST kept (IFF_VOLATILE)", path: ch + "flags", write: "0x1000\n"},
		{follows: "__dev_change_flags: IFF_BROADCAST kept (IFF_VOLATILE)", path: ch + "flags", want: "0x1002\n"},
		{follows: "change_flags: (unsigned int)new_flags", path: ch + "flags", write: "0x100000002\n"},
		{follows: "change_flags: (unsigned int)new_flags", path: ch + "flags", want: "0x2\n"},
		{follows: "change_flags: (unsigned int)new_flags", path: ch + "flags", write: "0x1002\n"},
		{follows: "ipoib_setup_common: tx_queue_len", path: ib + "tx_queue_len", want: "1000\n"},
		{follows: "change_tx_queue_len: must fit unsigned int", path: ib + "tx_queue_len", write: "4294967296\n", errno: syscall.ERANGE},
		{follows: "netdev_store: kstrtoul -ERANGE", path: ib + "tx_queue_len", write: "18446744073709551616\n", errno: syscall.ERANGE},
		{follows: "change_tx_queue_len", path: ib + "tx_queue_len", write: "0x800\n"},
		{follows: "change_tx_queue_len", path: ib + "tx_queue_len", want: "2048\n"},
		{follows: "ipoib_fix_features: connected mode drops IP_CSUM and TSO only", path: ib + "mode", write: "connected\n"},
		{follows: "ipoib_fix_features: connected mode drops IP_CSUM and TSO only", path: ib + "ethtool/features",
			want: "rx-checksumming: on\ntx-checksumming: off [requested on]\ntcp-segmentation-offload: off [requested on]\ngeneric-receive-offload: on\n"},
		{follows: "ipoib_set_mode", path: ib + "mode", write: "datagram\n"},
		{follows: "netdev_fix_features: no GRO_HW without RXCSUM", path: ib + "ethtool/features", write: "rx off\n"},
		{follows: "netdev_fix_features: no GRO_HW without RXCSUM", path: ib + "ethtool/features",
			want: "rx-checksumming: off\ntx-checksumming: on\ntcp-segmentation-offload: on\ngeneric-receive-offload: off [requested on]\n"},
		{follows: "netdev_fix_features: no TSO without checksum offload", path: ib + "ethtool/features", write: "rx on tx off\n"},
		{follows: "netdev_fix_features: no TSO without checksum offload", path: ib + "ethtool/features",
			want: "rx-checksumming: on\ntx-checksumming: off\ntcp-segmentation-offload: off [requested on]\ngeneric-receive-offload: on\n"},
	} {
		if c.write != "" {
			if errno := write(v.tree, c.path, c.write); errno != c.errno {
				t.Errorf("%s: echo %q > %s: errno %v, want %v", c.follows, c.write, c.path, errno, c.errno)
			}
			continue
		}
		got, errno := read(v.tree, c.path)
		if errno != c.errno || got != c.want {
			t.Errorf("%s: cat %s = %q, %v; want %q, %v", c.follows, c.path, got, errno, c.want, c.errno)
		}
	}
	// Modes that sysfs and debugfs give.
	for path, want := range map[string]uint32{
		ib + "carrier":      0644, // net-sysfs: DEVICE_ATTR_RW(carrier)
		"kernel/debug":      0700, // the debugfs mount point is root's only
		ib + "mode":         0644,
		ib + "dev_port":     0444,
		ib + "statistics":   0755,
		ib + "flags":        0644, // net-sysfs: DEVICE_ATTR_RW(flags)
		ib + "tx_queue_len": 0644,
	} {
		n, err := v.tree.Lookup(path)
		if err != nil {
			t.Errorf("lookup %s: %v", path, err)
			continue
		}
		if n.Perm() != want {
			t.Errorf("%s has mode %#o, want %#o", path, n.Perm(), want)
		}
	}
}

// net-sysfs's stores and create_child/delete_child need CAP_NET_ADMIN, even for uid 0;
// mode and umcast (ipoib's own attributes) do not. create_child and delete_child parse
// and range-check their argument first, as the driver does: EINVAL before EPERM.
func TestNetAdminNeeded(t *testing.T) {
	v := newEnv(t)
	root := Caller{UID: 0, GIDs: []uint32{0}, Via: "test"} // no CAP_NET_ADMIN
	for _, c := range []struct {
		path, data string
		errno      syscall.Errno
	}{
		{"class/net/ib0/create_child", "0x8001\n", syscall.EPERM},
		{"class/net/ib0/delete_child", "0x8001\n", syscall.EPERM},
		{"class/net/ib0/create_child", "x\n", syscall.EINVAL},
		{"class/net/ib0/create_child", "0x8000\n", syscall.EINVAL},
		{"class/net/ib0/delete_child", "0x10000\n", syscall.EINVAL},
		{"class/net/ib0/delete_child", "0\n", syscall.EPERM},
		{"class/net/ib0/mtu", "1500\n", syscall.EPERM},
		{"class/net/ib0/flags", "0x1002\n", syscall.EPERM},
		{"class/net/ib0/tx_queue_len", "10\n", syscall.EPERM},
		// carrier_store refuses a device without ndo_change_carrier before it asks.
		{"class/net/ib0/carrier", "1\n", syscall.EOPNOTSUPP},
		{"class/net/ib0/umcast", "1\n", 0},
		{"class/net/ib0/mode", "datagram\n", 0},
	} {
		n, err := v.tree.Lookup(c.path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := n.Open(root, syscall.O_WRONLY)
		if err != nil {
			t.Fatalf("open %s: %v", c.path, err)
		}
		_, err = h.Write([]byte(c.data))
		h.Release()
		if got, _ := err.(syscall.Errno); got != c.errno {
			t.Errorf("root without CAP_NET_ADMIN: echo %q > %s: %v, want %v", c.data, c.path, err, c.errno)
		}
	}
	if got, _ := read(v.tree, "class/net/ib0/mtu"); got != "2044\n" {
		t.Errorf("mtu after a refused write: %q", got)
	}
}

// The DHCP client identifiers of the vendor guide: the boot firmware's form (a fixed
// prefix and the port GUID) and the older one (0x20 and the hardware address).
func TestDHCPClientIDs(t *testing.T) {
	v := newEnv(t)
	hw := v.ib0.HWAddr()
	g := hw.GID()
	want := "ff:00:00:00:00:00:02:00:00:02:c9:00"
	for _, c := range g[8:] {
		want += fmt.Sprintf(":%02x", c)
	}
	if got, _ := read(v.tree, "class/net/ib0/dhcp/client_id"); got != want+"\n" {
		t.Errorf("client_id = %q, want %q", got, want)
	}
	if got, _ := read(v.tree, "class/net/ib0/dhcp/client_id_hwaddr"); got != "20:"+hw.String()+"\n" {
		t.Errorf("client_id_hwaddr = %q, want 20:%s", got, hw)
	}
}
