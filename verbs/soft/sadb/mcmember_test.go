package sadb

import (
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

type step struct {
	src Port
	req mad.SAMAD
}

type mcCase struct {
	name   string
	setup  []step // each must succeed
	src    Port
	req    mad.SAMAD
	status mad.Status
	want   []mad.MCMemberRecord // compared when non-nil (an empty slice means "no records")
	check  func(t *testing.T, db *DB)
}

func runMC(t *testing.T, cases []mcCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := newTestDB(t)
			for _, s := range c.setup {
				mustOK(t, db, s.src, s.req)
			}
			m := send(t, db, c.src, c.req)
			if m.Status != c.status {
				t.Fatalf("status %v, want %v", m.Status, c.status)
			}
			if c.status != mad.StatusOK {
				// osm_sa_send_error echoes the request's data
				if m.Data != c.req.Data {
					t.Errorf("error response does not echo the request data")
				}
			}
			if c.want != nil {
				got := mcRecs(t, m)
				if got == nil {
					got = []mad.MCMemberRecord{}
				}
				diff(t, "records", c.want, got)
			}
			if c.check != nil {
				c.check(t, db)
			}
		})
	}
}

func memberOf(t *testing.T, db *DB, mgid verbs.GID) []Member {
	t.Helper()
	g, ok := db.Group(mgid)
	if !ok {
		t.Fatalf("group %v does not exist", mgid)
	}
	return g.Members
}

func noGroup(mgid verbs.GID) func(*testing.T, *DB) {
	return func(t *testing.T, db *DB) {
		t.Helper()
		if g, ok := db.Group(mgid); ok {
			t.Errorf("group %v still exists: %+v", mgid, g)
		}
	}
}

func members(mgid verbs.GID, want ...Member) func(*testing.T, *DB) {
	return func(t *testing.T, db *DB) {
		t.Helper()
		got := memberOf(t, db, mgid)
		if got == nil {
			got = []Member{}
		}
		if want == nil {
			want = []Member{}
		}
		diff(t, "members", want, got)
	}
}

