// Package sadb is the Subnet Administrator of ipoibfs's software subnet manager: the
// multicast group database and the answers to SA requests (ClassPortInfo,
// MCMemberRecord join/leave/query, PathRecord). It is pure logic: no networking and no
// goroutines. The caller hands it raw 256-byte SA MADs together with the requesting
// port and sends back what Handle returns.
//
// The rules, status codes and record contents follow OpenSM 3.3.23 as observed on the
// wire (unmodified OpenSM on ibsim, see conformance_test.go) and as written in
// osm_sa_mcmember_record.c, osm_sa_path_record.c, osm_multicast.c and osm_sa.c. The
// places where this package knowingly differs from OpenSM are listed in the comment
// of Handle.
package sadb

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// Port is what the SA knows about one end port.
type Port struct {
	GUID  verbs.GUID
	GID   verbs.GID
	LID   verbs.LID
	PKeys []verbs.PKey
	MTU   verbs.MTU // active MTU
	Rate  verbs.Rate
	IsSM  bool

	// What NodeRecord and PortInfoRecord show (zero values are answered as zero).
	NodeGUID verbs.GUID
	PortNum  uint8
	NumPorts uint8
	Desc     string    // NodeDescription
	MaxMTU   verbs.MTU // MTUCap
	Width    uint8     // LinkWidthActive code: 1 1x, 2 4x, 4 8x, 8 12x
	Speed    uint8     // LinkSpeedActive code: 1 SDR, 2 DDR, 4 QDR
}

// Fabric is the SM's view of ports, supplied by the caller. The DB calls it without
// holding its own lock, so a Fabric may take locks of its own.
type Fabric interface {
	PortByGID(verbs.GID) (Port, bool)
	PortByLID(verbs.LID) (Port, bool)
}

// PortLister may additionally be implemented by a Fabric. PathRecord queries that
// leave the source or the destination unspecified then cover every listed port, as
// OpenSM does; without it the unspecified end is the requesting port.
type PortLister interface {
	Ports() []Port
}

// GroupParams are the parameters of a multicast group.
type GroupParams struct {
	MGID           verbs.GID
	PKey           verbs.PKey
	QKey           uint32
	MTU            verbs.MTU
	Rate           verbs.Rate
	SL             uint8
	TClass         uint8
	FlowLabel      uint32
	HopLimit       uint8
	Scope          uint8
	PacketLifeTime uint8
}

// Member is one port's membership in a group.
type Member struct {
	GID       verbs.GID
	JoinState uint8 // mad.JoinFull | mad.JoinNon | mad.JoinSendOnlyNon | mad.JoinSendOnlyFull
	ProxyJoin bool  // joined by another port on its behalf
}

// Group is a multicast group. Members are listed in OpenSM's order (its port map is
// keyed by the GUID in network byte order, so they come sorted by byte-reversed GUID).
type Group struct {
	GroupParams
	MLID      verbs.LID
	WellKnown bool // created by SetConfiguredGroups; survives its last member leaving
	Members   []Member
}

// Defaults used by SetConfiguredGroups for zero fields, and OpenSM's constants.
const (
	DefaultGroupMTU   = verbs.MTU2048 // partitions.conf mtu= default (4)
	DefaultGroupRate  = verbs.Rate(3) // partitions.conf rate= default (10 Gb/s)
	DefaultPacketLife = 18            // OpenSM subnet_timeout default; PacketLifeTime of groups and paths
	DefaultSMKey      = 1             // OpenSM's default sm_key/sa_key
)

const (
	maxMLID = verbs.LIDMulticastLast
	// fullish are the JoinState bits that keep a group alive.
	fullish = mad.JoinFull | mad.JoinSendOnlyFull
)

// member is one membership. The stored scope nibble is always the group's.
type member struct {
	gid   verbs.GID
	state uint8
	proxy bool
}

// group is a multicast group as OpenSM keeps it: the MCMemberRecord it was created
// from (MTU, Rate and PacketLifeTime with selector 2, MLID filled in; PortGID,
// JoinState and ProxyJoin of the creating request) and the member ports.
type group struct {
	rec       mad.MCMemberRecord
	wellKnown bool
	members   []*member // sorted by memberKey
	full      int       // members holding FullMember or SendOnlyFullMember
}

