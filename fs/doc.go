// Package fs is the synthetic control tree of ipoibfs: one node model that mirrors the
// kernel's sysfs and debugfs files for IPoIB (class/net/<if>/..., kernel/debug/ipoib/...,
// module/ib_ipoib/parameters/..., class/infiniband/<hca>/...), plus ethtool-like files
// and the subnet manager's view (sm/). The package knows nothing about FUSE or 9P: the
// front ends in fs/fuse and fs/ninep adapt the same nodes, so every file gives the same
// bytes and the same errno over both.
//
// # Nodes
//
// A [Node] is a directory or an attribute file. Directories list their children on
// demand, so interfaces that appear or disappear in the engine show up at once and never
// leave stale entries. The files of an interface or bond hold that object, not its name,
// as a sysfs file holds its kobject: a handle that outlives its interface gets ENODEV
// and never reaches a child made again under the name, and one opened before a rename
// goes on working, under the new name in its log lines. Inode numbers (also the 9P QID
// paths) come from a registry that hands out one number per path and, for the files
// of an interface or bond, per object: a re-created child's files are new inodes, as
// a new kobject's are, so a kernel cache holding the old ones cannot lead to the old
// object, and a renamed interface's files keep theirs, as kernfs nodes do (its
// debugfs files, which the driver makes again, do not). 1 is the root.
//
// # File semantics (as sysfs)
//
//   - Modes are exactly the kernel's: 0444 read-only, 0644 read-write, 0200 write-only.
//     Opening for reading a file that cannot be read, or for writing one that cannot be
//     written, fails with EACCES even for root, as kernfs does.
//   - Reads are served from a snapshot taken at the first read of a handle and refreshed
//     by every read at offset 0, so `cat` sees consistent bytes across several read
//     calls and `lseek(fd, 0) + read` sees fresh content.
//   - Each write call is applied once, with the whole written buffer; the offset is
//     ignored (so `>>` works) and O_TRUNC or a truncate to 0 is a no-op.
//   - A failed write returns a syscall.Errno and logs one line "path: reason" through
//     [Options.Log].
//   - sm/partitions is different because a configuration does not fit one write: the
//     writes of one open handle accumulate, and the whole text is parsed and applied
//     when the handle is flushed (close(2) over FUSE; the fid clunk over 9P) or
//     released. A parse error leaves the old configuration active, is returned from that
//     close/clunk as EINVAL and is logged as "sm/partitions: line N: reason". Writes
//     themselves only fail when the text grows beyond partitions.MaxFileBytes (EFBIG).
//     The Linux v9fs client ignores clunk errors, so over a kernel 9P mount the log line
//     (and reading the file back) is the only report.
//
// Formats and write parsing live in this package's tables (attrs.go) or in ipoib, never
// in a front end.
//
// # Locking
//
// Tree.idMu guards the inode registry; its pruning asks the engine and the bonds
// whether an interface still exists with idMu held (Engine.mu and Bonds.mu are below
// it: neither calls into the tree). A [Handle] has one mutex for its snapshot and
// accumulated bytes; it is held while the node's read or write function runs, so the
// reads and writes of one handle are serialised (9P may run them concurrently). The
// engine serialises writes of different handles with its own locks. Nodes are immutable.
package fs
