//go:build linux

package kernel

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"
)

// tunPath is the TUN clone device; tests replace it to simulate a missing device.
var tunPath = "/dev/net/tun"

// vnetHdrLen is sizeof(struct virtio_net_hdr), the header in front of every packet
// read from or written to an IFF_VNET_HDR TUN.
const vnetHdrLen = 10

const (
	tunCsum = unix.TUN_F_CSUM
	tunTSO  = unix.TUN_F_TSO4 | unix.TUN_F_TSO6
	tunUSO  = unix.TUN_F_USO4 | unix.TUN_F_USO6
)

// Device is one TUN device. Read, Write and the control methods may be called
// concurrently; Read calls are serialised among themselves, as are Write calls.
type Device struct {
	name   string
	ns     netns.NsHandle // open for a named namespace; None for the process's own
	worker *nsWorker      // the namespace's thread, held while the device is open
	nsTag  string         // for error messages: "" or " (netns NAME)"
	h      *netlink.Handle
	index  int
	link   netlink.Link // index-only stub for netlink calls
	q      []*Queue     // the TUN's queues; q[0] made the device
	batch  int
	uso    bool // kernel accepts TUN_F_USO4|USO6

	mtu atomic.Int64 // last MTU set through this package (Read's buffer check)
	gro atomic.Bool

	offMu    sync.Mutex
	offloads Offloads

	setMu     sync.Mutex  // SetMTU and SetUp against linkState's comparison
	up        bool        // IFF_UP as last set or reported (under setMu)
	noMcast   bool        // IFF_MULTICAST off as last set or reported (under setMu); a TUN starts with it on
	user      uint32      // IFF_PROMISC|IFF_ALLMULTI as last set or reported (under setMu)
	feat      DevFeatures // ethtool -k as last read after our change or reported (under setMu)
	featKnown bool
	carrier   bool   // as last set (under setMu): a device starts without one
	txq       int    // txqueuelen as last set or seen (under setMu); from the device at Open
	alias     string // ifalias as last set or seen (under setMu); from the device at Open
	speed     int    // the link speed SetSpeed last set (under setMu): -1 unknown, 0 none yet
	// now is the device's name as last set or seen (ip link set name); name stays
	// the one it was opened with, for messages.
	now atomic.Pointer[string]

	mu       sync.RWMutex // control ops hold it shared; Close exclusively
	closed   bool
	done     chan struct{}
	unlisted chan struct{} // closed once the closer found the device gone (Delete waits)
	watchers sync.WaitGroup
	mon      *monitor

	wmuW     sync.Mutex
	watches  []*watcher // replaced, never modified in place
	watchOff bool       // Close has begun: no watch goroutine starts (under wmuW)
}

