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

// nsMu serialises get-or-create of named namespaces within this process, and guards
// nsSeen.
var nsMu sync.Mutex

// nsSeen is the namespace (nsKey) each name stood for when this process last opened
// it.
var nsSeen = map[string]string{}

// ErrNamespaceGone: the named namespace was deleted (ip netns del), or deleted and
// made again, while this process had devices in it. New devices are not made in
// whatever the name stands for now: the devices already made live on in the old
// namespace (this process holds it), where the name no longer leads.
var ErrNamespaceGone = errors.New("the network namespace was deleted while this process had devices in it")

// openNetNS returns the worker of the named network namespace (acquired: release it),
// creating the namespace when missing, unless the name stood for another namespace in
// which this process still has devices (ErrNamespaceGone). The name is remembered
// for the namespace once the worker holds it, under nsMu, so that the last device's
// release cannot forget it in between.
func openNetNS(name string) (*nsWorker, error) {
	nsMu.Lock()
	defer nsMu.Unlock()
	h, err := getNetNS(name)
	if seen, ok := nsSeen[name]; ok && held(seen) {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("network namespace %q: %w", name, ErrNamespaceGone)
		case err != nil:
			return nil, err
		case nsKey(h) != seen:
			h.Close()
			return nil, fmt.Errorf("network namespace %q: %w (and made again)", name, ErrNamespaceGone)
		}
		return holdLocked(name, h)
	}
	if err == nil {
		return holdLocked(name, h)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
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
			h, err := getNetNS(name)
			if err != nil {
				return nil, err
			}
			return holdLocked(name, h)
		}
		return nil, fmt.Errorf("create network namespace %q: %w", name, r.err)
	}
	return holdLocked(name, r.h)
}

// holdLocked starts or joins the worker of h's namespace (closing h: the worker has
// its own) and remembers name for it. Called with nsMu held.
func holdLocked(name string, h netns.NsHandle) (*nsWorker, error) {
	defer h.Close()
	w, err := acquireWorker(h)
	if err != nil {
		return nil, err
	}
	nsSeen[name] = w.key
	return w, nil
}

// held reports whether devices of this process hold the namespace (its worker runs).
func held(key string) bool { return workerByKey(key) != nil }

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
// ns is not open): the namespace's worker while devices hold one (nsWorker), else a
// thread of its own. Such a thread is locked and never unlocked, so it is discarded
// when fn returns instead of going back to the scheduler in the wrong namespace.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	if w := lookupWorker(ns); w != nil {
		if ran, err := w.run(fn); ran {
			return err
		}
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

