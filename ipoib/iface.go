package ipoib

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/mad"
)

// Mode is the IPoIB transport mode.
type Mode uint8

const (
	Datagram Mode = iota
	Connected
)

func (m Mode) String() string {
	if m == Connected {
		return "connected"
	}
	return "datagram"
}

const (
	minMTU      = 72 // ETH_MIN_MTU 68 + the 4-byte encapsulation
	encapLen    = 4
	grhLen      = 40
	maxPathQ    = 3  // IPOIB_MAX_PATH_REC_QUEUE
	maxMcastQ   = 64 // IPOIB_MAX_MCAST_QUEUE
	txQueueLen  = 1000
	ifNameMax   = 15
	recvBatch   = 64
	maxBackoff  = 16 * time.Second // IPOIB_MAX_BACKOFF_SECONDS
	arpRetries  = 3
	arpInterval = time.Second

	neighGC = 30 * time.Second // the kernel's arp_tbl gc_interval
)

// The neighbour table's bounds (variables for the tests, which lower them).
var (
	// The kernel caps its ARP and ND tables at gc_thresh3 (1024 by default, for
	// all devices) and ib_ipoib frees a neighbour idle for two GC intervals; here
	// each interface has a table of its own, sized for a large subnet. Entries still waiting for an answer (each holding up to
	// maxPathQ frames) have a smaller cap: they are what a flood of sends to
	// addresses nobody answers for makes.
	maxNeigh      = 8192
	maxUnresolved = 256
	maxPaths      = maxNeigh // a path is made for a neighbour, or to answer one
	maxSendOnly   = 1024     // send-only groups (each one an SA membership)
)

// saClient is what an interface asks the SA (*sa.Client).
type saClient interface {
	Join(ctx context.Context, rec mad.MCMemberRecord, mask uint64) (mad.MCMemberRecord, error)
	Leave(ctx context.Context, rec mad.MCMemberRecord, mask uint64) error
	PathRecord(ctx context.Context, sgid, dgid verbs.GID, pkey verbs.PKey, tclass uint8) (mad.PathRecord, error)
}

// Interface is one IPoIB interface: a parent (one per port) or a P_Key child.
type Interface struct {
	e      *Engine
	name   atomic.Pointer[string] // Name(); changes only through Engine.Rename
	port   int
	parent *Interface
	sa     saClient

	dhcpLease atomic.Pointer[string] // set by the daemon's DHCP client

	// The interface's state is split by who uses it (doc.go, "Locking"): mu guards the
	// control path's fields; ds is what the data path reads, published whole; dmu guards
	// the tables both paths change; rxMu orders re-posting receive buffers against a
	// QP restart.
	mu       sync.Mutex
	ds       atomic.Pointer[dataState] // replaced under mu and dmu (setLocked)
	umcast   bool
	maxIBMTU int // port max MTU in bytes
	adminMTU int
	hw       HWAddr // fixed once newInterface returns (cmInit sets FlagRC before)
	features Features
	coalesce Coalesce
	children []*Interface
	// hostGroups is the kernel device's multicast list (SetHostGroups); until a host
	// reports one, the groups are derived from the addresses.
	hostGroups    []netip.Addr
	hostGroupsSet bool
	txQueueLen    uint32
	alias         string // ifalias (net-sysfs), which the kernel device follows
	noMulticast   bool   // IFF_MULTICAST cleared (a flags write, ip link set multicast off)
	flags         devFlags
	closed        bool
	serial        uint64
	renames       atomic.Uint64
	legacy        bool          // a create_child child (not AddLink's)
	taskRounds    atomic.Uint64 // rounds task() has finished (tests wait for one)
	childOps      sync.Mutex    // serialises CreateChild and DeleteChild of a parent
	hostMu        sync.Mutex    // one push to the host at a time (host.go)
	upMu          sync.Mutex    // one SetUp or close at a time, the open or stop it makes included
	ifIndex       atomic.Int32  // the kernel device's index (SetIfIndex); 0: none
	leaveMu       sync.Mutex    // guards leavesDone against leaves.Add racing close's Wait
	leaves        sync.WaitGroup
	leavesDone    bool
	leaving       map[verbs.GID]int // under leaveMu: background leaves on their way, per group
	// loopMu guards starting the interface's goroutines (startLoops) against close's
	// wg.Wait: they start at the first open, not at creation (most children are
	// never brought up, and six idle goroutines' stacks were most of a child's memory).
	loopMu    sync.Mutex
	loopsOn   bool                 // started
	loopsDone bool                 // close has begun: none may start
	bond      atomic.Pointer[Bond] // the bond this interface is a slave of (bond.go)

	qp        verbs.QP
	scq, rcq  verbs.CQ
	pkeyIndex int
	rxMu      sync.Mutex // the repost of receive buffers against restartQP's
	rxOut     int        // receive buffers posted and not polled back yet (under rxMu)
	recvBufs  [][]byte
	udRx      rxState // the receive CQ's drains (ib.go)
	cmRxS     rxState // connected mode's (cm.go)

	dmu   sync.Mutex // the tables below, the connections' and icmpOut
	mcast map[verbs.GID]*mcastGroup
	paths map[verbs.GID]*path
	neigh map[netip.Addr]*neigh
	// pending holds the neighbours of neigh still being resolved, so that the
	// task's round looks at those alone.
	pending   map[netip.Addr]*neigh
	gcAt      time.Time // the next neighbour GC round, zero while the tables are empty
	forcedAt  time.Time // the last GC forced by a full table (one a second at most)
	sendOnlyN int       // send-only groups in mcast
	txGone    []*cmTx   // connections a forced GC took out of tx, for the task to end

	stats  stats
	kick   chan struct{} // wakes the multicast/path task
	stop   chan struct{}
	ctx    context.Context // cancelled when the interface is destroyed (SA queries)
	cancel context.CancelFunc
	wg     sync.WaitGroup

	icmpOut [][]byte // under dmu: ICMP errors for the host, sent after unlocking

	// Connected mode (cm.go); cmMgr is nil when the HCA has no RC support.
	cmMgr        *cm.Manager
	cmStop       func()
	cmScq, cmRcq verbs.CQ
	// With a shared receive queue (cmHasSRQ: the device has them), every passive
	// connection receives into one pool of recv_queue_size buffers; the queue and its
	// buffers are made when the first connection comes, each set once, under dmu.
	cmHasSRQ  bool
	cmSRQ     verbs.SRQ
	cmSRQBufs [][]byte
	// cmSRQClaimed: a connection is making the pool (cmRxBuffers), under dmu.
	cmSRQClaimed bool
	tx           map[HWAddr]*cmTx // under dmu, as the connections' fields
	rx           map[verbs.QPN]*cmRx

	// The send queues (tss.go): tx0 posts on qp; lanes holds it and the others,
	// replaced whole under mu.
	tx0   txLane
	lanes atomic.Pointer[[]*txLane]

	carrierCounter // the carrier's changes
}