func TestJoinExisting(t *testing.T) {
	J := mad.IPoIBBroadcastJoinMask
	bj := func(port verbs.GID, pk verbs.PKey, js uint8) mad.SAMAD { return joinReq(mgidBcast, port, pk, js) }
	withMask := func(m mad.SAMAD, extra uint64, f func(*mad.MCMemberRecord)) mad.SAMAD {
		var r mad.MCMemberRecord
		_ = r.Unmarshal(m.Data[:])
		f(&r)
		r.Marshal(m.Data[:])
		m.SA.CompMask |= extra
		return m
	}
	rec := func(js uint8) []mad.MCMemberRecord { return []mad.MCMemberRecord{bcastRec(portB.GID, js)} }
	cases := []mcCase{
		{name: "broadcast join", src: portB, req: bj(portB.GID, 0xffff, 1), want: rec(1),
			check: members(mgidBcast, Member{GID: portB.GID, JoinState: 1})},
		{name: "JoinState merges", setup: []step{{portB, bj(portB.GID, 0xffff, 1)}},
			src: portB, req: bj(portB.GID, 0xffff, 2), want: rec(3),
			check: members(mgidBcast, Member{GID: portB.GID, JoinState: 3})},
		{name: "JoinState 0", src: portB, req: bj(portB.GID, 0xffff, 0), status: mad.StatusSAReqInvalid},
		{name: "no JoinState in mask", src: portB, req: mcReq(mad.MethodSet, J&^mad.CompMCJoinState,
			mad.MCMemberRecord{MGID: mgidBcast, PortGID: portB.GID, PKey: 0xffff, JoinState: 1}),
			status: mad.StatusSAInsufficientComponents},
		{name: "no PortGID in mask", src: portB, req: mcReq(mad.MethodSet, J&^mad.CompMCPortGID,
			mad.MCMemberRecord{MGID: mgidBcast, PortGID: portB.GID, PKey: 0xffff, JoinState: 1}),
			status: mad.StatusSAInsufficientComponents},
		{name: "no MGID in mask", src: portB, req: mcReq(mad.MethodSet, J&^mad.CompMCMGID,
			mad.MCMemberRecord{MGID: mgidBcast, PortGID: portB.GID, PKey: 0xffff, JoinState: 1}),
			status: mad.StatusSAInsufficientComponents},
		{name: "PortGID of another subnet", src: portB, req: bj(gid("fe81::10:3"), 0xffff, 1), status: mad.StatusSAInvalidGID},
		{name: "unknown PortGID", src: portB, req: bj(gid("fe80::10:99"), 0xffff, 1), status: mad.StatusSAReqInvalid},
		{name: "P_Key 0", src: portB, req: bj(portB.GID, 0, 1), status: mad.StatusSAReqInvalid},
		{name: "P_Key 0x8000", src: portB, req: bj(portB.GID, 0x8000, 1), status: mad.StatusSAReqInvalid},
		{name: "limited P_Key of the group's partition", src: portB, req: bj(portB.GID, 0x7fff, 1), want: rec(1)},
		{name: "P_Key of another partition", src: portB, req: bj(portB.GID, 0x8001, 1), status: mad.StatusSAReqInvalid},
		{name: "Q_Key mismatch", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCQKey,
			func(r *mad.MCMemberRecord) { r.QKey = verbs.GSIQKey }), status: mad.StatusSAReqInvalid},
		{name: "Q_Key match", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCQKey,
			func(r *mad.MCMemberRecord) { r.QKey = verbs.IPoIBQKey }), want: rec(1)},
		{name: "SL mismatch", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCSL,
			func(r *mad.MCMemberRecord) { r.SL = 1 }), status: mad.StatusSAReqInvalid},
		{name: "TClass mismatch", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCTClass,
			func(r *mad.MCMemberRecord) { r.TClass = 1 }), status: mad.StatusSAReqInvalid},
		{name: "FlowLabel mismatch", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCFlowLabel,
			func(r *mad.MCMemberRecord) { r.FlowLabel = 1 }), status: mad.StatusSAReqInvalid},
		{name: "HopLimit mismatch", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCHopLimit,
			func(r *mad.MCMemberRecord) { r.HopLimit = 1 }), status: mad.StatusSAReqInvalid},
		{name: "Scope mismatch is ignored", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCScope,
			func(r *mad.MCMemberRecord) { r.Scope = 5 }), want: rec(1)},
		{name: "MLID mismatch is ignored", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCMLID,
			func(r *mad.MCMemberRecord) { r.MLID = 0xc00f }), want: rec(1)},
		{name: "ProxyJoin bit is echoed", src: portB, req: withMask(bj(portB.GID, 0xffff, 1), mad.CompMCProxyJoin,
			func(r *mad.MCMemberRecord) { r.ProxyJoin = true }),
			want:  []mad.MCMemberRecord{func() mad.MCMemberRecord { r := bcastRec(portB.GID, 1); r.ProxyJoin = true; return r }()},
			check: members(mgidBcast, Member{GID: portB.GID, JoinState: 1})},
	}
	sel := func(name string, extra uint64, f func(*mad.MCMemberRecord), st mad.Status) mcCase {
		c := mcCase{name: name, src: portB, req: withMask(bj(portB.GID, 0xffff, 1), extra, f), status: st}
		if st == mad.StatusOK {
			c.want = rec(1)
		}
		return c
	}
	mtu := mad.CompMCMTUSelector | mad.CompMCMTU
	rate := mad.CompMCRateSelector | mad.CompMCRate
	cases = append(cases,
		sel("MTU exactly 4096", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 2, 5 }, mad.StatusSAReqInvalid),
		sel("MTU exactly 2048", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 2, 4 }, mad.StatusOK),
		sel("MTU greater than 1024", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 0, 3 }, mad.StatusOK),
		sel("MTU greater than 2048", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 0, 4 }, mad.StatusSAReqInvalid),
		sel("MTU less than 2048", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 1, 4 }, mad.StatusSAReqInvalid),
		sel("MTU less than 4096", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 1, 5 }, mad.StatusOK),
		sel("MTU largest", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 3, 1 }, mad.StatusOK),
		sel("MTU selector without MTU bit still checked", mad.CompMCMTUSelector,
			func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 2, 5 }, mad.StatusSAReqInvalid),
		sel("MTU without selector bit ignored", mad.CompMCMTU,
			func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 2, 5 }, mad.StatusOK),
		sel("invalid MTU 7", mtu, func(r *mad.MCMemberRecord) { r.MTUSelector, r.MTU = 3, 7 }, mad.StatusSAReqInvalid),
		sel("rate exactly 40", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 2, 7 }, mad.StatusSAReqInvalid),
		sel("rate exactly 10", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 2, 3 }, mad.StatusOK),
		// code 5 (5 Gb/s) is larger than code 3 (10 Gb/s): compared by bandwidth
		sel("rate greater than 5 Gb/s", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 0, 5 }, mad.StatusOK),
		sel("rate less than 5 Gb/s", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 1, 5 }, mad.StatusSAReqInvalid),
		sel("rate less than 14 Gb/s", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 1, 11 }, mad.StatusOK),
		sel("invalid rate 0", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 2, 0 }, mad.StatusSAReqInvalid),
		sel("invalid rate 23", rate, func(r *mad.MCMemberRecord) { r.RateSelector, r.Rate = 1, 23 }, mad.StatusSAReqInvalid),
		sel("PacketLifeTime selector ignored", mad.CompMCPacketLifeTime|mad.CompMCPacketLifeTimeSelector,
			func(r *mad.MCMemberRecord) { r.PacketLifeTimeSelector, r.PacketLifeTime = 2, 3 }, mad.StatusOK),
	)
	runMC(t, cases)
}

