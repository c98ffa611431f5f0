package mad

import (
	"encoding/binary"

	"ipoibfs/verbs"
)

// The SA records a fabric view is built from (what saquery shows with -N, -p and
// --pkey-table): NodeRecord, PortInfoRecord and P_KeyTableRecord, laid out as in
// IBA 15.2.5 and OpenSM's ib_types.h.

// Record sizes on the wire, and where the embedded attributes start.
const (
	NodeRecordSize       = 108 // LID, reserved, NodeInfo (40), NodeDescription (64)
	PortInfoRecordSize   = 68  // EndportLID, PortNum, Options, PortInfo (64)
	PKeyTableRecordSize  = 72  // LID, BlockNum, PortNum, reserved (3), 32 P_Keys
	PKeysPerBlock        = 32
	NodeTypeCA           = 1
	nodeDescSize         = 64
	nodeInfoOffsetInRec  = 4
	nodeDescOffsetInRec  = 44
	portInfoOffsetInRec  = 4
	pkeyTableOffsetInRec = 8
)

// NodeRecord is the SA NodeRecord (0x0011) of a channel adapter port.
type NodeRecord struct {
	LID          verbs.LID
	NodeType     uint8 // 1 channel adapter, 2 switch, 3 router
	NumPorts     uint8
	SysImageGUID verbs.GUID
	NodeGUID     verbs.GUID
	PortGUID     verbs.GUID
	PartitionCap uint16
	DeviceID     uint16
	Revision     uint32
	LocalPort    uint8
	VendorID     uint32 // 24 bits
	Desc         string // NodeDescription, up to 64 bytes, NUL padded
}

// Marshal writes r into b[:NodeRecordSize].
func (r *NodeRecord) Marshal(b []byte) {
	_ = b[NodeRecordSize-1]
	clear(b[:NodeRecordSize])
	binary.BigEndian.PutUint16(b[0:], uint16(r.LID))
	n := b[nodeInfoOffsetInRec:]
	n[0], n[1], n[2], n[3] = BaseVersion, 1, r.NodeType, r.NumPorts // NodeInfo class version 1
	binary.BigEndian.PutUint64(n[4:], uint64(r.SysImageGUID))
	binary.BigEndian.PutUint64(n[12:], uint64(r.NodeGUID))
	binary.BigEndian.PutUint64(n[20:], uint64(r.PortGUID))
	binary.BigEndian.PutUint16(n[28:], r.PartitionCap)
	binary.BigEndian.PutUint16(n[30:], r.DeviceID)
	binary.BigEndian.PutUint32(n[32:], r.Revision)
	binary.BigEndian.PutUint32(n[36:], r.VendorID&0xffffff)
	n[36] = r.LocalPort
	copy(b[nodeDescOffsetInRec:nodeDescOffsetInRec+nodeDescSize], r.Desc)
}

