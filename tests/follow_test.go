package tests

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"ipoibfs/internal/testenv"

	"golang.org/x/sys/unix"
)

// The engine follows its kernel devices as the driver does: ip link set mtu/down/up/del
// on a parent and a child, with the tree, ib0_mcg, the link-local address and carrier
// checked after each.
func TestFollowLinkChanges(t *testing.T) {
	td := treeStart(t, "fl", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	read, until := followHelpers(t, td)
	devMTU := func(dev string) string {
		_, rest, _ := strings.Cut(ipOut(t, ns, "link", "show", dev), " mtu ")
		mtu, _, _ := strings.Cut(rest, " ")
		return mtu
	}
	ll := linkLocal(t, ns, "ib0")
	lls := func() []string {
		var out []string
		for _, f := range strings.Fields(ipOut(t, ns, "-6", "addr", "show", "dev", "ib0", "scope", "link")) {
			if strings.HasPrefix(f, "fe80::") {
				out = append(out, strings.Split(f, "/")[0])
			}
		}
		return out
	}
	onlyGUIDLinkLocal := func() bool { l := lls(); return len(l) == 1 && l[0] == ll }
	sn := solicitedMGID(t, ll)
	if !strings.Contains(read("kernel/debug/ipoib/ib0_mcg"), "GID: ff12:401b:ffff:0:0:0:0:1\n") {
		t.Errorf("a fresh ib0 has not joined the IPv4 all-hosts group:\n%s", read("kernel/debug/ipoib/ib0_mcg"))
	}

	// ethtool: the port's rate as the speed; -K is read back into the tree.
	ethtool := testenv.Tool(t, "ethtool")
	if out, _ := run(t, 10*time.Second, "ip", "netns", "exec", ns, ethtool, "ib0"); !strings.Contains(out, "Speed: 40000Mb/s") {
		t.Errorf("ethtool ib0 on a 4X QDR port:\n%s", out)
	}
	mustRun(t, "ip", "netns", "exec", ns, ethtool, "-K", "ib0", "tso", "off")
	until("tso off in ethtool/features", func() bool {
		return strings.Contains(read("class/net/ib0/ethtool/features"), "tcp-segmentation-offload: off")
	})
	mustRun(t, "ip", "netns", "exec", ns, ethtool, "-K", "ib0", "tso", "on")
	until("tso on in ethtool/features", func() bool {
		return strings.Contains(read("class/net/ib0/ethtool/features"), "tcp-segmentation-offload: on")
	})
	// And the other way: the tree's write reaches the device.
	if err := os.WriteFile(td.path("class/net/ib0/ethtool/features"), []byte("tso off\n"), 0); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, 10*time.Second, "ip", "netns", "exec", ns, ethtool, "-k", "ib0"); !strings.Contains(out, "tcp-segmentation-offload: off") {
		t.Errorf("ethtool -k after writing tso off to the tree:\n%s", out)
	}
	if err := os.WriteFile(td.path("class/net/ib0/ethtool/features"), []byte("tso on\n"), 0); err != nil {
		t.Fatal(err)
	}
	// rx and tx checksumming are separate: tx off on the device leaves the engine's rx
	// switch on (the TUN's own is fixed off) and takes TSO with it.
	mustRun(t, "ip", "netns", "exec", ns, ethtool, "-K", "ib0", "tx", "off")
	until("tx off in ethtool/features", func() bool {
		return strings.HasPrefix(read("class/net/ib0/ethtool/features"), "rx-checksumming: on\ntx-checksumming: off\ntcp-segmentation-offload: off")
	})
	mustRun(t, "ip", "netns", "exec", ns, ethtool, "-K", "ib0", "tx", "on", "tso", "on")
	until("tx and tso on in ethtool/features", func() bool {
		return strings.Contains(read("class/net/ib0/ethtool/features"), "tx-checksumming: on\ntcp-segmentation-offload: on")
	})
	// rx off in the tree turns receive coalescing off, on the device too.
	if err := os.WriteFile(td.path("class/net/ib0/ethtool/features"), []byte("rx off\n"), 0); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, 10*time.Second, "ip", "netns", "exec", ns, ethtool, "-k", "ib0"); !strings.Contains(out, "generic-receive-offload: off") ||
		!strings.Contains(out, "tx-checksumming: on") {
		t.Errorf("ethtool -k after writing rx off to the tree:\n%s", out)
	}
	if got := read("class/net/ib0/ethtool/features"); !strings.Contains(got, "rx-checksumming: off\ntx-checksumming: on\ntcp-segmentation-offload: on\ngeneric-receive-offload: off [requested on]") {
		t.Errorf("features after rx off: %q", got)
	}
	if err := os.WriteFile(td.path("class/net/ib0/ethtool/features"), []byte("rx on\n"), 0); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, 10*time.Second, "ip", "netns", "exec", ns, ethtool, "-k", "ib0"); !strings.Contains(out, "generic-receive-offload: on") {
		t.Errorf("ethtool -k after rx on:\n%s", out)
	}

	// The transmit queue length: 1000 as an IPoIB netdev's, and the same both ways.
	if out := ipOut(t, ns, "link", "show", "ib0"); !strings.Contains(out, "qlen 1000") {
		t.Errorf("ib0's device: %s, want qlen 1000", out)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "txqueuelen", "2000")
	until("tree tx_queue_len 2000", func() bool { return read("class/net/ib0/tx_queue_len") == "2000" })
	if err := os.WriteFile(td.path("class/net/ib0/tx_queue_len"), []byte("1000\n"), 0); err != nil {
		t.Fatal(err)
	}
	if out := ipOut(t, ns, "link", "show", "ib0"); !strings.Contains(out, "qlen 1000") {
		t.Errorf("after writing tx_queue_len 1000: %s", out)
	}

	// MTU: a value the driver refuses (above the port's 4092 in datagram mode) is put
	// back at once; an allowed one is adopted; an MTU dip below 1280 and back leaves the
	// GUID-derived link-local and its solicited-node group, nothing random.
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "mtu", "9000")
	until("the refused MTU 9000 put back to 2044", func() bool { return devMTU("ib0") == "2044" })
	if got := read("class/net/ib0/mtu"); got != "2044" {
		t.Errorf("tree mtu after a refused ip link set mtu 9000: %s", got)
	}
	if !strings.Contains(td.log.String(), "MTU 9000 set on the device refused") {
		t.Errorf("the log does not say the MTU was refused:\n%s", td.log)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "mtu", "1500")
	until("tree mtu 1500", func() bool { return read("class/net/ib0/mtu") == "1500" })
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "mtu", "1000")
	until("tree mtu 1000", func() bool { return read("class/net/ib0/mtu") == "1000" })
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "mtu", "2044")
	until("tree mtu 2044", func() bool { return read("class/net/ib0/mtu") == "2044" })
	until("only the GUID link-local "+ll+" after the MTU dip", onlyGUIDLinkLocal)
	until("the solicited-node group of "+ll, func() bool { return strings.Contains(read("kernel/debug/ipoib/ib0_mcg"), sn) })

	// A child is created down, as the driver registers it, and comes up with ip link.
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitTUN(t, ns, "ib0.8001")
	if out := ipOut(t, ns, "link", "show", "ib0.8001"); strings.Contains(out, "<UP") || strings.Contains(out, ",UP") {
		t.Errorf("a new child's device is up: %s", out)
	}
	if got := read("class/net/ib0.8001/operstate"); got != "down" {
		t.Errorf("a new child's operstate: %s, want down", got)
	}
	// Renames: the tree and the debug files follow the device's name, both ways.
	gone := func(p string) func() bool {
		return func() bool { _, err := os.Stat(td.path(p)); return os.IsNotExist(err) }
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "name", "ibx")
	until("class/net/ibx", func() bool { return read("class/net/ibx/pkey") == "0x8001" })
	until("class/net/ib0.8001 gone", gone("class/net/ib0.8001"))
	if _, err := os.Stat(td.path("kernel/debug/ipoib/ibx_mcg")); err != nil {
		t.Errorf("after the rename: %v", err)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ibx", "name", "ib0.8001")
	until("class/net/ib0.8001 back", func() bool { return read("class/net/ib0.8001/pkey") == "0x8001" })
	until("class/net/ibx gone", gone("class/net/ibx"))

	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "up")
	until("ib0.8001 up in the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x1003" })
	// IFF_MULTICAST both ways: ip link set multicast off shows in the tree's flags, and
	// a flags write reaches the device.
	mcast := func(dev string) bool {
		out := ipOut(t, ns, "link", "show", dev)
		return strings.Contains(out, "<MULTICAST") || strings.Contains(out, ",MULTICAST")
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "multicast", "off")
	until("multicast off in the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x3" })
	if mcast("ib0.8001") {
		t.Errorf("the device's multicast off was put back: %s", ipOut(t, ns, "link", "show", "ib0.8001"))
	}
	if err := os.WriteFile(td.path("class/net/ib0.8001/flags"), []byte("0x1003\n"), 0); err != nil {
		t.Fatal(err)
	}
	until("multicast on the device after the flags write", func() bool { return mcast("ib0.8001") })
	// IFF_PROMISC and IFF_ALLMULTI both ways too (ip link set promisc/allmulticast);
	// DEBUG and NOARP are kept as written, as a netdev keeps them.
	devFlag := func(dev, flag string) bool {
		out := ipOut(t, ns, "link", "show", dev)
		return strings.Contains(out, "<"+flag) || strings.Contains(out, ","+flag)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "promisc", "on")
	until("promisc in the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x1103" })
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "allmulticast", "on")
	until("allmulti in the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x1303" })
	if err := os.WriteFile(td.path("class/net/ib0.8001/flags"), []byte("0x1087\n"), 0); err != nil {
		t.Fatal(err)
	}
	if got := read("class/net/ib0.8001/flags"); got != "0x1087" {
		t.Errorf("flags after writing 0x1087: %s", got)
	}
	until("promisc and allmulti off on the device after the flags write", func() bool {
		return !devFlag("ib0.8001", "PROMISC") && !devFlag("ib0.8001", "ALLMULTI")
	})
	if err := os.WriteFile(td.path("class/net/ib0.8001/flags"), []byte("0x1103\n"), 0); err != nil {
		t.Fatal(err)
	}
	until("promisc on the device after the flags write", func() bool { return devFlag("ib0.8001", "PROMISC") })
	if got := read("class/net/ib0.8001/flags"); got != "0x1103" {
		t.Errorf("flags after writing 0x1103: %s", got)
	}
	// The device's promiscuity count includes the user's own flag: a write taking it
	// off reads back at once, the count not yet seen notwithstanding.
	if err := os.WriteFile(td.path("class/net/ib0.8001/flags"), []byte("0x1003\n"), 0); err != nil {
		t.Fatal(err)
	}
	if got := read("class/net/ib0.8001/flags"); got != "0x1003" {
		t.Errorf("flags right after writing 0x1003: %s", got)
	}
	until("promisc off on the device after the flags write", func() bool { return !devFlag("ib0.8001", "PROMISC") })
	if err := os.WriteFile(td.path("class/net/ib0.8001/flags"), []byte("0x1103\n"), 0); err != nil {
		t.Fatal(err)
	}
	until("promisc on the device again", func() bool { return devFlag("ib0.8001", "PROMISC") })
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "promisc", "off")
	until("promisc off in the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x1003" })
	// A packet socket's promiscuity (tcpdump's) is not the user's flag, but dev->flags
	// has IFF_PROMISC while it lasts, and so does the tree's flags, as sysfs's.
	idx, err := strconv.Atoi(read("class/net/ib0.8001/ifindex"))
	if err != nil {
		t.Fatal(err)
	}
	ps := promiscSocket(t, ns, idx)
	until("a packet socket's promiscuity in the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x1103" })
	if devFlag("ib0.8001", "PROMISC") {
		t.Errorf("the packet socket's promiscuity shows as the user's in ip link: %s", ipOut(t, ns, "link", "show", "ib0.8001"))
	}
	unix.Close(ps)
	until("the packet socket's promiscuity gone from the tree", func() bool { return read("class/net/ib0.8001/flags") == "0x1003" })

	// Down: groups left, carrier off, the child follows; up: all back, same link-local.
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "down")
	until("ib0 down in the tree", func() bool { return read("class/net/ib0/operstate") == "down" })
	until("ib0.8001 down with its parent", func() bool { return read("class/net/ib0.8001/flags") == "0x1002" })
	until("ib0's groups left", func() bool { return !strings.Contains(read("kernel/debug/ipoib/ib0_mcg"), "GID:") })
	if out := ipOut(t, ns, "link", "show", "ib0.8001"); strings.Contains(out, "<UP") || strings.Contains(out, ",UP") {
		t.Errorf("ib0.8001's device still up after ib0 went down: %s", out)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "up")
	waitLink(t, ns, "ib0")
	until("ib0 up in the tree", func() bool { return read("class/net/ib0/operstate") == "up" && read("class/net/ib0/carrier") == "1" })
	until("ib0.8001 up with its parent", func() bool { return read("class/net/ib0.8001/flags") == "0x1003" })
	until("the GUID link-local back after up", onlyGUIDLinkLocal)
	until("the groups rejoined", func() bool {
		m := read("kernel/debug/ipoib/ib0_mcg")
		return strings.Contains(m, "ff12:401b:ffff:0:0:0:ffff:ffff") && strings.Contains(m, sn)
	})

	// ip link del of a child deletes the child; of ib0, the device is made again.
	mustRun(t, "ip", "-n", ns, "link", "del", "ib0.8001")
	until("ib0.8001 gone from the tree", func() bool {
		_, err := os.Stat(td.path("class/net/ib0.8001"))
		return os.IsNotExist(err)
	})
	mustRun(t, "ip", "-n", ns, "link", "del", "ib0")
	waitLink(t, ns, "ib0")
	until("ib0 in the tree and up after its device was made again", func() bool { return read("class/net/ib0/operstate") == "up" })
	until("the GUID link-local on the new device", onlyGUIDLinkLocal)
}