func TestJoinPortCapsAndPartitions(t *testing.T) {
	rec4K := func(port verbs.GID) mad.MCMemberRecord {
		return mad.MCMemberRecord{MGID: mgid4K, PortGID: port, QKey: 0x4444, MLID: 0xc003, MTUSelector: 2, MTU: verbs.MTU4096,
			PKey: 0xffff, RateSelector: 2, Rate: 7, PacketLifeTimeSelector: 2, PacketLifeTime: 18, Scope: 2, JoinState: 1}
	}
	cases := []mcCase{
		{name: "2048-MTU port cannot join a 4096 group", src: portB, req: joinReq(mgid4K, portB.GID, 0xffff, 1), status: mad.StatusSAReqInvalid},
		{name: "4096-MTU 40G port joins the 4096 group", src: portC, req: joinReq(mgid4K, portC.GID, 0xffff, 1),
			want: []mad.MCMemberRecord{rec4K(portC.GID)}},
		{name: "5G port cannot join a 40G group", src: portD, req: joinReq(mgid4K, portD.GID, 0x7fff, 1), status: mad.StatusSAReqInvalid},
		// by code 3 < 5 would fail; by bandwidth 10 Gb/s >= 5 Gb/s
		{name: "10G port joins a 5G group", src: portB, req: joinReq(mgidSlow, portB.GID, 0xffff, 1)},
		// by code 7 < 11 would fail; by bandwidth 40 >= 14
		{name: "40G port joins a 14G group", src: portC, req: joinReq(mgid14G, portC.GID, 0xffff, 1)},
		{name: "10G port cannot join a 14G group", src: portB, req: joinReq(mgid14G, portB.GID, 0xffff, 1), status: mad.StatusSAReqInvalid},
		{name: "limited member joins the default broadcast group", src: portE, req: joinReq(mgidBcast, portE.GID, 0x7fff, 2),
			want: []mad.MCMemberRecord{bcastRec(portE.GID, 2)}},
		{name: "5G port cannot join a 10G group", src: portD, req: joinReq(mgidBcast, portD.GID, 0x7fff, 2), status: mad.StatusSAReqInvalid},
		{name: "port outside the group's partition", src: portD, req: joinReq(mgidBc8001, portD.GID, 0x8001, 1), status: mad.StatusSAReqInvalid},
		{name: "limited member of 0x8002 joins its broadcast group", src: portC, req: joinReq(mgidBc8002, portC.GID, 0x0002, 1),
			check: members(mgidBc8002, Member{GID: portC.GID, JoinState: 1})},
		{name: "proxy join", src: portB, req: joinReq(mgidBcast, portC.GID, 0xffff, 1),
			want:  []mad.MCMemberRecord{bcastRec(portC.GID, 1)},
			check: members(mgidBcast, Member{GID: portC.GID, JoinState: 1, ProxyJoin: true})},
		{name: "proxy join without a shared P_Key", src: portD, req: joinReq(mgidBcast, portE.GID, 0x7fff, 1), status: mad.StatusSAReqInvalid},
		{name: "proxy join of a port outside the partition", src: portB, req: joinReq(mgidBc8001, portD.GID, 0x8001, 1), status: mad.StatusSAReqInvalid},
		// OpenSM checks the joining port's partition, not the requester's
		{name: "requester outside the partition proxy-joins a member", src: portD, req: joinReq(mgidBc8002, portB.GID, 0x8002, 1),
			check: members(mgidBc8002, Member{GID: portB.GID, JoinState: 1, ProxyJoin: true})},
		{name: "modifying another port's own membership", setup: []step{{portC, joinReq(mgidBcast, portC.GID, 0xffff, 1)}},
			src: portB, req: joinReq(mgidBcast, portC.GID, 0xffff, 2), status: mad.StatusSAReqInvalid},
		{name: "modifying a proxy membership from the partition", setup: []step{{portB, joinReq(mgidBc8001, portC.GID, 0x8001, 1)}},
			src: portA, req: joinReq(mgidBc8001, portC.GID, 0x8001, 2),
			check: members(mgidBc8001, Member{GID: portC.GID, JoinState: 3, ProxyJoin: true})},
		{name: "proxy member modifies itself", setup: []step{{portB, joinReq(mgidBc8001, portC.GID, 0x8001, 1)}},
			src: portC, req: joinReq(mgidBc8001, portC.GID, 0x8001, 2),
			check: members(mgidBc8001, Member{GID: portC.GID, JoinState: 3, ProxyJoin: true})},
	}
	runMC(t, cases)
}

