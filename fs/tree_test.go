package fs

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/ipoib"
)

// read reads a whole file through the node model as a front end would.
func read(t *Tree, path string) (string, syscall.Errno) {
	n, err := t.Lookup(path)
	if err != nil {
		return "", Errno(err)
	}
	h, err := n.Open(Internal, syscall.O_RDONLY)
	if err != nil {
		return "", Errno(err)
	}
	defer h.Release()
	var out []byte
	buf := make([]byte, 7) // small reads: the snapshot must hold across calls
	for {
		k, err := h.ReadAt(buf, int64(len(out)))
		if err != nil {
			return "", Errno(err)
		}
		if k == 0 {
			return string(out), 0
		}
		out = append(out, buf[:k]...)
	}
}

// write does open(O_WRONLY|O_TRUNC), one write, close, and returns the first errno.
func write(t *Tree, path, data string) syscall.Errno {
	n, err := t.Lookup(path)
	if err != nil {
		return Errno(err)
	}
	h, err := n.Open(Internal, syscall.O_WRONLY|syscall.O_TRUNC)
	if err != nil {
		return Errno(err)
	}
	_, werr := h.Write([]byte(data))
	ferr := h.Flush()
	rerr := h.Release()
	for _, e := range []error{werr, ferr, rerr} {
		if e != nil {
			return Errno(e)
		}
	}
	return 0
}

func names(t *testing.T, tr *Tree, path string) []string {
	t.Helper()
	n, err := tr.Lookup(path)
	if err != nil {
		t.Fatalf("lookup %s: %v", path, err)
	}
	cs, err := n.Children()
	if err != nil {
		t.Fatalf("list %s: %v", path, err)
	}
	var out []string
	for _, c := range cs {
		out = append(out, c.Name())
	}
	return out
}

func TestLayout(t *testing.T) {
	v := newEnv(t)
	tr := v.tree
	for path, want := range map[string][]string{
		"":                           {"class", "fabric", "kernel", "link", "module", "sm"},
		"class":                      {"infiniband", "net"},
		"class/net":                  {"ib0"},
		"class/infiniband":           {"n1"},
		"class/infiniband/n1":        {"board_id", "fw_ver", "hca_type", "hw_rev", "node_desc", "node_guid", "node_type", "ports", "sys_image_guid"},
		"class/infiniband/n1/ports":  {"1"},
		"kernel/debug/ipoib":         {"ib0_mcg", "ib0_path"},
		"module/ib_ipoib/parameters": ipoib.ParamNames,
		"class/net/ib0": {"addr_assign_type", "addr_len", "address", "broadcast", "carrier", "carrier_changes", "carrier_down_count",
			"carrier_up_count", "create_child", "delete_child", "dev_id", "dev_port", "dhcp", "dormant", "duplex", "ethtool", "flags",
			"ifalias", "ifindex", "iflink", "link_mode", "mode", "mtu", "operstate", "pkey", "speed", "statistics", "tx_queue_len",
			"type", "umcast"},
		"class/net/ib0/ethtool": {"coalesce", "features", "statistics"},
		"class/net/ib0/statistics": { // net-sysfs's 24
			"collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped", "rx_errors",
			"rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors", "rx_nohandler",
			"rx_over_errors", "rx_packets", "tx_aborted_errors", "tx_bytes", "tx_carrier_errors", "tx_compressed",
			"tx_dropped", "tx_errors", "tx_fifo_errors", "tx_heartbeat_errors", "tx_packets", "tx_window_errors"},
		"sm":     {"auth_failures", "faults", "groups", "nodes", "partitions"},
		"fabric": {"groups", "nodes"},
	} {
		if diff := cmp.Diff(want, names(t, tr, path)); diff != "" {
			t.Errorf("ls %q (-want +got):\n%s", path, diff)
		}
	}
	if got := len(names(t, tr, "class/infiniband/n1/ports/1/pkeys")); got != 64 {
		t.Errorf("pkeys: %d entries, want the table capacity 64", got)
	}
	// Without an SM there is no sm/.
	if diff := cmp.Diff([]string{"class", "fabric", "kernel", "link", "module"}, names(t, New(v.e, Options{}), "")); diff != "" {
		t.Errorf("root without SM: %s", diff)
	}
}