// carrierCounter counts a carrier's changes as a netdev's carrier_up_count and
// carrier_down_count do (netif_carrier_on and off). A netdev's carrier is turned off
// once as it is set up (the TUN device's when the kernel bridge opens it): counted, so
// that the counts read as the device's.
type carrierCounter struct{ ups, downs atomic.Uint64 }

func (c *carrierCounter) count(on bool) {
	if on {
		c.ups.Add(1)
	} else {
		c.downs.Add(1)
	}
}

// CarrierCounts returns how many times the carrier came on and went off.
func (c *carrierCounter) CarrierCounts() (up, down uint64) { return c.ups.Load(), c.downs.Load() + 1 }

// dataState is what the data path reads of an interface: the receive and transmit
// loops load it once per batch and take no lock for it. It is never changed in place:
// setLocked publishes a changed copy under mu and dmu, so a holder of either sees one
// that stays current while it is held, and Transmit, which holds dmu, routes on the same
// mode its tables were made for.
type dataState struct {
	up        bool
	carrier   bool
	qpReady   bool   // QP in RTS with a valid P_Key index
	qpGen     uint32 // bumps when all receive buffers are posted afresh (in their WR IDs)
	mode      Mode
	mtu       int
	mcastMTU  int
	qkey      uint32
	pkey      verbs.PKey
	bcast     HWAddr
	host      Host
	hostAddrs []netip.Prefix // the kernel's addresses (SetHostAddrs, a bond's view)
}

// data returns the current data-path state.
func (i *Interface) data() *dataState { return i.ds.Load() }

// setLocked publishes the data-path state changed by f. Called with mu held and dmu
// not: it takes dmu, so that no Transmit is between tables and state meanwhile.
func (i *Interface) setLocked(f func(d *dataState)) {
	i.dmu.Lock()
	i.publishLocked(f)
	i.dmu.Unlock()
}

// publishLocked is setLocked for a caller that holds dmu as well, to change the
// tables in the same step.
func (i *Interface) publishLocked(f func(d *dataState)) {
	d := *i.ds.Load()
	f(&d)
	i.ds.Store(&d)
}

func newInterface(e *Engine, name string, port int, parent *Interface, pkey verbs.PKey) (*Interface, error) {
	p, err := e.dev.Port(port)
	if err != nil {
		return nil, err
	}
	attr := p.Attr()
	gid, err := p.GID(0)
	if err != nil {
		return nil, err
	}
	if parent == nil {
		tab := p.PKeyTable()
		pkey = verbs.DefaultPKey
		if len(tab) > 0 {
			pkey = tab[0]
		}
	}
	pkey |= verbs.PKeyFullMember
	i := &Interface{e: e, serial: e.serials.Add(1), port: port, parent: parent, sa: e.newSAClient(p, attr),
		maxIBMTU: attr.MaxMTU.Bytes(), features: defaultFeatures, txQueueLen: 1000,
		mcast: map[verbs.GID]*mcastGroup{}, paths: map[verbs.GID]*path{}, neigh: map[netip.Addr]*neigh{},
		pending: map[netip.Addr]*neigh{},
		kick:    make(chan struct{}, 1), stop: make(chan struct{})}
	if e.wrapSA != nil {
		i.sa = e.wrapSA(i.sa)
	}
	i.name.Store(&name)
	i.ctx, i.cancel = context.WithCancel(context.Background())
	if i.maxIBMTU == 0 {
		i.maxIBMTU = 2048
	}
	mcastMTU := i.maxIBMTU - encapLen
	i.adminMTU = mcastMTU
	i.ds.Store(&dataState{pkey: pkey, mcastMTU: mcastMTU, mtu: mcastMTU, bcast: broadcastAddr(pkey)})
	if err := i.createQP(); err != nil {
		i.undoSetup()
		return nil, err
	}
	i.hw = MakeHWAddr(0, i.qp.Num(), gid)
	i.tx0.qp, i.tx0.scq = i.qp, i.scq
	i.lanes.Store(&[]*txLane{&i.tx0})
	if mgr := e.cms[port]; mgr != nil {
		if err := i.cmInit(mgr); err != nil {
			i.undoSetup()
			return nil, err
		}
	}
	return i, nil
}

