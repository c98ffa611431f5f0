package soft

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/soft/partitions"
	"ipoibfs/verbs/soft/sadb"
)

// SM is the subnet manager. It runs on one port of a soft HCA (as OpenSM runs on a host
// port): it assigns LIDs, brings ports ACTIVE, programs P_Key tables from the
// partition configuration, publishes the forwarding tables every port uses to reach
// the others, and answers SA requests on that port's QP1.
//
// Publishing is asynchronous and coalesced. A change (a port comes or goes, the SA
// changes multicast membership, partitions, faults or links change) increments
// routesV and wakes the publisher goroutine, which sends the tables as they are when it
// starts a pass to every port, then records them as published (pubV). Changes made
// while a pass runs are sent together by the next one, so a burst of N joins costs a
// few passes, not N. Whatever must follow the tables waits for them rather than for a
// pass of its own: an SA answer is sent once the tables of the version current after
// its request (its own change included) have gone to every port, as the synchronous
// publish before each answer did; a new port gets its configuration (ACTIVE) after the
// tables that let it reach the SM; SetPartitions, SetFaults and link changes return
// once their tables are out. The last change is always published: every change wakes
// the publisher, and a pass reads the version before it lists the tables.
//
// A pass sends a port only what changed since the tables the previous pass sent it
// (ctlRoutesDelta), when it was sent those; new ports, ports whose hello showed older
// tables (a lost message) and changes as large as the tables get the whole tables. A
// join to a fabric with thousands of groups then costs each port one entry, not the
// table: 4000 joins one at a time took 10.3 s, each port re-reading every group each
// time, and 4.5 s with deltas.
type SM struct {
	port  *Port
	epoch uint64
	db    *sadb.DB

	mu       sync.Mutex
	parts    *partitions.Config
	ports    map[netip.AddrPort]*smPort
	byGUID   map[verbs.GUID]*smPort
	guid2lid map[verbs.GUID]verbs.LID
	lidUsed  map[verbs.LID]bool
	routesV  uint64
	dbV      uint64
	faults   Faults
	down     map[linkKey]bool // ports whose link a link fault took down (linkfault.go)
	closed   bool
	stop     chan struct{}
	done     chan struct{}
	sweeps   atomic.Uint64 // sweep rounds done (tests wait for one)

	// LIDs (assignLID), with sm.mu: guid2lid and lidUsed above hold the LIDs given;
	// lidLast is the highest unicast LID (tests lower it); nextLID is where the search
	// for a free one starts, after the last one taken; lidsFull is set once a port was
	// refused for want of a LID (logged once, until a port gets one again).
	lidLast, nextLID verbs.LID
	lidsFull         bool

	// The publisher (publisher, publishPass); the fields with sm.mu.
	pubV    uint64                        // routes version every port has been sent
	after   []pubAction                   // to do once pubV reaches their version, in order
	resend  map[netip.AddrPort]verbs.GUID // ports whose hello showed tables they lack
	wake    chan struct{}                 // one pending wake-up for the publisher
	pubDone chan struct{}
	// last is what the last pass sent every port, the base of the next delta (the
	// publisher's own).
	last publishedTables
	// publishes counts the passes that sent the tables to every port (tests);
	// deltas the messages that sent only the changes.
	publishes atomic.Uint64
	deltas    atomic.Uint64
}

// publishedTables are forwarding tables as a pass sent them. Each entry remembers the
// pass that last listed it, so that advance finds the removed ones without a set of
// its own.
type publishedTables struct {
	v     uint64
	pass  uint64
	uni   map[verbs.LID]*pubEntry[ctlRoute]
	multi map[verbs.LID]*pubEntry[ctlMRoute]
}

type pubEntry[E any] struct {
	v    E
	pass uint64
}

// pubAction is something to do after the tables of version v went to every port.
type pubAction struct {
	v  uint64
	do func()
}

type smPort struct {
	addr      netip.AddrPort
	nodeGUID  verbs.GUID
	guid      verbs.GUID
	num       int
	numPorts  uint8
	desc      string
	lid       verbs.LID
	maxMTU    verbs.MTU
	width     int
	laneMbps  int
	pkeys     []verbs.PKey
	lastSeen  time.Time
	epochSeen uint64
	isSM      bool
	sentV     uint64 // the routes version last sent to it (publishPass)
}

