// Package mnt mounts a remote ipoibfs tree, served over 9P2000.L by another daemon, on a
// local directory through FUSE. It is for hosts without a kernel 9P client (`ipoibfs
// mount ADDR DIR`, or `mount -t ipoibfs ADDR DIR` through the mount.ipoibfs helper).
//
// Every FUSE operation becomes 9P requests on one connection: nodes hold only their path
// and walk it from an attached root each time (one per local user, held until the
// unmount), so no fid outlives its request or open file, and an interface deleted on
// the server is simply gone at the next lookup. Nothing is cached
// (entry and attribute timeouts 0, direct I/O), as on the local mount. Errors the
// server sends keep their errno, so scripts see the same "Invalid argument" or "No such
// device" as on the server's own mount; once the connection is lost every operation
// fails with ENOTCONN ("Transport endpoint is not connected") instead of hanging.
//
// Access: the mount is allow_other with default_permissions and keeps the server's
// owners and modes, so the local kernel applies the same rules to local users as the
// server applies to its own; and each local user acts on the server as itself: the
// connection attaches once per local uid that uses the mount (the server lets a root
// connection attach as other users, as the Linux client's access=user does), and once
// more for root without CAP_NET_ADMIN (ninep.NoNetAdminUname), which a root process's
// writes go through when it lacks the capability. The server's checks and its log
// lines then name the local user.
//
// Locking: Server.mu guards the table of attaches (an attach itself is made outside it,
// once per user); handle.mu serialises a handle's requests; the p9 client multiplexes
// requests by tag.
package mnt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
	"ipoibfs/fs/fuse"
	"ipoibfs/fs/ninep"
)

// Options configure Mount.
type Options struct {
	// Source is shown in /proc/mounts (the server address).
	Source string
	// Log receives diagnostic lines (nil discards).
	Log func(string)
	// ReadOnly mounts read-only (-o ro): the kernel refuses every write (EROFS).
	ReadOnly bool
}

// mountOpts are the FUSE mount's options.
func mountOpts(ro bool) []string {
	if ro {
		return []string{"default_permissions", "ro"}
	}
	return []string{"default_permissions"}
}

// Server is a mounted remote tree.
type Server struct {
	dir  string
	srv  *gofuse.Server
	conn io.Closer
	c    *p9.Client
	root p9.File // attached as this process
	self who     // who root is

	mu    sync.Mutex
	roots map[who]*attach // the other local users' attaches
}

// attach is one user's root fid, attached once.
type attach struct {
	once sync.Once
	f    p9.File
	err  error
}

// who is a local user as the server should see it.
type who struct {
	uid   uint32
	noCap bool // root without CAP_NET_ADMIN
}

// whoOf is the user making a FUSE request. Whether root holds CAP_NET_ADMIN is read
// (from /proc) only where it matters, for opening and writing files.
func (s *Server) whoOf(ctx context.Context, forWrite bool) who {
	c, ok := gofuse.FromContext(ctx)
	if !ok {
		return s.self
	}
	return s.whoIs(c.Uid, c.Pid, forWrite)
}

// whoIs is whoOf for the process pid of user uid.
func (s *Server) whoIs(uid, pid uint32, forWrite bool) who {
	w := who{uid: uid}
	if w.uid == 0 && forWrite {
		w.noCap = !fs.ProcNetAdmin(pid)
	}
	if w.uid == s.self.uid && !forWrite {
		w.noCap = s.self.noCap
	}
	return w
}

// rootFor returns the root fid attached as w, attaching the first time.
func (s *Server) rootFor(w who) (p9.File, error) {
	if w == s.self {
		return s.root, nil
	}
	s.mu.Lock()
	a := s.roots[w]
	if a == nil {
		a = &attach{}
		s.roots[w] = a
	}
	s.mu.Unlock()
	a.once.Do(func() { // outside mu: one user's slow attach holds up no other's
		if w.noCap {
			a.f, a.err = s.c.AttachAs("/", ninep.NoNetAdminUname(w.uid), p9.NoUID)
		} else {
			a.f, a.err = s.c.AttachAs("/", "", p9.UID(w.uid))
		}
	})
	return a.f, a.err
}