func TestFormats(t *testing.T) {
	v := newEnv(t)
	tr := v.tree
	exact := map[string]string{
		"class/net/ib0/type":                                "32\n",
		"class/net/ib0/addr_len":                            "20\n",
		"class/net/ib0/pkey":                                "0xffff\n",
		"class/net/ib0/mode":                                "datagram\n",
		"class/net/ib0/umcast":                              "0\n",
		"class/net/ib0/carrier":                             "1\n",
		"class/net/ib0/operstate":                           "up\n",
		"class/net/ib0/speed":                               "40000\n", // 4X QDR
		"class/net/ib0/duplex":                              "full\n",
		"class/net/ib0/carrier_up_count":                    "1\n",
		"class/net/ib0/carrier_down_count":                  "1\n",
		"class/net/ib0/carrier_changes":                     "2\n",
		"class/net/ib0/ifalias":                             "",
		"class/net/ib0/addr_assign_type":                    "0\n",
		"class/net/ib0/dormant":                             "0\n",
		"class/net/ib0/link_mode":                           "0\n",
		"class/net/ib0/dev_id":                              "0x0\n",
		"class/net/ib0/dev_port":                            "0\n",
		"class/net/ib0/tx_queue_len":                        "1000\n",
		"class/net/ib0/flags":                               "0x1003\n",
		"class/net/ib0/statistics/tx_errors":                "0\n",
		"class/net/ib0/ethtool/coalesce":                    "rx-usecs: 0\nrx-frames: 0\n",
		"class/net/ib0/ethtool/features":                    "rx-checksumming: on\ntx-checksumming: on\ntcp-segmentation-offload: on\ngeneric-receive-offload: on\n",
		"class/infiniband/n1/node_type":                     "1: CA\n",
		"class/infiniband/n1/fw_ver":                        "1.0.0\n",
		"class/infiniband/n1/node_desc":                     "ipoibfs n1\n",
		"class/infiniband/n1/hw_rev":                        "0\n",
		"class/infiniband/n1/hca_type":                      "ipoibfs-soft\n",
		"class/infiniband/n1/board_id":                      "IPOIBFS_0000000001\n",
		"class/infiniband/n1/ports/1/counters/symbol_error": "0\n",
		"class/infiniband/n1/ports/1/state":                 "4: ACTIVE\n",
		"class/infiniband/n1/ports/1/phys_state":            "5: LinkUp\n",
		"class/infiniband/n1/ports/1/rate":                  "40 Gb/sec (4X QDR)\n",
		"class/infiniband/n1/ports/1/link_layer":            "InfiniBand\n",
		"class/infiniband/n1/ports/1/lid":                   "0x1\n",
		"class/infiniband/n1/ports/1/sm_lid":                "0x1\n",
		"class/infiniband/n1/ports/1/pkeys/0":               "0xffff\n",
		"class/infiniband/n1/ports/1/pkeys/63":              "0x0000\n",
		"module/ib_ipoib/parameters/send_queue_size":        "128\n",
		"module/ib_ipoib/parameters/recv_queue_size":        "256\n",
		"module/ib_ipoib/parameters/debug_level":            "0\n",
		"module/ib_ipoib/parameters/max_nonsrq_conn_qp":     "128\n",
	}
	for path, want := range exact {
		got, errno := read(tr, path)
		if errno != 0 || got != want {
			t.Errorf("cat %s = %q, %v; want %q", path, got, errno, want)
		}
	}
	mtu, _ := read(tr, "class/net/ib0/mtu")
	if mtu != fmt.Sprintf("%d\n", v.ib0.MTU()) {
		t.Errorf("mtu %q, engine %d", mtu, v.ib0.MTU())
	}
	re := map[string]string{
		"class/net/ib0/address":              `^(00|80)(:[0-9a-f]{2}){3}:fe:80:00:00:00:00:00:00(:[0-9a-f]{2}){8}\n$`,
		"class/net/ib0/broadcast":            `^00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff\n$`,
		"class/infiniband/n1/node_guid":      `^[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}\n$`,
		"class/infiniband/n1/ports/1/gids/0": `^fe80:0000:0000:0000(:[0-9a-f]{4}){4}\n$`,
		"kernel/debug/ipoib/ib0_mcg":         `^GID: ff12:401b:ffff:0:0:0:ffff:ffff\n  created: +\d+\n  queuelen: +0\n  complete: +yes\n  send_only: +no\n\n`,
		"class/net/ib0/ethtool/statistics":   `^NIC statistics:\n     rx_packets: \d+\n     tx_packets: \d+\n(     \w+: \d+\n){6}$`,
		"sm/nodes":                           `^"ipoibfs n1" node_guid 0x[0-9a-f]{16} port_guid 0x[0-9a-f]{16} port 1 lid 0x0001 state ACTIVE pkeys 0xffff\n$`,
		"sm/groups":                          `(?s)^MGID: ff12:401b:ffff:0:0:0:ffff:ffff\n  MLID: 0xc[0-9a-f]{3}\n.*  members: 1\n    fe80:0:0:0:[0-9a-f:]+ join_state 0x1 \(full\)\n`,
		"sm/partitions":                      `Default=0x7fff`,
	}
	for path, pat := range re {
		got, errno := read(tr, path)
		if errno != 0 || !regexp.MustCompile(pat).MatchString(got) {
			t.Errorf("cat %s = %q, %v; want match %s", path, got, errno, pat)
		}
	}
	// The node GUID in sysfs form is the HCA's.
	g, _ := read(tr, "class/infiniband/n1/node_guid")
	if want := guidString(v.hca.NodeGUID()) + "\n"; g != want || len(g) != 20 {
		t.Errorf("node_guid %q want %q", g, want)
	}
}

func TestRateString(t *testing.T) {
	for _, c := range []struct {
		width, lane int
		want        string
	}{
		{4, 10000, "40 Gb/sec (4X QDR)\n"}, {1, 2500, "2.5 Gb/sec (1X SDR)\n"}, {4, 5000, "20 Gb/sec (4X DDR)\n"},
		{4, 14062, "56 Gb/sec (4X FDR)\n"}, {4, 25781, "100 Gb/sec (4X EDR)\n"}, {2, 53125, "100 Gb/sec (2X HDR)\n"},
		{12, 2500, "30 Gb/sec (12X SDR)\n"}, {8, 106250, "800 Gb/sec (8X NDR)\n"},
	} {
		a := verbsAttr(c.width, c.lane)
		got, err := rateString(a)
		if err != nil || got != c.want {
			t.Errorf("rate %dx%d = %q, %v; want %q", c.width, c.lane, got, err, c.want)
		}
	}
}

func TestGIDString(t *testing.T) {
	g := [16]byte{0xfe, 0x80, 14: 0x12, 15: 0x34}
	g[9], g[10], g[11] = 0x02, 0xc9, 0x03
	if got, want := gidString(g), "fe80:0000:0000:0000:0002:c903:0000:1234"; got != want {
		t.Errorf("gidString = %q want %q", got, want)
	}
}

