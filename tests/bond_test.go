package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"ipoibfs/internal/testenv"

	"golang.org/x/sys/unix"
)

// bondPing runs ping -i 0.01 from ns to dst until stop is closed and returns how many
// echoes it sent and how many replies came back.
func bondPing(t *testing.T, ns, dst string) (stop func() (sent, got int)) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "ping", "-n", "-i", "0.01", "-W", "1", dst)
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return func() (int, int) {
		time.Sleep(300 * time.Millisecond) // the last replies
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("ping did not stop; output:\n%s", out.String())
		}
		m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("no ping summary:\n%s", out.String())
		}
		sent, _ := strconv.Atoi(m[1])
		got, _ := strconv.Atoi(m[2])
		return sent, got
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Active-backup bonding end to end, as the vendor guide configures it: node a has two
// ports and bond0 over ib0 and ib1 from ifcfg files (ifcfg-bond0 with BONDING_OPTS, its
// active_slave applied once the slaves are enslaved,
// MASTER=bond0 SLAVE=yes in the slaves' files), node b hosts the subnet manager. a
// pings b every 10 ms through bond0. Taking a's port 1 down in b's sm/faults loses a
// few packets before active_slave reads ib1 and the ping goes on; bringing the port
// back changes nothing. With primary ib0 (written to the tree), the port coming back
// makes ib0 active again.
func TestBondActiveBackupFailover(t *testing.T) {
	requireE2E(t)
	treeRequire(t)
	dir := t.TempDir()
	files := map[string]string{
		"ifcfg-bond0": "DEVICE=bond0\nTYPE=Bond\nBONDING_MASTER=yes\nBONDING_OPTS=\"mode=active-backup miimon=100 active_slave=ib0\"\n" +
			"ONBOOT=yes\nBOOTPROTO=static\nIPADDR=10.87.0.1\nPREFIX=24\nMTU=2044\n",
		"ifcfg-ib0": "DEVICE=ib0\nTYPE=InfiniBand\nONBOOT=yes\nBOOTPROTO=none\nMASTER=bond0\nSLAVE=yes\n",
		"ifcfg-ib1": "DEVICE=ib1\nTYPE=InfiniBand\nONBOOT=yes\nBOOTPROTO=none\nMASTER=bond0\nSLAVE=yes\n",
	}
	for f, text := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nsA, nsB := netns(t, "bda"), netns(t, "bdb")
	mntA, mntB := treeMountDir(t), treeMountDir(t)
	treeNoMountAt(t, mntA)
	treeNoMountAt(t, mntB)
	b := startDaemon(t, "bondb", "-sm", "127.0.1.87:4791", "-netns", nsB, "-mount", mntB)
	a := startDaemon(t, "bonda", "-fabric", "127.0.1.87:4791", "-listen", "127.0.1.88:4791", "-ports", "2",
		"-netns", nsA, "-mount", mntA, "-config", dir)
	treeWait(t, mntB, b.log)
	treeWait(t, mntA, a.log)
	waitLink(t, nsB, "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.87.0.2/24", "dev", "ib0")
	waitLink(t, nsA, "bond0")

	bond := filepath.Join(mntA, "class/net/bond0")
	active := func() string { return readTrim(t, filepath.Join(bond, "bonding/active_slave")) }
	for f, want := range map[string]string{"bonding/mode": "active-backup 1", "bonding/miimon": "100", "bonding/slaves": "ib0 ib1",
		"bonding/fail_over_mac": "active 1", "type": "32", "mtu": "2044", "../bonding_masters": "bond0"} {
		if got := readTrim(t, filepath.Join(bond, f)); got != want {
			t.Errorf("%s: %q, want %q", f, got, want)
		}
	}
	// The first slave whose link the monitor sees up becomes active; the test starts
	// from ib0.
	mii := func(slave string) string {
		return readTrim(t, filepath.Join(mntA, "class/net", slave, "bonding_slave/mii_status"))
	}
	waitUntil(t, "both slaves' links up", func() bool { return mii("ib0") == "up" && mii("ib1") == "up" })
	if active() != "ib0" {
		sh(t, "echo ib0 > "+filepath.Join(bond, "bonding/active_slave"))
	}
	waitUntil(t, "ib0 active", func() bool { return active() == "ib0" })
	if got, want := readTrim(t, filepath.Join(bond, "address")), readTrim(t, filepath.Join(mntA, "class/net/ib0/address")); got != want {
		t.Errorf("bond0 address %s, want ib0's %s", got, want)
	}
	if out := ipOut(t, nsA, "-4", "addr", "show", "dev", "bond0"); !strings.Contains(out, "10.87.0.1/24") {
		t.Fatalf("bond0 has no 10.87.0.1/24:\n%s", out)
	}
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.87.0.2")
	// IPv6 to the bond's link-local address (its first slave's GUID): b resolves it
	// with neighbour discovery, answered by the active slave.
	bondLL := linkLocal(t, nsA, "bond0")
	if ib0LL := linkLocal(t, nsA, "ib0"); bondLL != ib0LL {
		t.Errorf("bond0's link-local %s, want ib0's %s (the first slave's GUID)", bondLL, ib0LL)
	}
	mustRun(t, "ip", "netns", "exec", nsB, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", bondLL+"%ib0")
	ib1Addr := readTrim(t, filepath.Join(mntA, "class/net/ib1/address"))
	faults := filepath.Join(mntB, "sm/faults")

	// Port 1 down and back, no primary.
	stop := bondPing(t, nsA, "10.87.0.2")
	time.Sleep(time.Second)
	sh(t, "echo 'link bonda 1 down' > "+faults)
	start := time.Now()
	waitUntil(t, "ib1 active", func() bool { return active() == "ib1" })
	t.Logf("active_slave ib1 %v after the link went down", time.Since(start).Round(time.Millisecond))
	if got := readTrim(t, filepath.Join(mntA, "class/infiniband/"+hcaName(t, mntA)+"/ports/1/state")); got != "1: DOWN" {
		t.Errorf("port 1 state %q while its link is down", got)
	}
	if got := readTrim(t, filepath.Join(bond, "address")); got != ib1Addr {
		t.Errorf("bond0 address %s after failover, want ib1's %s", got, ib1Addr)
	}
	if !strings.Contains(readTrim(t, faults), `link "ipoibfs bonda" 1 down`) {
		t.Errorf("sm/faults does not show the link down:\n%s", readTrim(t, faults))
	}
	// A reload of the files (systemctl reload's) applies them again and succeeds: it
	// does not force the file's active_slave, ib0, back while ib0's link is down (nor
	// ever on a running bond: the active slave is the bond's choice).
	if out, err := exec.Command(binPath, "reload", "-tree", mntA).CombinedOutput(); err != nil {
		t.Errorf("ipoibfs reload after the failover: %v %s\n%s", err, out, a.log)
	}
	if active() != "ib1" {
		t.Errorf("active_slave %s after a reload, want ib1 still", active())
	}
	if !strings.Contains(a.log.String(), "ifcfg-bond0: BONDING_OPTS active_slave=ib0 not applied to the running bond0 (its active slave stays ib1)") {
		t.Errorf("the log does not say active_slave=ib0 was not applied:\n%s", a.log)
	}
	// b's neighbour entry for the bond's IPv6 address moved to ib1 with the unsolicited
	// neighbour advertisement (b keeps entries until told otherwise).
	mustRun(t, "ip", "netns", "exec", nsB, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", bondLL+"%ib0")
	time.Sleep(500 * time.Millisecond)
	sh(t, "echo 'link bonda 1 up' > "+faults)
	waitUntil(t, "ib0's link back", func() bool { return mii("ib0") == "up" })
	time.Sleep(time.Second)
	sent, got := stop()
	t.Logf("ping through the failover: %d sent, %d received", sent, got)
	if active() != "ib1" {
		t.Errorf("active_slave %s after port 1 came back without a primary, want ib1", active())
	}
	if sent < 100 || sent-got > 25 {
		t.Errorf("%d of %d echoes lost in the failover, want at most 25", sent-got, sent)
	}
	if !strings.Contains(a.log.String(), "bond0: (slave ib1): making interface the new active one") {
		t.Errorf("no failover line in a's log")
	}

	// primary ib0: the same fault, and ib0 takes over again when its link is back.
	sh(t, "echo ib0 > "+filepath.Join(bond, "bonding/primary"))
	if got := readTrim(t, filepath.Join(bond, "bonding/primary")); got != "ib0" {
		t.Fatalf("primary %q", got)
	}
	waitUntil(t, "ib0 active as primary", func() bool { return active() == "ib0" })
	stop = bondPing(t, nsA, "10.87.0.2")
	time.Sleep(500 * time.Millisecond)
	sh(t, "echo 'link bonda 1 down' > "+faults)
	waitUntil(t, "ib1 active", func() bool { return active() == "ib1" })
	time.Sleep(500 * time.Millisecond)
	sh(t, "echo 'link bonda 1 up' > "+faults)
	waitUntil(t, "ib0 active again", func() bool { return active() == "ib0" })
	time.Sleep(500 * time.Millisecond)
	sent, got = stop()
	t.Logf("ping through failover and back to the primary: %d sent, %d received", sent, got)
	if sent < 50 || sent-got > 40 {
		t.Errorf("%d of %d echoes lost in two failovers, want at most 40", sent-got, sent)
	}
}

// hcaName is the one HCA under class/infiniband.
func hcaName(t *testing.T, mnt string) string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(mnt, "class/infiniband"))
	if err != nil || len(es) != 1 {
		t.Fatalf("class/infiniband: %v %v", es, err)
	}
	return es[0].Name()
}