// A multicast receiver on node B gets IPv4 and IPv6 datagrams sent to its groups from
// node A; B's ib0_mcg lists the groups while joined and not after the sockets close.
func TestFollowMulticastGroups(t *testing.T) {
	requireE2E(t)
	mntB := treeMountDir(t)
	treeNoMountAt(t, mntB)
	nsA, nsB := netns(t, "fma"), netns(t, "fmb")
	startDaemon(t, "fma", "-sm", "127.0.1.91:4791", "-netns", nsA)
	startDaemon(t, "fmb", "-fabric", "127.0.1.91:4791", "-listen", "127.0.1.92:4791", "-netns", nsB, "-mount", mntB)
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	mustRun(t, "ip", "-n", nsA, "addr", "add", "10.64.0.1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.64.0.2/24", "dev", "ib0")
	mcg := func() string { b, _ := os.ReadFile(mntB + "/kernel/debug/ipoib/ib0_mcg"); return string(b) }

	for _, tc := range []struct {
		group, mgid, src string
	}{
		{"239.1.2.3", "ff12:401b:ffff:0:0:0:f01:203", "10.64.0.1"},
		{"ff05::1:3", "ff12:601b:ffff:0:0:0:1:3", ""},
	} {
		g := netip.MustParseAddr(tc.group)
		rx := testenv.InNetns(t, nsB, func() (int, error) { return mcastReceiver(g, 5000) })
		waitUntil(t, tc.group+" in b's ib0_mcg", func() bool { return strings.Contains(mcg(), "GID: "+tc.mgid+"\n") })
		tx := testenv.InNetns(t, nsA, func() (int, error) { return mcastSender(g) })
		got := false
		buf := make([]byte, 64)
		for try := 0; try < 50 && !got; try++ {
			var dst unix.Sockaddr = &unix.SockaddrInet6{Port: 5000, Addr: g.As16()}
			if g.Is4() {
				dst = &unix.SockaddrInet4{Port: 5000, Addr: g.As4()}
			}
			if err := unix.Sendto(tx, []byte("to "+tc.group), 0, dst); err != nil {
				t.Fatalf("send to %s: %v", tc.group, err)
			}
			// The first datagrams may wait for a's send-only join.
			_ = unix.SetsockoptTimeval(rx, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
			if n, _, err := unix.Recvfrom(rx, buf, 0); err == nil && string(buf[:n]) == "to "+tc.group {
				got = true
			}
		}
		if !got {
			t.Errorf("b never received a datagram sent to %s", tc.group)
		}
		unix.Close(tx)
		unix.Close(rx) // the kernel leaves the group and reports it
		waitUntil(t, tc.group+" gone from b's ib0_mcg", func() bool { return !strings.Contains(mcg(), "GID: "+tc.mgid+"\n") })
	}
}

// mcastReceiver is a UDP socket bound to port and joined to group on ib0.
func mcastReceiver(group netip.Addr, port int) (int, error) {
	ifi, err := ifIndex("ib0")
	if err != nil {
		return -1, err
	}
	if group.Is4() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			unix.Close(fd)
			return -1, err
		}
		mreq := &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifi)}
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mreq); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet6{Port: port}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	mreq := &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifi)}
	if err := unix.SetsockoptIPv6Mreq(fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, mreq); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// mcastSender is a UDP socket that sends multicast out of ib0.
