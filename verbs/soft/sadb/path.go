package sadb

import (
	"cmp"
	"math/bits"
	"slices"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// PathRecord handling after OpenSM's osm_sa_path_record.c.

func pathRecord(r *mad.PathRecord) []byte {
	b := make([]byte, mad.PathRecordSize)
	r.Marshal(b)
	return b
}

func (db *DB) pathRecord(src Port, m *mad.SAMAD) []byte {
	if m.Method != mad.MethodGet && m.Method != mad.MethodGetTable {
		return errorResp(m, mad.StatusBadMethodAttr) // ERR 1F17
	}
	var pr mad.PathRecord
	_ = pr.Unmarshal(m.Data[:])
	mask := m.SA.CompMask
	if mask&mad.CompPRRateSelector != 0 && mask&mad.CompPRRate != 0 && !rateValid(pr.Rate) {
		return errorResp(m, mad.StatusSAReqInvalid)
	}
	if mask&mad.CompPRMTUSelector != 0 && mask&mad.CompPRMTU != 0 && !mtuValid(pr.MTU) {
		return errorResp(m, mad.StatusSAReqInvalid)
	}
	if sid := mask & mad.CompPRServiceID; sid != 0 && sid != mad.CompPRServiceID {
		return errorResp(m, mad.StatusSAInsufficientComponents)
	}
	if mask&mad.CompPRDGID != 0 && pr.DGID.IsMulticast() {
		return db.multicastPath(m, &pr)
	}
	recs, st := db.unicastPaths(src, m, &pr)
	if st != mad.StatusOK {
		return errorResp(m, st)
	}
	return respond(m, mad.PathRecordSize, recs)
}

// endPoint resolves one end (osm_pr_get_end_points): by GID (only GIDs of this subnet
// or link-local ones; the port is found by GUID) and/or by LID. fail is set when a
// given GID or LID matches no port: OpenSM then answers with no records.
type endPoint struct {
	byGID, byLID *Port
	fail         bool
}

func (db *DB) resolve(mask, gidBit, lidBit uint64, gid verbs.GID, lid verbs.LID, prefix uint64) endPoint {
	var e endPoint
	if mask&gidBit != 0 {
		if !linkLocal(gid) && gid.Prefix() != prefix {
			e.fail = true // off-subnet GID and no router
			return e
		}
		p, ok := db.fabric.PortByGID(verbs.MakeGID(prefix, gid.GUID()))
		if !ok {
			e.fail = true
			return e
		}
		e.byGID = &p
	}
	if mask&lidBit != 0 {
		p, ok := db.fabric.PortByLID(lid)
		if !ok {
			e.fail = true
			return e
		}
		e.byLID = &p
	}
	return e
}

// candidates are the ports one end may be: the resolved one, or every port.
func (e endPoint) candidates(all []Port) []Port {
	if e.byGID != nil {
		return []Port{*e.byGID}
	}
	if e.byLID != nil {
		return []Port{*e.byLID}
	}
	return all
}

// allPorts lists the fabric's ports in OpenSM's port-map order (byte-reversed GUID),
// or just the requester when the Fabric cannot list them.
func (db *DB) allPorts(src Port) []Port {
	l, ok := db.fabric.(PortLister)
	if !ok {
		return []Port{src}
	}
	ps := l.Ports()
	slices.SortStableFunc(ps, func(a, b Port) int {
		x, y := bits.ReverseBytes64(uint64(portGUID(a))), bits.ReverseBytes64(uint64(portGUID(b)))
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return ps
}

func (db *DB) unicastPaths(src Port, m *mad.SAMAD, pr *mad.PathRecord) ([][]byte, mad.Status) {
	mask := m.SA.CompMask
	prefix := subnetPrefix(src)
	se := db.resolve(mask, mad.CompPRSGID, mad.CompPRSLID, pr.SGID, pr.SLID, prefix)
	if se.fail {
		return nil, mad.StatusOK
	}
	de := db.resolve(mask, mad.CompPRDGID, mad.CompPRDLID, pr.DGID, pr.DLID, prefix)
	if de.fail {
		return nil, mad.StatusOK
	}
	if se.byGID != nil && se.byLID != nil && !samePort(*se.byGID, *se.byLID) {
		return nil, mad.StatusSAReqInvalid // SGID and SLID name different ports
	}
	if de.byGID != nil && de.byLID != nil && !samePort(*de.byGID, *de.byLID) {
		return nil, mad.StatusSAReqInvalid // DGID and DLID name different ports
	}
	var all []Port
	if (se.byGID == nil && se.byLID == nil) || (de.byGID == nil && de.byLID == nil) {
		all = db.allPorts(src)
	}
	srcs, dsts := se.candidates(all), de.candidates(all)
	sls := db.partitionSLs()

	// A table longer than an RMPP transfer can carry is refused before it is built:
	// a GetTable of every source and destination is quadratic in the ports.
	maxRecs := mad.MaxRMPPSegments * mad.SADataSize / (int(mad.AttrOffsetFor(mad.PathRecordSize)) * 8)
	var recs [][]byte
	for _, d := range dsts {
		for _, s := range srcs {
			if r, ok := pairPath(src, s, d, m, pr, sls); ok {
				if len(recs) == maxRecs {
					return nil, mad.StatusSATooManyRecords
				}
				recs = append(recs, pathRecord(&r))
				if m.Method == mad.MethodGet {
					return recs, mad.StatusOK
				}
			}
		}
	}
	return recs, mad.StatusOK
}

// partitionSLs maps partition numbers to the SL of their IPoIB broadcast group (the
// partition's sl= flag), which OpenSM puts in PathRecords that do not ask for an SL.
func (db *DB) partitionSLs() map[uint16]uint8 {
	db.mu.Lock()
	defer db.mu.Unlock()
	sls := map[uint16]uint8{}
	for _, g := range db.groups {
		r := &g.rec
		if g.wellKnown && r.MGID == broadcastMGID(r.MGID[1]&0x0f, [2]byte{r.MGID[4], r.MGID[5]}) {
			sls[r.PKey.Base()] = r.SL
		}
	}
	return sls
}

// selectValue applies a PathRecord selector to the path's value have for the
// requested req, as pr_rcv_get_path_parms does for MTU, rate and PacketLifeTime:
// greater than req; less than req (a path at or above req is given the value below
// req); exactly req (a path reaching req is given req; exactEqual, as for the rate,
// wants it equal); largest (have). ok is false when the path cannot satisfy it.
func selectValue[T any](sel uint8, have, req T, cmp func(a, b T) int, below func(T) (T, bool), exactEqual bool) (T, bool) {
	switch sel {
	case mad.SelGreater:
		if cmp(have, req) <= 0 {
			return have, false
		}
	case mad.SelLess:
		if cmp(have, req) >= 0 {
			return below(req)
		}
	case mad.SelExactly:
		if c := cmp(have, req); c < 0 || exactEqual && c != 0 {
			return have, false
		}
		return req, true
	}
	return have, true
}

// stepDown is the enum value below v (MTU and PacketLifeTime codes), none below 1.
func stepDown[T verbs.MTU | uint8](v T) (T, bool) { return v - 1, v > 1 }

// rateBelow is the rate code below r in bandwidth order.
func rateBelow(r verbs.Rate) (verbs.Rate, bool) {
	p := ratePrev(r)
	return p, p != 0
}

// pathParms is pr_rcv_get_path_parms for a path from s to d without switch hops.
type pathParms struct {
	mtu      verbs.MTU
	rate     verbs.Rate
	pktLife  uint8
	pkey     verbs.PKey
	sl       uint8
	loopback bool
}

func getPathParms(s, d Port, pr *mad.PathRecord, mask uint64, sls map[uint16]uint8) (pathParms, bool) {
	p := pathParms{mtu: min(s.MTU, d.MTU), rate: minRateOf(s.Rate, d.Rate), pktLife: DefaultPacketLife}
	if samePort(s, d) {
		p.loopback, p.pktLife = true, 0 // IBA table 205: loopback paths have PacketLifeTime 0
	}
	var ok bool
	if mask&mad.CompPRMTUSelector != 0 && mask&mad.CompPRMTU != 0 {
		if p.mtu, ok = selectValue(pr.MTUSelector, p.mtu, pr.MTU, cmp.Compare[verbs.MTU], stepDown[verbs.MTU], false); !ok {
			return p, false
		}
	}
	if mask&mad.CompPRRateSelector != 0 && mask&mad.CompPRRate != 0 {
		if p.rate, ok = selectValue(pr.RateSelector, p.rate, pr.Rate, compareRates, rateBelow, true); !ok {
			return p, false
		}
	}
	if mask&mad.CompPRPacketLifeTimeSelector != 0 && mask&mad.CompPRPacketLifeTime != 0 {
		if p.pktLife, ok = selectValue(pr.PacketLifeTimeSelector, p.pktLife, pr.PacketLifeTime, cmp.Compare[uint8], stepDown[uint8], false); !ok {
			return p, false
		}
	}
	raw := mask&mad.CompPRRawTraffic != 0 && pr.RawTraffic
	switch {
	case raw:
		p.pkey = commonPKey(s, d)
	case mask&mad.CompPRPKey != 0:
		p.pkey = pr.PKey // the answer carries the requested P_Key as is
		if !shareThisPKey(s, d, p.pkey) {
			return p, false // ERR 1F1A
		}
	default:
		if p.pkey = commonPKey(s, d); p.pkey == 0 {
			return p, false // ERR 1F1B
		}
	}
	switch {
	case mask&mad.CompPRSL != 0:
		p.sl = pr.SL
	case p.pkey != 0:
		p.sl = sls[p.pkey.Base()]
	}
	if raw {
		p.pkey = 0
	}
	return p, true
}

// pairPath is pr_rcv_get_port_pair_paths + pr_rcv_get_lid_pair_path + pr_rcv_build_pr
// for LMC 0 (one LID per port, so at most one path per pair).
func pairPath(req, s, d Port, m *mad.SAMAD, pr *mad.PathRecord, sls map[uint16]uint8) (mad.PathRecord, bool) {
	mask := m.SA.CompMask
	// requester, source and destination must all share a P_Key
	if !sharePKey(req, s) || !sharePKey(req, d) || !sharePKey(s, d) {
		return mad.PathRecord{}, false
	}
	if s.LID == 0 || d.LID == 0 {
		return mad.PathRecord{}, false
	}
	if m.Method != mad.MethodGet && mask&mad.CompPRNumbPath != 0 && pr.NumbPath == 0 {
		return mad.PathRecord{}, false // zero paths asked for
	}
	p, ok := getPathParms(s, d, pr, mask, sls)
	if !ok {
		return mad.PathRecord{}, false
	}
	_, reversible := getPathParms(d, s, pr, mask, sls)
	if mask&mad.CompPRReversible != 0 && pr.Reversible && !reversible {
		return mad.PathRecord{}, false
	}
	out := mad.PathRecord{
		DGID: d.GID, SGID: s.GID, DLID: d.LID, SLID: s.LID,
		Reversible: reversible, // NumbPath is always 0 in OpenSM's answers
		PKey:       p.pkey, SL: p.sl,
		MTUSelector: mad.SelExactly, MTU: p.mtu,
		RateSelector: mad.SelExactly, Rate: p.rate,
		PacketLifeTimeSelector: mad.SelExactly, PacketLifeTime: p.pktLife,
	}
	if mask&mad.CompPRSGID != 0 {
		out.SGID = pr.SGID // a given SGID is echoed as is
	}
	if p.loopback {
		out.PacketLifeTime = 0
	}
	return out, true
}

// multicastPath is pr_process_multicast: a PathRecord to a multicast group.
func (db *DB) multicastPath(m *mad.SAMAD, pr *mad.PathRecord) []byte {
	mask := m.SA.CompMask
	var slidPort *Port
	if mask&mad.CompPRSLID != 0 {
		if p, ok := db.fabric.PortByLID(pr.SLID); ok {
			slidPort = &p
		}
	}
	db.mu.Lock()
	g := db.groups[pr.DGID]
	var gr mad.MCMemberRecord
	ok := g != nil
	if ok {
		gr = g.rec
		if mask&mad.CompPRSGID != 0 {
			mem, _ := g.member(pr.SGID.GUID())
			ok = mem != nil
		}
		if ok && mask&mad.CompPRSLID != 0 {
			ok = slidPort != nil
			if ok {
				mem, _ := g.member(portGUID(*slidPort))
				ok = mem != nil
			}
		}
	}
	db.mu.Unlock()
	if !ok ||
		mask&mad.CompPRDLID != 0 && pr.DLID != gr.MLID ||
		mask&mad.CompPRPKey != 0 && pr.PKey != gr.PKey ||
		mask&mad.CompPRSL != 0 && pr.SL != gr.SL ||
		mask&mad.CompPRNumbPath != 0 && m.Method != mad.MethodGet && pr.NumbPath == 0 ||
		mask&mad.CompPRFlowLabel != 0 && pr.FlowLabel != gr.FlowLabel ||
		mask&mad.CompPRHopLimit != 0 && pr.HopLimit != gr.HopLimit ||
		mask&mad.CompPRTClass != 0 && pr.TClass != gr.TClass {
		return respond(m, mad.PathRecordSize, nil)
	}
	out := *pr
	out.DGID, out.DLID, out.TClass = gr.MGID, gr.MLID, gr.TClass
	out.Reversible, out.NumbPath = false, 1
	out.PKey = gr.PKey
	out.MTUSelector, out.MTU = mad.SelExactly, gr.MTU
	out.RateSelector, out.Rate = mad.SelExactly, gr.Rate
	out.PacketLifeTimeSelector, out.PacketLifeTime = mad.SelExactly, gr.PacketLifeTime
	out.SL, out.QoSClass = gr.SL, 0
	out.RawTraffic = false
	out.FlowLabel, out.HopLimit = gr.FlowLabel, gr.HopLimit
	if gr.MGID[1]&0x0f != mad.ScopeLinkLocal {
		out.HopLimit = 0xff // IB_HOPLIMIT_MAX outside link-local scope
	}
	return respond(m, mad.PathRecordSize, [][]byte{pathRecord(&out)})
}