// Mount attaches to the tree served on conn and mounts it at dir. The connection is
// owned by the Server from then on.
func Mount(dir string, conn io.ReadWriteCloser, o Options) (*Server, error) {
	c, err := p9.NewClient(conn, p9.WithMessageSize(256<<10))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("9P version negotiation: %w", errnoOf(err))
	}
	// This process attaches naming its uid: a server that trusts attach names from
	// this host (-9p-trust-uname) takes an unnamed attach as nobody; one that knows
	// the connection's user treats both alike. Without CAP_NET_ADMIN it says so, as
	// rootFor does for such a writer: a trusting server would grant it to a uid 0
	// named plainly, and this attach serves the writers that are this process's
	// equal (whoIs).
	self := who{uid: uint32(os.Geteuid()), noCap: !fs.ProcNetAdmin(uint32(os.Getpid()))}
	var root p9.File
	if self.noCap {
		root, err = c.AttachAs("/", ninep.NoNetAdminUname(self.uid), p9.NoUID)
	} else {
		root, err = c.AttachAs("/", "", p9.UID(self.uid))
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("9P attach: %w", errnoOf(err))
	}
	s := &Server{dir: dir, conn: conn, c: c, root: root, self: self, roots: map[who]*attach{}}
	logf := func(string) {}
	if o.Log != nil {
		logf = o.Log
	}
	zero := time.Duration(0)
	top := &node{s: s}
	qid, _, _, err := root.GetAttr(p9.AttrMask{Mode: true})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("9P getattr of the root: %w", errnoOf(err))
	}
	src := o.Source
	if src == "" {
		src = "ipoibfs"
	}
	srv, err := gofs.Mount(dir, top, &gofs.Options{
		MountOptions: gofuse.MountOptions{
			DirectMountStrict: true,
			DisableXAttrs:     true,
			AllowOther:        true,
			Options:           mountOpts(o.ReadOnly),
			FsName:            src,
			Name:              "ipoibfs",
			Logger:            newLogger(logf),
		},
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		RootStableAttr:  &gofs.StableAttr{Ino: qid.Path},
		Logger:          newLogger(logf),
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	s.srv = srv
	return s, nil
}

// Wait blocks until the file system is unmounted (umount DIR, or Unmount).
func (s *Server) Wait() {
	s.srv.Wait()
	s.c.Close()
}

// Unmount unmounts the tree (lazily if it is busy) and closes the connection. A copy
// of the mount in another mount namespace (ipoibfs exec makes / private) would keep
// go-fuse's unmount waiting for as long as it lives: the connection is aborted then,
// as the daemon does with its own mount.
func (s *Server) Unmount() error {
	err := fuse.UnmountServer(s.dir, s.srv)
	s.c.Close()
	return err
}

// errnoOf turns what the p9 client returns into the errno a local caller sees: the
// server's own errno, or ENOTCONN when the connection is gone.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var le linux.Errno
	if errors.As(err, &le) {
		return syscall.Errno(le)
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		return se
	}
	return syscall.ENOTCONN // EOF, reset, closed connection, out of tags: the link is unusable
}

// node is one path of the remote tree; path is "" for the root.
type node struct {
	gofs.Inode
	s    *Server
	path []string
}

var (
	_ gofs.NodeLookuper  = (*node)(nil)
	_ gofs.NodeReaddirer = (*node)(nil)
	_ gofs.NodeGetattrer = (*node)(nil)
	_ gofs.NodeSetattrer = (*node)(nil)
	_ gofs.NodeOpener    = (*node)(nil)
	_ gofs.NodeOpendirer = (*node)(nil)
	_ gofs.NodeStatfser  = (*node)(nil)
	_ gofs.NodeCreater   = (*node)(nil)
	_ gofs.NodeMkdirer   = (*node)(nil)
	_ gofs.NodeUnlinker  = (*node)(nil)
	_ gofs.NodeRmdirer   = (*node)(nil)
	_ gofs.NodeRenamer   = (*node)(nil)
	_ gofs.NodeSymlinker = (*node)(nil)
	_ gofs.NodeLinker    = (*node)(nil)
	_ gofs.NodeMknoder   = (*node)(nil)
	_ gofs.FileReader    = (*handle)(nil)
	_ gofs.FileWriter    = (*handle)(nil)
	_ gofs.FileFlusher   = (*handle)(nil)
	_ gofs.FileReleaser  = (*handle)(nil)
	_ gofs.FileFsyncer   = (*handle)(nil)
)

// walk returns a new fid for the node's path plus extra names, walked as the user
// making the request (forWrite: as that user will write); the caller clunks it.
func (n *node) walk(ctx context.Context, forWrite bool, extra ...string) (p9.File, error) {
	return n.walkAs(n.s.whoOf(ctx, forWrite), extra...)
}

// walkAs is walk as w.
func (n *node) walkAs(w who, extra ...string) (p9.File, error) {
	root, err := n.s.rootFor(w)
	if err != nil {
		return nil, err
	}
	names := append(append([]string(nil), n.path...), extra...)
	_, f, err := root.Walk(names)
	return f, err
}

