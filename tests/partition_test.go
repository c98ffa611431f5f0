package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ipoibfs/verbs/soft"
)

// mountDir returns a fresh mount point for a daemon.
func mountDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// waitTree waits until the daemon's FUSE mount serves ib0.
func waitTree(t *testing.T, mnt string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(mnt, "class/net/ib0/pkey")); err == nil && len(b) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree not mounted at %s", mnt)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sh runs a bash command line (never with a working directory inside a mount).
func sh(t *testing.T, cmd string) string {
	t.Helper()
	return mustRun(t, "bash", "-c", cmd)
}

func guid(name string) uint64 { return uint64(soft.GUIDFromName(name, 1)) }

// TestChildPartitionsMembership: three daemons; P_Key 0x8001 holds pa and pb (full),
// 0x0003 holds pa and pb as limited members. Children are created through the tree.
// pa and pb ping each other over ib0.8001; pc, not a member, has no carrier there and
// reaches nobody; the two limited members of 0x0003 cannot reach each other.
func TestChildPartitionsMembership(t *testing.T) {
	requireE2E(t)
	conf := filepath.Join(t.TempDir(), "partitions.conf")
	body := fmt.Sprintf("Default=0x7fff, ipoib : ALL=full;\nP1=0x8001, ipoib : %#x=full, %#x=full;\nP3=0x0003, ipoib : %#x=limited, %#x=limited;\n",
		guid("pa"), guid("pb"), guid("pa"), guid("pb"))
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sm := "127.0.1.21:4791"
	ns := map[string]string{"pa": netns(t, "pa"), "pb": netns(t, "pb"), "pc": netns(t, "pc")}
	mnt := map[string]string{"pa": mountDir(t), "pb": mountDir(t), "pc": mountDir(t)}
	startDaemon(t, "pa", "-sm", sm, "-netns", ns["pa"], "-mount", mnt["pa"], "-partitions", conf)
	startDaemon(t, "pb", "-fabric", sm, "-listen", "127.0.1.22:4791", "-netns", ns["pb"], "-mount", mnt["pb"])
	startDaemon(t, "pc", "-fabric", sm, "-listen", "127.0.1.23:4791", "-netns", ns["pc"], "-mount", mnt["pc"])
	for k, n := range []string{"pa", "pb", "pc"} {
		waitTree(t, mnt[n])
		waitLink(t, ns[n], "ib0")
		sh(t, "echo 0x8001 > "+mnt[n]+"/class/net/ib0/create_child")
		if got := sh(t, "cat "+mnt[n]+"/class/net/ib0.8001/pkey"); got != "0x8001\n" {
			t.Fatalf("%s: ib0.8001 pkey %q", n, got)
		}
		waitTUN(t, ns[n], "ib0.8001")
		mustRun(t, "ip", "-n", ns[n], "link", "set", "ib0.8001", "up") // created down, as by the driver
		mustRun(t, "ip", "-n", ns[n], "addr", "add", fmt.Sprintf("10.81.0.%d/24", k+1), "dev", "ib0.8001")
	}
	waitLink(t, ns["pa"], "ib0.8001")
	waitLink(t, ns["pb"], "ib0.8001")
	mustRun(t, "ip", "netns", "exec", ns["pa"], "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.81.0.2")
	mustRun(t, "ip", "netns", "exec", ns["pb"], "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.81.0.1")

	// pc is not in the partition: its child is up without carrier, and nobody reaches it.
	if out := mustRun(t, "ip", "-n", ns["pc"], "link", "show", "ib0.8001"); !strings.Contains(out, "NO-CARRIER") {
		t.Fatalf("non-member child has carrier: %s", out)
	}
	if got := sh(t, "cat "+mnt["pc"]+"/class/net/ib0.8001/operstate"); got != "down\n" {
		t.Fatalf("non-member operstate %q", got)
	}
	if out, err := run(t, 10*time.Second, "ip", "netns", "exec", ns["pa"], "ping", "-c", "2", "-W", "1", "10.81.0.3"); err == nil {
		t.Fatalf("reached a node outside the partition:\n%s", out)
	}

	// Two limited members of 0x0003.
	for k, n := range []string{"pa", "pb"} {
		sh(t, "echo 3 > "+mnt[n]+"/class/net/ib0/create_child")
		waitTUN(t, ns[n], "ib0.8003")
		mustRun(t, "ip", "-n", ns[n], "link", "set", "ib0.8003", "up")
		waitLink(t, ns[n], "ib0.8003")
		mustRun(t, "ip", "-n", ns[n], "addr", "add", fmt.Sprintf("10.83.0.%d/24", k+1), "dev", "ib0.8003")
	}
	if out, err := run(t, 10*time.Second, "ip", "netns", "exec", ns["pa"], "ping", "-c", "3", "-W", "1", "10.83.0.2"); err == nil {
		t.Fatalf("two limited members reached each other:\n%s", out)
	}
	// The receiver counted the P_Key violations of the limited-limited attempt... as the
	// sender's ARP never got an answer, the limited child of pb shows no traffic.
	if got := sh(t, "cat "+mnt["pb"]+"/class/net/ib0.8003/statistics/rx_packets"); got != "0\n" {
		t.Fatalf("limited member received %s packets", strings.TrimSpace(got))
	}
}

// waitTUN waits until the daemon has created the TUN device of a new child.
func waitTUN(t *testing.T, ns, dev string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := run(t, 5*time.Second, "ip", "-n", ns, "link", "show", dev); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TUN device %s in %s", dev, ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShutdownWithMountPinnedElsewhere: a process started with `ip netns exec` while
// the tree is mounted holds a copy of the mount in its own mount namespace (on hosts
// where / has private propagation). SIGTERM must still end the daemon promptly with
// exit 0 (startDaemon's cleanup checks both).
func TestShutdownWithMountPinnedElsewhere(t *testing.T) {
	requireE2E(t)
	ns := netns(t, "pin")
	mnt := mountDir(t)
	var pin *exec.Cmd
	t.Cleanup(func() { // runs after the daemon's SIGTERM check
		if pin != nil {
			_ = pin.Process.Kill()
			_ = pin.Wait()
		}
	})
	startDaemon(t, "pin", "-netns", ns, "-mount", mnt)
	waitTree(t, mnt)
	pin = exec.Command("ip", "netns", "exec", ns, "sleep", "120")
	if err := pin.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
}
