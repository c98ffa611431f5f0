// Package ninep serves the ipoibfs control tree (package ipoibfs/fs) over 9P2000.L with
// hugelgupf/p9. It is a thin adapter: walks, listings, reads and writes go to the fs node
// model, which owns formats, parsing and errnos, so a file gives the same bytes and
// errno here as over FUSE.
//
// Per fid: Walk(nil) returns a fresh clone, Open keeps an fs.Handle (iounit 0, so clients
// use msize-sized I/O), Close (the clunk) releases it. SetAttr is a no-op (the Linux
// client truncates through Tsetattr size 0). Readdir offsets are entry indexes. Errors
// are syscall.Errno values, which p9 turns into Rlerror. There is no per-user access
// check: p9 does not tell the server the attaching user, so every 9P client acts as root
// (with kernfs's rule that 0444 files cannot be opened for writing and 0200 files not for
// reading); restrict who may connect with Options.AllowCIDRs.
//
// Locking: a fid's file has one mutex for its handle; the handle serialises its own
// reads and writes. Serve's listener keeps a set of live connections under its mutex so
// that cancelling the context closes them.
package ninep

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// Options configure Serve.
type Options struct {
	// AllowCIDRs lists the networks clients may connect from. Empty allows every peer.
	// Connections from elsewhere are closed at once and logged. Peers without an IP
	// address (unix sockets) are always allowed.
	AllowCIDRs []netip.Prefix
	// TauthCompat answers Tauth with Rlerror ENOENT ("no authentication required"), as
	// diod does when auth is off, instead of p9's ENOSYS, so diod's tools (diodcat,
	// diodls, mount.diod) can attach.
	TauthCompat bool
	// Log receives one line per refused connection (nil discards).
	Log func(string)
}

// NewAttacher returns a p9.Attacher whose every attach is the tree at root.
func NewAttacher(root *fs.Node) p9.Attacher { return attacher{root} }

type attacher struct{ root *fs.Node }

func (a attacher) Attach() (p9.File, error) { return &file{n: a.root}, nil }

// Serve serves the tree on ln until ctx is cancelled, then closes ln and every
// connection and returns nil. Other errors from ln are returned.
func Serve(ctx context.Context, ln net.Listener, root *fs.Node, o Options) error {
	fl := &listener{Listener: ln, o: o, conns: map[net.Conn]struct{}{}}
	srv := p9.NewServer(NewAttacher(root))
	stop := context.AfterFunc(ctx, fl.closeAll)
	defer stop()
	err := srv.ServeContext(ctx, fl)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// ServeConn serves one already-accepted connection (net.Pipe in tests, an inherited
// socket) until it closes. Options.AllowCIDRs is not consulted.
func ServeConn(c net.Conn, root *fs.Node, o Options) error {
	if o.TauthCompat {
		c = newAuthShim(c)
	}
	return p9.NewServer(NewAttacher(root)).Handle(c, c)
}

// listener filters peers and tracks connections.
type listener struct {
	net.Listener
	o Options

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (l *listener) allowed(a net.Addr) (netip.Addr, bool) {
	if len(l.o.AllowCIDRs) == 0 {
		return netip.Addr{}, true
	}
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		return netip.Addr{}, true // unix sockets and the like are local
	}
	ip = ip.Unmap()
	for _, p := range l.o.AllowCIDRs {
		if p.Contains(ip) {
			return ip, true
		}
	}
	return ip, false
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ip, ok := l.allowed(c.RemoteAddr()); !ok {
			if l.o.Log != nil {
				l.o.Log(fmt.Sprintf("9p: refused connection from %s: not in the allowed networks %v", ip, l.o.AllowCIDRs))
			}
			c.Close()
			continue
		}
		if l.o.TauthCompat {
			c = newAuthShim(c)
		}
		tc := &trackedConn{Conn: c, l: l}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return nil, net.ErrClosed
		}
		l.conns[tc] = struct{}{}
		l.mu.Unlock()
		return tc, nil
	}
}

// closeAll closes the listener and every live connection.
func (l *listener) closeAll() {
	l.mu.Lock()
	l.closed = true
	cs := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		cs = append(cs, c)
	}
	l.mu.Unlock()
	l.Listener.Close()
	for _, c := range cs {
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *listener
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// ---- p9.File ----

// file is one fid: the node it names and, once opened, its handle.
type file struct {
	dirMu sync.Mutex
	dir   []*fs.Node // the listing in progress (per fid)
	n     *fs.Node
	mu    sync.Mutex
	h     *fs.Handle
}

var _ p9.File = (*file)(nil)

func toErr(err error) error {
	if err == nil {
		return nil
	}
	return linux.Errno(fs.Errno(err))
}

func qidOf(n *fs.Node) p9.QID {
	t := p9.TypeRegular
	if n.IsDir() {
		t = p9.TypeDir
	}
	return p9.QID{Type: t, Path: n.Ino()}
}

func (f *file) handle() (*fs.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.h == nil {
		return nil, linux.EBADF
	}
	return f.h, nil
}

func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	n := f.n
	qids := make([]p9.QID, 0, len(names))
	for _, name := range names {
		c, err := n.Lookup(name)
		if err != nil {
			return nil, nil, toErr(err)
		}
		n = c
		qids = append(qids, qidOf(n))
	}
	return qids, &file{n: n}, nil
}