func TestCarrierDownIsEINVAL(t *testing.T) {
	v := newEnv(t)
	if errno := write(v.tree, "class/net/ib0/create_child", "0x8001"); errno != 0 {
		t.Fatal(errno)
	}
	c, _ := v.e.Interface("ib0.8001")
	if err := c.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if _, errno := read(v.tree, "class/net/ib0.8001/carrier"); errno != syscall.EINVAL {
		t.Errorf("carrier of a down interface: %v, want EINVAL", errno)
	}
	if got, _ := read(v.tree, "class/net/ib0.8001/operstate"); got != "down\n" {
		t.Errorf("operstate %q", got)
	}
	// Link settings too: EINVAL while down; up without carrier (its P_Key is not in
	// the port's table), unknown.
	for _, f := range []string{"speed", "duplex"} {
		if _, errno := read(v.tree, "class/net/ib0.8001/"+f); errno != syscall.EINVAL {
			t.Errorf("%s of a down interface: %v, want EINVAL", f, errno)
		}
	}
	if err := c.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if c.Carrier() {
		t.Fatal("ib0.8001 has carrier")
	}
	for f, want := range map[string]string{"speed": "-1\n", "duplex": "unknown\n", "carrier": "0\n"} {
		if got, errno := read(v.tree, "class/net/ib0.8001/"+f); got != want || errno != 0 {
			t.Errorf("%s of an interface without carrier: %q %v, want %q", f, got, errno, want)
		}
	}
}

// The carrier's changes are counted as the netdev counts them.
func TestCarrierCounts(t *testing.T) {
	v := newEnv(t)
	counts := func() string {
		t.Helper()
		var out []string
		for _, f := range []string{"carrier_up_count", "carrier_down_count", "carrier_changes"} {
			got, errno := read(v.tree, "class/net/ib0/"+f)
			if errno != 0 {
				t.Fatalf("%s: %v", f, errno)
			}
			out = append(out, strings.TrimSpace(got))
		}
		return strings.Join(out, " ")
	}
	// Off once at setup, on with the broadcast group.
	if got := counts(); got != "1 1 2" {
		t.Fatalf("up, down, changes at start: %s, want 1 1 2", got)
	}
	if err := v.ib0.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if err := v.ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ib0's carrier back", v.ib0.Carrier)
	if got := counts(); got != "2 2 4" {
		t.Fatalf("up, down, changes after a down and up: %s, want 2 2 4", got)
	}
}

