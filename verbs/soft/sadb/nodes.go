package sadb

import (
	"slices"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// NodeRecord, PortInfoRecord and P_KeyTableRecord after OpenSM's
// osm_sa_node_record.c, osm_sa_portinfo_record.c and osm_sa_pkey_record.c: what
// saquery -N, -p and --pkey-table ask for, and what a node's fabric view is built
// from. The fabric is channel adapters only (the soft fabric has no switches).

// Component mask bits matched here (IBA 15.2.5.2, .3, .11); other bits are accepted
// and not matched.
const (
	compNodeLID      uint64 = 1 << 0
	compNodeGUID     uint64 = 1 << 7
	compNodePortGUID uint64 = 1 << 8
	compPIRLID       uint64 = 1 << 0
	compPIRPortNum   uint64 = 1 << 1
	compPKeyLID      uint64 = 1 << 0
	compPKeyBlock    uint64 = 1 << 1
	compPKeyPortNum  uint64 = 1 << 2

	capMaskIsSM         = 1 << 1
	capMaskClientRereg  = 1 << 25
	capMaskIsSMDisabled = 1 << 10
)

func (db *DB) portRecords(src Port, m *mad.SAMAD) []byte {
	if m.Method != mad.MethodGet && m.Method != mad.MethodGetTable {
		return errorResp(m, mad.StatusBadMethodAttr)
	}
	ports := db.visiblePorts(src, m.SA.SMKey != 0)
	mask := m.SA.CompMask
	var recs [][]byte
	switch m.AttrID {
	case mad.AttrNodeRecord:
		var q mad.NodeRecord
		_ = q.Unmarshal(m.Data[:])
		for _, p := range ports {
			if mask&compNodeLID != 0 && q.LID != p.LID ||
				mask&compNodeGUID != 0 && q.NodeGUID != p.NodeGUID ||
				mask&compNodePortGUID != 0 && q.PortGUID != p.GUID {
				continue
			}
			r := mad.NodeRecord{LID: p.LID, NodeType: mad.NodeTypeCA, NumPorts: p.NumPorts,
				SysImageGUID: p.NodeGUID, NodeGUID: p.NodeGUID, PortGUID: p.GUID,
				PartitionCap: verbs.PKeyTableCapacity, LocalPort: p.PortNum, Desc: p.Desc}
			b := make([]byte, mad.NodeRecordSize)
			r.Marshal(b)
			recs = append(recs, b)
		}
		return respond(m, mad.NodeRecordSize, recs)
	case mad.AttrPortInfoRecord:
		var q mad.PortInfoRecord
		_ = q.Unmarshal(m.Data[:])
		smLID := db.smLID()
		for _, p := range ports {
			if mask&compPIRLID != 0 && q.LID != p.LID || mask&compPIRPortNum != 0 && q.PortNum != p.PortNum {
				continue
			}
			r := mad.PortInfoRecord{LID: p.LID, PortNum: p.PortNum, GIDPrefix: p.GID.Prefix(), PortLID: p.LID,
				MasterSMLID: smLID, CapMask: capMaskClientRereg | capMaskIsSMDisabled, LocalPortNum: p.PortNum,
				LinkWidthAct: p.Width, State: verbs.PortActive, PhysState: physLinkUp, LinkSpeedAct: p.Speed,
				NeighborMTU: p.MTU, MTUCap: p.MaxMTU, SubnetTimeout: DefaultPacketLife}
			if p.IsSM {
				r.CapMask = capMaskClientRereg | capMaskIsSM
			}
			b := make([]byte, mad.PortInfoRecordSize)
			r.Marshal(b)
			recs = append(recs, b)
		}
		return respond(m, mad.PortInfoRecordSize, recs)
	default: // P_KeyTableRecord
		var q mad.PKeyTableRecord
		_ = q.Unmarshal(m.Data[:])
		for _, p := range ports {
			if mask&compPKeyLID != 0 && q.LID != p.LID || mask&compPKeyPortNum != 0 && q.PortNum != p.PortNum {
				continue
			}
			for blk := 0; blk*mad.PKeysPerBlock < max(1, len(p.PKeys)); blk++ {
				if mask&compPKeyBlock != 0 && int(q.BlockNum) != blk {
					continue
				}
				r := mad.PKeyTableRecord{LID: p.LID, BlockNum: uint16(blk), PortNum: p.PortNum}
				copy(r.PKeys[:], p.PKeys[min(len(p.PKeys), blk*mad.PKeysPerBlock):])
				b := make([]byte, mad.PKeyTableRecordSize)
				r.Marshal(b)
				recs = append(recs, b)
			}
		}
		return respond(m, mad.PKeyTableRecordSize, recs)
	}
}

// physLinkUp is PortPhysicalState LinkUp (5).
const physLinkUp = 5

// visiblePorts lists, by LID, the ports the requester may see: all of them for a
// trusted (SM_Key) request, else those sharing a partition with it, as OpenSM's
// osm_physp_share_pkey check does. Without a PortLister the requester sees itself.
func (db *DB) visiblePorts(src Port, trusted bool) []Port {
	l, ok := db.fabric.(PortLister)
	if !ok {
		return []Port{src}
	}
	var out []Port
	for _, p := range l.Ports() {
		if trusted || p.GUID == src.GUID || sharePKey(src, p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Port) int { return int(a.LID) - int(b.LID) })
	return out
}

// smLID is the LID of the port the SM runs on, 0 if the fabric does not list it.
func (db *DB) smLID() verbs.LID {
	l, ok := db.fabric.(PortLister)
	if !ok {
		return 0
	}
	for _, p := range l.Ports() {
		if p.IsSM {
			return p.LID
		}
	}
	return 0
}