// Open creates the TUN device cfg.Name in cfg.NetNS (creating the namespace when
// missing), sets its MTU and offloads, and returns it administratively down without a
// carrier (SetCarrier gives it one). Errors name the device and the reason;
// errors.Is(err, ErrUnavailable) reports that the kernel bridge cannot work here (no
// /dev/net/tun, no privilege), errors.Is(err, ErrExists) that the name is taken in
// that namespace, and errors.Is(err, ErrNamespaceGone) that the namespace was deleted
// while this process had devices in it.
func Open(cfg Config) (_ *Device, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Device{name: cfg.Name, done: make(chan struct{}), unlisted: make(chan struct{}), ns: netns.None()}
	if cfg.NetNS != "" {
		d.nsTag = " (netns " + cfg.NetNS + ")"
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("kernel bridge: %s%s: "+format, append([]any{d.name, d.nsTag}, args...)...)
	}
	defer func() {
		if err != nil {
			d.release()
		}
	}()

	if cfg.NetNS != "" {
		// The namespace's thread for the device's calls (inNetNS), its namespace file
		// and its netlink handle, shared by the namespace's devices.
		w, err := openNetNS(cfg.NetNS)
		if err != nil {
			if denied(err) {
				return nil, fmt.Errorf("%w: %s%s: %w", ErrUnavailable, d.name, d.nsTag, err)
			}
			return nil, fail("%w", err)
		}
		d.worker, d.ns, d.h = w, w.ns, w.h
	} else if d.h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil { // this namespace
		if denied(err) {
			return nil, fmt.Errorf("%w: %s%s: netlink: %w", ErrUnavailable, d.name, d.nsTag, err)
		}
		return nil, fail("netlink: %w", err)
	}
	if _, lerr := d.h.LinkByName(cfg.Name); lerr == nil {
		return nil, fail("%w", ErrExists)
	} else if _, notFound := lerr.(netlink.LinkNotFoundError); !notFound {
		return nil, fail("look up existing device: %w", lerr)
	}

	var fd int
	if err = d.inNS(func() (e error) { fd, e = createTUN(cfg.Name, cfg.Queues > 1); return e }); err != nil {
		var ue unavailableError
		if errors.As(err, &ue) {
			return nil, fmt.Errorf("%w: %s%s: %w", ErrUnavailable, d.name, d.nsTag, ue.err)
		}
		return nil, fail("%w", err)
	}
	q, err := newQueue(d, fd)
	if err != nil {
		return nil, fail("TUN setup: %w", err)
	}
	d.q = append(d.q, q)
	d.batch = q.tun.BatchSize()
	// The other queues attach before the offloads are set: each queue's setup sets
	// the device's TUNSETOFFLOAD flags to wireguard's.
	for k := 1; k < cfg.Queues; k++ {
		if err = d.inNS(func() (e error) { fd, e = attachQueue(cfg.Name); return e }); err != nil {
			return nil, fail("queue %d: %w", k, err)
		}
		if q, err = newQueue(d, fd); err != nil {
			return nil, fail("queue %d: TUN setup: %w", k, err)
		}
		d.q = append(d.q, q)
	}

	l, err := d.h.LinkByName(cfg.Name)
	if err != nil {
		return nil, fail("look up new device: %w", err)
	}
	// The queues are the device's: a device renamed or deleted while they attached
	// would leave some of them on a new device of the name, with fewer queues.
	if tt, ok := l.(*netlink.Tuntap); ok && cfg.Queues > 1 && tt.Queues != cfg.Queues {
		return nil, fail("%d of %d queues attached to the device (renamed or deleted meanwhile?)", tt.Queues, cfg.Queues)
	}
	d.index = l.Attrs().Index
	d.noMcast = l.Attrs().RawFlags&unix.IFF_MULTICAST == 0
	d.user = l.Attrs().RawFlags & UserFlagMask
	d.txq = l.Attrs().TxQLen
	d.alias = l.Attrs().Alias
	d.link = &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: d.index, Name: d.name}}
	d.mtu.Store(int64(l.Attrs().MTU))
	// Never let the kernel build a super-packet with more segments than one Read can
	// return (wireguard's split fails with ErrTooManySegments otherwise). Best effort:
	// the kernel may refuse gso_max_segs changes on a live device.
	if l.Attrs().GSOMaxSegs == 0 || int(l.Attrs().GSOMaxSegs) > d.batch {
		_ = d.h.LinkSetGSOMaxSegs(d.link, d.batch)
	}
	if cfg.MTU != 0 {
		if err := d.h.LinkSetMTU(d.link, cfg.MTU); err != nil {
			return nil, fail("set MTU %d: %w", cfg.MTU, err)
		}
		d.mtu.Store(int64(cfg.MTU))
	}
	// No carrier until the engine says so (a TUN starts with one): its first
	// SetCarrier(true) is then a transition, which makes the kernel's operstate "up"
	// (it stays "unknown" on a carrier never switched).
	if err := d.ioctl(func(fd int) error { return unix.IoctlSetPointerInt(fd, unix.TUNSETCARRIER, 0) }); err != nil {
		return nil, fail("clear carrier: %w", err)
	}
	// Probe UDP segmentation offload (Linux >= 6.2) once.
	d.uso = d.ioctlOffload(tunCsum|tunTSO|tunUSO) == nil
	if err := d.applyOffloads(cfg.Offloads); err != nil {
		return nil, fail("%w", err)
	}
	if err := register(d); err != nil {
		return nil, fail("netlink monitor: %w", err)
	}
	return d, nil
}

// createTUN opens the clone device and creates the TUN in the namespace of the calling
// thread. IFF_TUN_EXCL makes the kernel refuse an existing name instead of attaching
// to a persistent TUN of that name.
func createTUN(name string, multiQueue bool) (int, error) {
	fd, err := unix.Open(tunPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		err = &os.PathError{Op: "open", Path: tunPath, Err: err}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV) ||
			errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return -1, unavailableError{err}
		}
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(tunFlags(multiQueue) | unix.IFF_TUN_EXCL)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.EPERM):
			return -1, unavailableError{fmt.Errorf("create TUN (needs CAP_NET_ADMIN): %w", err)}
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EEXIST):
			return -1, fmt.Errorf("create TUN: %w (%w)", ErrExists, err)
		}
		return -1, fmt.Errorf("create TUN: %w", err)
	}
	return checkQueue(fd, name, ifr)
}

