package main

import (
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"syscall"
	"time"

	"ipoibfs/ipoib"
	"ipoibfs/ipoib/kernel"
)

// bridge connects one engine interface to its TUN device: the device is the
// interface's Host (received packets, MTU, carrier, offloads) and a reader goroutine
// per TUN queue feeds what the kernel sends out of the device into
// Interface.Transmit. Received packets are spread over the queues by flow (flowQueue),
// and the kernel sends each flow's packets out of the queue it last wrote one of the
// flow's packets to, so a flow stays on one queue both ways and flows spread over the
// readers.
type bridge struct {
	i    *ipoib.Interface
	dev  *kernel.Device
	bs   *bridges
	done chan struct{} // closed when the readers end, or by close if they never ran
	// txOnce starts the readers when the device first comes up (a device that is down
	// sends nothing, and most children are never brought up), or, in stopReader,
	// marks them as never to start.
	txOnce sync.Once

	adopter
}

// adopter records what a device's onLink is making the engine take from the device.
// The Host calls that change causes push that value only if the device does not hold
// it as far as the kernel package knows (kernel.Device's ...IfChanged): the device
// may hold a newer one by then (ip link set down; up: the engine's "down" reached the
// device after the user's "up" and left it down), but if the engine changed the
// device meanwhile, the adopted value must still reach it. A different value (an MTU
// the engine refused or lowered) goes to the device as always.
type adopter struct {
	adoptMu  sync.Mutex
	adopting adoption
	// failed: attributes whose last push to the device failed (a bit per attr): the
	// device kept its older value, so the engine's and the device's stay apart until
	// a push succeeds, and a change someone makes on the device meanwhile is the
	// newest and is taken as it is (outOfSync).
	failed uint32
}

// outOfSync says whether the engine's last push of a to the device failed.
func (d *adopter) outOfSync(a attr) bool {
	d.adoptMu.Lock()
	defer d.adoptMu.Unlock()
	return d.failed&(1<<a) != 0
}

// attr names a device attribute onLink adopts.
type attr uint8

const (
	attrUp attr = iota
	attrMTU
	attrTxq
	attrMulticast
	attrUserFlags
	attrFeatures
	attrAlias
)

// adoption is a device's attribute and the value the engine is being made to follow;
// a nil value: none.
type adoption struct {
	attr  attr
	value any
}

// adopt runs f with the attribute's value v as what is being adopted (onLink's calls
// into the engine).
func (d *adopter) adopt(a attr, v any, f func()) {
	d.adoptMu.Lock()
	d.adopting = adoption{a, v}
	d.adoptMu.Unlock()
	defer func() {
		d.adoptMu.Lock()
		d.adopting = adoption{}
		d.adoptMu.Unlock()
	}()
	f()
}

// push is a Host call's push of the attribute's value v to the device: through
// ifChanged when v is the value onLink is adopting, else through set.
func push[T comparable](d *adopter, a attr, v T, set, ifChanged func(T) error) error {
	d.adoptMu.Lock()
	adopted := d.adopting.value != nil && d.adopting.attr == a && d.adopting.value == any(v)
	d.adoptMu.Unlock()
	var err error
	if adopted {
		err = ifChanged(v)
	} else {
		err = set(v)
	}
	if !errors.Is(err, os.ErrClosed) { // a closed device: nothing to be in step with
		d.adoptMu.Lock()
		if err != nil {
			d.failed |= 1 << a
		} else {
			d.failed &^= 1 << a
		}
		d.adoptMu.Unlock()
	}
	return err
}

