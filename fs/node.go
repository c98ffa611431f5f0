package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"ipoibfs/ipoib"
)

// Error is a failed tree operation: the errno the caller sees and, for the log, why.
type Error struct {
	Errno  syscall.Errno
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Errno.Error()
	}
	return e.Errno.Error() + ": " + e.Detail
}

func (e *Error) Unwrap() error { return e.Errno }

func errorf(errno syscall.Errno, format string, a ...any) error {
	return &Error{Errno: errno, Detail: fmt.Sprintf(format, a...)}
}

// Errno returns the errno a front end reports for err: the syscall.Errno it wraps
// (engine errors wrap one), EINVAL for a partitions.conf error, EIO for anything else.
func Errno(err error) syscall.Errno {
	errno, _ := describe(err)
	return errno
}

// maxCommitBytes bounds what a handle of a commit file (sm/partitions) accumulates:
// the largest partitions.conf the subnet manager reads.
const maxCommitBytes = 1 << 20

// describe returns err's errno and the reason for the log line.
func describe(err error) (syscall.Errno, string) {
	if err == nil {
		return 0, ""
	}
	var pe interface{ LineReason() (int, string) } // a configuration file's error
	if errors.As(err, &pe) {
		line, reason := pe.LineReason()
		return syscall.EINVAL, fmt.Sprintf("line %d: %s", line, reason)
	}
	var errno syscall.Errno
	hasErrno := errors.As(err, &errno)
	var fe *Error
	if errors.As(err, &fe) {
		if fe.Detail != "" {
			return fe.Errno, fe.Detail
		}
		return fe.Errno, fe.Errno.Error()
	}
	var ie *ipoib.Error
	if errors.As(err, &ie) && hasErrno {
		if ie.Detail != "" {
			return errno, ie.Detail
		}
		return errno, errno.Error()
	}
	if hasErrno {
		return errno, errno.Error()
	}
	return syscall.EIO, err.Error()
}

// The tree's names are fixed: changing them fails with the errnos sysfs gives, the
// same over every front end.
const (
	ErrCreate    = syscall.EACCES // creating a file (open O_CREAT of a new name)
	ErrNamespace = syscall.EPERM  // mkdir, rmdir, unlink, rename, link, symlink, mknod, by root
)

// NamespaceErrno is what c gets for a change of names (ErrNamespace's operations): a
// user other than root has no write permission on any directory of the tree (all
// root's, 0755 or 0700), which the kernel checks first (EACCES); root gets
// ErrNamespace, as kernfs has no such operation. (Over FUSE the kernel answers users
// itself.)
func NamespaceErrno(c Caller) syscall.Errno {
	if c.UID != 0 && !c.ModesChecked {
		return syscall.EACCES
	}
	return ErrNamespace
}

// Node is a directory or an attribute file of the tree. Nodes are immutable and
// addressed by path; see the package documentation.
type Node struct {
	t    *Tree
	name string
	path string // as made; Path is the current one
	ino  uint64
	// own is the interface or bond whose directory class/net/<name> holds the node
	// (nil for the rest), rest the path below that directory: an interface renamed
	// after the node was made names its new path in Path.
	own  owner
	rest string
	perm uint32 // 0755 for directories; 0444, 0644 or 0200 for files
	dir  bool

	list   func(dir string) ([]*Node, error)     // directories: children in order
	lookup func(dir, name string) (*Node, error) // directories: optional fast path
	slow   bool                                  // a read asks the kernel or the HCA (Quick)
	read   func() ([]byte, error)                // files
	write  func([]byte) error                    // files: one write call
	// netAdmin: writes need Caller.NetAdmin (EPERM otherwise); parseFirst, when set,
	// runs before that check (the driver's create_child parses and range-checks its
	// argument before capable(): EINVAL comes first).
	netAdmin   bool
	parseFirst func([]byte) error
	// stream: each open follows what comes from then on (events, capture).
	stream streamSource
	commit func([]byte) error // files: accumulated writes of a handle
}

// Name returns the node's name ("" for the root).
func (n *Node) Name() string { return n.name }

// Path returns the path relative to the mount root ("" for the root).
func (n *Node) Path() string {
	if n.own != nil {
		return netPrefix + n.own.Name() + n.rest
	}
	return n.path
}

// Ino returns the stable inode number (also the 9P QID path).
func (n *Node) Ino() uint64 { return n.ino }

// IsDir reports whether the node is a directory.
func (n *Node) IsDir() bool { return n.dir }