// checkQueue checks a TUN file descriptor that TUNSETIFF gave name before wireguard's
// setup takes it: the kernel's name, and the CSUM|TSO4|TSO6 offloads that setup
// requires with IFF_VNET_HDR. Here a failure still lets us close the fd cleanly (it
// does: the fd is returned only without an error).
func checkQueue(fd int, name string, ifr *unix.Ifreq) (int, error) {
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNGETIFF: %w", err)
	}
	if got := ifr.Name(); got != name {
		unix.Close(fd)
		return -1, fmt.Errorf("kernel named the TUN %q", got)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunCsum|tunTSO); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETOFFLOAD: %w", err)
	}
	return fd, nil
}

// tunFlags are the TUNSETIFF flags of the device's queues.
func tunFlags(multiQueue bool) uint16 {
	f := uint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if multiQueue {
		f |= unix.IFF_MULTI_QUEUE
	}
	return f
}

// attachQueue opens another queue of the multi-queue TUN name in the namespace of the
// calling thread (TUNSETIFF of an existing device with the same flags attaches).
func attachQueue(name string) (int, error) {
	fd, err := unix.Open(tunPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: tunPath, Err: err}
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(tunFlags(true))
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("attach TUN queue: %w", err)
	}
	// (Without IFF_TUN_EXCL the attach makes a new device should the name have gone
	// meanwhile: Open counts the queues after.)
	return checkQueue(fd, name, ifr)
}

// closeQueues closes the device's queues, the first last: the kernel unregisters the
// device when its last queue closes.
func (d *Device) closeQueues() error {
	var errs []error
	for k := len(d.q) - 1; k >= 0; k-- {
		if err := d.q[k].tun.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// denied reports a privilege error (the process may not enter or create namespaces).
func denied(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
}

// unavailableError marks a createTUN failure that means the kernel bridge cannot work.
type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }

// release frees what Open acquired (after a failed Open or at the end of Close).
func (d *Device) release() {
	_ = d.closeQueues()
	if d.worker != nil { // the namespace file and handle are the worker's
		d.worker.release()
		// Nothing of the device may use them now: a closed handle would open a socket
		// in the calling thread's namespace instead of failing.
		d.worker, d.h, d.ns = nil, nil, netns.None()
		return
	}
	if d.h != nil {
		d.h.Close()
	}
	if d.ns.IsOpen() {
		d.ns.Close()
	}
}

// Index returns the kernel's interface index of the device.
func (d *Device) Index() int { return d.index }

// MTU is the device's MTU as this package last set or saw it (ip link set mtu).
func (d *Device) MTU() int { return int(d.mtu.Load()) }

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// currentName is the device's name as this package last set or saw it.
func (d *Device) currentName() string {
	if n := d.now.Load(); n != nil {
		return *n
	}
	return d.name
}

// BatchSize is the number of buffers Read wants (and the best Write batch): 128.
func (d *Device) BatchSize() int { return d.batch }

func (d *Device) errorf(format string, args ...any) error {
	return fmt.Errorf("kernel bridge: %s%s: "+format, append([]any{d.name, d.nsTag}, args...)...)
}

// ioErr maps a TUN I/O error; a closed device reports os.ErrClosed.
func (d *Device) ioErr(op string, err error) error {
	if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) || errors.Is(err, unix.EBADFD) {
		return d.errorf("%s: %w", op, os.ErrClosed)
	}
	return d.errorf("%s: %w", op, err)
}

// readIOErr is ioErr for a read or a wait: once Close or Delete has begun, whatever the
// descriptor answers is os.ErrClosed, and so it is once the kernel has unregistered
// the device (ip link del, a deleted namespace, CloseAll's request): the descriptor
// then polls as an error (EPOLLERR, which the runtime reports as "not pollable") on
// every read until it is closed, and a reader that took that for a passing error spun
// on it, thousands of log lines at every daemon's stop.
func (d *Device) readIOErr(op string, err error) error {
	select {
	case <-d.done:
		return d.errorf("%s: %w", op, os.ErrClosed)
	default:
	}
	if d.unregistered() {
		return d.errorf("%s: %w: %w", op, ErrUnregistered, os.ErrClosed)
	}
	return d.ioErr(op, err)
}

