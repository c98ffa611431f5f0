package ipoib

import (
	"crypto/rand"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"ipoibfs/verbs"
)

// Bonding over the engine's interfaces, as the kernel's bonding driver
// (drivers/net/bonding) runs with IPoIB slaves: the only mode it allows them is
// active-backup. A bond is a kernel device of its own whose IP traffic goes through one
// slave, the active one; the others wait. A link monitor (miimon) looks at every slave's
// link (the interface is up and has carrier) every miimon milliseconds; when the active
// slave's link goes, the next slave with a link (the primary first, when one is set and
// has a link) takes over: it is given the bond's addresses and multicast groups, so it
// answers ARP and ND and joins the groups for the bond, and it announces the change
// with a gratuitous ARP and an unsolicited neighbour advertisement for each address, so
// that peers point their neighbour entries at its hardware address at once. An IPoIB
// interface cannot take another's hardware address, so the bond's address is always
// the active slave's (fail_over_mac becomes "active" at the first slave, as the
// driver sets it for slaves that cannot change their address).
//
// Slaves are this engine's interfaces (ports' or P_Key children), all of one
// partition: the bond's broadcast address is its first slave's. A slave keeps its own
// kernel device; while enslaved, what it receives goes up through the bond (from the
// active slave only; a backup's IP traffic is dropped, as the driver delivers a
// backup's frames to no one), and the addresses its own device reports are set aside
// until it is released.
//
// Locking: Bonds.mu guards the list of bonds; Bond.mu a bond's configuration and
// slaves. Bond.mu is taken before a slave's Interface.mu, never after; the data path
// reads the active slave and the bond's host through atomics. Host calls are made
// after Bond.mu is released.

// BondDevices makes and removes a bond's kernel device, as the driver registers a
// netdev when a bond is created: CreateBond runs before Bonds.Create returns (its
// error undoes the bond) and DeleteBond before Bonds.Delete returns.
type BondDevices interface {
	CreateBond(b *Bond) error
	DeleteBond(b *Bond)
}

// OtherDevices is BondDevices that can also describe the namespace's kernel device of
// a name that is neither an interface nor a bond of the engine (lo, eth0, or an
// alternative name of one of the engine's devices): the driver looks a slave's name up
// among all the namespace's devices, so a write naming such a device gets the errno
// the driver gives for it, not ENODEV.
type OtherDevices interface {
	OtherDevice(name string) (OtherDevice, bool)
}

// OtherDevice is what bond_enslave looks at on a device that is not the engine's.
type OtherDevice struct {
	Name   string // its name: the one asked for may be an alternative name
	Up     bool   // IFF_UP
	Master bool   // IFF_MASTER on a device that is not a bond
	Busy   bool   // its receive handler is taken: a bridge's or another bond's port, a macvlan's lower device
}

// LinkLocalHost is a bond's Host that keeps the bond's IPv6 link-local address on its
// device: the kernel derives it from the bond's first InfiniBand address (its first
// slave's GUID) and keeps it through failovers.
type LinkLocalHost interface {
	SetLinkLocal(addr netip.Addr)
}

const (
	bondModeActiveBackup = 1
	fomNone              = 0 // fail_over_mac none
	fomActive            = 1
	bondDefaultMiimon    = 100 // the driver's miimon when neither it nor arp_interval is given
	ifNameSize           = 16  // IFNAMSIZ
	typeEther            = 1
	typeInfiniband       = 32
	bondMinMTU           = 68
	bondMaxMTU           = 65535 // ETH_MAX_MTU, the bond device's bound before its slaves'
)

// optValue is one entry of a bonding option's value table (struct bond_opt_value).
type optValue struct {
	name  string
	value uint64
	flags uint8
}

const (
	valDefault = 1 << iota
	valMax
)

var (
	bondModeTbl = []optValue{{"balance-rr", 0, valDefault}, {"active-backup", 1, 0}, {"balance-xor", 2, 0},
		{"broadcast", 3, 0}, {"802.3ad", 4, 0}, {"balance-tlb", 5, 0}, {"balance-alb", 6, 0}}
	bondFOMTbl    = []optValue{{"none", 0, valDefault}, {"active", 1, 0}, {"follow", 2, 0}}
	bondReselTbl  = []optValue{{"always", reselectAlways, valDefault}, {"better", reselectBetter, 0}, {"failure", reselectFailure, 0}}
	bondIntMaxTbl = []optValue{{"off", 0, valDefault}, {"maxval", math.MaxInt32, valMax}}
)

// primary_reselect's values (BOND_PRI_RESELECT_*).
const (
	reselectAlways = iota
	reselectBetter
	reselectFailure
)

func tblName(tbl []optValue, v uint64) string {
	for _, t := range tbl {
		if t.value == v {
			return t.name
		}
	}
	return "?"
}

func isCSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// scanWord is sscanf(s, "%<max>s"): white space skipped, then at most max characters
// up to the next white space.
func scanWord(s string, max int) string {
	k := 0
	for k < len(s) && isCSpace(s[k]) {
		k++
	}
	s = s[k:]
	end := 0
	for end < len(s) && end < max && !isCSpace(s[end]) {
		end++
	}
	return s[:end]
}

// parseBondOpt parses a value of a tabled option as bond_opt_parse does: the text is
// cut at the first newline; all digits and white space is a number (which must be in
// the table or, for a table with a maximum, in range); anything else is its first word,
// which must be one of the table's names or "default".
func parseBondOpt(tbl []optValue, s string) (uint64, bool) {
	if k := strings.IndexByte(s, '\n'); k >= 0 {
		s = s[:k]
	}
	numeric := true
	for k := 0; k < len(s); k++ {
		if c := s[k]; !(c >= '0' && c <= '9' || isCSpace(c)) {
			numeric = false
			break
		}
	}
	if numeric {
		w := scanWord(s, len(s))
		if w == "" {
			return 0, false // sscanf finds no number
		}
		var v uint64
		for k := 0; k < len(w); k++ {
			d := uint64(w[k] - '0')
			if v > (math.MaxUint64-d)/10 {
				v = math.MaxUint64 // strtoull saturates
				break
			}
			v = v*10 + d
		}
		for _, t := range tbl {
			if t.value == v {
				return v, true
			}
		}
		for _, t := range tbl {
			if t.flags&valMax != 0 && v <= t.value {
				return v, true
			}
		}
		return 0, false
	}
	w := scanWord(s, 32)
	for _, t := range tbl {
		if w == "default" && t.flags&valDefault != 0 || w == t.name {
			return t.value, true
		}
	}
	return 0, false
}

// devValidName is the kernel's dev_valid_name.
func devValidName(name string) bool {
	if name == "" || len(name) >= ifNameSize || name == "." || name == ".." {
		return false
	}
	for k := 0; k < len(name); k++ {
		if c := name[k]; c == '/' || c == ':' || isCSpace(c) {
			return false
		}
	}
	return true
}

// ---- the bonds of an engine ----

// Bonds are the bonds over one engine's interfaces (the bonding module of one network
// namespace).
type Bonds struct {
	e *Engine

	mu     sync.Mutex
	list   []*Bond // in creation order, as bonding_masters lists them
	devs   BondDevices
	closed bool

	stop, done chan struct{}
	unwatch    func()
	loaded     atomic.Bool
}

// Load marks the bonding driver loaded (modprobe bonding): the control tree shows
// bonding_masters from then on. Bonds work without it; it only says whether the
// administrator asked for bonding, so that a daemon without bonds shows what a host
// without the module does.
func (bs *Bonds) Load() {
	if !bs.loaded.Swap(true) {
		bs.e.log.Printf("bonding: Ethernet Channel Bonding Driver loaded (active-backup for IPoIB slaves)")
	}
}