func TestCreate(t *testing.T) {
	C := mad.IPoIBCreateJoinMask
	newG := gid("ff12:401b:ffff::e000:fb")
	created := func(mgid, port verbs.GID, js uint8, mlid verbs.LID) mad.MCMemberRecord {
		return mad.MCMemberRecord{MGID: mgid, PortGID: port, QKey: verbs.IPoIBQKey, MLID: mlid, MTUSelector: 2, MTU: verbs.MTU2048,
			PKey: 0xffff, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, JoinState: js}
	}
	mod := func(r mad.MCMemberRecord, f func(*mad.MCMemberRecord)) mad.MCMemberRecord { f(&r); return r }
	cases := []mcCase{
		{name: "IPoIB create", src: portB, req: mcReq(mad.MethodSet, C, ipoibCreate(newG, portB.GID, 1)),
			want: []mad.MCMemberRecord{created(newG, portB.GID, 1, 0xc006)},
			check: func(t *testing.T, db *DB) {
				g, _ := db.Group(newG)
				diff(t, "group", Group{GroupParams: GroupParams{MGID: newG, PKey: 0xffff, QKey: verbs.IPoIBQKey, MTU: 4, Rate: 3},
					MLID: 0xc006, Members: []Member{{GID: portB.GID, JoinState: 1}}}, g)
			}},
		{name: "insufficient components", src: portB, req: joinReq(newG, portB.GID, 0xffff, 1), status: mad.StatusSAInsufficientComponents,
			check: noGroup(newG)},
		{name: "create without SL in the mask", src: portB,
			req:    mcReq(mad.MethodSet, createMask&^mad.CompMCSL, ipoibCreate(newG, portB.GID, 1)),
			status: mad.StatusSAInsufficientComponents},
		{name: "NonMember cannot create", src: portB, req: mcReq(mad.MethodSet, C, ipoibCreate(newG, portB.GID, 2)), status: mad.StatusSAReqInvalid},
		{name: "NonMember with insufficient components", src: portB, req: joinReq(newG, portB.GID, 0xffff, 2), status: mad.StatusSAReqInvalid},
		{name: "SendOnlyNonMember cannot create", src: portB, req: mcReq(mad.MethodSet, C, ipoibCreate(newG, portB.GID, 4)), status: mad.StatusSAReqInvalid},
		{name: "SendOnlyFullMember creates", src: portB, req: mcReq(mad.MethodSet, C, ipoibCreate(newG, portB.GID, 8)),
			want: []mad.MCMemberRecord{created(newG, portB.GID, 8, 0xc006)}},
		{name: "Q_Key differs from the broadcast group", src: portB,
			req:    mcReq(mad.MethodSet, C, mod(ipoibCreate(newG, portB.GID, 1), func(r *mad.MCMemberRecord) { r.QKey = verbs.GSIQKey })),
			status: mad.StatusSAReqInvalid, check: noGroup(newG)},
		{name: "HopLimit differs from the broadcast group", src: portB,
			req:    mcReq(mad.MethodSet, C, mod(ipoibCreate(newG, portB.GID, 1), func(r *mad.MCMemberRecord) { r.HopLimit = 9 })),
			status: mad.StatusSAReqInvalid},
		{name: "P_Key of another partition than the MGID's", src: portB,
			req:    mcReq(mad.MethodSet, C, mod(ipoibCreate(newG, portB.GID, 1), func(r *mad.MCMemberRecord) { r.PKey = 0x8001 })),
			status: mad.StatusSAReqInvalid},
		{name: "IPoIB MGID without broadcast group", src: portB,
			req: mcReq(mad.MethodSet, C, ipoibCreate(gid("ff15:401b:ffff::1"), portB.GID, 1)), status: mad.StatusSAReqInvalid},
		{name: "IPoIB MTU need not match the broadcast group", src: portB,
			req:  mcReq(mad.MethodSet, C, mod(ipoibCreate(newG, portB.GID, 1), func(r *mad.MCMemberRecord) { r.MTU = 3 })),
			want: []mad.MCMemberRecord{mod(created(newG, portB.GID, 1, 0xc006), func(r *mad.MCMemberRecord) { r.MTU = 3 })}},
		{name: "port not in the partition", src: portD,
			req:    mcReq(mad.MethodSet, C, mod(ipoibCreate(gid("ff12:1234:8001::1"), portD.GID, 1), func(r *mad.MCMemberRecord) { r.PKey = 0x8001 })),
			status: mad.StatusSAReqInvalid, check: noGroup(gid("ff12:1234:8001::1"))},
		// OpenSM 3.3.23 lets a limited member create a group of its partition
		{name: "limited member creates", src: portC,
			req: mcReq(mad.MethodSet, C, mod(ipoibCreate(gid("ff12:1234:8003::1"), portC.GID, 1), func(r *mad.MCMemberRecord) { r.PKey = 0x0003 })),
			want: []mad.MCMemberRecord{mod(created(gid("ff12:1234:8003::1"), portC.GID, 1, 0xc006),
				func(r *mad.MCMemberRecord) { r.PKey = 0x0003 })}},
		{name: "requested MLID is honoured", src: portB,
			req:  mcReq(mad.MethodSet, C, mod(ipoibCreate(newG, portB.GID, 1), func(r *mad.MCMemberRecord) { r.MLID = 0xc0ff })),
			want: []mad.MCMemberRecord{created(newG, portB.GID, 1, 0xc0ff)}},
		{name: "record fields outside the mask are kept", src: portB,
			req: mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{MGID: gid("ff15:1:2::10"), PortGID: portB.GID, PKey: 0xffff, QKey: 0x42,
				JoinState: 1, TClass: 7, FlowLabel: 0x12345, SL: 3, HopLimit: 9, Scope: 8, PacketLifeTime: 5}),
			want: []mad.MCMemberRecord{{MGID: gid("ff15:1:2::10"), PortGID: portB.GID, QKey: 0x42, MLID: 0xc006, MTUSelector: 2, MTU: 4,
				TClass: 7, PKey: 0xffff, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, PacketLifeTime: 5, SL: 3,
				FlowLabel: 0x12345, HopLimit: 9, Scope: 8, JoinState: 1}}},
		{name: "4096-MTU port creates a 4096 group", src: portC,
			req:  mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{MGID: gid("ff15:1:2::11"), PortGID: portC.GID, PKey: 0xffff, JoinState: 1}),
			want: []mad.MCMemberRecord{{MGID: gid("ff15:1:2::11"), PortGID: portC.GID, MLID: 0xc006, MTUSelector: 2, MTU: 5, PKey: 0xffff, RateSelector: 2, Rate: 7, PacketLifeTimeSelector: 2, JoinState: 1}}},
		{name: "zero MGID gets an SA-assigned one", src: portB,
			req:  mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{PortGID: portB.GID, PKey: 0xffff, QKey: 1, JoinState: 1}),
			want: []mad.MCMemberRecord{{MGID: gid("ff12:a01b:fe80::"), PortGID: portB.GID, QKey: 1, MLID: 0xc006, MTUSelector: 2, MTU: 4, PKey: 0xffff, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, JoinState: 1}}},
		{name: "zero MGID with scope", setup: []step{{portB, mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{PortGID: portB.GID, PKey: 0xffff, QKey: 1, JoinState: 1})}},
			src: portB, req: mcReq(mad.MethodSet, createMask|mad.CompMCScope, mad.MCMemberRecord{PortGID: portB.GID, PKey: 0xffff, QKey: 1, JoinState: 1, Scope: 8}),
			want: []mad.MCMemberRecord{{MGID: gid("ff18:a01b:fe80::100:0:0"), PortGID: portB.GID, QKey: 1, MLID: 0xc007, MTUSelector: 2, MTU: 4, PKey: 0xffff, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, Scope: 8, JoinState: 1}}},
		{name: "zero MGID join without create components", src: portB, req: joinReq(verbs.GID{}, portB.GID, 0xffff, 1), status: mad.StatusSAInsufficientComponents},
		{name: "MGID not starting with ff", src: portB, req: mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{MGID: gid("fe80::1"), PortGID: portB.GID, PKey: 0xffff, JoinState: 1}), status: mad.StatusSAReqInvalid},
		{name: "MGID with reserved flags", src: portB, req: mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{MGID: gid("ff32:1::1"), PortGID: portB.GID, PKey: 0xffff, JoinState: 1}), status: mad.StatusSAReqInvalid},
		{name: "SA signature with link-local scope", src: portB, req: mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{MGID: gid("ff12:a01b::1"), PortGID: portB.GID, PKey: 0xffff, JoinState: 1}), status: mad.StatusSAReqInvalid},
		{name: "SA signature with site scope", src: portB, req: mcReq(mad.MethodSet, createMask, mad.MCMemberRecord{MGID: gid("ff15:a01b::5"), PortGID: portB.GID, PKey: 0xffff, JoinState: 1})},
		{name: "second member of a created group", setup: []step{{portB, mcReq(mad.MethodSet, C, ipoibCreate(newG, portB.GID, 1))}},
			src: portC, req: joinReq(newG, portC.GID, 0xffff, 1),
			want:  []mad.MCMemberRecord{created(newG, portC.GID, 1, 0xc006)},
			check: members(newG, Member{GID: portB.GID, JoinState: 1}, Member{GID: portC.GID, JoinState: 1})},
		{name: "create again with another MTU fails", setup: []step{{portB, mcReq(mad.MethodSet, C,
			mod(ipoibCreate(newG, portB.GID, 1), func(r *mad.MCMemberRecord) { r.MTU = 3 }))}},
			src: portC, req: mcReq(mad.MethodSet, C, ipoibCreate(newG, portC.GID, 1)), status: mad.StatusSAReqInvalid},
	}
	runMC(t, cases)
}

