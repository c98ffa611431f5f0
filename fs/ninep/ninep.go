// Package ninep serves the ipoibfs control tree (package ipoibfs/fs) over 9P2000.L with
// hugelgupf/p9. It is a thin adapter: walks, listings, reads and writes go to the fs node
// model, which owns formats, parsing, errnos and access decisions, so a file gives the
// same bytes and errno here as over FUSE, for the same user.
//
// Who a request comes from is established per connection, never from what the client
// claims (see identify): a unix socket's peer credentials (SO_PEERCRED); for TCP from
// this host the owner of the client's socket as the kernel reports it (sock_diag); a
// remote peer (only on networks in Options.AllowCIDRs) acts as nobody, or, with
// Options.TrustUname, as the user its Tattach names. A connection whose own user is root
// may attach as other users (the Linux client's access=user), one Tattach each; other
// connections only as themselves. The patched p9 copy in third_party/p9 passes Tattach's
// uname and n_uname to the attacher (see its PATCH.md).
//
// Per fid: Walk(nil) returns a fresh clone carrying its attach's user, Open keeps an
// fs.Handle (iounit 0, so clients use msize-sized I/O), Close (the clunk) releases it.
// SetAttr is a no-op (the Linux client truncates through Tsetattr size 0). Readdir
// offsets are entry indexes. Errors are syscall.Errno values, which p9 turns into
// Rlerror.
//
// Bounds, so that a hostile client cannot grow the daemon: at most Options.MaxConns
// connections (more are closed and logged), Options.MaxFids live fids per connection
// (ENFILE beyond), Options.MaxOutstanding requests in flight per connection (further
// requests wait unread), and a connection must attach within Options.AttachTimeout.
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// Defaults of the per-connection bounds.
const (
	DefaultMaxConns      = 256
	DefaultMaxFids       = 4096
	DefaultAttachTimeout = 30 * time.Second
)

// Options configure Serve.
type Options struct {
	// AllowCIDRs lists the networks clients may connect from. Empty allows every peer.
	// Connections from elsewhere are closed at once and logged. Peers without an IP
	// address (unix sockets) are always allowed.
	AllowCIDRs []netip.Prefix
	// TrustUname believes the user named in Tattach (uname / n_uname) for connections
	// from other hosts, as NFS sec=sys does; without it they are read-only as nobody.
	// Local connections are never identified by what they claim.
	TrustUname bool
	// TauthCompat answers Tauth with Rlerror ENOENT ("no authentication required"), as
	// diod does when auth is off, instead of p9's ENOSYS, so diod's tools (diodcat,
	// diodls, mount.diod) can attach.
	TauthCompat bool
	// MaxConns, MaxFids, MaxOutstanding (requests in flight per connection) and
	// AttachTimeout bound what clients may hold (0: defaults).
	MaxConns       int
	MaxFids        int
	MaxOutstanding int
	AttachTimeout  time.Duration
	// Unidentified is who a connection acts as when its peer has no credentials to
	// read (net.Pipe in tests); nil means nobody.
	Unidentified *fs.Caller
	// Log receives one line per refused connection or attach (nil discards).
	Log func(string)
}

func (o *Options) defaults() {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxFids <= 0 {
		o.MaxFids = DefaultMaxFids
	}
	if o.MaxOutstanding <= 0 {
		o.MaxOutstanding = DefaultMaxOutstanding
	}
	if o.AttachTimeout <= 0 {
		o.AttachTimeout = DefaultAttachTimeout
	}
}

func (o *Options) logf(format string, a ...any) {
	if o.Log != nil {
		o.Log(fmt.Sprintf(format, a...))
	}
}

// attacher serves the attaches of one connection.
type attacher struct {
	root     *fs.Node
	id       connIdentity
	o        *Options
	fids     *atomic.Int64
	attached chan struct{}
	once     sync.Once
	gone     <-chan struct{} // the client is gone (nil: never known)
	// lockWaits counts the connection's Tlocks waiting for a lock (lock.go).
	lockWaits atomic.Int32
}

var _ p9.UserAttacher = (*attacher)(nil)

func (a *attacher) Attach() (p9.File, error) { return a.AttachUser("", p9.NoUID) }