func openBridge(bs *bridges, i *ipoib.Interface, netns string) (*bridge, error) {
	f := i.Features()
	// A port's interface gets the -queues; a P_Key child one: a multi-queue TUN holds
	// about 6.6 MB of kernel memory once up (the kernel gives it 256 transmit queues,
	// each with a qdisc sized for txqueuelen), against 60 KiB, and a daemon has
	// thousands of children.
	queues := bs.queues
	if i.Parent() != nil {
		queues = 1
	}
	dev, err := openDevice(kernel.Config{Name: i.Name(), MTU: i.MTU(), NetNS: netns,
		Offloads: offloads(f), Queues: queues})
	if err != nil {
		return nil, err
	}
	// A send queue per device queue, so that the readers post in parallel (the
	// engine falls back on one where the HCA cannot: verbs/rdma).
	if err := i.SetSendQueues(queues); err != nil {
		log.Printf("%s: %v", i.Name(), err)
	}
	b := &bridge{i: i, dev: dev, bs: bs, done: make(chan struct{})}
	// The kernel must not invent a random link-local address: IPoIB's comes from the GUID.
	if err := dev.SetLinkLocal(i.LinkLocal()); err != nil {
		log.Printf("%s: %v", i.Name(), err)
	}
	// The device follows the interface: a child is created down, as the driver
	// registers it (and as Open leaves the device), and comes up with `ip link set up`
	// or with its parent. A device that cannot come up is not given to the interface.
	if i.IsUp() {
		if err := dev.SetUp(true); err != nil {
			dev.Close()
			return nil, err
		}
	}
	// AttachHost pushes the interface's state, in turn with the pushes of changes made
	// meanwhile (a parent brought up while this child is created): MTU, carrier,
	// offloads, txqueuelen (a TUN starts at 500, an IPoIB netdev at 1000) and up,
	// which starts the readers.
	i.AttachHost(b)
	i.SetIfIndex(dev.Index())
	// From here the interface follows the device: what ip link, ifconfig and the
	// stack do to it reaches the engine as the driver would see it.
	dev.Watch(kernel.Events{Link: b.onLink, Addrs: b.onAddrs, Groups: i.SetHostGroups, Gone: b.onGone,
		Moved: func(err error) { logMoved(i.Name(), err) }})
	return b, nil
}