func (s *smPort) gid() verbs.GID { return verbs.MakeGID(verbs.DefaultGIDPrefix, s.guid) }

// NodeInfo is one port as the subnet manager sees it.
type NodeInfo struct {
	Name     string // node description
	NodeGUID verbs.GUID
	PortGUID verbs.GUID
	Port     int
	LID      verbs.LID
	State    verbs.PortState
	Addr     netip.AddrPort
	PKeys    []verbs.PKey
}

// NewSM starts a subnet manager on port p of a soft HCA with the given partition
// configuration (nil = partitions.Default()).
func NewSM(p *Port, parts *partitions.Config) (*SM, error) {
	if parts == nil {
		parts = partitions.Default()
	}
	var e [8]byte
	_, _ = rand.Read(e[:])
	sm := &SM{port: p, epoch: binary.BigEndian.Uint64(e[:]) | 1, parts: parts,
		ports: map[netip.AddrPort]*smPort{}, byGUID: map[verbs.GUID]*smPort{},
		guid2lid: map[verbs.GUID]verbs.LID{}, lidUsed: map[verbs.LID]bool{},
		lidLast: verbs.LIDUnicastLast, nextLID: 1,
		stop: make(chan struct{}), done: make(chan struct{}),
		wake: make(chan struct{}, 1), pubDone: make(chan struct{})}
	sm.db = sadb.New(smFabric{sm})
	if !p.sm.CompareAndSwap(nil, sm) {
		return nil, fmt.Errorf("subnet manager: %s already hosts one", p)
	}
	sm.db.SetConfiguredGroups(groupsFor(parts))
	p.gsi.Register(mad.ClassSA, sm.handleSA)
	go sm.sweep(p.hca.cfg.Heartbeat)
	go sm.publisher()
	p.sendHello() // register our own port first so it gets the lowest LID
	// As before publishing was asynchronous, our port has its routes and is ACTIVE
	// when the SM is returned.
	sm.publish()
	return sm, nil
}

// Addr is the endpoint other nodes join.
func (sm *SM) Addr() netip.AddrPort { return sm.port.ep.Addr() }

// DB returns the SA database (multicast groups).
func (sm *SM) DB() *sadb.DB { return sm.db }

// Close stops the subnet manager; ports keep their configuration, as on a real fabric.
func (sm *SM) Close() {
	sm.mu.Lock()
	if sm.closed {
		sm.mu.Unlock()
		return
	}
	sm.closed = true
	sm.after = nil // answers and configurations not sent yet are dropped, as by a dying SM
	sm.mu.Unlock()
	close(sm.stop)
	<-sm.done
	<-sm.pubDone
	sm.port.gsi.Register(mad.ClassSA, nil)
	sm.port.sm.CompareAndSwap(sm, nil)
}

// Partitions returns the active partition configuration.
func (sm *SM) Partitions() *partitions.Config {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.parts
}

// SetPartitions applies a new partition configuration at run time: P_Key tables of all
// ports are reprogrammed (ports see a P_Key change event) and broadcast groups follow.
func (sm *SM) SetPartitions(c *partitions.Config) {
	sm.mu.Lock()
	sm.parts = c
	changed := []*smPort{}
	for _, sp := range sm.ports {
		k := sm.pkeysFor(sp)
		if !slices.Equal(k, sp.pkeys) {
			sp.pkeys = k
			changed = append(changed, sp)
		}
	}
	sm.mu.Unlock()
	sm.db.SetConfiguredGroups(groupsFor(c))
	for _, sp := range changed {
		sm.sendConfig(sp, false)
	}
	sm.checkDB()
	sm.publish()
}

// SetFaults sets fabric impairments for every port.
func (sm *SM) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	sm.mu.Lock()
	sm.faults = f
	sm.routesV++
	sm.mu.Unlock()
	sm.publish()
	return nil
}

// Faults returns the fabric impairments in force.
func (sm *SM) Faults() Faults {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.faults
}

