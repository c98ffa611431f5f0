package fuse

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"ipoibfs/fs"
	"ipoibfs/internal/testenv"
	"ipoibfs/ipoib"
)

// mount mounts root in a fresh temporary directory and unmounts it at cleanup.
func mount(t *testing.T, root *fs.Node) string {
	t.Helper()
	testenv.Root(t)
	testenv.File(t, "/dev/fuse")
	dir := t.TempDir()
	srv, err := Mount(dir, root, Options{Log: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	return dir
}

// sh runs a bash command line in dir and returns stdout, stderr and the exit code.
func sh(t *testing.T, dir, cmd string, cred *syscall.Credential) (string, string, int) {
	t.Helper()
	// cd in the shell, not through exec.Cmd.Dir: the forked child's chdir into our own
	// mount would run while the parent thread is stopped in vfork, and a garbage
	// collection waiting for that thread would stop the FUSE server: deadlock.
	c := exec.Command(testenv.Tool(t, "bash"), "-c", "cd "+shellQuote(dir)+" || exit 99; "+cmd)
	c.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	if cred != nil {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out, errb strings.Builder
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return out.String(), errb.String(), code
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestShell runs the documented shell commands over a FUSE mount.
func TestShell(t *testing.T) {
	v := newEnv(t)
	dir := mount(t, v.tree.Root())
	type shellCase struct {
		cmd     string
		out     string // exact stdout ("" = must be empty); a leading "~" means regexp
		errText string // substring of stderr ("" = must be empty)
		code    int
	}
	// Switching to connected mode works when the HCA offers it (the 0x80 flag in the
	// hardware address) and is "Invalid argument" otherwise.
	cm := func(cmd string) shellCase {
		if v.ib0.HWAddr().Flags()&ipoib.FlagRC != 0 {
			return shellCase{cmd: cmd + " && cat class/net/ib0/mode", out: "connected\n"}
		}
		return shellCase{cmd: cmd, errText: "write error: Invalid argument", code: 1}
	}
	for _, c := range []shellCase{
		{cmd: "echo 0x8001 > class/net/ib0/create_child"},
		{cmd: "cat class/net/ib0.8001/pkey", out: "0x8001\n"},
		{cmd: "cat class/net/ib0.8001/parent", out: "ib0\n"},
		{cmd: "ls class/net", out: "ib0\nib0.8001\n"},
		{cmd: "echo 1 > class/net/ib0/create_child", errText: "write error: Name not unique on network", code: 1},
		{cmd: "echo 0x0001 > class/net/ib0/delete_child", errText: "write error: No such device", code: 1},
		{cmd: "echo -n Connected > class/net/ib0/mode", errText: "write error: Invalid argument", code: 1},
		{cmd: "printf 'connected\\n\\n' > class/net/ib0/mode", errText: "write error: Invalid argument", code: 1},
		{cmd: "echo -n connected > class/net/ib0/mode", errText: "write error: Invalid argument", code: 1},
		cm("echo connected > class/net/ib0/mode"),
		{cmd: "echo datagram > class/net/ib0/mode"},
		{cmd: "cat class/net/ib0/mode", out: "datagram\n"},
		{cmd: "cat kernel/debug/ipoib/ib0_mcg", out: `~^GID: ff12:401b:ffff:0:0:0:ffff:ffff\n  created: +\d+\n  queuelen: +0\n  complete: +yes\n  send_only: +no\n\n`},
		{cmd: "ls kernel/debug/ipoib", out: "ib0.8001_mcg\nib0.8001_path\nib0_mcg\nib0_path\n"},
		{cmd: "echo 5 >> class/net/ib0/mtu", errText: "write error: Invalid argument", code: 1},
		{cmd: "echo 2000 >> class/net/ib0/mtu"},
		{cmd: "cat class/net/ib0/mtu", out: "2000\n"},
		{cmd: "echo 0x8001 > class/net/ib0/delete_child"},
		{cmd: "ls class/net", out: "ib0\n"},
		{cmd: "cat class/net/ib0.8001/pkey", errText: "No such file or directory", code: 1},
		{cmd: "cat class/net/ib0/create_child", errText: "Permission denied", code: 1},
		{cmd: "echo 1 > class/net/ib0/pkey", errText: "Permission denied", code: 1},
		{cmd: "echo 1 > class/net/ib0/newfile", errText: "Permission denied", code: 1},
		{cmd: "rm class/net/ib0/mtu", errText: "Operation not permitted", code: 1},
		{cmd: "mkdir class/net/x", errText: "Operation not permitted", code: 1},
		{cmd: "echo 1 > class/net/ib0/umcast; cat class/net/ib0/umcast", out: "1\n"},
		{cmd: "echo junk > class/net/ib0/umcast; cat class/net/ib0/umcast", out: "0\n"},
		{cmd: "cat class/infiniband/n1/ports/1/gids/0", out: `~^fe80:0000:0000:0000(:[0-9a-f]{4}){4}\n$`},
		{cmd: "cat class/infiniband/n1/ports/1/rate", out: "40 Gb/sec (4X QDR)\n"},
		{cmd: "cat class/net/ib0/ethtool/coalesce", out: "rx-usecs: 0\nrx-frames: 0\n"},
		{cmd: "echo rx-usecs 16 > class/net/ib0/ethtool/coalesce; cat class/net/ib0/ethtool/coalesce", out: "rx-usecs: 16\nrx-frames: 0\n"},
		{cmd: "echo rx-frames 70000 > class/net/ib0/ethtool/coalesce", errText: "write error: Invalid argument", code: 1},
		{cmd: "echo tso off > class/net/ib0/ethtool/features; grep tcp class/net/ib0/ethtool/features", out: "tcp-segmentation-offload: off\n"},
		{cmd: "head -1 class/net/ib0/ethtool/statistics", out: "NIC statistics:\n"},
		{cmd: "cat module/ib_ipoib/parameters/recv_queue_size", out: "256\n"},
		{cmd: "echo 2 > module/ib_ipoib/parameters/debug_level; cat module/ib_ipoib/parameters/debug_level", out: "2\n"},
		{cmd: "echo 0 > module/ib_ipoib/parameters/debug_level"},
		{cmd: "echo 1 > module/ib_ipoib/parameters/send_queue_size", errText: "Permission denied", code: 1},
		// A configuration round-trips; a bad one fails at close and leaves the old one.
		{cmd: "cat sm/partitions > /tmp/ipoibfs-parts.$$ && cat /tmp/ipoibfs-parts.$$ > sm/partitions; r=$?; rm -f /tmp/ipoibfs-parts.$$; exit $r"},
		{cmd: "printf 'Default=0x7fff : ALL=full;\\nP1=0x8001 , ipoib: ALL=full;\\n' | cat > sm/partitions"},
		{cmd: "grep -c P1 sm/partitions", out: "1\n"},
		{cmd: "printf 'nonsense here\\n' | cat > sm/partitions", errText: "Invalid argument", code: 1},
		{cmd: "grep -c P1 sm/partitions", out: "1\n"},
		{cmd: "ls -l class/net/ib0/create_child class/net/ib0/mtu class/net/ib0/pkey | cut -c1-10",
			out: "--w-------\n-rw-r--r--\n-r--r--r--\n"},
		{cmd: "stat -c '%U %s' class/net/ib0/mtu", out: "root 4096\n"},
	} {
		out, errText, code := sh(t, dir, c.cmd, nil)
		okOut := out == c.out
		if strings.HasPrefix(c.out, "~") {
			okOut = regexp.MustCompile(c.out[1:]).MatchString(out)
		}
		okErr := (c.errText == "" && errText == "") || (c.errText != "" && strings.Contains(errText, c.errText))
		if !okOut || !okErr || code != c.code {
			t.Errorf("$ %s\n  stdout %q (want %q)\n  stderr %q (want %q)\n  exit %d (want %d)", c.cmd, out, c.out, errText, c.errText, code, c.code)
		}
	}
	// Every failed write produced a log line naming the file.
	logs := strings.Join(v.log.Take(), "\n")
	for _, want := range []string{"class/net/ib0/create_child: P_Key 0x8001 is already used", "class/net/ib0/delete_child: no child of ib0 has P_Key 0x0001",
		"class/net/ib0/mtu: MTU 5 outside", "sm/partitions: line 1: "} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

// TestGoErrnos checks errnos from Go's os package over the mount, including the
// partitions error reported by close(2).
func TestGoErrnos(t *testing.T) {
	v := newEnv(t)
	dir := mount(t, v.tree.Root())
	p := func(s string) string { return filepath.Join(dir, s) }
	if err := os.WriteFile(p("class/net/ib0/create_child"), []byte("0x8002"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p("class/net/ib0/create_child"), []byte("0x8002"), 0); !errors.Is(err, syscall.ENOTUNIQ) {
		t.Errorf("duplicate create: %v", err)
	}
	f, err := os.OpenFile(p("sm/partitions"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("Default=0x7fff : ALL=full;\nP2=0x8002 : ALL=bogus;\n")); err != nil {
		t.Fatalf("write is accepted, the config is checked at close: %v", err)
	}
	if err := f.Close(); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("close of a bad config: %v, want EINVAL", err)
	}
	// Reads see fresh content at each open, and a snapshot per open file.
	f, err = os.Open(p("class/net/ib0.8002/mtu"))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	f.Read(b)
	c, _ := v.e.Interface("ib0.8002")
	if err := c.SetMTU(100); err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, 10)
	k, _ := f.Read(rest)
	if got := string(b) + string(rest[:k]); got == "100\n" || !strings.HasSuffix(got, "\n") {
		t.Errorf("one open file mixed two values: %q", got)
	}
	f.Close()
	if got, _ := os.ReadFile(p("class/net/ib0.8002/mtu")); string(got) != "100\n" {
		t.Errorf("fresh open: %q", got)
	}
	// pread at 0 on the same descriptor is fresh, as in sysfs.
	f, _ = os.Open(p("class/net/ib0.8002/mtu"))
	c.SetMTU(200)
	k, _ = f.ReadAt(rest, 0)
	if string(rest[:k]) != "200\n" {
		t.Errorf("pread at 0: %q", rest[:k])
	}
	f.Close()
}

// TestNonRoot: an unprivileged user reads 0444 files and gets EACCES on 0200 ones.
func TestNonRoot(t *testing.T) {
	v := newEnv(t)
	dir := mount(t, v.tree.Root())
	// t.TempDir's directories are 0700; let nobody reach the mount point.
	for d := filepath.Dir(dir); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0755); err != nil {
			t.Fatal(err)
		}
	}
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	for _, c := range []struct {
		cmd, out, errText string
		code              int
	}{
		{cmd: "id -u", out: "65534\n"},
		{cmd: "cat class/net/ib0/pkey", out: "0xffff\n"},
		{cmd: "cat class/net/ib0/mtu >/dev/null && ls class/net", out: "ib0\n"},
		{cmd: "echo 1 > class/net/ib0/create_child", errText: "Permission denied", code: 1},
		{cmd: "echo 1000 > class/net/ib0/mtu", errText: "Permission denied", code: 1},
		{cmd: "echo 1 > sm/partitions", errText: "Permission denied", code: 1},
	} {
		out, errText, code := sh(t, dir, c.cmd, nobody)
		okErr := (c.errText == "" && errText == "") || (c.errText != "" && strings.Contains(errText, c.errText))
		if out != c.out || !okErr || code != c.code {
			t.Errorf("(uid 65534) $ %s\n  stdout %q (want %q)\n  stderr %q (want %q)\n  exit %d (want %d)", c.cmd, out, c.out, errText, c.errText, code, c.code)
		}
	}
	if len(v.ib0.Children()) != 0 {
		t.Error("nobody created a child")
	}
}

// deadMount leaves a FUSE mount at dir whose server is gone.
func deadMount(t *testing.T, dir string) {
	t.Helper()
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	if err := syscall.Mount("ipoibfs-test", dir, "fuse.ipoibfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	syscall.Close(fd) // the "daemon" dies
}

func TestCleanupStale(t *testing.T) {
	testenv.Root(t)
	testenv.File(t, "/dev/fuse")
	dir := t.TempDir()
	if did, err := CleanupStale(dir); did || err != nil {
		t.Errorf("plain directory: %v %v", did, err)
	}
	deadMount(t, dir)
	if _, err := os.Stat(dir); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("dead mount: stat %v, want ENOTCONN", err)
	}
	did, err := CleanupStale(dir)
	if !did || err != nil {
		t.Fatalf("CleanupStale: %v %v", did, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("after cleanup: %v", err)
	}
	// Mounting works again, and a live mount is left alone.
	v := newEnv(t)
	srv, err := Mount(dir, v.tree.Root(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Unmount()
	if did, err := CleanupStale(dir); did || err != nil {
		t.Errorf("live mount: %v %v", did, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "class/net/ib0/type")); err != nil || string(b) != "32\n" {
		t.Errorf("read %q %v", b, err)
	}
}

// TestUnmountBusy: Unmount with an open file detaches lazily instead of failing.
func TestUnmountBusy(t *testing.T) {
	testenv.Root(t)
	testenv.File(t, "/dev/fuse")
	v := newEnv(t)
	dir := t.TempDir()
	srv, err := Mount(dir, v.tree.Root(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "class/net/ib0/type"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Unmount(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "class")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount still visible: %v", err)
	}
	b := make([]byte, 8)
	k, _ := f.Read(b)
	if string(b[:k]) != "32\n" {
		t.Errorf("open file after lazy unmount: %q", b[:k])
	}
	f.Close()
}

// mountChanges is mount with Options.Changes: the kernel caches interface names too.
func mountChanges(t *testing.T, root *fs.Node, changes <-chan string) (string, *Server) {
	t.Helper()
	testenv.Root(t)
	testenv.File(t, "/dev/fuse")
	dir := t.TempDir()
	srv, err := Mount(dir, root, Options{Log: func(s string) { t.Log(s) }, Changes: changes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	return dir, srv
}

// With Changes, names are cached as sysfs dentries are: a removed interface's names
// stay in the kernel's cache until the change names it (which is what makes the test
// able to fail), and go when it does: a name, or "" for all of them.
func TestCachedNamesDroppedOnChange(t *testing.T) {
	v := newEnv(t)
	changes := make(chan string, 4)
	dir, srv := mountChanges(t, v.tree.Root(), changes)
	exists := func(p string) bool {
		_, _, code := sh(t, dir, "test -e "+p, nil)
		return code == 0
	}
	for round, name := range []string{"ib0.8001", ""} {
		if _, err := v.ib0.CreateChild(0x8001); err != nil {
			t.Fatal(err)
		}
		if out, _, code := sh(t, dir, "cat class/net/ib0.8001/pkey kernel/debug/ipoib/ib0.8001_mcg >/dev/null && echo ok", nil); code != 0 || out != "ok\n" {
			t.Fatalf("round %d: reading the child: %q %d", round, out, code)
		}
		c, _ := v.e.Interface("ib0.8001")
		if err := v.ib0.RemoveChild(c); err != nil {
			t.Fatal(err)
		}
		if !exists("class/net/ib0.8001") {
			t.Fatalf("round %d: the removed child's name left the cache with no change sent: names are not cached", round)
		}
		changes <- name
		srv.inv.sync()
		for _, p := range []string{"class/net/ib0.8001", "kernel/debug/ipoib/ib0.8001_mcg", "kernel/debug/ipoib/ib0.8001_path"} {
			if exists(p) {
				t.Errorf("round %d (change %q): %s still there", round, name, p)
			}
		}
	}
	if !exists("class/net/ib0/pkey") {
		t.Error("ib0 lost")
	}
}

// Through the engine's own changes: a child deleted by a write is gone when the write
// returns; one deleted or renamed elsewhere (as ip link does) is gone soon after.
func TestCachedNamesFollowTheEngine(t *testing.T) {
	v := newEnv(t)
	changes, cancel := v.tree.Changes()
	defer cancel()
	dir, _ := mountChanges(t, v.tree.Root(), changes)
	script := `echo 0x8002 > class/net/ib0/create_child && cat class/net/ib0.8002/pkey &&
echo 0x8002 > class/net/ib0/delete_child && if test -e class/net/ib0.8002; then echo stale; else echo gone; fi`
	if out, errb, code := sh(t, dir, script, nil); code != 0 || out != "0x8002\ngone\n" {
		t.Fatalf("create, read, delete, test: %q %q %d", out, errb, code)
	}
	if _, err := v.ib0.CreateChild(0x8003); err != nil {
		t.Fatal(err)
	}
	if _, _, code := sh(t, dir, "cat class/net/ib0.8003/pkey", nil); code != 0 {
		t.Fatal("new child not readable")
	}
	c, _ := v.e.Interface("ib0.8003")
	if err := v.e.Rename(c, "storage3"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old name gone from the cache", func() bool {
		_, _, code := sh(t, dir, "test -e class/net/ib0.8003", nil)
		return code != 0
	})
	if out, _, code := sh(t, dir, "cat class/net/storage3/pkey", nil); code != 0 || out != "0x8003\n" {
		t.Errorf("renamed child: %q %d", out, code)
	}
}

// A descriptor holds the interface it was opened on, as a sysfs one holds its kobject:
// after a delete it answers ENODEV and never reaches the child made again under the
// name, which new opens reach (its files have new inode numbers, so the kernel's
// cached inodes of the old child are not reused); after a rename it goes on working.
func TestDescriptorHoldsItsInterface(t *testing.T) {
	v := newEnv(t)
	changes, cancel := v.tree.Changes()
	defer cancel()
	dir, _ := mountChanges(t, v.tree.Root(), changes)
	p := func(s string) string { return filepath.Join(dir, s) }
	if _, _, code := sh(t, dir, "echo 0x8005 > class/net/ib0/create_child", nil); code != 0 {
		t.Fatal("create_child")
	}
	old, err := os.OpenFile(p("class/net/ib0.8005/umcast"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if out, errb, code := sh(t, dir, "echo 0x8005 > class/net/ib0/delete_child && echo 0x8005 > class/net/ib0/create_child && cat class/net/ib0.8005/umcast", nil); code != 0 || out != "0\n" {
		t.Fatalf("delete, create, read: %q %q %d", out, errb, code)
	}
	if _, err := old.Write([]byte("1\n")); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("write through the deleted child's descriptor: %v, want ENODEV", err)
	}
	if out, errb, code := sh(t, dir, "cat class/net/ib0.8005/umcast && echo 1 > class/net/ib0.8005/umcast && cat class/net/ib0.8005/umcast", nil); code != 0 || out != "0\n1\n" {
		t.Errorf("the new child through new opens: %q %q %d", out, errb, code)
	}
	cur, err := os.OpenFile(p("class/net/ib0.8005/umcast"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	c, _ := v.e.Interface("ib0.8005")
	if err := v.e.Rename(c, "storage5"); err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Write([]byte("0\n")); err != nil {
		t.Errorf("write after a rename: %v", err)
	}
	waitFor(t, "storage5 in the mount", func() bool { _, err := os.Stat(p("class/net/storage5")); return err == nil })
	if b, err := os.ReadFile(p("class/net/storage5/umcast")); err != nil || string(b) != "0\n" {
		t.Errorf("storage5/umcast after the write through the old name's descriptor: %q, %v", b, err)
	}
}

// Root's changes of names reach the daemon (the kernel refuses other users itself):
// refused as sysfs refuses them, and logged with who asked.
func TestNameChangesLogged(t *testing.T) {
	v := newEnv(t)
	dir := mount(t, v.tree.Root())
	v.log.Take()
	for _, c := range []struct{ cmd, errText, line string }{
		{"mkdir class/net/x", "Operation not permitted", "class/net/x: mkdir refused (operation not permitted)"},
		{"rm -f class/net/ib0/mtu", "Operation not permitted", "class/net/ib0/mtu: unlink refused (operation not permitted)"},
		{"mv class/net/ib0/mtu class/net/ib0/mtu2", "Operation not permitted", "class/net/ib0/mtu: rename refused"},
		{"ln -s ib0 class/net/ib9", "Operation not permitted", "class/net/ib9: symlink refused"},
	} {
		_, errb, code := sh(t, dir, c.cmd, nil)
		if code == 0 || !strings.Contains(errb, c.errText) {
			t.Errorf("%s: exit %d, %q; want %q", c.cmd, code, errb, c.errText)
		}
		// mv asks renameat2(RENAME_NOREPLACE) first, which kernfs refuses with
		// EINVAL, then rename: each refusal is logged.
		lines := v.log.Take()
		ok := len(lines) > 0
		for _, l := range lines {
			ok = ok && strings.HasPrefix(l, c.line) && strings.Contains(l, "as uid=0 via=fuse")
		}
		if !ok || !strings.Contains(lines[len(lines)-1], "(operation not permitted)") {
			t.Errorf("%s: logged %q, want lines starting %q, the last EPERM", c.cmd, lines, c.line)
		}
	}
}
