package fs

import (
	"fmt"
	"syscall"
)

// NameOp is a change of names a front end was asked for.
type NameOp int

const (
	OpCreate  NameOp = iota // open O_CREAT of a new name (Tlcreate)
	OpMkdir                 // mkdir
	OpMknod                 // mknod
	OpSymlink               // symlink
	OpLink                  // link: a new name for an existing file
	OpUnlink                // unlink
	OpRmdir                 // rmdir (unlinkat AT_REMOVEDIR)
	OpRename                // rename from this directory; with no name, of the node itself (9P Trename)
)

var nameOps = [...]string{"create", "mkdir", "mknod", "symlink", "link", "unlink", "rmdir", "rename"}

func (o NameOp) String() string { return nameOps[o] }

// ChangeNames answers c's change of names (op on name) in directory n, and logs it with
// who asked. The tree's names are fixed, and the answer is the one sysfs gives, in the
// order the VFS checks: the name is looked up (search permission on n, EACCES), an
// existing one cannot be made again (EEXIST) and a missing one cannot be removed or
// renamed (ENOENT); then only root may write the tree's directories (EACCES), unlink
// refuses a directory (EISDIR) and rmdir a file (ENOTDIR); root gets ErrCreate for a
// create and ErrNamespace for the rest, as kernfs has no such operation. A kernel
// client (FUSE, v9fs) looks names up itself first; raw 9P clients get the same
// answers from here.
func (n *Node) ChangeNames(c Caller, op NameOp, name string) error {
	err := n.changeNames(c, op, name)
	if n.t.log != nil {
		n.t.log(fmt.Sprintf("%s: %s refused (%v); the tree's names are fixed; as %s", join(n.path, name), op, Errno(err).Error(), c))
	}
	return err
}

func (n *Node) changeNames(c Caller, op NameOp, name string) error {
	if op == OpRename && name == "" {
		return NamespaceErrno(c) // the node's parent is a directory of the tree
	}
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