// Loaded reports whether Load was called.
func (bs *Bonds) Loaded() bool { return bs.loaded.Load() }

// NewBonds starts the bonding layer of engine e: it follows the engine's interfaces, so
// that a slave that is deleted leaves its bond.
func NewBonds(e *Engine) *Bonds {
	bs := &Bonds{e: e, stop: make(chan struct{}), done: make(chan struct{})}
	ch, cancel := e.Watch()
	bs.unwatch = cancel
	go bs.watch(ch)
	return bs
}

// otherDevice asks the devices' maker about a device that is not the engine's (see
// OtherDevices); false when there is none or it cannot tell.
func (bs *Bonds) otherDevice(name string) (OtherDevice, bool) {
	bs.mu.Lock()
	od, ok := bs.devs.(OtherDevices)
	bs.mu.Unlock()
	if !ok || name == "" {
		return OtherDevice{}, false
	}
	return od.OtherDevice(name)
}

// engineName is the engine's name for a device that the namespace knows by another
// (an alternative name): "" unless that device is an interface or a bond of the
// engine.
func (bs *Bonds) engineName(d OtherDevice, asked string) string {
	if d.Name == asked {
		return ""
	}
	if _, ok := bs.e.Interface(d.Name); ok {
		return d.Name
	}
	if _, ok := bs.Bond(d.Name); ok {
		return d.Name
	}
	return ""
}

// SetDevices installs the device maker for bonds created from now on.
func (bs *Bonds) SetDevices(d BondDevices) {
	bs.mu.Lock()
	bs.devs = d
	bs.mu.Unlock()
}

func (bs *Bonds) watch(ch <-chan string) {
	defer close(bs.done)
	for {
		select {
		case <-bs.stop:
			return
		case <-ch:
		}
		for _, b := range bs.List() {
			b.releaseGone()
		}
	}
}

// Close deletes every bond (slaves released, devices removed).
func (bs *Bonds) Close() {
	bs.mu.Lock()
	if bs.closed {
		bs.mu.Unlock()
		return
	}
	bs.closed = true
	list := slices.Clone(bs.list)
	bs.mu.Unlock()
	bs.unwatch()
	close(bs.stop)
	<-bs.done
	for k := len(list) - 1; k >= 0; k-- {
		_ = bs.Delete(list[k].Name())
	}
}

// List returns the bonds in creation order.
func (bs *Bonds) List() []*Bond {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return slices.Clone(bs.list)
}

// Bond returns the bond with that name.
func (bs *Bonds) Bond(name string) (*Bond, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, b := range bs.list {
		if b.name == name {
			return b, true
		}
	}
	return nil, false
}

func bondErr(op, name string, errno syscall.Errno, format string, a ...any) error {
	return &Error{Op: op, If: name, Err: errno, Detail: fmt.Sprintf(format, a...)}
}

// Create makes a bond (bond_create): EINVAL for a name that is not an interface name,
// EEXIST when an interface or bond has it.
func (bs *Bonds) Create(name string) (*Bond, error) {
	if !devValidName(name) {
		return nil, bondErr("create", name, syscall.EINVAL, "%q is not a valid interface name", name)
	}
	if _, ok := bs.e.Interface(name); ok {
		return nil, bondErr("create", name, syscall.EEXIST, "%s already exists", name)
	}
	created := false
	defer func() { // after the unlock below
		if created {
			bs.e.notifyName(name)
		}
	}()
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.closed {
		return nil, bondErr("create", name, syscall.ENODEV, "the bonding layer is closed")
	}
	for _, b := range bs.list {
		if b.name == name {
			return nil, bondErr("create", name, syscall.EEXIST, "%s already exists", name)
		}
	}
	b := newBond(bs, name)
	if bs.devs != nil {
		if err := bs.devs.CreateBond(b); err != nil {
			b.stopMonitor()
			return nil, err
		}
	}
	bs.list = append(bs.list, b)
	created = true
	bs.e.log.Printf("%s is being created...", name)
	bs.e.event("%s: bond created", name)
	return b, nil
}

// Delete removes a bond (its slaves are released first, as unregistering a bond
// does): ENODEV when there is no such bond.
func (bs *Bonds) Delete(name string) error {
	return bs.deleteWhere(name, func(x *Bond) bool { return x.name == name })
}

// DeleteBond deletes b if it is still a bond (its device was deleted with ip link): by
// the bond itself, not its name, which a bond made since may have taken.
func (bs *Bonds) DeleteBond(b *Bond) error {
	return bs.deleteWhere(b.Name(), func(x *Bond) bool { return x == b })
}

func (bs *Bonds) deleteWhere(name string, match func(*Bond) bool) error {
	bs.mu.Lock()
	var b *Bond
	for k, x := range bs.list {
		if match(x) {
			b = x
			bs.list = slices.Delete(bs.list, k, k+1)
			break
		}
	}
	devs := bs.devs
	bs.mu.Unlock()
	if b == nil {
		return bondErr("delete", name, syscall.ENODEV, "unable to delete non-existent %s", name)
	}
	b.mu.Lock()
	var acts []func()
	for len(b.slaves) > 0 {
		acts = append(acts, b.releaseLocked(b.slaves[len(b.slaves)-1])...)
	}
	b.closed = true
	b.mu.Unlock()
	run(acts)
	b.stopMonitor()
	if devs != nil {
		devs.DeleteBond(b)
	}
	bs.e.notifyName(name)
	bs.e.log.Printf("%s is being deleted...", name)
	bs.e.event("%s: bond deleted", name)
	return nil
}

// MastersText is class/net/bonding_masters: the bonds' names on one line.
func (bs *Bonds) MastersText() string {
	var names []string
	for _, b := range bs.List() {
		names = append(names, b.name)
	}
	if len(names) == 0 {
		return ""
	}
	return strings.Join(names, " ") + "\n"
}

// WriteMasters applies a write of bonding_masters as bonding_store_bonds does: "+name"
// creates, "-name" deletes; anything else (or an invalid name) is EPERM.
func (bs *Bonds) WriteMasters(b []byte) error {
	cmd := scanWord(string(b), ifNameSize)
	if len(cmd) <= 1 || !devValidName(cmd[1:]) || cmd[0] != '+' && cmd[0] != '-' {
		return bondErr("write", "bonding_masters", syscall.EPERM, "no command found in bonding_masters - use +ifname or -ifname")
	}
	if cmd[0] == '+' {
		_, err := bs.Create(cmd[1:])
		return err
	}
	return bs.Delete(cmd[1:])
}

// ---- one bond ----

// slave is an enslaved interface and what the bond keeps about it.
type slave struct {
	i        *Interface
	link     bool // the link monitor's view
	failures int  // link_failure_count
	origMTU  int
	perm     HWAddr // the address it had when enslaved (perm_hwaddr)
	// What the interface's own device reported while it was a slave; given back at
	// release.
	ownAddrs     []netip.Prefix
	ownGroups    []netip.Addr
	ownGroupsSet bool
}

// Bond is one active-backup bond.
type Bond struct {
	bs     *Bonds
	serial uint64
	name   string

	active  atomic.Pointer[Interface] // the data path's view of the active slave
	host    atomic.Pointer[hostRef]
	upA     atomic.Bool
	ifIndex atomic.Int32

	hostMu       sync.Mutex // one push to the host at a time (host.go)
	mu           sync.Mutex
	slaves       []*slave
	primary      string // params.primary: a name, enslaved or not
	primSlave    *slave
	forcePrimary bool
	reselect     uint64 // primary_reselect: always, better or failure
	miimon       int
	fom          uint64
	up, carrier  bool
	noMulticast  bool // IFF_MULTICAST cleared (a flags write, ip link set multicast off)
	flags        devFlags
	mtu          int
	typ          int
	hw           HWAddr
	hwLen        int
	randomAddr   bool
	bcast        HWAddr
	ll           netip.Addr // IPv6 link-local, from the first InfiniBand address
	features     Features
	hostAddrs    []netip.Prefix
	hostGroups   []netip.Addr
	groupsSet    bool
	closed       bool

	txDropped atomic.Uint64
	alias     string // ifalias (under mu)
	carrierCounter

	kick       chan struct{}
	speedKick  chan struct{} // a slave's carrier changed: the monitor pushes the bond's again
	stop, done chan struct{}
}

