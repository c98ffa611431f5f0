//go:build linux

package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nsMu serialises get-or-create of named namespaces within this process.
var nsMu sync.Mutex

// openNetNS returns a handle of the named network namespace, creating it when missing.
// "" returns netns.None(): the namespace of the process.
func openNetNS(name string) (netns.NsHandle, error) {
	if name == "" {
		return netns.None(), nil
	}
	nsMu.Lock()
	defer nsMu.Unlock()
	h, err := getNetNS(name)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return h, err
	}
	// netns.NewNamed unshares the calling thread into the new namespace. Run it on a
	// dedicated locked thread that is never unlocked: the Go runtime terminates that
	// thread when the goroutine exits, so no thread stays in the wrong namespace.
	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		if errors.Is(r.err, fs.ErrExist) { // created by someone else meanwhile
			return getNetNS(name)
		}
		return netns.None(), fmt.Errorf("create network namespace %q: %w", name, r.err)
	}
	return r.h, nil
}

// getNetNS opens /run/netns/NAME and checks that it is a namespace file.
func getNetNS(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromName(name)
	if err != nil {
		return netns.None(), fmt.Errorf("network namespace %q: %w", name, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil {
		h.Close()
		return netns.None(), fmt.Errorf("network namespace %q: %w", name, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		h.Close()
		return netns.None(), fmt.Errorf("network namespace %q: /run/netns/%s is not a namespace (stale file?)", name, name)
	}
	return h, nil
}

// inNetNS runs fn on an OS thread that has entered ns (or on the calling goroutine when
// ns is not open). The thread is locked and never unlocked, so it is discarded when fn
// returns instead of going back to the scheduler in the wrong namespace.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			ch <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// LinkAddrs returns the IPv4 and IPv6 addresses of the interface called name in the
// named namespace ("" = this process's), for configuration that derives from another
// interface (the vendor installer's LAN_INTERFACE).
func LinkAddrs(netnsName, name string) ([]netip.Prefix, error) {
	h, closeNS, err := nsHandle(netnsName)
	if err != nil {
		return nil, err
	}
	defer closeNS()
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// LinkExists reports whether an interface of that name exists in the namespace.
func LinkExists(netnsName, name string) bool {
	h, closeNS, err := nsHandle(netnsName)
	if err != nil {
		return false
	}
	defer closeNS()
	_, err = h.LinkByName(name)
	return err == nil
}

// nsHandle is a netlink handle whose socket lives in the named namespace.
func nsHandle(netnsName string) (*netlink.Handle, func(), error) {
	if err := validNetNS(netnsName); err != nil {
		return nil, nil, err
	}
	ns := netns.None()
	if netnsName != "" {
		var err error
		if ns, err = getNetNS(netnsName); err != nil {
			return nil, nil, err
		}
	}
	h, err := newHandleIn(ns)
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		return nil, nil, err
	}
	return h, func() {
		h.Close()
		if ns.IsOpen() {
			ns.Close()
		}
	}, nil
}

// newHandleIn opens a netlink handle whose socket is created in ns by a throwaway
// thread (netlink's own NewHandleAt switches the calling thread there and back).
func newHandleIn(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := inNetNS(ns, func() (e error) { h, e = netlink.NewHandle(unix.NETLINK_ROUTE); return e })
	return h, err
}
