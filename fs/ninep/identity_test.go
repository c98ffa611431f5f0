package ninep

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/vishvananda/netns"

	"ipoibfs/fs"
	"ipoibfs/internal/testenv"
)

// Who an attach acts as, for each kind of connection and claim.
func TestAttachAs(t *testing.T) {
	root := connIdentity{who: fs.Caller{UID: 0, Via: "9p", Peer: "unix pid 1"}, fromKernel: true}
	user := connIdentity{who: fs.Caller{UID: 1000, Via: "9p", Peer: "127.0.0.1:5000"}, fromKernel: true}
	remote := connIdentity{who: fs.Caller{UID: fs.Nobody, Via: "9p", Peer: "192.0.2.7:700"}}
	trusted := remote
	trusted.trustNames = true
	for _, c := range []struct {
		what  string
		id    connIdentity
		uname string
		uid   p9.UID
		want  uint32
		err   error
	}{
		{"root connection, no claim", root, "", p9.NoUID, 0, nil},
		{"root connection attaching as 1000 (access=user)", root, "", 1000, 1000, nil},
		{"root connection attaching by name", root, "root", p9.NoUID, 0, nil},
		{"root connection, numeric uname", root, "1234", p9.NoUID, 1234, nil},
		{"root connection, unknown user name", root, "no-such-user-xyz", p9.NoUID, 0, linux.EPERM},
		{"user connection, no claim", user, "", p9.NoUID, 1000, nil},
		{"user connection claiming itself", user, "", 1000, 1000, nil},
		{"user connection claiming root", user, "", 0, 0, linux.EPERM},
		{"user connection claiming root by name", user, "root", p9.NoUID, 0, linux.EPERM},
		{"remote without trust claiming root", remote, "root", 0, fs.Nobody, nil},
		{"remote without trust, no claim", remote, "", p9.NoUID, fs.Nobody, nil},
		{"remote with trust claiming 1000", trusted, "", 1000, 1000, nil},
		{"remote with trust claiming root", trusted, "root", 0, 0, nil},
		{"remote with trust, no claim", trusted, "", p9.NoUID, fs.Nobody, nil},
		{"remote with trust, unknown name", trusted, "no-such-user-xyz", p9.NoUID, fs.Nobody, nil},
	} {
		got, err := c.id.attachAs(c.uname, c.uid)
		if !errors.Is(err, c.err) || (err == nil && got.UID != c.want) {
			t.Errorf("%s: uid %d, %v; want uid %d, %v", c.what, got.UID, err, c.want, c.err)
		}
	}
	// A server from before NoNetAdminUname (attachNamed alone) takes it for a user
	// name it does not know and refuses the attach: the form fails closed.
	if _, err := root.attachNamed(NoNetAdminUname(0), p9.NoUID); !errors.Is(err, linux.EPERM) {
		t.Errorf("NoNetAdminUname at a server that does not know it: %v, want EPERM", err)
	}
	// NoNetAdminUname keeps the user and takes CAP_NET_ADMIN away, and only that.
	capRoot := root
	capRoot.who.NetAdmin = true
	for _, c := range []struct {
		what     string
		id       connIdentity
		uid      p9.UID
		want     uint32
		netAdmin bool
		err      error
	}{
		{"root connection with the capability, plain", capRoot, 0, 0, true, nil},
		{"root connection with the capability, as root without it", capRoot, 0, 0, false, nil},
		{"root connection, as 1000 without it", capRoot, 1000, 1000, false, nil},
		{"user connection claiming root without it", user, 0, 0, false, linux.EPERM},
		{"remote with trust, root without it", trusted, 0, 0, false, nil},
	} {
		uname, uid := NoNetAdminUname(uint32(c.uid)), p9.NoUID
		if c.netAdmin {
			uname, uid = "", c.uid
		}
		got, err := c.id.attachAs(uname, uid)
		if !errors.Is(err, c.err) || err == nil && (got.UID != c.want || got.NetAdmin != c.netAdmin) {
			t.Errorf("%s: uid %d CAP_NET_ADMIN %v, %v; want uid %d %v, %v", c.what, got.UID, got.NetAdmin, err, c.want, c.netAdmin, c.err)
		}
	}
}