// unregistered reports whether the descriptor polls as an error: a TUN file does once
// its device is gone (tun_chr_poll), and for good.
func (d *Device) unregistered() bool {
	var gone bool
	_ = d.q[0].rc.Control(func(fd uintptr) { // any queue's: the device's state
		gone = pollNow(fd)&unix.POLLERR != 0
	})
	return gone
}

// ShortBuffer reports that a Read failed because a packet, or a segment of a
// super-packet, needs buffers of need bytes: the device's MTU was raised while the
// Read was waiting with buffers of the old one. The packet is kept; the next Read with
// buffers that large returns it.
func ShortBuffer(err error) (need int, ok bool) {
	var small *tun.BufferTooSmallError
	if errors.As(err, &small) {
		return small.Need, true
	}
	return 0, false
}

func isClosed(err error) bool {
	return errors.Is(err, os.ErrClosed) || errors.Is(err, unix.EBADFD)
}

// control runs fn with the netlink handle unless the device is closed.
func (d *Device) control(fn func() error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return d.errorf("%w", os.ErrClosed)
	}
	return fn()
}

// ioctl runs fn on the TUN file descriptor.
func (d *Device) ioctl(fn func(fd int) error) error {
	var ierr error
	if err := d.q[0].rc.Control(func(fd uintptr) { ierr = fn(int(fd)) }); err != nil { // the device's ioctls: any queue's
		return err
	}
	return ierr
}

func (d *Device) ioctlOffload(flags int) error {
	return d.ioctl(func(fd int) error { return unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, flags) })
}

// SetMTU changes the MTU of the kernel device (in its namespace).
func (d *Device) SetMTU(mtu int) error { return d.setMTU(mtu, false) }

// SetMTUIfChanged, SetUpIfChanged and SetTxQueueLenIfChanged set the value unless the
// device holds it as this package last set or saw it. They are for a value the engine
// took from the device (ip link set): pushing it back would undo a newer one someone
// set since, which the device holds then as far as this package knows, whereas a
// device this package changed meanwhile (the engine's own change) must get it.
func (d *Device) SetMTUIfChanged(mtu int) error { return d.setMTU(mtu, true) }

func (d *Device) setMTU(mtu int, ifChanged bool) error {
	return d.setLink(fmt.Sprintf("MTU %d", mtu), ifChanged,
		func() bool { return d.mtu.Load() == int64(mtu) },
		func() error { return d.h.LinkSetMTU(d.link, mtu) },
		func() { d.mtu.Store(int64(mtu)) })
}

// setLink is the link setters' common part: under setMu, unless ifChanged and the
// device holds the value as far as the package knows (holds), apply sets it and record
// notes it as the package's own (what names it in the error).
func (d *Device) setLink(what string, ifChanged bool, holds func() bool, apply func() error, record func()) error {
	return d.control(func() error {
		d.setMu.Lock()
		defer d.setMu.Unlock()
		if ifChanged && holds() {
			return nil
		}
		if err := apply(); err != nil {
			return d.errorf("set %s: %w", what, err)
		}
		record()
		return nil
	})
}

// SetOffloads switches offloads at run time: checksum and TSO through TUNSETOFFLOAD
// (the kernel stops/starts handing over super-packets at once, also on established
// connections), GRO for the following Write calls. TSO without TxChecksum is recorded as
// TSO off, as ethtool does.
func (d *Device) SetOffloads(o Offloads) error { return d.setOffloads(o, false) }

// SetOffloadsIfChanged is SetOffloads for offloads taken from the device (ethtool -K):
// when the device shows them as last read, it is not written again, since it may hold
// a newer change by now (the watch reports that one next); only Write's GRO follows.
func (d *Device) SetOffloadsIfChanged(o Offloads) error { return d.setOffloads(o, true) }

func (d *Device) setOffloads(o Offloads, ifChanged bool) error {
	return d.control(func() error {
		d.setMu.Lock()
		defer d.setMu.Unlock()
		if e := o.effective(); ifChanged && d.featKnown && d.feat.TxChecksum == e.TxChecksum && d.feat.TSO == e.TSO && d.feat.GRO == e.GRO {
			d.offMu.Lock()
			d.offloads = e
			d.gro.Store(e.GRO)
			d.offMu.Unlock()
			return nil
		}
		if err := d.applyOffloads(o); err != nil {
			return d.errorf("%w", err)
		}
		// What the kernel shows now is ours, not someone's ethtool -K.
		if f, err := d.deviceFeatures(""); err == nil {
			d.feat, d.featKnown = f, true
		}
		return nil
	})
}

