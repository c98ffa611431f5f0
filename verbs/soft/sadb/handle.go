package sadb

import (
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// ClassPortInfo values OpenSM 3.3.23 (Debian 3.3.23-2) sends, observed on the wire.
const (
	// CapabilityMask: Get/Set(Notice), UD multicast, MultiPath (Debian builds with
	// dual-sided RMPP) and PortInfo CapabilityMask matching = 0x2602.
	CPICapabilityMask = mad.CapGetSetNoticeSupported | mad.CapSAUDMulticast | mad.CapSAMultiPath |
		mad.CapSAPortInfoCapMaskMatch
	// CapabilityMask2: MulticastFDBTop, AdditionalGUID (alias GUIDs), FullPortInfoRecord,
	// ExtendedSpeeds, MulticastServiceRecord, PortInfoCapMask2Match,
	// SendOnlyFullMemberSupport, LinkWidth2x and bit 15 (HDR link speed) = 0xb5e8.
	CPICapabilityMask2 = mad.CapMask2MulticastFDBTop | mad.CapMask2AdditionalGUID |
		mad.CapMask2FullPortInfoRecord | mad.CapMask2ExtendedSpeeds | mad.CapMask2MulticastServiceRecord |
		mad.CapMask2PortInfoCapMask2Match | mad.CapMask2SendOnlyFullMemberSupport | mad.CapMask2LinkWidth2x |
		capMask2LinkSpeedHDR
	// CPIRespTimeValue is 16: OpenSM derives it from its 200 ms transaction timeout
	// (4.096 µs · 2^16 ≈ 268 ms is the first step above it).
	CPIRespTimeValue = 16

	capMask2LinkSpeedHDR uint32 = 1 << 15 // OSM_CAP2_IS_LINK_SPEED_HDR_SUPPORTED
)

// Handle answers one SA request MAD (the raw bytes as received on QP1 from src; only
// the first 256 are used). It returns the 256-byte response, or nil when no response
// is to be sent: req is shorter than a MAD, not of the SA class, a response (R bit),
// or carries a non-zero SM_Key other than the DB's (OpenSM drops those).
//
// Supported: ClassPortInfo Get; MCMemberRecord Set (join/create), Delete (leave), Get
// and GetTable; PathRecord Get and GetTable; NodeRecord, PortInfoRecord and
// P_KeyTableRecord Get and GetTable (see nodes.go). A GetTable answer longer than one
// MAD is returned whole (header, then every record): the caller's QP1 sends it as a
// multi-segment RMPP transfer (mad.SplitRMPP). Bad base or class version gets status
// 0x0004, an unknown method 0x0008, an unsupported method/attribute combination
// 0x000c; error responses echo the request (header and data) like OpenSM's
// osm_sa_send_error.
//
// Known differences from OpenSM 3.3.23:
//   - OpenSM silently drops Set/Delete of ClassPortInfo and PathRecord, unknown
//     attributes and unknown methods; this DB answers 0x000c/0x0008 instead. It also
//     supports only the attributes above (OpenSM answers ServiceRecord, InformInfo,
//     LinkRecord and more), and knows channel adapters only (no switch records).
//   - OpenSM under umad2sim does not look at the class version at all (a class
//     version 1 request is processed); this DB answers 0x0004.
//   - PathRecords are computed from the two end ports only (no switch hops), and
//     without a PortLister an unspecified end is the requester rather than "every
//     port"; QoS policies, LMC > 0 and routers are not modelled.
//   - OpenSM's ib_member_rec_t declares proxy_join as a C bitfield, so its query
//     results carry ProxyJoin in bit 0 of byte 49 and it reads requests' ProxyJoin
//     from there; this DB uses bit 7 as IBA and the kernel do (package mad).
//   - Rates are ordered like OpenSM's ordered_rates (by data rate), which differs
//     from verbs.Rate.Mbps for the 12x SDR/DDR/QDR codes (30 < 25, 60 < 50,
//     120 < 100 Gb/s).
//
// OpenSM rules that may surprise (all checked live, see conformance_test.go): any
// port may join another one (a proxy join) if the two share a P_Key, whatever the
// request's ProxyJoin bit says; it is the joining port, not the requester, that must
// be in the group's partition; a limited member may create a group; SendOnlyFullMember
// may create a group and counts as a full member when OpenSM decides to delete a group
// whose last full member left (its remaining members are dropped, WellKnown groups
// stay); PathRecords carry TClass, FlowLabel and HopLimit 0 whatever was asked, the
// requested P_Key verbatim (or, without one, the source's entry for the first shared
// partition in OpenSM's map order), NumbPath 0 and PacketLifeTime 18 (0 on loopback);
// PathRecord Get returns the first path found instead of 0x0400.
func (db *DB) Handle(src Port, req []byte) []byte {
	if len(req) < mad.Size {
		return nil
	}
	var m mad.SAMAD
	if err := mad.ParseSA(req, &m); err != nil {
		return nil
	}
	if m.MgmtClass != mad.ClassSA || m.IsResponse() {
		return nil
	}
	if m.BaseVersion != mad.BaseVersion || m.ClassVersion != mad.SAClassVersion {
		return errorResp(&m, mad.StatusBadVersion)
	}
	if m.SA.SMKey != 0 && m.SA.SMKey != db.smKey.Load() {
		return nil // C15-0.1.5: OpenSM discards MADs with a wrong SM_Key
	}
	switch m.Method {
	case mad.MethodGet, mad.MethodSet, mad.MethodGetTable, mad.MethodDelete,
		mad.MethodGetMulti, mad.MethodGetTraceTable:
	default:
		return errorResp(&m, mad.StatusBadMethod)
	}
	switch m.AttrID {
	case mad.AttrClassPortInfo:
		return db.classPortInfo(&m)
	case mad.AttrMCMemberRecord:
		return db.mcMember(src, &m)
	case mad.AttrPathRecord:
		return db.pathRecord(src, &m)
	case mad.AttrNodeRecord, mad.AttrPortInfoRecord, mad.AttrPKeyTableRecord:
		return db.portRecords(src, &m)
	}
	return errorResp(&m, mad.StatusBadMethodAttr)
}

// respMethod is the response method as OpenSM builds it: Set is answered with
// GetResp, everything else with the R bit added.
func respMethod(m uint8) uint8 {
	if m == mad.MethodSet {
		return mad.MethodGetResp
	}
	return m | mad.MethodResp
}

// errorResp is osm_sa_send_error: the request echoed (header and data) with the
// response method, the status, SM_Key 0 and, for GetTable, AttributeOffset 0.
func errorResp(m *mad.SAMAD, st mad.Status) []byte {
	r := *m
	r.Method = respMethod(m.Method)
	r.Status = st
	r.SA.SMKey = 0
	if m.Method == mad.MethodGetTable {
		r.SA.AttrOffset = 0
	}
	return r.Bytes()
}

// okResp is the skeleton of a successful response: the request's common header with
// the response method, the request's component mask and AttributeOffset, SM_Key 0,
// no RMPP and an empty data area.
func okResp(m *mad.SAMAD) mad.SAMAD {
	r := mad.SAMAD{Header: m.Header, SA: mad.SAHeader{CompMask: m.SA.CompMask, AttrOffset: m.SA.AttrOffset}}
	r.Method = respMethod(m.Method)
	r.Status = mad.StatusOK
	return r
}

// respond is osm_sa_respond for records of size bytes: Get wants exactly one record
// (0x0300 without, 0x0400 with more); Set and Delete carry one; GetTable carries as
// many as fit, with AttributeOffset 0 when there are none.
func respond(m *mad.SAMAD, size int, recs [][]byte) []byte {
	if m.Method == mad.MethodGet {
		switch {
		case len(recs) == 0:
			return errorResp(m, mad.StatusSANoRecords)
		case len(recs) > 1:
			return errorResp(m, mad.StatusSATooManyRecords)
		}
	}
	r := okResp(m)
	if m.Method == mad.MethodGetTable && len(recs) > mad.SADataSize/(int(mad.AttrOffsetFor(size))*8) {
		// More than one MAD holds: the long answer, which QP1 sends as an RMPP
		// transfer (the agent cuts it into segments).
		return mad.LongTable(&r, size, recs)
	}
	n := r.SetTableRecords(size, recs)
	if n == 0 {
		r.SA.AttrOffset = 0
	}
	if m.Method == mad.MethodGetTable {
		r.SetSingleSegmentRMPP(n)
	}
	return r.Bytes()
}

func (db *DB) classPortInfo(m *mad.SAMAD) []byte {
	switch m.Method {
	case mad.MethodGet:
	case mad.MethodGetTable:
		return errorResp(m, mad.StatusSAReqInvalid) // OpenSM's ERR 1403
	default:
		return errorResp(m, mad.StatusBadMethodAttr)
	}
	cpi := ClassPortInfo()
	r := okResp(m)
	cpi.Marshal(r.Data[:])
	return r.Bytes()
}

// ClassPortInfo is the SA ClassPortInfo this DB answers, identical to OpenSM 3.3.23's.
func ClassPortInfo() mad.ClassPortInfo {
	return mad.ClassPortInfo{
		BaseVersion:     mad.BaseVersion,
		ClassVersion:    mad.SAClassVersion,
		CapabilityMask:  CPICapabilityMask,
		CapabilityMask2: CPICapabilityMask2,
		RespTimeValue:   CPIRespTimeValue,
		RedirectQP:      verbs.GSIQPN,
		RedirectQKey:    verbs.GSIQKey,
		TrapQKey:        verbs.GSIQKey,
	}
}
