//go:build linux

package kernel

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

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
// reader stalled, and link and address messages share one socket: 64 MiB. It is a
// limit, used only while messages wait. Forced past net.core.rmem_max, which root may.
const monitorBuffer = 64 << 20

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
		d.mark(dirtyLink | dirtyAddrs | dirtyGroups | dirtyResync)
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
//
// One socket joins the link and address groups, and a message is read only as far as
// the interface index it is about: the monitor tells that device what changed and
// the device reads its own state. (netlink's LinkSubscribe decoded every attribute of
// every link message and its Receive allocated 64 KiB per read: with a child being
// created, 30 KiB of garbage each, half of what creating it made.)
func (m *monitor) follow() bool {
	var sock *os.File
	// Subscribe from a thread in the namespace, so the socket lives there.
	err := inNetNS(m.ns, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK,
			Groups: 1<<(unix.RTNLGRP_LINK-1) | 1<<(unix.RTNLGRP_IPV4_IFADDR-1) | 1<<(unix.RTNLGRP_IPV6_IFADDR-1)}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return err
		}
		// monitorBuffer, or the default size where the kernel refuses it (no
		// CAP_NET_ADMIN over the namespace): then it is not tried again.
		if !m.bufferRefused.Load() {
			err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, monitorBuffer)
			if errors.Is(err, unix.EPERM) {
				m.bufferRefused.Store(true)
			} else if err != nil {
				unix.Close(fd)
				return err
			}
		}
		sock = os.NewFile(uintptr(fd), "netlink monitor")
		return nil
	})
	if err != nil {
		return false
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		sock.Close()
		return false
	}
	stopped := make(chan struct{})
	go func() { // closing the socket ends a read waiting on it
		select {
		case <-m.stop:
			sock.Close()
		case <-stopped:
		}
	}()
	defer close(stopped)
	defer sock.Close() // closed when follow returns (the namespace may go right after)
	m.subscriptions.Add(1)
	m.markAll() // after subscribing, so no change falls between the reads and the events
	buf := make([]byte, 64<<10)
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			var from unix.Sockaddr
			var flags int
			for {
				n, _, flags, from, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
				if rerr != unix.EINTR {
					break
				}
			}
			if rerr == nil {
				if flags&unix.MSG_TRUNC != 0 {
					rerr = unix.EMSGSIZE // messages were cut: read everything afresh
				} else if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
					n = 0 // not from the kernel
				}
			}
			return rerr != unix.EAGAIN
		})
		select {
		case <-m.stop:
			return true
		default:
		}
		if err != nil || rerr != nil {
			return false // ENOBUFS: events were lost; subscribe again and read afresh
		}
		parseMonitorMessages(buf[:n], m.mark)
	}
}

// movedAway reports whether an RTM_DELLINK's body (ifinfomsg and attributes) says the
// link went to another network namespace (IFLA_NEW_NETNSID), not away for good.
func movedAway(data []byte) bool {
	const ifinfoLen = 16
	if len(data) < ifinfoLen {
		return false
	}
	for a := data[ifinfoLen:]; len(a) >= unix.SizeofRtAttr; {
		l := int(binary.NativeEndian.Uint16(a[0:2]))
		typ := binary.NativeEndian.Uint16(a[2:4]) &^ unix.NLA_F_NESTED
		if l < unix.SizeofRtAttr || l > len(a) {
			return false
		}
		if typ == unix.IFLA_NEW_NETNSID {
			return true
		}
		al := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if al >= len(a) {
			return false
		}
		a = a[al:]
	}
	return false
}

// parseMonitorMessages calls mark with the interface index and what changed for each
// link and address message in b (a netlink datagram); anything else is skipped.
func parseMonitorMessages(b []byte, mark func(index int, bits uint32)) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return
		}
		data := b[unix.NLMSG_HDRLEN:l]
		// ifinfomsg and ifaddrmsg both carry the index at offset 4.
		if len(data) >= 8 {
			index := int(int32(binary.NativeEndian.Uint32(data[4:8])))
			switch typ {
			case unix.RTM_NEWLINK:
				mark(index, dirtyLink|dirtyGroups) // up joins the all-hosts groups
			case unix.RTM_DELLINK:
				if movedAway(data) {
					mark(index, dirtyMoved) // ip link set DEV netns X
				} else {
					mark(index, dirtyGone)
				}
			case unix.RTM_NEWADDR, unix.RTM_DELADDR:
				mark(index, dirtyAddrs|dirtyGroups) // an IPv6 address has a solicited-node group
			}
		}
		al := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
		if al >= len(b) {
			return
		}
		b = b[al:]
	}
}