// undoSetup closes what a failed newInterface made: an HCA's QPs and CQs are finite,
// and a create_child refused for want of one must not keep the others it got.
func (i *Interface) undoSetup() {
	if i.cmStop != nil {
		i.cmStop()
	}
	if i.qp != nil {
		_ = i.qp.Close()
	}
	for _, cq := range []verbs.CQ{i.scq, i.rcq, i.cmScq, i.cmRcq} {
		if cq != nil {
			_ = cq.Close()
		}
	}
	i.cancel()
}

// startLoops starts the receive loop and the task (and connected mode's two loops)
// the first time the interface is opened or accepts a connection. It reports false
// once close has begun. loopMu is a leaf: nothing else is locked under it.
func (i *Interface) startLoops() bool {
	i.loopMu.Lock()
	defer i.loopMu.Unlock()
	if i.loopsDone {
		return false
	}
	if !i.loopsOn {
		i.loopsOn = true
		i.wg.Add(2)
		go i.recvLoop()
		go i.task()
		if i.cmMgr != nil {
			i.wg.Add(2)
			go i.cmRecvLoop()
			go i.cmSendLoop()
		}
	}
	return true
}

func (i *Interface) createQP() error {
	dev := i.e.dev
	q := i.e.params
	var err error
	if i.scq, err = dev.CreateCQ(verbs.CQAttr{Entries: q.SendQueueSize}); err != nil {
		return err
	}
	if i.rcq, err = dev.CreateCQ(verbs.CQAttr{Entries: q.RecvQueueSize, Handler: i.rxHandler}); err != nil {
		return err
	}
	i.qp, err = dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: i.port, SendCQ: i.scq, RecvCQ: i.rcq,
		MaxSendWR: q.SendQueueSize, MaxRecvWR: q.RecvQueueSize})
	return err
}

// allocRecvRingLocked makes the receive ring the first time the QP is opened, as the
// driver allocates its ring in ipoib_ib_dev_open: a child created down, and never
// brought up, holds no buffers. One slab: a large allocation is mapped and unmapped
// whole, so a deleted child's ring goes back to the system instead of fragmenting the
// heap. The ring stays until the interface goes (the receive loop may still hold
// completions for it after a stop).
func (i *Interface) allocRecvRingLocked() {
	if i.recvBufs != nil {
		return
	}
	bufs := make([][]byte, i.e.params.RecvQueueSize)
	sz := grhLen + i.maxIBMTU
	slab := make([]byte, len(bufs)*sz)
	for k := range bufs {
		bufs[k] = slab[k*sz : (k+1)*sz : (k+1)*sz]
	}
	i.recvBufs = bufs
}

// Name returns the interface name.
func (i *Interface) Name() string { return *i.name.Load() }

// Renames is how many times the interface has been renamed.
func (i *Interface) Renames() uint64 { return i.renames.Load() }

// Serial is a number no other interface or bond of the engine has had: a child deleted
// and made again under its name is another interface with another serial.
func (i *Interface) Serial() uint64 { return i.serial }

// Listed reports whether the interface is still in the engine's table (under whatever
// name it has now): false from the moment a delete takes it out.
func (i *Interface) Listed() bool {
	i.e.mu.Lock()
	defer i.e.mu.Unlock()
	return i.e.ifs[i.Name()] == i
}

// Port returns the HCA port number.
func (i *Interface) Port() int { return i.port }

// Parent returns the parent interface, or nil for a parent.
func (i *Interface) Parent() *Interface { return i.parent }

// PKey returns the P_Key (always with the full-membership bit).
func (i *Interface) PKey() verbs.PKey { return i.data().pkey }

// HWAddr returns the 20-byte hardware address.
func (i *Interface) HWAddr() HWAddr { return i.hw }

// Broadcast returns the broadcast hardware address.
func (i *Interface) Broadcast() HWAddr { return i.data().bcast }

// Mode returns the transport mode.
func (i *Interface) Mode() Mode { return i.data().mode }

// MTU returns the effective MTU.
func (i *Interface) MTU() int { return i.data().mtu }

// Carrier reports whether the link is up (port ACTIVE and broadcast group joined).
func (i *Interface) Carrier() bool { return i.data().carrier }

// IsUp reports the administrative state.
func (i *Interface) IsUp() bool { return i.data().up }

// Umcast returns the umcast flag.
func (i *Interface) Umcast() bool { i.mu.Lock(); defer i.mu.Unlock(); return i.umcast }

// SetUmcast sets the umcast flag (groups joined directly by userspace are left alone).
func (i *Interface) SetUmcast(on bool) {
	i.mu.Lock()
	i.umcast = on
	i.mu.Unlock()
	if on {
		i.e.log.Printf("%s: ignoring multicast groups joined directly by userspace", i.Name())
	}
}

// Stats returns the interface statistics.
func (i *Interface) Stats() Stats { return i.stats.snapshot() }

// Children returns the interface's P_Key children.
func (i *Interface) Children() []*Interface {
	i.mu.Lock()
	defer i.mu.Unlock()
	return slices.Clone(i.children)
}

// OperState returns the RFC 2863 operational state as sysfs shows it. Without carrier
// it is the core's default_operstate: "down" for a port's interface (its iflink is
// itself) and for a child whose parent has carrier, "lowerlayerdown" for a child whose
// parent has none (the child's iflink is its parent).
func (i *Interface) OperState() string {
	d := i.data()
	up, carrier := d.up, d.carrier
	switch {
	case !up:
		return "down"
	case carrier:
		return "up"
	case i.parent != nil && !i.parent.Carrier():
		return "lowerlayerdown"
	}
	return "down"
}