type hostRef struct{ h Host }

func newBond(bs *Bonds, name string) *Bond {
	b := &Bond{bs: bs, serial: bs.e.serials.Add(1), name: name, miimon: bondDefaultMiimon, fom: fomNone, mtu: 1500, typ: typeEther,
		hwLen: 6, randomAddr: true, features: defaultFeatures,
		kick: make(chan struct{}, 1), speedKick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	b.hw = randomMAC()
	go b.monitor()
	return b
}

// randomMAC is eth_hw_addr_random's address: random, locally administered, unicast.
func randomMAC() HWAddr {
	var a HWAddr
	_, _ = rand.Read(a[:6])
	a[0] = a[0]&0xfe | 0x02
	return a
}

func run(acts []func()) {
	for _, a := range acts {
		a()
	}
}

func (b *Bond) stopMonitor() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
}

func (b *Bond) logf(format string, a ...any) { b.bs.e.log.Printf(b.name+": "+format, a...) }

func (b *Bond) err(op string, errno syscall.Errno, format string, a ...any) error {
	return bondErr(op, b.name, errno, format, a...)
}

// Name returns the bond's name.
func (b *Bond) Name() string { return b.name }

// Serial is a number no other bond or interface of the engine has had (Interface.Serial).
func (b *Bond) Serial() uint64 { return b.serial }

// Listed reports whether the bond still exists: false from the moment a delete takes it
// out of the list.
func (b *Bond) Listed() bool {
	b.bs.mu.Lock()
	defer b.bs.mu.Unlock()
	return slices.Contains(b.bs.list, b)
}

// SpeedMbps is the bond's link speed as bond_ethtool_get_link_ksettings gives it in
// active-backup, the sum over the slaves that can send: the active slave's while it
// has a link and carrier, -1 (unknown) otherwise.
func (b *Bond) SpeedMbps() int {
	b.mu.Lock()
	a := b.active.Load()
	link := false
	if a != nil {
		if s := b.slaveLocked(a); s != nil {
			link = s.link
		}
	}
	b.mu.Unlock()
	if a == nil || !link || !a.Carrier() {
		return -1
	}
	if mbps := a.SpeedMbps(); mbps > 0 {
		return mbps
	}
	return -1
}

// Alias is the bond's alias (ifalias; ip link set alias), "" without one.
func (b *Bond) Alias() string {
	if r := b.host.Load(); r != nil {
		if s, ok := deviceAlias(r.h); ok {
			return s // the device's, as Interface.Alias
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.alias
}

// SetAlias sets the bond's alias, which its kernel device follows, with Interface's
// rules (at most 255 bytes, ends at a NUL, every call reaches the device).
func (b *Bond) SetAlias(s string) error {
	_, err := b.setAlias(s, nil)
	return err
}

// AdoptAlias is SetAlias for an alias someone set on the bond's device, taken only
// while the bond's alias is still prev (see Interface.AdoptAlias).
func (b *Bond) AdoptAlias(prev, s string) (bool, error) {
	return b.setAlias(s, &prev)
}

func (b *Bond) setAlias(s string, prev *string) (bool, error) {
	s, err := checkAlias(s)
	if err != nil {
		return false, b.err("set_alias", syscall.EINVAL, "%v", err)
	}
	b.mu.Lock()
	if prev != nil && b.alias != *prev {
		b.mu.Unlock()
		b.pushAlias() // refused: see Interface.setAlias
		return false, nil
	}
	changed := b.alias != s
	b.alias = s
	b.mu.Unlock()
	if changed {
		b.bs.e.event("%s: alias %q", b.name, s)
	}
	b.pushAlias()
	return true, nil
}

// AttachHost connects the bond's kernel device and pushes its MTU, carrier,
// features, flags and, to a host with a state of its own (AdminHost), up or down.
func (b *Bond) AttachHost(h Host) {
	b.hostMu.Lock() // as Interface.AttachHost
	defer b.hostMu.Unlock()
	b.mu.Lock()
	if h == nil {
		b.host.Store(nil)
	} else {
		b.host.Store(&hostRef{h})
	}
	mtu, carrier, f, mcast, user, up := b.mtu, b.carrier, b.features, !b.noMulticast, b.flags.user(), b.up
	alias := b.alias
	b.mu.Unlock()
	if h != nil {
		if ah, ok := h.(AdminHost); ok {
			ah.SetAdminUp(up)
		}
		h.SetMTU(mtu)
		h.SetCarrier(carrier)
		h.SetOffloads(f)
		if mh, ok := h.(MulticastHost); ok {
			mh.SetMulticast(mcast)
		}
		if uh, ok := h.(UserFlagsHost); ok {
			uh.SetUserFlags(user)
		}
		if alias != "" { // a new device has none
			aliasSender(alias)(h)
		}
	}
}

func (b *Bond) hostLoad() Host {
	if r := b.host.Load(); r != nil {
		return r.h
	}
	return nil
}

// SetIfIndex records the bond's kernel device index (0: none).
func (b *Bond) SetIfIndex(n int) { b.ifIndex.Store(int32(n)) }

// IfIndex is the bond's kernel device index, 0 without one.
func (b *Bond) IfIndex() int { return int(b.ifIndex.Load()) }

// LinkLocal is the bond's IPv6 link-local address: derived from its first slave's
// GUID; invalid before it had a slave.
func (b *Bond) LinkLocal() netip.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ll
}

// SetHostAddrs tells the bond the addresses its kernel device has: the active slave
// answers ARP and ND for them.
func (b *Bond) SetHostAddrs(p []netip.Prefix) {
	b.mu.Lock()
	b.hostAddrs = slices.Clone(p)
	if a := b.active.Load(); a != nil {
		a.setBondView(b.hostAddrs, b.hostGroups, b.groupsSet)
	}
	b.mu.Unlock()
}

// SetHostGroups tells the bond its kernel device's multicast list: the active slave
// joins those groups (the driver syncs the list to the active slave only).
func (b *Bond) SetHostGroups(g []netip.Addr) {
	b.mu.Lock()
	b.hostGroups, b.groupsSet = slices.Clone(g), true
	if a := b.active.Load(); a != nil {
		a.setBondView(b.hostAddrs, b.hostGroups, b.groupsSet)
	}
	b.mu.Unlock()
}

// Transmit sends what the kernel routed out of the bond through the active slave;
// without one (or while the bond is down) the packets are dropped.
func (b *Bond) Transmit(pkts [][]byte) {
	a := b.active.Load()
	if a == nil || !b.upA.Load() {
		b.txDropped.Add(uint64(len(pkts)))
		return
	}
	a.Transmit(pkts)
}

// TxDropped counts packets the bond dropped for want of an active slave.
func (b *Bond) TxDropped() uint64 { return b.txDropped.Load() }

// SetUp follows the bond device's administrative state (bond_open, bond_close): the
// link monitor runs while it is up.
func (b *Bond) SetUp(up bool) {
	b.mu.Lock()
	changed := b.up != up
	b.up = up
	b.upA.Store(up)
	var acts []func()
	if changed && up {
		acts = b.selectActiveLocked()
	}
	b.mu.Unlock()
	run(acts)
	if changed {
		b.bs.e.event("%s: %s", b.name, map[bool]string{true: "up", false: "down"}[up])
		b.pushUp() // a write of flags: the device follows (dev_change_flags)
		b.wake()
	}
}

func (b *Bond) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// IsUp reports the administrative state.
func (b *Bond) IsUp() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.up }