// ifalias takes what is written, less one trailing newline, and shows it with one;
// an administrator's (EPERM otherwise), at most 255 bytes (EINVAL), "" removes it.
func TestIfAlias(t *testing.T) {
	v := newEnv(t)
	const f = "class/net/ib0/ifalias"
	for _, c := range []struct{ in, want string }{
		{"rack 4 port 1\n", "rack 4 port 1\n"},
		{"two\n\n", "two\n\n"},
		{strings.Repeat("x", 255), strings.Repeat("x", 255) + "\n"},
		{"a\x00b\n", "a\n"}, // the alias ends at a NUL, as dev_get_alias reads it
		{"\n", ""},
	} {
		if errno := write(v.tree, f, c.in); errno != 0 {
			t.Fatalf("write %q: %v", c.in, errno)
		}
		if got, errno := read(v.tree, f); got != c.want || errno != 0 {
			t.Errorf("after %q: %q %v, want %q", c.in, got, errno, c.want)
		}
	}
	if errno := write(v.tree, f, "kept"); errno != 0 {
		t.Fatal(errno)
	}
	if errno := write(v.tree, f, strings.Repeat("x", 256)); errno != syscall.EINVAL {
		t.Errorf("256 bytes: %v, want EINVAL", errno)
	}
	n, err := v.tree.Lookup(f)
	if err != nil {
		t.Fatal(err)
	}
	h, err := n.Open(Caller{UID: 0, GIDs: []uint32{0}, Via: "test"}, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write([]byte("other")); err != syscall.EPERM {
		t.Errorf("without CAP_NET_ADMIN: %v, want EPERM", err)
	}
	h.Release()
	if got := v.ib0.Alias(); got != "kept" {
		t.Errorf("alias after the refused writes: %q, want kept", got)
	}
}

// TestWriteErrnos is the table of every writable file's errno paths.
func TestWriteErrnos(t *testing.T) {
	v := newEnv(t)
	tr := v.tree
	type step struct {
		path, data string
		want       syscall.Errno
	}
	ib := "class/net/ib0/"
	cmErr := syscall.EINVAL
	if v.ib0.HWAddr().Flags()&ipoib.FlagRC != 0 {
		cmErr = 0
	}
	steps := []step{
		// create_child: %i parsing, then the engine's rules.
		{ib + "create_child", "", 0}, // a zero-length write does nothing, as in sysfs
		{ib + "create_child", "\n", syscall.EINVAL},
		{ib + "create_child", "garbage", syscall.EINVAL},
		{ib + "create_child", "0", syscall.EINVAL},
		{ib + "create_child", "0x8000", syscall.EINVAL},
		{ib + "create_child", "0x10000", syscall.EINVAL},
		{ib + "create_child", "-1", syscall.EINVAL},
		{ib + "create_child", "99999999999999999999999", syscall.EINVAL},
		{ib + "create_child", "0xffff", syscall.ENOTUNIQ}, // the parent's own key
		{ib + "create_child", "0x7fff", syscall.ENOTUNIQ}, // normalised to 0xffff
		{ib + "create_child", "  0x8001junk\n", 0},
		{ib + "create_child", "1", syscall.ENOTUNIQ},
		{ib + "create_child", "0x8001", syscall.ENOTUNIQ},
		{ib + "create_child", "0100002", 0},             // octal 0x8002
		{ib + "create_child", "+32771", syscall.EINVAL}, // vsscanf's %i takes no '+'
		{ib + "create_child", "4295000067", 0},          // stored in a C int: 0x8003
		{"class/net/ib0.8001/create_child", "2", syscall.ENOENT},
		// delete_child: the full key only.
		{ib + "delete_child", "x", syscall.EINVAL},
		{ib + "delete_child", "-1", syscall.EINVAL},
		{ib + "delete_child", "0x10000", syscall.EINVAL},
		{ib + "delete_child", "0x0001", syscall.ENODEV},
		{ib + "delete_child", "0x8000", syscall.ENODEV},
		{ib + "delete_child", "0x8009", syscall.ENODEV},
		{ib + "delete_child", "0x8001", 0},
		{ib + "delete_child", "0x8001", syscall.ENODEV},
		// mode
		{ib + "mode", "datagram", syscall.EINVAL}, // ipoib_set_mode: strcmp with "datagram\n"
		{ib + "mode", "datagram\n", 0},
		{ib + "mode", "datagram\n\n", syscall.EINVAL},
		{ib + "mode", "Datagram\n", syscall.EINVAL},
		{ib + "mode", " datagram", syscall.EINVAL},
		{ib + "mode", "", 0},
		{ib + "mode", "\n", syscall.EINVAL},
		{ib + "mode", "connected", syscall.EINVAL},
		{ib + "mode", "connected\n", cmErr}, // EINVAL while the HCA offers no connected mode
		{ib + "mode", "datagram\n", 0},
		{ib + "mode", "connected\n", cmErr},
		{ib + "mode", "datagram\n", 0},
		// mtu
		{ib + "mtu", "2044\n", 0},
		{ib + "mtu", "2044", 0},
		{ib + "mtu", "72", 0},
		{ib + "mtu", "71", syscall.EINVAL},
		{ib + "mtu", "5", syscall.EINVAL},
		{ib + "mtu", "65520", syscall.EINVAL},
		{ib + "mtu", "0x800", syscall.EINVAL},
		{ib + "mtu", "", 0},
		{ib + "mtu", "\n", syscall.EINVAL},
		{ib + "mtu", "2044\n\n", syscall.EINVAL},
		{ib + "mtu", " 2044", syscall.EINVAL},
		{ib + "mtu", "-1", syscall.EINVAL},
		{ib + "mtu", "99999999999999999999", syscall.EINVAL},
		// umcast never fails
		{ib + "umcast", "1", 0},
		{ib + "umcast", "garbage", 0},
		{ib + "umcast", "", 0},
		// read-only and write-only files
		{ib + "pkey", "0x8001", syscall.EACCES},
		{ib + "type", "1", syscall.EACCES},
		{ib + "statistics/rx_packets", "0", syscall.EACCES},
		{"class/infiniband/n1/node_guid", "0", syscall.EACCES},
		{"kernel/debug/ipoib/ib0_mcg", "x", syscall.EACCES},
		{"module/ib_ipoib/parameters/send_queue_size", "256", syscall.EACCES},
		{"sm/nodes", "x", syscall.EACCES},
		// module parameters
		{"module/ib_ipoib/parameters/debug_level", "1\n", 0},
		{"module/ib_ipoib/parameters/debug_level", "0", 0},
		{"module/ib_ipoib/parameters/mcast_debug_level", "x", syscall.EINVAL},
		{"module/ib_ipoib/parameters/mcast_debug_level", "\n", syscall.EINVAL},
		{"module/ib_ipoib/parameters/mcast_debug_level", "0x10", 0},
		// ethtool/coalesce
		{ib + "ethtool/coalesce", "rx-usecs 8", 0},
		{ib + "ethtool/coalesce", "rx-usecs: 8\nrx-frames: 16\n", 0},
		{ib + "ethtool/coalesce", "rx-frames 65535", 0},
		{ib + "ethtool/coalesce", "rx-frames 65536", syscall.EINVAL},
		{ib + "ethtool/coalesce", "rx-usecs -1", syscall.EINVAL},
		{ib + "ethtool/coalesce", "rx-usecs", syscall.EINVAL},
		{ib + "ethtool/coalesce", "rx-usecs ten", syscall.EINVAL},
		{ib + "ethtool/coalesce", " \n", syscall.EINVAL},
		{ib + "ethtool/coalesce", "bogus 1", syscall.EINVAL},
		{ib + "ethtool/coalesce", "tx-usecs 1", syscall.EOPNOTSUPP},
		// ethtool/features
		{ib + "ethtool/features", "generic-receive-offload off", 0},
		{ib + "ethtool/features", "gro on\ntso off", 0},
		{ib + "ethtool/features", "tso maybe", syscall.EINVAL},
		{ib + "ethtool/features", "lro on", syscall.EINVAL},
		{ib + "ethtool/features", "tso", syscall.EINVAL},
		{ib + "ethtool/features", "\n", syscall.EINVAL},
		{ib + "ethtool/statistics", "x", syscall.EACCES},
		// sm/partitions: applied at close
		{"sm/partitions", "Default=0x7fff, ipoib : ALL=full;\nP1=0x8001, ipoib : ALL=full;\n", 0},
		{"sm/partitions", "Default=0x7fff : ALL=full;\nbroken line here\n", syscall.EINVAL},
		{"sm/partitions", "", 0},                   // an empty write applies nothing
		{"sm/partitions", "# only a comment\n", 0}, // a valid, empty configuration...
		// a gone interface
		{"class/net/ib0.9999/mtu", "1000", syscall.ENOENT},
	}
	for _, s := range steps {
		if got := write(tr, s.path, s.data); got != s.want {
			t.Errorf("echo %q > %s: errno %v (%d), want %v (%d)", s.data, s.path, got, int(got), s.want, int(s.want))
		}
	}
	// Resulting state.
	for path, want := range map[string]string{
		ib + "ethtool/coalesce": "rx-usecs: 8\nrx-frames: 65535\n",
		ib + "ethtool/features": "rx-checksumming: on\ntx-checksumming: on\ntcp-segmentation-offload: off\ngeneric-receive-offload: on\n",
		ib + "umcast":           "0\n",
		ib + "mtu":              "72\n",
		"module/ib_ipoib/parameters/mcast_debug_level": "16\n",
	} {
		if got, _ := read(tr, path); got != want {
			t.Errorf("%s = %q want %q", path, got, want)
		}
	}
	if diff := cmp.Diff([]string{"ib0", "ib0.8002", "ib0.8003"}, names(t, tr, "class/net")); diff != "" {
		t.Errorf("class/net: %s", diff)
	}
	parts, _ := read(tr, "sm/partitions")
	if strings.Contains(parts, "P1=0x0001") {
		t.Errorf("sm/partitions after writing an empty configuration:\n%s", parts)
	}
	// Data-path debug levels exist only in ipoib_debug_data builds.
	for _, p := range []string{"data_debug_level", "cm_data_debug_level"} {
		_, errno := read(tr, "module/ib_ipoib/parameters/"+p)
		if want := slices.Contains(ipoib.ParamNames, p); want != (errno == 0) {
			t.Errorf("%s: errno %v, listed %v", p, errno, want)
		}
	}
}

func TestWriteLog(t *testing.T) {
	v := newEnv(t)
	write(v.tree, "class/net/ib0/create_child", "0x8001")
	write(v.tree, "class/net/ib0/create_child", "1")
	write(v.tree, "class/net/ib0/mode", "connected!")
	write(v.tree, "class/net/ib0/mtu", "5")
	write(v.tree, "sm/partitions", "Default=0x7fff : ALL=full;\n\nbroken here\n")
	write(v.tree, "class/net/ib0/umcast", "1")
	got := v.log.take()
	// One line per write: file, result, what was written (quoted), who wrote it.
	const who = `; wrote %s as uid=0 via=internal$`
	line := func(start, data string) *regexp.Regexp {
		return regexp.MustCompile(start + fmt.Sprintf(who, regexp.QuoteMeta(strconv.Quote(data))))
	}
	want := []*regexp.Regexp{
		line(`^class/net/ib0/create_child: ok`, "0x8001"),
		line(`^class/net/ib0/create_child: P_Key 0x8001 is already used by ib0.* \(ENOTUNIQ\)`, "1"),
		line(`^class/net/ib0/mode: "connected!": write "datagram" or "connected" followed by a newline, as echo does \(EINVAL\)`, "connected!"),
		line(`^class/net/ib0/mtu: MTU 5 outside 72\.\.\d+ in datagram mode \(EINVAL\)`, "5"),
		line(`^sm/partitions: line 3: .+ \(EINVAL\)`, "Default=0x7fff : ALL=full;\n\nbroken here\n"),
		line(`^class/net/ib0/umcast: ok`, "1"),
	}
	if len(got) != len(want) {
		t.Fatalf("log lines %q, want %d", got, len(want))
	}
	for k, re := range want {
		if !re.MatchString(got[k]) {
			t.Errorf("log line %q does not match %s", got[k], re)
		}
	}
}

// TestPartitionsAccumulate: writes of one handle accumulate; a flush with nothing new
// does not re-apply; a bad config keeps the old one active.
func TestPartitionsAccumulate(t *testing.T) {
	v := newEnv(t)
	n, err := v.tree.Lookup("sm/partitions")
	if err != nil {
		t.Fatal(err)
	}
	h, err := n.Open(Internal, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Flush(); err != nil { // bash's dup2 close before any write
		t.Fatal(err)
	}
	for _, part := range []string{"Default=0x7fff, ipoib : ALL=full;\n", "P5=0x8005, ipoib ", ": ALL=full;\n"} {
		if _, err := h.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(v.hca.SM().Partitions().Partitions, func(p partitionT) bool { return p.Name == "P5" }) {
		t.Fatalf("P5 not applied:\n%s", v.hca.SM().Partitions())
	}
	waitFor(t, "P_Key 0x8005 in the port table", func() bool {
		p, _ := v.hca.Port(1)
		return slices.Contains(p.PKeyTable(), 0x8005)
	})
	before := v.hca.SM().Partitions().String()
	h, _ = n.Open(Internal, syscall.O_WRONLY)
	h.Write([]byte("P6=0x8006 : ALL=bogus;\n"))
	if err := h.Flush(); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("flush of a bad config: %v, want EINVAL", err)
	}
	if err := h.Release(); err != nil {
		t.Errorf("release after a failed flush re-applied: %v", err)
	}
	if after := v.hca.SM().Partitions().String(); after != before {
		t.Errorf("bad config changed the active one:\n%s", after)
	}
	// Too much data.
	h, _ = n.Open(Internal, syscall.O_WRONLY)
	if _, err := h.Write(make([]byte, 2<<20)); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("2 MiB write: %v, want EFBIG", err)
	}
	h.Release()
}

func TestInodes(t *testing.T) {
	v := newEnv(t)
	tr := v.tree
	if tr.Root().Ino() != 1 {
		t.Errorf("root ino %d", tr.Root().Ino())
	}
	seen := map[uint64]string{}
	var walk func(n *Node)
	walk = func(n *Node) {
		if p, dup := seen[n.Ino()]; dup {
			t.Errorf("ino %d for %q and %q", n.Ino(), p, n.Path())
		}
		seen[n.Ino()] = n.Path()
		if n.IsDir() {
			cs, _ := n.Children()
			for _, c := range cs {
				walk(c)
			}
		}
	}
	walk(tr.Root())
	a, _ := tr.Lookup("class/net/ib0/mtu")
	b, _ := tr.Lookup("class/net/ib0/mtu")
	if a.Ino() != b.Ino() {
		t.Error("same path, different inode")
	}
	// A re-created child is another object: its files get new numbers, as a new
	// kobject's kernfs nodes do, so no cache holding the old ones reaches it.
	write(tr, "class/net/ib0/create_child", "0x8001")
	c1, _ := tr.Lookup("class/net/ib0.8001/pkey")
	write(tr, "class/net/ib0/delete_child", "0x8001")
	if _, err := tr.Lookup("class/net/ib0.8001/pkey"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lookup after delete: %v", err)
	}
	write(tr, "class/net/ib0/create_child", "0x8001")
	c2, _ := tr.Lookup("class/net/ib0.8001/pkey")
	if c1.Ino() == c2.Ino() {
		t.Errorf("re-created child's pkey kept inode %d", c1.Ino())
	}
	if c3, _ := tr.Lookup("class/net/ib0.8001/pkey"); c3.Ino() != c2.Ino() {
		t.Errorf("the same child's pkey: inode %d, then %d", c2.Ino(), c3.Ino())
	}
}

// TestStaleHandle: a handle on a deleted interface's file gets ENODEV, not stale data.
func TestStaleHandle(t *testing.T) {
	v := newEnv(t)
	write(v.tree, "class/net/ib0/create_child", "0x8001")
	n, _ := v.tree.Lookup("class/net/ib0.8001/mtu")
	h, err := n.Open(Internal, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	write(v.tree, "class/net/ib0/delete_child", "0x8001")
	buf := make([]byte, 10)
	if _, err := h.ReadAt(buf, 0); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("read: %v", err)
	}
	if _, err := h.Write([]byte("1000")); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("write: %v", err)
	}
}

