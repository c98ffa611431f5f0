// Package fuse mounts the ipoibfs control tree (package ipoibfs/fs) with the kernel's
// FUSE client, through go-fuse v2. It is a thin adapter: every lookup, listing, read and
// write goes to the fs node model, which owns formats, parsing and errnos.
//
// Mount choices: mount(2) directly (DirectMountStrict: the daemon runs as root, and a
// failed mount reports its own error rather than a fusermount fallback's); xattrs off;
// every attribute file opened with FOPEN_DIRECT_IO so each read reaches the model (no
// content is ever cached); names and attributes cached as the kernel caches sysfs
// dentries, so a path walk costs no request: fixed names and all attributes for an hour,
// the interfaces' names (fs.DynamicDirs) too when Options.Changes says which ones to
// drop, and not at all without it. A dropped name is gone from the kernel's cache before
// the write that removed or renamed it returns (delete_child, link del), and within a
// scheduling delay when the change came from elsewhere (ip link del); Setattr refuses
// modes, owners and given times (EPERM) and takes truncates and touches as no-ops (the
// truncate of `echo x > file` included); allow_other plus default_permissions, so other
// users can read 0444 files and the kernel enforces the 0200/0644 modes (files are
// owned by root) with all that generic_permission counts; the tree then applies
// kernfs's own rules to the caller the kernel names (fs.Node.Access).
//
// Pitfall for the serving process: never start a child with its working directory (or
// program) inside the mount, e.g. exec.Cmd.Dir = mountpoint. Go forks with vfork; the
// child's chdir waits for this server while the parent thread is stopped in vfork, and a
// garbage collection waiting for that thread stops the server: the process deadlocks.
// Let the child cd itself (bash -c 'cd DIR && ...').
//
// Locking: none here; the fs handles lock themselves.
package fuse

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"ipoibfs/fs"
)

// Options configure a mount.
type Options struct {
	// FsName is the source shown in /proc/mounts (default "ipoibfs").
	FsName string
	// Debug logs every FUSE request and reply through Log.
	Debug bool
	// Log receives diagnostic lines (nil discards).
	Log func(string)
	// Changes names the interfaces that were added, removed or renamed (fs.Tree.Changes).
	// With it the kernel may cache the names of fs.DynamicDirs, and the server drops
	// them from its cache as they change; without it those names are looked up every
	// time.
	Changes <-chan string
}

// Server is a mounted tree.
type Server struct {
	dir  string
	srv  *gofuse.Server
	inv  *invalidator // nil without Options.Changes
	stop chan struct{}
}

// Mount mounts the tree whose root is root at dir and serves it until Unmount. dir must
// exist; a stale mount left there by a crashed daemon should be removed first with
// CleanupStale.
func Mount(dir string, root *fs.Node, o Options) (*Server, error) {
	if o.FsName == "" {
		o.FsName = "ipoibfs"
	}
	zero := time.Duration(0) // the default, for names in fs.DynamicDirs; see fixedTTL
	var inv *invalidator
	if o.Changes != nil {
		inv = &invalidator{changes: o.Changes, flush: make(chan chan struct{}), stop: make(chan struct{})}
	}
	opts := &gofs.Options{
		MountOptions: gofuse.MountOptions{
			DirectMountStrict: true,
			DisableXAttrs:     true,
			AllowOther:        true,
			Options:           []string{"default_permissions"},
			FsName:            o.FsName,
			Name:              "ipoibfs",
			Debug:             o.Debug,
			Logger:            newLogger(o.Log),
		},
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		RootStableAttr:  &gofs.StableAttr{Ino: root.Ino()},
		Logger:          newLogger(o.Log),
	}
	rootNode := &node{m: root, inv: inv}
	srv, err := gofs.Mount(dir, rootNode, opts)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	if inv != nil {
		inv.root = rootNode.EmbeddedInode()
		inv.done = make(chan struct{})
		go inv.run()
	}
	return &Server{dir: dir, srv: srv, inv: inv}, nil
}

// Dir returns the mount point.
func (s *Server) Dir() string { return s.dir }

// Wait blocks until the file system is unmounted.
func (s *Server) Wait() { s.srv.Wait() }

// Unmount unmounts the tree. If it is busy (open files, a shell inside it) it is
// detached lazily (MNT_DETACH): it disappears from the namespace now.
//
// Either way the FUSE connection can outlive the unmount: a process started with
// `ip netns exec` while the tree was mounted runs in a mount namespace holding its own
// copy of the mount when / has private propagation, and keeps the connection open for
// as long as it lives. Unmount then aborts the connection through fusectl (the
// kernel's fuse connection control file system), so the daemon never hangs on exit
// waiting for requests that cannot come.
func (s *Server) Unmount() error {
	if s.inv != nil {
		s.inv.close()
	}
	return UnmountServer(s.dir, s.srv)
}

