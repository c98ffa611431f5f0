package ninep

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// pipeClient serves root over net.Pipe and returns a client.
func pipeClient(t *testing.T, root *fs.Node, o Options) *Client {
	t.Helper()
	cc, sc := net.Pipe()
	done := make(chan struct{})
	if o.Unidentified == nil {
		o.Unidentified = &fs.Internal // a pipe has no peer credentials: act as root
	}
	go func() { ServeConn(sc, root, o); close(done) }()
	c, err := NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); <-done })
	return c
}

func TestReadWrite(t *testing.T) {
	v := newEnv(t)
	c := pipeClient(t, v.tree.Root(), Options{})
	for path, want := range map[string]string{
		"class/net/ib0/pkey": "0xffff\n", "class/net/ib0/type": "32\n", "class/net/ib0/mode": "datagram\n",
		"class/infiniband/n1/ports/1/state": "4: ACTIVE\n",
	} {
		got, err := c.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("read %s = %q, %v; want %q", path, got, err, want)
		}
	}
	if err := c.WriteFile("class/net/ib0/create_child", []byte("0x8001\n")); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.ReadFile("class/net/ib0.8001/parent"); string(got) != "ib0\n" {
		t.Errorf("parent %q", got)
	}
	for _, w := range []struct {
		path, data string
		want       syscall.Errno
	}{
		{"class/net/ib0/create_child", "1", syscall.ENOTUNIQ},
		{"class/net/ib0/delete_child", "0x0001", syscall.ENODEV},
		{"class/net/ib0/mode", "connected!", syscall.EINVAL},
		{"class/net/ib0/pkey", "1", syscall.EACCES},
		{"class/net/nosuch/mtu", "1", syscall.ENOENT},
		{"class/net/ib0/mtu", "5", syscall.EINVAL},
		{"sm/partitions", "Default=0x7fff : ALL=nonsense;\n", syscall.EINVAL}, // reported at clunk
	} {
		if err := c.WriteFile(w.path, []byte(w.data)); !errors.Is(err, w.want) {
			t.Errorf("write %q to %s: %v, want %v", w.data, w.path, err, w.want)
		}
	}
	if _, err := c.ReadFile("class/net/ib0/create_child"); !errors.Is(err, syscall.EACCES) {
		t.Errorf("read of a 0200 file: %v", err)
	}
	names, err := c.ReadDir("class/net")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ib0", "ib0.8001"}, names); diff != "" {
		t.Error(diff)
	}
	// A big directory crosses several Treaddir calls.
	pk, err := c.ReadDir("class/infiniband/n1/ports/1/pkeys")
	if err != nil || len(pk) != 64 || pk[63] != "63" {
		t.Errorf("pkeys: %d entries, %v", len(pk), err)
	}
}

// TestFidSemantics drives p9 directly: clone on Walk(nil), QIDs, iounit 0, the size-0
// SetAttr of O_TRUNC, append-style writes at an offset, GetAttr modes.
func TestFidSemantics(t *testing.T) {
	v := newEnv(t)
	cc, sc := net.Pipe()
	go ServeConn(sc, v.tree.Root(), Options{Unidentified: &fs.Internal})
	pc, err := p9.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	root, err := pc.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	qids, f, err := root.Walk([]string{"class", "net", "ib0", "mtu"})
	if err != nil || len(qids) != 4 || qids[0].Type != p9.TypeDir || qids[3].Type != p9.TypeRegular {
		t.Fatalf("walk: %v %v", qids, err)
	}
	n, _ := v.tree.Lookup("class/net/ib0/mtu")
	if qids[3].Path != n.Ino() {
		t.Errorf("qid path %d, ino %d", qids[3].Path, n.Ino())
	}
	_, clone, err := f.Walk(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, mask, attr, err := clone.GetAttr(p9.AttrMaskAll)
	if err != nil || !mask.Mode || attr.Mode != p9.ModeRegular|0644 {
		t.Errorf("getattr %v %o %v", mask, attr.Mode, err)
	}
	_, iounit, err := f.Open(p9.ReadWrite)
	if err != nil || iounit != 0 {
		t.Fatalf("open: iounit %d %v", iounit, err)
	}
	if err := f.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0}); err != nil {
		t.Errorf("setattr size 0: %v", err)
	}
	if _, err := f.WriteAt([]byte("1500\n"), 4096); err != nil { // >> writes at st_size
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	k, err := f.ReadAt(buf, 0)
	if string(buf[:k]) != "1500\n" {
		t.Errorf("read back %q %v", buf[:k], err)
	}
	f.Close()
	// The clone was never opened: it can still be opened now, write-only.
	if _, _, err := clone.Open(p9.WriteOnly); err != nil {
		t.Fatal(err)
	}
	if _, err := clone.ReadAt(buf, 0); err == nil {
		t.Error("read on a write-only fid succeeded")
	}
	clone.Close()
	// Walking into a file or to a missing name fails.
	if _, _, err := root.Walk([]string{"class", "net", "ib0", "mtu", "x"}); err == nil {
		t.Error("walk below a file")
	}
	if _, _, err := root.Walk([]string{"nosuch"}); sysErr(err) != syscall.ENOENT {
		t.Errorf("walk to a missing name: %v", err)
	}
	// Directories cannot be opened for writing; creating in them is refused.
	_, d, _ := root.Walk([]string{"class"})
	if _, _, err := d.Open(p9.WriteOnly); err == nil {
		t.Error("opened a directory for writing")
	}
	if _, err := d.Mkdir("x", 0755, 0, 0); err == nil {
		t.Error("mkdir succeeded")
	}
}