// Flags returns dev->flags as sysfs prints it: IFF_BROADCAST|IFF_MULTICAST, plus IFF_UP
// when up (0x1003), IFF_SLAVE when enslaved, PROMISC and ALLMULTI as asked for or
// while the device's promiscuity count is above zero, and the bits a write stores.
// RUNNING and LOWER_UP belong to the ioctl view (dev_get_flags), not to this
// attribute.
func (i *Interface) Flags() uint32 {
	i.mu.Lock()
	defer i.mu.Unlock()
	f := uint32(iffBroadcast)
	if !i.noMulticast {
		f |= iffMulticast
	}
	if i.data().up {
		f |= iffUp
	}
	if i.bond.Load() != nil {
		f |= iffSlave // bond_enslave sets it, __bond_release_one clears it
	}
	return f | i.flags.shown()
}

// SetCounted sets the dev->flags bits the kernel device has from its counts
// (kernel.Link.Counted): shown in Flags, with no other effect.
func (i *Interface) SetCounted(f uint32) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.flags.counted = f & iffUser
}

// The dev->flags bits an IPoIB netdev shows (include/uapi/linux/if.h).
const (
	iffUp, iffBroadcast, iffDebug, iffNoTrailers, iffNoARP = 0x1, 0x2, 0x4, 0x20, 0x80
	iffPromisc, iffAllMulti, iffSlave, iffMulticast        = 0x100, 0x200, 0x800, 0x1000
	iffPortSel, iffAutoMedia, iffDynamic                   = 0x2000, 0x4000, 0x8000
	// iffStored are kept as written (dev_change_flags), with no use here.
	iffStored = iffDebug | iffNoTrailers | iffNoARP | iffPortSel | iffAutoMedia | iffDynamic
	// iffUser are promiscuous and all-multicast as users ask for them (the kernel's
	// gflags): IPoIB has no address filter to open, but the kernel device follows.
	iffUser = iffPromisc | iffAllMulti
)

// devFlags are the dev->flags bits an interface or a bond keeps beyond its state
// (under its mu): those a write stores and the user's promisc and allmulti (bits),
// and IFF_PROMISC while the kernel device's promiscuity count has more than the
// user's own (counted).
type devFlags struct{ bits, counted uint32 }

func (d *devFlags) shown() uint32 { return d.bits | d.counted }
func (d *devFlags) user() uint32  { return d.bits & iffUser }

// store takes the stored bits of a flags write.
func (d *devFlags) store(f uint32) { d.bits = d.bits&^iffStored | f&iffStored }

// setUser takes f's iffUser bits and returns the ones before.
func (d *devFlags) setUser(f uint32) (old uint32) {
	old = d.user()
	d.bits = d.bits&^iffUser | f&iffUser
	return old
}

// userFlagEvents says which of promisc and allmulti changed from old to f.
func userFlagEvents(event func(string, ...any), name string, old, f uint32) {
	for _, b := range []struct {
		bit  uint32
		name string
	}{{iffPromisc, "promiscuous mode"}, {iffAllMulti, "all-multicast mode"}} {
		if (old^f)&b.bit != 0 {
			event("%s: %s %s", name, b.name, onOff(f&b.bit != 0))
		}
	}
}

// SetFlags applies a write of flags as dev_change_flags does for an IPoIB netdev:
// IFF_UP opens or stops the interface; IFF_MULTICAST, IFF_PROMISC, IFF_ALLMULTI and
// the bits a netdev only keeps (DEBUG, NOTRAILERS, NOARP, PORTSEL, AUTOMEDIA,
// DYNAMIC) are taken as written; the rest (BROADCAST, SLAVE, ...) are the device's
// own. The administrative state goes first, so that a refusal changes nothing.
func (i *Interface) SetFlags(f uint32) error {
	if err := i.SetUp(f&iffUp != 0); err != nil {
		return err
	}
	i.SetMulticast(f&iffMulticast != 0)
	i.mu.Lock()
	i.flags.store(f)
	i.mu.Unlock()
	i.SetUserFlags(f)
	return nil
}

// SetUserFlags sets IFF_PROMISC and IFF_ALLMULTI as f has them (a flags write, or ip
// link set promisc/allmulticast on the kernel device); the kernel device follows.
func (i *Interface) SetUserFlags(f uint32) { i.setUserFlags(f, nil) }

// AdoptUserFlags is SetUserFlags for flags someone set on the device, taken only
// while the interface's are still prev, the device's before (see AdoptAlias).
func (i *Interface) AdoptUserFlags(prev, f uint32) bool { return i.setUserFlags(f, &prev) }

func (i *Interface) setUserFlags(f uint32, prev *uint32) bool {
	i.mu.Lock()
	if prev != nil && i.flags.user() != *prev&iffUser {
		i.mu.Unlock()
		i.pushUserFlags() // refused: the device gets the interface's again (see setAlias)
		return false
	}
	old := i.flags.setUser(f)
	i.mu.Unlock()
	if old == f&iffUser {
		return true
	}
	userFlagEvents(i.e.event, i.Name(), old, f)
	i.pushUserFlags()
	return true
}

// Multicast reports IFF_MULTICAST, which a netdev starts with.
func (i *Interface) Multicast() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return !i.noMulticast
}

// SetMulticast sets or clears IFF_MULTICAST (ip link set multicast on/off, a flags
// write); the kernel device follows. Like the driver, the engine keeps joining the
// groups of the device's multicast list either way.
func (i *Interface) SetMulticast(on bool) { i.setMulticast(on, nil) }

// AdoptMulticast is SetMulticast for IFF_MULTICAST someone set on the device, taken
// only while the interface's is still prev, the device's before (see AdoptAlias).
func (i *Interface) AdoptMulticast(prev, on bool) bool { return i.setMulticast(on, &prev) }