// onLink applies a change someone made to the device (ip link set ...) to the
// interface, with the driver's rules: an MTU goes through the same checks as a write
// of mtu, and a refused one is put back on the device at once (the driver's ndo
// would have returned EINVAL); down and up stop and open the interface.
func (b *bridge) onLink(l kernel.Link) {
	name := b.i.Name()
	if l.Name != name {
		// ip link set ib0 name X: the interface takes the device's new name, as the
		// netdev's name is the interface's; a name the engine cannot take (another
		// interface has it) is put back on the device.
		if err := b.bs.e.Rename(b.i, l.Name); err != nil {
			log.Printf("%s: renamed to %s outside ipoibfs, refused and put back: %v", name, l.Name, err)
			if err := b.dev.SetName(name); err != nil {
				log.Printf("%s: %v", name, err)
			}
		}
		name = b.i.Name()
	}
	if l.CarrierPutBack {
		log.Printf("%s: carrier changed outside ipoibfs, put back to %v (the port's and the broadcast group's)", name, b.i.Carrier())
	}
	if l.MTUChanged {
		b.adopt(attrMTU, l.MTU, func() {
			if err := b.i.SetMTU(l.MTU); err != nil {
				log.Printf("%s: MTU %d set on the device refused, put back to %d: %v", name, l.MTU, b.i.MTU(), err)
			}
		})
		if b.i.MTU() != l.MTU {
			b.i.PushMTU() // the effective MTU (datagram: at most the group's), in turn with the engine's pushes
		}
	}
	// Each is taken only while the engine still has the value the device had before
	// (Prev...): one the engine changed since the watch read the device (a write in
	// the tree, on its way to the device) is newer, and the device gets it.
	if l.TxQLenChanged && l.TxQLen >= 0 {
		// ip link set txqueuelen: adopted as is.
		b.adopt(attrTxq, l.TxQLen, func() {
			if b.outOfSync(attrTxq) {
				_ = b.i.SetTxQueueLen(uint32(l.TxQLen)) // the newest: see adopter.failed (a refusal is logged)
			} else if !b.i.AdoptTxQueueLen(uint32(l.PrevTxQLen), uint32(l.TxQLen)) {
				logNotAdopted(name, "txqueuelen", l.TxQLen)
			}
		})
	}
	if l.MulticastChanged {
		// ip link set multicast on/off: the flag is the interface's (flags in the tree).
		b.adopt(attrMulticast, l.Multicast, func() {
			if b.outOfSync(attrMulticast) {
				b.i.SetMulticast(l.Multicast)
			} else if !b.i.AdoptMulticast(l.PrevMulticast, l.Multicast) {
				logNotAdopted(name, "multicast", l.Multicast)
			}
		})
	}
	if l.AliasChanged {
		// ip link set alias: the interface's ifalias shows it.
		b.adopt(attrAlias, l.Alias, func() {
			took, err := true, error(nil)
			if b.outOfSync(attrAlias) {
				err = b.i.SetAlias(l.Alias)
			} else {
				took, err = b.i.AdoptAlias(l.PrevAlias, l.Alias)
			}
			if err != nil {
				log.Printf("%s: alias set on the device: %v", name, err)
			} else if !took {
				logNotAdopted(name, "alias", fmt.Sprintf("%q", l.Alias))
			}
		})
	}
	if l.UserFlagsChanged {
		// ip link set promisc/allmulticast: the interface's flags show them.
		b.adopt(attrUserFlags, l.UserFlags, func() {
			if b.outOfSync(attrUserFlags) {
				b.i.SetUserFlags(l.UserFlags)
			} else if !b.i.AdoptUserFlags(l.PrevUserFlags, l.UserFlags) {
				logNotAdopted(name, "promisc/allmulti flags", fmt.Sprintf("%#x", l.UserFlags))
			}
		})
	}
	b.i.SetCounted(l.Counted) // tcpdump's promiscuity shows in flags, as in sysfs
	if l.FeaturesChanged {
		// ethtool -K on the device: the request the engine keeps; the mode's
		// constraints then apply (connected mode forces tx checksum and TSO off again).
		// The TUN device's rx-checksumming is fixed off (it has no NETIF_F_RXCSUM): the
		// engine's receive checksum switch is the tree's alone.
		f := l.Features
		b.adopt(attrFeatures, kernel.Offloads{TxChecksum: f.TxChecksum, TSO: f.TSO, GRO: f.GRO}, func() {
			b.i.SetFeatures(ipoib.Features{RxChecksum: b.i.RequestedFeatures().RxChecksum, TxChecksum: f.TxChecksum, TSO: f.TSO, GRO: f.GRO})
		})
	}
	if l.Up {
		b.startReader()
	}
	if l.UpChanged {
		b.adopt(attrUp, l.Up, func() {
			if err := b.i.SetUp(l.Up); err != nil {
				log.Printf("%s: set %s: %v", name, map[bool]string{true: "up", false: "down"}[l.Up], err)
			}
		})
	}
	if l.Up && (l.MTUChanged || l.UpChanged) {
		b.ensureLinkLocal()
	}
}

// onAddrs passes the device's addresses to the engine and keeps the GUID-derived
// link-local among them.
func (b *bridge) onAddrs(p []netip.Prefix) {
	b.i.SetHostAddrs(p)
	ll := b.i.LinkLocal()
	if !slices.ContainsFunc(p, func(p netip.Prefix) bool { return p.Addr() == ll }) {
		b.ensureLinkLocal()
	}
}

func (b *bridge) ensureLinkLocal() {
	// ENODEV: the device was just deleted; onGone deals with that.
	if err := b.dev.EnsureLinkLocal(b.i.LinkLocal()); err != nil && !errors.Is(err, syscall.ENODEV) {
		log.Printf("%s: %v", b.i.Name(), err)
	}
}