func mcastSender(group netip.Addr) (int, error) {
	ifi, err := ifIndex("ib0")
	if err != nil {
		return -1, err
	}
	if group.Is4() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		return fd, unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifi)})
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	return fd, unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifi)
}

// ifIndex reads an interface's index in the calling thread's namespace.
func ifIndex(name string) (int, error) {
	b, err := os.ReadFile("/proc/thread-self/net/dev_snmp6/" + name)
	if err != nil {
		return -1, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "ifIndex" {
			var n int
			for _, c := range f[1] {
				n = n*10 + int(c-'0')
			}
			return n, nil
		}
	}
	return -1, os.ErrNotExist
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	waitShowing(t, what, ok, func() string { return "" })
}

// waitShowing is waitUntil with what detail says added to a failure.
func waitShowing(t *testing.T, what string, ok func() bool, detail func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s%s", what, detail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ipOut(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, _ := run(t, 10*time.Second, "ip", append([]string{"-n", ns}, args...)...)
	return out
}

// solicitedMGID is the ib0_mcg GID line of a link-local address's solicited-node group
// on the default P_Key.
func solicitedMGID(t *testing.T, ll string) string {
	a := netip.MustParseAddr(ll).As16()
	return fmt.Sprintf("GID: ff12:601b:ffff:0:0:1:ff%02x:%x\n", a[13], uint16(a[14])<<8|uint16(a[15]))
}