func (i *Interface) setMulticast(on bool, prev *bool) bool {
	i.mu.Lock()
	if prev != nil && i.noMulticast == *prev {
		i.mu.Unlock()
		i.pushMulticast() // refused: see setAlias
		return false
	}
	changed := i.noMulticast == on
	i.noMulticast = !on
	i.mu.Unlock()
	if changed {
		i.e.event("%s: multicast %s", i.Name(), onOff(on))
		i.pushMulticast()
	}
	return true
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// SetIfIndex records the kernel device's interface index (0: the device is gone).
func (i *Interface) SetIfIndex(n int) { i.ifIndex.Store(int32(n)) }

// IfIndex is the kernel device's interface index, 0 without a device.
func (i *Interface) IfIndex() int { return int(i.ifIndex.Load()) }

// IfLink is what the interface's traffic goes through, as ipoib_get_iflink says: a
// port's interface itself, a child its parent.
func (i *Interface) IfLink() int {
	if i.parent != nil {
		return i.parent.IfIndex()
	}
	return i.IfIndex()
}

// Alias is the interface's alias (ifalias; ip link set alias), "" without one: its
// device's as the kernel has it now where the host can read it (AliasReader: an alias
// set with ip link on a down device reaches the interface no other way), else the
// interface's own.
func (i *Interface) Alias() string {
	if s, ok := deviceAlias(i.data().host); ok {
		return s
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.alias
}

// maxAlias is the longest alias (IFALIASZ - 1, as dev_set_alias takes).
const maxAlias = 255

// SetAlias sets the interface's alias, which the kernel device follows; "" removes it.
// Longer than 255 bytes is EINVAL, as dev_set_alias has it; the alias ends at a NUL
// byte, as the kernel reads it. It goes to the device even when unchanged, as every
// ifalias write does: the kernel announces no alias change on a device that is down,
// so the device may hold another one.
func (i *Interface) SetAlias(s string) error {
	_, err := i.setAlias(s, nil)
	return err
}

// AdoptAlias is SetAlias for an alias someone set on the device (ip link set alias):
// it is taken only while the interface's alias is still prev, the one the device had
// before (kernel.Link.PrevAlias). One the engine changed since (a write of ifalias,
// on its way to the device) is newer and stays. It reports whether s was taken.
func (i *Interface) AdoptAlias(prev, s string) (bool, error) {
	return i.setAlias(s, &prev)
}

func (i *Interface) setAlias(s string, prev *string) (bool, error) {
	s, err := checkAlias(s)
	if err != nil {
		return false, &Error{Op: "set_alias", If: i.Name(), Err: syscall.EINVAL, Detail: err.Error()}
	}
	i.mu.Lock()
	if prev != nil && i.alias != *prev {
		i.mu.Unlock()
		// Refused: the device gets the interface's alias again. Usually the newer
		// write's own push is on its way and this one repeats it; but after a push
		// that failed, the device's value and the engine's would otherwise stay apart.
		i.pushAlias()
		return false, nil
	}
	changed := i.alias != s
	i.alias = s
	i.mu.Unlock()
	if changed {
		i.e.event("%s: alias %q", i.Name(), s)
	}
	i.pushAlias()
	return true, nil
}

// checkAlias applies dev_set_alias's rules to an alias: at most 255 bytes, and it
// ends at a NUL, as the kernel reads it.
func checkAlias(s string) (string, error) {
	if len(s) > maxAlias {
		return "", fmt.Errorf("%d bytes, at most %d", len(s), maxAlias)
	}
	if k := strings.IndexByte(s, 0); k >= 0 {
		s = s[:k]
	}
	return s, nil
}

// TxQueueLen is the device's transmit queue length (1000 as ipoib_setup_common sets).
func (i *Interface) TxQueueLen() uint32 {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.txQueueLen
}

// SetTxQueueLen sets the transmit queue length, which the kernel device follows. A
// length the device refuses is not taken: the old one stays and the device's error is
// returned, as dev_change_tx_queue_len puts the old length back when the qdisc cannot
// follow.
func (i *Interface) SetTxQueueLen(n uint32) error {
	i.hostMu.Lock()
	defer i.hostMu.Unlock()
	i.mu.Lock()
	old := i.txQueueLen
	i.txQueueLen = n
	h := i.data().host
	i.mu.Unlock()
	if old == n {
		return nil
	}
	i.e.event("%s: txqueuelen %d", i.Name(), n)
	th, ok := h.(TxQueueHost)
	if !ok {
		return nil
	}
	if err := th.SetTxQueueLen(n); err != nil {
		i.mu.Lock()
		if i.txQueueLen == n {
			i.txQueueLen = old
		}
		i.mu.Unlock()
		i.e.event("%s: txqueuelen %d (the device refused %d)", i.Name(), old, n)
		return err
	}
	return nil
}

// AdoptTxQueueLen is SetTxQueueLen for a length someone set on the device, taken only
// while the interface's is still prev, the device's before (see AdoptAlias).
func (i *Interface) AdoptTxQueueLen(prev, n uint32) bool { return i.setTxQueueLen(n, &prev) }

func (i *Interface) setTxQueueLen(n uint32, prev *uint32) bool {
	i.mu.Lock()
	if prev != nil && i.txQueueLen != *prev {
		i.mu.Unlock()
		i.pushTxQueueLen() // refused: see setAlias
		return false
	}
	changed := i.txQueueLen != n
	i.txQueueLen = n
	i.mu.Unlock()
	if changed {
		i.e.event("%s: txqueuelen %d", i.Name(), n)
		i.pushTxQueueLen()
	}
	return true
}

// AttachHost connects the kernel side and pushes the current MTU, carrier, effective
// features and, to a host that follows them, the administrative state and transmit
// queue length. (It holds hostMu throughout: no push of a change made meanwhile reaches
// the host before these, and none reaches a host detached with AttachHost(nil) after
// it returns.)
func (i *Interface) AttachHost(h Host) {
	i.hostMu.Lock()
	defer i.hostMu.Unlock()
	i.mu.Lock()
	i.setLocked(func(d *dataState) { d.host = h })
	d := i.data()
	mtu, carrier, up, f, txq, mcast := d.mtu, d.carrier, d.up, i.effectiveFeaturesLocked(), i.txQueueLen, !i.noMulticast
	user, alias := i.flags.user(), i.alias
	i.mu.Unlock()
	if h == nil {
		return
	}
	h.SetMTU(mtu)
	h.SetCarrier(carrier)
	h.SetOffloads(f)
	if th, ok := h.(TxQueueHost); ok {
		_ = th.SetTxQueueLen(txq) // the bridge logs a refusal
	}
	if mh, ok := h.(MulticastHost); ok {
		mh.SetMulticast(mcast)
	}
	if uh, ok := h.(UserFlagsHost); ok {
		uh.SetUserFlags(user)
	}
	if alias != "" { // a new device has none
		aliasSender(alias)(h)
	}
	if ah, ok := h.(AdminHost); ok {
		ah.SetAdminUp(up)
	}
}

// SetHostAddrs tells the engine which addresses the kernel has on the interface; the
// engine answers ARP and ND for them and joins their multicast groups.
func (i *Interface) SetHostAddrs(p []netip.Prefix) {
	if i.slaveHostAddrs(p) {
		return // a slave answers for its bond's addresses (bond.go)
	}
	i.mu.Lock()
	p = slices.Clone(p)
	i.setLocked(func(d *dataState) { d.hostAddrs = p })
	i.mu.Unlock()
	i.wake()
}

// SetHostGroups tells the engine the kernel device's multicast list: every group in it
// is joined on the fabric as a full member, and groups that leave the list are left, as
// the driver's multicast restart does with the netdev's list.
func (i *Interface) SetHostGroups(g []netip.Addr) {
	if i.slaveHostGroups(g) {
		return // a slave joins its bond's groups (bond.go)
	}
	i.mu.Lock()
	i.hostGroups = slices.Clone(g)
	i.hostGroupsSet = true
	i.mu.Unlock()
	i.wake()
}

// ownAddrs returns the kernel's addresses plus the GUID-derived IPv6 link-local one.
func (i *Interface) ownAddrs() []netip.Addr {
	out := addrsOf(i.data().hostAddrs)
	if i.bond.Load() != nil {
		return out // a slave has no IPv6 of its own; the active one has its bond's (bond.go)
	}
	ll := linkLocal(i.hw.GID().GUID())
	if !slices.Contains(out, ll) {
		out = append(out, ll)
	}
	return out
}

// LinkLocal returns the IPv6 link-local address derived from the port GUID.
func (i *Interface) LinkLocal() netip.Addr { return linkLocal(i.HWAddr().GID().GUID()) }

// SetUp sets the administrative state. Bringing a parent up or down does the same to its
// children, as the kernel driver does.
func (i *Interface) SetUp(up bool) error {
	// Two SetUps at once ran their opens and stops in either order: a stop that
	// came last left the interface up with its QP reset and no carrier.
	i.upMu.Lock()
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		i.upMu.Unlock()
		return &Error{Op: "set_up", If: i.Name(), Err: syscall.ENODEV}
	}
	changed := i.data().up != up
	i.setLocked(func(d *dataState) { d.up = up })
	kids := slices.Clone(i.children)
	parentUp := i.parent == nil || i.parent.IsUp()
	i.mu.Unlock()
	if up && !parentUp {
		i.e.tracef(1, "parent device %s is not up, so child device may be not functioning.", i.parent.Name())
	}
	if changed {
		i.e.event("%s: %s", i.Name(), map[bool]string{true: "up", false: "down"}[up])
		i.pushUp()
		if up {
			i.open()
		} else {
			i.stopDev()
		}
	}
	i.upMu.Unlock()
	if !changed {
		// The driver's children follow their parent's open and stop, which run only
		// when IFF_UP changes: a child someone took down stays down when the parent
		// is set up again (a flags write, a reload's ONBOOT, an enslavement).
		return nil
	}
	// The parent's state when each child's turn comes, not this call's, and looked at
	// again after: of two SetUps of the parent at once, one loop may read the parent
	// down, the other's change and loop pass, and its child's SetUp then land last;
	// the look after catches that and sets the child again. (The last write to a
	// child is followed by a look that sees the parent's last change.)
	for _, c := range kids {
		for {
			up := i.IsUp()
			_ = c.SetUp(up)
			if i.IsUp() == up {
				break
			}
		}
	}
	return nil
}

// open brings the QP up on the P_Key's table index; a missing P_Key leaves the
// interface up without carrier until the subnet manager adds it.
func (i *Interface) open() {
	if !i.startLoops() {
		return
	}
	i.restartQP()
	i.wake()
}

// restartQP (re)initialises the QP for the current P_Key. Called without i.mu. It
// does nothing on an interface that is down or closed: a port event's flush that found
// the interface up, or an open, may come after a stop or close took the QP down, and
// must not bring it back (receiving, its buffers posted) under them. changed says
// whether the interface's P_Key or its index changed (or the QP was restarted).
func (i *Interface) restartQP() (changed bool) {
	p, _ := i.e.dev.Port(i.port)
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed || !i.data().up {
		return false
	}
	if i.parent == nil {
		// The parent follows whatever is at index 0.
		if tab := p.PKeyTable(); len(tab) > 0 && tab[0].Valid() {
			if newKey := tab[0] | verbs.PKeyFullMember; newKey != i.data().pkey {
				i.setLocked(func(d *dataState) { d.pkey, d.bcast = newKey, broadcastAddr(newKey) })
				changed = true
			}
		}
	}
	d := i.data()
	idx, found := p.FindPKey(d.pkey)
	if d.qpReady && found && idx == i.pkeyIndex {
		return changed
	}
	changed = true
	// The receive loop re-posts no buffer while the ring is posted afresh (rxMu), and
	// none polled from before: their WR IDs carry the old generation.
	i.rxMu.Lock()
	defer i.rxMu.Unlock()
	i.resetQPLocked()
	if !found {
		status := "not found"
		if !d.pkey.Valid() {
			status = "Invalid"
		}
		i.e.log.Printf("%s: P_Key 0x%04x is %s", i.Name(), uint16(d.pkey), status)
		return
	}
	i.pkeyIndex = idx
	if err := verbs.UDToRTS(i.qp, idx, d.qkey); err != nil {
		i.e.log.Printf("%s: QP restart failed: %v", i.Name(), err)
		return
	}
	gen := d.qpGen + 1
	i.setLocked(func(d *dataState) { d.qpGen = gen })
	i.allocRecvRingLocked()
	wrs := make([]verbs.RecvWR, len(i.recvBufs))
	for k, b := range i.recvBufs {
		wrs[k] = verbs.RecvWR{ID: recvWRID(gen, k), Buf: b}
	}
	if _, err := i.postRxLocked(wrs); err != nil {
		i.e.log.Printf("%s: posting receive buffers: %v", i.Name(), err)
		return
	}
	i.lanesUpLocked()
	i.setLocked(func(d *dataState) { d.qpReady = true })
	return true
}

// resetQPLocked takes the QP down as the driver does (ipoib_ib_dev_stop): to the error
// state, which completes every posted receive buffer with a flush error, then, once
// all of them are back, to reset, and drops every receive completion left on the CQ
// (ipoib_drain_cq). Resetting a QP with buffers posted lost them on a real HCA: the
// provider's slots never came back, and the next ring found the receive queue full
// (verbs/rdma, rxe: no receive after ip link set down/up). And left on the CQ, the
// old ring's completions took the room the next ring's need: the receive CQ holds one
// ring's worth, the overflow lost completions and their buffers with them, and after
// a few restarts under traffic the soft HCA's QP had none left
// (TestRestartsUnderTraffic, 1 in 40 runs under load). Called with mu and rxMu held.
func (i *Interface) resetQPLocked() {
	var wcs [64]verbs.WC
	// Not ready from here: no post takes the QP as sending while it is flushed (a
	// send failing meanwhile would have it checked, and logged, as a broken one).
	i.setLocked(func(d *dataState) { d.qpReady = false })
	if i.rxOut > 0 {
		_ = i.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr})
		// A real HCA flushes in the background: wait for the buffers, 5 s at most
		// (the driver's wait in ipoib_ib_dev_stop).
		for deadline := time.Now().Add(5 * time.Second); i.rxOut > 0 && time.Now().Before(deadline); {
			if i.pollRxLocked(wcs[:]) == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		if i.rxOut > 0 {
			i.e.log.Printf("%s: %d receive buffers not flushed by the QP", i.Name(), i.rxOut)
		}
		for _, l := range *i.lanes.Load() { // the sends it flushed give the provider's send slots back
			i.reapCQ(l.scq)
		}
	}
	_ = i.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPReset})
	i.lanesDownLocked()
	for i.rcq.Poll(wcs[:]) > 0 {
	}
	i.rxOut = 0
}