// logNotAdopted says that a value someone set on the device (ip link set) was not
// taken: the engine's changed since the device had the one before it (a write in the
// tree, whose push may still be on its way) or never reached the device (a push that
// failed), and the device has been given the engine's again.
func logNotAdopted(name, what string, v any) {
	log.Printf("%s: %s %v set on the device outside ipoibfs not taken: the tree's value is newer or had not reached the device; put back", name, what, v)
}

// onGone handles `ip link del`: a child's device takes the child with it; a port's
// interface cannot be deleted, so its device is made again.
// logMoved says what became of a device someone moved to another network namespace.
func logMoved(name string, err error) {
	if err != nil {
		log.Printf("%s: moved to another network namespace outside ipoibfs (ip link set netns) and not put back, so it is gone: %v", name, err)
		return
	}
	log.Printf("%s: moved to another network namespace outside ipoibfs (ip link set netns): put back, since the engine keeps its devices where it made them; the move took its addresses", name)
}

func (b *bridge) onGone() {
	go b.bs.gone(b) // not on the watch goroutine: closing the device waits for it
}

// startReader starts the goroutines that read what the kernel sends out of the
// device, one per queue, once.
func (b *bridge) startReader() {
	b.txOnce.Do(func() {
		var wg sync.WaitGroup
		for k := range b.dev.Queues() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				readLoop(b.dev, b.dev.Queue(k), b.i.Name, b.i.MTU, func(p [][]byte) { b.i.TransmitQueue(k, p) })
			}()
		}
		go func() { wg.Wait(); close(b.done) }()
	})
}

// stopReader waits for the readers to end (the device is closed), or keeps them from
// ever starting.
func (b *bridge) stopReader() {
	b.txOnce.Do(func() { close(b.done) })
	<-b.done
}

// readLoop feeds what the kernel sends out of dev's queue q to transmit until dev is
// closed (an interface's or a bond's device).
func readLoop(dev *kernel.Device, q *kernel.Queue, name func() string, mtu func() int, transmit func([][]byte)) {
	var bufs [][]byte
	var sizes []int   // made with bufs: an unused child holds none (4 KiB each,
	var pkts [][]byte // 4.5 MB per 1000 idle children in a heap profile)
	// fails counts the reads that failed in a row: a lasting error is logged at 1, 2,
	// 4, 8, ... failures and waited out with a growing pause, so it cannot spin the loop.
	var fails int
	var floor int // the buffer size a kept packet needs, until it is read
	for {
		// A batch of buffers at the current MTU, not of 64 KiB each (with thousands
		// of children that was 8 MiB per device): one super-packet's segments, or
		// with large send off the packets queued behind the first, which a read
		// takes at once (offloads off: 0.13-0.18x veth with one buffer, 0.46-0.58x
		// with a batch, netbench).
		n := dev.BatchSize()
		if bufs == nil {
			// No buffers until the device first has something to send: a child
			// that is never used costs none (n x MTU each, 256 KiB at 2044).
			if err := q.WaitReadable(); err != nil {
				if ended(dev, q, name, err) {
					return
				}
				log.Printf("%s: wait for the kernel: %v", name(), err)
			}
		}
		// At the headroom a 64 KiB packet of connected mode is read in place. Sized
		// for the larger of the two MTUs: while the device's is above the engine's
		// (an ip link set mtu the engine has not followed yet, or is putting back)
		// a read with smaller buffers fails, and the engine drops what is too long.
		// (Made again when the size changes either way: a moment of a large MTU the
		// engine refused must not leave a child's reader with 8 MiB for good.)
		if size := max(kernel.ReadBufferLen(max(mtu(), dev.MTU())), floor); len(bufs) != n || len(bufs[0]) != size {
			bufs = segmentBuffers(size, n)
		}
		if len(sizes) != n {
			sizes, pkts = make([]int, n), make([][]byte, n)
		}
		c, err := q.ReadOffset(bufs, sizes, kernel.ReadHeadroom)
		if err != nil {
			if ended(dev, q, name, err) {
				return
			}
			if need, ok := kernel.ShortBuffer(err); ok {
				// The MTU grew while this read waited (a switch to connected mode):
				// the packet is kept for a read with buffers that hold it.
				floor = kernel.ReadBufferLen(max(need, mtu()))
				continue
			}
			fails++
			if fails&(fails-1) == 0 {
				log.Printf("%s: read from the kernel: %v (%d in a row)", name(), err, fails)
			}
			time.Sleep(min(time.Duration(fails-1)*time.Millisecond, time.Second))
			continue
		}
		fails, floor = 0, 0
		groups := false
		for k := 0; k < c; k++ {
			pkts[k] = bufs[k][kernel.ReadHeadroom : kernel.ReadHeadroom+sizes[k]]
			groups = groups || isGroupReport(pkts[k])
		}
		if groups {
			dev.RefreshGroups()
		}
		transmit(pkts[:c])
	}
}