// create_child makes the child's device before it returns and delete_child removes it
// before it returns; a device name taken in the namespace fails the write with EEXIST
// and leaves nothing behind (the other device included).
func TestFollowChildDeviceInStep(t *testing.T) {
	td := treeStart(t, "fs", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	exists := func(dev string) bool {
		_, err := run(t, 10*time.Second, "ip", "-n", ns, "link", "show", dev)
		return err == nil
	}
	// Someone else's device of that name: a persistent TUN made with ip tuntap.
	mustRun(t, "ip", "-n", ns, "tuntap", "add", "dev", "ib0.8002", "mode", "tun")
	err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8002\n"), 0)
	if treeErrno(err) != unix.EEXIST {
		t.Errorf("create_child with the device name taken: %v, want EEXIST", err)
	}
	if _, err := os.Stat(td.path("class/net/ib0.8002")); !os.IsNotExist(err) {
		t.Errorf("class/net/ib0.8002 after the failed create: %v", err)
	}
	if out := ipOut(t, ns, "-d", "link", "show", "ib0.8002"); !strings.Contains(out, "persist on") {
		t.Errorf("the other device was touched: %s", out)
	}
	mustRun(t, "ip", "-n", ns, "link", "del", "ib0.8002")
	for round := range 5 {
		if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8002\n"), 0); err != nil {
			t.Fatalf("round %d: create_child: %v", round, err)
		}
		if !exists("ib0.8002") {
			t.Fatalf("round %d: no ib0.8002 device when create_child returned", round)
		}
		if err := os.WriteFile(td.path("class/net/ib0/delete_child"), []byte("0x8002\n"), 0); err != nil {
			t.Fatalf("round %d: delete_child: %v", round, err)
		}
		if exists("ib0.8002") {
			t.Fatalf("round %d: ib0.8002 device still there when delete_child returned", round)
		}
	}
}