// TestCreateSelectors checks how the MTU and Rate selectors of a create request
// decide the group's values (mgrp_request_is_realizable), for the 2048-MTU, 10 Gb/s
// port B. The expectations were observed on OpenSM 3.3.23.
func TestCreateSelectors(t *testing.T) {
	type sc struct {
		sel, v uint8
		want   uint8 // 0: refused with 0x0200
	}
	mtus := []sc{{0, 3, 4}, {0, 4, 0}, {1, 5, 4}, {1, 4, 3}, {2, 5, 0}, {3, 1, 4}, {1, 2, 1}, {0, 1, 4}, {1, 1, 0}, {1, 6, 0}, {2, 0, 0}}
	rates := []sc{{0, 2, 3}, {0, 3, 0}, {0, 5, 3}, {1, 7, 3}, {1, 3, 5}, {1, 6, 3}, {2, 7, 0}, {2, 5, 5}, {3, 2, 3}, {1, 2, 0},
		{1, 21, 3}, {1, 22, 3}, {1, 23, 0}, {1, 19, 3}, {1, 20, 3}, {1, 1, 0}, {2, 19, 0}, {1, 11, 3}, {1, 5, 2}}
	for _, c := range mtus {
		db := newTestDB(t)
		r := mad.MCMemberRecord{MGID: gid("ff15:1:2::20"), PortGID: portB.GID, PKey: 0xffff, JoinState: 1, MTUSelector: c.sel, MTU: verbs.MTU(c.v)}
		m := send(t, db, portB, mcReq(mad.MethodSet, createMask|mad.CompMCMTU|mad.CompMCMTUSelector, r))
		if c.want == 0 {
			if m.Status != mad.StatusSAReqInvalid {
				t.Errorf("MTU selector %d value %d: status %v, want 0x0200", c.sel, c.v, m.Status)
			}
			if _, ok := db.Group(r.MGID); ok {
				t.Errorf("MTU selector %d value %d: failed create left a group", c.sel, c.v)
			}
			continue
		}
		if got := mcRecs(t, m); len(got) != 1 || got[0].MTU != verbs.MTU(c.want) || got[0].MTUSelector != 2 {
			t.Errorf("MTU selector %d value %d: status %v records %+v, want MTU %d", c.sel, c.v, m.Status, got, c.want)
		}
	}
	for _, c := range rates {
		db := newTestDB(t)
		r := mad.MCMemberRecord{MGID: gid("ff15:1:2::40"), PortGID: portB.GID, PKey: 0xffff, JoinState: 1, RateSelector: c.sel, Rate: verbs.Rate(c.v)}
		m := send(t, db, portB, mcReq(mad.MethodSet, createMask|mad.CompMCRate|mad.CompMCRateSelector, r))
		if c.want == 0 {
			if m.Status != mad.StatusSAReqInvalid {
				t.Errorf("rate selector %d value %d: status %v, want 0x0200", c.sel, c.v, m.Status)
			}
			continue
		}
		if got := mcRecs(t, m); len(got) != 1 || got[0].Rate != verbs.Rate(c.want) || got[0].RateSelector != 2 {
			t.Errorf("rate selector %d value %d: status %v records %+v, want rate %d", c.sel, c.v, m.Status, got, c.want)
		}
	}
}