func (d *Device) applyOffloads(o Offloads) error {
	o = o.effective()
	// TUNSETOFFLOAD says what this reader can take, and the TUN driver lets ethtool
	// enable no more than that: it stays at checksum and TCP segmentation, so that
	// `ethtool -K tso on` works on the device. What the kernel actually does is the
	// device's features, set below as ethtool would. UDP segmentation has no legacy
	// ethtool switch, so it follows large send here.
	flags := tunCsum | tunTSO
	if o.TSO && d.uso {
		flags |= tunUSO
	}
	d.offMu.Lock()
	defer d.offMu.Unlock()
	if err := d.ioctlOffload(flags); err != nil {
		return fmt.Errorf("TUNSETOFFLOAD %#x (%v): %w", flags, o, err)
	}
	if err := d.setFeatures(o.TxChecksum, o.TSO, o.GRO); err != nil {
		return fmt.Errorf("ethtool features (%v): %w", o, err)
	}
	d.offloads = o
	d.gro.Store(o.GRO)
	return nil
}

// Offloads returns the offloads in effect.
func (d *Device) Offloads() Offloads {
	d.offMu.Lock()
	defer d.offMu.Unlock()
	return d.offloads
}

// AddAddr adds an IPv4 or IPv6 address (with its broadcast, if valid) to the device;
// an address it already has is not an error.
func (d *Device) AddAddr(p netip.Prefix, broadcast netip.Addr) error {
	return d.control(func() error {
		a := nlAddr(p)
		if broadcast.IsValid() {
			a.Broadcast = broadcast.AsSlice()
		}
		if err := d.h.AddrAdd(d.link, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return d.errorf("add address %s: %w", p, err)
		}
		return nil
	})
}

// DelAddr removes an address; one the device does not have is not an error.
func (d *Device) DelAddr(p netip.Prefix) error {
	return d.control(func() error {
		if err := d.h.AddrDel(d.link, nlAddr(p)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return d.errorf("delete address %s: %w", p, err)
		}
		return nil
	})
}

// SetName renames the device (the kernel refuses while it is up: EBUSY).
func (d *Device) SetName(name string) error {
	if err := validName(name); err != nil {
		return d.errorf("rename: %w", err)
	}
	return d.control(func() error {
		if err := d.h.LinkSetName(d.link, name); err != nil {
			return d.errorf("rename to %s: %w", name, err)
		}
		d.now.Store(&name)
		return nil
	})
}

// SetTxQueueLen sets the device's transmit queue length.
func (d *Device) SetTxQueueLen(n int) error { return d.setTxQueueLen(n, false) }

// SetTxQueueLenIfChanged: see SetMTUIfChanged.
func (d *Device) SetTxQueueLenIfChanged(n int) error { return d.setTxQueueLen(n, true) }

func (d *Device) setTxQueueLen(n int, ifChanged bool) error {
	return d.setLink(fmt.Sprintf("txqueuelen %d", n), ifChanged,
		func() bool { return d.txq == n },
		func() error { return d.h.LinkSetTxQLen(d.link, n) },
		func() { d.txq = n })
}

// SetAlias sets the device's alias (ip link set alias); "" removes it.
func (d *Device) SetAlias(s string) error { return d.setAlias(s, false) }

// SetAliasIfChanged: see SetMTUIfChanged.
func (d *Device) SetAliasIfChanged(s string) error { return d.setAlias(s, true) }

func (d *Device) setAlias(s string, ifChanged bool) error {
	return d.setLink(fmt.Sprintf("alias %q", s), ifChanged,
		func() bool { return d.alias == s },
		func() error { return d.h.LinkSetAlias(d.link, s) },
		func() { d.alias = s })
}

// SetMulticast sets or clears IFF_MULTICAST on the kernel device (ip link set multicast).
func (d *Device) SetMulticast(on bool) error { return d.setMulticast(on, false) }

// SetMulticastIfChanged: see SetMTUIfChanged.
func (d *Device) SetMulticastIfChanged(on bool) error { return d.setMulticast(on, true) }

func (d *Device) setMulticast(on, ifChanged bool) error {
	return d.setLink(fmt.Sprintf("multicast %v", on), ifChanged,
		func() bool { return d.noMcast == !on },
		func() error {
			if on {
				return d.h.LinkSetMulticastOn(d.link)
			}
			return d.h.LinkSetMulticastOff(d.link)
		},
		func() { d.noMcast = !on })
}