// recvWRID is a UD receive buffer's work request ID: the ring generation it was
// posted in, and its index in the ring.
func recvWRID(gen uint32, k int) uint64 { return uint64(gen)<<32 | uint64(uint32(k)) }

// stopDev takes the interface down: groups are left, connections ended, paths and
// neighbours flushed (the kernel's neigh_ifdown), carrier off.
func (i *Interface) stopDev() {
	i.leaveAll(true)
	if i.cmMgr != nil {
		i.cmEndAll() // ipoib_cm_dev_stop; the transmit side goes with the neighbours
	}
	i.mu.Lock()
	i.dmu.Lock()
	i.flushPathsLocked()
	i.flushNeighLocked()
	i.dmu.Unlock()
	i.rxMu.Lock()
	i.resetQPLocked()
	i.rxMu.Unlock()
	act := i.setCarrierLocked(false)
	i.mu.Unlock()
	act()
}

// setCarrierLocked changes the carrier and returns what to tell the host after
// unlocking. In datagram mode carrier-on first settles the MTU to min(mcast, admin).
func (i *Interface) setCarrierLocked(on bool) func() {
	d := i.data()
	if d.carrier == on {
		return func() {}
	}
	i.setLocked(func(d *dataState) { d.carrier = on })
	i.count(on)
	i.e.event("%s: carrier %s", i.Name(), onOff(on))
	var mtuAct func()
	if on && d.mode == Datagram {
		mtuAct = i.setMTULocked(min(d.mcastMTU, i.adminMTU))
	}
	i.e.tracef(1, "%s: carrier %v", i.Name(), on)
	return func() {
		if mtuAct != nil {
			mtuAct()
		}
		i.pushCarrier()
		if b := i.bond.Load(); b != nil {
			b.slaveCarrierChanged() // the bond's link settings are its active slave's
		}
	}
}