// Carrier reports whether any slave has a link (bond_set_carrier).
func (b *Bond) Carrier() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.carrier }

// OperState is "up" with carrier, else "down" (the bond is its own iflink).
func (b *Bond) OperState() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.up && b.carrier {
		return "up"
	}
	return "down"
}

// Flags is dev->flags: IFF_BROADCAST|IFF_MASTER, IFF_MULTICAST unless cleared, IFF_UP
// when up, PROMISC and ALLMULTI as asked for, and the bits a write stores.
func (b *Bond) Flags() uint32 {
	const iffMaster = 0x400
	b.mu.Lock()
	defer b.mu.Unlock()
	f := uint32(iffBroadcast | iffMaster)
	if !b.noMulticast {
		f |= iffMulticast
	}
	if b.up {
		f |= iffUp
	}
	return f | b.flags.shown()
}

// SetCounted sets the dev->flags bits the bond's kernel device has from its counts
// (kernel.Link.Counted): shown in Flags, with no other effect.
func (b *Bond) SetCounted(f uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flags.counted = f & iffUser
}

// SetFlags applies a write of flags as Interface.SetFlags: up, IFF_MULTICAST,
// IFF_PROMISC and IFF_ALLMULTI, and the bits a netdev only keeps.
func (b *Bond) SetFlags(f uint32) {
	b.SetUp(f&iffUp != 0)
	b.SetMulticast(f&iffMulticast != 0)
	b.mu.Lock()
	b.flags.store(f)
	b.mu.Unlock()
	b.SetUserFlags(f)
}

// SetUserFlags sets the bond's IFF_PROMISC and IFF_ALLMULTI as f has them; its device
// follows. (The bonding driver also passes them on to the active slave, as counts the
// slave's own flags do not show: not done here, where they mean nothing to the link.)
func (b *Bond) SetUserFlags(f uint32) { b.setUserFlags(f, nil) }

// AdoptUserFlags is SetUserFlags for flags someone set on the bond's device, taken
// only while the bond's are still prev (see Interface.AdoptAlias).
func (b *Bond) AdoptUserFlags(prev, f uint32) bool { return b.setUserFlags(f, &prev) }

func (b *Bond) setUserFlags(f uint32, prev *uint32) bool {
	b.mu.Lock()
	if prev != nil && b.flags.user() != *prev&iffUser {
		b.mu.Unlock()
		b.pushUserFlags() // refused: see Interface.setAlias
		return false
	}
	old := b.flags.setUser(f)
	b.mu.Unlock()
	if old == f&iffUser {
		return true
	}
	userFlagEvents(b.bs.e.event, b.name, old, f)
	b.pushUserFlags()
	return true
}

// SetMulticast sets or clears the bond's IFF_MULTICAST; its device follows.
func (b *Bond) SetMulticast(on bool) { b.setMulticast(on, nil) }

// AdoptMulticast is SetMulticast for IFF_MULTICAST someone set on the bond's device,
// taken only while the bond's is still prev (see Interface.AdoptAlias).
func (b *Bond) AdoptMulticast(prev, on bool) bool { return b.setMulticast(on, &prev) }

func (b *Bond) setMulticast(on bool, prev *bool) bool {
	b.mu.Lock()
	if prev != nil && b.noMulticast == *prev {
		b.mu.Unlock()
		b.pushMulticast() // refused: see Interface.setAlias
		return false
	}
	changed := b.noMulticast == on
	b.noMulticast = !on
	b.mu.Unlock()
	if changed {
		b.bs.e.event("%s: multicast %s", b.name, onOff(on))
		b.pushMulticast()
	}
	return true
}

// Type is the device type: 1 (Ethernet) until the first slave, then 32 (InfiniBand),
// as bond_setup_by_slave changes it.
func (b *Bond) Type() int { b.mu.Lock(); defer b.mu.Unlock(); return b.typ }

// AddrLen is 6 until the first slave, then 20.
func (b *Bond) AddrLen() int { b.mu.Lock(); defer b.mu.Unlock(); return b.hwLen }

// HWAddrText is the bond's address: the active slave's (fail_over_mac active), or the
// last one it had; a random Ethernet address before any slave.
func (b *Bond) HWAddrText() string {
	b.mu.Lock()
	hw, n := b.hw, b.hwLen
	b.mu.Unlock()
	if a := b.active.Load(); a != nil {
		hw = a.HWAddr()
	}
	return colonHex(hw[:n])
}

// BroadcastText is the bond's broadcast address (its first slave's).
func (b *Bond) BroadcastText() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.typ != typeInfiniband {
		return "ff:ff:ff:ff:ff:ff"
	}
	return b.bcast.String()
}

func colonHex(b []byte) string {
	var s strings.Builder
	for k, c := range b {
		if k > 0 {
			s.WriteByte(':')
		}
		fmt.Fprintf(&s, "%02x", c)
	}
	return s.String()
}

// MTU returns the bond's MTU.
func (b *Bond) MTU() int { b.mu.Lock(); defer b.mu.Unlock(); return b.mtu }

// SetMTU changes the bond's MTU and every slave's (bond_change_mtu): a slave that
// refuses it (a datagram-mode slave refuses 65520) fails the change and the slaves
// changed before it get the old MTU back.
func (b *Bond) SetMTU(mtu int) error {
	if mtu < bondMinMTU || mtu > bondMaxMTU {
		return b.err("set_mtu", syscall.EINVAL, "MTU %d outside %d..%d", mtu, bondMinMTU, bondMaxMTU)
	}
	b.mu.Lock()
	for k, s := range b.slaves {
		if err := s.i.SetMTU(mtu); err != nil {
			for _, d := range b.slaves[:k] {
				_ = d.i.SetMTU(b.mtu)
			}
			b.mu.Unlock()
			return err
		}
	}
	changed := b.mtu != mtu
	b.mtu = mtu
	b.mu.Unlock()
	if changed {
		b.bs.e.event("%s: mtu %d", b.name, mtu)
		b.pushMTU()
	}
	return nil
}

// Features are the offloads of the bond's device: those every slave has
// (bond_compute_features).
func (b *Bond) Features() Features { b.mu.Lock(); defer b.mu.Unlock(); return b.features }

// Slaves returns the slaves in the order they were enslaved.
func (b *Bond) Slaves() []*Interface {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*Interface, len(b.slaves))
	for k, s := range b.slaves {
		out[k] = s.i
	}
	return out
}

// Active returns the active slave, nil without one.
func (b *Bond) Active() *Interface { return b.active.Load() }

// SlaveInfo is what class/net/<slave>/bonding_slave/ shows.
type SlaveInfo struct {
	State        string // "active" or "backup"
	MIIStatus    string // "up" or "down"
	LinkFailures int
	PermHWAddr   HWAddr
	OriginalMTU  int
	Bond         string
}

// SlaveInfo describes slave i of this bond; ok is false when it is not one.
func (b *Bond) SlaveInfo(i *Interface) (SlaveInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.slaveLocked(i)
	if s == nil {
		return SlaveInfo{}, false
	}
	st, mii := "backup", "down"
	if b.active.Load() == i {
		st = "active"
	}
	if s.link {
		mii = "up"
	}
	return SlaveInfo{State: st, MIIStatus: mii, LinkFailures: s.failures, PermHWAddr: s.perm, OriginalMTU: s.origMTU, Bond: b.name}, true
}

