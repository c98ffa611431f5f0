package fs

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"ipoibfs/internal/testenv"
)

// Access is generic_permission for root-owned nodes plus kernfs's rule, for every mode
// the tree uses and every kind of user.
func TestAccess(t *testing.T) {
	tr := &Tree{}
	file := func(perm uint32, r, w bool) *Node {
		n := &Node{t: tr, perm: perm}
		if r {
			n.read = func() ([]byte, error) { return nil, nil }
		}
		if w {
			n.write = func([]byte) error { return nil }
		}
		return n
	}
	root := Caller{UID: 0, GIDs: []uint32{0}}
	user := Caller{UID: 1000, GIDs: []uint32{1000}}
	nobody := Caller{UID: Nobody, GIDs: []uint32{Nobody}}
	wheel := Caller{UID: 1001, GIDs: []uint32{1001, 0}} // member of group 0
	const ok, no = syscall.Errno(0), syscall.EACCES
	for _, c := range []struct {
		what string
		n    *Node
		mask int
		want map[*Caller]syscall.Errno
	}{
		{"read 0444", file(0444, true, false), MayRead, map[*Caller]syscall.Errno{&root: ok, &user: ok, &nobody: ok}},
		{"write 0444 (kernfs: not even root)", file(0444, true, false), MayWrite, map[*Caller]syscall.Errno{&root: no, &user: no, &nobody: no}},
		{"read 0644", file(0644, true, true), MayRead, map[*Caller]syscall.Errno{&root: ok, &user: ok, &nobody: ok}},
		{"write 0644", file(0644, true, true), MayWrite, map[*Caller]syscall.Errno{&root: ok, &user: no, &nobody: no, &wheel: no}},
		{"read 0200 (kernfs: not even root)", file(0200, false, true), MayRead, map[*Caller]syscall.Errno{&root: no, &user: no}},
		{"write 0200", file(0200, false, true), MayWrite, map[*Caller]syscall.Errno{&root: ok, &user: no, &nobody: no}},
		{"search 0755", &Node{t: tr, perm: 0755, dir: true}, MayExec, map[*Caller]syscall.Errno{&root: ok, &user: ok, &nobody: ok}},
		{"search 0700", &Node{t: tr, perm: 0700, dir: true}, MayExec, map[*Caller]syscall.Errno{&root: ok, &user: no, &nobody: no, &wheel: no}},
		{"list 0700", &Node{t: tr, perm: 0700, dir: true}, MayRead, map[*Caller]syscall.Errno{&root: ok, &user: no}},
		{"group bits 0750", &Node{t: tr, perm: 0750, dir: true}, MayExec, map[*Caller]syscall.Errno{&wheel: ok, &user: no}},
	} {
		for who, want := range c.want {
			err := c.n.Access(*who, c.mask)
			got := syscall.Errno(0)
			if err != nil {
				got = err.(syscall.Errno)
			}
			if got != want {
				t.Errorf("%s as uid %d: %v, want %v", c.what, who.UID, got, want)
			}
		}
	}
}

// Open applies Access for the caller, and a refused open for writing is logged with
// who asked.
func TestOpenAsUser(t *testing.T) {
	v := newEnv(t)
	n, err := v.tree.Lookup("class/net/ib0/mode")
	if err != nil {
		t.Fatal(err)
	}
	user := Caller{UID: 1000, GIDs: []uint32{1000}, Via: "9p", Peer: "127.0.0.1:4000"}
	if _, err := n.Open(user, syscall.O_WRONLY); err != syscall.EACCES {
		t.Errorf("uid 1000 opening mode for writing: %v, want EACCES", err)
	}
	if h, err := n.Open(user, syscall.O_RDONLY); err != nil {
		t.Errorf("uid 1000 opening mode for reading: %v", err)
	} else {
		h.Release()
	}
	lines := v.log.take()
	if len(lines) != 1 || lines[0] != `class/net/ib0/mode: permission denied; open for writing as uid=1000 via=9p peer="127.0.0.1:4000"` {
		t.Errorf("log after the refused open: %q", lines)
	}
}

// A write's log line quotes at most 64 bytes of what was written.
func TestAuditQuotesAtMost64Bytes(t *testing.T) {
	v := newEnv(t)
	long := strings.Repeat("x", 200)
	if errno := write(v.tree, "class/net/ib0/mtu", long); errno != syscall.EINVAL {
		t.Fatalf("mtu %q: %v", long, errno)
	}
	lines := v.log.take()
	if len(lines) != 1 || !strings.Contains(lines[0], `; wrote "`+strings.Repeat("x", 64)+`" as uid=0`) {
		t.Errorf("log line %q", lines)
	}
}