// UserFlagMask are the flags users set on a device that the engine follows without
// using them (promiscuous and all-multicast mean nothing to IPoIB's link, which has no
// address filter): IFF_PROMISC and IFF_ALLMULTI.
const UserFlagMask = unix.IFF_PROMISC | unix.IFF_ALLMULTI

// SetUserFlags sets IFF_PROMISC and IFF_ALLMULTI on the kernel device as f has them
// (ip link set promisc/allmulticast on|off).
func (d *Device) SetUserFlags(f uint32) error { return d.setUserFlags(f, false) }

// SetUserFlagsIfChanged: see SetMTUIfChanged.
func (d *Device) SetUserFlagsIfChanged(f uint32) error { return d.setUserFlags(f, true) }

func (d *Device) setUserFlags(f uint32, ifChanged bool) error {
	f &= UserFlagMask
	return d.setLink(fmt.Sprintf("flags %#x", f), ifChanged,
		func() bool { return d.user == f },
		func() error {
			set := []struct {
				bit     uint32
				on, off func(netlink.Link) error
			}{
				{unix.IFF_PROMISC, d.h.SetPromiscOn, d.h.SetPromiscOff},
				{unix.IFF_ALLMULTI, d.h.LinkSetAllmulticastOn, d.h.LinkSetAllmulticastOff},
			}
			for _, s := range set {
				if (d.user^f)&s.bit == 0 {
					continue
				}
				op := s.off
				if f&s.bit != 0 {
					op = s.on
				}
				if err := op(d.link); err != nil {
					return err
				}
				d.user ^= s.bit // each as it is done: a failure in the second keeps the first
			}
			return nil
		},
		func() { d.user = f })
}

// SetUp sets or clears IFF_UP on the kernel device.
func (d *Device) SetUp(up bool) error { return d.setUp(up, false) }

// SetUpIfChanged: see SetMTUIfChanged.
func (d *Device) SetUpIfChanged(up bool) error { return d.setUp(up, true) }

func (d *Device) setUp(up, ifChanged bool) error {
	return d.setLink(fmt.Sprintf("up=%v", up), ifChanged,
		func() bool { return d.up == up },
		func() error {
			if up {
				return d.h.LinkSetUp(d.link)
			}
			return d.h.LinkSetDown(d.link)
		},
		func() { d.up = up })
}

// SetCarrier sets the carrier of the TUN (TUNSETCARRIER, Linux >= 5.0). An
// administratively up device without carrier shows NO-CARRIER and the kernel does not
// route through it.
func (d *Device) SetCarrier(on bool) error {
	return d.control(func() error {
		d.setMu.Lock()
		defer d.setMu.Unlock()
		if err := d.setCarrierLocked(on); err != nil {
			return d.errorf("set carrier %v: %w", on, err)
		}
		return nil
	})
}

// setCarrierLocked sets the carrier and records it. Called with setMu held.
func (d *Device) setCarrierLocked(on bool) error {
	v := 0
	if on {
		v = 1
	}
	if err := d.ioctl(func(fd int) error { return unix.IoctlSetPointerInt(fd, unix.TUNSETCARRIER, v) }); err != nil {
		return err
	}
	d.carrier = on
	return nil
}

// Addrs returns the addresses the kernel has on the device (in its namespace), IPv4
// and IPv6 in kernel order, without zones.
func (d *Device) Addrs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := d.control(func() error {
		var addrs []netlink.Addr
		var err error
		for range 5 { // a dump interrupted by a concurrent change is retried
			addrs, err = d.h.AddrList(d.link, netlink.FAMILY_ALL)
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return d.errorf("list addresses: %w", err)
		}
		out = make([]netip.Prefix, 0, len(addrs))
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok {
				out = append(out, p)
			}
		}
		return nil
	})
	return out, err
}

// Close removes the device from the kernel (closing the TUN deletes it), stops address
// watches and unblocks pending Read/Write calls, which then report os.ErrClosed.
// Closing twice is a no-op.
func (d *Device) Close() error {
	if !d.beginClose() {
		return nil
	}
	return d.finishClose()
}

// waitUnlistedByOther is Delete's wait when another Close, Delete or CloseAll closes
// the device: until it no longer lists the device either.
func (d *Device) waitUnlistedByOther() { <-d.unlisted }