func (b *Bond) slaveLocked(i *Interface) *slave {
	for _, s := range b.slaves {
		if s.i == i {
			return s
		}
	}
	return nil
}

// ---- the bonding/ files ----

// Option returns the text of bonding/<name>, as bond_sysfs.c shows it.
func (b *Bond) Option(name string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch name {
	case "mode":
		return fmt.Sprintf("%s %d\n", tblName(bondModeTbl, bondModeActiveBackup), bondModeActiveBackup), nil
	case "slaves":
		var names []string
		for _, s := range b.slaves {
			names = append(names, s.i.Name())
		}
		if len(names) == 0 {
			return "", nil
		}
		return strings.Join(names, " ") + "\n", nil
	case "active_slave":
		if a := b.active.Load(); a != nil {
			return a.Name() + "\n", nil
		}
		return "", nil
	case "primary":
		if b.primSlave != nil {
			return b.primSlave.i.Name() + "\n", nil
		}
		return "", nil
	case "miimon":
		return fmt.Sprintf("%d\n", b.miimon), nil
	case "fail_over_mac":
		return fmt.Sprintf("%s %d\n", tblName(bondFOMTbl, b.fom), b.fom), nil
	case "primary_reselect":
		return fmt.Sprintf("%s %d\n", tblName(bondReselTbl, b.reselect), b.reselect), nil
	case "mii_status":
		if b.carrier {
			return "up\n", nil
		}
		return "down\n", nil
	}
	return "", b.err("read", syscall.ENOENT, "no bonding option %s", name)
}

// OptionNames are the bonding/ files: the writable options, then mii_status.
var OptionNames = []string{"active_slave", "fail_over_mac", "miimon", "mode", "primary", "primary_reselect", "slaves"}

// SetOption applies a write of bonding/<name> (or one name=value of BONDING_OPTS),
// with the driver's parsing and errnos (bond_opt_parse, __bond_opt_set and each
// option's set function).
func (b *Bond) SetOption(name, val string) error {
	switch name {
	case "mode":
		return b.setMode(val)
	case "miimon":
		v, ok := parseBondOpt(bondIntMaxTbl, val)
		if !ok {
			return b.err(name, syscall.EINVAL, "option miimon: invalid value (%s); allowed values 0 - %d", clipOpt(val), math.MaxInt32)
		}
		b.mu.Lock()
		b.miimon = int(v)
		b.mu.Unlock()
		b.logf("Setting MII monitoring interval to %d", v)
		b.wake()
		return nil
	case "fail_over_mac":
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.slaves) > 0 {
			return b.err(name, syscall.ENOTEMPTY, "option fail_over_mac: unable to set because the bond device has slaves")
		}
		v, ok := parseBondOpt(bondFOMTbl, val)
		if !ok {
			return b.err(name, syscall.EINVAL, "option fail_over_mac: invalid value (%s)", clipOpt(val))
		}
		b.fom = v
		return nil
	case "primary":
		return b.setPrimary(val)
	case "primary_reselect":
		// bond_option_primary_reselect_set: then the active slave is chosen again.
		v, ok := parseBondOpt(bondReselTbl, val)
		if !ok {
			return b.err(name, syscall.EINVAL, "option primary_reselect: invalid value (%s)", clipOpt(val))
		}
		b.mu.Lock()
		b.reselect = v
		b.logf("Setting primary_reselect to %s (%d)", tblName(bondReselTbl, v), v)
		acts := b.selectActiveLocked()
		b.mu.Unlock()
		run(acts)
		return nil
	case "active_slave":
		return b.setActiveSlave(val)
	case "slaves":
		cmd := scanWord(val, ifNameSize)
		if len(cmd) <= 1 || !devValidName(cmd[1:]) || cmd[0] != '+' && cmd[0] != '-' {
			return b.err(name, syscall.EPERM, "no command found in slaves file - use +ifname or -ifname")
		}
		if cmd[0] == '+' {
			return b.Enslave(cmd[1:])
		}
		return b.Release(cmd[1:])
	}
	return b.err("write", syscall.ENOENT, "no bonding option %s", name)
}

func clipOpt(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	return s
}

// setMode: the mode can change only without slaves (ENOTEMPTY) and while the bond is
// down (EBUSY); of the driver's modes only active-backup can have IPoIB slaves, so the
// others are refused (EINVAL) rather than accepted and refused at the first enslave.
func (b *Bond) setMode(val string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.slaves) > 0 {
		return b.err("mode", syscall.ENOTEMPTY, "option mode: unable to set because the bond device has slaves")
	}
	if b.up {
		return b.err("mode", syscall.EBUSY, "option mode: unable to set because the bond device is up")
	}
	v, ok := parseBondOpt(bondModeTbl, val)
	if !ok {
		return b.err("mode", syscall.EINVAL, "option mode: invalid value (%s)", clipOpt(val))
	}
	if v != bondModeActiveBackup {
		return b.err("mode", syscall.EINVAL, "option mode: %s: only active-backup is supported for infiniband slaves", tblName(bondModeTbl, v))
	}
	return nil
}

// setPrimary (bond_option_primary_set): the name is kept even before that interface
// is enslaved; an empty write clears it. Either way the active slave is chosen again.
func (b *Bond) setPrimary(val string) error {
	p, _, _ := strings.Cut(val, "\n")
	if len(p) >= ifNameSize {
		p = p[:ifNameSize-1]
	}
	b.mu.Lock()
	b.primary, b.primSlave = p, nil
	for _, s := range b.slaves {
		if p != "" && s.i.Name() == p {
			// An enslaved primary is taken now whatever primary_reselect says
			// (force_primary).
			b.primSlave, b.forcePrimary = s, true
		}
	}
	switch {
	case p == "":
		b.logf("Setting primary slave to None")
	case b.primSlave != nil:
		b.logf("Setting %s as primary slave", p)
	default:
		b.logf("Recording %s as primary, but it has not been enslaved yet", p)
	}
	acts := b.selectActiveLocked()
	b.mu.Unlock()
	run(acts)
	return nil
}

// setActiveSlave (bond_option_active_slave_set): an empty write clears the active
// slave and lets the bond choose; a name must be an interface (ENODEV), a slave of
// this bond (EINVAL), and up with a link (EINVAL) unless it is already the active one.
func (b *Bond) setActiveSlave(val string) error {
	name := scanWord(val, ifNameSize-1)
	clear := name == "" || strings.HasPrefix(val, "\n")
	// The names are looked up before Bond.mu is taken, as Enslave does: Bonds.mu and
	// Engine.mu come before it in the lock order (package doc).
	var i *Interface
	var known, isBond, other bool
	if !clear {
		i, known = b.bs.e.Interface(name)
		if !known {
			if _, isBond = b.bs.Bond(name); !isBond {
				var d OtherDevice
				if d, other = b.bs.otherDevice(name); other {
					if n := b.bs.engineName(d, name); n != "" {
						name = n // an alternative name of the engine's device
						i, known = b.bs.e.Interface(name)
						_, isBond = b.bs.Bond(name)
					}
				}
			}
		}
	}
	b.mu.Lock()
	var acts []func()
	defer func() { b.mu.Unlock(); run(acts) }()
	if clear {
		acts = append(b.changeActiveLocked(nil), b.selectActiveLocked()...)
		return nil
	}
	if !known {
		if isBond || other {
			return b.err("active_slave", syscall.EINVAL, "Device %s is not bonding slave", name)
		}
		return b.err("active_slave", syscall.ENODEV, "no interface %s", name)
	}
	s := b.slaveLocked(i)
	if s == nil {
		if i.bond.Load() == nil {
			return b.err("active_slave", syscall.EINVAL, "Device %s is not bonding slave", name)
		}
		return b.err("active_slave", syscall.EINVAL, "Device %s is not our slave", name)
	}
	old := b.active.Load()
	if old == i {
		return nil
	}
	if old == nil || !s.link || !i.IsUp() {
		return b.err("active_slave", syscall.EINVAL, "Could not set %s as active slave; either %s is down or the link is down", name, name)
	}
	acts = b.changeActiveLocked(s)
	return nil
}

