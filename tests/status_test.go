package tests

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// ipoibfs status reads one screen from the mounted tree and from 9P: the HCA and its
// port, each interface with its parent, mode, MTU and state.
func TestStatusCommand(t *testing.T) {
	td := treeStart(t, "st", "")
	waitLink(t, td.ns, "ib0")
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^CA '.+' \(ipoibfs-soft\)$`),
		regexp.MustCompile(`(?m)^\tport 1: ACTIVE \(LinkUp\), 40 Gb/sec \(4X QDR\), LID 0x[0-9a-f]+, SM LID 0x[0-9a-f]+$`),
		regexp.MustCompile(`(?m)^ib0 +0xffff +- +datagram +2044 +1 +up +0`),
		regexp.MustCompile(`(?m)^ib0\.8001 +0x8001 +ib0 +datagram +\d+ +- +down +0`),
	}
	for _, args := range [][]string{{"status", "-tree", td.mnt}, {"status", "-9p", td.addr}} {
		out, err := exec.Command(binPath, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ipoibfs %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		for _, re := range want {
			if !re.Match(out) {
				t.Errorf("ipoibfs %s lacks %s:\n%s", strings.Join(args, " "), re, out)
			}
		}
	}
	out, err := exec.Command(binPath, "status", "-tree", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is the tree mounted?") {
		t.Errorf("status of an empty directory: %v %s", err, out)
	}
}
