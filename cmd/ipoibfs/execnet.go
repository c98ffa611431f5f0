package main

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// netClassDir is what `ipoibfs exec` mounts over /sys/class/net: a live merge of the
// host's entries and the tree's interfaces, each a symlink as in sysfs. sysfs lets no
// one add names, and a static copy would miss a child created by the command itself
// (`echo 0x8005 > create_child` and then `cat /sys/class/net/ib0.8005/pkey`), so every
// lookup and listing asks both sides again. The host's entries keep their own relative
// link text (../../devices/...), which still resolves: only /sys/class/net is covered.
type netClassDir struct {
	gofs.Inode
	host string // a bind of the host's /sys/class/net, made before it was covered
	tree string // the tree's class/net
}

var (
	_ gofs.NodeLookuper  = (*netClassDir)(nil)
	_ gofs.NodeReaddirer = (*netClassDir)(nil)
	_ gofs.NodeGetattrer = (*netClassDir)(nil)
)

// target returns the link text of name: the tree's interface first, then the host's.
func (d *netClassDir) target(name string) (string, bool) {
	if st, err := os.Stat(filepath.Join(d.tree, name)); err == nil && st.IsDir() {
		return filepath.Join(d.tree, name), true
	}
	if t, err := os.Readlink(filepath.Join(d.host, name)); err == nil {
		return t, true
	}
	return "", false
}

func (d *netClassDir) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	t, ok := d.target(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	out.Attr.Mode = syscall.S_IFLNK | 0o777
	out.Attr.Size = uint64(len(t))
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	l := &gofs.MemSymlink{Data: []byte(t)}
	l.Attr.Mode = syscall.S_IFLNK | 0o777
	return d.NewInode(ctx, l, gofs.StableAttr{Mode: syscall.S_IFLNK}), 0
}

func (d *netClassDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	names := map[string]bool{}
	for _, dir := range []string{d.tree, d.host} {
		es, err := os.ReadDir(dir)
		if err != nil {
			return nil, gofs.ToErrno(err)
		}
		for _, e := range es {
			names[e.Name()] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	es := make([]gofuse.DirEntry, len(sorted))
	for k, n := range sorted {
		es[k] = gofuse.DirEntry{Name: n, Mode: syscall.S_IFLNK}
	}
	return gofs.NewListDirStream(es), 0
}

func (d *netClassDir) Getattr(ctx context.Context, f gofs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	out.Nlink = 2
	return 0
}

// mountNetClass covers dir (/sys/class/net) with the merged view; host is a bind of
// its original content. The returned function detaches it; the server's goroutines
// end with the process (a synchronous unmount would wait for the kernel to release a
// connection that this namespace's last process still holds).
func mountNetClass(dir, host, tree string) (func(), error) {
	zero := time.Duration(0)
	srv, err := gofs.Mount(dir, &netClassDir{host: host, tree: tree}, &gofs.Options{
		MountOptions: gofuse.MountOptions{
			DirectMountStrict: true,
			DisableXAttrs:     true,
			AllowOther:        true,
			FsName:            "ipoibfs-exec",
			Name:              "ipoibfs",
		},
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
	})
	if err != nil {
		return nil, err
	}
	_ = srv
	return func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) }, nil
}
