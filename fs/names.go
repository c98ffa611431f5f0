package fs

import (
	"fmt"
	"strconv"
	"syscall"
)

// NameOp is a change of names a front end was asked for.
type NameOp int

const (
	OpCreate  NameOp = iota // open O_CREAT of a new name (Tlcreate)
	OpMkdir                 // mkdir
	OpMknod                 // mknod (Node.Mknod)
	OpSymlink               // symlink
	OpLink                  // link: a new name for an existing file
	OpUnlink                // unlink
	OpRmdir                 // rmdir (unlinkat AT_REMOVEDIR)
	OpRename                // rename (Node.Rename)
)

var nameOps = [...]string{"create", "mkdir", "mknod", "symlink", "link", "unlink", "rmdir", "rename"}

func (o NameOp) String() string { return nameOps[o] }

// The tree's names are fixed: every change of names is refused, with the answer sysfs
// gives, in the order the VFS checks (fs/namei.c). The name is looked up first
// (search permission on the directory, EACCES): an existing one cannot be made again
// (EEXIST), a missing one cannot be removed or renamed (ENOENT). Then only root may
// write the tree's directories (EACCES), unlink refuses a directory (EISDIR) and rmdir
// a file (ENOTDIR). Root then gets what kernfs answers for an operation it does not
// have: EACCES for a create (no ->create), EPERM for the rest. A kernel client (FUSE,
// v9fs) looks names up itself first; raw 9P clients get the same answers from here.
// Each refusal is logged with who asked.

// ChangeNames answers c's op on name in directory n (not OpMknod or OpRename: Mknod
// and Rename take more).
func (n *Node) ChangeNames(c Caller, op NameOp, name string) error {
	return n.refused(c, op, name, n.changeNames(c, op, name))
}

// Mknod answers c's mknod of name with mode (its file type decides, as may_mknod and
// do_mknodat: a directory is EPERM and an unknown type EINVAL before the lookup; a
// regular file is a create).
func (n *Node) Mknod(c Caller, name string, mode uint32) error {
	var err error
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		err = syscall.EPERM
	case 0, syscall.S_IFREG:
		err = n.changeNames(c, OpCreate, name)
	case syscall.S_IFCHR, syscall.S_IFBLK, syscall.S_IFIFO, syscall.S_IFSOCK:
		err = n.changeNames(c, OpMknod, name)
	default:
		err = syscall.EINVAL
	}
	return n.refused(c, OpMknod, name, err)
}

// renameat2's flags.
const (
	renameNoReplace = 1 << 0
	renameExchange  = 1 << 1
	renameWhiteout  = 1 << 2
)

// Rename answers c's rename of oldName in n to newName in newDir, with renameat2's
// flags (do_renameat2, vfs_rename; kernfs_iop_rename refuses any flag with EINVAL).
func (n *Node) Rename(c Caller, oldName string, newDir *Node, newName string, flags uint32) error {
	err := n.rename(c, oldName, newDir, newName, flags)
	if err == nil {
		return nil // a name onto itself: nothing to do, as vfs_rename has it
	}
	return n.refused(c, OpRename, oldName, err)
}

func (n *Node) rename(c Caller, oldName string, newDir *Node, newName string, flags uint32) error {
	if flags&^(renameNoReplace|renameExchange|renameWhiteout) != 0 ||
		flags&(renameNoReplace|renameWhiteout) != 0 && flags&renameExchange != 0 {
		return syscall.EINVAL
	}
	if !n.dir || newDir == nil || !newDir.dir {
		return syscall.ENOTDIR
	}
	for _, d := range []*Node{n, newDir} {
		if err := d.Access(c, MayExec); err != nil {
			return err
		}
	}
	src, err := n.Lookup(oldName)
	if err != nil {
		return syscall.ENOENT
	}
	dst, derr := newDir.Lookup(newName)
	switch {
	case flags&renameExchange != 0 && derr != nil:
		return syscall.ENOENT
	case flags&renameNoReplace != 0 && derr == nil:
		return syscall.EEXIST
	}
	if derr == nil && src.Ino() == dst.Ino() {
		return nil // vfs_rename's first check: the same file
	}
	for _, d := range []*Node{n, newDir} {
		if err := d.Access(c, MayWrite|MayExec); err != nil {
			return err
		}
	}
	if derr == nil && flags&renameExchange == 0 {
		switch {
		case src.IsDir() && !dst.IsDir():
			return syscall.ENOTDIR
		case !src.IsDir() && dst.IsDir():
			return syscall.EISDIR
		}
	}
	if flags != 0 {
		return syscall.EINVAL
	}
	return ErrNamespace
}

// refused logs a refusal of op on name in n (no name: n itself) and returns it. The
// name is the client's: clipped (a 9P client may send 64 KiB with every request) and
// escaped (a newline in it must not make a line of its own in the log).
func (n *Node) refused(c Caller, op NameOp, name string, err error) error {
	if n.t.log != nil {
		p := n.Path()
		if name != "" {
			q := strconv.Quote(clip([]byte(name)))
			p = join(p, q[1:len(q)-1])
		}
		n.t.log(fmt.Sprintf("%s: %s refused (%v); the tree's names are fixed; as %s", p, op, Errno(err).Error(), c))
	}
	return err
}

func (n *Node) changeNames(c Caller, op NameOp, name string) error {
	if !n.dir {
		return syscall.ENOTDIR
	}
	if err := n.Access(c, MayExec); err != nil {
		return err
	}
	child, err := n.Lookup(name)
	exists := err == nil
	switch op {
	case OpUnlink, OpRmdir, OpRename:
		if !exists {
			return syscall.ENOENT
		}
	default:
		if exists {
			return syscall.EEXIST
		}
	}
	if err := n.Access(c, MayWrite|MayExec); err != nil {
		return err
	}
	switch {
	case op == OpUnlink && child.IsDir():
		return syscall.EISDIR
	case op == OpRmdir && !child.IsDir():
		return syscall.ENOTDIR
	case op == OpCreate:
		return ErrCreate
	}
	return ErrNamespace
}
