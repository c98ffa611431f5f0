package mad

import (
	"encoding/binary"

	"ipoibfs/verbs"
)

// PathRecordSize is the wire size of a PathRecord (AttributeOffset 8).
const PathRecordSize = 64

// PathRecord component mask bits (IBA 15.2.5.16; OpenSM IB_PR_COMPMASK_*, kernel
// IB_SA_PATH_REC_*). The 64-bit ServiceID has two bits (its top 8 and low 56 bits);
// bit 7 is reserved.
const (
	CompPRServiceID8MSB          uint64 = 1 << 0
	CompPRServiceID56LSB         uint64 = 1 << 1
	CompPRServiceID                     = CompPRServiceID8MSB | CompPRServiceID56LSB
	CompPRDGID                   uint64 = 1 << 2
	CompPRSGID                   uint64 = 1 << 3
	CompPRDLID                   uint64 = 1 << 4
	CompPRSLID                   uint64 = 1 << 5
	CompPRRawTraffic             uint64 = 1 << 6
	CompPRFlowLabel              uint64 = 1 << 8
	CompPRHopLimit               uint64 = 1 << 9
	CompPRTClass                 uint64 = 1 << 10
	CompPRReversible             uint64 = 1 << 11
	CompPRNumbPath               uint64 = 1 << 12
	CompPRPKey                   uint64 = 1 << 13
	CompPRQoSClass               uint64 = 1 << 14
	CompPRSL                     uint64 = 1 << 15
	CompPRMTUSelector            uint64 = 1 << 16
	CompPRMTU                    uint64 = 1 << 17
	CompPRRateSelector           uint64 = 1 << 18
	CompPRRate                   uint64 = 1 << 19
	CompPRPacketLifeTimeSelector uint64 = 1 << 20
	CompPRPacketLifeTime         uint64 = 1 << 21
	CompPRPreference             uint64 = 1 << 22
)

// IPoIBPathMask is the Linux ipoib PathRecord query (path_rec_start):
// DGID|SGID|TClass|NumbPath|P_Key = 0x340c. ipoib also sets Reversible=1 and
// NumbPath=1 in the record, but Reversible is not in its mask.
const IPoIBPathMask = CompPRDGID | CompPRSGID | CompPRTClass | CompPRNumbPath | CompPRPKey

// PathRecord is the SA PathRecord (attribute 0x0035). The selectors are kept apart from
// their values; MTU, Rate and PacketLifeTime hold only the low 6 bits.
type PathRecord struct {
	ServiceID              uint64
	DGID                   verbs.GID
	SGID                   verbs.GID
	DLID                   verbs.LID
	SLID                   verbs.LID
	RawTraffic             bool
	FlowLabel              uint32 // 20 bits
	HopLimit               uint8
	TClass                 uint8
	Reversible             bool
	NumbPath               uint8 // 7 bits; in queries the maximum number of paths
	PKey                   verbs.PKey
	QoSClass               uint16 // 12 bits
	SL                     uint8  // 4 bits
	MTUSelector            uint8  // 2 bits
	MTU                    verbs.MTU
	RateSelector           uint8 // 2 bits
	Rate                   verbs.Rate
	PacketLifeTimeSelector uint8 // 2 bits
	PacketLifeTime         uint8 // 6 bits
	Preference             uint8
}

// Marshal writes the record into b[:PathRecordSize], masking each field to its width;
// reserved bits are zero. It panics if b is shorter.
func (r *PathRecord) Marshal(b []byte) {
	_ = b[PathRecordSize-1]
	binary.BigEndian.PutUint64(b[0:], r.ServiceID)
	copy(b[8:24], r.DGID[:])
	copy(b[24:40], r.SGID[:])
	binary.BigEndian.PutUint16(b[40:], uint16(r.DLID))
	binary.BigEndian.PutUint16(b[42:], uint16(r.SLID))
	w := (r.FlowLabel&0xfffff)<<8 | uint32(r.HopLimit)
	if r.RawTraffic {
		w |= 1 << 31
	}
	binary.BigEndian.PutUint32(b[44:], w)
	b[48] = r.TClass
	b[49] = r.NumbPath & 0x7f
	if r.Reversible {
		b[49] |= 0x80
	}
	binary.BigEndian.PutUint16(b[50:], uint16(r.PKey))
	binary.BigEndian.PutUint16(b[52:], (r.QoSClass&0xfff)<<4|uint16(r.SL&0xf))
	b[54] = selByte(r.MTUSelector, uint8(r.MTU))
	b[55] = selByte(r.RateSelector, uint8(r.Rate))
	b[56] = selByte(r.PacketLifeTimeSelector, r.PacketLifeTime)
	b[57] = r.Preference
	clear(b[58:64])
}

// Unmarshal decodes the record from b, which must hold PathRecordSize bytes.
func (r *PathRecord) Unmarshal(b []byte) error {
	if len(b) < PathRecordSize {
		return short("PathRecord", len(b), PathRecordSize)
	}
	r.ServiceID = binary.BigEndian.Uint64(b[0:])
	copy(r.DGID[:], b[8:24])
	copy(r.SGID[:], b[24:40])
	r.DLID = verbs.LID(binary.BigEndian.Uint16(b[40:]))
	r.SLID = verbs.LID(binary.BigEndian.Uint16(b[42:]))
	w := binary.BigEndian.Uint32(b[44:])
	r.RawTraffic = w>>31 != 0
	r.FlowLabel = w >> 8 & 0xfffff
	r.HopLimit = uint8(w)
	r.TClass = b[48]
	r.Reversible, r.NumbPath = b[49]&0x80 != 0, b[49]&0x7f
	r.PKey = verbs.PKey(binary.BigEndian.Uint16(b[50:]))
	q := binary.BigEndian.Uint16(b[52:])
	r.QoSClass, r.SL = q>>4, uint8(q&0xf)
	r.MTUSelector, r.MTU = b[54]>>6, verbs.MTU(b[54]&0x3f)
	r.RateSelector, r.Rate = b[55]>>6, verbs.Rate(b[55]&0x3f)
	r.PacketLifeTimeSelector, r.PacketLifeTime = b[56]>>6, b[56]&0x3f
	r.Preference = b[57]
	return nil
}