// Perm returns the permission bits (0755 for directories; 0444, 0644 or 0200 for files).
func (n *Node) Perm() uint32 { return n.perm }

// Mode returns the node's type and permission bits.
func (n *Node) Mode() os.FileMode {
	if n.dir {
		return os.ModeDir | os.FileMode(n.perm)
	}
	return os.FileMode(n.perm)
}

// Size is what stat reports: 4096 for files (as sysfs does; content is generated on
// read) and 0 for directories.
func (n *Node) Size() uint64 {
	if n.dir {
		return 0
	}
	return 4096
}

// ModTime is every node's access, modification and change time: when the tree was
// built (content is generated on read, so there is no better answer).
func (n *Node) ModTime() time.Time { return n.t.start }

// DynamicDirs are the directories whose entries come and go while the daemon runs
// (interfaces: created, deleted, renamed). Every other name in the tree is fixed for
// the daemon's life, and every node's attributes are: a front end whose client caches
// names (the kernel's dentry cache behind FUSE) may keep the others for good, and these
// only while it drops the ones Tree.Changes names, as the kernel drops a netdev's sysfs
// dentries when it goes.
var DynamicDirs = []string{"class/net", "kernel/debug/ipoib"}

// Entry is a name in a directory of the tree.
type Entry struct{ Dir, Name string }

// InterfaceEntries are the names interface ifname has in DynamicDirs.
func InterfaceEntries(ifname string) []Entry {
	return []Entry{{"class/net", ifname}, {"kernel/debug/ipoib", ifname + "_mcg"}, {"kernel/debug/ipoib", ifname + "_path"}}
}

// Changes returns a channel naming each interface that was added, removed or renamed
// (both names; "" when names went missing: all of DynamicDirs may have changed), and a
// cancel function.
func (t *Tree) Changes() (<-chan string, func()) { return t.e.Watch() }

// InDynamicDir reports whether n's name is one that may vanish (see DynamicDirs).
func (n *Node) InDynamicDir() bool {
	dir, _ := path.Split(n.Path())
	return slices.Contains(DynamicDirs, strings.TrimSuffix(dir, "/"))
}

// NeedsNetAdmin reports whether writes to the file need CAP_NET_ADMIN, so a front end
// need not find out for other opens (it costs a read of /proc).
func (n *Node) NeedsNetAdmin() bool { return n.netAdmin }

// Children lists a directory's entries.
func (n *Node) Children() ([]*Node, error) {
	if !n.dir {
		return nil, syscall.ENOTDIR
	}
	return n.list(n.Path())
}

// Lookup returns the child called name: ENOENT when there is none, ENOTDIR when n is a
// file.
func (n *Node) Lookup(name string) (*Node, error) {
	if !n.dir {
		return nil, syscall.ENOTDIR
	}
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return nil, syscall.ENOENT
	}
	if n.lookup != nil {
		return n.lookup(n.Path(), name)
	}
	return n.listed(n.Path(), name)
}

// listed finds the child called name in the listing of directory n at path dir.
func (n *Node) listed(dir, name string) (*Node, error) {
	cs, err := n.list(dir)
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if c.name == name {
			return c, nil
		}
	}
	return nil, syscall.ENOENT
}

// Open opens the node for c with open(2) flags: c must pass Access for reading and/or
// writing (EACCES otherwise), and with O_TRUNC may truncate (MayTruncate), as the
// kernel's open asks. Directories open read-only (EISDIR for writing or truncating).
func (n *Node) Open(c Caller, flags int) (*Handle, error) {
	acc := flags & syscall.O_ACCMODE
	rd := acc == syscall.O_RDONLY || acc == syscall.O_RDWR
	wr := acc == syscall.O_WRONLY || acc == syscall.O_RDWR
	if n.dir && (wr || flags&syscall.O_TRUNC != 0) {
		if n.t.log != nil {
			n.t.log(fmt.Sprintf("%s: is a directory; open for writing as %s", n.Path(), c))
		}
		return nil, syscall.EISDIR
	}
	mask := 0
	if rd {
		mask |= MayRead
	}
	if wr {
		mask |= MayWrite
	}
	err := n.Access(c, mask)
	if err == nil && flags&syscall.O_TRUNC != 0 {
		err = n.MayTruncate(c)
	}
	if err != nil {
		// Every refused change is logged: an open for writing, or one that would
		// truncate (O_RDONLY|O_TRUNC asks for write permission too).
		if (wr || flags&syscall.O_TRUNC != 0) && n.t.log != nil {
			how := "for writing"
			if !wr {
				how = "with O_TRUNC"
			}
			n.t.log(fmt.Sprintf("%s: permission denied; open %s as %s", n.Path(), how, c))
		}
		return nil, err
	}
	h := &Handle{n: n, c: c, rd: rd || n.dir, wr: wr}
	if n.stream != nil && rd {
		sub, err := n.stream.open()
		if err != nil {
			return nil, Errno(err)
		}
		h.sub = sub
	}
	return h, nil
}