func TestLeave(t *testing.T) {
	newG := gid("ff12:401b:ffff::e000:fb")
	createB := step{portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(newG, portB.GID, 1))}
	leaveRec := func(mgid, port verbs.GID, scope, js uint8) mad.MCMemberRecord {
		return mad.MCMemberRecord{MGID: mgid, PortGID: port, MTUSelector: 2, RateSelector: 2, PacketLifeTimeSelector: 2, Scope: scope, JoinState: js}
	}
	cases := []mcCase{
		{name: "leave", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}},
			src: portB, req: leaveReq(mgidBcast, portB.GID, 1), want: []mad.MCMemberRecord{leaveRec(mgidBcast, portB.GID, 2, 0)},
			check: members(mgidBcast)},
		{name: "partial leave", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 3)}},
			src: portB, req: leaveReq(mgidBcast, portB.GID, 2), want: []mad.MCMemberRecord{leaveRec(mgidBcast, portB.GID, 2, 1)},
			check: members(mgidBcast, Member{GID: portB.GID, JoinState: 1})},
		{name: "leave echoes the request's fields", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}},
			src: portB, req: mcReq(mad.MethodDelete, mad.LeaveMask|mad.CompMCPKey, mad.MCMemberRecord{MGID: mgidBcast, PortGID: portB.GID,
				QKey: 0xb1b, MLID: 0xc000, MTU: 4, PKey: 0xffff, Rate: 3, JoinState: 1, ProxyJoin: true}),
			want: []mad.MCMemberRecord{{MGID: mgidBcast, PortGID: portB.GID, QKey: 0xb1b, MLID: 0xc000, MTUSelector: 2, MTU: 4,
				PKey: 0xffff, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, Scope: 2, ProxyJoin: true}}},
		{name: "double leave", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}, {portB, leaveReq(mgidBcast, portB.GID, 1)}},
			src: portB, req: leaveReq(mgidBcast, portB.GID, 1), status: mad.StatusSAReqInvalid},
		{name: "leave bits not held", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}},
			src: portB, req: leaveReq(mgidBcast, portB.GID, 3), status: mad.StatusSAReqInvalid,
			check: members(mgidBcast, Member{GID: portB.GID, JoinState: 1})},
		{name: "leave JoinState 0", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}},
			src: portB, req: leaveReq(mgidBcast, portB.GID, 0), status: mad.StatusSAReqInvalid},
		{name: "leave unknown group", src: portB, req: leaveReq(newG, portB.GID, 1), status: mad.StatusSAReqInvalid},
		{name: "leave insufficient mask", src: portB, req: mcReq(mad.MethodDelete, mad.CompMCMGID, mad.MCMemberRecord{MGID: mgidBcast, PortGID: portB.GID, JoinState: 1}),
			status: mad.StatusSAInsufficientComponents},
		{name: "leave PortGID of another subnet", src: portB, req: leaveReq(mgidBcast, gid("fe81::10:3"), 1), status: mad.StatusSAInvalidGID},
		{name: "leave with invalid rate", src: portB, req: mcReq(mad.MethodDelete, mad.LeaveMask|mad.CompMCRate|mad.CompMCRateSelector,
			mad.MCMemberRecord{MGID: mgidBcast, PortGID: portB.GID, JoinState: 1, Rate: 1}), status: mad.StatusSAReqInvalid},
		{name: "leave of another port's own membership", setup: []step{{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}},
			src: portC, req: leaveReq(mgidBcast, portB.GID, 1), status: mad.StatusSAReqInvalid},
		{name: "leave of a proxy membership from the partition", setup: []step{{portC, joinReq(mgidBc8001, portB.GID, 0x8001, 1)}},
			src: portA, req: leaveReq(mgidBc8001, portB.GID, 1), want: []mad.MCMemberRecord{leaveRec(mgidBc8001, portB.GID, 2, 0)}},
		{name: "leave of a proxy membership from outside the partition", setup: []step{{portB, joinReq(mgidBcast, portC.GID, 0xffff, 1)}},
			src: portD, req: leaveReq(mgidBcast, portC.GID, 1), want: []mad.MCMemberRecord{leaveRec(mgidBcast, portC.GID, 2, 0)}},
		{name: "last member leaves a created group", setup: []step{createB},
			src: portB, req: leaveReq(newG, portB.GID, 1), want: []mad.MCMemberRecord{leaveRec(newG, portB.GID, 0, 0)}, check: noGroup(newG)},
		{name: "last full member leaves: group and NonMembers go", setup: []step{createB, {portC, joinReq(newG, portC.GID, 0xffff, 2)}},
			src: portB, req: leaveReq(newG, portB.GID, 1), check: noGroup(newG)},
		{name: "full member drops to NonMember: group goes", setup: []step{createB, {portB, joinReq(newG, portB.GID, 0xffff, 2)}},
			src: portB, req: leaveReq(newG, portB.GID, 1), want: []mad.MCMemberRecord{leaveRec(newG, portB.GID, 0, 2)}, check: noGroup(newG)},
		{name: "one of two full members leaves", setup: []step{createB, {portC, joinReq(newG, portC.GID, 0xffff, 1)}},
			src: portB, req: leaveReq(newG, portB.GID, 1), check: members(newG, Member{GID: portC.GID, JoinState: 1})},
		{name: "SendOnlyFullMember counts as full", setup: []step{
			{portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(newG, portB.GID, 8))},
			{portC, joinReq(newG, portC.GID, 0xffff, 5)}},
			src: portC, req: leaveReq(newG, portC.GID, 5), check: members(newG, Member{GID: portB.GID, JoinState: 8})},
		{name: "last SendOnlyFullMember leaves", setup: []step{{portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(newG, portB.GID, 8))}},
			src: portB, req: leaveReq(newG, portB.GID, 8), check: noGroup(newG)},
		{name: "well-known group drops NonMembers but stays", setup: []step{
			{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)}, {portC, joinReq(mgidBcast, portC.GID, 0xffff, 2)}},
			src: portB, req: leaveReq(mgidBcast, portB.GID, 1), check: members(mgidBcast)},
		{name: "well-known group keeps NonMembers without a full member leaving", setup: []step{{portC, joinReq(mgidBcast, portC.GID, 0xffff, 2)}},
			src: portB, req: joinReq(mgidBcast, portB.GID, 0xffff, 2),
			check: members(mgidBcast, Member{GID: portB.GID, JoinState: 2}, Member{GID: portC.GID, JoinState: 2})},
	}
	runMC(t, cases)

	// The MLID of a deleted group is reused (lowest free).
	db := newTestDB(t)
	mustOK(t, db, portB, createB.req)
	mustOK(t, db, portB, leaveReq(newG, portB.GID, 1))
	other := gid("ff12:401b:ffff::e000:fc")
	got := mcRecs(t, mustOK(t, db, portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(other, portB.GID, 1))))
	if len(got) != 1 || got[0].MLID != 0xc006 {
		t.Errorf("MLID after reuse: %+v, want 0xc006", got)
	}
}

