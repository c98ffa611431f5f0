package fs

import (
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
		ib + "carrier":    0644, // net-sysfs: DEVICE_ATTR_RW(carrier)
		"kernel/debug":    0700, // the debugfs mount point is root's only
		ib + "mode":       0644,
		ib + "dev_port":   0444,
		ib + "statistics": 0755,
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