// Nodes lists the ports known to the SM, sorted by LID.
func (sm *SM) Nodes() []NodeInfo {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	out := make([]NodeInfo, 0, len(sm.ports))
	for _, sp := range sm.ports {
		out = append(out, NodeInfo{Name: sp.desc, NodeGUID: sp.nodeGUID, PortGUID: sp.guid, Port: sp.num,
			LID: sp.lid, State: sm.portStateLocked(sp), Addr: sp.addr, PKeys: slices.Clone(sp.pkeys)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LID < out[j].LID })
	return out
}

func groupsFor(c *partitions.Config) []sadb.GroupParams {
	var gs []sadb.GroupParams
	keys := c.Keys()
	for i, pt := range c.Partitions {
		pk := verbs.PKey(keys[i]) | verbs.PKeyFullMember
		if pt.IPoIB {
			for _, sc := range scopesOf(pt.IPoIBFlags) {
				var g verbs.GID
				g[0], g[1], g[2], g[3] = 0xff, 0x10|sc, 0x40, 0x1b
				binary.BigEndian.PutUint16(g[4:], uint16(pk))
				g[12], g[13], g[14], g[15] = 0xff, 0xff, 0xff, 0xff
				gs = append(gs, paramsOf(g, pk, pt.IPoIBFlags, sc))
			}
		}
		for _, m := range pt.MGIDs {
			g := m.MGID
			if g[4] == 0 && g[5] == 0 { // a zero P_Key field is filled from the partition
				binary.BigEndian.PutUint16(g[4:], uint16(pk))
			}
			for _, sc := range scopesOf(m.Flags) {
				g[1] = g[1]&0xf0 | sc
				gs = append(gs, paramsOf(g, pk, m.Flags, sc))
			}
		}
	}
	return gs
}

func scopesOf(f partitions.GroupFlags) []uint8 {
	if len(f.Scopes) == 0 {
		return []uint8{2}
	}
	return f.Scopes
}

func paramsOf(g verbs.GID, pk verbs.PKey, f partitions.GroupFlags, scope uint8) sadb.GroupParams {
	return sadb.GroupParams{MGID: g, PKey: pk, QKey: f.QKey, MTU: f.MTU, Rate: f.Rate, SL: f.SL,
		TClass: f.TClass, FlowLabel: f.FlowLabel, Scope: scope, PacketLifeTime: 18}
}

func (sm *SM) pkeysFor(sp *smPort) []verbs.PKey {
	return sm.parts.PKeys(partitions.Port{GUID: sp.guid, IsSM: sp.isSM})
}

// handleHello processes a port's hello (registration and heartbeat) from src.
func (sm *SM) handleHello(src netip.AddrPort, h *ctlHello) {
	if h.PortGUID == sm.port.guid && src != sm.port.ep.Addr() {
		// Only the SM's own port is the SM's port: a hello claiming its GUID from
		// elsewhere would take its LID, and every port's SA traffic with it.
		sm.port.cnt.malformed.Add(1)
		return
	}
	sm.mu.Lock()
	if sm.closed {
		sm.mu.Unlock()
		return
	}
	sp := sm.ports[src]
	isNew := false
	var gone []verbs.GID // ports forgotten, whose SA records go once sm.mu is released
	if sp == nil || sp.guid != h.PortGUID {
		if sp != nil {
			// Another port GUID at this address (the node restarted under another
			// name): the port that was here is gone, as if the sweep had found it
			// silent. Kept, its GID would still answer queries and its group
			// memberships would never leave.
			gone = append(gone, sm.forgetLocked(sp))
		}
		if old := sm.byGUID[h.PortGUID]; old != nil { // same port, new address: a restart
			delete(sm.ports, old.addr)
		}
		lid, ok := sm.assignLID(h.PortGUID)
		if !ok {
			// Every unicast LID belongs to a live port: this one stays out of the
			// fabric rather than get LID 0, which no port can be reached at.
			first, used := !sm.lidsFull, len(sm.lidUsed)
			sm.lidsFull = true
			sm.mu.Unlock()
			sm.forgetInDB(gone)
			if l := sm.port.hca.cfg.Logger; first && l != nil {
				l.Printf("subnet manager: no free unicast LID for port %#x at %s: live ports hold all %d; port left out",
					uint64(h.PortGUID), src, used)
			}
			return
		}
		sm.lidsFull = false
		sp = &smPort{addr: src, guid: h.PortGUID, isSM: src == sm.port.ep.Addr(), lid: lid}
		sm.ports[src] = sp
		sm.byGUID[h.PortGUID] = sp
		isNew = true
	}
	sp.nodeGUID, sp.num, sp.numPorts, sp.desc = h.NodeGUID, int(h.PortNum), h.NumPorts, h.NodeDesc
	sp.maxMTU, sp.width, sp.laneMbps = h.MaxMTU, int(h.Width), int(h.LaneMbps)
	sp.lastSeen = sm.clk().Now()
	if h.RoutesVersion < sp.sentV {
		// Behind what it was sent (a lost message): the next pass sends it the whole
		// tables, not a delta it would ignore, even while changes keep coming.
		sp.sentV = 0
	}
	reregister := h.Epoch != sm.epoch
	sp.epochSeen = h.Epoch
	if isNew {
		sp.pkeys = sm.pkeysFor(sp)
		sm.routesV++
		// The port becomes ACTIVE after the tables that let it reach the SM and the
		// others are on their way to it.
		if sm.afterLocked(sm.routesV, func() { sm.sendConfig(sp, reregister) }) {
			sm.mu.Unlock()
			sm.forgetInDB(gone)
			sm.kick()
			return
		}
	} else if h.RoutesVersion != sm.routesV && sm.pubV == sm.routesV {
		// The port lacks tables already published (a lost part, or this hello
		// crossed them): they go to it again. With a pass pending, that pass
		// brings them (whole: sentV is 0 now).
		if sm.resend == nil {
			sm.resend = map[netip.AddrPort]verbs.GUID{}
		}
		sm.resend[sp.addr] = sp.guid
		defer sm.kick()
	}
	sm.mu.Unlock()
	sm.forgetInDB(gone)
	sm.sendConfig(sp, reregister)
}

// forgetLocked removes port sp from the fabric, as the sweep does a silent port, and
// returns its GID for forgetInDB. Its LID stays reserved for its GUID until LIDs run
// out (assignLID). Called with sm.mu held.
func (sm *SM) forgetLocked(sp *smPort) verbs.GID {
	if sm.ports[sp.addr] == sp {
		delete(sm.ports, sp.addr)
	}
	if sm.byGUID[sp.guid] == sp {
		delete(sm.byGUID, sp.guid)
	}
	sm.routesV++
	return sp.gid()
}

// forgetInDB drops the group memberships of the ports forgetLocked removed from the SA
// database and has the tables without them published. Called without sm.mu.
func (sm *SM) forgetInDB(gone []verbs.GID) {
	if len(gone) == 0 {
		return
	}
	for _, g := range gone {
		sm.db.RemovePort(g)
	}
	sm.checkDB()
	sm.kick()
}

// assignLID gives port GUID g a unicast LID: the one it had before if it still holds
// it (as OpenSM's guid2lid), else a free one. When none is free, the LIDs of GUIDs not
// registered now are taken back; ok is false when live ports hold every LID. Called
// with sm.mu held.
func (sm *SM) assignLID(g verbs.GUID) (verbs.LID, bool) {
	if l, held := sm.guid2lid[g]; held {
		return l, true
	}
	l := sm.freeLIDLocked()
	// Every registered GUID holds a LID, so the others hold the rest: with none, a
	// refused port's hellos cost no walk of the table.
	if l == 0 && len(sm.guid2lid) > len(sm.byGUID) {
		sm.reclaimLIDsLocked()
		l = sm.freeLIDLocked()
	}
	if l == 0 {
		return 0, false
	}
	sm.lidUsed[l] = true
	sm.guid2lid[g] = l
	sm.nextLID = l%sm.lidLast + 1
	return l, true
}

// freeLIDLocked returns a LID no GUID holds, or 0 when there is none. The search
// starts after the last LID taken, so while LIDs are left it finds one at once rather
// than walking past every LID already given.
func (sm *SM) freeLIDLocked() verbs.LID {
	if len(sm.lidUsed) >= int(sm.lidLast) {
		return 0
	}
	l := sm.nextLID
	for range sm.lidLast {
		if l < 1 || l > sm.lidLast {
			l = 1
		}
		if !sm.lidUsed[l] {
			return l
		}
		l++
	}
	return 0
}

// reclaimLIDsLocked frees the LIDs of the GUIDs that have no port registered now. It
// walks every LID given, so it runs only when none is left: a port that comes back
// before then still finds its old LID.
func (sm *SM) reclaimLIDsLocked() {
	for g, l := range sm.guid2lid {
		if sm.byGUID[g] == nil {
			delete(sm.guid2lid, g)
			delete(sm.lidUsed, l)
		}
	}
}

func (sm *SM) smLID() verbs.LID {
	if sp := sm.ports[sm.port.ep.Addr()]; sp != nil {
		return sp.lid
	}
	return 0
}

func (sm *SM) sendConfig(sp *smPort, reregister bool) {
	sm.mu.Lock()
	c := ctlConfig{LID: sp.lid, SMLID: sm.smLID(), State: sm.portStateLocked(sp), ActiveMTU: sp.maxMTU,
		Rate: rateFor(sp.width, sp.laneMbps), Reregister: reregister, SMEpoch: sm.epoch,
		SMGID: verbs.MakeGID(verbs.DefaultGIDPrefix, sm.port.guid), GIDPrefix: verbs.DefaultGIDPrefix,
		PKeys: slices.Clone(sp.pkeys)}
	sm.mu.Unlock()
	sm.sendCtl(sp.addr, sp.guid, c.append(putCtlHeader(nil, ctlAttrConfig, 0)))
}

func (sm *SM) sendCtl(dst netip.AddrPort, dstGUID verbs.GUID, body []byte) {
	if dst == sm.port.ep.Addr() {
		sm.port.applyCtl(body) // its own port: not through the network's door
		return
	}
	sm.port.sendCtl(dst, dstGUID, body)
}

// AuthFailures counts the management messages the subnet manager's port dropped for
// want of a valid fabric-key MAC.
func (sm *SM) AuthFailures() uint64 { return sm.port.AuthFailures() }

// ctlDest is a port the tables are sent to.
type ctlDest struct {
	addr  netip.AddrPort
	guid  verbs.GUID
	sentV uint64 // the routes version last sent to it
}

// routesTables are the forwarding tables as they are now, with the version they
// carry, and the ports known to the SM. The version is read before the groups, so the
// tables hold at least every change it counts (they may hold later ones too, published
// again under a later version).
func (sm *SM) routesTables() (ctlRoutes, []ctlDest) {
	sm.mu.Lock()
	v := sm.routesV
	sm.mu.Unlock()
	groups := sm.db.GroupsAnyOrder()
	sm.mu.Lock()
	r := ctlRoutes{Version: v, Faults: sm.faults}
	dests := make([]ctlDest, 0, len(sm.ports))
	for a, sp := range sm.ports {
		dests = append(dests, ctlDest{a, sp.guid, sp.sentV})
		if sm.linkDownLocked(sp) {
			continue // gone from the fabric while its link is down
		}
		r.Uni = append(r.Uni, ctlRoute{LID: sp.lid, GID: sp.gid(), Addr: sp.addr})
	}
	r.Multi = make([]ctlMRoute, 0, len(groups))
	for _, g := range groups {
		m := ctlMRoute{MLID: g.MLID, MGID: g.MGID}
		for _, mem := range g.Members {
			// Send-only members do not receive.
			if mem.JoinState&0x3 == 0 {
				continue
			}
			if sp, ok := sm.portByGIDLocked(mem.GID); ok {
				m.Members = append(m.Members, sp.lid)
			}
		}
		r.Multi = append(r.Multi, m)
	}
	sm.mu.Unlock()
	sort.Slice(r.Uni, func(i, j int) bool { return r.Uni[i].LID < r.Uni[j].LID })
	return r, dests
}

// routesMsgs are the tables as routes messages, in as many parts as needed.
func routesMsgs(r *ctlRoutes) [][]byte {
	var msgs [][]byte
	for _, part := range r.split() {
		msgs = append(msgs, part.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	}
	return msgs
}

// advance makes t the tables r and returns what changed from t's version to r's. It
// costs a map lookup per entry and allocates only for new entries.
func (t *publishedTables) advance(r *ctlRoutes) ctlRoutesDelta {
	d := ctlRoutesDelta{From: t.v, Routes: ctlRoutes{Version: r.Version, Parts: 1, Faults: r.Faults}}
	if t.uni == nil {
		t.uni, t.multi = map[verbs.LID]*pubEntry[ctlRoute]{}, map[verbs.LID]*pubEntry[ctlMRoute]{}
	}
	t.v = r.Version
	t.pass++
	d.Routes.Uni, d.DelUni = advanceTable(t.uni, t.pass, r.Uni,
		func(u ctlRoute) verbs.LID { return u.LID },
		func(a, b ctlRoute) bool { return a == b })
	d.Routes.Multi, d.DelMulti = advanceTable(t.multi, t.pass, r.Multi,
		func(m ctlMRoute) verbs.LID { return m.MLID },
		func(a, b ctlMRoute) bool { return a.MGID == b.MGID && slices.Equal(a.Members, b.Members) })
	return d
}

// advanceTable makes table hold entries (keyed by key), marking each with pass, and
// returns the entries new or changed (by same) and the keys of those gone.
func advanceTable[E any](table map[verbs.LID]*pubEntry[E], pass uint64, entries []E,
	key func(E) verbs.LID, same func(a, b E) bool) (set []E, gone []verbs.LID) {
	for _, x := range entries {
		e := table[key(x)]
		if e == nil {
			e = &pubEntry[E]{}
			table[key(x)] = e
		}
		if e.pass == 0 || !same(e.v, x) {
			e.v = x
			set = append(set, x)
		}
		e.pass = pass
	}
	for k, e := range table {
		if e.pass != pass {
			gone = append(gone, k)
			delete(table, k)
		}
	}
	return set, gone
}

// deltaMsg encodes the delta d of tables r, or returns nil when sending it is not worth
// it: as many changes as entries, or more than one part.
func deltaMsg(d *ctlRoutesDelta, r *ctlRoutes) []byte {
	changes := len(d.DelUni) + len(d.Routes.Uni) + len(d.DelMulti) + len(d.Routes.Multi)
	if changes >= len(r.Uni)+len(r.Multi) || changes > maxCtlEntries {
		return nil
	}
	msg := d.append(putCtlHeader(nil, ctlAttrDelta, 0))
	if len(msg) > maxRoutesPart {
		return nil
	}
	return msg
}

// kick wakes the publisher; a wake-up already pending covers this one.
func (sm *SM) kick() {
	select {
	case sm.wake <- struct{}{}:
	default:
	}
}

// afterLocked arranges for do to run once the tables of version v have been sent to
// every port, after whatever was arranged before. It reports false, arranging
// nothing, when they have been already (the caller does it now) — or when the SM is
// closed (then nothing will be sent). Called with sm.mu held.
func (sm *SM) afterLocked(v uint64, do func()) bool {
	if sm.pubV >= v || sm.closed {
		return false
	}
	sm.after = append(sm.after, pubAction{v, do})
	return true
}

// publish has the tables as they are now sent to every port and waits until they
// are (or the SM closes). Changes made by others in the meantime share the pass.
func (sm *SM) publish() {
	ch := make(chan struct{})
	sm.mu.Lock()
	queued := sm.afterLocked(sm.routesV, func() { close(ch) })
	sm.mu.Unlock()
	if !queued {
		return
	}
	sm.kick()
	select {
	case <-ch:
	case <-sm.stop:
	}
}

// publisher sends the tables whenever they changed, until the SM closes.
func (sm *SM) publisher() {
	defer close(sm.pubDone)
	for {
		select {
		case <-sm.stop:
			return
		case <-sm.wake:
		}
		sm.publishPass()
	}
}

// publishPass sends the newest tables to every port if they changed since the last
// pass (else to the ports that asked again), then does what waited for them.
func (sm *SM) publishPass() {
	sm.mu.Lock()
	full := sm.routesV != sm.pubV
	resend := sm.resend
	sm.resend = nil
	sm.mu.Unlock()
	if !full && len(resend) == 0 {
		return
	}
	r, dests := sm.routesTables()
	v := r.Version
	var msgs [][]byte // encoded when a port needs the whole tables
	var delta []byte
	lastV := sm.last.v
	if full {
		if d := sm.last.advance(&r); lastV != 0 {
			delta = deltaMsg(&d, &r)
		}
	} else {
		dests = dests[:0]
		for a, g := range resend {
			dests = append(dests, ctlDest{a, g, 0})
		}
	}
	// A port sent the last tables gets only what changed since; the others (new, or
	// whose hello showed it lacks tables) get them whole.
	for _, d := range dests {
		if delta != nil && d.sentV == lastV {
			sm.sendCtl(d.addr, d.guid, delta)
			sm.deltas.Add(1)
			continue
		}
		if msgs == nil {
			msgs = routesMsgs(&r)
		}
		for _, m := range msgs {
			sm.sendCtl(d.addr, d.guid, m)
		}
	}
	// A resend's tables may hold changes later than their version (the version is
	// read before the groups), unlike what the last pass recorded: the next delta
	// would not fit them, so those ports get the whole tables again next time.
	sentV := v
	if !full {
		sentV = 0
	}
	sm.mu.Lock()
	for _, d := range dests {
		if sp := sm.ports[d.addr]; sp != nil && sp.guid == d.guid {
			sp.sentV = sentV
		}
	}
	sm.mu.Unlock()
	if !full {
		return
	}
	sm.publishes.Add(1)
	// Run what waited for version v, including what was arranged while it runs;
	// pubV moves only when nothing for v is left, so anything arranged after finds
	// it published and does it itself, never before what was arranged earlier.
	for {
		sm.mu.Lock()
		if sm.closed {
			sm.mu.Unlock()
			return
		}
		n := 0
		for n < len(sm.after) && sm.after[n].v <= v {
			n++
		}
		if n == 0 {
			sm.pubV = max(sm.pubV, v)
			sm.mu.Unlock()
			return
		}
		ready := sm.after[:n:n]
		sm.after = slices.Clone(sm.after[n:])
		sm.mu.Unlock()
		for _, a := range ready {
			a.do()
		}
	}
}

// clk is the clock of the SM's HCA (Config.Clock).
func (sm *SM) clk() clock.Clock { return sm.port.hca.cfg.Clock }

// sweep removes ports that stopped sending hellos and republishes the tables when
// multicast membership changed.
func (sm *SM) sweep(hb time.Duration) {
	defer close(sm.done)
	t := sm.clk().NewTicker(hb)
	defer t.Stop()
	for {
		select {
		case <-sm.stop:
			return
		case <-t.C():
		}
		dead := []verbs.GID{}
		// Silence is counted up to the moment the SM's port has handled all that
		// reached it: hellos waiting behind a backlog of its own (a stalled receive
		// loop) do not make their senders dead.
		// A stall is not waited out for ever: past 32 heartbeats (a receive loop that
		// never drains under saturating traffic) silence counts again, so dead ports
		// still go.
		now := sm.clk().Now()
		caught := sm.port.caughtUp(now)
		if floor := now.Add(-32 * hb); caught.Before(floor) {
			caught = floor
		}
		sm.mu.Lock()
		for _, sp := range sm.ports {
			if caught.Sub(sp.lastSeen) > 8*hb && !sp.isSM {
				dead = append(dead, sm.forgetLocked(sp))
			}
		}
		sm.mu.Unlock()
		sm.forgetInDB(dead)
		sm.checkDB()
		sm.sweeps.Add(1)
	}
}

// checkDB has the tables republished when the SA changed group membership.
func (sm *SM) checkDB() {
	v := sm.db.Version()
	sm.mu.Lock()
	changed := sm.noteDBLocked(v)
	sm.mu.Unlock()
	if changed {
		sm.kick()
	}
}

// noteDBLocked counts a change of the tables when the SA database reached version v
// since last noted. Called with sm.mu held.
func (sm *SM) noteDBLocked(v uint64) bool {
	if v <= sm.dbV {
		return false
	}
	sm.dbV = v
	sm.routesV++
	return true
}

// handleSA answers an SA request on the SM port's QP1. The answer goes out once the
// tables reflecting the database after the request have gone to every port: at once
// when nothing is pending, else from the publisher after its pass (nil here).
func (sm *SM) handleSA(src verbs.MADSource, req []byte) []byte {
	sm.mu.Lock()
	sp := sm.byGUID[src.GID.GUID()]
	if sm.linkDownLocked(sp) {
		sp = nil // a port without a link sends nothing
	}
	var port sadb.Port
	if sp != nil {
		port = sm.sadbPort(sp)
	}
	sm.mu.Unlock()
	if sp == nil {
		return nil
	}
	resp := sm.db.Handle(port, req)
	v := sm.db.Version()
	sm.mu.Lock()
	changed := sm.noteDBLocked(v)
	deferred := resp != nil && sm.afterLocked(sm.routesV, func() { sm.answer(src, resp) })
	sm.mu.Unlock()
	if changed {
		sm.kick()
	}
	if deferred {
		return nil
	}
	return resp
}

// answer sends an SA response the handler deferred, as the QP1 agent sends one a
// handler returns.
func (sm *SM) answer(src verbs.MADSource, resp []byte) {
	g := &sm.port.gsi
	if len(resp) > mad.Size {
		g.sendRMPP(src.LID, src.QPN, resp)
		return
	}
	_ = g.send(src.LID, src.QPN, resp)
}

// sadbPort describes a port for the SA database. Called with sm.mu held.
func (sm *SM) sadbPort(sp *smPort) sadb.Port {
	return sadb.Port{GUID: sp.guid, GID: sp.gid(), LID: sp.lid, PKeys: slices.Clone(sp.pkeys),
		MTU: sp.maxMTU, Rate: rateFor(sp.width, sp.laneMbps), IsSM: sp.isSM,
		NodeGUID: sp.nodeGUID, PortNum: uint8(sp.num), NumPorts: sp.numPorts, Desc: sp.desc,
		MaxMTU: sp.maxMTU, Width: widthCode(sp.width), Speed: speedCode(sp.laneMbps)}
}

// widthCode is PortInfo's LinkWidthActive for a number of lanes.
func widthCode(lanes int) uint8 {
	switch lanes {
	case 1:
		return 1
	case 8:
		return 4
	case 12:
		return 8
	}
	return 2 // 4x
}

// speedCode is PortInfo's LinkSpeedActive for a lane speed (SDR, DDR, QDR; faster
// lanes are extended speeds, which LinkSpeedActive reports as QDR-capable).
func speedCode(laneMbps int) uint8 {
	switch {
	case laneMbps <= 2500:
		return 1
	case laneMbps <= 5000:
		return 2
	}
	return 4
}

func (sm *SM) portByGID(g verbs.GID) (*smPort, bool) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.portByGIDLocked(g)
}

func (sm *SM) portByGIDLocked(g verbs.GID) (*smPort, bool) {
	sp := sm.byGUID[g.GUID()]
	return sp, sp != nil && g.Prefix() == verbs.DefaultGIDPrefix && !sm.linkDownLocked(sp)
}

func (sm *SM) routeByAddr(a netip.AddrPort) (ctlRoute, bool) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sp := sm.ports[a]
	if sp == nil || sm.linkDownLocked(sp) {
		return ctlRoute{}, false
	}
	return ctlRoute{LID: sp.lid, GID: sp.gid(), Addr: sp.addr}, true
}