// ifindex and iflink are the kernel devices' indexes: a child's iflink is its parent.
func TestFollowIfIndex(t *testing.T) {
	td := treeStart(t, "ix", "")
	waitLink(t, td.ns, "ib0")
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	index := func(dev string) string {
		out := ipOut(t, td.ns, "-o", "link", "show", dev)
		n, _, _ := strings.Cut(out, ":")
		return strings.TrimSpace(n)
	}
	read := func(p string) string { b, _ := os.ReadFile(td.path(p)); return strings.TrimSpace(string(b)) }
	ib0, kid := index("ib0"), index("ib0.8001")
	if ib0 == "" || kid == "" || ib0 == kid {
		t.Fatalf("indexes %q %q", ib0, kid)
	}
	for p, want := range map[string]string{
		"class/net/ib0/ifindex": ib0, "class/net/ib0/iflink": ib0,
		"class/net/ib0.8001/ifindex": kid, "class/net/ib0.8001/iflink": ib0,
	} {
		if got := read(p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}

// Changes made on the device in quick succession end as the last one says, on both
// sides: the engine adopts each as it sees it and never pushes a value it adopted
// back to the device (a newer change may have replaced it there: ip link set down
// then up left the interface down, the engine's "down" arriving after the "up").
func TestFollowQuickSuccession(t *testing.T) {
	td := treeStart(t, "fq", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	read, _ := followHelpers(t, td)
	settled := func(what string, ok func() bool) {
		t.Helper()
		// Settled: true for 200 ms running (a late push back would show in that time).
		since := time.Time{}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			switch {
			case !ok():
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			case time.Since(since) > 200*time.Millisecond:
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never settled\nip link: %s\nlog:\n%s", what, ipOut(t, ns, "link", "show", "ib0"), td.log)
			}
		}
	}
	for round := 0; round < 10; round++ {
		batch := exec.Command("ip", "-n", ns, "-batch", "-")
		batch.Stdin = strings.NewReader("link set ib0 down\nlink set ib0 up\nlink set ib0 mtu 1500\nlink set ib0 mtu 1800\n")
		if out, err := batch.CombinedOutput(); err != nil {
			t.Fatalf("ip -batch: %v %s", err, out)
		}
		settled(fmt.Sprintf("round %d: ib0 up with MTU 1800 on the device and in the tree", round), func() bool {
			link := ipOut(t, ns, "link", "show", "ib0")
			return strings.Contains(link, ",UP") && strings.Contains(link, " mtu 1800 ") &&
				read("class/net/ib0/operstate") == "up" && read("class/net/ib0/mtu") == "1800"
		})
	}
}

// The carrier is the engine's: `ip link set ib0 carrier off` (which an IPoIB netdev
// refuses and a TUN takes) is put back at once, and a device made again after `ip
// link del ib0` reports operstate up as the first one did (its carrier goes from off
// to on, which the kernel needs to leave "unknown").
func TestFollowCarrierIsTheEngines(t *testing.T) {
	td := treeStart(t, "fc", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	operstate := func() string {
		out, _ := run(t, 10*time.Second, "ip", "netns", "exec", ns, "cat", "/sys/class/net/ib0/operstate")
		return strings.TrimSpace(out)
	}
	_, until := followHelpers(t, td)
	until("operstate up on a fresh device", func() bool { return operstate() == "up" })
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "carrier", "off")
	until("the carrier put back", func() bool {
		return strings.Contains(ipOut(t, ns, "link", "show", "ib0"), "LOWER_UP") && operstate() == "up"
	})
	if !strings.Contains(td.log.String(), "ib0: carrier changed outside ipoibfs, put back to true") {
		t.Errorf("the put-back is not logged:\n%s", td.log)
	}
	old := ipOut(t, ns, "link", "show", "ib0")
	mustRun(t, "ip", "-n", ns, "link", "del", "ib0")
	until("ib0 made again, up, with operstate up", func() bool {
		l := ipOut(t, ns, "link", "show", "ib0")
		return l != old && strings.Contains(l, "LOWER_UP") && operstate() == "up"
	})
}

// followHelpers returns read, a tree file's content ("" for a file that does not
// exist, yet or any more), and until, which polls ok for up to 10 s and fails showing
// ip link and the log: the waits poll until the tree has followed the device.
func followHelpers(t *testing.T, td *treeDaemon) (read func(p string) string, until func(what string, ok func() bool)) {
	read = func(p string) string {
		b, _ := os.ReadFile(td.path(p))
		return strings.TrimSpace(string(b))
	}
	until = func(what string, ok func() bool) {
		t.Helper()
		waitShowing(t, what, ok, func() string {
			return fmt.Sprintf("\nip link: %s\nlog:\n%s", ipOut(t, td.ns, "link", "show"), td.log)
		})
	}
	return read, until
}

// ib0's device deleted while the daemon cannot make it again (here: out of file
// descriptors, its limit lowered from outside): the daemon keeps trying, and once it
// can, ib0 has its device back, up, with the tree's ifindex naming it. (Taking the
// name instead cannot be timed: ip link del of the TUN returns only after the daemon
// has let go of the old device, and by then it has made the new one.)
func TestFollowPortDeviceMadeAgainOnceItCan(t *testing.T) {
	td := treeStart(t, "fr", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	read, until := followHelpers(t, td)
	pid := td.cmd.Process.Pid
	var limit unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &limit); err != nil {
		t.Fatal(err)
	}
	// No new descriptor above stderr: the TUN's open fails with EMFILE.
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 3, Max: limit.Max}, nil); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "ip", "-n", ns, "link", "del", "ib0")
	until("the daemon's failed try", func() bool { return strings.Contains(td.log.String(), "trying again") })
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &limit, nil); err != nil {
		t.Fatal(err)
	}
	until("ib0's device made again", func() bool { return strings.Contains(td.log.String(), "ib0: device made again") })
	waitLink(t, ns, "ib0")
	until("ib0 up in the tree", func() bool { return read("class/net/ib0/operstate") == "up" })
	idx := strings.SplitN(ipOut(t, ns, "-o", "link", "show", "ib0"), ":", 2)[0]
	if got := read("class/net/ib0/ifindex"); got != idx {
		t.Errorf("class/net/ib0/ifindex = %q, the device's index is %s", got, idx)
	}
}