// ended reports whether a read or wait error ends a reader: the device is closed, by
// us or by the kernel. The kernel's unregistering it (ip link del, or the namespace
// went; the engine follows: the device is deleted or made again) is said once, by the
// first queue's reader, whether it was reading or waiting.
func ended(dev *kernel.Device, q *kernel.Queue, name func() string, err error) bool {
	if errors.Is(err, kernel.ErrUnregistered) && q == dev.Queue(0) {
		log.Printf("%s: the kernel unregistered the device; its readers stop", name())
	}
	return errors.Is(err, os.ErrClosed)
}

// segmentBuffers returns n buffers of size bytes in one allocation: a super-packet's
// segments never exceed the MTU (n is the device's gso_max_segs with large send on).
func segmentBuffers(size, n int) [][]byte {
	bufs := make([][]byte, n)
	mem := make([]byte, n*size)
	for k := range bufs {
		bufs[k] = mem[k*size : (k+1)*size : (k+1)*size]
	}
	return bufs
}

// detach makes the interface forget the device before the device goes.
func (b *bridge) detach() {
	b.i.AttachHost(nil)
	b.i.SetIfIndex(0)
	b.i.SetCounted(0) // no device, no packet socket on it
}

func (b *bridge) close() {
	b.detach()
	b.dev.Close()
	b.stopReader()
}

// delete is close for delete_child: it returns once the kernel no longer lists the
// device (kernel.Device.Delete) and does not wait for the reader, which ends by itself
// when the kernel has released the device's file (it may be the one closing it, for
// the ~20 ms of the kernel's release); a packet it still hands to the engine meanwhile
// is dropped, the interface being down or closed.
func (b *bridge) delete() {
	b.detach()
	if err := b.dev.Delete(); err != nil {
		log.Printf("%s: %v", b.i.Name(), err)
	}
	b.txOnce.Do(func() { close(b.done) }) // a reader never started never starts
}

// isGroupReport tells IGMP and MLD messages (MLD always follows a hop-by-hop header
// with the router alert): the kernel sends one for each join and leave, and netlink
// has no event for those on every kernel.
func isGroupReport(p []byte) bool {
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		return p[9] == 2 // IGMP
	case len(p) >= 40 && p[0]>>4 == 6:
		return p[6] == 0 // hop-by-hop options
	}
	return false
}

// Host methods: errors are logged, the data path goes on.

// logErr logs a failed device operation under the interface's name.
func (b *bridge) logErr(err error) {
	if err != nil {
		log.Printf("%s: %v", b.i.Name(), err)
	}
}

func (b *bridge) Deliver(pkts [][]byte) {
	spread(b.dev.Queues(), pkts, 0, func(q int, pkts [][]byte) {
		if _, err := b.dev.Queue(q).Write(pkts); err != nil && !errors.Is(err, os.ErrClosed) {
			log.Printf("%s: write to the kernel: %v", b.i.Name(), err)
		}
	})
}

