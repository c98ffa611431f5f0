//go:build linux

package kernel

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// monitor is the one netlink subscription (link and address changes) of a network
// namespace, shared by every device of this package there. Devices register by
// interface index and are only told "something of yours changed"; each then reads its
// own state. Per-device subscriptions would wake every device for every change of every
// other one, which grows as the square of the number of children.
type monitor struct {
	key  string
	ns   netns.NsHandle // a duplicate, owned by the monitor
	refs int            // under monMu

	mu   sync.Mutex
	devs map[int]*Device

	// The namespace's multicast lists, shared by its devices' reads (groupLists).
	gmu      sync.Mutex
	gcond    *sync.Cond
	gReading bool
	gWaiters int    // callers waiting for a read (tests wait for them)
	gStarted uint64 // reads started
	gResFrom uint64 // the number of the read gRes came from
	gRes     map[int][]netip.Addr
	gErr     error

	subscriptions atomic.Int64 // subscriptions made; more than one: one broke (tests)
	// bufferRefused: forcing the buffer size failed (no CAP_NET_ADMIN over the
	// namespace); its subscriptions then keep the default.
	bufferRefused atomic.Bool

	stop chan struct{}
	done chan struct{}
}

// monitorBuffer is the receive buffer of the subscription's sockets. After an overflow
// (ENOBUFS: events were lost) the monitor subscribes again and every device of the
// namespace reads its link, addresses and groups afresh, which with thousands of
// children costs seconds; the default buffer (net.core.rmem_default, 208 KiB: about
// 50-150 link messages, each charged 1.5-4.5 KiB) overflowed under a burst of
// `ip -batch` link changes. 32 MiB holds a change of each of 4000 devices with the
// reader stalled; it is a limit, used only while messages wait. Forced past
// net.core.rmem_max, which root may.
const monitorBuffer = 32 << 20

// withBuffer subscribes with monitorBuffer, or with the default size where the kernel
// refuses it (netlink leaves that socket open, so it is not tried again).
func (m *monitor) withBuffer(subscribe func(size int) error) error {
	if !m.bufferRefused.Load() {
		err := subscribe(monitorBuffer)
		if err == nil || !errors.Is(err, unix.EPERM) {
			return err
		}
		m.bufferRefused.Store(true)
	}
	return subscribe(0)
}

var (
	monMu    sync.Mutex
	monitors = map[string]*monitor{}
)

// nsKey identifies a namespace (its nsfs inode), so two names for one namespace share
// a monitor and a recreated namespace of the same name does not.
func nsKey(ns netns.NsHandle) string {
	if !ns.IsOpen() {
		return ""
	}
	return ns.UniqueId()
}

// register adds d to the monitor of its namespace, starting the monitor if needed.
func register(d *Device) error {
	key := nsKey(d.ns)
	monMu.Lock()
	defer monMu.Unlock()
	m := monitors[key]
	if m == nil {
		ns := netns.None()
		if d.ns.IsOpen() {
			fd, err := unix.Dup(int(d.ns))
			if err != nil {
				return err
			}
			ns = netns.NsHandle(fd)
		}
		m = &monitor{key: key, ns: ns, devs: map[int]*Device{}, stop: make(chan struct{}), done: make(chan struct{})}
		monitors[key] = m
		go m.run()
	}
	m.refs++
	m.mu.Lock()
	m.devs[d.index] = d
	m.mu.Unlock()
	d.mon = m
	return nil
}

// unregister removes d; the last device stops the monitor.
func (m *monitor) unregister(d *Device) {
	m.mu.Lock()
	if m.devs[d.index] == d {
		delete(m.devs, d.index)
	}
	m.mu.Unlock()
	monMu.Lock()
	m.refs--
	last := m.refs == 0
	if last {
		delete(monitors, m.key)
	}
	monMu.Unlock()
	if last {
		close(m.stop)
		<-m.done
		if m.ns.IsOpen() {
			m.ns.Close()
		}
	}
}

// mark tells the device with this index what changed.
func (m *monitor) mark(index int, bits uint32) {
	m.mu.Lock()
	d := m.devs[index]
	m.mu.Unlock()
	if d != nil {
		d.mark(bits)
	}
}

// markAll is used after a (re)subscription: anything may have changed meanwhile.
func (m *monitor) markAll() {
	m.mu.Lock()
	devs := make([]*Device, 0, len(m.devs))
	for _, d := range m.devs {
		devs = append(devs, d)
	}
	m.mu.Unlock()
	for _, d := range devs {
		d.mark(dirtyLink | dirtyAddrs | dirtyGroups)
	}
}

func (m *monitor) run() {
	defer close(m.done)
	for {
		if m.follow() {
			return
		}
		select { // the subscription broke (e.g. ENOBUFS under a burst): resubscribe
		case <-m.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// follow subscribes and dispatches until stopped (true) or the subscription ends.
func (m *monitor) follow() bool {
	links := make(chan netlink.LinkUpdate, 256)
	addrs := make(chan netlink.AddrUpdate, 256)
	stop := make(chan struct{})
	defer func() {
		close(stop)
		for range links { // let the subscription goroutines finish
		}
		for range addrs {
		}
	}()
	// Subscribe from a throwaway thread in the namespace, so the sockets live there
	// without netlink switching (and restoring) one of our threads.
	lerr := inNetNS(m.ns, func() error {
		return m.withBuffer(func(size int) error {
			return netlink.LinkSubscribeWithOptions(links, stop, netlink.LinkSubscribeOptions{ErrorCallback: func(error) {},
				ReceiveBufferSize: size, ReceiveBufferForceSize: size != 0})
		})
	})
	if lerr != nil {
		close(links)
	}
	aerr := inNetNS(m.ns, func() error {
		return m.withBuffer(func(size int) error {
			return netlink.AddrSubscribeWithOptions(addrs, stop, netlink.AddrSubscribeOptions{ErrorCallback: func(error) {},
				ReceiveBufferSize: size, ReceiveBufferForceSize: size != 0})
		})
	})
	if aerr != nil {
		close(addrs)
	}
	if lerr != nil || aerr != nil {
		return false
	}
	m.subscriptions.Add(1)
	m.markAll() // after subscribing, so no change falls between the reads and the events
	for {
		select {
		case <-m.stop:
			return true
		case u, ok := <-links:
			if !ok {
				return false
			}
			bits := uint32(dirtyLink | dirtyGroups) // up joins the all-hosts groups
			if u.Header.Type == unix.RTM_DELLINK {
				bits = dirtyGone
			}
			m.mark(int(u.Index), bits)
		case u, ok := <-addrs:
			if !ok {
				return false
			}
			m.mark(u.LinkIndex, dirtyAddrs|dirtyGroups) // an IPv6 address has a solicited-node group
		}
	}
}
