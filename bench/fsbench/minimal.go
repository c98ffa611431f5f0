package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// The FUSE reference: the smallest go-fuse server a careful author would write for a
// sysfs-like file, with the daemon's mount options (direct mount, allow_other,
// default_permissions, no xattrs), contents never cached (FOPEN_DIRECT_IO) and names
// and attributes cached for an hour. It serves class/net/ib0/pkey ("0xffff\n") and
// class/net/ib0/mode (takes any write) in its own process, as the daemon does.
var minimalDir = flag.String("minimal-fuse", "", "internal: serve the minimal go-fuse reference at this directory")

// minDir is the root; it builds the tree once when mounted.
type minDir struct{ gofs.Inode }

type minFile struct {
	gofs.Inode
	data []byte
}

var (
	_ gofs.NodeOpener    = (*minFile)(nil)
	_ gofs.NodeGetattrer = (*minFile)(nil)
	_ gofs.NodeSetattrer = (*minFile)(nil)
	_ gofs.NodeReader    = (*minFile)(nil)
	_ gofs.NodeWriter    = (*minFile)(nil)
)

func (f *minFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, gofuse.FOPEN_DIRECT_IO, 0
}

func (f *minFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	out.Mode, out.Size = 0644, 4096
	return 0
}

func (f *minFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	return f.Getattr(ctx, fh, out)
}

func (f *minFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	if off >= int64(len(f.data)) {
		return gofuse.ReadResultData(nil), 0
	}
	return gofuse.ReadResultData(f.data[off:]), 0
}

func (f *minFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	return uint32(len(data)), 0
}

func (d *minDir) OnAdd(ctx context.Context) {
	class := d.NewPersistentInode(ctx, &gofs.Inode{}, gofs.StableAttr{Mode: syscall.S_IFDIR})
	net := d.NewPersistentInode(ctx, &gofs.Inode{}, gofs.StableAttr{Mode: syscall.S_IFDIR})
	ib0 := d.NewPersistentInode(ctx, &gofs.Inode{}, gofs.StableAttr{Mode: syscall.S_IFDIR})
	ib0.AddChild("pkey", d.NewPersistentInode(ctx, &minFile{data: []byte(pkeyWant)}, gofs.StableAttr{}), false)
	ib0.AddChild("mode", d.NewPersistentInode(ctx, &minFile{data: []byte(modeWrite)}, gofs.StableAttr{}), false)
	net.AddChild("ib0", ib0, false)
	class.AddChild("net", net, false)
	d.AddChild("class", class, false)
}

// serveMinimal mounts the reference at dir and serves it until SIGTERM.
func serveMinimal(dir string) {
	hour := time.Hour
	srv, err := gofs.Mount(dir, &minDir{}, &gofs.Options{
		MountOptions: gofuse.MountOptions{DirectMountStrict: true, DisableXAttrs: true, AllowOther: true,
			Options: []string{"default_permissions"}, FsName: "fsbench-minimal", Name: "fsbench"},
		EntryTimeout: &hour, AttrTimeout: &hour,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "minimal go-fuse server: %v\n", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; _ = srv.Unmount() }()
	srv.Wait()
}

// startMinimal runs this program again as the reference server, mounted under tmp.
func startMinimal(tmp string) string {
	dir := filepath.Join(tmp, "minimal")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		die("%v", err)
	}
	self, err := os.Executable()
	if err != nil {
		die("%v", err)
	}
	cmd := exec.Command(self, "-minimal-fuse", dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		die("start the minimal go-fuse server: %v", err)
	}
	atExit(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
			_ = cmd.Process.Kill()
		}
	})
	p := filepath.Join(dir, pkeyPath)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(p); err == nil && string(b) == pkeyWant {
			return dir
		}
		if time.Now().After(deadline) {
			die("the minimal go-fuse server did not come up at %s", dir)
		}
	}
}