// `ip netns del` of the daemon's namespace is said when it happens, in the daemon's
// log, not first at the next create_child, which then fails with ENODEV and makes no
// child.
func TestNamespaceDeletedIsSaid(t *testing.T) {
	requireE2E(t)
	mnt := treeMountDir(t)
	treeNoMountAt(t, mnt)
	ns := netns(t, "nsd")
	d := startDaemon(t, "nsd", "-sm", "127.0.1.105:4791", "-netns", ns, "-mount", mnt)
	waitLink(t, ns, "ib0")
	waitTree(t, mnt)
	mustRun(t, "ip", "netns", "del", ns)
	said := fmt.Sprintf("network namespace %s was deleted (ip netns del)", ns)
	waitUntil(t, "the deletion in the daemon's log", func() bool { return strings.Contains(d.log.String(), said) })
	err := os.WriteFile(mnt+"/class/net/ib0/create_child", []byte("0x8005\n"), 0)
	if !errors.Is(err, unix.ENODEV) {
		t.Fatalf("create_child after the namespace was deleted: %v, want ENODEV", err)
	}
	if _, err := os.Stat(mnt + "/class/net/ib0.8005"); err == nil {
		t.Fatalf("ib0.8005 made in a deleted namespace")
	}
}

// promiscSocket opens a packet socket in namespace ns that makes the device with
// index idx promiscuous while it is open, as tcpdump does.
func promiscSocket(t *testing.T, ns string, idx int) int {
	t.Helper()
	return testenv.InNetns(t, ns, func() (int, error) {
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return -1, err
		}
		mr := unix.PacketMreq{Ifindex: int32(idx), Type: unix.PACKET_MR_PROMISC}
		if err := unix.SetsockoptPacketMreq(s, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mr); err != nil {
			unix.Close(s)
			return -1, err
		}
		return s, nil
	})
}