func fill(a p9.Attr, qid p9.QID, out *gofuse.Attr) {
	out.Ino = qid.Path
	out.Mode = uint32(a.Mode)
	out.Size = a.Size
	out.Nlink = uint32(a.NLink)
	out.Blksize = 4096
	out.Owner = gofuse.Owner{Uid: uint32(a.UID), Gid: uint32(a.GID)}
	out.Atime, out.Atimensec = a.ATimeSeconds, uint32(a.ATimeNanoSeconds)
	out.Mtime, out.Mtimensec = a.MTimeSeconds, uint32(a.MTimeNanoSeconds)
	out.Ctime, out.Ctimensec = a.CTimeSeconds, uint32(a.CTimeNanoSeconds)
}

var attrMask = p9.AttrMask{Mode: true, UID: true, GID: true, NLink: true, Size: true, ATime: true, MTime: true, CTime: true}

func (n *node) getattr(ctx context.Context, extra ...string) (p9.QID, p9.Attr, syscall.Errno) {
	f, err := n.walk(ctx, false, extra...)
	if err != nil {
		return p9.QID{}, p9.Attr{}, errnoOf(err)
	}
	defer f.Close()
	qid, _, a, err := f.GetAttr(attrMask)
	return qid, a, errnoOf(err)
}

func kind(m p9.FileMode) uint32 {
	if m.IsDir() {
		return syscall.S_IFDIR
	}
	return syscall.S_IFREG
}

func (n *node) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	qid, a, e := n.getattr(ctx, name)
	if e != 0 {
		return nil, e
	}
	fill(a, qid, &out.Attr)
	child := &node{s: n.s, path: append(append([]string(nil), n.path...), name)}
	return n.NewInode(ctx, child, gofs.StableAttr{Mode: kind(a.Mode), Ino: qid.Path}), 0
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	qid, a, e := n.getattr(ctx)
	if e != 0 {
		return e
	}
	fill(a, qid, &out.Attr)
	return 0
}

// Setattr asks the server (Tsetattr), which decides as the local mount does: truncation
// and times set to now are accepted where the user may write and change nothing;
// modes, owners and given times are fixed (EPERM). Through an open file (ftruncate)
// it goes on that file's fid.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	v := in.Valid
	m := p9.SetAttrMask{
		Permissions:        v&gofuse.FATTR_MODE != 0,
		UID:                v&gofuse.FATTR_UID != 0,
		GID:                v&gofuse.FATTR_GID != 0,
		Size:               v&gofuse.FATTR_SIZE != 0,
		ATime:              v&(gofuse.FATTR_ATIME|gofuse.FATTR_ATIME_NOW) != 0,
		ATimeNotSystemTime: v&gofuse.FATTR_ATIME != 0 && v&gofuse.FATTR_ATIME_NOW == 0,
		MTime:              v&(gofuse.FATTR_MTIME|gofuse.FATTR_MTIME_NOW) != 0,
		MTimeNotSystemTime: v&gofuse.FATTR_MTIME != 0 && v&gofuse.FATTR_MTIME_NOW == 0,
		CTime:              v&gofuse.FATTR_CTIME != 0,
	}
	a := p9.SetAttr{Permissions: p9.FileMode(in.Mode), UID: p9.UID(in.Uid), GID: p9.GID(in.Gid), Size: in.Size,
		ATimeSeconds: in.Atime, ATimeNanoSeconds: uint64(in.Atimensec), MTimeSeconds: in.Mtime, MTimeNanoSeconds: uint64(in.Mtimensec)}
	if h, ok := f.(*handle); ok {
		h.mu.Lock()
		err := h.f.SetAttr(m, a)
		h.mu.Unlock()
		if err != nil {
			return errnoOf(err)
		}
	} else {
		pf, err := n.walk(ctx, false)
		if err != nil {
			return errnoOf(err)
		}
		err = pf.SetAttr(m, a)
		pf.Close()
		if err != nil {
			return errnoOf(err)
		}
	}
	return n.Getattr(ctx, f, out)
}

func (n *node) Statfs(ctx context.Context, out *gofuse.StatfsOut) syscall.Errno {
	out.Bsize = 4096
	out.NameLen = 255
	return 0
}

func (n *node) Opendir(ctx context.Context) syscall.Errno { return 0 }

