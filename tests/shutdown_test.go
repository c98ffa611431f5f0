package tests

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShutdownDeletesEveryDevice: a daemon with 300 children, some up with an
// address, stops on SIGTERM with exit 0 and leaves no device of its own in its
// namespace. The daemon deletes them in one request per namespace (kernel.CloseAll;
// one at a time, 4000 children took 70-110 s, longer than systemd waits); the kernel
// test checks that the batch deletion is what removes them.
func TestShutdownDeletesEveryDevice(t *testing.T) {
	td := treeStart(t, "sd", "")
	waitLink(t, td.ns, "ib0")
	script := `for k in $(seq 1 300); do printf '0x%04x\n' $((0x8000 + k)) > class/net/ib0/create_child || exit 1; done`
	if _, stderr, code := td.bash(t, script, nil); code != 0 {
		t.Fatalf("creating 300 children: status %d: %s", code, stderr)
	}
	for _, c := range []string{"ib0.8001", "ib0.8002", "ib0.812c"} {
		mustRun(t, "ip", "-n", td.ns, "link", "set", c, "up")
	}
	mustRun(t, "ip", "-n", td.ns, "addr", "add", "10.88.0.1/24", "dev", "ib0.8001")
	if n := strings.Count(mustRun(t, "ip", "-n", td.ns, "-o", "link", "show"), "\n"); n != 302 {
		t.Fatalf("%d links before the shutdown, want lo, ib0 and 300 children", n)
	}
	_ = td.daemon.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-td.daemon.done:
		td.daemon.done <- err // for the cleanup, which signals and waits again
	case <-time.After(3 * time.Minute):
		t.Fatalf("no exit within 3 minutes of SIGTERM; log:\n%s", td.log.String())
	}
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v; log:\n%s", err, td.log.String())
	}
	if out := mustRun(t, "ip", "-n", td.ns, "-o", "link", "show"); strings.Count(out, "\n") != 1 || !strings.Contains(out, " lo:") {
		t.Errorf("links left after the shutdown:\n%s", out)
	}
	if strings.Contains(td.log.String(), "closing the kernel devices") {
		t.Errorf("the batch deletion failed; log:\n%s", td.log.String())
	}
}