// Unmarshal decodes a NodeRecord from b[:NodeRecordSize].
func (r *NodeRecord) Unmarshal(b []byte) error {
	if len(b) < NodeRecordSize {
		return short("NodeRecord", len(b), NodeRecordSize)
	}
	r.LID = verbs.LID(binary.BigEndian.Uint16(b[0:]))
	n := b[nodeInfoOffsetInRec:]
	r.NodeType, r.NumPorts = n[2], n[3]
	r.SysImageGUID = verbs.GUID(binary.BigEndian.Uint64(n[4:]))
	r.NodeGUID = verbs.GUID(binary.BigEndian.Uint64(n[12:]))
	r.PortGUID = verbs.GUID(binary.BigEndian.Uint64(n[20:]))
	r.PartitionCap = binary.BigEndian.Uint16(n[28:])
	r.DeviceID = binary.BigEndian.Uint16(n[30:])
	r.Revision = binary.BigEndian.Uint32(n[32:])
	r.LocalPort = n[36]
	r.VendorID = binary.BigEndian.Uint32(n[36:]) & 0xffffff
	d := b[nodeDescOffsetInRec : nodeDescOffsetInRec+nodeDescSize]
	if i := indexZero(d); i >= 0 {
		d = d[:i]
	}
	r.Desc = string(d)
	return nil
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// PortInfoRecord is the SA PortInfoRecord (0x0012): the PortInfo fields a fabric
// view needs; the rest of the 64-byte PortInfo is written as zero.
type PortInfoRecord struct {
	LID           verbs.LID // EndportLID
	PortNum       uint8
	GIDPrefix     uint64
	PortLID       verbs.LID // PortInfo.LID
	MasterSMLID   verbs.LID
	CapMask       uint32
	LocalPortNum  uint8
	LinkWidthAct  uint8 // 1 1x, 2 4x, 4 8x, 8 12x
	State         verbs.PortState
	PhysState     uint8
	LinkSpeedAct  uint8 // 1 SDR, 2 DDR, 4 QDR
	NeighborMTU   verbs.MTU
	MTUCap        verbs.MTU
	SubnetTimeout uint8
}

// Marshal writes r into b[:PortInfoRecordSize].
func (r *PortInfoRecord) Marshal(b []byte) {
	_ = b[PortInfoRecordSize-1]
	clear(b[:PortInfoRecordSize])
	binary.BigEndian.PutUint16(b[0:], uint16(r.LID))
	b[2] = r.PortNum
	p := b[portInfoOffsetInRec:]
	binary.BigEndian.PutUint64(p[8:], r.GIDPrefix)
	binary.BigEndian.PutUint16(p[16:], uint16(r.PortLID))
	binary.BigEndian.PutUint16(p[18:], uint16(r.MasterSMLID))
	binary.BigEndian.PutUint32(p[20:], r.CapMask)
	p[28] = r.LocalPortNum
	p[29], p[30], p[31] = r.LinkWidthAct, r.LinkWidthAct, r.LinkWidthAct // enabled, supported, active
	p[32] = r.LinkSpeedAct<<4 | uint8(r.State)&0x0f                      // LinkSpeedSupported, PortState
	p[33] = r.PhysState << 4                                             // PortPhysicalState, LinkDownDefault
	p[35] = r.LinkSpeedAct<<4 | r.LinkSpeedAct                           // LinkSpeedActive, LinkSpeedEnabled
	p[36] = uint8(r.NeighborMTU) << 4
	p[41] = uint8(r.MTUCap) & 0x0f
	p[51] = r.SubnetTimeout & 0x1f
}

// Unmarshal decodes a PortInfoRecord from b[:PortInfoRecordSize].
func (r *PortInfoRecord) Unmarshal(b []byte) error {
	if len(b) < PortInfoRecordSize {
		return short("PortInfoRecord", len(b), PortInfoRecordSize)
	}
	r.LID = verbs.LID(binary.BigEndian.Uint16(b[0:]))
	r.PortNum = b[2]
	p := b[portInfoOffsetInRec:]
	r.GIDPrefix = binary.BigEndian.Uint64(p[8:])
	r.PortLID = verbs.LID(binary.BigEndian.Uint16(p[16:]))
	r.MasterSMLID = verbs.LID(binary.BigEndian.Uint16(p[18:]))
	r.CapMask = binary.BigEndian.Uint32(p[20:])
	r.LocalPortNum = p[28]
	r.LinkWidthAct = p[31]
	r.State = verbs.PortState(p[32] & 0x0f)
	r.PhysState = p[33] >> 4
	r.LinkSpeedAct = p[35] >> 4
	r.NeighborMTU = verbs.MTU(p[36] >> 4)
	r.MTUCap = verbs.MTU(p[41] & 0x0f)
	r.SubnetTimeout = p[51] & 0x1f
	return nil
}

// PKeyTableRecord is the SA P_KeyTableRecord (0x0033): one block of 32 P_Keys.
type PKeyTableRecord struct {
	LID      verbs.LID
	BlockNum uint16
	PortNum  uint8
	PKeys    [PKeysPerBlock]verbs.PKey
}

// Marshal writes r into b[:PKeyTableRecordSize].
func (r *PKeyTableRecord) Marshal(b []byte) {
	_ = b[PKeyTableRecordSize-1]
	clear(b[:PKeyTableRecordSize])
	binary.BigEndian.PutUint16(b[0:], uint16(r.LID))
	binary.BigEndian.PutUint16(b[2:], r.BlockNum)
	b[4] = r.PortNum
	for i, k := range r.PKeys {
		binary.BigEndian.PutUint16(b[pkeyTableOffsetInRec+2*i:], uint16(k))
	}
}

// Unmarshal decodes a PKeyTableRecord from b[:PKeyTableRecordSize].
func (r *PKeyTableRecord) Unmarshal(b []byte) error {
	if len(b) < PKeyTableRecordSize {
		return short("P_KeyTableRecord", len(b), PKeyTableRecordSize)
	}
	r.LID = verbs.LID(binary.BigEndian.Uint16(b[0:]))
	r.BlockNum = binary.BigEndian.Uint16(b[2:])
	r.PortNum = b[4]
	for i := range r.PKeys {
		r.PKeys[i] = verbs.PKey(binary.BigEndian.Uint16(b[pkeyTableOffsetInRec+2*i:]))
	}
	return nil
}