func memberKey(g verbs.GUID) uint64 { return bits.ReverseBytes64(uint64(g)) }

func (g *group) member(guid verbs.GUID) (*member, int) {
	for i, m := range g.members {
		if m.gid.GUID() == guid {
			return m, i
		}
	}
	return nil, -1
}

func (g *group) export() Group {
	r := &g.rec
	out := Group{
		GroupParams: GroupParams{MGID: r.MGID, PKey: r.PKey, QKey: r.QKey, MTU: r.MTU, Rate: r.Rate,
			SL: r.SL, TClass: r.TClass, FlowLabel: r.FlowLabel, HopLimit: r.HopLimit, Scope: r.Scope,
			PacketLifeTime: r.PacketLifeTime},
		MLID:      r.MLID,
		WellKnown: g.wellKnown,
	}
	for _, m := range g.members {
		out.Members = append(out.Members, Member{GID: m.gid, JoinState: m.state, ProxyJoin: m.proxy})
	}
	return out
}

// DB is the SA database. It is safe for concurrent use (one mutex).
type DB struct {
	fabric Fabric
	smKey  atomic.Uint64

	mu      sync.Mutex
	groups  map[verbs.GID]*group
	byMGID  []*group // groups in MGID order, nil when a group came or went (sorted)
	mlids   map[verbs.LID]*group
	mlidLow verbs.LID // every multicast LID below it is in use (newMLID starts there)
	version uint64
	mgidSeq uint32 // OpenSM's uniq_count for SA-assigned MGIDs
}

// New returns an empty database answering for fabric f. Its SM_Key is DefaultSMKey.
func New(f Fabric) *DB {
	db := &DB{fabric: f, groups: map[verbs.GID]*group{}, mlids: map[verbs.LID]*group{}}
	db.smKey.Store(DefaultSMKey)
	return db
}

// SetSMKey sets the SM_Key. Requests carrying another non-zero SM_Key are ignored
// (Handle returns nil), requests carrying this one are trusted: MCMemberRecord queries
// then show the members' PortGID, JoinState and ProxyJoin.
func (db *DB) SetSMKey(k uint64) { db.smKey.Store(k) }

// Version increments on every change of groups or memberships.
func (db *DB) Version() uint64 {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.version
}

// Groups returns a deep copy of all groups, sorted by MGID bytes.
func (db *DB) Groups() []Group {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := make([]Group, 0, len(db.groups))
	for _, g := range db.sorted() {
		out = append(out, g.export())
	}
	return out
}

// GroupsAnyOrder is Groups in no particular order, for a caller that indexes them
// (the SM's forwarding tables): sorting costs O(n log n) after every group created.
func (db *DB) GroupsAnyOrder() []Group {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := make([]Group, 0, len(db.groups))
	for _, g := range db.groups {
		out = append(out, g.export())
	}
	return out
}

// Group returns a copy of the group with the given MGID.
func (db *DB) Group(mgid verbs.GID) (Group, bool) {
	db.mu.Lock()
	defer db.mu.Unlock()
	g := db.groups[mgid]
	if g == nil {
		return Group{}, false
	}
	return g.export(), true
}

// sorted returns the groups in MGID byte order (OpenSM's mgrp_mgid_tbl order). The
// order is kept until a group comes or goes: the SM lists the groups after every
// join (its forwarding tables), and sorting ten thousand groups each time was most of
// what a join cost. Callers must not modify the slice.
func (db *DB) sorted() []*group {
	if db.byMGID != nil {
		return db.byMGID
	}
	gs := make([]*group, 0, len(db.groups))
	for _, g := range db.groups {
		gs = append(gs, g)
	}
	slices.SortFunc(gs, func(a, b *group) int { return bytes.Compare(a.rec.MGID[:], b.rec.MGID[:]) })
	db.byMGID = gs
	return gs
}