// AttrChange is what a SETATTR (FUSE) or Tsetattr (9P) asks to change.
type AttrChange struct {
	Mode, Owner bool    // chmod; chown or chgrp
	Times       bool    // access or modification time set to given values
	TimesNow    bool    // times set to the current time (touch; the kernel's truncating open)
	Size        bool    // truncate; the size itself does not matter
	Handle      *Handle // the open file it came through (ftruncate), if any
}

// MayTruncate reports whether c may truncate n, or set its times to now, without a
// descriptor open for writing: root may (the owner, and CAP_DAC_OVERRIDE; kernfs's
// rule about files without a store method is about opening them, so root truncates
// or touches even a 0444 file on sysfs), anyone else needs write permission (EACCES).
func (n *Node) MayTruncate(c Caller) error {
	if c.UID == 0 || c.ModesChecked {
		return nil
	}
	return n.Access(c, MayWrite)
}

// SetAttr decides a change of attributes for c. The tree's modes, owners and times are
// fixed: changing a mode, an owner or a time to a given value fails with EPERM, for
// root too (sysfs would store them; the tree refuses rather than report a change it
// did not make), and the refusal is logged with who asked. Truncating and setting the
// times to now need MayTruncate or a handle open for writing, and then do nothing, as
// truncating a sysfs file does (a file's content is made at each read). A directory
// cannot be truncated (EISDIR).
func (n *Node) SetAttr(c Caller, a AttrChange) error {
	if a.Mode || a.Owner || a.Times {
		what := map[bool]string{true: "modes and owners", false: "times"}[a.Mode || a.Owner]
		if n.t.log != nil {
			n.t.log(fmt.Sprintf("%s: the tree's %s are fixed (EPERM); setattr as %s", n.Path(), what, c))
		}
		return syscall.EPERM
	}
	if a.Size && n.dir {
		return syscall.EISDIR
	}
	if (a.Size || a.TimesNow) && (a.Handle == nil || !a.Handle.wr) {
		err := n.MayTruncate(c)
		if err != nil && n.t.log != nil {
			what := map[bool]string{true: "truncate", false: "set times to now"}[a.Size]
			n.t.log(fmt.Sprintf("%s: permission denied; %s as %s", n.Path(), what, c))
		}
		return err
	}
	return nil
}

// Handle is one open file: a read snapshot, or the accumulated writes of a commit file.
// All methods return syscall.Errno errors.
type Handle struct {
	n      *Node
	c      Caller // who opened it: the modes were checked for them
	rd, wr bool

	mu    sync.Mutex
	snap  []byte
	have  bool
	acc   []byte // commit files: bytes written through this handle
	dirty bool   // acc changed since it was last applied
	w     Caller // who wrote acc last (a descriptor may be handed to another process)

	sub streamSub // a stream's subscription
}

// StreamIdle is how long ReadAt, which has no context, waits on a stream (`events`,
// `capture`) before returning no bytes. The front ends use ReadContext, which waits
// until the FUSE interrupt or the 9P flush ends the read.
const StreamIdle = 10 * time.Second

// IsStream reports a file whose reads block for what comes next (`events`): front ends
// serve it without caching, sizes or offsets.
func (n *Node) IsStream() bool { return n.stream != nil }

// Quick reports whether a read of n is answered at once from the daemon's memory: the
// sysfs-like attribute files of class/ and module/, but for those that ask the kernel
// or the HCA (ifalias, port counters). Not fabric/ (it asks the subnet administrator
// over the fabric), kernel/debug/ or sm/ (tables of any size), nor a stream, which
// waits. A front end may answer a quick read in the goroutine that took the request
// instead of handing it to another (9P).
func (n *Node) Quick() bool {
	if n.dir || n.stream != nil || n.slow {
		return false
	}
	top, _, _ := strings.Cut(n.Path(), "/")
	return top == "class" || top == "module"
}

