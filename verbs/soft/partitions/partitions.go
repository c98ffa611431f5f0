package partitions

import (
	"fmt"
	"slices"

	"ipoibfs/verbs"
)

// Input limits of [Parse]. See the package documentation.
const (
	MaxFileBytes  = 1 << 20 // bytes in a file
	MaxLines      = 1 << 16 // lines in a file
	MaxLineBytes  = 4094    // bytes in a line without its newline (OpenSM reads lines into char[4096] with fgets(…, 4095))
	MaxNameBytes  = 64      // bytes in a partition name (OpenSM keeps 31 of them)
	MaxPartitions = 512     // distinct partitions (merged definitions count once)
	MaxMembers    = 16384   // member entries in all partitions together
	MaxMGIDs      = 512     // mgid lines in all partitions together
)

// OpenSM defaults.
const (
	DefaultPKey  verbs.PKey = 0x7fff    // key of the default partition (15 bits)
	DefaultName             = "Default" // name of the default partition
	DefaultRate  verbs.Rate = 3         // 10 Gb/s
	DefaultMTU   verbs.MTU  = 4         // 2048 bytes
	DefaultScope uint8      = 2         // link-local
	DefaultSL    uint8      = 0
)

// Membership is a port's membership in a partition.
type Membership uint8

const (
	MemberLimited Membership = iota // limited member: P_Key without bit 15
	MemberFull                      // full member: P_Key with bit 15
	MemberBoth                      // both a full and a limited P_Key entry
)

func (m Membership) String() string {
	switch m {
	case MemberLimited:
		return "limited"
	case MemberFull:
		return "full"
	case MemberBoth:
		return "both"
	}
	return fmt.Sprintf("Membership(%d)", uint8(m))
}

// Selector says which ports a member entry stands for.
type Selector uint8

const (
	SelGUID        Selector = iota // the port with Member.GUID
	SelALL                         // every end port (and switch port 0)
	SelALLCAs                      // every channel adapter port
	SelALLSwitches                 // every switch (port 0)
	SelALLRouters                  // every router port
	SelSELF                        // the subnet manager's own port
)

var selectorNames = [...]string{"", "ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF"}

func (s Selector) String() string {
	if s == SelGUID {
		return "GUID"
	}
	if int(s) < len(selectorNames) {
		return selectorNames[s]
	}
	return fmt.Sprintf("Selector(%d)", uint8(s))
}

// Member is one entry of a partition's port list. Membership is resolved: an entry
// written without "=…" carries its definition's defmember.
type Member struct {
	Sel        Selector
	GUID       verbs.GUID // only for SelGUID
	Membership Membership
	Line       int
}

// matches reports whether the entry stands for port p.
func (m *Member) matches(p Port) bool {
	switch m.Sel {
	case SelGUID:
		return m.GUID == p.GUID
	case SelALL:
		return true
	case SelALLCAs:
		return !p.IsSwitch && !p.IsRouter
	case SelALLSwitches:
		return p.IsSwitch
	case SelALLRouters:
		return p.IsRouter
	case SelSELF:
		return p.IsSM
	}
	return false
}

// GroupFlags are the parameters of a multicast group OpenSM creates. Values are IBTA
// enumerations. Scopes is sorted, without duplicates, and never empty in a parsed
// configuration ([2] unless scope= was given); one group is created per scope.
type GroupFlags struct {
	MTU       verbs.MTU
	Rate      verbs.Rate
	SL        uint8
	Scopes    []uint8
	QKey      uint32
	TClass    uint8
	FlowLabel uint32
}

func (g GroupFlags) equal(h GroupFlags) bool {
	return g.MTU == h.MTU && g.Rate == h.Rate && g.SL == h.SL && slices.Equal(g.Scopes, h.Scopes) &&
		g.QKey == h.QKey && g.TClass == h.TClass && g.FlowLabel == h.FlowLabel
}

// MGIDGroup is a multicast group requested by an mgid= line. For IP groups (signature
// 0x401b/0x601b) the MGID's P_Key field holds the partition key with the full bit.
type MGIDGroup struct {
	MGID  verbs.GID
	Flags GroupFlags
	Line  int
}