// Enslave makes interface name a slave (bond_enslave), in the driver's order of
// checks: no such device ENODEV (a bond EPERM; another device of the namespace EPERM
// when a master, EBUSY in use, EPERM while up, else EINVAL beside slaves and
// EOPNOTSUPP without; an alternative name of an engine's device is that device),
// already a slave
// EBUSY, up EPERM (ifenslave and ifup bring a slave down first), another partition
// than the other slaves EINVAL (the driver's "different type"), fail_over_mac other
// than active once there are slaves EOPNOTSUPP, and the bond's MTU refused by the
// slave. The slave is opened, its link looked at, and the active slave chosen.
func (b *Bond) Enslave(name string) error {
	i, ok := b.bs.e.Interface(name)
	if !ok {
		if name == b.name {
			return b.err("enslave", syscall.EPERM, "cannot enslave bond to itself")
		}
		if _, isBond := b.bs.Bond(name); isBond {
			return b.err("enslave", syscall.EPERM, "%s is a bond: only IPoIB interfaces can be slaves", name)
		}
		d, other := b.bs.otherDevice(name)
		if !other {
			return b.err("enslave", syscall.ENODEV, "interface %s does not exist", name)
		}
		if n := b.bs.engineName(d, name); n != "" {
			return b.Enslave(n) // an alternative name of the engine's device
		}
		// A device of the namespace that is not an IPoIB interface of the engine, in
		// the driver's order: a master that is not a bond, a device in use, up,
		// then another type than the slaves'. With no slave yet the driver would
		// turn the bond into one of that type: here bonds are IPoIB only.
		switch {
		case d.Master:
			return b.err("enslave", syscall.EPERM, "Device %s is a master device (not a bond) and cannot be enslaved", name)
		case d.Busy:
			return b.err("enslave", syscall.EBUSY, "Device %s is in use and cannot be enslaved", name)
		case d.Up:
			return b.err("enslave", syscall.EPERM, "Device %s can not be enslaved while up", name)
		}
		b.mu.Lock()
		slaves := len(b.slaves)
		b.mu.Unlock()
		if slaves > 0 {
			return b.err("enslave", syscall.EINVAL, "Device %s type is different from other slaves", name)
		}
		return b.err("enslave", syscall.EOPNOTSUPP, "%s is not an IPoIB interface of this engine: only those can be slaves here", name)
	}
	b.mu.Lock()
	var acts []func()
	defer func() { b.mu.Unlock(); run(acts) }()
	if b.closed {
		return b.err("enslave", syscall.ENODEV, "%s is being deleted", b.name)
	}
	if m := i.bond.Load(); m != nil {
		return b.err("enslave", syscall.EBUSY, "Device %s is in use and cannot be enslaved (a slave of %s)", name, m.name)
	}
	if i.IsUp() {
		return b.err("enslave", syscall.EPERM, "Device %s can not be enslaved while up", name)
	}
	if len(b.slaves) > 0 && i.Broadcast() != b.bcast {
		return b.err("enslave", syscall.EINVAL, "%s is in partition 0x%04x, the other slaves in 0x%04x: different broadcast addresses, can not enslave it",
			name, uint16(i.PKey()), uint16(b.slaves[0].i.PKey()))
	}
	if b.fom != fomActive {
		if len(b.slaves) > 0 {
			return b.err("enslave", syscall.EOPNOTSUPP, "%s does not support setting the MAC address, but fail_over_mac is not set to active", name)
		}
		b.fom = fomActive
		b.logf("(slave %s): The slave device specified does not support setting the MAC address; Setting fail_over_mac to active for active-backup mode", name)
	}
	// The first slave sets the bond up as an InfiniBand device (bond_setup_by_slave:
	// type, address length, broadcast; not the MTU, which the slaves take from the
	// bond, dev_set_mtu in bond_enslave) and gives it its address; undone if
	// enslaving fails.
	saved := struct {
		typ, hwLen, mtu int
		hw, bcast       HWAddr
		random          bool
		ll              netip.Addr
	}{b.typ, b.hwLen, b.mtu, b.hw, b.bcast, b.randomAddr, b.ll}
	undo := func() {
		b.typ, b.hwLen, b.mtu, b.hw, b.bcast, b.randomAddr, b.ll = saved.typ, saved.hwLen, saved.mtu, saved.hw, saved.bcast, saved.random, saved.ll
	}
	if len(b.slaves) == 0 {
		if b.typ != typeInfiniband {
			b.typ, b.hwLen = typeInfiniband, HWAddrLen
		}
		b.bcast = i.Broadcast()
		if b.randomAddr {
			b.hw, b.randomAddr = i.HWAddr(), false
			if !b.ll.IsValid() {
				b.ll = i.LinkLocal()
			}
		}
	}
	s := &slave{i: i, origMTU: i.MTU(), perm: i.HWAddr()}
	if err := i.SetMTU(b.mtu); err != nil {
		undo()
		return err
	}
	if !i.bond.CompareAndSwap(nil, b) {
		_ = i.SetMTU(s.origMTU)
		undo()
		return b.err("enslave", syscall.EBUSY, "Device %s is in use and cannot be enslaved", name)
	}
	i.mu.Lock()
	s.ownAddrs, s.ownGroups, s.ownGroupsSet = i.data().hostAddrs, i.hostGroups, i.hostGroupsSet
	i.setLocked(func(d *dataState) { d.hostAddrs = nil })
	i.hostGroups, i.hostGroupsSet = nil, false
	i.mu.Unlock()
	if err := i.SetUp(true); err != nil {
		i.bond.Store(nil)
		i.setBondView(s.ownAddrs, s.ownGroups, s.ownGroupsSet)
		_ = i.SetMTU(s.origMTU)
		undo()
		return err
	}
	s.link = b.miimon == 0 || i.IsUp() && i.Carrier()
	if b.primary != "" && b.primary == name {
		b.primSlave, b.forcePrimary = s, true
	}
	b.slaves = append(b.slaves, s)
	acts = append(acts, b.hostSetupLocked(saved.typ != b.typ || saved.mtu != b.mtu, saved.ll != b.ll)...)
	acts = append(acts, b.selectActiveLocked()...)
	acts = append(acts, b.carrierLocked()...)
	role, link := "a backup", "a down"
	if b.active.Load() == i {
		role = "an active"
	}
	if s.link {
		link = "an up"
	}
	b.logf("(slave %s): Enslaving as %s interface with %s link", name, role, link)
	b.bs.e.event("%s: enslaved %s", b.name, name)
	return nil
}

// hostSetupLocked recomputes the bond's features from its slaves and returns the host
// calls for a changed MTU, link-local address and features.
func (b *Bond) hostSetupLocked(mtuChanged, llChanged bool) []func() {
	f := defaultFeatures
	for _, s := range b.slaves {
		sf := s.i.Features()
		f.RxChecksum = f.RxChecksum && sf.RxChecksum
		f.TxChecksum = f.TxChecksum && sf.TxChecksum
		f.TSO = f.TSO && sf.TSO
		f.GRO = f.GRO && sf.GRO
	}
	fChanged := f != b.features
	b.features = f
	if b.hostLoad() == nil {
		return nil
	}
	return []func(){func() {
		if mtuChanged {
			b.pushMTU()
		}
		if fChanged {
			b.pushOffloads()
		}
		if llChanged {
			b.pushLinkLocal()
		}
	}}
}