// A child's device someone moves to another network namespace (ip link set netns) is
// put back where the daemon made it, said in the log; the child stays, in the tree
// and the engine, instead of being taken for deleted (and its moved device with it).
func TestMovedDeviceIsPutBack(t *testing.T) {
	td := treeStart(t, "mv", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	other := fmt.Sprintf("ipoibfs-mv%d", os.Getpid())
	mustRun(t, "ip", "netns", "add", other)
	t.Cleanup(func() { _, _ = run(t, 10*time.Second, "ip", "netns", "del", other) })
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "up")
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "netns", other)
	waitUntil(t, "the put-back said in the log", func() bool {
		return strings.Contains(td.log.String(), "ib0.8001: moved to another network namespace outside ipoibfs (ip link set netns): put back")
	})
	if out := ipOut(t, ns, "link", "show", "ib0.8001"); !strings.Contains(strings.SplitN(out, ">", 2)[0], ",UP") {
		t.Errorf("ib0.8001 back, but not up: %s", out)
	}
	if _, err := run(t, 10*time.Second, "ip", "-n", other, "link", "show", "ib0.8001"); err == nil {
		t.Error("ib0.8001 still in the other namespace")
	}
	// The move took the device's addresses; its GUID-derived link-local comes back.
	waitUntil(t, "ib0.8001's link-local address back", func() bool {
		return strings.Contains(ipOut(t, ns, "-6", "addr", "show", "dev", "ib0.8001"), "inet6 fe80::")
	})
	if got := readTrim(t, td.path("class/net/ib0.8001/pkey")); got != "0x8001" {
		t.Errorf("class/net/ib0.8001/pkey after the move: %q", got)
	}
	if strings.Contains(td.log.String(), "ib0.8001: device deleted") {
		t.Errorf("the move was taken for a deletion:\n%s", td.log.String())
	}
}

// The tree's class/net files that describe the device read the same as the kernel's
// sysfs for the TUN device that stands for it (in its namespace, as `ip netns exec`
// mounts it), before and after changes made with ip and through the tree: MTU,
// txqueuelen, index, carrier, operstate, link settings and alias. ib0 has carrier; the
// child, whose P_Key is not in the port's table, is up without.
func TestTreeAgreesWithSysfs(t *testing.T) {
	td := treeStart(t, "agree", "")
	ns := td.ns
	waitLink(t, ns, "ib0")
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "up")
	files := []string{"mtu", "tx_queue_len", "ifindex", "carrier", "operstate", "speed", "duplex", "ifalias", "dormant",
		"carrier_up_count", "carrier_down_count", "carrier_changes"}
	agree := func(when string) { t.Helper(); sysfsAgree(t, td, when, files, "ib0", "ib0.8001") }
	agree("at start")
	if got := readTrim(t, td.path("class/net/ib0.8001/speed")); got != "-1" {
		t.Fatalf("the child without carrier has speed %q", got)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0", "mtu", "1500", "txqueuelen", "700", "alias", "set by ip")
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "alias", "child")
	agree("after ip link set")
	for f, v := range map[string]string{"class/net/ib0/mtu": "2000\n", "class/net/ib0/tx_queue_len": "900\n", "class/net/ib0/ifalias": "set in the tree\n"} {
		if err := os.WriteFile(td.path(f), []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	agree("after writes to the tree")
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "down")
	agree("with the child down")
	// An alias set with ip on a device that is down is not announced (the kernel's
	// netdev_state_change): ifalias reads it from the device all the same, and a
	// write of the alias the engine had before still puts it on the device, as every
	// ifalias write sets it.
	mustRun(t, "ip", "-n", ns, "link", "set", "ib0.8001", "alias", "unseen")
	agree("after ip link set alias on the child down")
	if err := os.WriteFile(td.path("class/net/ib0.8001/ifalias"), []byte("child\n"), 0); err != nil {
		t.Fatal(err)
	}
	agree("after the same alias written again")
}