// UnmountServer unmounts go-fuse server srv's file system at dir as Server.Unmount
// does (lazily when busy; the connection aborted when a copy of the mount elsewhere
// keeps it open), for other go-fuse servers (the 9P client's mount, mnt).
func UnmountServer(dir string, srv *gofuse.Server) error {
	var dev uint64
	var st syscall.Stat_t
	if syscall.Stat(dir, &st) == nil {
		dev = st.Dev
	}
	done := make(chan error, 1)
	go func() { done <- srv.Unmount() }()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		// Busy: detach lazily; open files keep being served until closed (or until
		// the process exits and the kernel drops the connection).
		derr := syscall.Unmount(dir, syscall.MNT_DETACH)
		if derr != nil {
			return fmt.Errorf("unmount %s: %v; lazy unmount: %w", dir, err, derr)
		}
		return nil
	case <-time.After(2 * time.Second):
		if err := abortConn(dev); err != nil {
			return fmt.Errorf("unmount %s: the connection stays open elsewhere and could not be aborted: %w", dir, err)
		}
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		return nil
	}
}

// abortConn writes to /sys/fs/fuse/connections/<dev>/abort, mounting fusectl there
// first when needed. dev is the mount's st_dev.
func abortConn(dev uint64) error {
	if dev == 0 {
		return errors.New("unknown FUSE device")
	}
	const ctl = "/sys/fs/fuse/connections"
	// fusectl names a connection by the kernel's dev_t (major << 20 | minor).
	major, minor := (dev>>8)&0xfff|(dev>>32)&^0xfff, dev&0xff|(dev>>12)&^0xff
	abort := fmt.Sprintf("%s/%d/abort", ctl, major<<20|minor)
	if _, err := os.Stat(abort); err != nil {
		if err := syscall.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("mount fusectl: %w", err)
		}
	}
	return os.WriteFile(abort, []byte("1"), 0)
}

// Dead reports whether dir is a FUSE mount whose server is gone.
func Dead(dir string) bool {
	var st syscall.Statfs_t
	return errors.Is(syscall.Statfs(dir, &st), syscall.ENOTCONN)
}

// CleanupStale lazily unmounts a dead FUSE mount at dir: one whose daemon died, which
// answers every request with ENOTCONN ("Transport endpoint is not connected"). It
// reports whether it unmounted something; a healthy mount or a plain directory is left
// alone. Dead asks with statfs, which FUSE always sends to the server (a stat may be
// answered from the kernel's attribute cache, also for a dead mount).
func CleanupStale(dir string) (bool, error) {
	if !Dead(dir) {
		return false, nil
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		return false, fmt.Errorf("unmount stale FUSE mount %s: %w", dir, err)
	}
	return true, nil
}

// node adapts one fs.Node.
type node struct {
	gofs.Inode
	m   *fs.Node
	inv *invalidator // shared by all nodes of the mount; nil: names in DynamicDirs uncached
}

var (
	_ gofs.NodeLookuper    = (*node)(nil)
	_ gofs.NodeReaddirer   = (*node)(nil)
	_ gofs.NodeGetattrer   = (*node)(nil)
	_ gofs.NodeSetattrer   = (*node)(nil)
	_ gofs.NodeOpener      = (*node)(nil)
	_ gofs.NodeOpendirer   = (*node)(nil)
	_ gofs.NodeStatfser    = (*node)(nil)
	_ gofs.FileReader      = (*handle)(nil)
	_ gofs.FileWriter      = (*handle)(nil)
	_ gofs.FileFlusher     = (*handle)(nil)
	_ gofs.FileReleaser    = (*handle)(nil)
	_ gofs.FileFsyncer     = (*handle)(nil)
	_ gofs.FileGetattrer   = (*handle)(nil)
	_ gofs.FileSetattrer   = (*handle)(nil)
	_ gofs.NodeOnForgetter = (*node)(nil)
	_ gofs.NodeCreater     = (*node)(nil)
	_ gofs.NodeMkdirer     = (*node)(nil)
	_ gofs.NodeMknoder     = (*node)(nil)
	_ gofs.NodeLinker      = (*node)(nil)
	_ gofs.NodeSymlinker   = (*node)(nil)
	_ gofs.NodeUnlinker    = (*node)(nil)
	_ gofs.NodeRmdirer     = (*node)(nil)
	_ gofs.NodeRenamer     = (*node)(nil)
)