// A file holds its interface, not its name, as a sysfs file holds its kobject: a
// descriptor opened before a delete never reaches the child made again under the name,
// and one opened before a rename goes on working under the new name.
func TestHandleHoldsItsInterface(t *testing.T) {
	v := newEnv(t)
	open := func(p string, flags int) *Handle {
		t.Helper()
		n, err := v.tree.Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := n.Open(Internal, flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Release() })
		return h
	}
	readH := func(h *Handle) (string, error) {
		buf := make([]byte, 64)
		k, err := h.ReadAt(buf, 0)
		return string(buf[:k]), err
	}
	write(v.tree, "class/net/ib0/create_child", "0x8001")
	old := open("class/net/ib0.8001/umcast", syscall.O_RDWR)
	oldDir, _ := v.tree.Lookup("class/net/ib0.8001")
	oldStats, _ := v.tree.Lookup("class/net/ib0.8001/statistics")
	oldEthtool, _ := v.tree.Lookup("class/net/ib0.8001/ethtool")
	write(v.tree, "class/net/ib0/delete_child", "0x8001")
	write(v.tree, "class/net/ib0/create_child", "0x8001")
	if _, err := old.Write([]byte("1\n")); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("write through a descriptor of the deleted child: %v, want ENODEV", err)
	}
	if got, _ := read(v.tree, "class/net/ib0.8001/umcast"); got != "0\n" {
		t.Errorf("the new child's umcast is %q after a write to the old one's", got)
	}
	if _, err := readH(old); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("read through a descriptor of the deleted child: %v", err)
	}
	if cs, err := oldDir.Children(); err != nil || len(cs) != 0 {
		t.Errorf("the deleted child's directory lists %d entries, %v", len(cs), err)
	}
	if _, err := oldDir.Lookup("umcast"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lookup in the deleted child's directory: %v", err)
	}
	for name, d := range map[string]*Node{"statistics": oldStats, "ethtool": oldEthtool} {
		if cs, err := d.Children(); err != nil || len(cs) != 0 {
			t.Errorf("the deleted child's %s lists %d entries, %v", name, len(cs), err)
		}
	}
	if _, err := oldStats.Lookup("rx_bytes"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lookup in the deleted child's statistics: %v", err)
	}

	cur := open("class/net/ib0.8001/umcast", syscall.O_WRONLY)
	dbg := open("kernel/debug/ipoib/ib0.8001_mcg", syscall.O_RDONLY)
	before, _ := v.tree.Lookup("class/net/ib0.8001/umcast")
	oldMcg, _ := v.tree.Lookup("kernel/debug/ipoib/ib0.8001_mcg")
	c, _ := v.e.Interface("ib0.8001")
	if err := v.e.Rename(c, "storage1"); err != nil {
		t.Fatal(err)
	}
	v.log.take()
	if _, err := cur.Write([]byte("1\n")); err != nil {
		t.Errorf("write after a rename: %v", err)
	}
	// The write is logged under the file's name now, and the file keeps its inode
	// number, as a kernfs node does across a rename.
	if lines := v.log.take(); len(lines) != 1 || !strings.HasPrefix(lines[0], "class/net/storage1/umcast: ok;") {
		t.Errorf("the write through the descriptor opened as ib0.8001 logged %q", lines)
	}
	if after, _ := v.tree.Lookup("class/net/storage1/umcast"); after == nil || after.Ino() != before.Ino() {
		t.Errorf("umcast's inode across the rename: %d, then %v", before.Ino(), after)
	}
	if got, _ := read(v.tree, "class/net/storage1/umcast"); got != "1\n" {
		t.Errorf("storage1/umcast %q after a write through the descriptor opened as ib0.8001", got)
	}
	// The driver makes a renamed interface's debugfs files again under the new name:
	// the old one's descriptor reads EIO, as a removed debugfs file does.
	if _, err := readH(dbg); !errors.Is(err, syscall.EIO) {
		t.Errorf("the renamed child's old _mcg descriptor: %v, want EIO", err)
	}
	if _, errno := read(v.tree, "kernel/debug/ipoib/storage1_mcg"); errno != 0 {
		t.Errorf("storage1_mcg: %v", errno)
	}
	// Renamed back, the old file stays removed (the driver made new ones twice).
	if err := v.e.Rename(c, "ib0.8001"); err != nil {
		t.Fatal(err)
	}
	if _, err := readH(dbg); !errors.Is(err, syscall.EIO) {
		t.Errorf("the old _mcg descriptor after renaming back: %v, want EIO", err)
	}
	if n, err := v.tree.Lookup("kernel/debug/ipoib/ib0.8001_mcg"); err != nil || n.Ino() == oldMcg.Ino() {
		t.Errorf("the _mcg made again after renaming back: %v, inode %d as the removed one's", err, oldMcg.Ino())
	} else if _, errno := read(v.tree, "kernel/debug/ipoib/ib0.8001_mcg"); errno != 0 {
		t.Errorf("the _mcg made again after renaming back: %v", errno)
	}
	if err := v.e.Rename(c, "storage1"); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshot: a handle keeps its content across reads at other offsets and refreshes
