package soft

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/soft/partitions"
	"ipoibfs/verbs/soft/sadb"
)

// SM is the subnet manager. It runs on one port of a soft HCA (as OpenSM runs on a host
// port): it assigns LIDs, brings ports ACTIVE, programs P_Key tables from the
// partition configuration, publishes the forwarding tables every port uses to reach
// the others, and answers SA requests on that port's QP1.
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
		stop: make(chan struct{}), done: make(chan struct{})}
	sm.db = sadb.New(smFabric{sm})
	if !p.sm.CompareAndSwap(nil, sm) {
		return nil, fmt.Errorf("subnet manager: %s already hosts one", p)
	}
	sm.db.SetConfiguredGroups(groupsFor(parts))
	p.gsi.Register(mad.ClassSA, sm.handleSA)
	go sm.sweep(p.hca.cfg.Heartbeat)
	p.sendHello() // register our own port first so it gets the lowest LID
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
	sm.mu.Unlock()
	close(sm.stop)
	<-sm.done
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

// handleCtl processes a port's hello (registration and heartbeat).
func (sm *SM) handleCtl(src netip.AddrPort, mad []byte) {
	attr, body, err := parseCtl(mad)
	if err != nil || attr != ctlAttrHello {
		return
	}
	var h ctlHello
	if err := h.parse(body); err != nil {
		return
	}
	sm.mu.Lock()
	if sm.closed {
		sm.mu.Unlock()
		return
	}
	sp := sm.ports[src]
	isNew := false
	if sp == nil || sp.guid != h.PortGUID {
		if old := sm.byGUID[h.PortGUID]; old != nil { // same port, new address: a restart
			delete(sm.ports, old.addr)
		}
		sp = &smPort{addr: src, guid: h.PortGUID, isSM: src == sm.port.ep.Addr()}
		sp.lid = sm.assignLID(h.PortGUID)
		sm.ports[src] = sp
		sm.byGUID[h.PortGUID] = sp
		isNew = true
	}
	sp.nodeGUID, sp.num, sp.numPorts, sp.desc = h.NodeGUID, int(h.PortNum), h.NumPorts, h.NodeDesc
	sp.maxMTU, sp.width, sp.laneMbps = h.MaxMTU, int(h.Width), int(h.LaneMbps)
	sp.lastSeen = time.Now()
	reregister := h.Epoch != sm.epoch
	sp.epochSeen = h.Epoch
	if isNew {
		sp.pkeys = sm.pkeysFor(sp)
		sm.routesV++
	}
	stale := h.RoutesVersion != sm.routesV
	sm.mu.Unlock()
	if isNew {
		sm.publish()
	} else if stale {
		sm.sendRoutes(sp)
	}
	sm.sendConfig(sp, reregister)
}

func (sm *SM) assignLID(g verbs.GUID) verbs.LID {
	if l, ok := sm.guid2lid[g]; ok {
		return l
	}
	for l := verbs.LID(1); l <= verbs.LIDUnicastLast; l++ {
		if !sm.lidUsed[l] {
			sm.lidUsed[l] = true
			sm.guid2lid[g] = l
			return l
		}
	}
	return 0
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
		sm.port.handleCtl(dst, body)
		return
	}
	sm.port.sendCtl(dst, dstGUID, body)
}

// AuthFailures counts the management messages the subnet manager's port dropped for
// want of a valid fabric-key MAC.
func (sm *SM) AuthFailures() uint64 { return sm.port.AuthFailures() }

// routesMsgs are the forwarding tables as routes messages, in as many parts as needed.
func (sm *SM) routesMsgs() [][]byte {
	sm.mu.Lock()
	r := ctlRoutes{Version: sm.routesV, Faults: sm.faults}
	for _, sp := range sm.ports {
		if sm.linkDownLocked(sp) {
			continue // gone from the fabric while its link is down
		}
		r.Uni = append(r.Uni, ctlRoute{LID: sp.lid, GID: sp.gid(), Addr: sp.addr})
	}
	sm.mu.Unlock()
	for _, g := range sm.db.Groups() {
		m := ctlMRoute{MLID: g.MLID, MGID: g.MGID}
		for _, mem := range g.Members {
			// Send-only members do not receive.
			if mem.JoinState&0x3 == 0 {
				continue
			}
			if sp, ok := sm.portByGID(mem.GID); ok {
				m.Members = append(m.Members, sp.lid)
			}
		}
		r.Multi = append(r.Multi, m)
	}
	sort.Slice(r.Uni, func(i, j int) bool { return r.Uni[i].LID < r.Uni[j].LID })
	var msgs [][]byte
	for _, part := range r.split() {
		msgs = append(msgs, part.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	}
	return msgs
}

func (sm *SM) sendRoutes(sp *smPort) {
	for _, m := range sm.routesMsgs() {
		sm.sendCtl(sp.addr, sp.guid, m)
	}
}

// publish sends the forwarding tables to every port.
func (sm *SM) publish() {
	msgs := sm.routesMsgs()
	sm.mu.Lock()
	type dest struct {
		addr netip.AddrPort
		guid verbs.GUID
	}
	dests := make([]dest, 0, len(sm.ports))
	for a, sp := range sm.ports {
		dests = append(dests, dest{a, sp.guid})
	}
	sm.mu.Unlock()
	for _, d := range dests {
		for _, m := range msgs {
			sm.sendCtl(d.addr, d.guid, m)
		}
	}
}

// sweep removes ports that stopped sending hellos and republishes the tables when
// multicast membership changed.
func (sm *SM) sweep(hb time.Duration) {
	defer close(sm.done)
	t := time.NewTicker(hb)
	defer t.Stop()
	for {
		select {
		case <-sm.stop:
			return
		case <-t.C:
		}
		dead := []verbs.GID{}
		sm.mu.Lock()
		for a, sp := range sm.ports {
			if time.Since(sp.lastSeen) > 8*hb && !sp.isSM {
				delete(sm.ports, a)
				delete(sm.byGUID, sp.guid)
				dead = append(dead, sp.gid())
				sm.routesV++
			}
		}
		sm.mu.Unlock()
		for _, g := range dead {
			sm.db.RemovePort(g)
		}
		sm.checkDB()
		if len(dead) > 0 {
			sm.publish()
		}
	}
}

// checkDB republishes when the SA changed group membership.
func (sm *SM) checkDB() {
	v := sm.db.Version()
	sm.mu.Lock()
	changed := v != sm.dbV
	if changed {
		sm.dbV = v
		sm.routesV++
	}
	sm.mu.Unlock()
	if changed {
		sm.publish()
	}
}

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
	sm.checkDB()
	return resp
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
