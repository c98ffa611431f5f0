package tests

// End-to-end tests of the control tree as the daemon serves it: the FUSE mount driven by
// bash and Go, the 9P server driven by the `ipoibfs 9p` subcommand, a Go 9P client,
// diod's tools and the Linux v9fs client in a QEMU guest, all against real daemons.
//
// Never start a child process whose working directory is inside a daemon's mount (see
// fs/fuse): shells cd there themselves (bash -c 'cd MNT && ...').

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs/ninep"
	"ipoibfs/internal/testenv"
	"ipoibfs/internal/vm"
)

// treeDaemon is a daemon with its tree mounted at mnt and served over 9P on addr.
type treeDaemon struct {
	*daemon
	mnt  string
	addr string // 127.0.0.1:port
	port int
	ns   string
}

func treeRequire(t *testing.T) {
	t.Helper()
	testenv.Root(t)
	testenv.File(t, "/dev/fuse")
	testenv.File(t, "/dev/net/tun")
	testenv.Tool(t, "ip")
	testenv.Tool(t, "bash")
}

// treeFreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func treeFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// treeNetns is netns(t, tag), created here with IPv6 router solicitations off so that
// the interfaces' multicast groups (ib0_mcg) do not change a few seconds after start.
func treeNetns(t *testing.T, tag string) string {
	t.Helper()
	ns := netns(t, tag)
	mustRun(t, "ip", "netns", "add", ns)
	mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-q", "-w",
		"net.ipv6.conf.default.router_solicitations=0", "net.ipv6.conf.all.router_solicitations=0")
	return ns
}

// treeMountDir returns a fresh mount point path whose parents other users can traverse.
func treeMountDir(t *testing.T) string {
	t.Helper()
	tmp := t.TempDir()
	for d := tmp; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(tmp, "mnt")
}

// treeNoMountAt is a cleanup: the daemon must leave no mount at dir. A mount that is
// still there is detached so the temporary directory can go.
func treeNoMountAt(t *testing.T, dir string) {
	t.Helper()
	t.Cleanup(func() {
		b, err := os.ReadFile("/proc/mounts")
		if err != nil {
			t.Error(err)
			return
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[1] == dir {
				t.Errorf("mount left behind: %s", l)
				_ = syscall.Unmount(dir, syscall.MNT_DETACH)
			}
		}
	})
}

// treeWait waits until the tree answers at mnt.
func treeWait(t *testing.T, mnt string, log fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(mnt, "class/net/ib0/pkey"))
		if err == nil && string(b) == "0xffff\n" {
			return
		}
		if l := log.String(); strings.Contains(l, "FUSE mount off") {
			t.Fatalf("the daemon did not mount its tree at %s; log:\n%s", mnt, l)
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree at %s not ready: %q %v; log:\n%s", mnt, b, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// treeStart starts a daemon on the embedded fabric with its tree mounted at mnt ("" for
// a new directory), 9P on a free loopback port and its interfaces in a new namespace.
func treeStart(t *testing.T, tag, mnt string, extra ...string) *treeDaemon {
	t.Helper()
	treeRequire(t)
	if mnt == "" {
		mnt = treeMountDir(t)
	}
	port := treeFreePort(t)
	td := &treeDaemon{mnt: mnt, port: port, addr: fmt.Sprintf("127.0.0.1:%d", port), ns: treeNetns(t, tag)}
	treeNoMountAt(t, mnt) // registered first, so it runs after the daemon's SIGTERM cleanup
	td.daemon = startDaemon(t, "tree-"+tag, append([]string{"-mount", mnt, "-9p", td.addr, "-netns", td.ns}, extra...)...)
	treeWait(t, mnt, td.log)
	return td
}

func (td *treeDaemon) path(p string) string { return filepath.Join(td.mnt, p) }

// bash runs script with bash after cd'ing into the mount (as uid 0 unless cred is set)
// and returns stdout, stderr and the exit status.
func (td *treeDaemon) bash(t *testing.T, script string, cred *syscall.Credential) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "cd \"$0\" || exit 99\n"+script, td.mnt)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return runOutput(t, "bash", cmd)
}

// ninep runs `ipoibfs 9p ADDR op path` with stdin and returns stdout, stderr and the
// exit status.
func (td *treeDaemon) ninep(t *testing.T, op, path, stdin string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "9p", td.addr, op, path)
	cmd.Stdin = strings.NewReader(stdin)
	return runOutput(t, "ipoibfs 9p", cmd)
}