// The same bonding through the tree, as a script does it on a host with the driver:
// -bonding loads it (bonding_masters appears), the slave goes down before it is
// enslaved, the bond's device appears in the namespace, and the kernel's errnos come
// back to bash.
func TestBondThroughTheTree(t *testing.T) {
	td := treeStart(t, "bdt", "", "-ports", "2", "-bonding")
	waitLink(t, td.ns, "ib1")
	out := sh(t, "cd "+td.mnt+` && {
echo +bond0 > class/net/bonding_masters
cat class/net/bonding_masters
( echo balance-rr > class/net/bond0/bonding/mode ) 2>&1 | sed 's/.*: //'
( echo +ib0 > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
# lo is the namespace's, not the engine's: the driver's errnos for it.
ip -n `+td.ns+` link set lo down
( echo +lo > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
ip -n `+td.ns+` link set ib0 down
ip -n `+td.ns+` link set ib1 down
# The engine follows the devices through netlink, a moment after ip returns.
for i in ib0 ib1; do n=0; until [ "$(cat class/net/$i/flags)" = 0x1002 ] || [ $n -gt 200 ]; do sleep 0.05; n=$((n+1)); done; done
echo +ib0 > class/net/bond0/bonding/slaves
echo +ib1 > class/net/bond0/bonding/slaves
( echo +lo > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
ip -n `+td.ns+` link set lo up
( echo +lo > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
( echo -lo > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
( echo lo > class/net/bond0/bonding/active_slave ) 2>&1 | sed 's/.*: //'
( echo +eth9 > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
# A bridge's port is in use (EBUSY); ib1's device by an alternative name is ib1.
ip -n `+td.ns+` link add br9 type bridge
ip -n `+td.ns+` link add v9 type veth peer name v10
ip -n `+td.ns+` link set v9 master br9
( echo +v9 > class/net/bond0/bonding/slaves ) 2>&1 | sed 's/.*: //'
ip -n `+td.ns+` link del v9
ip -n `+td.ns+` link del br9
ip -n `+td.ns+` link property add dev ib1 altname slot1
echo -slot1 > class/net/bond0/bonding/slaves
cat class/net/bond0/bonding/slaves
echo +slot1 > class/net/bond0/bonding/slaves
( echo 65520 > class/net/bond0/mtu ) 2>&1 | sed 's/.*: //'
cat class/net/bond0/bonding/slaves class/net/bond0/type class/net/bond0/bonding/fail_over_mac
}`)
	want := "bond0\nInvalid argument\nOperation not permitted\nOperation not supported\n" +
		"Invalid argument\nOperation not permitted\nInvalid argument\nInvalid argument\nNo such device\n" +
		"Device or resource busy\nib0\n" +
		"Invalid argument\nib0 ib1\n32\nactive 1\n"
	if out != want {
		t.Fatalf("transcript:\n%s\nwant:\n%s", out, want)
	}
	mustRun(t, "ip", "-n", td.ns, "link", "set", "bond0", "up")
	waitLink(t, td.ns, "bond0")
	var act string
	waitUntil(t, "an active slave", func() bool {
		act = readTrim(t, td.path("class/net/bond0/bonding/active_slave"))
		return act != ""
	})
	other := map[string]string{"ib0": "ib1", "ib1": "ib0"}[act]
	if got := readTrim(t, td.path("class/net/"+other+"/bonding_slave/state")); got != "backup" {
		t.Errorf("%s active, %s state %q, want backup", act, other, got)
	}
	// IFF_MULTICAST both ways, as an interface's.
	mustRun(t, "ip", "-n", td.ns, "link", "set", "bond0", "multicast", "off")
	waitUntil(t, "bond0's multicast off in the tree", func() bool { return readTrim(t, td.path("class/net/bond0/flags")) == "0x403" })
	if err := os.WriteFile(td.path("class/net/bond0/flags"), []byte("0x1403\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bond0's device multicast again", func() bool {
		return strings.Contains(ipOut(t, td.ns, "link", "show", "bond0"), "MULTICAST")
	})
	// IFF_PROMISC and IFF_ALLMULTI both ways too.
	mustRun(t, "ip", "-n", td.ns, "link", "set", "bond0", "allmulticast", "on")
	waitUntil(t, "bond0's allmulti in the tree", func() bool { return readTrim(t, td.path("class/net/bond0/flags")) == "0x1603" })
	if err := os.WriteFile(td.path("class/net/bond0/flags"), []byte("0x1503\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bond0's device promiscuous, not all-multicast", func() bool {
		out := ipOut(t, td.ns, "link", "show", "bond0")
		return strings.Contains(out, "PROMISC") && !strings.Contains(out, "ALLMULTI")
	})
	if got := readTrim(t, td.path("class/net/bond0/flags")); got != "0x1503" {
		t.Errorf("bond0's flags after writing 0x1503: %s", got)
	}
	// A packet socket's promiscuity shows in bond0's flags too, as in sysfs.
	if err := os.WriteFile(td.path("class/net/bond0/flags"), []byte("0x1403\n"), 0); err != nil {
		t.Fatal(err)
	}
	idx, err := strconv.Atoi(readTrim(t, td.path("class/net/bond0/ifindex")))
	if err != nil {
		t.Fatal(err)
	}
	ps := promiscSocket(t, td.ns, idx)
	waitUntil(t, "a packet socket's promiscuity in bond0's flags", func() bool { return readTrim(t, td.path("class/net/bond0/flags")) == "0x1503" })
	unix.Close(ps)
	waitUntil(t, "gone again", func() bool { return readTrim(t, td.path("class/net/bond0/flags")) == "0x1403" })
	// Up and down written in the tree reach the device, as dev_change_flags would.
	isUp := func() bool {
		return strings.Contains(strings.SplitN(ipOut(t, td.ns, "link", "show", "bond0"), ">", 2)[0], ",UP")
	}
	if err := os.WriteFile(td.path("class/net/bond0/flags"), []byte("0x1402\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bond0's device down", func() bool { return !isUp() })
	if err := os.WriteFile(td.path("class/net/bond0/flags"), []byte("0x1403\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bond0's device up again", isUp)
	if got := readTrim(t, td.path("class/net/bond0/flags")); got != "0x1403" {
		t.Errorf("bond0's flags after writing 0x1403: %s", got)
	}
	// Deleted, the bond's names leave the kernel's cache of the tree at once, as sysfs's.
	if out := sh(t, "cd "+td.mnt+" && cat class/net/bond0/mtu >/dev/null && echo -bond0 > class/net/bonding_masters && if test -e class/net/bond0; then echo stale; else echo gone; fi"); out != "gone\n" {
		t.Errorf("class/net/bond0 after -bond0: %q", out)
	}
	treeWaitLinks(t, td.ns, []string{"ib0", "ib1"})
}
