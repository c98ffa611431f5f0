package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
)

// BOOTPROTO=dhcp against a real DHCP server, dnsmasq, on the other node's ib0, which
// reserves an address for this node's client identifier as the tree shows it: ib0 gets
// exactly that address, the lease shows in dhcp/lease, it is renewed, and the server
// sees it released when the file goes (SIGHUP) and when the daemon exits.
//
// dnsmasq because it serves a TUN device (no link-layer address, NOARP) from a UDP
// socket and broadcasts its replies for the broadcast flag. Kea does not: its raw
// sockets expect an Ethernet header, and its UDP sockets, bound to the interface's
// address, never see a client's broadcast.
func TestDHCPReservedAddress(t *testing.T) {
	requireE2E(t)
	testenv.File(t, "/dev/fuse")
	dnsmasq := testenv.Tool(t, "dnsmasq")
	const reserved, serverAddr = "10.67.0.10", "10.67.0.1"

	dir := t.TempDir()
	conf := filepath.Join(dir, "ifcfg")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "ifcfg-ib0"), []byte("DEVICE=ib0\nTYPE=InfiniBand\nONBOOT=yes\nBOOTPROTO=dhcp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nsA, nsB := netns(t, "dha"), netns(t, "dhb")
	// Strict reverse-path filtering on the client's side, RHEL's default: the OFFER
	// comes from a server the client has no route to yet, which the IP layer drops
	// before any UDP socket sees it.
	mustRun(t, "ip", "netns", "add", nsA)
	mustRun(t, "ip", "netns", "exec", nsA, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1")
	startDaemon(t, "dhb", "-sm", "127.0.1.71:4791", "-netns", nsB)
	waitLink(t, nsB, "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", serverAddr+"/24", "dev", "ib0")
	mnt := mountDir(t)
	a := startDaemon(t, "dha", "-fabric", "127.0.1.71:4791", "-listen", "127.0.1.72:4791", "-netns", nsA, "-mount", mnt, "-config", conf)
	waitTree(t, mnt)
	leaseFile := filepath.Join(mnt, "class/net/ib0/dhcp/lease")
	if st, err := os.Stat(leaseFile); err != nil || st.Mode().Perm() != 0o444 {
		t.Fatalf("dhcp/lease: %v %v, want a 0444 file", st, err)
	}
	b, err := os.ReadFile(filepath.Join(mnt, "class/net/ib0/dhcp/client_id"))
	if err != nil {
		t.Fatal(err)
	}
	clientID := strings.TrimSpace(string(b))

	// The server: leases of at least 2 minutes (dnsmasq's minimum), renewed after 4 s.
	srvLog := &testenv.Buffer{}
	srv := exec.Command("ip", "netns", "exec", nsB, dnsmasq, "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=ib0", "--bind-interfaces", "--dhcp-leasefile="+filepath.Join(dir, "leases"), "--log-dhcp",
		"--dhcp-range=10.67.0.100,10.67.0.200,255.255.255.0,2m", "--dhcp-host=id:"+clientID+","+reserved,
		"--dhcp-option=option:T1,4", "--dhcp-option=option:T2,8")
	srv.Stdout, srv.Stderr = srvLog, srvLog
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("dnsmasq log:\n%s", srvLog)
		}
	})

	// The client retransmits its DISCOVER 4 s after the first, then 8 s later.
	dhcpWait(t, 30*time.Second, "the reserved address on ib0", func() bool {
		return strings.Contains(ipOut(t, nsA, "-4", "addr", "show", "dev", "ib0"), "inet "+reserved+"/24 ")
	})
	if out := ipOut(t, nsA, "-4", "addr", "show", "dev", "ib0"); strings.Count(out, "inet ") != 1 {
		t.Errorf("ib0 has other addresses than %s:\n%s", reserved, out)
	}
	lease := func() string {
		b, err := os.ReadFile(leaseFile)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first := lease()
	wantRE := regexp.MustCompile(`^address ` + regexp.QuoteMeta(reserved) + `/24\nserver ` + regexp.QuoteMeta(serverAddr) +
		`\nrouter ` + regexp.QuoteMeta(serverAddr) + `\nlease_time 120\nrenew_at (\S+)\nrebind_at \S+\nexpires_at \S+\n$`)
	m := wantRE.FindStringSubmatch(first)
	if m == nil {
		t.Fatalf("dhcp/lease:\n%s", first)
	}
	if _, err := time.Parse(time.RFC3339, m[1]); err != nil {
		t.Errorf("renew_at: %v", err)
	}
	if !strings.Contains(srvLog.String(), "DHCPACK(ib0) "+reserved+" "+clientID) {
		t.Errorf("dnsmasq did not log the ACK for %s", clientID)
	}

	// Renewal at T1: a REQUEST and ACK after the first, and a new renew_at.
	dhcpWait(t, 20*time.Second, "a renewal", func() bool {
		l := wantRE.FindStringSubmatch(lease())
		return l != nil && l[1] != m[1] && strings.Count(srvLog.String(), "DHCPACK(ib0) "+reserved) >= 2
	})
	if !strings.Contains(a.log.String(), "dhcp: lease of "+reserved+"/24 renewed from "+serverAddr) {
		t.Errorf("no renewal in the daemon's log")
	}

	// Moved to another namespace and put back (which unbinds packet sockets on the
	// device, and takes its addresses): the client still hears the server, and the
	// next ACK, of a renewal or a rebinding, puts the address back.
	other := netns(t, "dho")
	mustRun(t, "ip", "netns", "add", other)
	mustRun(t, "ip", "-n", nsA, "link", "set", "ib0", "netns", other)
	dhcpWait(t, 10*time.Second, "the put-back", func() bool {
		return strings.Contains(a.log.String(), "ib0: moved to another network namespace outside ipoibfs (ip link set netns): put back")
	})
	acks := strings.Count(srvLog.String(), "DHCPACK(ib0) "+reserved)
	dhcpWait(t, 30*time.Second, "an ACK after the move and the address back", func() bool {
		return strings.Count(srvLog.String(), "DHCPACK(ib0) "+reserved) > acks &&
			strings.Contains(ipOut(t, nsA, "-4", "addr", "show", "dev", "ib0"), "inet "+reserved+"/24 ")
	})

	// The file removed, then SIGHUP: the lease is released and the address goes.
	ifcfg := filepath.Join(conf, "ifcfg-ib0")
	text, err := os.ReadFile(ifcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ifcfg); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	release := "DHCPRELEASE(ib0) " + reserved + " " + clientID
	dhcpWait(t, 10*time.Second, "the release after SIGHUP", func() bool {
		return strings.Count(srvLog.String(), release) == 1 && lease() == "" &&
			!strings.Contains(ipOut(t, nsA, "-4", "addr", "show", "dev", "ib0"), "inet ")
	})

	// Back, and SIGHUP: the lease again; then exit releases it before the devices go.
	if err := os.WriteFile(ifcfg, text, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	dhcpWait(t, 30*time.Second, "the address again", func() bool {
		return strings.HasPrefix(lease(), "address "+reserved+"/24\n")
	})
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.done:
		a.done <- err // for startDaemon's cleanup
	case <-time.After(15 * time.Second):
		t.Fatal("the daemon did not exit")
	}
	dhcpWait(t, 5*time.Second, "the release at exit", func() bool {
		return strings.Count(srvLog.String(), release) == 2
	})
}

// dhcpWait polls cond until it holds or the time is up.
func dhcpWait(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A child whose file asks for DHCP and that is then deleted takes its DHCP client with
// it (socket and goroutines), as a netdev's unregistration takes its client's socket.
func TestDHCPClientGoesWithItsChild(t *testing.T) {
	conf := t.TempDir()
	file := "DEVICE=ib0.8001\nTYPE=InfiniBand\nONBOOT=yes\nPKEY=yes\nPKEY_ID=1\nPHYSDEV=ib0\nBOOTPROTO=dhcp\n"
	if err := os.WriteFile(filepath.Join(conf, "ifcfg-ib0.8001"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	td := treeStart(t, "dhd", "", "-config", conf)
	waitLink(t, td.ns, "ib0")
	dhcpWait(t, 10*time.Second, "the child's device", func() bool {
		_, err := os.Stat(td.path("class/net/ib0.8001/dhcp/lease"))
		return err == nil
	})
	if err := os.WriteFile(td.path("class/net/ib0/delete_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	dhcpWait(t, 10*time.Second, "the client stopping", func() bool {
		return strings.Contains(td.log.String(), "ib0.8001: gone; its DHCP client stops")
	})
}
