package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"ipoibfs/fs/fuse"
)

// Checks made before the daemon touches anything, so that a second daemon started by
// mistake on the same mount point or namespace fails with the reason and leaves the
// first one untouched (it has not joined the fabric, made a device or mounted yet).

// checkMountPoint refuses a mount point where a live file system is already mounted
// (another daemon's tree, or anything else we would hide). A dead FUSE mount left by a
// crashed daemon does not count: it is cleaned up when the tree is mounted.
func checkMountPoint(dir string) error {
	if dir == "" {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("-mount %s: %v", dir, err)
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(abs))
	if err != nil || len(mounts) == 0 {
		// Nothing mounted there: a path that cannot be a directory (through a
		// file, or a file itself) is a mistake to say now, not after the daemon
		// has joined the fabric and said READY without its tree. Anything else
		// (a directory still to be made, one we may not make: no privilege to
		// mount either) is mountTree's, which goes on with 9P alone and says why.
		st, err := os.Stat(abs)
		switch {
		case errors.Is(err, syscall.ENOTDIR):
			return fmt.Errorf("-mount %s: %v", dir, err)
		case err == nil && !st.IsDir():
			return fmt.Errorf("-mount %s: not a directory", dir)
		}
		return nil
	}
	if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) || fuse.Dead(abs) {
		return nil // dead mount: mountTree cleans it up
	}
	m := mounts[len(mounts)-1]
	return fmt.Errorf("-mount %s: a %s file system (%s) is already mounted there; stop the daemon serving it or choose another -mount", dir, m.FSType, m.Source)
}

// checkDevices refuses to start when a network device with one of the interface names
// already exists in the target namespace: another daemon's, or the kernel's own
// ib_ipoib interface.
func checkDevices(ns string, names []string) error {
	h := netns.None()
	if ns != "" {
		var err error
		if h, err = netns.GetFromName(ns); err != nil {
			return nil // the namespace does not exist yet: nothing can be in it
		}
		defer h.Close()
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil // no netlink here: the kernel bridge will say why it is off
	}
	defer nl.Close()
	for _, name := range names {
		if _, err := nl.LinkByName(name); err == nil {
			where := "this namespace"
			if ns != "" {
				where = "network namespace " + ns
			}
			return fmt.Errorf("a network device %s already exists in %s (another ipoibfs daemon, or the kernel's ib_ipoib); stop it or use another -netns", name, where)
		}
	}
	return nil
}