// Partition is one partition of the configuration; repeated definitions of the same
// partition are merged into the first one (see the package documentation).
type Partition struct {
	Name string
	// PKey is the partition key as given in the file, low 15 bits only; 0 means the key
	// is assigned automatically (see Config.Keys).
	PKey verbs.PKey
	// Index0 asks for the key to be put at P_Key table index 0 (flag indx0).
	Index0 bool
	// IPoIB asks for the IPoIB broadcast group ff1s:401b:PPPP::ffff:ffff, one per scope,
	// with IPoIBFlags. For a partition without ipoib, IPoIBFlags holds the partition-level
	// flags of its first definition. IPoIBFlags.QKey is 0x0b1b unless Q_Key= said
	// otherwise.
	IPoIB      bool
	IPoIBFlags GroupFlags
	// DefMember is the defmember= of the first definition (default limited).
	DefMember Membership
	Members   []Member
	MGIDs     []MGIDGroup
	// Line is the line of the first definition.
	Line int
}

// Config is a parsed partitions.conf.
type Config struct {
	Partitions []Partition
}

// Error is a syntax or semantic error in a partitions.conf file.
type Error struct {
	File   string
	Line   int
	Reason string
}

// LineReason lets a caller that does not import this package report the line.
func (e *Error) LineReason() (int, string) { return e.Line, e.Reason }

func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason) }

// Port describes a port the SM knows, for resolving member lists.
type Port struct {
	GUID     verbs.GUID
	IsSwitch bool // switch port 0 (matches ALL_SWITCHES)
	IsRouter bool // router port (matches ALL_ROUTERS)
	IsSM     bool // the SM's own port (matches SELF, always full in the default partition)
}

// Default returns the configuration OpenSM uses when there is no partitions file:
// "Default=0x7fff, ipoib : ALL=full ;".
func Default() *Config {
	return &Config{Partitions: []Partition{{
		Name:       DefaultName,
		PKey:       DefaultPKey,
		IPoIB:      true,
		IPoIBFlags: defaultRawFlags().broadcast(),
		DefMember:  MemberLimited,
		Members:    []Member{{Sel: SelALL, Membership: MemberFull, Line: 1}},
		Line:       1,
	}}}
}

// rawFlags are the group flags of one definition as OpenSM keeps them while parsing
// (struct group_flags): scopes as a bit mask, Q_Key 0 meaning "default".
type rawFlags struct {
	mtu    verbs.MTU
	rate   verbs.Rate
	sl     uint8
	scopes uint16
	qkey   uint32
	tclass uint8
	flow   uint32
}

func defaultRawFlags() rawFlags { return rawFlags{mtu: DefaultMTU, rate: DefaultRate, sl: DefaultSL} }

func (f rawFlags) group() GroupFlags {
	g := GroupFlags{MTU: f.mtu, Rate: f.rate, SL: f.sl, QKey: f.qkey, TClass: f.tclass, FlowLabel: f.flow}
	for s := uint8(1); s < 16; s++ {
		if f.scopes&(1<<s) != 0 {
			g.Scopes = append(g.Scopes, s)
		}
	}
	if g.Scopes == nil {
		g.Scopes = []uint8{DefaultScope}
	}
	return g
}

// broadcast returns the flags of an IP group: Q_Key 0 means 0x0b1b.
func (f rawFlags) broadcast() GroupFlags {
	g := f.group()
	if g.QKey == 0 {
		g.QKey = verbs.IPoIBQKey
	}
	return g
}

// ipoibBroadcastTemplate is OpenSM's osm_ipoib_broadcast_mgid.
var ipoibBroadcastTemplate = verbs.GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}

// isIPMGID reports whether g has the IPv4 (0x401b) or IPv6 (0x601b) signature.
func isIPMGID(g verbs.GID) bool { return (g[2] == 0x40 || g[2] == 0x60) && g[3] == 0x1b }

// BroadcastMGID returns the IPoIB broadcast MGID ff1s:401b:PPPP::ffff:ffff of partition
// key (full bit added) for scope s.
func BroadcastMGID(key verbs.PKey, scope uint8) verbs.GID {
	g := ipoibBroadcastTemplate
	g[1] = 0x10 | scope&0xf
	k := key | verbs.PKeyFullMember
	g[4], g[5] = byte(k>>8), byte(k)
	return g
}

// nextAutoKey is OpenSM's generate_pkey: the next counter value that is not in use, or
// 0 when the counter has reached 0x7ffe.
func nextAutoKey(counter *uint16, used func(uint16) bool) uint16 {
	for *counter < uint16(DefaultPKey)-1 {
		*counter++
		if !used(*counter) {
			return *counter
		}
	}
	return 0
}