// at offset 0.
func TestSnapshot(t *testing.T) {
	v := newEnv(t)
	n, _ := v.tree.Lookup("class/net/ib0/mtu")
	h, _ := n.Open(Internal, syscall.O_RDONLY)
	defer h.Release()
	buf := make([]byte, 2)
	k, _ := h.ReadAt(buf, 0)
	first := string(buf[:k])
	if err := v.ib0.SetMTU(1000); err != nil {
		t.Fatal(err)
	}
	k, _ = h.ReadAt(buf, 2)
	if got := first + string(buf[:k]); got != "2044\n"[:4] && got != "4092"[:4] {
		t.Errorf("snapshot broke: %q", got)
	}
	big := make([]byte, 100)
	k, _ = h.ReadAt(big, 0)
	if got := string(big[:k]); got != "1000\n" {
		t.Errorf("read at 0 after change = %q", got)
	}
}

func TestOpenModes(t *testing.T) {
	v := newEnv(t)
	for _, c := range []struct {
		path  string
		flags int
		want  error
	}{
		{"class/net/ib0/create_child", syscall.O_RDONLY, syscall.EACCES},
		{"class/net/ib0/create_child", syscall.O_RDWR, syscall.EACCES},
		{"class/net/ib0/create_child", syscall.O_WRONLY, nil},
		{"class/net/ib0/pkey", syscall.O_WRONLY, syscall.EACCES},
		{"class/net/ib0/mtu", syscall.O_RDWR, nil},
		{"class/net", syscall.O_WRONLY, syscall.EISDIR},
		{"class/net", syscall.O_RDONLY, nil},
	} {
		n, err := v.tree.Lookup(c.path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := n.Open(Internal, c.flags)
		if !errors.Is(err, c.want) && !(err == nil && c.want == nil) {
			t.Errorf("open %s %#x: %v want %v", c.path, c.flags, err, c.want)
		}
		if h != nil {
			h.Release()
		}
	}
	for path, perm := range map[string]uint32{
		"class/net/ib0/create_child": 0200, "class/net/ib0/mtu": 0644, "class/net/ib0/pkey": 0444,
		"class/net": 0755, "module/ib_ipoib/parameters/debug_level": 0644,
		"module/ib_ipoib/parameters/send_queue_size": 0444, "sm/partitions": 0644,
	} {
		n, _ := v.tree.Lookup(path)
		if n.Perm() != perm {
			t.Errorf("%s perm %o want %o", path, n.Perm(), perm)
		}
	}
}

// fabric/ is the SA's answer to this node: the same ports and groups the SM's own
// files list (members aside, which the SA shows only with the SM_Key).
func TestFabricViewMatchesSM(t *testing.T) {
	v := newEnv(t)
	smNodes, _ := read(v.tree, "sm/nodes")
	nodes, errno := read(v.tree, "fabric/nodes")
	if errno != 0 || nodes != smNodes || nodes == "" {
		t.Errorf("fabric/nodes (errno %v):\n%s\nsm/nodes:\n%s", errno, nodes, smNodes)
	}
	smGroups, _ := read(v.tree, "sm/groups")
	var want strings.Builder
	for _, l := range strings.SplitAfter(smGroups, "\n") {
		if !strings.HasPrefix(l, "  members:") && !strings.HasPrefix(l, "    ") {
			want.WriteString(l)
		}
	}
	groups, errno := read(v.tree, "fabric/groups")
	if errno != 0 || groups != want.String() || !strings.Contains(groups, "ff12:401b:ffff:0:0:0:ffff:ffff") {
		t.Errorf("fabric/groups (errno %v):\n%s\nsm/groups without members:\n%s", errno, groups, want.String())
	}
}

// sm/groups lists every member of every group by GID: root's alone, as the SA shows
// members only to requests with the SM_Key; fabric/groups shows anyone the groups.
func TestSMGroupsRootOnly(t *testing.T) {
	v := newEnv(t)
	user := Caller{UID: 1000, GIDs: []uint32{1000}}
	for path, want := range map[string]error{"sm/groups": syscall.EACCES, "fabric/groups": nil} {
		n, err := v.tree.Lookup(path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := n.Open(user, syscall.O_RDONLY)
		if !errors.Is(err, want) || want != nil && err == nil {
			t.Errorf("%s opened by uid 1000: %v, want %v", path, err, want)
		}
		if h != nil {
			h.Release()
		}
	}
	if got, errno := read(v.tree, "sm/groups"); errno != 0 || !strings.Contains(got, "join_state") {
		t.Errorf("sm/groups as root: %q %v", got, errno)
	}
}

// TestLookupAgreesWithListing: every directory answers a lookup of any name exactly
// as its listing holds it (the same node, or ENOENT), whether the lookup builds one
// node or searches the listing, in trees with and without the optional root entries
// and with a child, a bond and its slave; and a directory held past its interface's
// delete finds nothing.
func TestLookupAgreesWithListing(t *testing.T) {
	tr, e, h := newBondEnv(t)
	if e := write(tr, "class/net/ib0/create_child", "0x8001"); e != 0 {
		t.Fatalf("create_child: %v", e)
	}
	ib1, _ := e.Interface("ib1")
	if err := ib1.SetUp(false); err != nil {
		t.Fatal(err)
	}
	for _, w := range [][2]string{{"class/net/bonding_masters", "+bond0\n"}, {"class/net/bond0/bonding/slaves", "+ib1\n"}} {
		if e := write(tr, w[0], w[1]); e != 0 {
			t.Fatalf("write %s: %v", w[0], e)
		}
	}
	// Counters that differ, so a statistics file that reads another's shows.
	ib0, _ := e.Interface("ib0")
	pkt := make([]byte, 28) // IPv4 to 224.0.0.1: a send-only join, then sent
	pkt[0], pkt[3], pkt[8], pkt[9] = 0x45, 28, 1, 1
	copy(pkt[12:], []byte{10, 0, 0, 1, 224, 0, 0, 1})
	ib0.Transmit([][]byte{pkt, {0x45}}) // and a runt, dropped
	waitFor(t, "distinct counters", func() bool {
		seen := map[uint64]bool{}
		for _, v := range ib0.Stats().Values() {
			seen[v] = true
		}
		return len(seen) >= 3
	})
	full := New(e, Options{SM: h.SM(), Bonds: tr.bonds, Events: NewEventLog(), Reload: func() error { return nil }})
	trees := []*Tree{tr, full, New(e, Options{})}
	all := map[string]bool{"nope": true, ".hidden": true}
	for _, x := range trees {
		walkDirs(t, x, all)
	}
	for _, x := range trees {
		checkLookups(t, x, all)
	}
	if got := names(t, full, ""); !slices.Contains(got, "events") || !slices.Contains(got, "reload") {
		t.Errorf("root with events and reload lists %v", got)
	}

	child, _ := tr.Lookup("class/net/ib0.8001")
	stats, _ := tr.Lookup("class/net/ib0.8001/statistics")
	if e := write(tr, "class/net/ib0/delete_child", "0x8001"); e != 0 {
		t.Fatalf("delete_child: %v", e)
	}
	for _, c := range []struct {
		d    *Node
		name string
	}{{child, "pkey"}, {child, "statistics"}, {stats, "rx_packets"}} {
		if n, err := c.d.Lookup(c.name); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("lookup %s in %s after delete: found %v (err %v); want ENOENT", c.name, c.d.Path(), n != nil, err)
		}
	}
}

// walkDirs returns every directory of tr and adds every name in it to names.
func walkDirs(t *testing.T, tr *Tree, names map[string]bool) []*Node {
	t.Helper()
	var dirs []*Node
	var walk func(n *Node)
	walk = func(n *Node) {
		dirs = append(dirs, n)
		cs, err := n.Children()
		if err != nil {
			t.Fatalf("list %s: %v", n.Path(), err)
		}
		for _, c := range cs {
			names[c.Name()] = true
			if c.IsDir() {
				walk(c)
			}
		}
	}
	walk(tr.Root())
	return dirs
}

// checkLookups looks up each of names in every directory of tr: what the listing does
// not hold is ENOENT, what it holds is the same node, and a readable file reads the
// same through both.
func checkLookups(t *testing.T, tr *Tree, names map[string]bool) {
	t.Helper()
	type shape struct {
		Path                      string
		Ino                       uint64
		Perm                      uint32
		Dir, Admin, Parse, RD, WR bool
		Stream                    bool
	}
	of := func(n *Node) shape {
		return shape{n.Path(), n.Ino(), n.perm, n.dir, n.netAdmin, n.parseFirst != nil, n.read != nil, n.write != nil, n.stream != nil}
	}
	for _, d := range walkDirs(t, tr, map[string]bool{}) {
		cs, _ := d.Children()
		listed := map[string]*Node{}
		for _, c := range cs {
			listed[c.Name()] = c
		}
		for name := range names {
			got, err := d.Lookup(name)
			want, ok := listed[name]
			if !ok {
				if !errors.Is(err, syscall.ENOENT) {
					t.Errorf("lookup %s in %q: found %v (err %v); want ENOENT (not listed)", name, d.Path(), got != nil, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("lookup %s in %q: %v; it is listed", name, d.Path(), err)
				continue
			}
			if diff := cmp.Diff(of(want), of(got)); diff != "" {
				t.Errorf("lookup %s in %q differs from its listing (-listed +looked up):\n%s", name, d.Path(), diff)
				continue
			}
			if want.dir {
				if a, b := childNames(want), childNames(got); !slices.Equal(a, b) {
					t.Errorf("%s lists %v, looked up %v", want.Path(), a, b)
				}
				continue
			}
			if want.read == nil || want.stream != nil {
				continue
			}
			// A value may move between two reads (a counter): it must agree within a few.
			var a, b string
			for range 3 {
				a, b = readNode(want), readNode(got)
				if a == b {
					break
				}
			}
			if a != b {
				t.Errorf("%s reads %q listed, %q looked up", want.Path(), a, b)
			}
		}
	}
}

func childNames(n *Node) []string {
	cs, err := n.Children()
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	for _, c := range cs {
		out = append(out, c.Name())
	}
	return out
}

// readNode reads a whole file, or says which error it got.
func readNode(n *Node) string {
	h, err := n.Open(Internal, syscall.O_RDONLY)
	if err != nil {
		return "open: " + err.Error()
	}
	defer h.Release()
	var out []byte
	buf := make([]byte, 4096)
	for {
		k, err := h.ReadAt(buf, int64(len(out)))
		if err != nil {
			return "read: " + err.Error()
		}
		if k == 0 {
			return string(out)
		}
		out = append(out, buf[:k]...)
	}
}
