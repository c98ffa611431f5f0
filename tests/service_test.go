package tests

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
)

// READY=1 reaches the service manager only when the daemon is usable: at that moment
// the kernel device exists (so `ip addr add` does not race the daemon) and the tree is
// mounted. STOPPING=1 follows SIGTERM.
func TestReadinessNotification(t *testing.T) {
	requireE2E(t)
	testenv.File(t, "/dev/fuse")
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ns, mnt := netns(t, "rdy"), mountDir(t)
	log := &testenv.Buffer{}
	cmd := exec.Command(binPath, "-name", "rdy", "-netns", ns, "-mount", mnt, "-9p", "")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()

	next := func(what string) string {
		t.Helper()
		buf := make([]byte, 4096)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s on NOTIFY_SOCKET: %v; log:\n%s", what, err, log)
		}
		return string(buf[:n])
	}
	msg := next("READY=1")
	if !strings.Contains(msg, "READY=1") || !strings.Contains(msg, "STATUS=interfaces ib0") {
		t.Fatalf("first notification %q, want READY=1 with STATUS=interfaces ib0 ...", msg)
	}
	// Checked at once, without waiting: this is what readiness promises.
	if out, err := exec.Command("ip", "-n", ns, "link", "show", "ib0").CombinedOutput(); err != nil {
		t.Errorf("READY=1 sent before ib0 existed in %s: %v %s", ns, err, out)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "class/net/ib0/pkey")); err != nil || string(b) != "0xffff\n" {
		t.Errorf("READY=1 sent before the tree was served: pkey %q, %v", b, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if msg := next("STOPPING=1"); !strings.Contains(msg, "STOPPING=1") {
		t.Errorf("after SIGTERM: notification %q, want STOPPING=1", msg)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("exit after SIGTERM: %v; log:\n%s", err, log)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("no exit within 15 s of SIGTERM; log:\n%s", log)
	}
}

// The unit file is valid for systemd: systemd-analyze verify checks its directives and
// that ExecStart names an executable (the freshly built binary stands in for the
// installed one).
func TestServiceUnitVerifies(t *testing.T) {
	tool := testenv.Tool(t, "systemd-analyze")
	unit, err := os.ReadFile("../contrib/ipoibfs.service")
	if err != nil {
		t.Fatal(err)
	}
	const installed = "/usr/local/sbin/ipoibfs"
	if !strings.Contains(string(unit), "ExecStart="+installed+" ") || !strings.Contains(string(unit), "Type=notify") {
		t.Fatalf("unit file lost its ExecStart=%s or Type=notify:\n%s", installed, unit)
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "ipoibfs.service")
	if err := os.WriteFile(f, []byte(strings.ReplaceAll(string(unit), installed, binPath)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, "verify", f).CombinedOutput()
	// verify also reports problems of units it pulls in (network.target's own
	// dependencies on a minimal container); only lines about our unit count.
	var ours []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "ipoibfs.service") {
			ours = append(ours, l)
		}
	}
	if len(ours) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(ours, "\n"))
	}
	// A broken unit must be caught by the same check, or it proves nothing.
	broken := strings.Replace(string(unit), "Type=notify", "Type=notify-please", 1)
	broken = strings.ReplaceAll(broken, installed, binPath)
	if err := os.WriteFile(f, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command(tool, "verify", f).CombinedOutput()
	if !strings.Contains(string(out), "ipoibfs.service") {
		t.Errorf("systemd-analyze verify accepted Type=notify-please: %s", out)
	}
}

// A second daemon started by mistake on the first one's namespace or mount point fails
// at once, naming the conflict, and the first keeps its device and its tree.
func TestSecondDaemonRefused(t *testing.T) {
	requireE2E(t)
	testenv.File(t, "/dev/fuse")
	ns, mnt := netns(t, "dup"), mountDir(t)
	startDaemon(t, "first", "-netns", ns, "-mount", mnt)
	waitLink(t, ns, "ib0")
	waitTree(t, mnt)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-netns", ns}, "a network device ib0 already exists in network namespace " + ns},
		{[]string{"-netns", netns(t, "dup2"), "-mount", mnt}, "-mount " + mnt + ": a fuse.ipoibfs file system"},
	} {
		args := append([]string{"-name", "second", "-9p", ""}, tc.args...)
		if len(tc.args) == 2 {
			args = append(args, "-mount", "")
		}
		out, err := run(t, 20*time.Second, binPath, args...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("second daemon %v: %v, output %q; want exit 1 saying %q", tc.args, err, out, tc.want)
		}
		if strings.Contains(out, "subnet manager on") || strings.Contains(out, "endpoint") {
			t.Errorf("second daemon %v started its HCA before refusing:\n%s", tc.args, out)
		}
	}
	out := mustRun(t, "ip", "-n", ns, "link", "show", "ib0")
	if !strings.Contains(out, "LOWER_UP") {
		t.Errorf("first daemon's ib0 after the refusals: %s", out)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "class/net/ib0/mode")); err != nil || string(b) != "datagram\n" {
		t.Errorf("first daemon's tree after the refusals: %q, %v", b, err)
	}
}

// A mount point the daemon cannot make (a path through a regular file) fails the
// daemon before it joins the fabric, naming -mount: it does not go on to say READY
// without the tree the administrator asked for.
func TestUnusableMountPointRefused(t *testing.T) {
	requireE2E(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(file, "tree")
	out, err := run(t, 20*time.Second, binPath, "-name", "badmnt", "-netns", netns(t, "badmnt"), "-9p", "", "-mount", mnt)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, "-mount "+mnt+": ") || !strings.Contains(out, "not a directory") {
		t.Errorf("-mount %s: %v, output %q; want exit 1 naming -mount and ENOTDIR", mnt, err, out)
	}
	if strings.Contains(out, "subnet manager on") || strings.Contains(out, "endpoint") {
		t.Errorf("the daemon started its HCA before refusing its mount point:\n%s", out)
	}
}
