package ninep

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"golang.org/x/sys/unix"

	"ipoibfs/internal/testenv"
)

// runHolder is this test binary run as another process that will hold a client's
// socket: "recv" says it is ready, then takes one over its fd 3 (SCM_RIGHTS) and
// keeps it; "thread" keeps
// the socket it was started with (fd 3) and drops CAP_NET_ADMIN on one of its threads
// alone. Each says "ready" on stdout, then waits to be killed.
func runHolder(role string) {
	switch role {
	case "recv":
		fmt.Println("ready")
		if recvDescriptor() != nil {
			os.Exit(1)
		}
		select {}
	case "unshared":
		// A thread that leaves the process's descriptor table (unshare(CLONE_FILES))
		// and takes the socket into its own, which /proc/<pid>/fd does not show.
		if err := onOtherThread(func() error {
			if err := unix.Unshare(unix.CLONE_FILES); err != nil {
				return err
			}
			fmt.Printf("ready %d\n", unix.Gettid())
			return recvDescriptor()
		}); err != nil {
			fmt.Println("unshared:", err)
			os.Exit(1)
		}
		select {}
	case "thread":
		// The first thread's capabilities are the process's as /proc/<pid> shows
		// them: they are dropped on another.
		if err := onOtherThread(func() error {
			var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var data [2]unix.CapUserData
			if err := unix.Capget(&hdr, &data[0]); err != nil {
				return err
			}
			data[0].Effective &^= 1 << 12 // CAP_NET_ADMIN
			return unix.Capset(&hdr, &data[0])
		}); err != nil {
			fmt.Println("capset:", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	select {}
}

// onOtherThread runs f on a locked OS thread other than the process's first (whose
// state /proc/<pid> shows; a locked goroutine may run on it) and returns its result.
// The thread stays locked and alive, so what f changed on it lasts with the process.
func onOtherThread(f func() error) error {
	done := make(chan error)
	var run func()
	run = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the process
		if unix.Gettid() == unix.Getpid() {
			go run() // with this one held, another goroutine gets another thread
			select {}
		}
		done <- f()
		select {}
	}
	go run()
	return <-done
}

// recvDescriptor takes one descriptor sent over fd 3 (SCM_RIGHTS) into the calling
// thread's table, and keeps it.
func recvDescriptor() error {
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(3, buf, oob, 0)
	if err == nil && oobn == 0 {
		err = errors.New("no descriptor")
	}
	return err
}

// startHolder starts runHolder's role in a child with extra files, and waits for it to
// be ready.
func startHolder(t *testing.T, role string, wrap []string, files ...*os.File) *exec.Cmd {
	t.Helper()
	args := append(append([]string(nil), wrap...), os.Args[0], "-test.run=^$")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "IPOIBFS_NINEP_HOLDER="+role)
	cmd.ExtraFiles = files
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		b := make([]byte, 64)
		n, _ := out.Read(b)
		ready <- string(b[:n])
	}()
	select {
	case s := <-ready:
		if !strings.HasPrefix(s, "ready") {
			t.Fatalf("holder %s: %q", role, s)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("holder %s never ready", role)
	}
	return cmd
}

// The holders are looked at in full at each write that needs CAP_NET_ADMIN: a
// process that already existed and is handed the client's socket (SCM_RIGHTS) after a
// write makes the next one refused, though no process was made meanwhile; and a holder
// one of whose threads has dropped the capability (credentials are a thread's) has it
// not, nor has one whose thread holds the socket in a descriptor table of its own.
func TestNetAdminHoldersSeenAtEachWrite(t *testing.T) {
	testenv.Root(t)
	setpriv := testenv.Tool(t, "setpriv")
	v := newEnv(t)
	conn, c := serveOne(t, v, "unix", filepath.Join(t.TempDir(), "s"))
	root, err := c.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	write := openWriter(t, root, "class", "net", "ib0", "tx_queue_len")

	// A receiver without the capability, made before the writes.
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(pair[0]), "mine"), os.NewFile(uintptr(pair[1]), "theirs")
	defer mine.Close()
	recv := startHolder(t, "recv", []string{setpriv, "--bounding-set=-net_admin", "--"}, theirs)
	theirs.Close()
	if err := write(1001); err != nil {
		t.Fatalf("before the hand-off: %v", err)
	}
	cf, err := conn.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(int(mine.Fd()), []byte{0}, unix.UnixRights(int(cf.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	cf.Close()
	var st unix.Stat_t
	raw, _ := conn.(*net.UnixConn).SyscallConn()
	_ = raw.Control(func(fd uintptr) { _ = unix.Fstat(int(fd), &st) })
	want := fmt.Sprintf("socket:[%d]", st.Ino)
	waitFor(t, "the receiver holding the socket", func() bool {
		dir := fmt.Sprintf("/proc/%d/fd/", recv.Process.Pid)
		fds, _ := os.ReadDir(dir)
		for _, fd := range fds {
			if l, _ := os.Readlink(dir + fd.Name()); l == want {
				return true
			}
		}
		return false
	})
	v.log.Take()
	if err := write(1002); !errors.Is(err, linux.EPERM) {
		t.Errorf("a write once a process without CAP_NET_ADMIN was handed the socket: %v, want EPERM", err)
	}
	if lines := v.log.Take(); len(lines) != 1 || !strings.Contains(lines[0], fmt.Sprintf("pid %d holds the client's socket without CAP_NET_ADMIN", recv.Process.Pid)) {
		t.Errorf("log %q, want the refusal naming the receiver", lines)
	}
	_ = recv.Process.Kill()
	_ = recv.Wait()
	if err := write(1003); err != nil {
		t.Fatalf("the receiver gone: %v", err)
	}

	// A holder with one thread without it.
	cf, err = conn.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	th := startHolder(t, "thread", nil, cf)
	cf.Close()
	if err := write(1004); !errors.Is(err, linux.EPERM) {
		t.Errorf("a holder one of whose threads lacks CAP_NET_ADMIN: %v, want EPERM", err)
	}
	_ = th.Process.Kill()
	_ = th.Wait()

	// A process without it whose thread took the socket into a descriptor table of
	// its own.
	pair, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine2, theirs2 := os.NewFile(uintptr(pair[0]), "mine"), os.NewFile(uintptr(pair[1]), "theirs")
	defer mine2.Close()
	un := startHolder(t, "unshared", []string{setpriv, "--bounding-set=-net_admin", "--"}, theirs2)
	theirs2.Close()
	cf, err = conn.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(int(mine2.Fd()), []byte{0}, unix.UnixRights(int(cf.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	cf.Close()
	waitFor(t, "the unshared thread holding the socket", func() bool {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", un.Process.Pid))
		for _, tk := range tasks {
			dir := fmt.Sprintf("/proc/%d/task/%s/fd/", un.Process.Pid, tk.Name())
			fds, _ := os.ReadDir(dir)
			for _, fd := range fds {
				if l, _ := os.Readlink(dir + fd.Name()); l == want {
					return true
				}
			}
		}
		return false
	})
	if err := write(1005); !errors.Is(err, linux.EPERM) {
		t.Errorf("a holder without CAP_NET_ADMIN in a thread's own descriptor table: %v, want EPERM", err)
	}
	if lines := v.log.Take(); len(lines) == 0 || !strings.Contains(lines[len(lines)-1], fmt.Sprintf("pid %d holds the client's socket without CAP_NET_ADMIN", un.Process.Pid)) {
		t.Errorf("log %q, want the refusal naming the process of the unshared thread", lines)
	}
	_ = un.Process.Kill()
	_ = un.Wait()
	if n := v.ib0.TxQueueLen(); n != 1003 {
		t.Errorf("tx_queue_len %d, want 1003", n)
	}
}

// A /proc mounted with hidepid hides other users' processes from a daemon without
// CAP_SYS_PTRACE, so a holder of the socket could be passed over: then no connection
// counts as privileged. With CAP_SYS_PTRACE, or with subset=pid (which hides no
// process), the look goes on. The /proc of a mount namespace of the test's own is
// remounted (unshare -m), the host's stays as it is.
func TestHidepidProcMakesNobodyPrivileged(t *testing.T) {
	if mode := os.Getenv("IPOIBFS_HIDEPID_CHILD"); mode != "" {
		ok, why := (&holders{want: "socket:[0]"}).netAdmin()
		fmt.Printf("showsall=%v netadmin=%v why=%s\n", procShowsAll(), ok, why)
		return
	}
	testenv.Root(t)
	unshare, setpriv := testenv.Tool(t, "unshare"), testenv.Tool(t, "setpriv")
	for _, c := range []struct {
		opts  string
		drop  bool // CAP_SYS_PTRACE
		blind bool
	}{
		{"hidepid=invisible", true, true},
		{"hidepid=2", true, true},
		{"hidepid=invisible", false, false},
		{"subset=pid", true, false},
		{"hidepid=0", true, false},
	} {
		script := "mount -t proc -o " + c.opts + " proc /proc && exec \"$@\""
		args := []string{"-m", "--propagation", "private", "--", "sh", "-c", script, "sh"}
		if c.drop {
			args = append(args, setpriv, "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--")
		}
		args = append(args, os.Args[0], "-test.run=^TestHidepidProcMakesNobodyPrivileged$")
		cmd := exec.Command(unshare, args...)
		cmd.Env = append(os.Environ(), "IPOIBFS_HIDEPID_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s, CAP_SYS_PTRACE dropped %v: %v: %s", c.opts, c.drop, err, out)
		}
		s := string(out)
		if c.blind {
			if !strings.Contains(s, "showsall=the socket's holders cannot all be found: /proc is mounted with hidepid") || !strings.Contains(s, "netadmin=false why=the socket's holders cannot all be found") {
				t.Errorf("/proc with %s, the daemon without CAP_SYS_PTRACE: %s", c.opts, s)
			}
		} else if !strings.Contains(s, "showsall=<nil>") {
			t.Errorf("/proc with %s, CAP_SYS_PTRACE dropped %v: %s", c.opts, c.drop, s)
		}
	}
}

// A daemon without CAP_SYS_ADMIN still finds a unix client's socket in its own network
// namespace: sock_diag is asked there without setns (which needs the capability).
func TestUnixPeerWithoutSysAdmin(t *testing.T) {
	if os.Getenv("IPOIBFS_NOSYSADMIN_CHILD") != "" {
		dir, err := os.MkdirTemp("", "nosysadmin")
		if err != nil {
			fmt.Println("tempdir:", err)
			return
		}
		defer os.RemoveAll(dir)
		l, err := net.Listen("unix", filepath.Join(dir, "s"))
		if err != nil {
			fmt.Println("listen:", err)
			return
		}
		defer l.Close()
		cl, err := net.Dial("unix", filepath.Join(dir, "s"))
		if err != nil {
			fmt.Println("dial:", err)
			return
		}
		defer cl.Close()
		sc, err := l.Accept()
		if err != nil {
			fmt.Println("accept:", err)
			return
		}
		defer sc.Close()
		var st unix.Stat_t
		raw, _ := cl.(*net.UnixConn).SyscallConn()
		_ = raw.Control(func(fd uintptr) { _ = unix.Fstat(int(fd), &st) })
		peer, err := unixPeerInode(sc)
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var d [2]unix.CapUserData
		_ = unix.Capget(&hdr, &d[0])
		fmt.Printf("sysadmin=%v peer=%v err=%v\n", d[0].Effective&(1<<unix.CAP_SYS_ADMIN) != 0, peer == st.Ino, err)
		return
	}
	testenv.Root(t)
	setpriv := testenv.Tool(t, "setpriv")
	cmd := exec.Command(setpriv, "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--",
		os.Args[0], "-test.run=^TestUnixPeerWithoutSysAdmin$")
	cmd.Env = append(os.Environ(), "IPOIBFS_NOSYSADMIN_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "sysadmin=false peer=true err=<nil>") {
		t.Errorf("without CAP_SYS_ADMIN: %s", out)
	}
}
