package sadb

import (
	"cmp"
	"encoding/binary"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// MCMemberRecord handling after OpenSM's osm_sa_mcmember_record.c.

const (
	// joinMask is what every Set/Delete needs (else 0x0600).
	joinMask = mad.CompMCMGID | mad.CompMCPortGID | mad.CompMCJoinState
	// createMask is what an implicit create needs (else 0x0600).
	createMask = joinMask | mad.CompMCQKey | mad.CompMCTClass | mad.CompMCPKey |
		mad.CompMCFlowLabel | mad.CompMCSL
)

func mcRecord(r *mad.MCMemberRecord) []byte {
	b := make([]byte, mad.MCMemberRecordSize)
	r.Marshal(b)
	return b
}

// ratesValid checks the Rate and MTU values when both selector and value are masked
// in (rate_is_valid / mtu_is_valid).
func mcValuesValid(mask uint64, r *mad.MCMemberRecord) bool {
	if mask&mad.CompMCRateSelector != 0 && mask&mad.CompMCRate != 0 && !rateValid(r.Rate) {
		return false
	}
	if mask&mad.CompMCMTUSelector != 0 && mask&mad.CompMCMTU != 0 && !mtuValid(r.MTU) {
		return false
	}
	return true
}

func (db *DB) mcMember(src Port, m *mad.SAMAD) []byte {
	var rec mad.MCMemberRecord
	_ = rec.Unmarshal(m.Data[:])
	mask := m.SA.CompMask
	switch m.Method {
	case mad.MethodSet, mad.MethodDelete:
		if mask&joinMask != joinMask {
			return errorResp(m, mad.StatusSAInsufficientComponents) // ERR 1B18 / 1B20
		}
	case mad.MethodGet, mad.MethodGetTable:
	default:
		return errorResp(m, mad.StatusBadMethodAttr) // ERR 1B21
	}
	if !mcValuesValid(mask, &rec) {
		return errorResp(m, mad.StatusSAReqInvalid)
	}
	switch m.Method {
	case mad.MethodSet:
		return db.join(src, m, &rec)
	case mad.MethodDelete:
		return db.leave(src, m, &rec)
	}
	return db.query(src, m, &rec)
}

// validateOther is validate_other_comp_fields: the masked Q_Key, P_Key (same
// partition, not both limited), TClass, SL, FlowLabel and HopLimit must match.
func validateOther(mask uint64, r *mad.MCMemberRecord, g *mad.MCMemberRecord) bool {
	if mask&mad.CompMCQKey != 0 && r.QKey != g.QKey {
		return false // ERR 1B30
	}
	if mask&mad.CompMCPKey != 0 {
		if !r.PKey.Full() && !g.PKey.Full() {
			return false // ERR 1B31
		}
		if r.PKey.Base() != g.PKey.Base() {
			return false // ERR 1B32
		}
	}
	if mask&mad.CompMCTClass != 0 && r.TClass != g.TClass {
		return false
	}
	if mask&mad.CompMCSL != 0 && r.SL != g.SL {
		return false
	}
	if mask&mad.CompMCFlowLabel != 0 && r.FlowLabel != g.FlowLabel {
		return false
	}
	if mask&mad.CompMCHopLimit != 0 && r.HopLimit != g.HopLimit {
		return false
	}
	return true
}

// validateMore is validate_more_comp_fields: the MTU and Rate selectors (looked at
// whenever the selector bit is masked in) must be satisfied by the group's values.
func validateMore(mask uint64, r *mad.MCMemberRecord, g *mad.MCMemberRecord) bool {
	if mask&mad.CompMCMTUSelector != 0 && !matches(r.MTUSelector, cmp.Compare(g.MTU, r.MTU)) {
		return false
	}
	return mask&mad.CompMCRateSelector == 0 || matches(r.RateSelector, compareRates(g.Rate, r.Rate))
}

// matches reports whether a group's value, compared with the requested one (c < 0
// below, 0 equal, > 0 above), satisfies the request's selector (largest: always).
func matches(sel uint8, c int) bool {
	switch sel {
	case mad.SelGreater:
		return c > 0
	case mad.SelLess:
		return c < 0
	case mad.SelExactly:
		return c == 0
	}
	return true
}

// portCaps is validate_port_caps: the joining port's MTU and rate must reach the
// group's (OpenSM ERR 1B12 otherwise).
func portCaps(g *mad.MCMemberRecord, p Port) bool {
	return p.MTU >= g.MTU && compareRates(p.Rate, g.Rate) >= 0
}

// realizable is mgrp_request_is_realizable: it fixes the MTU and Rate of a group being
// created from the request's selectors and the creating port's capabilities.
func realizable(mask uint64, r *mad.MCMemberRecord, p Port) bool {
	portMTU := p.MTU
	if mask&mad.CompMCMTU == 0 || mask&mad.CompMCMTUSelector == 0 || r.MTUSelector == mad.SelLargest {
		r.MTU = portMTU
		if r.MTU == 0 {
			r.MTU = DefaultGroupMTU
		}
	} else {
		req := r.MTU
		mtu := req
		switch r.MTUSelector {
		case mad.SelGreater:
			if portMTU != 0 && req >= portMTU {
				return false
			}
			if portMTU != 0 {
				mtu = portMTU
			} else {
				mtu++
			}
		case mad.SelLess:
			if portMTU != 0 && req > portMTU {
				mtu = portMTU
			} else {
				mtu--
			}
		}
		if !mtuValid(mtu) {
			return false
		}
		r.MTU = mtu
	}
	portRate := p.Rate
	if mask&mad.CompMCRate == 0 || mask&mad.CompMCRateSelector == 0 || r.RateSelector == mad.SelLargest {
		r.Rate = portRate
		if r.Rate == 0 {
			r.Rate = DefaultGroupRate
		}
	} else {
		req := r.Rate
		rate := req
		switch r.RateSelector {
		case mad.SelGreater:
			if compareRates(req, portRate) >= 0 {
				return false
			}
			if portRate != 0 {
				rate = portRate
			} else {
				rate = rateNext(req)
			}
		case mad.SelLess:
			if compareRates(req, portRate) > 0 {
				rate = portRate
			} else {
				rate = ratePrev(req)
			}
		}
		if !rateValid(rate) {
			return false
		}
		r.Rate = rate
	}
	return true
}

// validateRequestedMGID is validate_requested_mgid plus the IPoIB check of
// mcmr_rcv_create_new_mgrp (ipoib_mcgroup_creation_validation, on by default): an
// IPoIB MGID other than a broadcast MGID needs the broadcast group of its scope and
// P_Key, and the masked Q_Key/P_Key/TClass/SL/FlowLabel/HopLimit must match it.
func (db *DB) validateRequestedMGID(mask uint64, r *mad.MCMemberRecord) bool {
	mgid := r.MGID
	if mgid[0] != 0xff {
		return false // ERR 1B01
	}
	sig := binary.BigEndian.Uint16(mgid[2:])
	if sig == 0x401b || sig == 0x601b {
		bc := broadcastMGID(mgid[1]&0x0f, [2]byte{mgid[4], mgid[5]})
		if sig != 0x401b || mgid != bc {
			bg := db.groups[bc]
			if bg == nil {
				return false // ERR 1B1B
			}
			if !validateOther(mask, r, &bg.rec) {
				return false // ERR 1B1C
			}
		}
		return true
	}
	if mgid[1]&0xe0 != 0 {
		return false // ERR 1B28: reserved flag bits
	}
	if sig == 0xa01b && mgid[1]&0x0f == mad.ScopeLinkLocal {
		return false // ERR 1B24: SA signature with link-local scope
	}
	return true
}

// buildMGID is build_new_mgid: ff1<scope>:a01b, the first six bytes of the subnet
// prefix, then OpenSM's counter in little-endian byte order and two zero bytes.
func (db *DB) buildMGID(mask uint64, r *mad.MCMemberRecord, prefix uint64) bool {
	scope := uint8(mad.ScopeLinkLocal)
	if mask&mad.CompMCScope != 0 {
		scope = r.Scope
	}
	var g verbs.GID
	g[0], g[1], g[2], g[3] = 0xff, 0x10|scope&0x0f, 0xa0, 0x1b
	binary.BigEndian.PutUint64(g[4:12], prefix)
	for range 1000 {
		binary.LittleEndian.PutUint32(g[10:14], db.mgidSeq)
		db.mgidSeq++
		if db.groups[g] == nil {
			r.MGID = g
			return true
		}
	}
	return false
}

// createGroup is mcmr_rcv_create_new_mgrp. The new group's record is the request's
// record (including fields outside the component mask, as OpenSM copies it whole) with
// the MGID assigned if it was zero, MTU and Rate fixed by realizable, a fresh MLID and
// selectors 2.
func (db *DB) createGroup(mask uint64, req *mad.MCMemberRecord, p Port, prefix uint64) (*group, mad.Status) {
	r := *req
	if r.MGID.IsZero() {
		if !db.buildMGID(mask, &r, prefix) {
			return nil, mad.StatusSANoResources // ERR 1B23
		}
	} else if !db.validateRequestedMGID(mask, req) {
		return nil, mad.StatusSAReqInvalid // ERR 1B22
	}
	if !realizable(mask, &r, p) {
		return nil, mad.StatusSAReqInvalid // ERR 1B26
	}
	mlid := db.newMLID(r.MLID)
	if mlid == 0 {
		return nil, mad.StatusSANoResources // ERR 1B19
	}
	r.MLID = mlid
	r.MTUSelector, r.RateSelector, r.PacketLifeTimeSelector = mad.SelExactly, mad.SelExactly, mad.SelExactly
	g := &group{rec: r}
	db.insert(g)
	return g, mad.StatusOK
}

// validateModify is validate_modify (o15-0.2.1): a membership joined by the port itself
// may only be modified by that port; a proxy-joined one by any port of its partition.
func validateModify(g *group, src Port, portGID verbs.GID) bool {
	m, _ := g.member(portGID.GUID())
	if m == nil {
		return true
	}
	if !m.proxy {
		return portGUID(src) == m.gid.GUID() && subnetPrefix(src) == m.gid.Prefix()
	}
	return hasPKey(src, g.rec.PKey)
}

// join is mcmr_rcv_join_mgrp.
func (db *DB) join(src Port, m *mad.SAMAD, rec *mad.MCMemberRecord) []byte {
	mask := m.SA.CompMask
	prefix := subnetPrefix(src)
	if rec.PortGID.Prefix() != prefix {
		return errorResp(m, mad.StatusSAInvalidGID)
	}
	port, ok := db.fabric.PortByGID(rec.PortGID) // before locking: Fabric may lock
	if !ok {
		return errorResp(m, mad.StatusSAReqInvalid) // unknown port GUID
	}
	proxy := !samePort(port, src)
	if proxy && !sharePKey(port, src) {
		return errorResp(m, mad.StatusSAReqInvalid) // port and requester share no P_Key
	}
	if mask&mad.CompMCPKey != 0 && !rec.PKey.Valid() {
		return errorResp(m, mad.StatusSAReqInvalid) // invalid P_Key supplied
	}
	js := rec.JoinState

	db.mu.Lock()
	defer db.mu.Unlock()
	g := db.groups[rec.MGID]
	isNew := false
	if g == nil {
		if js&fullish == 0 {
			return errorResp(m, mad.StatusSAReqInvalid) // ERR 1B10
		}
		if mask&createMask != createMask {
			return errorResp(m, mad.StatusSAInsufficientComponents) // ERR 1B11
		}
		var st mad.Status
		if g, st = db.createGroup(mask, rec, port, prefix); st != mad.StatusOK {
			return errorResp(m, st)
		}
		isNew = true
	} else if !validateOther(mask, rec, &g.rec) {
		return errorResp(m, mad.StatusSAReqInvalid) // ERR 1B1A
	}
	if !validateMore(mask, rec, &g.rec) || !portCaps(&g.rec, port) || js == 0 {
		if isNew {
			db.remove(g)
		}
		return errorResp(m, mad.StatusSAReqInvalid) // ERR 1B12
	}
	if !hasPKey(port, g.rec.PKey) {
		if isNew {
			db.remove(g)
		}
		return errorResp(m, mad.StatusSAReqInvalid) // ERR 1B14: port not in the group's partition
	}
	if !isNew && !validateModify(g, src, rec.PortGID) {
		return errorResp(m, mad.StatusSAReqInvalid) // ERR 1B13
	}
	mem, changed := g.addMember(rec.PortGID, js, proxy)
	if changed || isNew {
		db.version++
	}

	// The answer is the request's record with the group's parameters
	// (copy_from_create_mc_rec) and the member's merged JoinState.
	resp := *rec
	gr := &g.rec
	resp.MGID = gr.MGID
	resp.QKey, resp.MLID, resp.TClass, resp.PKey = gr.QKey, gr.MLID, gr.TClass, gr.PKey
	resp.SL, resp.FlowLabel, resp.HopLimit = gr.SL, gr.FlowLabel, gr.HopLimit
	resp.Scope, resp.JoinState = gr.Scope, mem.state
	resp.MTUSelector, resp.MTU = mad.SelExactly, gr.MTU
	resp.RateSelector, resp.Rate = mad.SelExactly, gr.Rate
	resp.PacketLifeTimeSelector, resp.PacketLifeTime = mad.SelExactly, gr.PacketLifeTime
	return respond(m, mad.MCMemberRecordSize, [][]byte{mcRecord(&resp)})
}

// leave is mcmr_rcv_leave_mgrp.
func (db *DB) leave(src Port, m *mad.SAMAD, rec *mad.MCMemberRecord) []byte {
	if rec.PortGID.Prefix() != subnetPrefix(src) {
		return errorResp(m, mad.StatusSAInvalidGID)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	g := db.groups[rec.MGID]
	if g == nil {
		return errorResp(m, mad.StatusSAReqInvalid)
	}
	// validate_delete (o15-0.1.14): a member, holding every bit to remove, and allowed
	// to modify it.
	mem, i := g.member(rec.PortGID.GUID())
	js := rec.JoinState
	if mem == nil || js&mem.state == 0 || js&^mem.state != 0 || !validateModify(g, src, rec.PortGID) {
		return errorResp(m, mad.StatusSAReqInvalid) // ERR 1B25
	}
	left := db.dropBits(g, mem, i, js)
	db.version++

	// The answer is the request's record with the MTU, Rate and PacketLifeTime
	// selectors set to 2 and the member's remaining JoinState under the group's scope.
	resp := *rec
	resp.MTUSelector, resp.RateSelector, resp.PacketLifeTimeSelector = mad.SelExactly, mad.SelExactly, mad.SelExactly
	resp.Scope, resp.JoinState = g.rec.Scope, left
	return respond(m, mad.MCMemberRecordSize, [][]byte{mcRecord(&resp)})
}

// query is mcmr_query_mgrp / mcmr_by_comp_mask.
func (db *DB) query(src Port, m *mad.SAMAD, rec *mad.MCMemberRecord) []byte {
	mask := m.SA.CompMask
	trusted := m.SA.SMKey != 0 // a wrong non-zero SM_Key never gets here
	var ssMask uint8
	if mask&mad.CompMCScope != 0 {
		ssMask |= 0xf0
	}
	if mask&mad.CompMCJoinState != 0 {
		ssMask |= 0x0f
	}
	reqSS := rec.Scope<<4 | rec.JoinState&0x0f

	db.mu.Lock()
	var out []mad.MCMemberRecord
	for _, g := range db.sorted() {
		gr := &g.rec
		if mask&mad.CompMCMGID != 0 && rec.MGID != gr.MGID {
			continue
		}
		if mask&mad.CompMCMLID != 0 && rec.MLID != gr.MLID {
			continue
		}
		if !hasPKey(src, gr.PKey) {
			continue // the requester does not see groups outside its partitions
		}
		if !validateOther(mask, rec, gr) {
			continue
		}
		if mask&mad.CompMCProxyJoin != 0 && rec.ProxyJoin != gr.ProxyJoin {
			continue
		}
		if !validateMore(mask, rec, gr) {
			continue
		}
		scope := gr.Scope
		if trusted && mask&mad.CompMCPortGID == 0 {
			// one record per member
			for _, mem := range g.members {
				if ssMask&reqSS != ssMask&(scope<<4|mem.state) {
					continue
				}
				r := *gr
				r.JoinState, r.PortGID, r.ProxyJoin = mem.state, mem.gid, mem.proxy
				out = append(out, r)
			}
			continue
		}
		r := *gr
		if mask&mad.CompMCPortGID != 0 {
			mem, _ := g.member(rec.PortGID.GUID())
			if mem == nil {
				continue
			}
			r.JoinState, r.PortGID, r.ProxyJoin = mem.state, mem.gid, mem.proxy
		}
		if ssMask&reqSS != ssMask&(scope<<4|r.JoinState) {
			continue
		}
		out = append(out, r)
	}
	db.mu.Unlock()

	recs := make([][]byte, len(out))
	for i := range out {
		if !trusted {
			// p923: PortGID, JoinState and ProxyJoin are zero for untrusted requests
			out[i].PortGID, out[i].JoinState, out[i].ProxyJoin = verbs.GID{}, 0, false
		}
		recs[i] = mcRecord(&out[i])
	}
	return respond(m, mad.MCMemberRecordSize, recs)
}