// client returns a Go 9P client of the daemon, closed at cleanup.
func (td *treeDaemon) client(t *testing.T) *ninep.Client {
	t.Helper()
	conn, err := net.Dial("tcp", td.addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ninep.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// attach returns the root of a raw p9 client of the daemon (for locks and fids the
// ninep.Client does not expose), its connection closed at cleanup.
func (td *treeDaemon) attach(t *testing.T) p9.File {
	t.Helper()
	conn, err := net.Dial("tcp", td.addr)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := p9.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	root, err := pc.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// guestImage prepares the QEMU guest (a missing piece fails under CI, else skips).
func guestImage(t *testing.T) *vm.Image {
	t.Helper()
	testenv.Short(t, "boots a QEMU guest")
	im, err := vm.Prepare()
	if errors.Is(err, vm.ErrMissing) {
		testenv.Missing(t, err.Error())
	}
	if err != nil {
		t.Fatalf("vm.Prepare: %v", err)
	}
	return im
}

func treeErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	var le linux.Errno
	if errors.As(err, &le) {
		return syscall.Errno(le)
	}
	return syscall.EIO
}

// treeLinks lists the interface names in a namespace.
func treeLinks(t *testing.T, ns string) []string {
	t.Helper()
	out := mustRun(t, "ip", "-n", ns, "-o", "link", "show")
	var names []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if n != "lo" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// treeWaitLinks polls until the namespace's interfaces (lo aside) are exactly want.
func treeWaitLinks(t *testing.T, ns string, want []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := treeLinks(t, ns)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("ip -n %s link: TUN devices %v, want %v", ns, got, want)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func treeLs(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("ls %s: %v", dir, err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// ---- one script, bash on FUSE and busybox sh on the guest's v9fs ----

// treeDocScript runs the IPoIB documentation's commands, each as "$ command", its output
// (stderr merged, write errors normalised) and "exit N". Busybox ash and bash.
const treeDocScript = `run() {
	echo "\$ $1"
	{ eval "$1"; echo "exit $?"; } 2>&1 | sed 's/.*write error: /write error: /'
}
run 'cat class/net/ib0/pkey'
run 'echo 0x8001 > class/net/ib0/create_child'
run 'ls class/net'
run 'ls kernel/debug/ipoib'
run 'cat class/net/ib0.8001/pkey'
run 'cat class/net/ib0.8001/parent'
run 'echo 1 > class/net/ib0/create_child'
run 'echo 0x0001 > class/net/ib0/delete_child'
run 'echo 0 > class/net/ib0/create_child'
run 'cat class/net/ib0/mode'
run 'echo -n Connected > class/net/ib0/mode'
run 'echo datagram > class/net/ib0/mode'
run 'cat class/net/ib0/mode'
run 'cat class/net/ib0/umcast'
run 'grep GID kernel/debug/ipoib/ib0_mcg'
run 'cat module/ib_ipoib/parameters/recv_queue_size'
run 'echo 0x8001 > class/net/ib0/delete_child'
run 'ls class/net'
`

// treeDocWant is the transcript treeDocScript must print; "@MCG@" stands for the GID lines of
// ib0_mcg, checked by treeMCGLines.
const treeDocWant = `$ cat class/net/ib0/pkey
0xffff
exit 0
$ echo 0x8001 > class/net/ib0/create_child
exit 0
$ ls class/net
ib0
ib0.8001
exit 0
$ ls kernel/debug/ipoib
ib0.8001_mcg
ib0.8001_path
ib0_mcg
ib0_path
exit 0
$ cat class/net/ib0.8001/pkey
0x8001
exit 0
$ cat class/net/ib0.8001/parent
ib0
exit 0
$ echo 1 > class/net/ib0/create_child
write error: Name not unique on network
exit 1
$ echo 0x0001 > class/net/ib0/delete_child
write error: No such device
exit 1
$ echo 0 > class/net/ib0/create_child
write error: Invalid argument
exit 1
$ cat class/net/ib0/mode
datagram
exit 0
$ echo -n Connected > class/net/ib0/mode
write error: Invalid argument
exit 1
$ echo datagram > class/net/ib0/mode
exit 0
$ cat class/net/ib0/mode
datagram
exit 0
$ cat class/net/ib0/umcast
0
exit 0
$ grep GID kernel/debug/ipoib/ib0_mcg
@MCG@exit 0
$ cat module/ib_ipoib/parameters/recv_queue_size
256
exit 0
$ echo 0x8001 > class/net/ib0/delete_child
exit 0
$ ls class/net
ib0
exit 0
`

// treeMCGLines matches ib0_mcg's GID lines: the IPv4 all-hosts group (the kernel's
// list has it from the moment the device is up) and broadcast group first, then the
// IPv6 groups (all-nodes, solicited-node) of the P_Key 0xffff.
var treeMCGLines = regexp.MustCompile(`^GID: ff12:401b:ffff:0:0:0:0:1\nGID: ff12:401b:ffff:0:0:0:ffff:ffff\n(GID: ff12:601b:ffff:[0-9a-f:]+\n){2,}$`)

// treeCheckDoc compares a transcript with treeDocWant.
func treeCheckDoc(t *testing.T, where, got string) {
	t.Helper()
	head, tail, _ := strings.Cut(treeDocWant, "@MCG@")
	if !strings.HasPrefix(got, head) || !strings.HasSuffix(got, tail) || len(got) < len(head)+len(tail) {
		t.Errorf("%s: transcript (-want +got):\n%s", where, cmp.Diff(treeDocWant, got))
		return
	}
	if mcg := got[len(head) : len(got)-len(tail)]; !treeMCGLines.MatchString(mcg) {
		t.Errorf("%s: grep GID ib0_mcg printed %q", where, mcg)
	}
}

// treeWaitMCG waits until ib0's multicast groups stop changing (the kernel's IPv6
// joins after the TUN device comes up).
func treeWaitMCG(t *testing.T, td *treeDaemon) {
	t.Helper()
	waitLink(t, td.ns, "ib0")
	var last string
	same := 0
	deadline := time.Now().Add(10 * time.Second)
	for same < 4 {
		b, _ := os.ReadFile(td.path("kernel/debug/ipoib/ib0_mcg"))
		var gids []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "GID: ") {
				gids = append(gids, l)
			}
		}
		cur := strings.Join(gids, "\n")
		if cur == last && len(gids) >= 3 {
			same++
		} else {
			same, last = 0, cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("ib0_mcg never settled: %q", b)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// TestTreeDocCommandsFUSEAnd9PGuest runs the documentation's commands with bash on the
// FUSE mount and with busybox sh on the Linux v9fs mount of the same daemon in a QEMU
// guest: the transcripts must be identical and right.
func TestTreeDocCommandsFUSEAnd9PGuest(t *testing.T) {
	treeRequire(t)
	im := guestImage(t)
	td := treeStart(t, "tdoc", "")
	treeWaitMCG(t, td)

	fuseOut, stderr, code := td.bash(t, treeDocScript, nil)
	if code != 0 || stderr != "" {
		t.Errorf("bash on FUSE: exit %d, stderr %q", code, stderr)
	}
	treeCheckDoc(t, "bash on FUSE", fuseOut)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	guestOut, code, err := im.Run(ctx, td.port, treeDocScript)
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	t.Logf("guest boot+run: %v", time.Since(start).Round(time.Millisecond))
	if code != 0 {
		t.Errorf("guest script exit %d", code)
	}
	treeCheckDoc(t, "busybox sh on v9fs", guestOut)
	if diff := cmp.Diff(fuseOut, guestOut); diff != "" {
		t.Errorf("FUSE and 9P transcripts differ (-bash/FUSE +guest/9P):\n%s", diff)
	}
	// Explicitly, so that equally wrong transcripts cannot pass.
	for _, line := range []string{"0x8001", "ib0", "write error: Name not unique on network",
		"write error: No such device", "write error: Invalid argument"} {
		for where, out := range map[string]string{"FUSE": fuseOut, "9P": guestOut} {
			if !slices.Contains(strings.Split(out, "\n"), line) {
				t.Errorf("%s transcript lacks the line %q", where, line)
			}
		}
	}
	if got := treeLs(t, td.path("class/net")); !slices.Equal(got, []string{"ib0"}) {
		t.Errorf("after both runs class/net = %v", got)
	}
}

// flock(1) on the Linux v9fs mount works as on sysfs, and its locks hold against
// another 9P client's (here the test's own connection): a write lock the host holds
// makes the guest's non-blocking flock fail, a read lock lets a shared one through.
func TestGuestFlock(t *testing.T) {
	treeRequire(t)
	im := guestImage(t)
	flock := testenv.Tool(t, "flock") // util-linux's: the guest's busybox has none
	guest := *im
	guest.Copy = []string{flock}
	td := treeStart(t, "tflock", "")
	root := td.attach(t)
	for file, typ := range map[string]p9.LockType{"pkey": p9.WriteLock, "mtu": p9.ReadLock} {
		_, f, err := root.Walk([]string{"class", "net", "ib0", file})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, _, err := f.Open(p9.ReadOnly); err != nil {
			t.Fatal(err)
		}
		if st, err := f.Lock(4242, typ, 0, 0, 0, "host"); err != nil || st != p9.LockStatusOK {
			t.Fatalf("host %v on %s: %v %v", typ, file, st, err)
		}
	}
	script := strings.NewReplacer("flock", flock).Replace(`flock class/net/ib0/mode -c 'echo locked'; echo "status $?"
flock -n class/net/ib0/pkey -c 'echo should not run'; echo "contended $?"
flock -s -n class/net/ib0/mtu -c 'echo shared'; echo "status $?"
`)
	const want = "locked\nstatus 0\ncontended 1\nshared\nstatus 0\n"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, code, err := guest.Run(ctx, td.port, script)
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	if code != 0 || out != want {
		t.Errorf("flock on v9fs: exit %d, transcript (-want +got):\n%s", code, cmp.Diff(want, out))
	}
}

// ---- errno table ----

// TestTreeWriteErrnos writes every error path of every writable file with Go's
// os.WriteFile on the FUSE mount and with `ipoibfs 9p ADDR write` (content on stdin):
// both give the same errno, the subcommand exits 1 and prints its text.
func TestTreeWriteErrnos(t *testing.T) {
	td := treeStart(t, "terrno", "")
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatalf("create_child 0x8001: %v", err)
	}
	hcas := treeLs(t, td.path("class/infiniband"))
	if len(hcas) != 1 {
		t.Fatalf("class/infiniband: %v", hcas)
	}
	hca := "class/infiniband/" + hcas[0]
	const (
		ok       = syscall.Errno(0)
		einval   = syscall.EINVAL
		enotuniq = syscall.ENOTUNIQ
		enodev   = syscall.ENODEV
		eacces   = syscall.EACCES
	)
	for _, c := range []struct {
		path, data string
		want       syscall.Errno
	}{
		// create_child: sscanf %i, the full-membership bit added, no duplicates.
		{"class/net/ib0/create_child", "0x8001\n", enotuniq},
		{"class/net/ib0/create_child", "1\n", enotuniq},      // 1|0x8000
		{"class/net/ib0/create_child", "32769\n", enotuniq},  // decimal 0x8001
		{"class/net/ib0/create_child", "0100001", enotuniq},  // octal 0x8001
		{"class/net/ib0/create_child", "0xffff\n", enotuniq}, // the parent's own P_Key
		{"class/net/ib0/create_child", "0x7fff\n", enotuniq}, // ... as a partial member
		{"class/net/ib0/create_child", "0\n", einval},
		{"class/net/ib0/create_child", "0x8000\n", einval},
		{"class/net/ib0/create_child", "0x10000\n", einval},
		{"class/net/ib0/create_child", "-5\n", einval},
		{"class/net/ib0/create_child", "child\n", einval},
		// delete_child: the exact P_Key of an existing child.
		{"class/net/ib0/delete_child", "0x0001\n", enodev},
		{"class/net/ib0/delete_child", "0x8002\n", enodev},
		{"class/net/ib0/delete_child", "0xffff\n", enodev},
		{"class/net/ib0/delete_child", "0x10000\n", einval},
		{"class/net/ib0/delete_child", "-1\n", einval},
		{"class/net/ib0/delete_child", "none\n", einval},
		// mode
		{"class/net/ib0/mode", "Connected", einval},
		{"class/net/ib0/mode", "datagram mode\n", einval},
		{"class/net/ib0/mode", "datagram\n\n", einval},
		{"class/net/ib0/mode", "datagram\n", ok},
		{"class/net/ib0.8001/mode", "bogus\n", einval},
		// mtu (datagram mode on a 2K broadcast group)
		{"class/net/ib0/mtu", "5\n", einval},
		{"class/net/ib0/mtu", "65520\n", einval},
		{"class/net/ib0/mtu", "1500x\n", einval},
		{"class/net/ib0/mtu", " 1500\n", einval},
		{"class/net/ib0/mtu", "2044\n", ok},
		{"class/net/ib0.8001/mtu", "abc", einval},
		// umcast never fails (simple_strtoul)
		{"class/net/ib0/umcast", "garbage\n", ok},
		{"class/net/ib0/umcast", "0\n", ok},
		// ethtool
		{"class/net/ib0/ethtool/coalesce", "rx-usecs\n", einval},
		{"class/net/ib0/ethtool/coalesce", "rx-usecs 70000\n", einval},
		{"class/net/ib0/ethtool/coalesce", "rx-usecs x\n", einval},
		{"class/net/ib0/ethtool/coalesce", "tx-usecs 5\n", syscall.EOPNOTSUPP},
		{"class/net/ib0/ethtool/coalesce", "bogus 1\n", einval},
		{"class/net/ib0/ethtool/coalesce", "rx-usecs 0 rx-frames 0\n", ok},
		{"class/net/ib0/ethtool/features", "tso maybe\n", einval},
		{"class/net/ib0/ethtool/features", "lro on\n", einval},
		{"class/net/ib0/ethtool/features", "tso\n", einval},
		{"class/net/ib0/ethtool/features", "tso on\n", ok},
		// module parameters: debug levels are 0644, queue sizes 0444
		{"module/ib_ipoib/parameters/debug_level", "x\n", einval},
		{"module/ib_ipoib/parameters/debug_level", "1\n\n", einval},
		{"module/ib_ipoib/parameters/debug_level", "0\n", ok},
		{"module/ib_ipoib/parameters/mcast_debug_level", "0x\n", einval},
		{"module/ib_ipoib/parameters/recv_queue_size", "1\n", eacces},
		{"module/ib_ipoib/parameters/send_queue_size", "1\n", eacces},
		// the subnet manager
		{"sm/faults", "loss\n", einval},
		{"sm/faults", "loss 2\n", einval},
		{"sm/faults", "loss lots\n", einval},
		{"sm/faults", "bogus 1\n", einval},
		{"sm/faults", "delay forever\n", einval},
		{"sm/faults", "loss 0\n", ok},
		{"sm/partitions", "x\n", einval}, // reported at close (FUSE) / clunk (9P)
		{"sm/partitions", "Default=0x7fff : ALL=wrong;\n", einval},
		{"sm/partitions", "Default=0x7fff, ipoib : ALL=full;\n", ok},
		// read-only files and directories, whoever writes
		{"class/net/ib0/pkey", "0x8001\n", eacces},
		{"class/net/ib0.8001/parent", "ib1\n", eacces},
		{"class/net/ib0/statistics/rx_packets", "0\n", eacces},
		{"kernel/debug/ipoib/ib0_mcg", "x\n", eacces},
		{"sm/nodes", "x\n", eacces},
		{hca + "/ports/1/pkeys/0", "0x8001\n", eacces},
		{"class/net/ib0", "x\n", syscall.EISDIR},
		{"class/net/ib9/mtu", "1500\n", syscall.ENOENT},
	} {
		name := fmt.Sprintf("%s <- %q", c.path, c.data)
		fuseErr := os.WriteFile(td.path(c.path), []byte(c.data), 0o644)
		if got := treeErrno(fuseErr); got != c.want {
			t.Errorf("%s over FUSE: %v (errno %d), want %v (errno %d)", name, fuseErr, got, c.want, c.want)
		}
		stdout, stderr, code := td.ninep(t, "write", c.path, c.data)
		wantCode, wantErr := 0, ""
		if c.want != 0 {
			wantCode, wantErr = 1, fmt.Sprintf("ipoibfs 9p: write %s: %s\n", c.path, c.want.Error())
		}
		if code != wantCode || stderr != wantErr || stdout != "" {
			t.Errorf("%s over 9P: exit %d, stderr %q, stdout %q; want exit %d, stderr %q", name, code, stderr, stdout, wantCode, wantErr)
		}
	}
	// The failed writes reach the log as "path: reason".
	for _, l := range []string{
		"class/net/ib0/create_child: P_Key 0x8001 is already used by ib0",
		"class/net/ib0/delete_child: no child of ib0 has P_Key 0x0001",
		"sm/partitions: line 1: ",
	} {
		if !strings.Contains(td.log.String(), l) {
			t.Errorf("log lacks %q", l)
		}
	}
	if got := treeLs(t, td.path("class/net")); !slices.Equal(got, []string{"ib0", "ib0.8001"}) {
		t.Errorf("class/net after the table: %v", got)
	}
	// The failed writes left everything as it was.
	for path, want := range map[string]string{
		"class/net/ib0/mode": "datagram\n", "class/net/ib0/mtu": "2044\n", "class/net/ib0/umcast": "0\n",
		"sm/partitions": "Default=0x7fff, ipoib :\n\tALL=full ;\n", "sm/faults": "loss 0\ndup 0\nreorder 0\ndelay 0s\n",
	} {
		if b, err := os.ReadFile(td.path(path)); err != nil || string(b) != want {
			t.Errorf("cat %s = %q, %v; want %q", path, b, err, want)
		}
	}

	// A name that does not exist: open(O_CREAT) over FUSE is refused as sysfs refuses
	// it (EACCES); the 9P write opens without creating (ENOENT). Not the same call.
	if err := os.WriteFile(td.path("class/net/ib0.8001/create_child"), []byte("0x8002\n"), 0o644); treeErrno(err) != eacces {
		t.Errorf("create_child of a child over FUSE (O_CREAT): %v, want EACCES", err)
	}
	if _, stderr, code := td.ninep(t, "write", "class/net/ib0.8001/create_child", "0x8002\n"); code != 1 ||
		stderr != "ipoibfs 9p: write class/net/ib0.8001/create_child: no such file or directory\n" {
		t.Errorf("create_child of a child over 9P: exit %d %q", code, stderr)
	}

	// A handle that outlives its interface answers ENODEV, over both front ends.
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8002"), 0); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(td.path("class/net/ib0.8002/mtu"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	root := td.attach(t)
	_, pf, err := root.Walk([]string{"class", "net", "ib0.8002", "mtu"})
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if _, _, err := pf.Open(p9.WriteOnly); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(td.path("class/net/ib0/delete_child"), []byte("0x8002"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write([]byte("1500\n")); treeErrno(err) != enodev {
		t.Errorf("write to ib0.8002/mtu after delete_child over FUSE: %v, want ENODEV", err)
	}
	if _, err := pf.WriteAt([]byte("1500\n"), 0); treeErrno(err) != enodev {
		t.Errorf("write to ib0.8002/mtu after delete_child over 9P: %v, want ENODEV", err)
	}
}

// ---- children appear and disappear with the write ----

// TestTreeChildrenImmediate: a child is listed as soon as create_child returns and gone
// when delete_child returns, over both front ends whichever made it; its TUN device
// follows shortly.
func TestTreeChildrenImmediate(t *testing.T) {
	td := treeStart(t, "timm", "")
	waitLink(t, td.ns, "ib0")
	c := td.client(t)
	listed := func() (viaFUSE, via9P []string) {
		viaFUSE = treeLs(t, td.path("class/net"))
		via9P, err := c.ReadDir("class/net")
		if err != nil {
			t.Fatalf("9P ls class/net: %v", err)
		}
		sort.Strings(via9P)
		return viaFUSE, via9P
	}
	tun := func(name string, want bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := run(t, 5*time.Second, "ip", "-n", td.ns, "link", "show", name)
			if (err == nil) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("ip -n %s link show %s: exists=%v, want %v", td.ns, name, err == nil, want)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for round, via := range []string{"FUSE", "9P", "FUSE", "9P"} {
		write := func(file, data string) {
			t.Helper()
			if via == "FUSE" {
				if err := os.WriteFile(td.path("class/net/ib0/"+file), []byte(data), 0); err != nil {
					t.Fatalf("round %d: %s <- %s over FUSE: %v", round, file, data, err)
				}
				return
			}
			if _, stderr, code := td.ninep(t, "write", "class/net/ib0/"+file, data); code != 0 {
				t.Fatalf("round %d: %s <- %s over 9P: %s", round, file, data, stderr)
			}
		}
		pk := fmt.Sprintf("0x%04x", 0x8001+round)
		name := "ib0." + pk[2:]
		write("create_child", pk+"\n")
		f, n := listed()
		want := []string{"ib0", name}
		if !slices.Equal(f, want) || !slices.Equal(n, want) {
			t.Errorf("round %d: right after create_child via %s: FUSE ls %v, 9P ls %v; want %v", round, via, f, n, want)
		}
		if b, err := os.ReadFile(td.path("class/net/" + name + "/pkey")); err != nil || string(b) != pk+"\n" {
			t.Errorf("%s/pkey = %q, %v", name, b, err)
		}
		if b, err := c.ReadFile("kernel/debug/ipoib/" + name + "_path"); err != nil {
			t.Errorf("9P read %s_path: %q %v", name, b, err)
		}
		tun(name, true)
		write("delete_child", pk+"\n")
		f, n = listed()
		if !slices.Equal(f, []string{"ib0"}) || !slices.Equal(n, []string{"ib0"}) {
			t.Errorf("round %d: right after delete_child via %s: FUSE ls %v, 9P ls %v", round, via, f, n)
		}
		if _, err := os.Stat(td.path("class/net/" + name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat %s after delete_child: %v", name, err)
		}
		if _, err := c.Stat("class/net/" + name); treeErrno(err) != syscall.ENOENT {
			t.Errorf("9P stat %s after delete_child: %v", name, err)
		}
		tun(name, false)
	}
}

// ---- concurrent shells ----

type treeChildOp struct {
	create bool
	pkey   int
	ok     bool
}

// TestTreeConcurrentChildren: eight shells create and delete children with colliding
// P_Keys at once (four bash on FUSE, two Go 9P clients, two running `ipoibfs 9p`). A
// failure must be the right errno, the successful operations on each P_Key must
// alternate, and at the end class/net (both front ends) and the namespace's TUN devices
// hold exactly the children whose last successful operation was a create.
func TestTreeConcurrentChildren(t *testing.T) {
	td := treeStart(t, "tconc", "")
	waitLink(t, td.ns, "ib0")
	pkeys := []int{0x8001, 0x8002, 0x8003, 0x8004}
	const workers = 8
	// Operations per worker, so that the kinds run for similar times: a bash echo or a
	// Go client write takes well under a millisecond, `ipoibfs 9p` starts a process.
	opsPer := []int{150, 150, 150, 150, 300, 300, 40, 40}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	plans := make([][]treeChildOp, workers)
	for w := range plans {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		for range opsPer[w] {
			plans[w] = append(plans[w], treeChildOp{create: r.IntN(2) == 0, pkey: pkeys[r.IntN(len(pkeys))]})
		}
	}
	file := func(op treeChildOp) string {
		if op.create {
			return "class/net/ib0/create_child"
		}
		return "class/net/ib0/delete_child"
	}
	wantErr := func(op treeChildOp) syscall.Errno {
		if op.create {
			return syscall.ENOTUNIQ
		}
		return syscall.ENODEV
	}
	var mu sync.Mutex
	var problems []string
	problem := func(f string, a ...any) { mu.Lock(); problems = append(problems, fmt.Sprintf(f, a...)); mu.Unlock() }
	// Every worker gets its connection or shell ready, then all start at once.
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for w := range workers {
		ready.Add(1)
		done.Add(1)
		plan := plans[w]
		switch {
		case w < 4: // bash on the FUSE mount
			var sb strings.Builder
			sb.WriteString("exec 2>&1\nread go\n")
			for _, op := range plan {
				fmt.Fprintf(&sb, "echo %#x > %s; echo \"R $?\"\n", op.pkey, file(op))
			}
			cmd := exec.Command("bash", "-c", "cd \"$0\" || exit 99\n"+sb.String(), td.mnt)
			cmd.Env = append(os.Environ(), "LC_ALL=C")
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				fmt.Fprintln(stdin, "go")
				stdin.Close()
				sc := bufio.NewScanner(stdout)
				k, pending := 0, ""
				for sc.Scan() {
					l := sc.Text()
					if _, e, ok := strings.Cut(l, "write error: "); ok {
						pending = e
						continue
					}
					rc, ok := strings.CutPrefix(l, "R ")
					if !ok || k >= len(plan) {
						problem("bash %d: unexpected line %q", w, l)
						continue
					}
					op := &plan[k]
					op.ok = rc == "0"
					want := wantErr(*op)
					wantText := strings.ToUpper(want.Error()[:1]) + want.Error()[1:]
					switch {
					case op.ok && pending != "":
						problem("bash %d op %d: exit 0 with error %q", w, k, pending)
					case !op.ok && (rc != "1" || pending != wantText):
						problem("bash %d op %d: %s %#x: exit %s, error %q; want exit 1 %q", w, k, file(*op), op.pkey, rc, pending, wantText)
					}
					pending = ""
					k++
				}
				if err := cmd.Wait(); err != nil || k != len(plan) {
					problem("bash %d: %v after %d of %d operations", w, err, k, len(plan))
				}
			}()
		case w < 6: // Go 9P client
			c := td.client(t)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				for k := range plan {
					op := &plan[k]
					err := c.WriteFile(file(*op), []byte(fmt.Sprintf("%#x\n", op.pkey)))
					op.ok = err == nil
					if err != nil && treeErrno(err) != wantErr(*op) {
						problem("9P client %d op %d: %s %#x: %v", w, k, file(*op), op.pkey, err)
					}
					if k%10 == 0 { // a FUSE listing while children come and go: no duplicates
						// (9P listings during changes: TestTree9PReaddirDuringChanges)
						es, err := os.ReadDir(td.path("class/net"))
						var names []string
						for _, e := range es {
							names = append(names, e.Name())
						}
						if err != nil || len(slices.Compact(slices.Clone(names))) != len(names) || !slices.Contains(names, "ib0") {
							problem("9P client %d: ls class/net (FUSE) = %v, %v", w, names, err)
						}
					}
				}
			}()
		default: // ipoibfs 9p
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				for k := range plan {
					op := &plan[k]
					cmd := exec.Command(binPath, "9p", td.addr, "write", file(*op))
					cmd.Stdin = strings.NewReader(fmt.Sprintf("%#x\n", op.pkey))
					out, err := cmd.CombinedOutput()
					op.ok = err == nil
					want := fmt.Sprintf("ipoibfs 9p: write %s: %s\n", file(*op), wantErr(*op))
					if err != nil && string(out) != want {
						problem("ipoibfs 9p %d op %d: %v %q; want %q", w, k, err, out, want)
					}
				}
			}()
		}
	}
	ready.Wait()
	close(start)
	done.Wait()
	for _, p := range problems {
		t.Error(p)
	}

	want := []string{"ib0"}
	for _, pk := range pkeys {
		creates, deletes := 0, 0
		for _, plan := range plans {
			for _, op := range plan {
				if op.pkey == pk && op.ok {
					if op.create {
						creates++
					} else {
						deletes++
					}
				}
			}
		}
		// Successful operations on one P_Key alternate, starting with a create.
		switch creates - deletes {
		case 1:
			want = append(want, fmt.Sprintf("ib0.%04x", pk))
		case 0:
		default:
			t.Errorf("P_Key %#x: %d successful creates and %d successful deletes", pk, creates, deletes)
		}
		t.Logf("P_Key %#x: %d creates, %d deletes succeeded", pk, creates, deletes)
	}
	sort.Strings(want)
	got := treeLs(t, td.path("class/net")) // os.ReadDir sorts; duplicates stay
	if !slices.Equal(got, want) {
		t.Errorf("ls class/net (FUSE) = %v, want %v", got, want)
	}
	g9, err := td.client(t).ReadDir("class/net")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(g9)
	if !slices.Equal(g9, want) {
		t.Errorf("ls class/net (9P) = %v, want %v", g9, want)
	}
	out, stderr, code := td.bash(t, "ls class/net", nil)
	if code != 0 || out != strings.Join(want, "\n")+"\n" {
		t.Errorf("bash ls class/net: %q %q %d", out, stderr, code)
	}
	treeWaitLinks(t, td.ns, want)
}

// TestTree9PReaddirDuringChanges: a directory listing that takes several Treaddir
// calls (every client makes at least two: the last one comes back empty) while children
// are created and deleted. As kernfs guarantees for getdents, an entry that exists
// throughout the listing appears exactly once; entries added or removed meanwhile may or
// may not appear.
func TestTree9PReaddirDuringChanges(t *testing.T) {
	td := treeStart(t, "trd", "")
	write := func(file, pkey string) {
		t.Helper()
		if err := os.WriteFile(td.path("class/net/ib0/"+file), []byte(pkey), 0); err != nil {
			t.Fatalf("%s %s: %v", file, pkey, err)
		}
	}
	root := td.attach(t)
	// list opens class/net and reads it with Treaddir of count bytes, calling between
	// after the first call.
	list := func(count uint32, between func()) []string {
		t.Helper()
		_, d, err := root.Walk([]string{"class", "net"})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if _, _, err := d.Open(p9.ReadOnly); err != nil {
			t.Fatal(err)
		}
		var names []string
		var off uint64
		for call := 0; ; call++ {
			ds, err := d.Readdir(off, count)
			if err != nil {
				t.Fatalf("Treaddir offset %d: %v", off, err)
			}
			if call == 0 {
				between()
			}
			if len(ds) == 0 {
				return names
			}
			for _, e := range ds {
				names = append(names, e.Name)
				off = e.Offset
			}
		}
	}
	check := func(what string, got []string, throughout ...string) {
		t.Helper()
		for _, n := range throughout {
			if k := slices.Index(got, n); k < 0 || slices.Contains(got[k+1:], n) {
				t.Errorf("%s: listing %v: %s (there throughout) must appear exactly once", what, got, n)
			}
		}
	}

	// The same over FUSE: getdents(2) with a buffer of size bytes.
	listFUSE := func(size int, between func()) []string {
		t.Helper()
		fd, err := syscall.Open(td.path("class/net"), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		buf := make([]byte, size)
		var names []string
		for call := 0; ; call++ {
			n, err := syscall.Getdents(fd, buf)
			if err != nil {
				t.Fatalf("getdents: %v", err)
			}
			if call == 0 {
				between()
			}
			if n == 0 {
				return names
			}
			_, _, names = syscall.ParseDirent(buf[:n], -1, names)
		}
	}
	for _, fe := range []struct {
		name       string
		whole, two int
		list       func(int, func()) []string
	}{
		{"9P", 64 << 10, 60, func(n int, f func()) []string { return list(uint32(n), f) }},
		{"FUSE", 64 << 10, 80, listFUSE}, // 80 bytes: ".", "..", "ib0"; then two children
	} {
		// A whole listing in the first call; a child created before the empty call.
		write("create_child", "0x8002")
		got := fe.list(fe.whole, func() { write("create_child", "0x8001") })
		check(fe.name+": child created during the listing", got, "ib0", "ib0.8002")

		// A few entries per call; an early one deleted after the first call.
		write("create_child", "0x8003") // ib0 ib0.8001 ib0.8002 ib0.8003
		got = fe.list(fe.two, func() { write("delete_child", "0x8001") })
		check(fe.name+": child deleted during the listing", got, "ib0", "ib0.8002", "ib0.8003")

		// Unchanged directory, small calls: everything once.
		got = fe.list(fe.two, func() {})
		if !slices.Equal(slices.Sorted(slices.Values(got)), []string{"ib0", "ib0.8002", "ib0.8003"}) {
			t.Errorf("%s: unchanged directory listed as %v", fe.name, got)
		}
		write("delete_child", "0x8002")
		write("delete_child", "0x8003")
	}
}

// ---- diod's tools ----

func TestTreeDiodTools(t *testing.T) {
	treeRequire(t)
	diodcat, diodls := testenv.Tool(t, "diodcat"), testenv.Tool(t, "diodls")
	td := treeStart(t, "tdiod", "")
	server := td.addr
	if out := mustRun(t, diodls, "-s", server, "-a", "/", "class/net"); out != "ib0\n" {
		t.Errorf("diodls class/net = %q", out)
	}
	if out := mustRun(t, diodcat, "-s", server, "-a", "/", "class/net/ib0/pkey"); out != "0xffff\n" {
		t.Errorf("diodcat class/net/ib0/pkey = %q", out)
	}
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001"), 0); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, diodls, "-s", server, "-a", "/", "class/net"); out != "ib0\nib0.8001\n" {
		t.Errorf("diodls class/net with a child = %q", out)
	}
	if out := mustRun(t, diodcat, "-s", server, "-a", "/", "class/net/ib0.8001/parent"); out != "ib0\n" {
		t.Errorf("diodcat ib0.8001/parent = %q", out)
	}
	out := mustRun(t, diodls, "-s", server, "-a", "/", "-l", "class/net/ib0")
	for _, re := range []string{`(?m)^--w-------.* create_child$`, `(?m)^-r--r--r--.* pkey$`, `(?m)^-rw-r--r--.* mtu$`, `(?m)^d.* ethtool$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("diodls -l class/net/ib0 does not match %s:\n%s", re, out)
		}
	}
	if out, err := run(t, 10*time.Second, diodcat, "-s", server, "-a", "/", "class/net/ib9/pkey"); err == nil ||
		!strings.Contains(out, "No such file or directory") {
		t.Errorf("diodcat of a missing file: %v %q", err, out)
	}
}

// ---- other users ----

// TestTreeOtherUsers: uid 65534 reads what sysfs lets everyone read and is refused the
// writes sysfs refuses.
func TestTreeOtherUsers(t *testing.T) {
	td := treeStart(t, "tuser", "")
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	as := func(name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := as("cat", td.path("class/net/ib0/pkey")); err != nil || out != "0xffff\n" {
		t.Errorf("uid 65534: cat pkey = %q, %v", out, err)
	}
	if out, err := as("cat", td.path("module/ib_ipoib/parameters/recv_queue_size")); err != nil || out != "256\n" {
		t.Errorf("uid 65534: cat recv_queue_size = %q, %v", out, err)
	}
	if out, err := as("ls", td.path("class/net")); err != nil || out != "ib0\n" {
		t.Errorf("uid 65534: ls class/net = %q, %v", out, err)
	}
	for _, c := range []struct{ file, data string }{
		{"class/net/ib0/create_child", "0x8001"},
		{"class/net/ib0/mode", "datagram"},
		{"class/net/ib0/mtu", "1500"},
		{"module/ib_ipoib/parameters/debug_level", "1"},
		{"sm/partitions", "Default=0x7fff : ALL=full;"},
	} {
		out, err := as("bash", "-c", `echo "$1" > "$2"`, "bash", c.data, td.path(c.file))
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("uid 65534: echo %s > %s: %v %q; want Permission denied", c.data, c.file, err, out)
		}
	}
	if out, err := as("cat", td.path("class/net/ib0/create_child")); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("uid 65534: cat create_child: %v %q; want Permission denied", err, out)
	}
	if got := treeLs(t, td.path("class/net")); !slices.Equal(got, []string{"ib0"}) {
		t.Errorf("uid 65534 changed class/net: %v", got)
	}
	if b, _ := os.ReadFile(td.path("module/ib_ipoib/parameters/debug_level")); string(b) != "0\n" {
		t.Errorf("uid 65534 changed debug_level: %q", b)
	}
	// root still may.
	if err := os.WriteFile(td.path("class/net/ib0/create_child"), []byte("0x8001"), 0); err != nil {
		t.Errorf("root: create_child: %v", err)
	}
}

// ---- a dead mount left by a crashed daemon ----

func TestTreeStaleMountCleanup(t *testing.T) {
	treeRequire(t)
	mnt := treeMountDir(t)
	treeNoMountAt(t, mnt)
	ns1 := netns(t, "tstale1")
	var log1 testenv.Buffer
	cmd := exec.Command(binPath, "-name", "tree-stale1", "-mount", mnt, "-9p", "", "-netns", ns1)
	cmd.Stdout, cmd.Stderr = &log1, &log1
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	treeWait(t, mnt, &log1)
	if err := os.WriteFile(filepath.Join(mnt, "class/net/ib0/create_child"), []byte("0x8001"), 0); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	killed = true
	// (A stat may still be answered from the kernel's cache of names and attributes;
	// whatever reaches the daemon fails.)
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Join(mnt, "class"), &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after SIGKILL: statfs %v, want ENOTCONN (Transport endpoint is not connected)", err)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "class/net/ib0/pkey")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after SIGKILL: read %v, want ENOTCONN", err)
	}
	if mounts, _ := os.ReadFile("/proc/mounts"); !strings.Contains(string(mounts), " "+mnt+" ") {
		t.Fatalf("no dead mount at %s in /proc/mounts", mnt)
	}

	td := treeStart(t, "tstale2", mnt)
	if !strings.Contains(td.log.String(), mnt+": removed a dead mount left by an earlier daemon") {
		t.Errorf("log does not mention the dead mount:\n%s", td.log)
	}
	n := 0
	mounts, _ := os.ReadFile("/proc/mounts")
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == mnt {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d mounts at %s, want the new one only:\n%s", n, mnt, mounts)
	}
	// The new tree is the new daemon's: no child, and creating one works.
	if got := treeLs(t, td.path("class/net")); !slices.Equal(got, []string{"ib0"}) {
		t.Errorf("class/net = %v", got)
	}
	out, stderr, code := td.bash(t, "echo 0x8001 > class/net/ib0/create_child && cat class/net/ib0.8001/pkey", nil)
	if code != 0 || out != "0x8001\n" {
		t.Errorf("create_child on the new mount: %q %q %d", out, stderr, code)
	}
	treeWaitLinks(t, td.ns, []string{"ib0", "ib0.8001"})
}

// ---- SIGHUP and sm/partitions ----

// partitionsFile writes text to a new -partitions file and returns it, with what
// writes it again.
func partitionsFile(t *testing.T, text string) (string, func(string)) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "partitions.conf")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(text)
	return file, write
}

func TestTreePartitionsReload(t *testing.T) {
	treeRequire(t)
	file, writeConf := partitionsFile(t, "Default=0x7fff, ipoib : ALL=full;\n")
	td := treeStart(t, "thup", "", "-partitions", file)
	cat := func(path string) string {
		out, stderr, code := td.bash(t, "cat "+path, nil)
		if code != 0 {
			t.Errorf("cat %s: exit %d %q", path, code, stderr)
		}
		return out
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; log:\n%s", what, td.log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	const pkey1 = "class/infiniband/*/ports/1/pkeys/1"
	if got := cat("sm/partitions"); strings.Contains(got, "P2=") || !strings.Contains(got, "Default=0x7fff") {
		t.Errorf("sm/partitions at start: %q", got)
	}
	if got := cat(pkey1); got != "0x0000\n" {
		t.Errorf("pkeys/1 at start: %q", got)
	}

	writeConf("Default=0x7fff, ipoib : ALL=full;\nP2=0x8002, ipoib : ALL=full;\n")
	// The daemon installs its signal handler just after mounting; nothing shows when.
	time.Sleep(200 * time.Millisecond)
	_ = td.cmd.Process.Signal(syscall.SIGHUP)
	// sm/partitions is written in canonical form, whose partition keys are the 15-bit
	// base (as Default=0x7fff): P2 shows as 0x0002. Either spelling names P_Key 0x8002.
	p2 := regexp.MustCompile(`(?m)^P2=0x[08]002, ipoib :`)
	waitFor("sm/partitions with P2", func() bool { return p2.MatchString(cat("sm/partitions")) })
	waitFor("pkeys/1 = 0x8002", func() bool { return cat(pkey1) == "0x8002\n" })
	if !strings.Contains(td.log.String(), "SIGHUP: partitions reloaded from "+file) {
		t.Errorf("log lacks the reload")
	}

	// A broken file is refused, naming the file and the line; the old one stays.
	writeConf("Default=0x7fff : ALL=wrong;\n")
	_ = td.cmd.Process.Signal(syscall.SIGHUP)
	bad := regexp.MustCompile(regexp.QuoteMeta(file) + `(:| line )1: .*keeping the previous partitions`)
	waitFor("the reload error in the log", func() bool { return bad.MatchString(td.log.String()) })
	if got := cat("sm/partitions"); !p2.MatchString(got) {
		t.Errorf("sm/partitions after a broken reload: %q", got)
	}
	if got := cat(pkey1); got != "0x8002\n" {
		t.Errorf("pkeys/1 after a broken reload: %q", got)
	}

	// A broken configuration written into sm/partitions: EINVAL at close, the old
	// configuration stays, the log says which line.
	before := cat("sm/partitions")
	out, stderr, code := td.bash(t, `printf 'x\n' | cat > sm/partitions`, nil)
	if code != 1 || !strings.HasSuffix(stderr, "write error: Invalid argument\n") {
		t.Errorf("printf 'x\\n' | cat > sm/partitions: exit %d, %q %q; want exit 1 and write error: Invalid argument", code, out, stderr)
	}
	if err := os.WriteFile(td.path("sm/partitions"), []byte("x\n"), 0); treeErrno(err) != syscall.EINVAL {
		t.Errorf("os.WriteFile sm/partitions: %v, want EINVAL", err)
	}
	// bash's printf builtin: the error comes at close(2), which bash does not check,
	// so only the log and the unchanged file show it.
	logBefore := strings.Count(td.log.String(), "sm/partitions: line 1: ")
	_, stderr, code = td.bash(t, `printf 'x\n' > sm/partitions`, nil)
	t.Logf("bash printf 'x\\n' > sm/partitions: exit %d, stderr %q", code, stderr)
	waitFor("the sm/partitions error in the log", func() bool {
		return strings.Count(td.log.String(), "sm/partitions: line 1: ") > logBefore
	})
	if got := cat("sm/partitions"); got != before {
		t.Errorf("sm/partitions changed by broken writes: %q, was %q", got, before)
	}
	if got := cat(pkey1); got != "0x8002\n" {
		t.Errorf("pkeys/1 after broken writes: %q", got)
	}
	// And a good one written there applies.
	_, stderr, code = td.bash(t, `printf 'Default=0x7fff, ipoib : ALL=full;\nP3=0x8003, ipoib : ALL=full;\n' > sm/partitions`, nil)
	if code != 0 {
		t.Errorf("writing a good configuration: exit %d %q", code, stderr)
	}
	waitFor("pkeys/1 = 0x8003", func() bool { return cat(pkey1) == "0x8003\n" })
}

// `ipoibfs reload` (systemctl reload's) returns once the partitions file has been
// read again, and fails, keeping the old partitions, when it does not parse; over the
// mount and over 9P alike.
func TestReloadWaitsAndFails(t *testing.T) {
	treeRequire(t)
	file, writeConf := partitionsFile(t, "Default=0x7fff, ipoib : ALL=full;\n")
	td := treeStart(t, "trl", "", "-partitions", file)
	reload := func(where ...string) (string, int) {
		t.Helper()
		out, err := exec.Command(binPath, append([]string{"reload"}, where...)...).CombinedOutput()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	p2 := regexp.MustCompile(`(?m)^P2=0x[08]002, ipoib :`)
	for _, where := range [][]string{{"-tree", td.mnt}, {"-9p", td.addr}} {
		writeConf("Default=0x7fff, ipoib : ALL=full;\nP2=0x8002, ipoib : ALL=full;\n")
		if out, code := reload(where...); code != 0 || out != "" {
			t.Fatalf("ipoibfs reload %v: exit %d %q", where, code, out)
		}
		// Done when it returns: no waiting.
		if got, _ := os.ReadFile(td.path("sm/partitions")); !p2.Match(got) {
			t.Fatalf("sm/partitions right after ipoibfs reload %v: %q", where, got)
		}
		writeConf("Default=0x7fff : ALL=wrong;\n")
		out, code := reload(where...)
		if code != 1 || !strings.Contains(out, "invalid argument") {
			t.Errorf("ipoibfs reload %v of a bad file: exit %d %q, want 1 and invalid argument", where, code, out)
		}
		if got, _ := os.ReadFile(td.path("sm/partitions")); !p2.Match(got) {
			t.Errorf("sm/partitions after a failed reload: %q", got)
		}
		bad := regexp.MustCompile(`reload: ` + regexp.QuoteMeta(file) + `(:| line )1: .*keeping the previous partitions`)
		if !bad.MatchString(td.log.String()) {
			t.Errorf("the log lacks the failed reload's reason:\n%s", td.log)
		}
		writeConf("Default=0x7fff, ipoib : ALL=full;\n")
		if _, code := reload(where...); code != 0 {
			t.Fatalf("ipoibfs reload %v back: exit %d", where, code)
		}
	}
	if err := os.WriteFile(td.path("reload"), []byte("2\n"), 0); treeErrno(err) != syscall.EINVAL {
		t.Errorf("writing 2 to reload: %v, want EINVAL", err)
	}
}

// ---- ipoibfs 9p ----

func TestTree9PSubcommand(t *testing.T) {
	td := treeStart(t, "tsub", "")
	for _, c := range []struct {
		op, path, stdin string
		out, err        string
		code            int
	}{
		{op: "ls", path: "class/net", out: "ib0\n"},
		{op: "ls", path: "/class/net/", out: "ib0\n"},
		{op: "ls", path: "class", out: "infiniband\nnet\n"},
		{op: "read", path: "class/net/ib0/pkey", out: "0xffff\n"},
		{op: "read", path: "class/net/ib0/mode", out: "datagram\n"},
		{op: "stat", path: "class/net/ib0/pkey", out: "-r--r--r--\n"},
		{op: "stat", path: "class/net/ib0/mtu", out: "-rw-r--r--\n"},
		{op: "stat", path: "class/net/ib0/create_child", out: "--w-------\n"},
		{op: "stat", path: "class/net", out: "drwxr-xr-x\n"},
		{op: "write", path: "class/net/ib0/create_child", stdin: "0x8001\n"},
		{op: "ls", path: "class/net", out: "ib0\nib0.8001\n"},
		{op: "read", path: "class/net/ib0.8001/parent", out: "ib0\n"},
		{op: "read", path: "class/net/nope", err: "ipoibfs 9p: read class/net/nope: no such file or directory\n", code: 1},
		{op: "ls", path: "class/nope", err: "ipoibfs 9p: ls class/nope: no such file or directory\n", code: 1},
		{op: "stat", path: "nope/pkey", err: "ipoibfs 9p: stat nope/pkey: no such file or directory\n", code: 1},
		{op: "write", path: "class/net/ib9/mtu", stdin: "1500", err: "ipoibfs 9p: write class/net/ib9/mtu: no such file or directory\n", code: 1},
		{op: "read", path: "class/net/ib0/create_child", err: "ipoibfs 9p: read class/net/ib0/create_child: permission denied\n", code: 1},
		{op: "cat", path: "class/net/ib0/pkey", err: "ipoibfs 9p: unknown operation \"cat\": want ls, read, write or stat\n", code: 1},
	} {
		out, stderr, code := td.ninep(t, c.op, c.path, c.stdin)
		if out != c.out || stderr != c.err || code != c.code {
			t.Errorf("ipoibfs 9p %s %s: stdout %q stderr %q exit %d; want %q %q %d", c.op, c.path, out, stderr, code, c.out, c.err, c.code)
		}
	}
	// The same bytes as the FUSE mount.
	for _, p := range []string{"class/net/ib0/address", "kernel/debug/ipoib/ib0_path", "sm/nodes", "class/net/ib0/ethtool/features"} {
		b, err := os.ReadFile(td.path(p))
		out, stderr, code := td.ninep(t, "read", p, "")
		if err != nil || code != 0 || out != string(b) {
			t.Errorf("read %s: FUSE %q %v, 9P %q %q %d", p, b, err, out, stderr, code)
		}
	}
	if out, stderr, code := td.ninep(t, "ls", "class/net/ib0", ""); code != 0 || out != strings.Join(treeLs(t, td.path("class/net/ib0")), "\n")+"\n" {
		t.Errorf("ls class/net/ib0 over 9P differs from FUSE: %q %q", out, stderr)
	}
}

// runOutput runs cmd and returns its stdout, stderr and exit status; failing to run it
// at all fails the test.
func runOutput(t *testing.T, what string, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%s: %v", what, err)
	}
	return o.String(), e.String(), code
}