// SetConfiguredGroups installs the groups the SM creates from partitions.conf (IPoIB
// broadcast groups, mgid= lines; the first entry for an MGID counts, entries whose
// MGID is not multicast are ignored). Missing ones
// are created in slice order with the lowest free MLIDs from 0xc000 up (after the
// unlisted ones below are gone); existing ones keep their MLID, record and members
// and become WellKnown (OpenSM's find-or-create). Previously configured groups that
// are no longer listed stop being WellKnown; they are deleted when they have no
// FullMember/SendOnlyFullMember left (any remaining non-full members are dropped, as
// OpenSM's osm_mgrp_cleanup does). Zero fields get OpenSM's defaults: MTU 4 (2048),
// Rate 3 (10 Gb/s), PacketLifeTime 18, Scope from the MGID's scope nibble. The group's
// P_Key always carries the full-membership bit, like OpenSM's partition groups.
// It reports whether anything changed.
func (db *DB) SetConfiguredGroups(gs []GroupParams) bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	want := map[verbs.GID]bool{}
	for _, p := range gs {
		if p.MGID.IsMulticast() {
			want[p.MGID] = true
		}
	}
	changed := false
	// Unlisted groups go first, so that new ones can reuse their MLIDs.
	for _, g := range db.sorted() {
		if g.wellKnown && !want[g.rec.MGID] {
			g.wellKnown = false
			db.cleanup(g)
			changed = true
		}
	}
	done := map[verbs.GID]bool{}
	for _, p := range gs {
		if done[p.MGID] || !p.MGID.IsMulticast() {
			continue
		}
		done[p.MGID] = true
		if g := db.groups[p.MGID]; g != nil {
			if !g.wellKnown {
				g.wellKnown = true
				changed = true
			}
			continue
		}
		mlid := db.newMLID(0)
		if mlid == 0 {
			continue // MLID space exhausted
		}
		db.insert(&group{rec: configuredRecord(p, mlid), wellKnown: true})
		changed = true
	}
	if changed {
		db.version++
	}
	return changed
}

func configuredRecord(p GroupParams, mlid verbs.LID) mad.MCMemberRecord {
	if p.MTU == 0 {
		p.MTU = DefaultGroupMTU
	}
	if p.Rate == 0 {
		p.Rate = DefaultGroupRate
	}
	if p.PacketLifeTime == 0 {
		p.PacketLifeTime = DefaultPacketLife
	}
	if p.Scope == 0 {
		p.Scope = p.MGID[1] & 0x0f
	}
	return mad.MCMemberRecord{
		MGID: p.MGID, QKey: p.QKey, MLID: mlid,
		MTUSelector: mad.SelExactly, MTU: p.MTU & 0x3f, TClass: p.TClass,
		PKey: p.PKey | verbs.PKeyFullMember, RateSelector: mad.SelExactly, Rate: p.Rate & 0x3f,
		PacketLifeTimeSelector: mad.SelExactly, PacketLifeTime: p.PacketLifeTime & 0x3f,
		SL: p.SL & 0xf, FlowLabel: p.FlowLabel & 0xfffff, HopLimit: p.HopLimit,
		Scope: p.Scope & 0xf, JoinState: mad.JoinFull, // OpenSM's partition groups carry JoinState 1
	}
}

// RemovePort drops every membership of the port with GID gid (matched on its GUID,
// as OpenSM does): a port left the fabric. Groups losing their last
// FullMember/SendOnlyFullMember drop their remaining members and, unless WellKnown,
// are deleted. It reports whether anything changed.
func (db *DB) RemovePort(gid verbs.GID) bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	changed := false
	for _, g := range db.sorted() {
		m, i := g.member(gid.GUID())
		if m == nil {
			continue
		}
		db.dropBits(g, m, i, 0x0f)
		changed = true
	}
	if changed {
		db.version++
	}
	return changed
}

// insert adds a new group.
func (db *DB) insert(g *group) {
	db.byMGID = nil
	db.groups[g.rec.MGID] = g
	db.mlids[g.rec.MLID] = g
}

// remove deletes a group and frees its MLID.
func (db *DB) remove(g *group) {
	db.byMGID = nil
	delete(db.groups, g.rec.MGID)
	if db.mlids[g.rec.MLID] == g {
		delete(db.mlids, g.rec.MLID)
		db.mlidLow = min(db.mlidLow, g.rec.MLID)
	}
}