// setMTULocked sets the effective MTU and returns the host notification.
func (i *Interface) setMTULocked(mtu int) func() {
	d := i.data()
	if d.mtu == mtu {
		return func() {}
	}
	i.setLocked(func(d *dataState) { d.mtu = mtu })
	i.e.event("%s: mtu %d", i.Name(), mtu)
	return i.pushMTU
}

// SetMTU applies an MTU write with the kernel's rules (ipoib_change_mtu).
func (i *Interface) SetMTU(mtu int) error {
	i.mu.Lock()
	d := i.data()
	if d.mode == Connected {
		// ipoib_change_mtu: up to the CM maximum; above the group MTU multicast drops.
		if mtu < 68 || mtu > cmMaxMTU {
			i.mu.Unlock()
			return &Error{Op: "set_mtu", If: i.Name(), Err: syscall.EINVAL,
				Detail: fmt.Sprintf("MTU %d outside 68..%d in connected mode", mtu, cmMaxMTU)}
		}
		if mtu > d.mcastMTU {
			i.e.log.Printf("%s: mtu > %d will cause multicast packet drops.", i.Name(), d.mcastMTU)
		}
		act := i.setMTULocked(mtu)
		i.mu.Unlock()
		act()
		return nil
	}
	udMax := i.maxIBMTU - encapLen
	if mtu < minMTU || mtu > udMax {
		i.mu.Unlock()
		return &Error{Op: "set_mtu", If: i.Name(), Err: syscall.EINVAL,
			Detail: fmt.Sprintf("MTU %d outside %d..%d in datagram mode", mtu, minMTU, udMax)}
	}
	i.adminMTU = mtu
	if mtu > d.mcastMTU {
		i.e.tracef(1, "%s: MTU must be smaller than the underlying link layer MTU - 4 (%d)", i.Name(), d.mcastMTU)
	}
	act := i.setMTULocked(min(d.mcastMTU, i.adminMTU))
	i.mu.Unlock()
	act()
	return nil
}