// Writable reports whether the handle was opened for writing: its release may apply
// what was written (a commit file).
func (h *Handle) Writable() bool { return h.wr }

// ReadContext is ReadAt, except that a stream waits until ctx ends (an interrupted
// FUSE read) rather than StreamIdle.
func (h *Handle) ReadContext(ctx context.Context, p []byte, off int64) (int, error) {
	if h.sub != nil {
		return h.sub.read(ctx, p, 0)
	}
	return h.ReadAt(p, off)
}

// Node returns the node the handle is open on.
func (h *Handle) Node() *Node { return h.n }

// ReadAt copies content from offset off into p and returns how many bytes it copied;
// 0 means end of file. The content is generated at the first read and again at every
// read at offset 0.
func (h *Handle) ReadAt(p []byte, off int64) (int, error) {
	if h.n.dir {
		return 0, syscall.EISDIR
	}
	if !h.rd {
		return 0, syscall.EBADF
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if h.sub != nil {
		return h.sub.read(context.Background(), p, StreamIdle)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if off == 0 || !h.have {
		b, err := h.n.read()
		if err != nil {
			h.have = false
			return 0, Errno(err)
		}
		h.snap, h.have = b, true
	}
	if off >= int64(len(h.snap)) {
		return 0, nil
	}
	return copy(p, h.snap[off:]), nil
}

// Write applies one write call as the opener: the whole buffer, whatever the offset.
// On failure it logs "path: reason" and returns the errno. A zero-length write does
// nothing (as sysfs_kf_write; the kernel's FUSE and 9P clients never send one).
func (h *Handle) Write(p []byte) (int, error) { return h.WriteAs(h.c, p) }

// WriteAs is Write by c, the process that made the write call where the front end
// knows it (FUSE): the modes were checked at open, for the opener, as the kernel
// does; CAP_NET_ADMIN is checked for the writer, as the driver's stores check
// capable() when they run, and the log names the writer.
func (h *Handle) WriteAs(c Caller, p []byte) (int, error) {
	if h.n.dir {
		return 0, syscall.EISDIR
	}
	if !h.wr {
		return 0, syscall.EBADF
	}
	if len(p) == 0 { // as sysfs_kf_write: nothing written, nothing applied
		return 0, nil
	}
	if h.n.commit == nil && len(p) > maxStore {
		// As kernfs: a store gets at most a page, and the write is short; a caller
		// that writes the rest gets it stored as a value of its own.
		p = p[:maxStore]
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n.netAdmin && !c.NetAdmin {
		if h.n.parseFirst != nil {
			if err := h.n.parseFirst(p); err != nil {
				return 0, h.n.t.audit(c, h.n.Path(), p, err)
			}
		}
		why := "CAP_NET_ADMIN is needed"
		if c.NoNetAdmin != "" {
			why += " (" + c.NoNetAdmin + ")"
		}
		return 0, h.n.t.audit(c, h.n.Path(), p, errorf(syscall.EPERM, "%s", why))
	}
	if h.n.commit != nil {
		if len(h.acc)+len(p) > maxCommitBytes {
			return 0, h.n.t.audit(c, h.n.Path(), p, errorf(syscall.EFBIG, "more than %d bytes written", maxCommitBytes))
		}
		h.acc = append(h.acc, p...)
		h.dirty, h.w = true, c
		return len(p), nil
	}
	if errno := h.n.t.audit(c, h.n.Path(), p, h.n.write(p)); errno != 0 {
		return 0, errno
	}
	return len(p), nil
}

// maxStore is the most one write hands an attribute's store (PAGE_SIZE, as kernfs).
const maxStore = 4096

// Flush is called at every close of a descriptor of the handle. For a commit file with
// writes since the last flush it applies everything written through the handle so far;
// the error (EINVAL for a bad configuration) is returned and logged.
func (h *Handle) Flush() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applyLocked()
}

// Release ends the handle; pending writes of a commit file are applied as by Flush.
func (h *Handle) Release() error {
	if h.sub != nil {
		h.sub.close() // wakes a read blocked on the stream
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.applyLocked()
	h.snap = nil
	return err
}

func (h *Handle) applyLocked() error {
	if h.n.commit == nil || !h.dirty {
		return nil
	}
	h.dirty = false
	if errno := h.n.t.audit(h.w, h.n.Path(), h.acc, h.n.commit(h.acc)); errno != 0 {
		return errno
	}
	return nil
}
