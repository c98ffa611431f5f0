package ipoib

import (
	"errors"
	"fmt"
	"log"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
)

// Error is an engine error naming the operation, the interface or file, and the errno.
type Error struct {
	Op     string // "write", "create_child", "set_mtu" ...
	If     string // interface name or tree path
	Err    error  // a syscall.Errno
	Detail string // one line: why
}

func (e *Error) Error() string {
	s := e.Op + " " + e.If + ": " + e.Err.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Host is the kernel side of an interface.
type Host interface {
	// Deliver hands received IP packets (no link header) to the kernel. The packets
	// may be the HCA's receive buffers: they are the host's until Deliver returns,
	// and the control path (a QP restart) waits for it, so Deliver must not wait on
	// anything that calls the engine.
	Deliver(pkts [][]byte)
	// SetMTU follows the interface MTU.
	SetMTU(mtu int)
	// SetCarrier follows the interface carrier.
	SetCarrier(on bool)
	// SetOffloads follows the interface's enabled features.
	SetOffloads(f Features)
}

// FrameHost is a Host that takes received packets in place: DeliverFrames gets frames
// whose packet starts at offset, and may overwrite the bytes before it (a kernel
// device's own header goes there), sparing the copy Deliver makes; FrameHeadroom is
// what it needs before a packet. Connected mode's receive buffers have that room.
type FrameHost interface {
	FrameHeadroom() int
	DeliverFrames(frames [][]byte, offset int)
}

// AdminHost is a Host whose device has an administrative state of its own (a kernel
// network device): the engine sets it when the interface goes up or down by itself,
// such as a child following its parent.
type AdminHost interface {
	SetAdminUp(up bool)
}

// TxQueueHost is a Host whose device has a transmit queue length of its own. The
// device may refuse a length (a TUN's ring past what the kernel allocates: ENOMEM),
// as a netdev's qdisc may: the error goes back to the writer.
type TxQueueHost interface {
	SetTxQueueLen(n uint32) error
}

// AliasHost is a Host whose device has an alias of its own (IFLA_IFALIAS).
type AliasHost interface {
	SetAlias(s string)
}

// MulticastHost is a Host whose device has an IFF_MULTICAST flag of its own.
type MulticastHost interface {
	SetMulticast(on bool)
}

// UserFlagsHost is a Host whose device has IFF_PROMISC and IFF_ALLMULTI of its own;
// SetUserFlags gets both, as dev->flags bits.
type UserFlagsHost interface {
	SetUserFlags(f uint32)
}

// Options configure an engine.
type Options struct {
	Params *Params
	// Clock runs the engine's timers (joins, retries, reaping) and the CM's; nil is
	// the real clock. Tests pass a clock.Mock to run them on virtual time.
	Clock  clock.Clock
	Logger *log.Logger // the engine's messages; nil = log.Default()
	// Trace receives the debug_level / mcast_debug_level lines (which those parameters
	// switch on); nil = Logger.
	Trace *log.Logger
	// NameTemplate for parents, "%d" replaced by port-1 (default "ib%d").
	NameTemplate string
	// PortNames, by port number, names those ports' parents instead (names.go).
	PortNames map[int]string
	// Event receives one line per state change ("ib0: carrier on"): carrier, up/down,
	// MTU, mode, port events, joins and leaves, paths, connections, children. It must
	// not block (the tree's EventLog does not). nil discards.
	Event func(line string)

	// GIDMode runs every interface without the SA, taking groups and paths from GIDs
	// (gidmode.go); ports whose link layer is Ethernet (RoCE) run so anyway.
	GIDMode bool

	// wrapSA, for tests, stands between each interface and its SA client.
	wrapSA func(saClient) saClient
}

// timers are the intervals the kernel driver has as constants. Engine.tm holds them so
// that tests can shorten them.
type timers struct {
	arpInterval  time.Duration // between ARP requests / solicitations for a neighbour
	pathRetry    time.Duration // a failed path query is not repeated sooner
	joinBackoff  time.Duration // before the first retry of a failed join; then doubles
	maxBackoff   time.Duration // IPOIB_MAX_BACKOFF_SECONDS
	sendOnlyIdle time.Duration // send-only groups unused this long are left
	cmRxIdle     time.Duration // passive connections idle this long are torn down
	neighGC      time.Duration // between rounds of the neighbour GC
}

// defaultTimers are the driver's: send-only groups go with their neighbour, reaped
// after two ARP gc_intervals (30 s) idle.
var defaultTimers = timers{arpInterval: arpInterval, pathRetry: time.Second,
	joinBackoff: time.Second, maxBackoff: maxBackoff, sendOnlyIdle: 60 * time.Second, cmRxIdle: cmRxIdle,
	neighGC: neighGC}

// Devices makes and removes the kernel device of each interface in step with the
// engine, as the driver registers a netdev inside create_child: Create runs before
// CreateChild returns (its error undoes the child and is the write's error) and Delete
// before DeleteChild returns.
type Devices interface {
	Create(i *Interface) error
	Delete(i *Interface)
}

// Engine runs IPoIB on every port of one HCA.
type Engine struct {
	dev    verbs.Device
	params *Params
	log    *log.Logger
	trace  *log.Logger
	emit   func(string)
	clk    clock.Clock
	start  time.Time
	tm     atomic.Pointer[timers]
	wrapSA func(saClient) saClient

	gidMode bool // Options.GIDMode (gidmode.go)

	cms map[int]*cm.Manager // per port, when the HCA supports RC (connected mode)

	serials atomic.Uint64 // the last Serial given to an interface or bond

	// warn limits the send path's warnings as ipoib_warn does: 100 in 10 s for
	// each warning (sendWarnf).
	warn [numSendWarns]*ratelimit

	mu      sync.Mutex
	ifs     map[string]*Interface
	closed  bool
	subs    map[chan string]struct{}
	devices Devices

	stopEv func()
	evDone chan struct{} // closed when eventLoop has returned
	done   chan struct{}
}

// New starts an engine with one parent interface per port of dev.
func New(dev verbs.Device, o Options) (*Engine, error) {
	if o.Params == nil {
		o.Params = DefaultParams()
	}
	if o.Logger == nil {
		o.Logger = log.Default()
	}
	if o.NameTemplate == "" {
		o.NameTemplate = "ib%d"
	}
	if o.Trace == nil {
		o.Trace = o.Logger
	}
	names, err := o.parentNames(dev.NumPorts())
	if err != nil {
		return nil, err
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	e := &Engine{dev: dev, params: o.Params, log: o.Logger, trace: o.Trace, emit: o.Event, clk: o.Clock, start: o.Clock.Now(),
		ifs: map[string]*Interface{}, subs: map[chan string]struct{}{}, done: make(chan struct{}), wrapSA: o.wrapSA, gidMode: o.GIDMode}
	for k := range e.warn {
		e.warn[k] = newWarnLimit(sendWarnNames[k])
	}
	tm := defaultTimers
	e.tm.Store(&tm)
	events, stop := dev.Subscribe(64)
	e.stopEv, e.evDone = stop, make(chan struct{})
	go e.eventLoop(events)
	e.cms = map[int]*cm.Manager{}
	if cmSupported(dev) {
		for n := 1; n <= dev.NumPorts(); n++ {
			mgr, err := cm.New(dev, n, cm.WithClock(e.clk))
			if err != nil {
				e.log.Printf("port %d: no connection manager, connected mode unavailable: %v", n, err)
				continue
			}
			e.cms[n] = mgr
		}
	}
	for n := 1; n <= dev.NumPorts(); n++ {
		name := names[n-1]
		i, err := newInterface(e, name, n, nil, 0)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.mu.Lock() // the event loop, running already, reads the table
		e.ifs[name] = i
		e.mu.Unlock()
	}
	return e, nil
}

// Device returns the HCA the engine runs on.
func (e *Engine) Device() verbs.Device { return e.dev }

// Params returns the module parameters.
func (e *Engine) Params() *Params { return e.params }

// SetDevices installs the device maker and makes the devices of the interfaces that
// exist (the parents); an error there is returned and the caller decides.
func (e *Engine) SetDevices(d Devices) error {
	e.mu.Lock()
	e.devices = d
	e.mu.Unlock()
	var errs []error
	for _, i := range e.Interfaces() {
		if err := d.Create(i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (e *Engine) devicesSnapshot() Devices {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.devices
}

// Rename gives an interface a new name, as a rename of its netdev does: the tree and
// the debug files follow. The name must be a valid interface name not used by another
// interface (EEXIST); children keep their names.
func (e *Engine) Rename(i *Interface, name string) error {
	fail := func(errno syscall.Errno, detail string) error {
		return &Error{Op: "rename", If: i.Name(), Err: errno, Detail: detail}
	}
	if err := validIfName(name); err != nil {
		return fail(syscall.EINVAL, err.Error())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := i.Name()
	if old == name {
		return nil
	}
	if e.ifs[old] != i {
		return fail(syscall.ENODEV, "no longer exists")
	}
	if _, taken := e.ifs[name]; taken {
		return fail(syscall.EEXIST, name+" exists")
	}
	delete(e.ifs, old)
	e.ifs[name] = i
	i.renames.Add(1) // before the name: a reader of the name, then the count, sees a change
	i.name.Store(&name)
	e.log.Printf("%s: renamed %s", old, name)
	e.event("%s: renamed %s", old, name)
	e.notifyLocked(old)
	e.notifyLocked(name)
	return nil
}

// Interfaces returns all interfaces sorted by name.
func (e *Engine) Interfaces() []*Interface {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*Interface, 0, len(e.ifs))
	for _, i := range e.ifs {
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name() < out[b].Name() })
	return out
}

// Interface returns the interface with that name.
func (e *Engine) Interface(name string) (*Interface, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i, ok := e.ifs[name]
	return i, ok
}

// Watch returns a channel that receives an interface name whenever an interface is
// added, removed or renamed (both names), and a cancel function. Nothing is lost: when
// the channel is full its oldest name is replaced by "", which means "names changed that
// are not listed: look at all of them".
func (e *Engine) Watch() (<-chan string, func()) {
	ch := make(chan string, 64)
	e.mu.Lock()
	e.subs[ch] = struct{}{}
	e.mu.Unlock()
	return ch, func() {
		e.mu.Lock()
		delete(e.subs, ch)
		e.mu.Unlock()
	}
}

// notifyName tells the watchers that a name in class/net came or went outside the
// interface table (a bond), so caches of names drop it too.
func (e *Engine) notifyName(name string) {
	e.mu.Lock()
	e.notifyLocked(name)
	e.mu.Unlock()
}

func (e *Engine) notifyLocked(name string) {
	for ch := range e.subs {
		select {
		case ch <- name:
			continue
		default:
		}
		// Full: the reader is behind. Make room and say that a name went missing.
		select {
		case <-ch:
		default:
		}
		select {
		case ch <- "":
		default:
		}
	}
}

// Close stops every interface.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	ifs := make([]*Interface, 0, len(e.ifs))
	for _, i := range e.ifs {
		ifs = append(ifs, i)
	}
	e.mu.Unlock()
	if e.stopEv != nil {
		e.stopEv()
		<-e.evDone // the loop ends with the closed subscription
	}
	// Children first, as ipoib_remove_one does.
	sort.Slice(ifs, func(a, b int) bool { return ifs[a].parent != nil && ifs[b].parent == nil })
	for _, i := range ifs {
		i.close()
	}
	for _, m := range e.cms {
		m.Close()
	}
}

// eventLoop dispatches port events as ipoib_event does: CLIENT_REREGISTER, GID_CHANGE
// and SM_CHANGE flush lightly (rejoin groups; carrier and unicast stay), PORT_ERR,
// PORT_ACTIVE and LID_CHANGE normally (carrier off, paths too), PKEY_CHANGE heavily
// (re-find the P_Key and restart the QP; nothing when the interface's key and index
// did not change).
func (e *Engine) eventLoop(ch <-chan verbs.Event) {
	defer close(e.evDone)
	for ev := range ch {
		var level flushLevel
		switch ev.Type {
		case verbs.EventClientReregister, verbs.EventGIDChange, verbs.EventSMChange:
			level = flushLight
		case verbs.EventPKeyChange:
			level = flushHeavy
		default:
			level = flushNormal
		}
		e.tracef(1, "port %d event %v: %v flush", ev.Port, ev.Type, level)
		e.event("port %d: %v", ev.Port, ev.Type)
		e.flushPort(ev.Port, level)
	}
}

// flushParallel bounds the interfaces a port event flushes at once.
const flushParallel = 64

// flushPort flushes the port's interfaces, at most flushParallel at a time, and
// returns when all are done. The driver flushes each on its own ordered workqueue, so
// one interface's leaves, waiting up to 3 s for a slow SA, do not hold up the others':
// one after another, a client reregister would reach the thousandth child after
// minutes, its memberships unknown to the new SM until then. Waiting for all before
// the next event keeps each interface's flushes in the order of the events.
func (e *Engine) flushPort(port int, level flushLevel) {
	sem := make(chan struct{}, flushParallel)
	var wg sync.WaitGroup
	for _, i := range e.Interfaces() {
		if i.port != port {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			i.flush(level)
		}()
	}
	wg.Wait()
}

// tracef logs when debug_level >= level.
// event reports a state change to Options.Event.
func (e *Engine) event(format string, a ...any) {
	if e.emit != nil {
		e.emit(fmt.Sprintf(format, a...))
	}
}

func (e *Engine) tracef(level int32, format string, a ...any) {
	if e.params.DebugLevel.Load() >= level {
		e.trace.Printf("ipoib: "+format, a...)
	}
}

// mtracef logs when mcast_debug_level >= level.
func (e *Engine) mtracef(level int32, format string, a ...any) {
	if e.params.McastDebugLevel.Load() >= level {
		e.trace.Printf("ipoib mcast: "+format, a...)
	}
}

// dtracef logs data-path lines when built with ipoib_debug_data and data_debug_level
// is set; without the tag the call compiles away.
func (e *Engine) dtracef(format string, a ...any) {
	if dataDebug && e.params.DataDebugLevel.Load() > 0 {
		e.trace.Printf("ipoib data: "+format, a...)
	}
}

// cmdtracef is the connected-mode data path's trace (the driver's ipoib_cm data
// debug), when cm_data_debug_level > 0 in a data-debug build.
func (e *Engine) cmdtracef(format string, a ...any) {
	if dataDebug && e.params.CMDataDebugLevel.Load() > 0 {
		e.trace.Printf("ipoib cm data: "+format, a...)
	}
}

// jiffies emulates the kernel's jiffies counter (HZ=250, starting 5 minutes before wrap
// as INITIAL_JIFFIES does), for the "created" field of <if>_mcg.
func (e *Engine) jiffies(t time.Time) int64 {
	const hz = 250
	return int64(1<<32-300*hz) + int64(t.Sub(e.start)/(time.Second/hz))
}

// Stats are the interface counters, named as the kernel's ethtool -S shows them.
type Stats struct {
	RxPackets, TxPackets, RxBytes, TxBytes, TxErrors, RxDropped, TxDropped, Multicast uint64
}

// StatNames lists the statistics in ethtool order.
var StatNames = []string{"rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "tx_errors", "rx_dropped", "tx_dropped", "multicast"}

// Values returns the statistics in StatNames order.
func (s Stats) Values() []uint64 {
	return []uint64{s.RxPackets, s.TxPackets, s.RxBytes, s.TxBytes, s.TxErrors, s.RxDropped, s.TxDropped, s.Multicast}
}

type stats struct {
	rxPackets, txPackets, rxBytes, txBytes, txErrors, rxDropped, txDropped, multicast atomic.Uint64
}

func (s *stats) snapshot() Stats {
	return Stats{s.rxPackets.Load(), s.txPackets.Load(), s.rxBytes.Load(), s.txBytes.Load(),
		s.txErrors.Load(), s.rxDropped.Load(), s.txDropped.Load(), s.multicast.Load()}
}

// addrsOf collects the interface's own addresses as the host reported them.
func addrsOf(p []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, 0, len(p))
	for _, x := range p {
		out = append(out, x.Addr())
	}
	return slices.Compact(out)
}