func TestQuery(t *testing.T) {
	joined := []step{
		{portB, joinReq(mgidBcast, portB.GID, 0xffff, 1)},
		{portC, joinReq(mgidBcast, portC.GID, 0xffff, 3)},
		{portB, joinReq(mgidBc8001, portC.GID, 0x8001, 1)}, // proxy
	}
	grp := func(mgid verbs.GID) mad.MCMemberRecord {
		for i, p := range testGroups() {
			if p.MGID == mgid {
				r := configuredRecord(p, verbs.LID(0xc000+i))
				r.JoinState = 0 // hidden from untrusted requesters
				return r
			}
		}
		panic("no such group")
	}
	withPort := func(r mad.MCMemberRecord, port verbs.GID, js uint8, proxy bool) mad.MCMemberRecord {
		r.PortGID, r.JoinState, r.ProxyJoin = port, js, proxy
		return r
	}
	get := func(mask uint64, r mad.MCMemberRecord) mad.SAMAD { return mcReq(mad.MethodGet, mask, r) }
	table := func(mask uint64, r mad.MCMemberRecord) mad.SAMAD { return mcReq(mad.MethodGetTable, mask, r) }
	cases := []mcCase{
		{name: "Get by MGID", setup: joined, src: portB, req: get(mad.CompMCMGID, mad.MCMemberRecord{MGID: mgidBcast}),
			want: []mad.MCMemberRecord{grp(mgidBcast)}},
		{name: "Get of everything", src: portB, req: get(0, mad.MCMemberRecord{}), status: mad.StatusSATooManyRecords},
		{name: "Get of an unknown MGID", src: portB, req: get(mad.CompMCMGID, mad.MCMemberRecord{MGID: gid("ff12::1")}), status: mad.StatusSANoRecords},
		{name: "Get by MLID", src: portB, req: get(mad.CompMCMLID, mad.MCMemberRecord{MLID: 0xc001}), want: []mad.MCMemberRecord{grp(mgidBc8001)}},
		{name: "Get by limited P_Key", src: portB, req: get(mad.CompMCPKey, mad.MCMemberRecord{PKey: 0x0002}), want: []mad.MCMemberRecord{grp(mgidBc8002)}},
		{name: "GetTable of an unknown MGID", src: portB, req: table(mad.CompMCMGID, mad.MCMemberRecord{MGID: gid("ff12::1")}), want: []mad.MCMemberRecord{}},
		{name: "GetTable of everything, beyond one MAD, in MGID order", src: portB, req: table(0, mad.MCMemberRecord{}),
			want: []mad.MCMemberRecord{grp(mgid4K), grp(mgidSlow), grp(mgid14G), grp(mgidBc8001), grp(mgidBc8002), grp(mgidBcast)}},
		{name: "requester sees only its partitions", src: portD, req: table(mad.CompMCQKey, mad.MCMemberRecord{QKey: verbs.IPoIBQKey}),
			want: []mad.MCMemberRecord{grp(mgidBcast)}},
		{name: "all partitions visible", src: portB, req: table(mad.CompMCQKey, mad.MCMemberRecord{QKey: verbs.IPoIBQKey}),
			want: []mad.MCMemberRecord{grp(mgidBc8001), grp(mgidBc8002), grp(mgidBcast)}},
		{name: "invisible group", src: portD, req: get(mad.CompMCMGID, mad.MCMemberRecord{MGID: mgidBc8001}), status: mad.StatusSANoRecords},
		{name: "MTU selector", src: portB, req: table(mad.CompMCMTU|mad.CompMCMTUSelector, mad.MCMemberRecord{MTUSelector: 0, MTU: 4}),
			want: []mad.MCMemberRecord{grp(mgid4K)}},
		{name: "rate selector by bandwidth", src: portB, req: table(mad.CompMCRate|mad.CompMCRateSelector, mad.MCMemberRecord{RateSelector: 1, Rate: 3}),
			want: []mad.MCMemberRecord{grp(mgidSlow)}},
		{name: "invalid MTU", src: portB, req: get(mad.CompMCMTU|mad.CompMCMTUSelector|mad.CompMCMGID, mad.MCMemberRecord{MGID: mgidBcast}),
			status: mad.StatusSAReqInvalid},
		{name: "Q_Key filter", src: portB, req: table(mad.CompMCQKey, mad.MCMemberRecord{QKey: 0x5555}), want: []mad.MCMemberRecord{grp(mgidSlow)}},
		{name: "JoinState filter against the group record", src: portB,
			req: get(mad.CompMCMGID|mad.CompMCJoinState, mad.MCMemberRecord{MGID: mgidBcast, JoinState: 1}), want: []mad.MCMemberRecord{grp(mgidBcast)}},
		{name: "JoinState filter mismatch", src: portB,
			req: get(mad.CompMCMGID|mad.CompMCJoinState, mad.MCMemberRecord{MGID: mgidBcast, JoinState: 3}), status: mad.StatusSANoRecords},
		{name: "untrusted PortGID query hides the member", setup: joined, src: portB,
			req: get(mad.CompMCMGID|mad.CompMCPortGID, mad.MCMemberRecord{MGID: mgidBcast, PortGID: portC.GID}), want: []mad.MCMemberRecord{grp(mgidBcast)}},
		{name: "untrusted PortGID query of a non-member", setup: joined, src: portB,
			req: get(mad.CompMCMGID|mad.CompMCPortGID, mad.MCMemberRecord{MGID: mgidBcast, PortGID: portA.GID}), status: mad.StatusSANoRecords},
		{name: "untrusted PortGID+JoinState filters on the member", setup: joined, src: portB,
			req: get(mad.CompMCMGID|mad.CompMCPortGID|mad.CompMCJoinState, mad.MCMemberRecord{MGID: mgidBcast, PortGID: portC.GID, JoinState: 1}), status: mad.StatusSANoRecords},
		{name: "trusted query lists members", setup: joined, src: portB,
			req:  withSMKey(table(mad.CompMCMGID, mad.MCMemberRecord{MGID: mgidBcast}), DefaultSMKey),
			want: []mad.MCMemberRecord{withPort(grp(mgidBcast), portB.GID, 1, false), withPort(grp(mgidBcast), portC.GID, 3, false)}},
		{name: "trusted query by JoinState", setup: joined, src: portB,
			req:  withSMKey(table(mad.CompMCJoinState, mad.MCMemberRecord{JoinState: 1}), DefaultSMKey),
			want: []mad.MCMemberRecord{withPort(grp(mgidBc8001), portC.GID, 1, true), withPort(grp(mgidBcast), portB.GID, 1, false)}},
		{name: "trusted query by PortGID", setup: joined, src: portB,
			req:  withSMKey(table(mad.CompMCPortGID, mad.MCMemberRecord{PortGID: portC.GID}), DefaultSMKey),
			want: []mad.MCMemberRecord{withPort(grp(mgidBc8001), portC.GID, 1, true), withPort(grp(mgidBcast), portC.GID, 3, false)}},
		{name: "ProxyJoin filter compares the group record", setup: joined, src: portB,
			req: withSMKey(table(mad.CompMCProxyJoin|mad.CompMCMGID, mad.MCMemberRecord{MGID: mgidBc8001, ProxyJoin: true}), DefaultSMKey), want: []mad.MCMemberRecord{}},
		{name: "GetMulti", src: portB, req: mcReq(mad.MethodGetMulti, 0, mad.MCMemberRecord{}), status: mad.StatusBadMethodAttr},
		{name: "GetTraceTable", src: portB, req: mcReq(mad.MethodGetTraceTable, 0, mad.MCMemberRecord{}), status: mad.StatusBadMethodAttr},
	}
	runMC(t, cases)

	// A wrong SM_Key is dropped like OpenSM does.
	db := newTestDB(t)
	bad := withSMKey(mcReq(mad.MethodGetTable, 0, mad.MCMemberRecord{}), 2)
	if resp := db.Handle(portB, bad.Bytes()); resp != nil {
		t.Errorf("request with a wrong SM_Key answered")
	}
	db.SetSMKey(2)
	if m := send(t, db, portB, withSMKey(mcReq(mad.MethodGetTable, 0, mad.MCMemberRecord{}), 2)); m.Status != mad.StatusOK {
		t.Errorf("request with the configured SM_Key: %v", m.Status)
	}
}