// smFabric adapts the SM's port table for the SA database.
type smFabric struct{ sm *SM }

func (f smFabric) PortByGID(g verbs.GID) (sadb.Port, bool) {
	sp, ok := f.sm.portByGID(g)
	if !ok {
		return sadb.Port{}, false
	}
	f.sm.mu.Lock()
	defer f.sm.mu.Unlock()
	return f.sm.sadbPort(sp), true
}

// Ports lists every port the SM knows, for queries that cover the fabric (NodeRecord,
// PortInfoRecord, P_KeyTableRecord, PathRecords with an open end).
func (f smFabric) Ports() []sadb.Port {
	f.sm.mu.Lock()
	defer f.sm.mu.Unlock()
	out := make([]sadb.Port, 0, len(f.sm.ports))
	for _, sp := range f.sm.ports {
		if !f.sm.linkDownLocked(sp) {
			out = append(out, f.sm.sadbPort(sp))
		}
	}
	return out
}

func (f smFabric) PortByLID(l verbs.LID) (sadb.Port, bool) {
	f.sm.mu.Lock()
	defer f.sm.mu.Unlock()
	for _, sp := range f.sm.ports {
		if sp.lid == l && !f.sm.linkDownLocked(sp) {
			return f.sm.sadbPort(sp), true
		}
	}
	return sadb.Port{}, false
}