// wake nudges the interface task (joins, queued work).
func (i *Interface) wake() {
	select {
	case i.kick <- struct{}{}:
	default:
	}
}

// close destroys the interface for good.
func (i *Interface) close() {
	i.upMu.Lock() // no SetUp opens the interface while it is stopped and closed
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		i.upMu.Unlock()
		return
	}
	up := i.data().up
	// Down before the groups are left, as SetUp(false) and the driver (which stops
	// its join task first): a round of the task while the leaves were on their way
	// joined again, and the membership outlived the interface at the SA.
	i.setLocked(func(d *dataState) { d.up = false })
	i.mu.Unlock()
	if up {
		i.stopDev()
	}
	i.mu.Lock()
	i.closed = true // up is false since the start: no SetUp ran meanwhile (upMu)
	i.mu.Unlock()
	i.upMu.Unlock()
	i.loopMu.Lock()
	i.loopsDone = true
	i.loopMu.Unlock()
	i.cmClose()
	for _, r := range []*rxState{&i.udRx, &i.cmRxS} {
		r.mu.Lock() // a drain on the HCA's receive path ends first; none starts after
		r.closed = true
		r.mu.Unlock()
	}
	close(i.stop)
	i.cancel()
	i.wg.Wait()
	i.waitLeaves()
	i.closeLanes()
	_ = i.qp.Close()
	_ = i.scq.Close()
	_ = i.rcq.Close()
	if i.cmScq != nil {
		_ = i.cmScq.Close()
		_ = i.cmRcq.Close()
	}
	if i.cmSRQ != nil {
		_ = i.cmSRQ.Close() // after its QPs (cmClose) and the receive loop
	}
	// A closed interface may stay reachable for a while (a connection's teardown
	// keeps its QP and with it the CQ handler, until the CM's timewait ends): it
	// holds none of its buffers or tables meanwhile (the shared receive queue's pool
	// alone is 16 MiB).
	i.mu.Lock()
	i.recvBufs = nil // no drain reads it: the receive states are closed
	i.mu.Unlock()
	i.dmu.Lock()
	i.cmSRQBufs = nil
	i.flushNeighLocked()
	i.paths, i.mcast, i.sendOnlyN = map[verbs.GID]*path{}, map[verbs.GID]*mcastGroup{}, 0
	i.dmu.Unlock()
}

// flushLevel is the kernel's ipoib_flush_level.
type flushLevel uint8

const (
	flushLight flushLevel = iota
	flushNormal
	flushHeavy
)

func (l flushLevel) String() string { return [...]string{"light", "normal", "heavy"}[l] }

// flush reacts to a port event.
func (i *Interface) flush(l flushLevel) {
	if !i.IsUp() {
		return
	}
	if l == flushHeavy || !i.data().qpReady {
		if !i.restartQP() && l == flushHeavy {
			// A P_Key change elsewhere in the table: this interface's key and index
			// are as they were (update_parent_pkey/update_child_pkey: "Not flushing").
			return
		}
	}
	// A normal or heavy flush takes the carrier down with the groups, as
	// ipoib_ib_dev_down; a light one (an SM's client reregister) only rejoins, and
	// unicast goes on meanwhile.
	i.leaveAll(l >= flushNormal)
	if l >= flushNormal {
		i.dmu.Lock()
		i.flushPathsLocked()
		i.dmu.Unlock()
	}
	i.wake()
}

// task runs the multicast joins and retries (ipoib_mcast_join_task) and neighbour
// retransmissions, woken by wake() and by its own timers.
func (i *Interface) task() {
	defer i.wg.Done()
	t := i.e.clk.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next := i.runTask()
		i.taskRounds.Add(1)
		t.Reset(next) // no stale tick is received after a Reset (clock.Timer)
		select {
		case <-i.stop:
			return
		case <-i.kick:
		case <-t.C():
		}
	}
}

// runTask does one round of pending work and returns when it wants to run again.
func (i *Interface) runTask() time.Duration {
	next := time.Hour
	if d := i.mcastRound(); d < next {
		next = d
	}
	if d := i.neighRound(); d < next {
		next = d
	}
	if d := i.cmReap(); d < next {
		next = d
	}
	i.reapSendCQ()
	return max(next, 10*time.Millisecond)
}