// caller is the process the kernel says made the request. The kernel has already
// applied the modes (default_permissions), capabilities included, so the tree applies
// only kernfs's rules (fs.Caller.ModesChecked: a user with CAP_DAC_OVERRIDE writes as
// on sysfs), and names the caller in its log lines.
// Whether it holds CAP_NET_ADMIN is read from /proc only when netAdmin says the request
// needs to know (a write of a file that requires it, checked for the process making
// each write).
func caller(ctx context.Context, netAdmin bool) fs.Caller {
	c, ok := gofuse.FromContext(ctx)
	if !ok {
		return fs.Caller{UID: fs.Nobody, GIDs: []uint32{fs.Nobody}, Via: "fuse"}
	}
	return fs.Caller{UID: c.Uid, GIDs: []uint32{c.Gid}, Via: "fuse", PID: c.Pid,
		NetAdmin: netAdmin && fs.ProcNetAdmin(c.Pid), ModesChecked: true}
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return fs.Errno(err)
}

func kind(m *fs.Node) uint32 {
	if m.IsDir() {
		return syscall.S_IFDIR
	}
	return syscall.S_IFREG
}

func fill(m *fs.Node, a *gofuse.Attr) {
	a.Ino = m.Ino()
	a.Mode = kind(m) | m.Perm()
	a.Size = m.Size()
	a.Nlink = 1
	if m.IsDir() {
		a.Nlink = 2
	}
	a.Blksize = 4096
	a.Owner = gofuse.Owner{Uid: 0, Gid: 0}
	t := m.ModTime()
	a.SetTimes(&t, &t, &t)
}

// fixedTTL is how long the kernel keeps a fixed name and any node's attributes: they
// do not change while the daemon runs (fs.DynamicDirs' names are looked up every time).
const fixedTTL = time.Hour

func (n *node) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var gen uint64
	if n.inv != nil {
		gen = n.inv.gen.Load()
	}
	c, err := n.m.Lookup(name)
	if err != nil {
		return nil, errno(err)
	}
	fill(c, &out.Attr)
	out.SetAttrTimeout(fixedTTL)
	switch {
	case !c.InDynamicDir():
		out.SetEntryTimeout(fixedTTL)
	case n.inv != nil && n.inv.gen.Load() == gen:
		// Cached until a change names it; a name that changed while it was looked
		// up is not cached at all: the invalidation may have come before go-fuse
		// knew the name (for "", all names, it invalidates only the known ones).
		out.SetEntryTimeout(fixedTTL)
	}
	return n.NewInode(ctx, &node{m: c, inv: n.inv}, gofs.StableAttr{Mode: kind(c), Ino: c.Ino()}), 0
}

func (n *node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	cs, err := n.m.Children()
	if err != nil {
		return nil, errno(err)
	}
	es := make([]gofuse.DirEntry, len(cs))
	for k, c := range cs {
		es[k] = gofuse.DirEntry{Name: c.Name(), Ino: c.Ino(), Mode: kind(c)}
	}
	return gofs.NewListDirStream(es), 0
}

func (n *node) Opendir(ctx context.Context) syscall.Errno { return 0 }

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	fill(n.m, &out.Attr)
	out.SetTimeout(fixedTTL)
	return 0
}

// Setattr lets the tree decide (fs.Node.SetAttr): truncation (O_TRUNC arrives as a
// size-0 SETATTR) and times set to now are accepted where the caller may write, and
// change nothing; modes, owners and given times are fixed (EPERM).
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	v := in.Valid
	a := fs.AttrChange{
		Mode:     v&gofuse.FATTR_MODE != 0,
		Owner:    v&(gofuse.FATTR_UID|gofuse.FATTR_GID) != 0,
		Times:    v&gofuse.FATTR_ATIME != 0 && v&gofuse.FATTR_ATIME_NOW == 0 || v&gofuse.FATTR_MTIME != 0 && v&gofuse.FATTR_MTIME_NOW == 0,
		TimesNow: v&(gofuse.FATTR_ATIME_NOW|gofuse.FATTR_MTIME_NOW|gofuse.FATTR_CTIME) != 0,
		Size:     v&gofuse.FATTR_SIZE != 0,
	}
	if h, ok := f.(*handle); ok {
		a.Handle = h.h
	}
	if err := n.m.SetAttr(caller(ctx, false), a); err != nil {
		return errno(err)
	}
	fill(n.m, &out.Attr)
	return 0
}

func (n *node) Statfs(ctx context.Context, out *gofuse.StatfsOut) syscall.Errno {
	out.Bsize = 4096
	out.NameLen = 255
	return 0
}

func (n *node) OnForget() {}

// The tree's names are fixed: every change of names that reaches the daemon (root's;
// the kernel refuses other users itself, default_permissions) is refused and logged
// (fs.Node.ChangeNames).