// FrameHeadroom and DeliverFrames make the bridge an ipoib.FrameHost: connected mode's
// packets are written to the kernel from their receive buffers.
func (b *bridge) FrameHeadroom() int { return kernel.WriteHeadroom }

func (b *bridge) DeliverFrames(frames [][]byte, offset int) {
	spread(b.dev.Queues(), frames, offset, func(q int, frames [][]byte) {
		if _, err := b.dev.Queue(q).WriteOffset(frames, offset); err != nil && !errors.Is(err, os.ErrClosed) {
			log.Printf("%s: write to the kernel: %v", b.i.Name(), err)
		}
	})
}

func (b *bridge) SetMTU(mtu int) {
	b.logErr(push(&b.adopter, attrMTU, mtu, b.dev.SetMTU, b.dev.SetMTUIfChanged))
}

// SetCarrier follows the interface's carrier, and with it the link settings ethtool
// and sysfs show (ipoib_get_link_ksettings): the port's rate with carrier, unknown
// without; so a port that trains at another rate later shows it. Pushes are
// serialised (the interface's hostMu).
func (b *bridge) SetCarrier(on bool) {
	b.logErr(b.dev.SetCarrier(on))
	speed := -1 // unknown
	if on {
		speed = b.i.SpeedMbps()
	}
	b.logErr(b.dev.SetSpeed(speed))
}

// SetTxQueueLen follows a tx_queue_len write; the device's refusal goes back to it.
func (b *bridge) SetTxQueueLen(n uint32) error {
	err := push(&b.adopter, attrTxq, int(n), b.dev.SetTxQueueLen, b.dev.SetTxQueueLenIfChanged)
	b.logErr(err)
	return err
}

// ReadAlias reads the device's alias from the kernel (ifalias of a device that is
// down; see ipoib.AliasReader).
func (b *bridge) ReadAlias() (string, error) { return b.dev.Alias() }

// SetAlias follows the interface's alias (an ifalias write).
func (b *bridge) SetAlias(s string) {
	b.logErr(push(&b.adopter, attrAlias, s, b.dev.SetAlias, b.dev.SetAliasIfChanged))
}

// SetMulticast follows the interface's IFF_MULTICAST (a flags write).
func (b *bridge) SetMulticast(on bool) {
	b.logErr(push(&b.adopter, attrMulticast, on, b.dev.SetMulticast, b.dev.SetMulticastIfChanged))
}

// SetUserFlags follows the interface's IFF_PROMISC and IFF_ALLMULTI (a flags write).
func (b *bridge) SetUserFlags(f uint32) {
	b.logErr(push(&b.adopter, attrUserFlags, f, b.dev.SetUserFlags, b.dev.SetUserFlagsIfChanged))
}

// SetAdminUp follows the interface's own up/down (a child following its parent).
func (b *bridge) SetAdminUp(up bool) {
	if up {
		b.startReader()
	}
	b.logErr(push(&b.adopter, attrUp, up, b.dev.SetUp, b.dev.SetUpIfChanged))
}

func (b *bridge) SetOffloads(f ipoib.Features) {
	// Features taken from the device are not written back over a newer ethtool -K;
	// what the mode forces (connected mode: checksum and TSO off) is a different
	// value, which goes to the device as always.
	b.logErr(push(&b.adopter, attrFeatures, offloads(f), b.dev.SetOffloads, b.dev.SetOffloadsIfChanged))
}

func offloads(f ipoib.Features) kernel.Offloads {
	return kernel.Offloads{TxChecksum: f.TxChecksum, TSO: f.TSO, GRO: f.GRO}
}

// The Host extensions the bridge implements; a signature slip would silently turn a
// push off.
var (
	_ ipoib.FrameHost     = (*bridge)(nil)
	_ ipoib.AdminHost     = (*bridge)(nil)
	_ ipoib.TxQueueHost   = (*bridge)(nil)
	_ ipoib.MulticastHost = (*bridge)(nil)
	_ ipoib.UserFlagsHost = (*bridge)(nil)
	_ ipoib.AliasHost     = (*bridge)(nil)
	_ ipoib.AliasReader   = (*bridge)(nil)
)