func (n *node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f, err := n.walk(ctx, false)
	if err != nil {
		return nil, errnoOf(err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return nil, errnoOf(err)
	}
	var es []gofuse.DirEntry
	var off uint64
	for {
		ds, err := f.Readdir(off, 64<<10)
		if err != nil {
			return nil, errnoOf(err)
		}
		if len(ds) == 0 {
			return gofs.NewListDirStream(es), 0
		}
		for _, d := range ds {
			off = d.Offset
			if d.Name == "." || d.Name == ".." {
				continue
			}
			m := uint32(syscall.S_IFREG)
			if d.Type == p9.TypeDir {
				m = syscall.S_IFDIR
			}
			es = append(es, gofuse.DirEntry{Name: d.Name, Ino: d.QID.Path, Mode: m})
		}
	}
}

// The tree's names are fixed: the server refuses with the errnos sysfs gives, and so
// does this mount without asking it (EACCES for create, EPERM for the rest).

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EACCES
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Symlink(ctx context.Context, target, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	var mode p9.OpenFlags
	switch flags & syscall.O_ACCMODE {
	case syscall.O_WRONLY:
		mode = p9.WriteOnly
	case syscall.O_RDWR:
		mode = p9.ReadWrite
	default:
		mode = p9.ReadOnly
	}
	w := n.s.whoOf(ctx, mode != p9.ReadOnly)
	f, err := n.walkAs(w)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	if _, _, err := f.Open(mode); err != nil {
		f.Close()
		return nil, 0, errnoOf(err)
	}
	return &handle{n: n, f: f, who: w, mode: mode}, gofuse.FOPEN_DIRECT_IO, 0
}

// handle is one open remote fid. Each close(2) after a write sends Tfsync, on which the
// server applies what a commit file (sm/partitions) accumulated and answers its
// verdict, as close(2) does on the local mount; the fid stays open for the other
// holders of the descriptor (a shell's subshell closing its copy) until the release.
type handle struct {
	n       *node
	mu      sync.Mutex
	f       p9.File
	who     who // who opened it
	mode    p9.OpenFlags
	alt     p9.File // the same file opened as altWho, for writers who differ in CAP_NET_ADMIN
	altWho  who
	wrote   bool
	clunked bool
}

// fileFor returns the fid a write by the request's process goes through: the handle's
// own, or, when root opened it and the writer (a process it was handed to, or one
// that dropped or kept the capability) differs from the opener in CAP_NET_ADMIN, one
// opened as root with the writer's, so the server decides the write as the kernel
// would (the capability is the writer's; the modes were checked at open). (A write by
// another user through root's descriptor still reaches the server as root's: a fid
// of that user could not be opened for writing.) Called with mu held.
func (h *handle) fileFor(ctx context.Context) (p9.File, error) {
	c, ok := gofuse.FromContext(ctx)
	if h.who.uid != 0 || !ok {
		return h.f, nil
	}
	w := h.n.s.whoIs(0, c.Pid, true)
	if w == h.who {
		return h.f, nil
	}
	if h.alt == nil || h.altWho != w {
		h.closeAlt()
		f, err := h.n.walkAs(w)
		if err != nil {
			return nil, err
		}
		if _, _, err := f.Open(h.mode); err != nil {
			f.Close()
			return nil, err
		}
		h.alt, h.altWho = f, w
	}
	return h.alt, nil
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.clunked {
		return nil, syscall.EBADF
	}
	k, err := h.f.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, errnoOf(err)
	}
	return gofuse.ReadResultData(dest[:k]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.clunked {
		return 0, syscall.EBADF
	}
	f, err := h.fileFor(ctx)
	if err != nil {
		return 0, errnoOf(err)
	}
	k, err := f.WriteAt(data, off)
	if err != nil {
		return 0, errnoOf(err)
	}
	h.wrote = true
	return uint32(k), 0
}

func (h *handle) Flush(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.wrote || h.clunked {
		return 0
	}
	h.wrote = false
	var altErr error
	if h.alt != nil {
		altErr = h.alt.FSync()
	}
	if err := h.f.FSync(); err != nil {
		return errnoOf(err)
	}
	return errnoOf(altErr)
}

func (h *handle) closeAlt() {
	if h.alt != nil {
		h.alt.Close()
		h.alt = nil
	}
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.clunked {
		h.clunked = true
		h.closeAlt()
		h.f.Close()
	}
	return 0
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

// newLogger turns go-fuse's log output into calls of a line function.
func newLogger(f func(string)) *log.Logger {
	return log.New(lineWriter(f), "", 0)
}

type lineWriter func(string)

func (w lineWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w("fuse: " + l)
	}
	return len(p), nil
}