func (a *attacher) AttachUser(uname string, uid p9.UID) (p9.File, error) {
	who, err := a.id.attachAs(uname, uid)
	if err != nil {
		a.o.logf("9p: refused attach as %q (uid %d) from %s: a connection of uid %d may attach only as itself",
			uname, uid, a.id.who.Peer, a.id.who.UID)
		return nil, err
	}
	a.once.Do(func() { close(a.attached) })
	return newFile(a, a.root, who)
}

// Serve serves the tree on ln until ctx is cancelled, then closes ln and every
// connection and returns nil. Other errors from ln are returned.
func Serve(ctx context.Context, ln net.Listener, root *fs.Node, o Options) error {
	o.defaults()
	diag := newSockDiag()
	defer diag.close()
	fl := &listener{Listener: ln, o: &o, conns: map[net.Conn]struct{}{}}
	stop := context.AfterFunc(ctx, fl.closeAll)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := fl.accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Identified on the connection's own goroutine: the lookup dumps the
			// host's TCP sockets, and must not hold up the accepts of others.
			id := identify(c.raw, diag, o.TrustUname, o.Unidentified)
			serveConn(c, root, id, &o)
		}()
	}
}

// ServeConn serves one already-accepted connection (net.Pipe in tests, an inherited
// socket) until it closes. Options.AllowCIDRs and MaxConns are not consulted.
func ServeConn(c net.Conn, root *fs.Node, o Options) error {
	o.defaults()
	diag := newSockDiag()
	defer diag.close()
	id := identify(c, diag, o.TrustUname, o.Unidentified)
	return serveConn(newShim(c, o.TauthCompat, o.MaxOutstanding), root, id, &o)
}

func serveConn(c net.Conn, root *fs.Node, id connIdentity, o *Options) error {
	a := &attacher{root: root, id: id, o: o, fids: new(atomic.Int64), attached: make(chan struct{})}
	if d, ok := c.(interface{ Done() <-chan struct{} }); ok {
		a.gone = d.Done()
	}
	// A connection that never attaches holds a goroutine and buffers for nothing.
	t := time.AfterFunc(o.AttachTimeout, func() {
		select {
		case <-a.attached:
		default:
			o.logf("9p: closing connection from %s: no attach within %v", id.who.Peer, o.AttachTimeout)
			c.Close()
		}
	})
	defer t.Stop()
	defer c.Close()
	defer locks.dropConn(a) // a connection's locks end with it
	return p9.NewServer(a).Handle(c, c)
}