// A unix socket's peer is who the kernel says; a root connection attaching as another
// user gets that user's rights, and a write as that user is refused.
func TestUnixPeerAndAttachAs(t *testing.T) {
	v := newEnv(t)
	_, c := serveOne(t, v, "unix", filepath.Join(t.TempDir(), "s"))
	try := func(root p9.File) error {
		_, f, err := root.Walk([]string{"class", "net", "ib0", "mtu"})
		if err != nil {
			return err
		}
		defer f.Close()
		if _, _, err := f.Open(p9.WriteOnly); err != nil {
			return err
		}
		_, err = f.WriteAt([]byte("2044\n"), 0)
		return err
	}
	me, err := c.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := try(me); err != nil {
			t.Errorf("root over a unix socket writing mtu: %v", err)
		}
	}
	as1000, err := c.AttachAs("/", "", 1000)
	if os.Geteuid() != 0 {
		if !errors.Is(err, linux.EPERM) {
			t.Errorf("a non-root connection attaching as 1000: %v, want EPERM", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("root attaching as 1000: %v", err)
	}
	if err := try(as1000); !errors.Is(err, linux.EACCES) {
		t.Errorf("uid 1000 (attached by root) writing mtu: %v, want EACCES", err)
	}
	lines := v.log.Take()
	found := false
	for _, l := range lines {
		if l == `class/net/ib0/mtu: permission denied; open for writing as uid=1000 via=9p peer="unix pid `+strconv.Itoa(os.Getpid())+`"` {
			found = true
		}
	}
	if !found {
		t.Errorf("no log line naming uid 1000 and this process: %q", lines)
	}
}

// The fids a connection holds are bounded: beyond MaxFids a walk fails with ENFILE,
// and clunking gives room again.
func TestFidBound(t *testing.T) {
	v := newEnv(t)
	cc, sc := net.Pipe()
	go ServeConn(sc, v.tree.Root(), Options{Unidentified: &fs.Internal, MaxFids: 8})
	c, err := p9.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	root, err := c.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	var held []p9.File
	for range 7 { // the attach holds one
		_, f, err := root.Walk([]string{"class"})
		if err != nil {
			t.Fatalf("walk %d: %v", len(held), err)
		}
		held = append(held, f)
	}
	if _, _, err := root.Walk([]string{"class"}); !errors.Is(err, linux.ENFILE) {
		t.Fatalf("walk beyond the bound: %v, want ENFILE", err)
	}
	held[0].Close()
	if _, f, err := root.Walk([]string{"class"}); err != nil {
		t.Errorf("walk after a clunk: %v", err)
	} else {
		f.Close()
	}
}

// A connection that never attaches is closed after AttachTimeout.
func TestAttachTimeout(t *testing.T) {
	v := newEnv(t)
	cc, sc := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeConn(sc, v.tree.Root(), Options{AttachTimeout: 50 * time.Millisecond}) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a connection that never attached is still served")
	}
	if _, err := cc.Write([]byte{0}); !errors.Is(err, syscall.EPIPE) && !errors.Is(err, net.ErrClosed) && err == nil {
		t.Errorf("write to the closed connection: %v", err)
	}
}

// A connection has at most MaxOutstanding requests in flight: the shim stops reading
// requests until replies are written.
func TestOutstandingBound(t *testing.T) {
	cc, sc := net.Pipe()
	defer cc.Close()
	s := newShim(sc, false, 4)
	defer s.Close() // releases the reader waiting for a slot
	go func() {
		for k := range 10 {
			_, _ = cc.Write(frame(110, uint16(k), 1, 2, 3))
		}
	}()
	got := make(chan int, 16)
	go func() {
		buf := make([]byte, 10)
		for k := 1; ; k++ {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			got <- k
		}
	}()
	for k := 1; k <= 4; k++ {
		if n := <-got; n != k {
			t.Fatalf("request %d read as %d", k, n)
		}
	}
	select {
	case n := <-got:
		t.Fatalf("request %d read with 4 replies owed", n)
	case <-time.After(100 * time.Millisecond):
	}
	// One reply paid: exactly one more request is read.
	go func() { buf := make([]byte, 64); _, _ = cc.Read(buf) }()
	if _, err := s.Write(frame(111, 0)); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != 5 {
		t.Fatalf("after one reply, request %d read", n)
	}
}