// Delete is Close for a caller that needs the device gone, not released: it returns
// once the kernel no longer lists the device in its namespace (ip link and
// /sys/class/net do not show it) and leaves the rest of the kernel's release, about
// 20 ms a device (the RCU barrier after every unregistration), to a goroutine. One
// delete_child after another then takes about a millisecond where each took the full
// release (a thousand children 20 s), and the releases overlap. At most maxReleasing
// are outstanding (each holds a thread in close(2)); WaitReleased waits for them. An
// error of a release that ends after Delete returned is logged. A device someone moved
// to another namespace is deleted there, and Delete returns once it is released. (If a reader is blocked on the
// device, the final close, and so the wait for the release, may fall to the reader's
// thread instead, which then stays with the runtime.)
func (d *Device) Delete() error {
	if !d.beginClose() {
		d.waitUnlistedByOther()
		return nil
	}
	// No watch event runs once Delete returns, as with Close (a running one ends at
	// its next look at done).
	d.watchers.Wait()
	// A device someone moved to another namespace (and the watch has not put back)
	// is not listed here at all: Delete then waits for the kernel's release, which
	// removes it there.
	moved := d.movedAway()
	releasing <- struct{}{}
	tunClosed := make(chan struct{})
	polled := make(chan struct{}) // Delete no longer uses the netlink handle
	result := make(chan error, 1)
	var returned bool // written before polled is closed
	go func() {
		// The thread blocked in close(2) for the release exits with this goroutine
		// (locked and never unlocked): the runtime keeps idle threads for good, and a
		// burst of deletes left dozens of them (48 KiB of stacks each).
		runtime.LockOSThread()
		defer func() { <-releasing }()
		if beforeRelease != nil {
			beforeRelease()
		}
		err := d.closeQueues()
		close(tunClosed)
		<-polled
		err = d.finishRelease(err)
		if !returned {
			result <- err
		} else if err != nil {
			log.Print(err)
		}
	}()
	if !moved {
		returned = d.waitUnlisted(tunClosed)
	}
	close(polled)
	if returned {
		close(d.unlisted)
		return nil
	}
	err := <-result
	close(d.unlisted)
	return err
}

// beforeRelease, when set (tests), runs in Delete's goroutine before it closes the TUN.
var beforeRelease func()

// movedAway reports whether the device is in another network namespace than its own.
func (d *Device) movedAway() bool {
	var moved bool
	err := d.ioctl(func(fd int) error {
		n, err := unix.IoctlRetInt(fd, unix.TUNGETDEVNETNS)
		if err != nil {
			return err
		}
		there := netns.NsHandle(n)
		defer there.Close()
		home := d.ns
		if !home.IsOpen() {
			h, err := netns.Get() // not a namespace worker's thread: the process's
			if err != nil {
				return err
			}
			defer h.Close()
			home = h
		}
		moved = !there.Equal(home)
		return nil
	})
	return err == nil && moved
}

// waitUnlisted reports true once the kernel no longer finds the device by its index,
// false when the TUN's close returned first.
func (d *Device) waitUnlisted(tunClosed <-chan struct{}) bool {
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 2*time.Millisecond) {
		select {
		case <-tunClosed:
			return false
		case <-time.After(wait):
		}
		// The kernel takes the device out of its tables and out of sysfs with RTNL
		// held, and a query by index waits for RTNL: not found means all of it is done.
		if _, err := d.h.LinkByIndex(d.index); errors.As(err, new(netlink.LinkNotFoundError)) {
			return true
		}
	}
}

// maxReleasing bounds the releases Delete leaves running.
const maxReleasing = 64

var releasing = make(chan struct{}, maxReleasing)

// releasedMu makes WaitReleased callers take the slots one after the other (two
// taking some each would wait for each other for good).
var releasedMu sync.Mutex

// WaitReleased waits until the kernel has released every device Delete removed.
func WaitReleased() {
	releasedMu.Lock()
	defer releasedMu.Unlock()
	for range maxReleasing {
		releasing <- struct{}{}
	}
	for range maxReleasing {
		<-releasing
	}
}

// beginClose marks the device closed and stops following it; false: closed already.
func (d *Device) beginClose() bool {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false
	}
	d.closed = true
	close(d.done)
	d.mu.Unlock()
	d.wmuW.Lock()
	d.watchOff = true
	d.wmuW.Unlock()
	if d.mon != nil {
		d.mon.unregister(d) // before the device goes: its removal is ours, not "Gone"
	}
	return true
}

// finishClose closes the TUN, which deletes the device unless CloseAll has, and
// releases what the device holds.
func (d *Device) finishClose() error {
	defer close(d.unlisted)
	return d.finishRelease(d.closeQueues())
}