// listener filters peers and tracks connections.
type listener struct {
	net.Listener
	o *Options

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

// accept returns the next allowed connection within the connection bound, wrapped for
// tracking (and the Tauth shim); raw is the socket itself, for identification.
func (l *listener) accept() (*trackedConn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ip, ok := l.allowed(c.RemoteAddr()); !ok {
			l.o.logf("9p: refused connection from %s: not in the allowed networks %v", ip, l.o.AllowCIDRs)
			c.Close()
			continue
		}
		raw := c
		c = newShim(c, l.o.TauthCompat, l.o.MaxOutstanding)
		tc := &trackedConn{Conn: c, raw: raw, l: l}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return nil, net.ErrClosed
		}
		if len(l.conns) >= l.o.MaxConns {
			l.mu.Unlock()
			l.o.logf("9p: refused connection from %s: %d connections already", raw.RemoteAddr(), l.o.MaxConns)
			c.Close()
			continue
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
	raw  net.Conn
	l    *listener
	once sync.Once
}

// Done is the shim's: closed when the connection ends, so that a read waiting on a
// stream (events, capture) ends with it (serveConn looks for it; without it a waiting
// reader held shutdown and its connection until the next event).
func (c *trackedConn) Done() <-chan struct{} {
	if d, ok := c.Conn.(interface{ Done() <-chan struct{} }); ok {
		return d.Done()
	}
	return nil
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

// file is one fid: the node it names, who acts through it and, once opened, its
// handle.
type file struct {
	a     *attacher
	who   fs.Caller
	dirMu sync.Mutex
	dir   []*fs.Node // the listing in progress (per fid)
	n     *fs.Node
	mu    sync.Mutex
	h     *fs.Handle
	gone  atomic.Bool // clunked: the fid no longer counts
	// locked: a Tlock came through the fid, whose clunk releases what it took
	locked atomic.Bool
}

// newFile makes a fid for n, within the connection's bound on live fids.
func newFile(a *attacher, n *fs.Node, who fs.Caller) (*file, error) {
	if a.fids.Add(1) > int64(a.o.MaxFids) {
		a.fids.Add(-1)
		return nil, linux.ENFILE
	}
	return &file{a: a, who: who, n: n}, nil
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

// Walk needs search permission on every directory it passes, as path lookup does.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	n := f.n
	qids := make([]p9.QID, 0, len(names))
	for _, name := range names {
		if n.IsDir() {
			if err := n.Access(f.who, fs.MayExec); err != nil {
				return nil, nil, toErr(err)
			}
		}
		c, err := n.Lookup(name)
		if err != nil {
			return nil, nil, toErr(err)
		}
		n = c
		qids = append(qids, qidOf(n))
	}
	nf, err := newFile(f.a, n, f.who)
	if err != nil {
		return nil, nil, err
	}
	return qids, nf, nil
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

// SetAttr lets the tree decide (fs.Node.SetAttr): the size-0 truncate of `echo x >
// file` and times set to now are accepted where the fid's user may write, and change
// nothing; modes, owners and given times are fixed (EPERM).
func (f *file) SetAttr(m p9.SetAttrMask, _ p9.SetAttr) error {
	h, _ := f.handle() // nil when the fid is not open
	return toErr(f.n.SetAttr(f.who, fs.AttrChange{
		Mode:     m.Permissions,
		Owner:    m.UID || m.GID,
		Times:    m.ATime && m.ATimeNotSystemTime || m.MTime && m.MTimeNotSystemTime,
		TimesNow: m.ATime && !m.ATimeNotSystemTime || m.MTime && !m.MTimeNotSystemTime || m.CTime,
		Size:     m.Size,
		Handle:   h,
	}))
}

// Close releases the open handle. For sm/partitions this applies the written
// configuration; its error reaches clients that read Rclunk errors (the Go client does,
// the Linux v9fs client does not).
func (f *file) Close() error {
	if !f.gone.Swap(true) {
		f.a.fids.Add(-1)
	}
	if f.locked.Load() {
		locks.dropFid(f.lockKey(), f)
	}
	f.mu.Lock()
	h := f.h
	f.h = nil
	f.mu.Unlock()
	if h == nil {
		return nil
	}
	return toErr(h.Release())
}

// Quick tells the p9 server that a read of this fid and its clunk are answered at
// once (p9.QuickFile): a directory's clunk, or a quick file (fs.Node.Quick) not
// opened for writing, whose clunk would apply what was written.
func (f *file) Quick() bool {
	f.mu.Lock()
	h := f.h
	f.mu.Unlock()
	if h != nil && h.Writable() {
		return false
	}
	return f.n.IsDir() || f.n.Quick()
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
	if uint32(mode)&syscall.O_TRUNC != 0 { // Tlopen carries Linux's open flags
		flags |= syscall.O_TRUNC // asks for write permission (fs.Node.Open)
	}
	h, err := f.n.Open(f.who, flags)
	if err != nil {
		return p9.QID{}, 0, toErr(err)
	}
	f.mu.Lock()
	if f.h != nil {
		// Two Tlopens of one fid at once (the library checks "not yet opened" under
		// a shared lock): the second would drop the first's handle unreleased (an
		// events or capture subscription kept until exit).
		f.mu.Unlock()
		_ = h.Release()
		return p9.QID{}, 0, linux.EINVAL
	}
	f.h = h
	f.mu.Unlock()
	return qidOf(f.n), 0, nil
}

// RefuseDirWrite refuses an open of a directory for writing through the tree, which
// logs it as it logs every refused change.
func (f *file) RefuseDirWrite(mode p9.OpenFlags) error {
	if _, _, err := f.Open(mode); err != nil {
		return err
	}
	return linux.EISDIR // not reached: the tree opens no directory for writing
}

var _ p9.DirWriteRefuser = (*file)(nil)

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

// ReadAtFlush is ReadAt for a stream (events, capture): it waits for data until the
// client flushes the read, as FUSE's interrupt ends one (third_party/p9's patch).
func (f *file) ReadAtFlush(p []byte, off int64, flushed <-chan struct{}) (int, error) {
	if !f.n.IsStream() {
		return f.ReadAt(p, off)
	}
	h, err := f.handle()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-flushed:
			cancel()
		case <-f.a.gone: // a dead connection flushes nothing: end the read with it
			cancel()
		case <-ctx.Done():
		}
	}()
	k, err := h.ReadContext(ctx, p, off)
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
	k, err := h.WriteAs(f.writer(), p)
	return k, toErr(err)
}

// writer is who a write through f acts as: f's user, whose CAP_NET_ADMIN, for a file
// that needs it, is asked again at the write, as the kernel asks capable() of the
// writing task (a process the client forked or handed its socket to since it
// attached may write through it, and must have it too).
func (f *file) writer() fs.Caller {
	c := f.who
	if c.NetAdmin && f.n.NeedsNetAdmin() && f.a.id.holders != nil {
		if ok, why := f.a.id.holders.netAdmin(); !ok {
			c.NetAdmin, c.NoNetAdmin = false, why
		}
	}
	return c
}

// FSync applies what was written to a commit file (sm/partitions) so far, as a close
// on the local mount does (fs.Handle.Flush), and returns its verdict; the fid stays
// open. 'ipoibfs mount' sends it for each close(2) after a write.
func (f *file) FSync() error {
	h, err := f.handle()
	if err != nil {
		return nil // not open: nothing written to apply
	}
	return toErr(h.Flush())
}

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

// CheckXattrCreate refuses a Txattrcreate before its value is sent: the tree has no
// extended attributes (as SetXattr).
func (f *file) CheckXattrCreate(string, uint64, p9.XattrFlags) error { return linux.EOPNOTSUPP }

// XattrFID makes the file of a fid Txattrwalk makes from this one: within the
// connection's bound on live fids like any other, sharing the node without owning
// this fid's open handle.
func (f *file) XattrFID() (p9.File, error)      { return newFile(f.a, f.n, f.who) }
func (f *file) GetXattr(string) ([]byte, error) { return nil, linux.EOPNOTSUPP } // as the FUSE mount: the tree has no extended attributes
func (f *file) ListXattrs() ([]string, error)   { return nil, nil }
func (f *file) RemoveXattr(string) error        { return linux.EOPNOTSUPP }

// The tree's names are fixed: every change of names is refused and logged
// (fs.Node.ChangeNames).

func (f *file) Create(name string, _ p9.OpenFlags, _ p9.FileMode, _ p9.UID, _ p9.GID) (p9.File, p9.QID, uint32, error) {
	return nil, p9.QID{}, 0, f.names(fs.OpCreate, name)
}

func (f *file) names(op fs.NameOp, name string) error { return toErr(f.n.ChangeNames(f.who, op, name)) }

func (f *file) Mkdir(name string, _ p9.FileMode, _ p9.UID, _ p9.GID) (p9.QID, error) {
	return p9.QID{}, f.names(fs.OpMkdir, name)
}
func (f *file) Symlink(_, name string, _ p9.UID, _ p9.GID) (p9.QID, error) {
	return p9.QID{}, f.names(fs.OpSymlink, name)
}
func (f *file) Link(_ p9.File, name string) error { return f.names(fs.OpLink, name) }
func (f *file) Mknod(name string, mode p9.FileMode, _, _ uint32, _ p9.UID, _ p9.GID) (p9.QID, error) {
	return p9.QID{}, toErr(f.n.Mknod(f.who, name, uint32(mode)))
}

// Rename is not reached: the p9 server turns Trename into the parent's RenameAt.
func (f *file) Rename(p9.File, string) error { return linux.Errno(fs.NamespaceErrno(f.who)) }

func (f *file) RenameAt(oldName string, newDir p9.File, newName string) error {
	nd, ok := newDir.(*file)
	if !ok {
		return linux.EXDEV
	}
	return toErr(f.n.Rename(f.who, oldName, nd.n, newName, 0))
}
func (f *file) UnlinkAt(name string, flags uint32) error {
	if flags&0x200 != 0 { // AT_REMOVEDIR
		return f.names(fs.OpRmdir, name)
	}
	return f.names(fs.OpUnlink, name)
}
func (f *file) Readlink() (string, error) { return "", linux.EINVAL }
func (f *file) Renamed(p9.File, string)   {}