// Whatever a Tattach names (uname from the wire, n_uname), a connection the kernel
// identified as a user other than root acts as that user or not at all, nobody's
// remote connection stays nobody, and the NoNetAdminUname form never grants
// CAP_NET_ADMIN.
func FuzzAttachAs(f *testing.F) {
	for _, s := range []string{"", "root", "1000", NoNetAdminUname(0), NoNetAdminUname(1000), "ipoibfs:-cap_net_admin:", "ipoibfs:-cap_net_admin:x"} {
		f.Add(s, uint32(p9.NoUID))
		f.Add(s, uint32(0))
	}
	f.Fuzz(func(t *testing.T, uname string, uid uint32) {
		user := connIdentity{who: fs.Caller{UID: 1000, Via: "9p", NetAdmin: true}, fromKernel: true}
		if c, err := user.attachAs(uname, p9.UID(uid)); err == nil && c.UID != 1000 {
			t.Fatalf("uid 1000's connection attached as %d with %q/%d", c.UID, uname, uid)
		}
		remote := connIdentity{who: fs.Caller{UID: fs.Nobody, Via: "9p"}}
		if c, err := remote.attachAs(uname, p9.UID(uid)); err == nil && (c.UID != fs.Nobody || c.NetAdmin) {
			t.Fatalf("an untrusted remote attached as %d (CAP_NET_ADMIN %v) with %q/%d", c.UID, c.NetAdmin, uname, uid)
		}
		root := connIdentity{who: fs.Caller{UID: 0, Via: "9p", NetAdmin: true}, fromKernel: true}
		if c, err := root.attachAs(uname, p9.UID(uid)); err == nil && strings.HasPrefix(uname, noNetAdminPrefix) && p9.UID(uid) == p9.NoUID && c.NetAdmin {
			t.Fatalf("%q attached with CAP_NET_ADMIN", uname)
		}
	})
}

// A TCP connection's user is the owner of exactly the client's socket: sockets of the
// same client port from other addresses, closed and in TIME_WAIT (which the kernel
// reports as root's, with no inode), do not stand in for it, nor make it ambiguous.
func TestTCPIdentityIsTheExactSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (sock_diag shows the owner, /proc the capability)")
		}
		t.Skip("needs root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialFrom := func(ip string, port int) (client, server net.Conn) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	// Closed by the client first: its end stays in TIME_WAIT.
	port := 0
	for k := 3; k < 9; k++ {
		c, s := dialFrom("127.0.0."+strconv.Itoa(k), port)
		port = c.LocalAddr().(*net.TCPAddr).Port
		c.Close()
		_, _ = io.Copy(io.Discard, s)
		s.Close()
	}
	c, s := dialFrom("127.0.0.2", port)
	defer c.Close()
	defer s.Close()
	diag := newSockDiag()
	defer diag.close()
	id := identify(s, diag, false, nil)
	if id.who.UID != 0 || !id.fromKernel || !id.who.NetAdmin {
		t.Fatalf("root's connection from port %d beside 6 closed ones: uid %d, from the kernel %v, CAP_NET_ADMIN %v", port, id.who.UID, id.fromKernel, id.who.NetAdmin)
	}
}

// Every process holding a client socket (loopback TCP, or unix) must hold
// CAP_NET_ADMIN for the connection to have it: a child without the capability that
// inherited the socket (a client that forked, or handed it on) could write through
// it too.
func TestNetAdminNeedsEveryHolder(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (sock_diag shows the owner, /proc the capability)")
		}
		t.Skip("needs root")
	}
	t.Run("tcp", func(t *testing.T) { testNetAdminNeedsEveryHolder(t, "tcp", "127.0.0.1:0") })
	t.Run("unix", func(t *testing.T) { testNetAdminNeedsEveryHolder(t, "unix", filepath.Join(t.TempDir(), "s")) })
}

func testNetAdminNeedsEveryHolder(t *testing.T, network, addr string) {
	setpriv := testenv.Tool(t, "setpriv")
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	diag := newSockDiag()
	defer diag.close()
	if id := identify(s, diag, false, nil); !id.who.NetAdmin {
		t.Fatalf("root's own connection: CAP_NET_ADMIN %v", id.who.NetAdmin)
	}
	f, err := c.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(setpriv, "--bounding-set=-net_admin", "--", "sleep", "60")
	child.ExtraFiles = []*os.File{f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// setpriv keeps the capability until it runs sleep.
	for deadline := time.Now().Add(10 * time.Second); fs.ProcNetAdmin(uint32(child.Process.Pid)); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the child under setpriv still has CAP_NET_ADMIN")
		}
	}
	if id := identify(s, diag, false, nil); id.who.NetAdmin {
		t.Error("a holder without CAP_NET_ADMIN: the connection has it")
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	if id := identify(s, diag, false, nil); !id.who.NetAdmin {
		t.Error("the holder without it gone: the connection does not have it")
	}
}

// serveOne serves v's tree to one connection over network (a listener on addr) and
// returns the client's end and a 9P client on it; both end with the test.
func serveOne(t *testing.T, v *env, network, addr string) (net.Conn, *p9.Client) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		done <- ServeConn(c, v.tree.Root(), Options{})
	}()
	conn, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := p9.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); ln.Close(); <-done })
	return conn, c
}

