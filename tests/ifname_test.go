package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestIfnameBesideKernelIB0 runs the daemon where an ib0 already exists, as on a host
// whose kernel ib_ipoib drives a real HCA (here a TUN device named ib0 stands in for
// it): without -ifname the daemon refuses to start and says why; with
// -ifname ib0=uib0 port 1's interface is uib0 everywhere (the kernel device, the tree,
// the debug files, its children) while port 2 keeps ib1, and the stand-in ib0 is left
// alone. An ifcfg file names the interface by its new name.
func TestIfnameBesideKernelIB0(t *testing.T) {
	treeRequire(t)
	ns := treeNetns(t, "ifn")
	mustRun(t, "ip", "-n", ns, "tuntap", "add", "dev", "ib0", "mode", "tun")
	standIn := mustRun(t, "ip", "-n", ns, "-o", "link", "show", "ib0")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, "-name", "ifn-refused", "-mount", "", "-9p", "", "-netns", ns).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "a network device ib0 already exists in network namespace "+ns) {
		t.Fatalf("daemon beside an existing ib0 without -ifname: %v, output:\n%s", err, out)
	}

	mnt := treeMountDir(t)
	port := treeFreePort(t)
	td := &treeDaemon{mnt: mnt, port: port, addr: fmt.Sprintf("127.0.0.1:%d", port), ns: ns}
	treeNoMountAt(t, mnt)
	cfg := t.TempDir() // interface files name the interface as -ifname does
	if err := os.WriteFile(filepath.Join(cfg, "ifcfg-uib0"), []byte("DEVICE=uib0\nTYPE=InfiniBand\nONBOOT=yes\nBOOTPROTO=static\nIPADDR=10.77.0.1\nPREFIX=24\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	td.daemon = startDaemon(t, "ifn", "-mount", mnt, "-9p", td.addr, "-netns", ns, "-ports", "2", "-ifname", "ib0=uib0", "-config", cfg)
	for deadline := time.Now().Add(15 * time.Second); ; {
		b, err := os.ReadFile(td.path("class/net/uib0/pkey"))
		if err == nil && string(b) == "0xffff\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("class/net/uib0/pkey: %q %v; log:\n%s", b, err, td.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitLink(t, ns, "uib0")
	waitLink(t, ns, "ib1")
	if got := treeLs(t, td.path("class/net")); !slices.Equal(got, []string{"ib1", "uib0"}) {
		t.Errorf("class/net = %v, want [ib1 uib0]", got)
	}
	if got, err := os.ReadFile(td.path("class/net/uib0/dev_port")); err != nil || string(got) != "0\n" {
		t.Errorf("class/net/uib0/dev_port = %q, %v; want port 1's 0", got, err)
	}
	if _, err := os.Stat(td.path("kernel/debug/ipoib/uib0_mcg")); err != nil {
		t.Errorf("uib0_mcg: %v", err)
	}
	stdout, stderr, code := td.ninep(t, "read", "class/net/uib0/mode", "")
	if code != 0 || stdout != "datagram\n" {
		t.Errorf("9p read class/net/uib0/mode: exit %d, %q, stderr %q", code, stdout, stderr)
	}
	stdout, stderr, code = td.bash(t, "echo 0x8001 > class/net/uib0/create_child && cat class/net/uib0.8001/parent", nil)
	if code != 0 || stdout != "uib0\n" {
		t.Errorf("child of uib0: exit %d, parent %q, stderr %q", code, stdout, stderr)
	}
	treeWaitLinks(t, ns, []string{"ib0", "ib1", "uib0", "uib0.8001"})
	if got := mustRun(t, "ip", "-n", ns, "-o", "addr", "show", "dev", "uib0"); !strings.Contains(got, "inet 10.77.0.1/24") {
		t.Errorf("ifcfg-uib0's address is not on uib0:\n%s", got)
	}
	if got := mustRun(t, "ip", "-n", ns, "-o", "link", "show", "ib0"); got != standIn {
		t.Errorf("the existing ib0 changed:\n%s\nwas\n%s", got, standIn)
	}
	if l := td.log.String(); !strings.Contains(l, "uib0: up, hardware address") || strings.Contains(l, `msg="ib0: up`) {
		t.Errorf("log lacks uib0's up line or has ib0's:\n%s", l)
	}
}
