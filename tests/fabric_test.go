package tests

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Every node sees the fabric, not only the one running the subnet manager: node b's
// fabric/nodes and fabric/groups, built from SA GetTable queries, say what node a's
// sm/nodes and sm/groups say (members aside: the SA shows them only with the SM_Key).
// Forty partitions make the group table 12 RMPP segments long.
func TestFabricViewFromEveryNode(t *testing.T) {
	a := treeStart(t, "fva", "", "-sm", "127.0.1.61:4791")
	b := treeStart(t, "fvb", "", "-fabric", "127.0.1.61:4791", "-listen", "127.0.1.62:4791")
	var conf strings.Builder
	conf.WriteString("Default=0x7fff, ipoib : ALL=full;\n")
	for k := 1; k <= 40; k++ {
		fmt.Fprintf(&conf, "P%d=0x%04x, ipoib : ALL=full;\n", k, 0x200+k)
	}
	if err := os.WriteFile(a.path("sm/partitions"), []byte(conf.String()), 0); err != nil {
		t.Fatal(err)
	}
	readTree := func(td *treeDaemon, p string) string {
		t.Helper()
		out, err := os.ReadFile(td.path(p))
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		return string(out)
	}
	withoutMembers := func(s string) string {
		var b strings.Builder
		for _, l := range strings.SplitAfter(s, "\n") {
			if !strings.HasPrefix(l, "  members:") && !strings.HasPrefix(l, "    ") {
				b.WriteString(l)
			}
		}
		return b.String()
	}
	var nodes, groups, smGroups string
	for deadline := time.Now().Add(20 * time.Second); ; {
		// Until b's port is ACTIVE (its tree is served before), fabric/ answers
		// ENETDOWN: the port is not on the fabric yet.
		n, errN := os.ReadFile(b.path("fabric/nodes"))
		g, errG := os.ReadFile(b.path("fabric/groups"))
		nodes, groups = string(n), string(g)
		smGroups = withoutMembers(readTree(a, "sm/groups"))
		if errN == nil && errG == nil && strings.Count(nodes, "\n") == 2 && strings.Count(groups, "MGID:") >= 41 && groups == smGroups {
			break
		}
		for _, err := range []error{errN, errG} {
			if err != nil && !errors.Is(err, syscall.ENETDOWN) {
				t.Fatalf("read b's fabric/: %v", err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's fabric/groups never matched a's sm/groups (%v, %v):\n%s\n--- sm/groups:\n%s", errN, errG, groups, smGroups)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if smNodes := readTree(a, "sm/nodes"); nodes != smNodes {
		t.Errorf("b's fabric/nodes:\n%s\na's sm/nodes:\n%s", nodes, smNodes)
	}
	if !strings.Contains(nodes, "tree-fvb") {
		t.Errorf("fabric/nodes does not name node b:\n%s", nodes)
	}
}

// A node whose subnet manager does not answer says so in its log every few seconds,
// its port reads DOWN and fabric/ says why; when the SM arrives, the log says so and
// the port comes up.
func TestUnreachableSubnetManager(t *testing.T) {
	c := treeStart(t, "fvc", "", "-fabric", "127.0.1.63:4791", "-listen", "127.0.1.64:4791")
	for deadline := time.Now().Add(20 * time.Second); strings.Count(c.log.String(), "no answer from the subnet manager at 127.0.1.63:4791") < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("no repeated line about the silent subnet manager:\n%s", c.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	state, err := os.ReadFile(c.path("class/infiniband/tree-fvc/ports/1/state"))
	if err != nil || string(state) != "1: DOWN\n" {
		t.Errorf("port state %q (%v), want 1: DOWN", state, err)
	}
	if _, err := os.ReadFile(c.path("fabric/nodes")); err == nil || !strings.Contains(err.Error(), "network is down") {
		t.Errorf("fabric/nodes without an SM: %v, want ENETDOWN", err)
	}
	startDaemon(t, "fvsm", "-sm", "127.0.1.63:4791")
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(c.log.String(), "the subnet manager at 127.0.1.63:4791 answers after"); {
		if time.Now().After(deadline) {
			t.Fatalf("the SM's arrival was not logged:\n%s", c.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	state, _ = os.ReadFile(c.path("class/infiniband/tree-fvc/ports/1/state"))
	if string(state) != "4: ACTIVE\n" {
		t.Errorf("port state %q after the SM answered", state)
	}
}
