package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/internal/testenv"
)

// remoteMount runs `ipoibfs mount ADDR DIR` in the foreground and waits for the tree;
// wrap, if any, is the command line it runs under (nsenter, setpriv).
func remoteMount(t *testing.T, addr, dir string, wrap ...string) (cmd *exec.Cmd, done chan error, log *testenv.Buffer) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	log = &testenv.Buffer{}
	argv := append(wrap, binPath, "mount", addr, dir)
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	})
	treeWait(t, dir, log)
	return cmd, done, log
}

// Node B's tree mounted on "host A" through `ipoibfs mount` gives the same transcript of
// the documented commands as B's own mount; a dropped connection gives ENOTCONN, not a
// hang; umount ends the mount process with status 0.
func TestRemoteMountTranscript(t *testing.T) {
	td := treeStart(t, "rmt", "")
	treeWaitMCG(t, td)
	remote := filepath.Join(t.TempDir(), "remote")
	_, done, log := remoteMount(t, td.addr, remote)

	local, stderr, code := td.bash(t, treeDocScript, nil)
	if code != 0 || stderr != "" {
		t.Errorf("bash on B's mount: exit %d, stderr %q", code, stderr)
	}
	treeCheckDoc(t, "bash on B's own mount", local)
	rtd := *td
	rtd.mnt = remote
	got, stderr, code := rtd.bash(t, treeDocScript, nil)
	if code != 0 || stderr != "" {
		t.Errorf("bash on the remote mount: exit %d, stderr %q", code, stderr)
	}
	if diff := cmp.Diff(local, got); diff != "" {
		t.Errorf("transcripts differ (-B's mount +remote mount):\n%s", diff)
	}
	// The local kernel applies the server's modes to local users too.
	_, stderr, _ = rtd.bash(t, "echo connected > class/net/ib0/mode", &syscall.Credential{Uid: 65534, Gid: 65534})
	if !strings.Contains(stderr, "Permission denied") {
		t.Errorf("nobody writing mode on the remote mount: stderr %q, want Permission denied", stderr)
	}
	if b, err := os.ReadFile(td.path("class/net/ib0/mode")); err != nil || string(b) != "datagram\n" {
		t.Errorf("mode on B after nobody's write: %q, %v", b, err)
	}
	// Attribute changes are the server's to decide, as on its own mount: root's chmod
	// is refused, its truncate of a file it may write is not.
	if err := os.Chmod(filepath.Join(remote, "class/net/ib0/pkey"), 0o666); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chmod on the remote mount: %v, want EPERM", err)
	}
	if err := os.Truncate(filepath.Join(remote, "class/net/ib0/mtu"), 0); err != nil {
		t.Errorf("truncate mtu on the remote mount: %v", err)
	}
	// Local root without CAP_NET_ADMIN acts on the server without it too, whether it
	// opens the file itself or is handed root's descriptor; root's own write works.
	testenv.Tool(t, "setpriv")
	cc := filepath.Join(remote, "class/net/ib0/create_child")
	if out, err := exec.Command("setpriv", "--bounding-set=-net_admin", "--", "sh", "-c", "printf 0x8007 > "+cc).CombinedOutput(); err == nil {
		t.Errorf("root without CAP_NET_ADMIN created a child through the remote mount: %s", out)
	}
	f, err := os.OpenFile(cc, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	handed := exec.Command("setpriv", "--bounding-set=-net_admin", "--", "sh", "-c", "printf 0x8008 >&3")
	handed.ExtraFiles = []*os.File{f}
	if out, err := handed.CombinedOutput(); err == nil {
		t.Errorf("root's descriptor handed to a process without CAP_NET_ADMIN created a child: %s", out)
	}
	if _, err := f.Write([]byte("0x8009")); err != nil {
		t.Errorf("root's own write through the remote mount: %v", err)
	}
	f.Close()
	// sm/partitions' text is applied at the close, and its verdict is the close's.
	parts := filepath.Join(remote, "sm/partitions")
	if err := os.WriteFile(parts, []byte("x\n"), 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a bad partitions.conf through the remote mount: %v, want EINVAL at the close", err)
	}
	if err := os.WriteFile(parts, []byte("Default=0x7fff, ipoib : ALL=full;\n"), 0); err != nil {
		t.Errorf("a good partitions.conf through the remote mount: %v", err)
	}
	// A descriptor shared with a subshell stays usable after the subshell's close, as
	// on the local mount.
	if out, err := exec.Command("sh", "-c", "exec 3>"+cc+"; (printf 0x800a >&3); printf 0x800b >&3").CombinedOutput(); err != nil {
		t.Errorf("writes through a descriptor a subshell shared: %v %s", err, out)
	}
	if got := treeLs(t, td.path("class/net")); !slices.Equal(got, []string{"ib0", "ib0.8009", "ib0.800a", "ib0.800b"}) {
		t.Errorf("class/net after the writes through the remote mount: %v, want ib0 and ib0.8009, ib0.800a, ib0.800b", got)
	}
	if n := strings.Count(td.log.String(), "CAP_NET_ADMIN is needed (EPERM)"); n != 2 {
		t.Errorf("B logged %d writes refused for want of CAP_NET_ADMIN, want 2:\n%s", n, td.log.String())
	}

	// B goes away: the remote mount answers ENOTCONN at once. (Once B has exited: the
	// signal only starts its shutdown, and until it closes the connection the mount
	// still answers.)
	_ = td.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(20 * time.Second); syscall.Kill(td.cmd.Process.Pid, 0) == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("B did not exit within 20 s of SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "cat", filepath.Join(remote, "class/net/ib0/pkey")).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("cat on the remote mount hung after the server went away")
	}
	if err == nil || !strings.Contains(string(out), "Transport endpoint is not connected") {
		t.Errorf("cat after the server went away: %v %q, want ENOTCONN", err, out)
	}
	if err := syscall.Unmount(remote, 0); err != nil {
		t.Fatalf("umount %s: %v", remote, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ipoibfs mount after umount: %v; log:\n%s", err, log)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("ipoibfs mount still running 10 s after umount; log:\n%s", log)
	}
}

// mount(8) runs mount.ipoibfs for `mount -t ipoibfs ADDR DIR` (and fstab lines): it
// returns once the tree is mounted and a detached process serves it until umount. The
// helper is made visible to mount(8) in a private mount namespace (an overlay on the
// helper directory) so the host's /sbin is not touched.
func TestMountTypeIpoibfs(t *testing.T) {
	testenv.Tool(t, "mount")
	testenv.Tool(t, "unshare")
	testenv.Tool(t, "pgrep")
	td := treeStart(t, "mtyp", "")
	sbin, err := filepath.EvalSymlinks("/sbin")
	if err != nil {
		t.Fatal(err)
	}
	extra := t.TempDir()
	if err := os.Symlink(binPath, filepath.Join(extra, "mount.ipoibfs")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	errFile := filepath.Join(t.TempDir(), "err") // not in the package's directory
	script := `set -e
mount -t overlay overlay -o lowerdir=` + extra + `:` + sbin + ` ` + sbin + `
mount -t ipoibfs ` + td.addr + ` ` + dir + `
grep " ` + dir + ` " /proc/mounts | cut -d' ' -f1,3
cat ` + dir + `/class/net/ib0/pkey
umount ` + dir + `
if mount -t ipoibfs 127.0.0.1:1 ` + dir + ` 2>` + errFile + `; then echo "mounted a dead address"; fi
echo "status of the failed mount: $(cat ` + errFile + `)"
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "private", "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("mount -t ipoibfs: %v\n%s", err, out)
	}
	want := td.addr + " fuse.ipoibfs\n0xffff\nstatus of the failed mount: mount.ipoibfs: dial tcp 127.0.0.1:1: connect: connection refused\n"
	if string(out) != want {
		t.Errorf("mount -t ipoibfs transcript (-want +got):\n%s", cmp.Diff(want, string(out)))
	}
	// The detached server ended with the umount: nothing serves from that mount any more.
	deadline := time.Now().Add(10 * time.Second)
	for {
		o, _ := exec.Command("pgrep", "-f", "mount "+td.addr+" "+dir).Output()
		if len(o) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("mount.ipoibfs's server still running after umount: %s", o)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A mount whose process was killed leaves a dead FUSE mount (every access ENOTCONN);
// `ipoibfs mount` on the same directory removes it and mounts again, as the daemon
// does with its own.
func TestRemoteMountReplacesADeadOne(t *testing.T) {
	td := treeStart(t, "rmd", "")
	remote := filepath.Join(t.TempDir(), "remote")
	first, done, _ := remoteMount(t, td.addr, remote)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-done
	if _, err := os.Stat(filepath.Join(remote, "class")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after the mount process was killed: %v, want ENOTCONN (a dead mount)", err)
	}
	log := &testenv.Buffer{}
	again := exec.Command(binPath, "mount", td.addr, remote)
	again.Stdout, again.Stderr = log, log
	if err := again.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Process.Kill(); _ = again.Wait() })
	treeWait(t, remote, log)
	if got := readTrim(t, filepath.Join(remote, "class/net/ib0/pkey")); got != "0xffff" {
		t.Errorf("pkey through the new mount: %q", got)
	}
	if !strings.Contains(log.String(), "removed a dead mount") {
		t.Errorf("the new mount did not say it removed the dead one:\n%s", log.String())
	}
}

// A copy of the remote mount in another mount namespace (private propagation, as
// ipoibfs exec makes it) does not keep `ipoibfs mount` from ending on SIGTERM: the
// connection is aborted, as the daemon does with its own mount.
func TestRemoteMountEndsWithACopyElsewhere(t *testing.T) {
	unshare := testenv.Tool(t, "unshare")
	td := treeStart(t, "rmp", "")
	remote := filepath.Join(t.TempDir(), "remote")
	cmd, done, log := remoteMount(t, td.addr, remote)
	pin := exec.Command(unshare, "-m", "--propagation", "private", "sleep", "120")
	if err := pin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pin.Process.Kill(); _ = pin.Wait() })
	time.Sleep(300 * time.Millisecond) // the copy is made
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("ipoibfs mount still running 30 s after SIGTERM with a copy of its mount elsewhere; log:\n%s", log.String())
	}
}

// `-o ro` mounts read-only: reads work, every write is EROFS from the local kernel
// (it was accepted and ignored, a read-write mount).
func TestRemoteMountReadOnly(t *testing.T) {
	td := treeStart(t, "rmo", "")
	remote := filepath.Join(t.TempDir(), "remote")
	if err := os.MkdirAll(remote, 0o755); err != nil {
		t.Fatal(err)
	}
	log := &testenv.Buffer{}
	cmd := exec.Command(binPath, "mount", "-o", "ro,noatime", td.addr, remote)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = syscall.Unmount(remote, syscall.MNT_DETACH) })
	treeWait(t, remote, log)
	if got := readTrim(t, filepath.Join(remote, "class/net/ib0/mode")); got != "datagram" {
		t.Errorf("mode through the read-only mount: %q", got)
	}
	err := os.WriteFile(filepath.Join(remote, "class/net/ib0/mode"), []byte("connected\n"), 0)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("a write through the read-only mount: %v, want EROFS", err)
	}
	if got := readTrim(t, td.path("class/net/ib0/mode")); got != "datagram" {
		t.Errorf("mode on the server after the refused write: %q", got)
	}
}

// `ipoibfs mount` run without CAP_NET_ADMIN, against a server on "another host" that
// believes attach names (-9p-trust-uname; here a network namespace on a veth pair, so
// the server cannot find the client's socket and takes it as remote): a writer as
// capable as the mount process itself goes through the mount's own attach, which must
// say it has no CAP_NET_ADMIN (a plain attach as uid 0 was granted it by the trusting
// server: a review found it).
func TestRemoteMountWithoutNetAdmin(t *testing.T) {
	testenv.Tool(t, "setpriv")
	testenv.Tool(t, "nsenter")
	ns := netns(t, "rnc")
	mustRun(t, "ip", "netns", "add", ns)
	host, peer := "ipo"+strconv.Itoa(os.Getpid()%100000)+"h", "ipo"+strconv.Itoa(os.Getpid()%100000)+"p"
	_ = exec.Command("ip", "link", "del", host).Run()
	mustRun(t, "ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	mustRun(t, "ip", "addr", "add", "10.73.0.1/24", "dev", host)
	mustRun(t, "ip", "link", "set", host, "up")
	mustRun(t, "ip", "-n", ns, "addr", "add", "10.73.0.2/24", "dev", peer)
	mustRun(t, "ip", "-n", ns, "link", "set", peer, "up")
	mustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")

	port := treeFreePort(t)
	addr := fmt.Sprintf("10.73.0.1:%d", port)
	td := treeStart(t, "rnca", "", "-9p", addr, "-9p-allow", "10.73.0.0/24", "-9p-trust-uname")
	dir := filepath.Join(t.TempDir(), "remote")
	remoteMount(t, addr, dir, "nsenter", "--net=/run/netns/"+ns, "setpriv", "--bounding-set=-net_admin", "--")
	cc := filepath.Join(dir, "class/net/ib0/create_child")
	if out, err := exec.Command("setpriv", "--bounding-set=-net_admin", "--", "sh", "-c", "printf 0x8007 > "+cc).CombinedOutput(); err == nil {
		t.Errorf("root without CAP_NET_ADMIN created a child through a mount without it: %s", out)
	}
	if _, err := os.Stat(td.path("class/net/ib0.8007")); err == nil {
		t.Error("ib0.8007 exists on the server")
	}
	// The server did take the mount as remote and trusted its name: root's read of a
	// root-only file works (nobody's would be refused).
	if _, err := os.ReadFile(filepath.Join(dir, "sm/groups")); err != nil {
		t.Errorf("root's read of sm/groups through the trusted mount: %v", err)
	}
}