// sysfsAgree waits up to 10 s for each of devs' files to read the same in the tree as
// in the kernel's sysfs for its device (content, or failing both), and fails the test
// with the differences otherwise.
func sysfsAgree(t *testing.T, td *treeDaemon, when string, files []string, devs ...string) {
	t.Helper()
	differ := func(dev string) []string {
		var out []string
		for _, f := range files {
			tree, terr := os.ReadFile(td.path("class/net/" + dev + "/" + f))
			sys, serr := run(t, 10*time.Second, "ip", "netns", "exec", td.ns, "cat", "/sys/class/net/"+dev+"/"+f)
			if (terr == nil) != (serr == nil) || terr == nil && string(tree) != sys {
				out = append(out, fmt.Sprintf("%s: tree %q %v, sysfs %q %v", f, tree, terr, sys, serr))
			}
		}
		return out
	}
	for _, dev := range devs {
		var last []string
		ok := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if last = differ(dev); len(last) == 0 {
				ok = true
				break
			}
		}
		if !ok {
			t.Fatalf("%s, %s: the tree and sysfs differ:\n%s", when, dev, strings.Join(last, "\n"))
		}
	}
}

// A bond's files agree with its device's sysfs as an interface's do: the link settings
// are the active slave's, and follow a failover; the alias goes both ways.
func TestBondAgreesWithSysfs(t *testing.T) {
	td := treeStart(t, "bagree", "", "-ports", "2", "-bonding")
	ns := td.ns
	waitLink(t, ns, "ib1")
	// miimon 0: no monitor rounds; a slave's carrier that comes after the bond's must
	// still reach the bond's device's link settings.
	sh(t, "cd "+td.mnt+` && echo +bond0 > class/net/bonding_masters && echo 0 > class/net/bond0/bonding/miimon`)
	for _, i := range []string{"ib0", "ib1"} {
		mustRun(t, "ip", "-n", ns, "link", "set", i, "down")
		waitUntil(t, i+" down in the tree", func() bool { return readTrim(t, td.path("class/net/"+i+"/flags")) == "0x1002" })
		if err := os.WriteFile(td.path("class/net/bond0/bonding/slaves"), []byte("+"+i+"\n"), 0); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{"mtu", "ifindex", "carrier", "operstate", "speed", "duplex", "ifalias", "dormant",
		"carrier_up_count", "carrier_down_count", "carrier_changes"}
	sysfsAgree(t, td, "bond0 down", files, "bond0")
	mustRun(t, "ip", "-n", ns, "link", "set", "bond0", "up")
	waitLink(t, ns, "bond0")
	var act string
	waitUntil(t, "an active slave", func() bool {
		act = readTrim(t, td.path("class/net/bond0/bonding/active_slave"))
		return act != ""
	})
	sysfsAgree(t, td, "bond0 up", files, "bond0")
	if got := readTrim(t, td.path("class/net/bond0/speed")); got != "40000" {
		t.Errorf("bond0's speed with %s active: %q, want its 40000", act, got)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", "bond0", "alias", "bond by ip")
	sysfsAgree(t, td, "after ip link set alias", files, "bond0")
	if err := os.WriteFile(td.path("class/net/bond0/ifalias"), []byte("bond in the tree\n"), 0); err != nil {
		t.Fatal(err)
	}
	sysfsAgree(t, td, "after a write of ifalias", files, "bond0")
	// The active slave goes down: the other takes over (the MII monitor sees it), and
	// the speed is its.
	if err := os.WriteFile(td.path("class/net/bond0/bonding/miimon"), []byte("100\n"), 0); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "ip", "-n", ns, "link", "set", act, "down")
	waitUntil(t, "a failover", func() bool {
		a := readTrim(t, td.path("class/net/bond0/bonding/active_slave"))
		return a != "" && a != act
	})
	sysfsAgree(t, td, "after a failover", files, "bond0")
}