// openWriter opens the file at path through root for writing and returns a writer of
// a number and a newline, as echo N > file.
func openWriter(t *testing.T, root p9.File, path ...string) func(n int) error {
	t.Helper()
	_, f, err := root.Walk(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		t.Fatal(err)
	}
	return func(n int) error { _, err := f.WriteAt([]byte(strconv.Itoa(n)+"\n"), 0); return err }
}

// CAP_NET_ADMIN is asked again at each write that needs it, as the kernel asks
// capable() of the writing task: a child without it that the client forked (or handed
// its socket to) after attaching writes nothing, and the refusal says which process
// lacks it; once the child is gone the client writes again.
func TestNetAdminAskedAtEachWrite(t *testing.T) {
	testenv.Root(t)
	t.Run("tcp", func(t *testing.T) { testNetAdminAskedAtEachWrite(t, "tcp", "127.0.0.1:0") })
	t.Run("unix", func(t *testing.T) { testNetAdminAskedAtEachWrite(t, "unix", filepath.Join(t.TempDir(), "s")) })
}

func testNetAdminAskedAtEachWrite(t *testing.T, network, addr string) {
	setpriv := testenv.Tool(t, "setpriv")
	v := newEnv(t)
	conn, c := serveOne(t, v, network, addr)
	root, err := c.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	write := openWriter(t, root, "class", "net", "ib0", "tx_queue_len")
	if err := write(1001); err != nil {
		t.Fatalf("root's connection, before any child: %v", err)
	}
	sf, err := conn.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(setpriv, "--bounding-set=-net_admin", "--", "sleep", "60")
	child.ExtraFiles = []*os.File{sf}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	sf.Close()
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); fs.ProcNetAdmin(uint32(child.Process.Pid)); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the child under setpriv still has CAP_NET_ADMIN")
		}
	}
	v.log.Take()
	if err := write(1002); !errors.Is(err, linux.EPERM) {
		t.Errorf("a write while a child without CAP_NET_ADMIN holds the socket: %v, want EPERM", err)
	}
	want := "pid " + strconv.Itoa(child.Process.Pid) + " holds the client's socket without CAP_NET_ADMIN"
	if lines := v.log.Take(); len(lines) != 1 || !strings.Contains(lines[0], want) {
		t.Errorf("log %q, want the refusal naming %q", lines, want)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	if err := write(1003); err != nil {
		t.Errorf("the child gone: %v", err)
	}
	if n := v.ib0.TxQueueLen(); n != 1003 {
		t.Errorf("tx_queue_len %d, want 1003 (1002 refused)", n)
	}
}

// A unix client in another network namespace (ip netns exec ... ipoibfs 9p unix:...)
// is found: the accepted socket lives in the client's namespace, and sock_diag is
// asked there.
func TestUnixPeerInAnotherNetNS(t *testing.T) {
	testenv.Root(t)
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer orig.Close()
		ns, err := netns.New() // and this thread is in it
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		defer func() {
			if err := netns.Set(orig); err != nil {
				panic(err) // a thread left in the new namespace must not run anything else
			}
		}()
		if c, err = net.Dial("unix", sock); err != nil {
			t.Fatal(err)
		}
	}()
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var st syscall.Stat_t
	raw, _ := c.(*net.UnixConn).SyscallConn()
	_ = raw.Control(func(fd uintptr) { _ = syscall.Fstat(int(fd), &st) })
	peer, err := unixPeerInode(s)
	if err != nil || peer != st.Ino {
		t.Fatalf("the peer of a connection from another network namespace: inode %d, %v; want %d", peer, err, st.Ino)
	}
}

// A client socket no process holds (in flight in an SCM_RIGHTS message here; a kernel
// v9fs mount's is the same to /proc) has no CAP_NET_ADMIN: whoever receives it could
// write with it.
func TestNetAdminOfASocketNoProcessHolds(t *testing.T) {
	testenv.Root(t)
	for _, network := range []string{"tcp", "unix"} {
		addr := "127.0.0.1:0"
		if network == "unix" {
			addr = filepath.Join(t.TempDir(), "s")
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(pair[0])
		defer syscall.Close(pair[1])
		f, err := c.(interface{ File() (*os.File, error) }).File()
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Sendmsg(pair[0], []byte{0}, syscall.UnixRights(int(f.Fd())), nil, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		c.Close() // now only the message holds it
		diag := newSockDiag()
		id := identify(s, diag, false, nil)
		diag.close()
		if id.who.NetAdmin || !strings.Contains(id.who.NoNetAdmin, "no process holds") {
			t.Errorf("%s: a client socket in flight: CAP_NET_ADMIN %v (%q)", network, id.who.NetAdmin, id.who.NoNetAdmin)
		}
	}
}
