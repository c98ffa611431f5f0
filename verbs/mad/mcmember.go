package mad

import (
	"encoding/binary"

	"ipoibfs/verbs"
)

// MCMemberRecordSize is the wire size of an MCMemberRecord. In SA MADs it occupies 56
// bytes (AttributeOffset 7).
const MCMemberRecordSize = 52

// Selectors for the MTU, Rate and PacketLifeTime fields of MCMemberRecord and
// PathRecord; on the wire they are the top 2 bits of the field's byte.
const (
	SelGreater  = 0 // greater than the given value
	SelLess     = 1 // less than the given value
	SelExactly  = 2 // exactly the given value
	SelLargest  = 3 // largest available (MTU, rate)
	SelSmallest = 3 // smallest available (packet lifetime)
)

// JoinState bits of an MCMemberRecord.
const (
	JoinFull         = 1 // FullMember
	JoinNon          = 2 // NonMember
	JoinSendOnlyNon  = 4 // SendOnlyNonMember
	JoinSendOnlyFull = 8 // SendOnlyFullMember (needs ClassPortInfo CapMask2SendOnlyFullMemberSupport)
)

// Multicast address scopes (the MGID scope nibble and MCMemberRecord.Scope).
const (
	ScopeLinkLocal = 0x2
	ScopeSiteLocal = 0x5
	ScopeOrgLocal  = 0x8
	ScopeGlobal    = 0xe
)

// MCMemberRecord component mask bits (IBA 15.2.5.17; OpenSM IB_MCR_COMPMASK_*, kernel
// IB_SA_MCMEMBER_REC_*), bit n = field n in record order.
const (
	CompMCMGID                   uint64 = 1 << 0
	CompMCPortGID                uint64 = 1 << 1
	CompMCQKey                   uint64 = 1 << 2
	CompMCMLID                   uint64 = 1 << 3
	CompMCMTUSelector            uint64 = 1 << 4
	CompMCMTU                    uint64 = 1 << 5
	CompMCTClass                 uint64 = 1 << 6
	CompMCPKey                   uint64 = 1 << 7
	CompMCRateSelector           uint64 = 1 << 8
	CompMCRate                   uint64 = 1 << 9
	CompMCPacketLifeTimeSelector uint64 = 1 << 10
	CompMCPacketLifeTime         uint64 = 1 << 11
	CompMCSL                     uint64 = 1 << 12
	CompMCFlowLabel              uint64 = 1 << 13
	CompMCHopLimit               uint64 = 1 << 14
	CompMCScope                  uint64 = 1 << 15
	CompMCJoinState              uint64 = 1 << 16
	CompMCProxyJoin              uint64 = 1 << 17
)

// Component masks the Linux kernel uses for MCMemberRecord requests.
const (
	// IPoIBBroadcastJoinMask is ipoib's join of the broadcast group, which the SM must
	// already have created: MGID|PortGID|P_Key|JoinState = 0x10083.
	IPoIBBroadcastJoinMask = CompMCMGID | CompMCPortGID | CompMCPKey | CompMCJoinState

	// IPoIBCreateJoinMask is ipoib's join of any other group, which may create it; the
	// values are copied from the broadcast group with "exactly" MTU and rate selectors:
	// the broadcast mask plus Q_Key, MTUSelector, MTU, TClass, RateSelector, Rate, SL,
	// FlowLabel and HopLimit = 0x173f7.
	IPoIBCreateJoinMask = IPoIBBroadcastJoinMask | CompMCQKey | CompMCMTUSelector | CompMCMTU |
		CompMCTClass | CompMCRateSelector | CompMCRate | CompMCSL | CompMCFlowLabel | CompMCHopLimit

	// LeaveMask is the kernel multicast module's leave (SA Delete):
	// MGID|PortGID|JoinState = 0x10003.
	LeaveMask = CompMCMGID | CompMCPortGID | CompMCJoinState
)

// MCMemberRecord is the SA MCMemberRecord (attribute 0x0038). The selectors are kept
// apart from their values; MTU, Rate and PacketLifeTime hold only the low 6 bits.
type MCMemberRecord struct {
	MGID                   verbs.GID
	PortGID                verbs.GID
	QKey                   uint32
	MLID                   verbs.LID
	MTUSelector            uint8 // 2 bits
	MTU                    verbs.MTU
	TClass                 uint8
	PKey                   verbs.PKey
	RateSelector           uint8 // 2 bits
	Rate                   verbs.Rate
	PacketLifeTimeSelector uint8  // 2 bits
	PacketLifeTime         uint8  // 6 bits
	SL                     uint8  // 4 bits
	FlowLabel              uint32 // 20 bits
	HopLimit               uint8
	Scope                  uint8 // 4 bits
	JoinState              uint8 // 4 bits, JoinFull|JoinNon|...
	ProxyJoin              bool
}

// selByte packs a 2-bit selector and a 6-bit value.
func selByte(sel, v uint8) byte { return sel<<6 | v&0x3f }

// Marshal writes the record into b[:MCMemberRecordSize], masking each field to its
// width; reserved bits are zero. It panics if b is shorter.
func (r *MCMemberRecord) Marshal(b []byte) {
	_ = b[MCMemberRecordSize-1]
	copy(b[0:16], r.MGID[:])
	copy(b[16:32], r.PortGID[:])
	binary.BigEndian.PutUint32(b[32:], r.QKey)
	binary.BigEndian.PutUint16(b[36:], uint16(r.MLID))
	b[38] = selByte(r.MTUSelector, uint8(r.MTU))
	b[39] = r.TClass
	binary.BigEndian.PutUint16(b[40:], uint16(r.PKey))
	b[42] = selByte(r.RateSelector, uint8(r.Rate))
	b[43] = selByte(r.PacketLifeTimeSelector, r.PacketLifeTime)
	binary.BigEndian.PutUint32(b[44:], uint32(r.SL&0xf)<<28|(r.FlowLabel&0xfffff)<<8|uint32(r.HopLimit))
	b[48] = r.Scope<<4 | r.JoinState&0xf
	b[49] = 0
	if r.ProxyJoin {
		b[49] = 0x80
	}
	b[50], b[51] = 0, 0
}

// Unmarshal decodes the record from b, which must hold MCMemberRecordSize bytes.
func (r *MCMemberRecord) Unmarshal(b []byte) error {
	if len(b) < MCMemberRecordSize {
		return short("MCMemberRecord", len(b), MCMemberRecordSize)
	}
	copy(r.MGID[:], b[0:16])
	copy(r.PortGID[:], b[16:32])
	r.QKey = binary.BigEndian.Uint32(b[32:])
	r.MLID = verbs.LID(binary.BigEndian.Uint16(b[36:]))
	r.MTUSelector, r.MTU = b[38]>>6, verbs.MTU(b[38]&0x3f)
	r.TClass = b[39]
	r.PKey = verbs.PKey(binary.BigEndian.Uint16(b[40:]))
	r.RateSelector, r.Rate = b[42]>>6, verbs.Rate(b[42]&0x3f)
	r.PacketLifeTimeSelector, r.PacketLifeTime = b[43]>>6, b[43]&0x3f
	w := binary.BigEndian.Uint32(b[44:])
	r.SL = uint8(w >> 28)
	r.FlowLabel = w >> 8 & 0xfffff
	r.HopLimit = uint8(w)
	r.Scope, r.JoinState = b[48]>>4, b[48]&0xf
	r.ProxyJoin = b[49]&0x80 != 0
	return nil
}