// newMLID returns requested if it is a free multicast LID (OpenSM honours the MLID of
// the creating request), else the lowest free one, or 0 when none is left. The search
// starts at mlidLow, so creating N groups costs O(N) in all, not O(N²).
func (db *DB) newMLID(requested verbs.LID) verbs.LID {
	if requested >= verbs.LIDMulticastBase && requested <= maxMLID && db.mlids[requested] == nil {
		return requested
	}
	for l := max(db.mlidLow, verbs.LIDMulticastBase); l <= maxMLID; l++ {
		if db.mlids[l] == nil {
			db.mlidLow = l
			return l
		}
	}
	db.mlidLow = maxMLID + 1
	return 0
}

// addMember merges a join into g (JoinState bits OR-ed into an existing membership,
// whose ProxyJoin flag is kept) and reports whether anything changed.
func (g *group) addMember(gid verbs.GID, state uint8, proxy bool) (*member, bool) {
	if m, _ := g.member(gid.GUID()); m != nil {
		old := m.state
		m.state |= state
		if old&fullish == 0 && m.state&fullish != 0 {
			g.full++
		}
		return m, m.state != old
	}
	m := &member{gid: gid, state: state, proxy: proxy}
	i, _ := slices.BinarySearchFunc(g.members, memberKey(gid.GUID()), func(e *member, k uint64) int {
		a := memberKey(e.gid.GUID())
		switch {
		case a < k:
			return -1
		case a > k:
			return 1
		}
		return 0
	})
	g.members = slices.Insert(g.members, i, m)
	if state&fullish != 0 {
		g.full++
	}
	return m, true
}

// dropBits removes JoinState bits from member m (index i) of g, as OpenSM's
// osm_mgrp_remove_port: the member goes when no bit is left, and when the group loses
// its last FullMember/SendOnlyFullMember it is cleaned up. It returns the remaining
// JoinState.
func (db *DB) dropBits(g *group, m *member, i int, bits uint8) uint8 {
	prev := m.state
	m.state = prev &^ bits
	if m.state == 0 {
		g.members = slices.Delete(g.members, i, i+1)
	}
	if prev&fullish != 0 && m.state&fullish == 0 {
		g.full--
		if g.full <= 0 {
			g.full = 0
			db.cleanup(g)
			return m.state
		}
	}
	if len(g.members) == 0 && !g.wellKnown {
		db.remove(g)
	}
	return m.state
}

// cleanup is osm_mgrp_cleanup: a group without FullMember/SendOnlyFullMember loses all
// its members and, unless WellKnown, is deleted.
func (db *DB) cleanup(g *group) {
	if g.full > 0 {
		return
	}
	g.members = nil
	if !g.wellKnown {
		db.remove(g)
	}
}

// subnetPrefix is the subnet prefix the SA checks GIDs against: the requester's.
func subnetPrefix(src Port) uint64 {
	if src.GID.IsZero() {
		return verbs.DefaultGIDPrefix
	}
	return src.GID.Prefix()
}

// portGUID is a port's GUID (from its GID when GUID is unset).
func portGUID(p Port) verbs.GUID {
	if p.GUID != 0 {
		return p.GUID
	}
	return p.GID.GUID()
}

func samePort(a, b Port) bool { return portGUID(a) == portGUID(b) }

// linkLocal reports whether g is in fe80::/10 (OpenSM's ib_gid_is_link_local).
func linkLocal(g verbs.GID) bool { return g[0] == 0xfe && g[1]&0xc0 == 0x80 }

// broadcastMGID is the IPoIB broadcast MGID ff1<scope>:401b:<pkey>::ffff:ffff.
func broadcastMGID(scope uint8, pkey [2]byte) verbs.GID {
	var g verbs.GID
	g[0], g[1], g[2], g[3] = 0xff, 0x10|scope&0xf, 0x40, 0x1b
	g[4], g[5] = pkey[0], pkey[1]
	binary.BigEndian.PutUint32(g[12:], 0xffffffff)
	return g
}