// ---- Tauth shim ----

func frame(typ byte, tag uint16, body ...byte) []byte {
	f := make([]byte, 7, 7+len(body))
	binary.LittleEndian.PutUint32(f, uint32(7+len(body)))
	f[4] = typ
	binary.LittleEndian.PutUint16(f[5:], tag)
	return append(f, body...)
}

func str9(s string) []byte {
	b := binary.LittleEndian.AppendUint16(nil, uint16(len(s)))
	return append(b, s...)
}

// tauth is Tauth{afid, uname, aname, n_uname}.
func tauth(tag uint16) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 1)
	b = append(b, str9("root")...)
	b = append(b, str9("/")...)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return frame(msgTauth, tag, b...)
}

func tversion() []byte {
	b := binary.LittleEndian.AppendUint32(nil, 8192)
	return frame(100, 0xffff, append(b, str9("9P2000.L")...)...)
}

// exchange sends frames on a fresh connection to the server and returns the replies.
func exchange(t *testing.T, root *fs.Node, o Options, reqs ...[]byte) [][]byte {
	t.Helper()
	cc, sc := net.Pipe()
	if o.Unidentified == nil {
		o.Unidentified = &fs.Internal
	}
	go ServeConn(sc, root, o)
	defer cc.Close()
	var out [][]byte
	for _, r := range reqs {
		if _, err := cc.Write(r); err != nil {
			t.Fatal(err)
		}
		cc.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := readFrame(cc)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func TestTauth(t *testing.T) {
	v := newEnv(t)
	for _, c := range []struct {
		compat bool
		errno  uint32
	}{{true, 2 /* ENOENT */}, {false, 38 /* ENOSYS, p9's own answer */}} {
		r := exchange(t, v.tree.Root(), Options{TauthCompat: c.compat}, tversion(), tauth(0x1234))
		if r[0][4] != 101 {
			t.Fatalf("Rversion expected, got type %d", r[0][4])
		}
		want := frame(msgRlerror, 0x1234, binary.LittleEndian.AppendUint32(nil, c.errno)...)
		if !bytes.Equal(r[1], want) {
			t.Errorf("compat=%v: Tauth answered % x, want % x", c.compat, r[1], want)
		}
	}
	// The p9 client works through the shim.
	c := pipeClient(t, v.tree.Root(), Options{TauthCompat: true})
	if got, err := c.ReadFile("class/net/ib0/pkey"); err != nil || string(got) != "0xffff\n" {
		t.Errorf("through the shim: %q %v", got, err)
	}
}

// ---- Serve: CIDR filter and shutdown ----

func TestServeCIDRAndCancel(t *testing.T) {
	v := newEnv(t)
	var mu sync.Mutex
	var logged []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := Options{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, TauthCompat: true,
		Log: func(s string) { mu.Lock(); logged = append(logged, s); mu.Unlock() }}
	go func() { done <- Serve(ctx, ln, v.tree.Root(), o) }()

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("refused peer: read %v, want the connection closed", err)
	}
	conn.Close()
	mu.Lock()
	if len(logged) != 1 || !strings.Contains(logged[0], "refused connection from 127.0.0.1") {
		t.Errorf("log %q", logged)
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}

	// Allowed peer; cancelling closes its live connection too.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	o.AllowCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	go func() { done <- Serve(ctx, ln, v.tree.Root(), o) }()
	conn, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.ReadFile("class/net/ib0/type"); err != nil || string(got) != "32\n" {
		t.Errorf("allowed peer read %q %v", got, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return with a client connected")
	}
	if _, err := c.ReadFile("class/net/ib0/type"); err == nil {
		t.Error("connection still served after cancel")
	}
	c.Close()
}

// ---- frame fuzzing ----

// shimRun pushes a byte stream from a client through the shim and returns what the
// server read and what the client got back.
func shimRun(in []byte) (toServer, toClient []byte) {
	c := &recConn{r: bytes.NewReader(in)}
	toServer, _ = io.ReadAll(newAuthShim(c))
	return toServer, bytes.Join(c.writes, nil)
}

// FuzzAuthShim feeds arbitrary client bytes through the shim: it must not panic, must
// pass every well-formed non-Tauth frame through unchanged and in order, answer every
// Tauth with Rlerror(ENOENT) of the same tag, and stop at the first malformed frame.
func FuzzAuthShim(f *testing.F) {
	f.Add(append(tversion(), tauth(7)...))
	f.Add(tauth(1)[:5])
	f.Add([]byte{3, 0, 0, 0, 100})
	f.Add(append(append(frame(110, 1, 1, 2, 3), tauth(2)...), frame(120, 3)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		toServer, toClient := shimRun(in)
		// Reference parse.
		var wantServer, wantClient []byte
		r := bytes.NewReader(in)
		for {
			fr, err := readFrame(r)
			if err != nil {
				break
			}
			if fr[4] == msgTauth {
				wantClient = append(wantClient, rlerror([2]byte{fr[5], fr[6]}, enoent)...)
				continue
			}
			wantServer = append(wantServer, fr...)
		}
		if !bytes.Equal(toServer, wantServer) {
			t.Fatalf("server got % x, want % x", toServer, wantServer)
		}
		if !bytes.Equal(toClient, wantClient) {
			t.Fatalf("client got % x, want % x", toClient, wantClient)
		}
	})
}

// FuzzShimWrite: server output split into arbitrary pieces reaches the client as the
// same bytes, one whole frame per write.
func FuzzShimWrite(f *testing.F) {
	f.Add([]byte{3, 1, 200}, uint8(3))
	f.Fuzz(func(t *testing.T, sizes []byte, cut uint8) {
		var stream []byte
		for k, s := range sizes {
			stream = append(stream, frame(byte(k), uint16(k), bytes.Repeat([]byte{byte(k)}, int(s))...)...)
		}
		rec := &recConn{}
		s := newAuthShim(rec)
		step := int(cut)%17 + 1
		for off := 0; off < len(stream); off += step {
			end := min(off+step, len(stream))
			if n, err := s.Write(stream[off:end]); err != nil || n != end-off {
				t.Fatalf("write: %d %v", n, err)
			}
		}
		if got := bytes.Join(rec.writes, nil); !bytes.Equal(got, stream) {
			t.Fatalf("stream changed")
		}
		for _, w := range rec.writes {
			if int(binary.LittleEndian.Uint32(w)) != len(w) {
				t.Fatalf("write of %d bytes is not one frame", len(w))
			}
		}
	})
}

// recConn is a connection that reads from r and records every write.
type recConn struct {
	net.Conn
	r      io.Reader
	writes [][]byte
}

func (r *recConn) Read(p []byte) (int, error) { return r.r.Read(p) }

func (r *recConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

// ---- raw messages the p9 client does not send ----

func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func tattach(fid uint32) []byte {
	b := append(u32(fid), u32(^uint32(0))...) // afid NOFID
	b = append(append(b, str9("root")...), str9("/")...)
	return frame(104, 1, append(b, u32(0)...)...)
}

func twalk(fid, newfid uint32, names ...string) []byte {
	b := append(u32(fid), u32(newfid)...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(names)))
	for _, n := range names {
		b = append(b, str9(n)...)
	}
	return frame(110, 1, b...)
}

func tlopen(fid, flags uint32) []byte { return frame(12, 1, append(u32(fid), u32(flags)...)...) }

func txattrwalk(fid, newfid uint32, name string) []byte {
	return frame(30, 1, append(append(u32(fid), u32(newfid)...), str9(name)...)...)
}

func tclunk(fid uint32) []byte { return frame(120, 1, u32(fid)...) }

func twrite(fid uint32, data string) []byte {
	b := binary.LittleEndian.AppendUint64(u32(fid), 0)
	return frame(118, 1, append(append(b, u32(uint32(len(data)))...), data...)...)
}

// rerrno is the errno of an Rlerror reply, 0 for any other.
func rerrno(r []byte) uint32 {
	if r[4] != msgRlerror {
		return 0
	}
	return binary.LittleEndian.Uint32(r[7:])
}

// A fid made by Txattrwalk shares the file of the fid it was walked from without
// owning it: clunking it leaves that fid open (a write through it still works, and
// sm/partitions' text is not applied early). Writing through a fid opened read-only
// fails with EBADF, as write(2) on such a descriptor.
func TestXattrWalkLeavesItsFidOpen(t *testing.T) {
	v := newEnv(t)
	r := exchange(t, v.tree.Root(), Options{}, tversion(), tattach(0),
		twalk(0, 1, "class", "net", "ib0", "mtu"), tlopen(1, syscall.O_RDWR),
		txattrwalk(1, 2, ""), tclunk(2), twrite(1, "1500\n"),
		twalk(0, 3, "class", "net", "ib0", "mtu"), tlopen(3, syscall.O_RDONLY), twrite(3, "1400\n"))
	for k, want := range []byte{101, 105, 111, 13, 31, 121, 119, 111, 13} {
		if r[k][4] != want {
			t.Fatalf("reply %d: type %d (errno %d), want %d", k, r[k][4], rerrno(r[k]), want)
		}
	}
	if got := rerrno(r[9]); got != uint32(syscall.EBADF) {
		t.Errorf("Twrite on a read-only fid: errno %d, want EBADF", got)
	}
	if n, _ := v.tree.Lookup("class/net/ib0/mtu"); n != nil {
		h, _ := n.Open(fs.Internal, syscall.O_RDONLY)
		b := make([]byte, 16)
		k, _ := h.ReadAt(b, 0)
		if string(b[:k]) != "1500\n" {
			t.Errorf("mtu %q after the writes, want 1500", b[:k])
		}
	}
}

// Tsetattr goes through the tree's rules (fs.Node.SetAttr) instead of succeeding for
// anyone: a chmod is EPERM (root's too), nobody's truncate of root's file and its
// Tlopen with O_TRUNC are EACCES; root's truncate of a writable file is accepted.
// A change of names is EACCES for nobody (no write permission on the directory, which
// the kernel checks first) and EPERM for root, as on sysfs.
func TestSetAttrAndTruncate(t *testing.T) {
	v := newEnv(t)
	for _, c := range []struct {
		who             fs.Caller
		chmod, truncate error
		lopenTrunc      error
		mkdir           error
		unlinkDir       error // unlinkat without AT_REMOVEDIR of a directory
	}{
		{fs.Caller{UID: fs.Nobody, GIDs: []uint32{fs.Nobody}, Via: "9p"}, linux.EPERM, linux.EACCES, linux.EACCES, linux.EACCES, linux.EACCES},
		{fs.Internal, linux.EPERM, nil, nil, linux.EPERM, linux.EISDIR},
	} {
		root, end := rawAttach(t, v.tree.Root(), Options{Unidentified: &c.who})
		_, f, err := root.Walk([]string{"class", "net", "ib0", "mtu"})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0666}); !errors.Is(err, c.chmod) {
			t.Errorf("uid %d chmod: %v, want %v", c.who.UID, err, c.chmod)
		}
		if err := f.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0}); !errors.Is(err, c.truncate) {
			t.Errorf("uid %d truncate: %v, want %v", c.who.UID, err, c.truncate)
		}
		if _, _, err := f.Open(p9.ReadOnly | p9.OpenFlags(syscall.O_TRUNC)); !errors.Is(err, c.lopenTrunc) {
			t.Errorf("uid %d Tlopen O_RDONLY|O_TRUNC: %v, want %v", c.who.UID, err, c.lopenTrunc)
		}
		_, d, err := root.Walk([]string{"class", "net"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Mkdir("x", 0o755, 0, 0); !errors.Is(err, c.mkdir) {
			t.Errorf("uid %d mkdir: %v, want %v", c.who.UID, err, c.mkdir)
		}
		if err := d.UnlinkAt("ib0", 0); !errors.Is(err, c.unlinkDir) {
			t.Errorf("uid %d unlink: %v, want %v", c.who.UID, err, c.unlinkDir)
		}
		end()
	}
}