// Release takes interface name out of the bond (bond_release): no such device ENODEV,
// not a slave of this bond (or a device that is not an interface) EINVAL. A released slave gets its MTU back and is
// closed, as the driver leaves it.
func (b *Bond) Release(name string) error {
	i, ok := b.bs.e.Interface(name)
	if !ok {
		// A bond or another device of the namespace exists and is no slave: the
		// driver's "cannot release" (EINVAL).
		if _, isBond := b.bs.Bond(name); isBond {
			return b.err("release", syscall.EINVAL, "cannot release %s: not a slave of %s", name, b.name)
		}
		if d, other := b.bs.otherDevice(name); other {
			if n := b.bs.engineName(d, name); n != "" {
				return b.Release(n) // an alternative name of the engine's device
			}
			return b.err("release", syscall.EINVAL, "cannot release %s: not a slave of %s", name, b.name)
		}
		return b.err("release", syscall.ENODEV, "interface %s does not exist", name)
	}
	return b.release(i, name)
}

// release is Release of interface i, looked up by name before Bond.mu is taken (the
// lock order), so it may have been deleted since.
func (b *Bond) release(i *Interface, name string) error {
	b.mu.Lock()
	s := b.slaveLocked(i)
	if s == nil {
		b.mu.Unlock()
		return b.err("release", syscall.EINVAL, "cannot release %s: not a slave of %s", name, b.name)
	}
	// A slave deleted before this write goes first, as its unregister would have
	// released it already (the engine's watch may not have run yet). s itself may be
	// among them (deleted since it was looked up): then it is gone, as the driver
	// answers once the device is unregistered, and the bond may go with it.
	acts, destroy := b.releaseGoneLocked()
	gone := !slices.Contains(b.slaves, s)
	if !gone {
		acts = append(acts, b.releaseLocked(s)...)
	}
	b.mu.Unlock()
	run(acts)
	if destroy {
		b.logf("Destroying bond")
		_ = b.bs.DeleteBond(b)
	}
	if gone {
		return b.err("release", syscall.ENODEV, "interface %s does not exist", name)
	}
	return nil
}

// releaseGone releases slaves whose interface no longer exists (a child deleted while
// enslaved, as NETDEV_UNREGISTER releases it).
//
// As bond_slave_netdev_event's NETDEV_UNREGISTER: a bond whose type is not Ethernet
// (InfiniBand, from its first slave) is destroyed with its last slave
// (bond_release_and_destroy); a release through the slaves file leaves it.
func (b *Bond) releaseGone() {
	b.mu.Lock()
	acts, destroy := b.releaseGoneLocked()
	b.mu.Unlock()
	run(acts)
	if destroy {
		b.logf("Destroying bond")
		_ = b.bs.DeleteBond(b) // ENODEV: deleted meanwhile
	}
}

// releaseGoneLocked releases the slaves whose interface is gone and says whether the
// bond is to be destroyed; it is then closed at once (an Enslave meanwhile is
// ENODEV), as the driver releases and destroys in one step under RTNL.
func (b *Bond) releaseGoneLocked() (acts []func(), destroy bool) {
	gone := 0
	for _, s := range slices.Clone(b.slaves) {
		if i, ok := b.bs.e.Interface(s.i.Name()); !ok || i != s.i {
			acts = append(acts, b.releaseLocked(s)...)
			gone++
		}
	}
	destroy = gone > 0 && len(b.slaves) == 0 && b.typ != typeEther && !b.closed
	if destroy {
		b.closed = true
	}
	return acts, destroy
}

func (b *Bond) releaseLocked(s *slave) []func() {
	wasActive := b.active.Load() == s.i
	k := slices.Index(b.slaves, s)
	b.slaves = slices.Delete(b.slaves, k, k+1)
	if b.primSlave == s {
		b.primSlave = nil
	}
	var acts []func()
	if wasActive {
		acts = append(acts, b.changeActiveLocked(nil)...)
		acts = append(acts, b.selectActiveLocked()...)
	}
	if len(b.slaves) == 0 {
		// eth_hw_addr_random: six random bytes; the rest of an InfiniBand-type
		// bond's 20 keep the last slave's.
		r := randomMAC()
		copy(b.hw[:6], r[:6])
		b.randomAddr = true
	}
	acts = append(acts, b.carrierLocked()...)
	acts = append(acts, b.hostSetupLocked(false, false)...)
	i := s.i
	i.bond.Store(nil)
	i.setBondView(s.ownAddrs, s.ownGroups, s.ownGroupsSet)
	role := "backup"
	if wasActive {
		role = "active"
	}
	b.logf("(slave %s): Releasing %s interface", i.Name(), role)
	b.bs.e.event("%s: released %s", b.name, i.Name())
	return append(acts, func() {
		_ = i.SetMTU(s.origMTU)
		_ = i.SetUp(false) // the driver closes a released slave
	})
}

// ---- link monitoring and failover ----

// monitor is the MII monitor (bond_mii_monitor): every miimon ms it looks at each
// slave's link and, when one changed, chooses the active slave again.
func (b *Bond) monitor() {
	defer close(b.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		b.mu.Lock()
		ms := b.miimon
		b.mu.Unlock()
		d := time.Hour
		if ms > 0 {
			d = time.Duration(ms) * time.Millisecond
		}
		t.Reset(d)
		for waiting := true; waiting; {
			select {
			case <-b.stop:
				return
			case <-b.speedKick:
				// The carrier push carries the link settings, the active slave's,
				// which its carrier changes (with or without miimon: the bond's own
				// carrier and active slave stay as they are until the next check,
				// whose time this does not put off).
				b.pushCarrier()
			case <-b.kick:
				waiting = false
			case <-t.C:
				waiting = false
			}
		}
		b.miiCheck()
	}
}

// slaveCarrierChanged tells the monitor a slave's carrier changed, without waiting
// (from the slave's push, under the slave's locks: the push itself takes Bond.hostMu,
// above them).
func (b *Bond) slaveCarrierChanged() {
	select {
	case b.speedKick <- struct{}{}:
	default:
	}
}

// miiCheck is one round of the MII monitor.
func (b *Bond) miiCheck() {
	b.mu.Lock()
	if b.closed || !b.up || b.miimon == 0 {
		b.mu.Unlock()
		return
	}
	changed := false
	for _, s := range b.slaves {
		link := s.i.IsUp() && s.i.Carrier()
		if link == s.link {
			continue
		}
		s.link, changed = link, true
		if link {
			b.logf("(slave %s): link status definitely up", s.i.Name())
		} else {
			s.failures++
			b.logf("(slave %s): link status definitely down, disabling slave", s.i.Name())
		}
		b.bs.e.event("%s: slave %s link %s", b.name, s.i.Name(), map[bool]string{true: "up", false: "down"}[link])
	}
	var acts []func()
	if changed || b.active.Load() == nil && len(b.slaves) > 0 {
		acts = b.selectActiveLocked()
	}
	acts = append(acts, b.carrierLocked()...)
	b.mu.Unlock()
	run(acts)
}

// bestLocked is bond_find_best_slave for active-backup: the primary or the active
// slave as bond_choose_primary_or_current chooses (the primary when it has a link and
// the active slave has none, was just enslaved, or primary_reselect says so: always;
// better, when its speed is higher, read now as the driver's is refreshed at each
// link change; failure, never while the active slave has a link), else the first
// slave with a link.
func (b *Bond) bestLocked() *slave {
	var curr *slave
	if a := b.active.Load(); a != nil {
		curr = b.slaveLocked(a)
	}
	prim := b.primSlave
	currUp := curr != nil && curr.link
	if prim != nil && prim.link {
		force := b.forcePrimary
		b.forcePrimary = false
		switch {
		case force || !currUp || b.reselect == reselectAlways:
			return prim
		case b.reselect == reselectBetter && prim.i.SpeedMbps() > curr.i.SpeedMbps():
			// The driver compares the duplex too when the speeds are equal; an
			// IPoIB link is always full duplex, so equal speeds keep the current.
			return prim
		}
		return curr
	}
	if currUp {
		return curr
	}
	for _, s := range b.slaves {
		if s.link {
			return s
		}
	}
	return nil
}