// CAP_NET_ADMIN counts only in the daemon's user namespace: a process of a new user
// namespace shows every capability in its CapEff (capsh --drop=cap_net_admin; unshare
// -U -r) and holds none over the daemon's, as the kernel's capable() sees it. This
// process itself (root in the initial namespace) holds it.
func TestProcNetAdminCountsOnlyTheDaemonsUserNamespace(t *testing.T) {
	testenv.Root(t)
	if !ProcNetAdmin(uint32(os.Getpid())) {
		t.Fatal("the test, run as root, holds no CAP_NET_ADMIN by ProcNetAdmin")
	}
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}}
	if err := cmd.Start(); err != nil {
		t.Fatalf("a process in a new user namespace: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := uint32(cmd.Process.Pid)
	// Its CapEff has the bit (or the check below would pass for nothing). Just
	// started, it may still be the test's own until exec: wait for sleep.
	waitExec := time.Now().Add(5 * time.Second)
	for {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(comm)) == "sleep" || time.Now().After(waitExec) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	capEff, err := procCapEff(pid)
	if err != nil || capEff&(1<<capNetAdmin) == 0 {
		t.Fatalf("the namespaced process's CapEff %#x (%v): no CAP_NET_ADMIN to ignore", capEff, err)
	}
	if ProcNetAdmin(pid) {
		t.Fatal("a process of another user namespace counted as holding CAP_NET_ADMIN")
	}
	if ok, tid, err := ProcThreadsNetAdmin(pid); ok || tid != pid || err != nil {
		t.Fatalf("ProcThreadsNetAdmin of a process of another user namespace: %v, thread %d, %v; want false, %d, nil", ok, tid, err, pid)
	}
	// In its own namespace it has the capability, but that namespace maps one user,
	// as any user's unshare -U does: it counts for nothing here either.
	if !ProcNetAdminInItsNS(uint32(os.Getpid())) {
		t.Error("the test itself: no CAP_NET_ADMIN in its own namespace")
	}
	if ProcNetAdminInItsNS(pid) {
		t.Error("a process of a user namespace mapping one user counted as holding CAP_NET_ADMIN in its own")
	}
}

// Capabilities are a thread's: a process one of whose threads dropped CAP_NET_ADMIN
// (capset on itself alone) does not have it in every thread, and the thread is named.
// What capget(2) reads is what /proc/<tid>/status shows (read by procfs, not by the
// code under test).
func TestProcThreadsNetAdminAsksEveryThread(t *testing.T) {
	testenv.Root(t)
	pid := uint32(os.Getpid())
	if ok, tid, err := ProcThreadsNetAdmin(pid); !ok {
		t.Fatalf("the test, run as root: not every thread has CAP_NET_ADMIN (thread %d, %v)", tid, err)
	}
	dropped, done, restored := make(chan uint32), make(chan struct{}), make(chan struct{})
	drop := func() {
		defer close(restored)
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var d [2]unix.CapUserData
		if err := unix.Capget(&hdr, &d[0]); err != nil {
			t.Error(err)
			close(dropped)
			return
		}
		had := d
		d[0].Effective &^= 1 << capNetAdmin
		if err := unix.Capset(&hdr, &d[0]); err != nil {
			t.Error(err)
			close(dropped)
			return
		}
		dropped <- uint32(unix.Gettid())
		<-done
		if err := unix.Capset(&hdr, &had[0]); err != nil {
			t.Errorf("thread %d: CAP_NET_ADMIN not raised again: %v", unix.Gettid(), err)
		}
	}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if unix.Gettid() != unix.Getpid() {
			drop()
			return
		}
		// The leader: another thread is wanted. With this one held, a second
		// locked goroutine runs on a thread of its own.
		again := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			drop()
			close(again)
		}()
		<-again
	}()
	tid, live := <-dropped
	if !live {
		return
	}
	defer func() { close(done); <-restored }()
	if tid == pid {
		t.Fatal("the capability was dropped on the leader, not another thread")
	}
	ok, got, err := ProcThreadsNetAdmin(pid)
	if ok || got != tid || err != nil {
		t.Errorf("thread %d dropped CAP_NET_ADMIN: ProcThreadsNetAdmin %v, thread %d, %v; want false, %d", tid, ok, got, err, tid)
	}
	for _, id := range []uint32{pid, tid} {
		p, err := procfs.NewProc(int(id))
		if err != nil {
			t.Fatal(err)
		}
		st, err := p.NewStatus()
		if err != nil {
			t.Fatal(err)
		}
		if capEff, err := procCapEff(id); err != nil || capEff != st.CapEff {
			t.Errorf("task %d: capget %#x (%v), /proc status CapEff %#x", id, capEff, err, st.CapEff)
		}
	}
	if _, err := procCapEff(0); err == nil {
		t.Error("procCapEff(0) read the daemon's own capabilities")
	}
}