// openDevice is kernel.Open (a variable for tests).
var openDevice = kernel.Open

// bridges keeps one bridge per engine interface. The engine calls Create and Delete
// inside create_child and delete_child, so a child's device exists when the write
// returns and is gone when delete_child returns. When the kernel bridge is unavailable
// from the start (no /dev/net/tun, no privilege) it says why once and the engine runs
// without it; once a device has been made, a device that cannot be made fails its
// create_child instead, so that no interface exists without its device while others
// have theirs.
type bridges struct {
	e      *ipoib.Engine
	netns  string
	queues int // TUN queues of a port's interface (a child's device has one)
	mu     sync.Mutex
	m      map[*ipoib.Interface]*bridge
	off    bool // no devices: unavailable from the start, or closed
	made   bool // a device has been made: the bridge is on for good

	release *time.Timer // debug.FreeOSMemory after a burst of deletions
	// recreating holds the pending retry of each port interface whose device could
	// not be made again (recreateLater), one chain per interface.
	recreating map[*ipoib.Interface]*time.Timer
}

func startBridges(e *ipoib.Engine, netns string, queues int) *bridges {
	bs := &bridges{e: e, netns: netns, queues: queues, m: map[*ipoib.Interface]*bridge{}}
	if err := e.SetDevices(bs); err != nil {
		log.Print(err)
		// A port's interface cannot go (only a child can be refused): its device is
		// tried again until it can be made, as after an ip link del.
		for _, i := range e.Interfaces() {
			if i.Parent() == nil && !bs.isOff() && bs.device(i) == nil {
				bs.recreateLater(i, time.Second, 1)
			}
		}
	}
	return bs
}

// markMade records that a device has been made (a bond's counts): from then on a
// refused device fails its interface instead of turning devices off.
func (bs *bridges) markMade() {
	bs.mu.Lock()
	bs.made = true
	bs.mu.Unlock()
}

// Create makes the interface's device. A name taken in the namespace is EEXIST for
// the create_child write; the kernel bridge being unavailable is not an error.
func (bs *bridges) Create(i *ipoib.Interface) error {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.off || bs.m[i] != nil {
		return nil
	}
	b, err := openBridge(bs, i, bs.netns)
	if err != nil {
		bs.off, err = openErr(i.Name(), "the engine runs without TUN devices", err, !bs.made)
		return err
	}
	bs.m[i], bs.made = b, true
	return nil
}

// isOff reports whether the engine runs without devices.
func (bs *bridges) isOff() bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.off
}

// openErr sorts a failed kernel.Open of name's device: without the kernel bridge
// (when mayTurnOff: off, said once, no error, the engine runs on without devices, as
// without says; otherwise the error, with the system's errno), a name taken (EEXIST),
// a deleted namespace (ENODEV: ip netns del; the devices made so far live on where
// nothing leads to them, and new ones are not made in a namespace of the same name
// made since), or anything else as it is.
func openErr(name, without string, err error, mayTurnOff bool) (off bool, _ error) {
	switch {
	case errors.Is(err, kernel.ErrUnavailable) && mayTurnOff:
		log.Printf("kernel bridge off, %s: %v", without, err)
		return true, nil
	case errors.Is(err, kernel.ErrUnavailable):
		log.Printf("%s: %v", name, err)
		return false, err
	case errors.Is(err, kernel.ErrExists):
		return false, fmt.Errorf("%w: %v", syscall.EEXIST, err)
	case errors.Is(err, kernel.ErrNamespaceGone):
		log.Printf("%s: %v", name, err)
		return false, fmt.Errorf("%w: %v", syscall.ENODEV, err)
	}
	return false, err
}