// selectActiveLocked makes the best slave the active one (bond_select_active_slave).
func (b *Bond) selectActiveLocked() []func() {
	best := b.bestLocked()
	if a := b.active.Load(); best == nil && a != nil && b.slaveLocked(a) != nil {
		// No slave has a link: the driver keeps none active.
		acts := b.changeActiveLocked(nil)
		b.logf("now running without any active interface!")
		return acts
	}
	return b.changeActiveLocked(best)
}

// changeActiveLocked makes s (nil: none) the active slave (bond_change_active_slave):
// the old one loses the bond's addresses and groups, the new one gets them and, when
// the bond is up, announces itself to the peers.
func (b *Bond) changeActiveLocked(s *slave) []func() {
	old := b.active.Load()
	var next *Interface
	if s != nil {
		next = s.i
	}
	if old == next {
		return nil
	}
	b.active.Store(next)
	if old != nil && old.bond.Load() == b {
		old.setBondView(nil, nil, false)
	}
	if next == nil {
		b.bs.e.event("%s: no active slave", b.name)
		if b.hostLoad() != nil {
			return []func(){b.pushCarrier}
		}
		return nil
	}
	next.setBondView(b.hostAddrs, b.hostGroups, b.groupsSet)
	b.hw = next.HWAddr() // fail_over_mac active: the bond takes the active slave's address
	if old != nil {
		b.logf("(slave %s): making interface the new active one", next.Name())
	} else {
		b.logf("(slave %s): making interface the new active one (no previous active)", next.Name())
	}
	b.bs.e.event("%s: active slave %s", b.name, next.Name())
	var acts []func()
	if b.hostLoad() != nil {
		acts = append(acts, b.pushCarrier) // and with it the link settings, the active slave's
	}
	if !b.up || !s.link {
		return acts
	}
	return append(acts, next.announce)
}

// carrierLocked sets the bond's carrier: on while any slave has a link.
func (b *Bond) carrierLocked() []func() {
	on := false
	for _, s := range b.slaves {
		on = on || s.link
	}
	if on == b.carrier {
		return nil
	}
	b.carrier = on
	b.count(on)
	b.bs.e.event("%s: carrier %s", b.name, onOff(on))
	if b.hostLoad() == nil {
		return nil
	}
	return []func(){b.pushCarrier}
}

// ---- the slave's side ----

// Master returns the bond the interface is a slave of, nil when it is none's.
func (i *Interface) Master() *Bond { return i.bond.Load() }

// upperHost is where the interface's received packets go: its own host, or while it is
// a slave the bond's, from the active slave only (a backup's are dropped).
func (i *Interface) upperHost() Host {
	b := i.bond.Load()
	if b == nil {
		return i.data().host
	}
	if b.active.Load() != i {
		return nil
	}
	return b.hostLoad()
}

// slaveHostAddrs keeps addresses the interface's own device reports while it is a
// slave (given back at release) and reports whether it is one.
func (i *Interface) slaveHostAddrs(p []netip.Prefix) bool {
	b := i.bond.Load()
	if b == nil {
		return false
	}
	b.mu.Lock()
	if s := b.slaveLocked(i); s != nil {
		s.ownAddrs = slices.Clone(p)
	}
	b.mu.Unlock()
	return true
}

// slaveHostGroups is slaveHostAddrs for the device's multicast list.
func (i *Interface) slaveHostGroups(g []netip.Addr) bool {
	b := i.bond.Load()
	if b == nil {
		return false
	}
	b.mu.Lock()
	if s := b.slaveLocked(i); s != nil {
		s.ownGroups, s.ownGroupsSet = slices.Clone(g), true
	}
	b.mu.Unlock()
	return true
}

// setBondView sets the addresses and groups the interface answers and joins for.
func (i *Interface) setBondView(addrs []netip.Prefix, groups []netip.Addr, groupsSet bool) {
	i.mu.Lock()
	addrs = slices.Clone(addrs)
	i.setLocked(func(d *dataState) { d.hostAddrs = addrs })
	i.hostGroups, i.hostGroupsSet = slices.Clone(groups), groupsSet
	i.mu.Unlock()
	i.wake()
}

var allNodes = netip.MustParseAddr("ff02::1")

// announce tells the peers that the interface now has its addresses
// (NETDEV_NOTIFY_PEERS after a failover): a gratuitous ARP request for each IPv4
// address, broadcast, and an unsolicited neighbour advertisement (override, not
// solicited) for each IPv6 address, to all nodes.
func (i *Interface) announce() {
	type send struct {
		frame []byte
		ah    verbs.AH
	}
	var out []send
	i.dmu.Lock()
	d := i.data()
	seen := map[netip.Addr]bool{}
	for _, p := range d.hostAddrs {
		a := p.Addr()
		if seen[a] || !a.IsValid() {
			continue
		}
		seen[a] = true
		var frame []byte
		var mgid verbs.GID
		if a.Is4() {
			r := arpPacket{Op: arpRequest, SenderHW: i.hw, SenderIP: a, TargetIP: a}
			frame, mgid = r.appendFrame(nil), d.bcast.GID()
		} else {
			frame = i.ndFrame(icmpv6NA, a, allNodes, a, ndOptTgtLL, naFlagOverrid)
			mgid = mgidForIP(allNodes, d.bcast)
		}
		if ah, ok := i.sendMulticastLocked(mgid, frame); ok {
			out = append(out, send{frame, ah})
		}
	}
	i.dmu.Unlock()
	for _, o := range out {
		i.sendFrames([][]byte{o.frame}, o.ah, verbs.MulticastQPN)
	}
	i.e.event("%s: announced %d addresses", i.Name(), len(seen))
}

// CheckBondOption checks one name=value of an ifcfg file's BONDING_OPTS, for the options
// bonds have here, as a write of bonding/<name> would parse it: EINVAL for a bad value
// or a mode other than active-backup, ENOENT for an option bonds do not have.
func CheckBondOption(name, val string) error {
	var tbl []optValue
	switch name {
	case "mode":
		v, ok := parseBondOpt(bondModeTbl, val)
		if !ok {
			return bondErr(name, "BONDING_OPTS", syscall.EINVAL, "invalid value (%s)", clipOpt(val))
		}
		if v != bondModeActiveBackup {
			return bondErr(name, "BONDING_OPTS", syscall.EINVAL, "%s: only active-backup is supported for infiniband slaves", tblName(bondModeTbl, v))
		}
		return nil
	case "miimon":
		tbl = bondIntMaxTbl
	case "fail_over_mac":
		tbl = bondFOMTbl
	case "primary_reselect":
		tbl = bondReselTbl
	case "primary", "active_slave":
		if val != "" && !devValidName(val) {
			return bondErr(name, "BONDING_OPTS", syscall.EINVAL, "%q is not an interface name", clipOpt(val))
		}
		return nil
	default:
		return bondErr(name, "BONDING_OPTS", syscall.ENOENT, "no bonding option %s", name)
	}
	if _, ok := parseBondOpt(tbl, val); !ok {
		return bondErr(name, "BONDING_OPTS", syscall.EINVAL, "invalid value (%s)", clipOpt(val))
	}
	return nil
}
