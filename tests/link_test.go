package tests

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ipoibfs link: named children as ip link add ... type ipoib makes them, with the
// netlink rules (P_Key, mode and umcast at creation, P_Keys may repeat, delete_child
// does not touch them), over the mounted tree and over 9P.
func TestLinkNamedChildren(t *testing.T) {
	td := treeStart(t, "lk", "")
	waitLink(t, td.ns, "ib0")
	link := func(args ...string) (string, error) {
		out, err := exec.Command(binPath, append([]string{"link", "-tree", td.mnt}, args...)...).CombinedOutput()
		return string(out), err
	}
	mustLink := func(args ...string) string {
		t.Helper()
		out, err := link(args...)
		if err != nil {
			t.Fatalf("ipoibfs link %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	read := func(p string) string { b, _ := os.ReadFile(td.path(p)); return strings.TrimSpace(string(b)) }
	mustLink("add", "link", "ib0", "name", "storage0", "type", "ipoib", "pkey", "0x8005", "mode", "connected", "umcast", "1")
	if out, err := run(t, 10*time.Second, "ip", "-n", td.ns, "link", "show", "storage0"); err != nil {
		t.Fatalf("no storage0 device when ipoibfs link add returned: %v %s", err, out)
	}
	for p, want := range map[string]string{"pkey": "0x8005", "mode": "connected", "umcast": "1", "parent": "ib0", "mtu": "65520"} {
		if got := read("class/net/storage0/" + p); got != want {
			t.Errorf("class/net/storage0/%s = %q, want %q", p, got, want)
		}
	}
	if got := mustLink("show", "storage0"); got != "storage0@ib0: ipoib pkey 0x8005 mode connected umcast 1 (netlink)\n" {
		t.Errorf("link show storage0: %q", got)
	}
	// Netlink children may share a P_Key; create_child's rule is its own.
	mustLink("add", "link", "ib0", "name", "storage1", "type", "ipoib", "pkey", "0x8005")
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8005\n"), 0); err != nil {
		t.Errorf("create_child 0x8005 beside netlink children of that P_Key: %v", err)
	}
	if err := os.WriteFile(td.path("class/net/ib0/delete_child"), []byte("0x8005\n"), 0); err != nil {
		t.Errorf("delete_child 0x8005: %v", err)
	}
	if read("class/net/storage0/pkey") != "0x8005" || read("class/net/storage1/pkey") != "0x8005" || read("class/net/ib0.8005/pkey") != "" {
		t.Errorf("delete_child removed a netlink child or kept its own:\n%s", read("link"))
	}
	// Refusals: a taken name, a port's interface, another type.
	if out, err := link("add", "link", "ib0", "name", "storage0", "type", "ipoib"); err == nil {
		t.Errorf("adding a taken name succeeded: %s", out)
	}
	if out, err := link("del", "ib0"); err == nil {
		t.Errorf("deleting ib0 succeeded: %s", out)
	}
	if out, err := link("add", "link", "ib0", "name", "v0", "type", "vlan"); err == nil {
		t.Errorf("type vlan accepted: %s", out)
	}
	// Over 9P the same file.
	out, err := exec.Command(binPath, "link", "-9p", td.addr, "show").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "storage1@ib0: ipoib pkey 0x8005 mode datagram umcast 0 (netlink)\n") {
		t.Errorf("link show over 9P: %v\n%s", err, out)
	}
	mustLink("del", "storage0")
	if _, err := run(t, 10*time.Second, "ip", "-n", td.ns, "link", "show", "storage0"); err == nil {
		t.Error("storage0's device still there when ipoibfs link del returned")
	}
}