// inNS is inNetNS for a device: on the worker it holds, without looking the worker up
// by the namespace's identity (an fstat and a map under a global lock per call).
func (d *Device) inNS(fn func() error) error {
	if w := d.worker; w != nil {
		if ran, err := w.run(fn); ran {
			return err
		}
	}
	return inNetNS(d.ns, fn)
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

// LinkInfo is what the bonding driver's checks look at on a device that is not the
// engine's (bond_enslave): its name (the one asked may be an alternative name), IFF_UP,
// IFF_MASTER on a device that is not a bond, and whether its receive handler is taken.
type LinkInfo struct {
	Name   string
	Up     bool
	Master bool // IFF_MASTER, and not a bond (eql)
	Busy   bool // a port of a bridge, bond, team or Open vSwitch, or the lower device of a macvlan, macvtap, ipvlan or macsec device
}

// LookupLink describes the interface called name (or with that alternative name) in
// the namespace; false when there is none.
func LookupLink(netnsName, name string) (LinkInfo, bool) {
	h, closeNS, err := nsHandle(netnsName)
	if err != nil {
		return LinkInfo{}, false
	}
	defer closeNS()
	l, err := h.LinkByName(name)
	if err != nil {
		return LinkInfo{}, false
	}
	a := l.Attrs()
	info := LinkInfo{Name: a.Name, Up: a.RawFlags&unix.IFF_UP != 0, Master: a.RawFlags&unix.IFF_MASTER != 0 && l.Type() != "bond"}
	if a.MasterIndex != 0 {
		if m, err := h.LinkByIndex(a.MasterIndex); err == nil {
			switch m.Type() {
			case "bridge", "bond", "team", "openvswitch":
				info.Busy = true
			}
		}
	}
	if !info.Busy {
		// The devices that take over a lower device's receive handler.
		if links, err := h.LinkList(); err == nil {
			for _, o := range links {
				if o.Attrs().ParentIndex != a.Index || o.Attrs().Index == a.Index {
					continue
				}
				switch o.Type() {
				case "macvlan", "macvtap", "ipvlan", "ipvtap", "macsec":
					info.Busy = true
				}
			}
		}
	}
	return info, true
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

// nsWorker is a goroutine locked on an OS thread that has entered a namespace, kept
// while devices there hold it: every netlink, ethtool and /proc call of a device made
// its own thread (entering the namespace, then discarded), seven per child created;
// with the worker they cost a hand-off each. The devices of the namespace also share
// its namespace file and netlink handle (requests on it are serialised by its socket's
// lock): each device held its own of both, three file descriptors per child with its
// TUN instead of one.
type nsWorker struct {
	key  string
	refs int // under workersMu
	ch   chan func()
	stop chan struct{}
	ns   netns.NsHandle  // the worker's own (a dup), closed with it
	h    *netlink.Handle // its socket made in ns
}

var (
	workersMu sync.Mutex
	workers   = map[string]*nsWorker{}
)

// acquireWorker returns the worker of ns, starting it if needed; release it when done.
func acquireWorker(ns netns.NsHandle) (*nsWorker, error) {
	key := nsKey(ns)
	workersMu.Lock()
	defer workersMu.Unlock()
	if w := workers[key]; w != nil {
		w.refs++
		return w, nil
	}
	fd, err := unix.Dup(int(ns))
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	w := &nsWorker{key: key, refs: 1, ch: make(chan func()), stop: make(chan struct{}), ns: netns.NsHandle(fd)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(ns); err != nil {
			started <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE) // its socket is in ns
		if err != nil {
			started <- fmt.Errorf("netlink: %w", err)
			return
		}
		w.h = h
		started <- nil
		defer func() {
			w.h.Close()
			w.ns.Close()
		}()
		for {
			select {
			case f := <-w.ch:
				f()
			case <-w.stop:
				return
			}
		}
	}()
	if err := <-started; err != nil {
		w.ns.Close()
		return nil, err
	}
	workers[key] = w
	startNSWatchLocked()
	return w, nil
}

// lookupWorker returns the worker of ns if one runs.
func lookupWorker(ns netns.NsHandle) *nsWorker { return workerByKey(nsKey(ns)) }

// workerByKey returns the worker of the namespace nsKey names, if one runs.
func workerByKey(key string) *nsWorker {
	workersMu.Lock()
	defer workersMu.Unlock()
	return workers[key]
}

// release drops a reference; the last one stops the worker (and ends its thread),
// and the names that stood for its namespace are forgotten: the kernel reuses a
// freed namespace's inode number, and a name remembered with it would be taken for
// a later namespace that got the number (said deleted when it is not).
func (w *nsWorker) release() {
	workersMu.Lock()
	last := false
	if w.refs--; w.refs == 0 {
		if workers[w.key] == w {
			delete(workers, w.key)
		}
		if len(workers) == 0 {
			stopNSWatchLocked()
		}
		close(w.stop)
		last = true
	}
	workersMu.Unlock()
	if last {
		forget(w.key)
	}
}

// forget drops the names remembered for the namespace key unless devices hold it
// again (nsMu before workersMu, as openNetNS takes them).
func forget(key string) {
	nsMu.Lock()
	defer nsMu.Unlock()
	if held(key) {
		return
	}
	for name, k := range nsSeen {
		if k == key {
			delete(nsSeen, name)
		}
	}
}

// run runs fn on the worker's thread; ran is false when the worker has stopped.
func (w *nsWorker) run(fn func() error) (ran bool, err error) {
	done := make(chan error, 1)
	select {
	case w.ch <- func() { done <- fn() }:
		return true, <-done
	case <-w.stop:
		return false, nil
	}
}