// SetAttr: the tree's modes, owners and times are fixed (EPERM for everyone, logged),
// truncation and times set to now need write permission (EACCES) and change nothing,
// and open with O_TRUNC asks for write permission too.
func TestSetAttr(t *testing.T) {
	v := newEnv(t)
	root := Caller{UID: 0, GIDs: []uint32{0}, Via: "9p", Peer: "root's"}
	user := Caller{UID: 1000, GIDs: []uint32{1000}, Via: "9p", Peer: "user's"}
	look := func(p string) *Node {
		n, err := v.tree.Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	mtu, pkey, dir := look("class/net/ib0/mtu"), look("class/net/ib0/pkey"), look("class/net/ib0")
	wh, err := mtu.Open(root, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Release()
	for _, c := range []struct {
		what string
		n    *Node
		who  Caller
		a    AttrChange
		want error
	}{
		{"root chmod", mtu, root, AttrChange{Mode: true}, syscall.EPERM},
		{"root chown", pkey, root, AttrChange{Owner: true}, syscall.EPERM},
		{"root sets a time", mtu, root, AttrChange{Times: true}, syscall.EPERM},
		{"user chmod", mtu, user, AttrChange{Mode: true}, syscall.EPERM},
		{"root truncates a writable file", mtu, root, AttrChange{Size: true, TimesNow: true}, nil},
		{"root truncates a read-only file (sysfs: root may)", pkey, root, AttrChange{Size: true}, nil},
		{"root touches a read-only file", pkey, root, AttrChange{TimesNow: true}, nil},
		{"user truncates root's file", mtu, user, AttrChange{Size: true}, syscall.EACCES},
		{"user touches root's file", mtu, user, AttrChange{TimesNow: true}, syscall.EACCES},
		{"ftruncate through a handle open for writing", mtu, user, AttrChange{Size: true, Handle: wh}, nil},
		{"root truncates a directory", dir, root, AttrChange{Size: true}, syscall.EISDIR},
		{"root touches a directory", dir, root, AttrChange{TimesNow: true}, nil},
	} {
		if err := c.n.SetAttr(c.who, c.a); err != c.want {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	lines := strings.Join(v.log.take(), "\n")
	if !strings.Contains(lines, `class/net/ib0/mtu: the tree's modes and owners are fixed (EPERM); setattr as uid=0 via=9p peer="root's"`) {
		t.Errorf("root's chmod is not logged:\n%s", lines)
	}
	if _, err := pkey.Open(user, syscall.O_RDONLY|syscall.O_TRUNC); err != syscall.EACCES {
		t.Errorf("user's open of pkey with O_TRUNC: %v, want EACCES", err)
	}
	if h, err := pkey.Open(root, syscall.O_RDONLY|syscall.O_TRUNC); err != nil {
		t.Errorf("root's open of pkey with O_TRUNC: %v, want success as on sysfs", err)
	} else {
		h.Release()
	}
	if _, err := dir.Open(root, syscall.O_RDONLY|syscall.O_TRUNC); err != syscall.EISDIR {
		t.Errorf("root's open of a directory with O_TRUNC: %v, want EISDIR", err)
	}
}

// A daemon in a PID namespace of its own with the host's /proc (unshare -p without
// --mount-proc) would read another process's capabilities under a writer's PID: it
// sees that /proc is not its own and counts no process as holding CAP_NET_ADMIN.
func TestProcOfAnotherPIDNamespace(t *testing.T) {
	if os.Getenv("IPOIBFS_PROC_CHILD") != "" {
		fmt.Printf("ours=%v netadmin=%v\n", ProcIsOurs(), ProcNetAdmin(uint32(os.Getpid())))
		return
	}
	testenv.Root(t)
	unshare := testenv.Tool(t, "unshare")
	if err := ProcIsOurs(); err != nil {
		t.Fatalf("the test's own /proc: %v", err)
	}
	if !ProcNetAdmin(uint32(os.Getpid())) {
		t.Fatal("root without the PID namespace: no CAP_NET_ADMIN")
	}
	cmd := exec.Command(unshare, "-p", "-f", "--", os.Args[0], "-test.run=^TestProcOfAnotherPIDNamespace$")
	cmd.Env = append(os.Environ(), "IPOIBFS_PROC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "ours=/proc is another PID namespace's") || !strings.Contains(string(out), "netadmin=false") {
		t.Errorf("in a PID namespace of its own with the host's /proc: %s", out)
	}
}

// A store gets at most a page per write, as kernfs gives it (PAGE_SIZE, no
// atomic_write_len for sysfs attributes): a longer write is short, and what the caller
// writes after is a store of its own.
func TestStoreTakesAPage(t *testing.T) {
	var stores []int
	n := &Node{t: &Tree{}, perm: 0o200, path: "x", write: func(p []byte) error { stores = append(stores, len(p)); return nil }}
	h, err := n.Open(Internal, syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 5000)
	k, err := h.Write(p)
	if err != nil || k != 4096 {
		t.Fatalf("a 5000-byte write: %d, %v; want 4096 taken", k, err)
	}
	if k, err := h.Write(p[k:]); err != nil || k != 904 {
		t.Fatalf("the rest: %d, %v", k, err)
	}
	if fmt.Sprint(stores) != "[4096 904]" {
		t.Errorf("stores %v, want [4096 904]", stores)
	}
}