// Delete removes the interface's device.
func (bs *bridges) Delete(i *ipoib.Interface) {
	bs.mu.Lock()
	b := bs.m[i]
	delete(bs.m, i)
	if bs.release == nil {
		bs.release = time.AfterFunc(time.Hour, debug.FreeOSMemory)
	}
	// Once deletions pause, hand the memory of the deleted interfaces back to the
	// system: the runtime would keep it for reuse, and deleting a thousand children
	// should leave the daemon the size it was before they were made.
	bs.release.Reset(2 * time.Second)
	bs.mu.Unlock()
	if b != nil {
		b.delete()
	}
}

// device returns the interface's kernel device, nil without one.
func (bs *bridges) device(i *ipoib.Interface) *kernel.Device {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b := bs.m[i]; b != nil {
		return b.dev
	}
	return nil
}

// gone handles a device deleted outside ipoibfs.
func (bs *bridges) gone(b *bridge) {
	name := b.i.Name()
	if p := b.i.Parent(); p != nil {
		log.Printf("%s: device deleted with ip link; deleting the child", name)
		if err := p.RemoveChild(b.i); err != nil {
			log.Printf("%s: %v", name, err)
		}
		return // RemoveChild closes the bridge
	}
	log.Printf("%s: device deleted with ip link; a port's interface cannot be deleted, making the device again", name)
	bs.mu.Lock()
	if bs.m[b.i] != b {
		bs.mu.Unlock()
		return
	}
	delete(bs.m, b.i)
	bs.mu.Unlock()
	b.close()
	if err := bs.Create(b.i); err != nil {
		// The name taken meanwhile (ip link del ib0; ip tuntap add ib0): tried again,
		// with a growing pause, until it works or the bridges close.
		log.Printf("%s: %v; trying again", name, err)
		bs.recreateLater(b.i, time.Second, 1)
	}
}

// recreateLater tries to make a port interface's device again after wait, and again
// after twice as long (at most 30 s) while that fails; a failure is logged after 1, 2,
// 4, ... tries. It stops once the interface has a device or the bridges are closed
// or off; an interface has one such chain at a time (tries > 1: the chain goes on).
func (bs *bridges) recreateLater(i *ipoib.Interface, wait time.Duration, tries int) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.off || tries == 1 && bs.recreating[i] != nil {
		return
	}
	if bs.recreating == nil {
		bs.recreating = map[*ipoib.Interface]*time.Timer{}
	}
	bs.recreating[i] = time.AfterFunc(wait, func() {
		bs.mu.Lock()
		done := bs.off || bs.m[i] != nil
		if done {
			delete(bs.recreating, i)
		}
		bs.mu.Unlock()
		if done {
			return
		}
		if err := bs.Create(i); err != nil {
			if tries++; tries&(tries-1) == 0 {
				log.Printf("%s: making the device again failed %d times: %v", i.Name(), tries, err)
			}
			bs.recreateLater(i, min(2*wait, 30*time.Second), tries)
			return
		}
		bs.mu.Lock()
		delete(bs.recreating, i)
		bs.mu.Unlock()
		log.Printf("%s: device made again", i.Name())
	})
}

func (bs *bridges) close() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.release != nil {
		bs.release.Stop()
	}
	for i, t := range bs.recreating {
		t.Stop()
		delete(bs.recreating, i)
	}
	// All devices go in one request per namespace (kernel.CloseAll): one at a time,
	// 4000 children took 70-110 s, the kernel's unregistration of each.
	devs := make([]*kernel.Device, 0, len(bs.m))
	for _, b := range bs.m {
		b.detach()
		devs = append(devs, b.dev)
	}
	if err := kernel.CloseAll(devs); err != nil {
		log.Printf("closing the kernel devices: %v", err)
	}
	for i, b := range bs.m {
		b.stopReader()
		delete(bs.m, i)
	}
	kernel.WaitReleased() // the devices delete_child removed
	bs.off = true
}