func (f *file) WalkGetAttr([]string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	return nil, nil, p9.AttrMask{}, p9.Attr{}, linux.ENOSYS
}

func (f *file) StatFS() (p9.FSStat, error) {
	return p9.FSStat{Type: 0x01021997 /* V9FS_MAGIC */, BlockSize: 4096, NameLength: 255}, nil
}

func (f *file) GetAttr(p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	mode := p9.ModeRegular
	nlink := p9.NLink(1)
	if f.n.IsDir() {
		mode, nlink = p9.ModeDirectory, 2
	}
	t := f.n.ModTime()
	sec, nsec := uint64(t.Unix()), uint64(t.Nanosecond())
	attr := p9.Attr{Mode: mode | p9.FileMode(f.n.Perm()), NLink: nlink, Size: f.n.Size(), BlockSize: 4096,
		ATimeSeconds: sec, ATimeNanoSeconds: nsec, MTimeSeconds: sec, MTimeNanoSeconds: nsec,
		CTimeSeconds: sec, CTimeNanoSeconds: nsec}
	valid := p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, Size: true, Blocks: true,
		ATime: true, MTime: true, CTime: true}
	return qidOf(f.n), valid, attr, nil
}

// SetAttr ignores every change, the size-0 truncate of `echo x > file` included.
func (f *file) SetAttr(p9.SetAttrMask, p9.SetAttr) error { return nil }

// Close releases the open handle. For sm/partitions this applies the written
// configuration; its error reaches clients that read Rclunk errors (the Go client does,
// the Linux v9fs client does not).
func (f *file) Close() error {
	f.mu.Lock()
	h := f.h
	f.h = nil
	f.mu.Unlock()
	if h == nil {
		return nil
	}
	return toErr(h.Release())
}

func (f *file) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	var flags int
	switch mode.Mode() {
	case p9.ReadOnly:
		flags = syscall.O_RDONLY
	case p9.WriteOnly:
		flags = syscall.O_WRONLY
	case p9.ReadWrite:
		flags = syscall.O_RDWR
	default:
		return p9.QID{}, 0, linux.EINVAL
	}
	h, err := f.n.Open(flags)
	if err != nil {
		return p9.QID{}, 0, toErr(err)
	}
	f.mu.Lock()
	f.h = h
	f.mu.Unlock()
	return qidOf(f.n), 0, nil
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	h, err := f.handle()
	if err != nil {
		return 0, err
	}
	k, err := h.ReadAt(p, off)
	if err != nil {
		return 0, toErr(err)
	}
	if k == 0 {
		return 0, io.EOF
	}
	return k, nil
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	h, err := f.handle()
	if err != nil {
		return 0, err
	}
	k, err := h.Write(p)
	return k, toErr(err)
}

func (f *file) FSync() error { return nil }

// Readdir lists the directory as it was when the listing started (offset 0): a listing
// takes several requests, and a child created or deleted in between must neither
// appear twice nor push another entry out.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	f.dirMu.Lock()
	defer f.dirMu.Unlock()
	if offset == 0 || f.dir == nil {
		cs, err := f.n.Children()
		if err != nil {
			return nil, toErr(err)
		}
		f.dir = cs
	}
	cs := f.dir
	if offset >= uint64(len(cs)) {
		return nil, nil
	}
	out := make(p9.Dirents, 0, len(cs)-int(offset))
	for k := int(offset); k < len(cs); k++ {
		q := qidOf(cs[k])
		out = append(out, p9.Dirent{QID: q, Offset: uint64(k) + 1, Type: q.Type, Name: cs[k].Name()})
	}
	return out, nil
}

func (f *file) SetXattr(string, []byte, p9.XattrFlags) error { return linux.EOPNOTSUPP }
func (f *file) GetXattr(string) ([]byte, error)              { return nil, linux.ENODATA }
func (f *file) ListXattrs() ([]string, error)                { return nil, nil }
func (f *file) RemoveXattr(string) error                     { return linux.EOPNOTSUPP }

func (f *file) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	return p9.LockStatusError, linux.ENOSYS
}

func (f *file) Create(string, p9.OpenFlags, p9.FileMode, p9.UID, p9.GID) (p9.File, p9.QID, uint32, error) {
	if !f.n.IsDir() {
		return nil, p9.QID{}, 0, linux.ENOTDIR
	}
	return nil, p9.QID{}, 0, linux.Errno(fs.ErrCreate)
}

// namespace is the answer to every other change of names.
func (f *file) namespace() error {
	if !f.n.IsDir() {
		return linux.ENOTDIR
	}
	return linux.Errno(fs.ErrNamespace)
}

func (f *file) Mkdir(string, p9.FileMode, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, f.namespace()
}
func (f *file) Symlink(string, string, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, f.namespace()
}
func (f *file) Link(p9.File, string) error { return f.namespace() }
func (f *file) Mknod(string, p9.FileMode, uint32, uint32, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, f.namespace()
}
func (f *file) Rename(p9.File, string) error           { return linux.Errno(fs.ErrNamespace) }
func (f *file) RenameAt(string, p9.File, string) error { return f.namespace() }
func (f *file) UnlinkAt(string, uint32) error          { return f.namespace() }
func (f *file) Readlink() (string, error)              { return "", linux.EINVAL }
func (f *file) Renamed(p9.File, string)                {}