func (n *node) names(ctx context.Context, op fs.NameOp, name string) syscall.Errno {
	return errno(n.m.ChangeNames(caller(ctx, false), op, name))
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, n.names(ctx, fs.OpCreate, name)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, n.names(ctx, fs.OpMkdir, name)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, errno(n.m.Mknod(caller(ctx, false), name, mode))
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, n.names(ctx, fs.OpLink, name)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, n.names(ctx, fs.OpSymlink, name)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.names(ctx, fs.OpUnlink, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.names(ctx, fs.OpRmdir, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	return errno(n.m.Rename(caller(ctx, false), name, np.m, newName, flags))
}

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	// The capability is not the opener's business: each write checks its writer's.
	h, err := n.m.Open(caller(ctx, false), int(flags))
	if err != nil {
		return nil, 0, errno(err)
	}
	flagsOut := uint32(gofuse.FOPEN_DIRECT_IO)
	if n.m.IsStream() { // reads block for the next event and have no offsets
		flagsOut |= gofuse.FOPEN_NONSEEKABLE
	}
	return &handle{h: h, n: n}, flagsOut, 0
}

// handle adapts one fs.Handle.
type handle struct {
	h *fs.Handle
	n *node
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	k, err := h.h.ReadContext(ctx, dest, off)
	if err != nil {
		return nil, errno(err)
	}
	return gofuse.ReadResultData(dest[:k]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	// The process writing, which may not be the one that opened (a descriptor passed
	// on, or kept across a dropped capability).
	k, err := h.h.WriteAs(caller(ctx, h.n.m.NeedsNetAdmin()), data)
	if err != nil {
		return 0, errno(err)
	}
	// A write may have removed or renamed an interface (delete_child, link): its names
	// leave the kernel's cache before the writer hears back, as with sysfs.
	h.n.inv.sync()
	return uint32(k), 0
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return errno(h.h.Flush()) }

func (h *handle) Release(ctx context.Context) syscall.Errno { return errno(h.h.Release()) }

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

func (h *handle) Getattr(ctx context.Context, out *gofuse.AttrOut) syscall.Errno {
	return h.n.Getattr(ctx, nil, out)
}

func (h *handle) Setattr(ctx context.Context, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	return h.n.Setattr(ctx, nil, in, out)
}

// invalidator drops the names of interfaces that changed from the kernel's dentry
// cache (FUSE_NOTIFY_INVAL_ENTRY). One goroutine owns the change channel, so a write
// handler's sync sees every change made before it, in order.
type invalidator struct {
	gen     atomic.Uint64 // changes taken so far (Lookup's check)
	changes <-chan string
	flush   chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
	root    *gofs.Inode
}

func (v *invalidator) run() {
	defer close(v.done)
	for {
		select {
		case name := <-v.changes:
			v.gen.Add(1)
			v.drop(name)
		case done := <-v.flush:
			for more := true; more; {
				select {
				case name := <-v.changes:
					v.gen.Add(1)
					v.drop(name)
				default:
					more = false
				}
			}
			close(done)
		case <-v.stop:
			return
		}
	}
}

// sync returns once every change queued so far has been dropped from the cache.
func (v *invalidator) sync() {
	if v == nil {
		return
	}
	done := make(chan struct{})
	select {
	case v.flush <- done:
		<-done
	case <-v.stop:
	}
}

func (v *invalidator) close() {
	select {
	case <-v.stop:
	default:
		close(v.stop)
		<-v.done
	}
}

// drop invalidates the kernel's entries for interface name ("": every cached name in
// fs.DynamicDirs). Invalidating a name that still exists only costs a lookup. A name
// is invalidated whether or not go-fuse holds its node yet: a lookup answered before
// the change may not have added it (go-fuse does after the reply is made), and the
// kernel would then keep the entry it is about to get for the entry timeout. (The
// kernel takes the directory's lock for the invalidation, which the lookup holds.)
func (v *invalidator) drop(name string) {
	if name != "" {
		for _, e := range fs.InterfaceEntries(name) {
			if d := v.dir(e.Dir); d != nil {
				d.NotifyEntry(e.Name)
			}
		}
		return
	}
	for _, dir := range fs.DynamicDirs {
		if d := v.dir(dir); d != nil {
			for c := range d.Children() {
				d.NotifyEntry(c)
			}
		}
	}
}

// dir is the Inode of a directory the kernel has looked up, nil if it has not.
func (v *invalidator) dir(path string) *gofs.Inode {
	d := v.root
	for _, c := range strings.Split(path, "/") {
		if d = d.GetChild(c); d == nil {
			return nil
		}
	}
	return d
}