// Extended attributes answer as over the FUSE mount: the tree has none, so a get is
// EOPNOTSUPP (not the EINVAL of a bad request) and the list is empty (not one empty
// name).
func TestXattrAnswers(t *testing.T) {
	v := newEnv(t)
	r := exchange(t, v.tree.Root(), Options{}, tversion(), tattach(0),
		twalk(0, 1, "class", "net", "ib0", "mtu"), txattrwalk(1, 2, "user.x"), txattrwalk(1, 3, ""))
	if got := rerrno(r[3]); got != uint32(syscall.EOPNOTSUPP) {
		t.Errorf("Txattrwalk user.x: type %d errno %d, want EOPNOTSUPP", r[3][4], got)
	}
	if r[4][4] != 31 || binary.LittleEndian.Uint64(r[4][7:]) != 0 {
		t.Errorf("Txattrwalk of the list: type %d, size %d; want an empty list", r[4][4], binary.LittleEndian.Uint64(r[4][7:]))
	}
}

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A connection's path tree keeps no node for a name nothing refers to any more: the
// names of children created, walked and deleted, and names given to Tunlinkat (the
// p9 server kept a node for each until the connection ended: a long-lived mount grew
// with every child it ever saw).
func TestPathTreeForgetsNames(t *testing.T) {
	v := newEnv(t)
	c := pipeClient(t, v.tree.Root(), Options{})
	dir, err := c.walk("class/net")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	const unlinks = 20000
	unlinkAll := func(from int) {
		for k := range unlinks {
			if err := dir.UnlinkAt(fmt.Sprintf("name-%d", from+k), 0); err == nil {
				t.Fatal("unlink in class/net succeeded")
			}
		}
	}
	unlinkAll(0) // warm: buffers and pools at their size
	v.log.Take() // each refusal is logged: the test's sink keeps the lines
	before := heapAfterGC()
	unlinkAll(unlinks)
	v.log.Take()
	if grew := int64(heapAfterGC()) - int64(before); grew > 1<<20 {
		t.Errorf("the heap grew by %d KiB over %d unlinks of new names", grew>>10, unlinks)
	}

	const children = 2000
	cycle := func(from int) {
		for k := range children {
			pkey := 0x1000 + from + k
			if err := c.WriteFile("class/net/ib0/create_child", fmt.Appendf(nil, "%#x\n", pkey)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ReadFile(fmt.Sprintf("class/net/ib0.%04x/pkey", pkey|0x8000)); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteFile("class/net/ib0/delete_child", fmt.Appendf(nil, "%#x\n", pkey|0x8000)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cycle(0)
	before = heapAfterGC()
	cycle(children)
	if grew := int64(heapAfterGC()) - int64(before); grew > 1<<20 {
		t.Errorf("the heap grew by %d KiB over %d children created, read and deleted", grew>>10, children)
	}
}

func txattrcreate(fid uint32, name string, size uint64) []byte {
	b := append(u32(fid), str9(name)...)
	b = binary.LittleEndian.AppendUint64(b, size)
	return frame(32, 1, append(b, u32(0)...)...)
}

// Txattrwalk's fids count within the connection's bound like any other (they escaped
// it: anyone could make millions), and a Txattrcreate is refused at once, before its
// value is buffered in the fid: EOPNOTSUPP as the tree has no extended attributes,
// E2BIG beyond the kernel's XATTR_SIZE_MAX whatever the file.
func TestXattrFidsBounded(t *testing.T) {
	v := newEnv(t)
	reqs := [][]byte{tversion(), tattach(0), twalk(0, 1, "class", "net", "ib0", "mtu")}
	const n = 10 // more than the bound of 8 holds
	for k := range n {
		reqs = append(reqs, txattrwalk(1, uint32(10+k), ""))
	}
	reqs = append(reqs, tclunk(10), txattrwalk(1, 30, ""), txattrwalk(1, 31, ""), // a clunked one gives its place back
		txattrcreate(1, "user.x", 4), txattrcreate(1, "user.x", 1<<40))
	r := exchange(t, v.tree.Root(), Options{MaxFids: 8}, reqs...)
	made := 0 // the walks that fit, then only ENFILE
	for k := 3; k < 3+n; k++ {
		switch got := rerrno(r[k]); {
		case r[k][4] == 31 && made == k-3:
			made++
		case got != uint32(syscall.ENFILE):
			t.Fatalf("Txattrwalk %d: type %d errno %d, want Rxattrwalk while they fit, then ENFILE", k-3, r[k][4], got)
		}
	}
	if made == 0 || made == n {
		t.Fatalf("%d of %d Txattrwalks made a fid within a bound of 8", made, n)
	}
	c := 3 + n
	if r[c][4] != 121 || r[c+1][4] != 31 || rerrno(r[c+2]) != uint32(syscall.ENFILE) {
		t.Errorf("after a clunk: types %d, %d, %d (errno %d), want Rclunk, Rxattrwalk, ENFILE", r[c][4], r[c+1][4], r[c+2][4], rerrno(r[c+2]))
	}
	if got := rerrno(r[c+3]); got != uint32(syscall.EOPNOTSUPP) {
		t.Errorf("Txattrcreate: type %d errno %d, want EOPNOTSUPP", r[c+3][4], got)
	}
	if got := rerrno(r[c+4]); got != uint32(syscall.E2BIG) {
		t.Errorf("Txattrcreate of 1 TiB: type %d errno %d, want E2BIG", r[c+4][4], got)
	}
}

// A fid opened twice at once keeps one handle: the library checks "not yet opened"
// under a shared lock, so two Tlopens can both reach Open; the second is refused and
// its handle released, not left to hold (an events subscription) until exit.
func TestOpenTwiceKeepsOneHandle(t *testing.T) {
	v := newEnv(t)
	n, err := v.tree.Lookup("class/net/ib0/mtu")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{}
	o.defaults()
	a := &attacher{root: v.tree.Root(), o: &o, fids: new(atomic.Int64)}
	f, err := newFile(a, n, fs.Internal)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	first := f.h
	if _, _, err := f.Open(p9.ReadOnly); !errors.Is(err, linux.EINVAL) {
		t.Errorf("second open of the fid: %v, want EINVAL", err)
	}
	if f.h != first {
		t.Error("the second open replaced the fid's handle")
	}
	f.Close()
}

// Every refused change over 9P is answered as sysfs answers it (names looked up first:
// EEXIST onto an existing name, ENOENT for a missing one, EISDIR and ENOTDIR; then
// EACCES for users; then EPERM, or EACCES for a create, for root) and logged with the
// path, what was asked and who asked.
func TestRefusedChangesAnsweredAndLogged(t *testing.T) {
	v := newEnv(t)
	nobody := fs.Caller{UID: fs.Nobody, GIDs: []uint32{fs.Nobody}, Via: "9p"}
	type step struct {
		what string
		do   func(root, netDir, ib0, mtu p9.File) error
		want map[uint32]error // by uid
		line string           // the log line's start
	}
	anyone := func(err error) map[uint32]error { return map[uint32]error{0: err, fs.Nobody: err} }
	steps := []step{
		{"mkdir of a new name", func(_, d, _, _ p9.File) error { _, err := d.Mkdir("x", 0o755, 0, 0); return err },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/x: mkdir refused"},
		{"mkdir of an existing name", func(_, d, _, _ p9.File) error { _, err := d.Mkdir("ib0", 0o755, 0, 0); return err },
			anyone(linux.EEXIST), "class/net/ib0: mkdir refused (file exists)"},
		{"create of a new name", func(_, d, _, _ p9.File) error {
			_, _, _, err := d.Create("x", p9.WriteOnly, 0o644, 0, 0)
			return err
		}, anyone(linux.EACCES), "class/net/x: create refused"},
		{"create of an existing name", func(_, _, i, _ p9.File) error {
			_, _, _, err := i.Create("mtu", p9.WriteOnly, 0o644, 0, 0)
			return err
		}, anyone(linux.EEXIST), "class/net/ib0/mtu: create refused"},
		{"symlink", func(_, d, _, _ p9.File) error { _, err := d.Symlink("ib0", "y", 0, 0); return err },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/y: symlink refused"},
		// mknod's file type decides (may_mknod, do_mknodat): a regular file is a create.
		{"mknod of a regular file", func(_, d, _, _ p9.File) error { _, err := d.Mknod("z", 0o644, 0, 0, 0, 0); return err },
			anyone(linux.EACCES), "class/net/z: mknod refused"},
		{"mknod of a FIFO", func(_, d, _, _ p9.File) error {
			_, err := d.Mknod("z", p9.ModeNamedPipe|0o644, 0, 0, 0, 0)
			return err
		}, map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/z: mknod refused"},
		{"mknod of a directory", func(_, d, _, _ p9.File) error {
			_, err := d.Mknod("ib0", p9.ModeDirectory|0o755, 0, 0, 0, 0)
			return err
		}, anyone(linux.EPERM), "class/net/ib0: mknod refused (operation not permitted)"},
		{"mknod of no known type", func(_, d, _, _ p9.File) error { _, err := d.Mknod("z", 0o170644, 0, 0, 0, 0); return err },
			anyone(linux.EINVAL), "class/net/z: mknod refused (invalid argument)"},
		{"link", func(_, _, i, m p9.File) error { return i.Link(m, "mtu2") },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/ib0/mtu2: link refused"},
		{"unlink of a missing name", func(_, d, _, _ p9.File) error { return d.UnlinkAt("nothing", 0) },
			anyone(linux.ENOENT), "class/net/nothing: unlink refused (no such file or directory)"},
		{"unlink of a file", func(_, _, i, _ p9.File) error { return i.UnlinkAt("mtu", 0) },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/ib0/mtu: unlink refused"},
		{"rmdir of a file", func(_, _, i, _ p9.File) error { return i.UnlinkAt("mtu", 0x200) },
			map[uint32]error{0: linux.ENOTDIR, fs.Nobody: linux.EACCES}, "class/net/ib0/mtu: rmdir refused"},
		{"rmdir of a directory", func(_, d, _, _ p9.File) error { return d.UnlinkAt("ib0", 0x200) },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/ib0: rmdir refused"},
		{"renameat of a missing name", func(_, d, _, _ p9.File) error { return d.RenameAt("nothing", d, "x") },
			anyone(linux.ENOENT), "class/net/nothing: rename refused"},
		{"renameat", func(_, d, _, _ p9.File) error { return d.RenameAt("ib0", d, "x") },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/ib0: rename refused"},
		{"renameat onto itself", func(_, d, _, _ p9.File) error { return d.RenameAt("ib0", d, "ib0") },
			anyone(nil), ""},
		{"renameat of a file onto a directory", func(_, d, i, _ p9.File) error { return i.RenameAt("mtu", d, "ib0") },
			map[uint32]error{0: linux.EISDIR, fs.Nobody: linux.EACCES}, "class/net/ib0/mtu: rename refused"},
		{"renameat of a directory onto a file", func(_, d, i, _ p9.File) error { return d.RenameAt("ib0", i, "mtu") },
			map[uint32]error{0: linux.ENOTDIR, fs.Nobody: linux.EACCES}, "class/net/ib0: rename refused"},
		{"unlink of a name with a newline", func(_, d, _, _ p9.File) error { return d.UnlinkAt("a\nfake: ok", 0) },
			anyone(linux.ENOENT), `class/net/a\nfake: ok: unlink refused`},
		{"rename", func(_, d, _, m p9.File) error { return m.Rename(d, "x") },
			map[uint32]error{0: linux.EPERM, fs.Nobody: linux.EACCES}, "class/net/ib0/mtu: rename refused"},
		{"mkdir in the debugfs directory", func(r, _, _, _ p9.File) error {
			_, d, err := r.Walk([]string{"kernel"})
			if err != nil {
				return err
			}
			_, err = d.Mkdir("debug", 0o755, 0, 0)
			return err
		}, anyone(linux.EEXIST), "kernel/debug: mkdir refused (file exists)"},
	}
	for _, who := range []fs.Caller{fs.Internal, nobody} {
		root, end := rawAttach(t, v.tree.Root(), Options{Unidentified: &who})
		walk := func(names ...string) p9.File {
			_, f, err := root.Walk(names)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
		netDir, ib0, mtu := walk("class", "net"), walk("class", "net", "ib0"), walk("class", "net", "ib0", "mtu")
		v.log.Take()
		for _, s := range steps {
			want := s.want[who.UID]
			if err := s.do(root, netDir, ib0, mtu); !errors.Is(err, want) {
				t.Errorf("uid %d %s: %v, want %v", who.UID, s.what, err, want)
			}
			lines := v.log.Take()
			as := fmt.Sprintf("as uid=%d via=9p", who.UID)
			if s.line == "" { // not refused: nothing logged
				if len(lines) != 0 {
					t.Errorf("uid %d %s: logged %q", who.UID, s.what, lines)
				}
				continue
			}
			if len(lines) != 1 || !strings.HasPrefix(lines[0], s.line) || !strings.Contains(lines[0], as) {
				t.Errorf("uid %d %s: logged %q, want one line starting %q and saying %q", who.UID, s.what, lines, s.line, as)
			}
		}
		// A directory opened for writing: EISDIR, logged.
		if _, _, err := walk("class", "net").Open(p9.WriteOnly); !errors.Is(err, linux.EISDIR) {
			t.Errorf("uid %d: a directory opened for writing: %v", who.UID, err)
		}
		if lines := v.log.Take(); len(lines) != 1 || !strings.HasPrefix(lines[0], "class/net: is a directory; open for writing as uid=") {
			t.Errorf("uid %d: a directory opened for writing logged %q", who.UID, lines)
		}
		// A truncate or an O_TRUNC open without write permission: logged as well.
		for _, f := range []func() error{
			func() error { return mtu.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{}) },
			func() error {
				_, _, err := walk("class", "net", "ib0", "mtu").Open(p9.ReadOnly | p9.OpenFlags(syscall.O_TRUNC))
				return err
			},
		} {
			err := f()
			lines := v.log.Take()
			if who.UID == 0 {
				if err != nil || len(lines) != 0 {
					t.Errorf("root's truncate: %v, logged %q", err, lines)
				}
			} else if !errors.Is(err, linux.EACCES) || len(lines) != 1 || !strings.HasPrefix(lines[0], "class/net/ib0/mtu: permission denied; ") {
				t.Errorf("nobody's truncate: %v, logged %q", err, lines)
			}
		}
		end()
	}
}

// rawAttach serves root on a fresh pipe with o and returns the attached root of a p9
// client, and a function that closes the client and waits for the server's end (also
// run at cleanup; once is enough).
func rawAttach(t *testing.T, root *fs.Node, o Options) (p9.File, func()) {
	t.Helper()
	cc, sc := net.Pipe()
	done := make(chan struct{})
	go func() { ServeConn(sc, root, o); close(done) }()
	pc, err := p9.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end := func() { once.Do(func() { pc.Close(); <-done }) }
	t.Cleanup(end)
	r, err := pc.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	return r, end
}

// A store takes at most a page per write and answers short (as sysfs's); the client's
// WriteFile writes the rest as write(2) in a loop does, each part a store of its own:
// here the second page's value is the one umcast keeps (its parser, sscanf's %d, reads
// the first number of a page and ignores what follows).
func TestWriteFileLoopsOnShortWrites(t *testing.T) {
	v := newEnv(t)
	c := pipeClient(t, v.tree.Root(), Options{})
	first := "1" + strings.Repeat(" ", 4095)
	for _, w := range []struct{ data, want string }{{first, "1\n"}, {first + "0\n", "0\n"}} {
		if err := c.WriteFile("class/net/ib0/umcast", []byte(w.data)); err != nil {
			t.Fatalf("a write of %d bytes to umcast: %v", len(w.data), err)
		}
		if got, err := c.ReadFile("class/net/ib0/umcast"); err != nil || string(got) != w.want {
			t.Errorf("umcast %q, %v after a write of %d bytes; want %q", got, err, len(w.data), w.want)
		}
	}
}