// finishRelease is finishClose once the TUN is closed (with err).
func (d *Device) finishRelease(err error) error {
	d.watchers.Wait()
	// The kernel unregisters a non-persistent TUN when its last fd closes; delete it
	// explicitly should it still be there (someone made it persistent).
	if l, lerr := d.h.LinkByIndex(d.index); lerr == nil && l.Attrs().Name == d.currentName() && l.Type() == "tuntap" {
		if derr := d.h.LinkDel(l); derr != nil {
			err = errors.Join(err, derr)
		}
	}
	d.release()
	if err != nil {
		return d.errorf("close: %w", err)
	}
	return nil
}

// SetLinkLocal replaces the kernel's own IPv6 link-local address generation with a
// fixed address (IPoIB derives it from the port GUID): address generation mode "none",
// then addr/64 added without DAD. Call it before bringing the device up.
func (d *Device) SetLinkLocal(addr netip.Addr) error {
	return d.control(func() error { return d.setLinkLocal(addr, nil) })
}

// setLinkLocal sets generation mode none, removes the stale link-local addresses and
// adds addr/64 without DAD.
func (d *Device) setLinkLocal(addr netip.Addr, stale []netlink.Addr) error {
	const addrGenModeNone = 1 // IN6_ADDR_GEN_MODE_NONE
	if err := d.h.LinkSetIP6AddrGenMode(d.link, addrGenModeNone); err != nil {
		return d.errorf("set IPv6 address generation mode none: %w", err)
	}
	for _, a := range stale {
		_ = d.h.AddrDel(d.link, &a)
	}
	a := nlAddr(netip.PrefixFrom(addr, 64))
	a.Flags = unix.IFA_F_NODAD
	if err := d.h.AddrAdd(d.link, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return d.errorf("add link-local %s: %w", addr, err)
	}
	return nil
}

// nlAddr is a prefix as netlink takes it.
func nlAddr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
}

// linkMissing reports whether the device's index names no link of its namespace.
func (d *Device) linkMissing() bool {
	var missing bool
	_ = d.control(func() error {
		_, err := d.h.LinkByIndex(d.index)
		var lnf netlink.LinkNotFoundError
		missing = errors.As(err, &lnf) || errors.Is(err, unix.ENODEV)
		return nil
	})
	return missing
}

// moveBack brings the device back to its namespace from the one someone moved it to.
// The engine keeps the device where it made it: its netlink handle, its watch and the
// interface's configuration are that namespace's. The kernel takes a device down when
// it moves it; it is brought up again if it was up. It must come back with the index
// it had (the kernel keeps it unless another device took it meanwhile).
func (d *Device) moveBack() error {
	return d.control(func() error {
		d.setMu.Lock()
		defer d.setMu.Unlock()
		var there netns.NsHandle
		var name string
		if err := d.ioctl(func(fd int) error {
			n, err := unix.IoctlRetInt(fd, unix.TUNGETDEVNETNS)
			if err != nil {
				return err
			}
			there = netns.NsHandle(n)
			ifr, err := unix.NewIfreq("")
			if err != nil {
				return err
			}
			if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
				return err
			}
			name = ifr.Name()
			return nil
		}); err != nil {
			return d.errorf("moved to another network namespace; finding it: %w", err)
		}
		defer there.Close()
		home := d.ns
		if !home.IsOpen() {
			h, err := netns.Get() // not a namespace worker's thread: the process's
			if err != nil {
				return d.errorf("moved to another network namespace; this one: %w", err)
			}
			defer h.Close()
			home = h
		}
		if there.Equal(home) {
			return nil // back already (another watch of the device put it back)
		}
		hx, err := netlink.NewHandleAt(there)
		if err != nil {
			return d.errorf("moved to another network namespace as %s: %w", name, err)
		}
		defer hx.Close()
		l, err := hx.LinkByName(name)
		if err == nil {
			err = hx.LinkSetNsFd(l, int(home))
		}
		if err != nil {
			return d.errorf("moved to another network namespace as %s, not put back: %w", name, err)
		}
		nl, err := d.h.LinkByIndex(d.index)
		if err != nil || nl.Attrs().Name != name {
			return d.errorf("put back from another network namespace as %s, not at index %d: %v", name, d.index, err)
		}
		if name != d.currentName() {
			d.now.Store(&name)
		}
		if d.up {
			if err := d.h.LinkSetUp(d.link); err != nil {
				return d.errorf("put back from another network namespace; up: %w", err)
			}
		}
		return nil
	})
}
