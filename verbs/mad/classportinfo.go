package mad

import (
	"encoding/binary"

	"ipoibfs/verbs"
)

// ClassPortInfoSize is the wire size of ClassPortInfo (IBA 13.4.8.1).
const ClassPortInfoSize = 72

// ClassPortInfo.CapabilityMask bits. Bits 0..7 are common to all classes (OpenSM
// OSM_CAP_IS_*); bits 8..15 are SA specific (IBA table 188; umad_sa.h
// UMAD_SA_CAP_MASK_*).
const (
	CapTrapSupported            uint16 = 1 << 0 // class generates Trap() MADs
	CapGetSetNoticeSupported    uint16 = 1 << 1 // Get/Set(Notice) supported
	CapSASubnetOptionalRecords  uint16 = 1 << 8
	CapSAUDMulticast            uint16 = 1 << 9 // UD multicast (MCMemberRecord) supported
	CapSAMultiPath              uint16 = 1 << 10
	CapSAReinit                 uint16 = 1 << 11
	CapSAGIDScopedMultiPath     uint16 = 1 << 12
	CapSAPortInfoCapMaskMatch   uint16 = 1 << 13
	CapSALinkSpeedWidthPairsRec uint16 = 1 << 14
	CapSAPAServices             uint16 = 1 << 15
)

// ClassPortInfo.CapabilityMask2 bits of the SA (27-bit field; umad_sa.h
// UMAD_SA_CAP_MASK2_*, OpenSM OSM_CAP2_IS_*).
const (
	CapMask2UnPathRePath              uint32 = 1 << 0
	CapMask2QoS                       uint32 = 1 << 1
	CapMask2ReversePathPKey           uint32 = 1 << 2
	CapMask2MulticastFDBTop           uint32 = 1 << 3
	CapMask2HierarchyInfo             uint32 = 1 << 4
	CapMask2AdditionalGUID            uint32 = 1 << 5 // alias GUIDs
	CapMask2FullPortInfoRecord        uint32 = 1 << 6
	CapMask2ExtendedSpeeds            uint32 = 1 << 7
	CapMask2MulticastServiceRecord    uint32 = 1 << 8
	CapMask2CableInfoRecord           uint32 = 1 << 9
	CapMask2PortInfoCapMask2Match     uint32 = 1 << 10
	CapMask2PortInfoExtRecord         uint32 = 1 << 11
	CapMask2SendOnlyFullMemberSupport uint32 = 1 << 12 // kernel IB_SA_CAP_MASK2_SENDONLY_FULL_MEM_SUPPORT, OpenSM OSM_CAP2_IS_SEND_ONLY_FULL_MEM_SUPPORTED
	CapMask2LinkWidth2x               uint32 = 1 << 13 // OpenSM OSM_CAP2_IS_LINK_WIDTH_2X_SUPPORTED
)

// ClassPortInfo is the ClassPortInfo attribute (0x0001) every management class
// supports. The kernel's SA client reads CapabilityMask2 from it to decide whether it
// may join send-only groups as SendOnlyFullMember.
type ClassPortInfo struct {
	BaseVersion     uint8
	ClassVersion    uint8
	CapabilityMask  uint16
	CapabilityMask2 uint32 // 27 bits
	RespTimeValue   uint8  // 5 bits
	RedirectGID     verbs.GID
	RedirectTC      uint8
	RedirectSL      uint8  // 4 bits
	RedirectFL      uint32 // 20 bits
	RedirectLID     verbs.LID
	RedirectPKey    verbs.PKey
	RedirectQP      verbs.QPN // 24 bits
	RedirectQKey    uint32
	TrapGID         verbs.GID
	TrapTC          uint8
	TrapSL          uint8  // 4 bits
	TrapFL          uint32 // 20 bits
	TrapLID         verbs.LID
	TrapPKey        verbs.PKey
	TrapHL          uint8
	TrapQP          verbs.QPN // 24 bits
	TrapQKey        uint32
}

func tcSLFL(tc, sl uint8, fl uint32) uint32 {
	return uint32(tc)<<24 | uint32(sl&0xf)<<20 | fl&0xfffff
}

// Marshal writes the attribute into b[:ClassPortInfoSize], masking each field to its
// width; reserved bits are zero. It panics if b is shorter.
func (c *ClassPortInfo) Marshal(b []byte) {
	_ = b[ClassPortInfoSize-1]
	b[0] = c.BaseVersion
	b[1] = c.ClassVersion
	binary.BigEndian.PutUint16(b[2:], c.CapabilityMask)
	binary.BigEndian.PutUint32(b[4:], (c.CapabilityMask2&(1<<27-1))<<5|uint32(c.RespTimeValue&0x1f))
	copy(b[8:24], c.RedirectGID[:])
	binary.BigEndian.PutUint32(b[24:], tcSLFL(c.RedirectTC, c.RedirectSL, c.RedirectFL))
	binary.BigEndian.PutUint16(b[28:], uint16(c.RedirectLID))
	binary.BigEndian.PutUint16(b[30:], uint16(c.RedirectPKey))
	binary.BigEndian.PutUint32(b[32:], uint32(c.RedirectQP)&0xffffff)
	binary.BigEndian.PutUint32(b[36:], c.RedirectQKey)
	copy(b[40:56], c.TrapGID[:])
	binary.BigEndian.PutUint32(b[56:], tcSLFL(c.TrapTC, c.TrapSL, c.TrapFL))
	binary.BigEndian.PutUint16(b[60:], uint16(c.TrapLID))
	binary.BigEndian.PutUint16(b[62:], uint16(c.TrapPKey))
	binary.BigEndian.PutUint32(b[64:], uint32(c.TrapHL)<<24|uint32(c.TrapQP)&0xffffff)
	binary.BigEndian.PutUint32(b[68:], c.TrapQKey)
}

// Unmarshal decodes the attribute from b, which must hold ClassPortInfoSize bytes.
func (c *ClassPortInfo) Unmarshal(b []byte) error {
	if len(b) < ClassPortInfoSize {
		return short("ClassPortInfo", len(b), ClassPortInfoSize)
	}
	c.BaseVersion = b[0]
	c.ClassVersion = b[1]
	c.CapabilityMask = binary.BigEndian.Uint16(b[2:])
	w := binary.BigEndian.Uint32(b[4:])
	c.CapabilityMask2, c.RespTimeValue = w>>5, uint8(w&0x1f)
	copy(c.RedirectGID[:], b[8:24])
	w = binary.BigEndian.Uint32(b[24:])
	c.RedirectTC, c.RedirectSL, c.RedirectFL = uint8(w>>24), uint8(w>>20&0xf), w&0xfffff
	c.RedirectLID = verbs.LID(binary.BigEndian.Uint16(b[28:]))
	c.RedirectPKey = verbs.PKey(binary.BigEndian.Uint16(b[30:]))
	c.RedirectQP = verbs.QPN(binary.BigEndian.Uint32(b[32:]) & 0xffffff)
	c.RedirectQKey = binary.BigEndian.Uint32(b[36:])
	copy(c.TrapGID[:], b[40:56])
	w = binary.BigEndian.Uint32(b[56:])
	c.TrapTC, c.TrapSL, c.TrapFL = uint8(w>>24), uint8(w>>20&0xf), w&0xfffff
	c.TrapLID = verbs.LID(binary.BigEndian.Uint16(b[60:]))
	c.TrapPKey = verbs.PKey(binary.BigEndian.Uint16(b[62:]))
	w = binary.BigEndian.Uint32(b[64:])
	c.TrapHL, c.TrapQP = uint8(w>>24), verbs.QPN(w&0xffffff)
	c.TrapQKey = binary.BigEndian.Uint32(b[68:])
	return nil
}
