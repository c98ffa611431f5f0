package sadb

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

func TestClassPortInfo(t *testing.T) {
	db := newTestDB(t)
	req := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 0x77, 0)
	req.AttrMod = 7
	req.SA.AttrOffset = 5
	m := send(t, db, portB, req)
	if m.Status != mad.StatusOK || m.Method != mad.MethodGetResp || m.AttrMod != 7 || m.SA.AttrOffset != 5 {
		t.Fatalf("header %+v %+v", m.Header, m.SA)
	}
	var got mad.ClassPortInfo
	if err := got.Unmarshal(m.Data[:]); err != nil {
		t.Fatal(err)
	}
	// What OpenSM 3.3.23 sends (captured on ibsim).
	want := mad.ClassPortInfo{BaseVersion: 1, ClassVersion: 2, CapabilityMask: 0x2602, CapabilityMask2: 0xb5e8,
		RespTimeValue: 16, RedirectQP: 1, RedirectQKey: 0x80010000, TrapQKey: 0x80010000}
	diff(t, "ClassPortInfo", want, got)
	if got.CapabilityMask2&mad.CapMask2SendOnlyFullMemberSupport == 0 {
		t.Error("SendOnlyFullMember support not advertised")
	}
	for _, c := range []struct {
		method uint8
		st     mad.Status
	}{{mad.MethodGetTable, mad.StatusSAReqInvalid}, {mad.MethodSet, mad.StatusBadMethodAttr}, {mad.MethodDelete, mad.StatusBadMethodAttr}} {
		m := send(t, db, portB, mad.NewSARequest(c.method, mad.AttrClassPortInfo, 0x78, 0))
		if m.Status != c.st {
			t.Errorf("ClassPortInfo method %#x: %v, want %v", c.method, m.Status, c.st)
		}
	}
}

func TestHandleGeneric(t *testing.T) {
	db := newTestDB(t)
	base := joinReq(mgidBcast, portB.GID, 0xffff, 1)
	type hc struct {
		name       string
		mod        func(*mad.SAMAD)
		nilResp    bool
		status     mad.Status
		respMethod uint8
	}
	cases := []hc{
		{name: "class version 1", mod: func(m *mad.SAMAD) { m.ClassVersion = 1 }, status: mad.StatusBadVersion, respMethod: mad.MethodGetResp},
		{name: "base version 2", mod: func(m *mad.SAMAD) { m.BaseVersion = 2 }, status: mad.StatusBadVersion, respMethod: mad.MethodGetResp},
		{name: "method Send", mod: func(m *mad.SAMAD) { m.Method = mad.MethodSend }, status: mad.StatusBadMethod, respMethod: 0x83},
		{name: "method 0x42", mod: func(m *mad.SAMAD) { m.Method = 0x42 }, status: mad.StatusBadMethod, respMethod: 0xc2},
		{name: "unknown attribute", mod: func(m *mad.SAMAD) { m.AttrID = 0x99 }, status: mad.StatusBadMethodAttr, respMethod: mad.MethodGetResp},
		{name: "ServiceRecord", mod: func(m *mad.SAMAD) { m.AttrID, m.Method = mad.AttrServiceRecord, mad.MethodGetTable }, status: mad.StatusBadMethodAttr, respMethod: mad.MethodGetTableResp},
		{name: "NodeRecord Set", mod: func(m *mad.SAMAD) { m.AttrID = mad.AttrNodeRecord }, status: mad.StatusBadMethodAttr, respMethod: mad.MethodGetResp},
		{name: "response bit", mod: func(m *mad.SAMAD) { m.Method = mad.MethodGetResp }, nilResp: true},
		{name: "SMP class", mod: func(m *mad.SAMAD) { m.MgmtClass = mad.ClassSubnLID }, nilResp: true},
		{name: "wrong SM_Key", mod: func(m *mad.SAMAD) { m.SA.SMKey = 99 }, nilResp: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := base
			c.mod(&req)
			b := req.Bytes()
			resp := db.Handle(portB, b)
			if c.nilResp {
				if resp != nil {
					t.Fatalf("got a response")
				}
				return
			}
			var m mad.SAMAD
			if len(resp) != mad.Size || mad.ParseSA(resp, &m) != nil {
				t.Fatalf("bad response length %d", len(resp))
			}
			if m.Status != c.status || m.Method != c.respMethod || m.TID != req.TID || m.Data != req.Data {
				t.Errorf("got status %v method %#x, want %v %#x (and the request echoed)", m.Status, m.Method, c.status, c.respMethod)
			}
		})
	}
	if db.Handle(portB, base.Bytes()[:255]) != nil {
		t.Error("short MAD answered")
	}
	if len(db.Groups()[len(db.Groups())-1].Members) != 0 {
		t.Error("a rejected request changed the broadcast group")
	}
	// Longer input: only the first 256 bytes count.
	long := append(base.Bytes(), 1, 2, 3)
	if resp := db.Handle(portB, long); len(resp) != mad.Size {
		t.Errorf("long MAD: response of %d bytes", len(resp))
	}
}

func TestVersion(t *testing.T) {
	db := New(&fakeFabric{ports: allPorts})
	v := db.Version()
	expect := func(what string, bump bool) {
		t.Helper()
		nv := db.Version()
		switch {
		case bump && nv != v+1:
			t.Errorf("%s: version %d -> %d, want one increment", what, v, nv)
		case !bump && nv != v:
			t.Errorf("%s: version %d -> %d, want unchanged", what, v, nv)
		}
		v = nv
	}
	handle := func(src Port, req mad.SAMAD) mad.Status { return send(t, db, src, req).Status }

	if !db.SetConfiguredGroups(testGroups()) {
		t.Error("initial SetConfiguredGroups: no change")
	}
	expect("configure", true)
	if db.SetConfiguredGroups(testGroups()) {
		t.Error("same configuration reported a change")
	}
	expect("same configuration", false)
	handle(portB, joinReq(mgidBcast, portB.GID, 0xffff, 1))
	expect("join", true)
	handle(portB, joinReq(mgidBcast, portB.GID, 0xffff, 1))
	expect("same join again", false)
	handle(portB, joinReq(mgidBcast, portB.GID, 0xffff, 2))
	expect("join adding a JoinState bit", true)
	handle(portB, joinReq(mgidBcast, portB.GID, 0xffff, 0))
	expect("rejected join", false)
	handle(portB, joinReq(gid("ff12:401b:ffff::1"), portB.GID, 0xffff, 1))
	expect("rejected create", false)
	handle(portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(gid("ff12:401b:ffff::1"), portB.GID, 1)))
	expect("create", true)
	handle(portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, mad.MCMemberRecord{MGID: gid("ff12:401b:ffff::2"), PortGID: portB.GID,
		PKey: 0xffff, QKey: 0xb1b, MTUSelector: 2, MTU: 5, RateSelector: 2, Rate: 3, JoinState: 1}))
	expect("create refused after allocation (port MTU)", false)
	handle(portB, mcReq(mad.MethodGetTable, 0, mad.MCMemberRecord{}))
	handle(portB, prReq(mad.MethodGet, ipoibPath, pathBC()))
	handle(portB, mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0))
	expect("queries", false)
	handle(portB, leaveReq(mgidBcast, portB.GID, 2))
	expect("partial leave", true)
	handle(portB, leaveReq(mgidBcast, portB.GID, 2))
	expect("rejected leave", false)
	handle(portB, leaveReq(gid("ff12:401b:ffff::1"), portB.GID, 1))
	expect("leave deleting a group", true)
	if db.RemovePort(portC.GID) {
		t.Error("RemovePort of a non-member reported a change")
	}
	expect("RemovePort of a non-member", false)
	if !db.RemovePort(portB.GID) {
		t.Error("RemovePort of a member reported no change")
	}
	expect("RemovePort", true)
	if !db.SetConfiguredGroups(testGroups()[:2]) {
		t.Error("shrinking the configuration reported no change")
	}
	expect("configuration shrinks", true)
}

func TestSetConfiguredGroups(t *testing.T) {
	db := New(&fakeFabric{ports: allPorts})
	site := gid("ff15:401b:ffff::ffff:ffff")
	db.SetConfiguredGroups([]GroupParams{{MGID: mgidBcast, PKey: 0x7fff, QKey: 0xb1b}, {MGID: site, PKey: 0xffff}, {MGID: mgidBcast, PKey: 1},
		{MGID: verbs.GID{}, PKey: 0xffff}, {MGID: portB.GID, PKey: 0xffff}})
	gs := db.Groups()
	want := []Group{
		{GroupParams: GroupParams{MGID: mgidBcast, PKey: 0xffff, QKey: 0xb1b, MTU: 4, Rate: 3, Scope: 2, PacketLifeTime: 18}, MLID: 0xc000, WellKnown: true},
		{GroupParams: GroupParams{MGID: site, PKey: 0xffff, MTU: 4, Rate: 3, Scope: 5, PacketLifeTime: 18}, MLID: 0xc001, WellKnown: true},
	}
	diff(t, "groups with defaults", want, gs)

	// Members survive a reconfiguration; dropped groups go; new ones take the lowest free MLID.
	mustOK(t, db, portB, joinReq(mgidBcast, portB.GID, 0xffff, 1))
	created := gid("ff12:401b:ffff::1")
	mustOK(t, db, portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(created, portB.GID, 1))) // 0xc002
	if !db.SetConfiguredGroups([]GroupParams{{MGID: mgidBc8001, PKey: 0x8001}, {MGID: mgidBcast, PKey: 0xffff, MTU: 5}, {MGID: created, PKey: 0xffff}}) {
		t.Fatal("no change reported")
	}
	g, _ := db.Group(mgidBcast)
	diff(t, "kept group", Group{GroupParams: GroupParams{MGID: mgidBcast, PKey: 0xffff, QKey: 0xb1b, MTU: 4, Rate: 3, Scope: 2, PacketLifeTime: 18},
		MLID: 0xc000, WellKnown: true, Members: []Member{{GID: portB.GID, JoinState: 1}}}, g)
	if _, ok := db.Group(site); ok {
		t.Error("unlisted empty group kept")
	}
	if g, _ := db.Group(mgidBc8001); g.MLID != 0xc001 {
		t.Errorf("new group MLID %#x, want the freed 0xc001", g.MLID)
	}
	if g, _ := db.Group(created); !g.WellKnown || g.MLID != 0xc002 || len(g.Members) != 1 {
		t.Errorf("join-created group listed in the configuration: %+v", g)
	}

	// An unlisted group with a full member loses WellKnown and goes with its last member.
	db.SetConfiguredGroups([]GroupParams{{MGID: mgidBc8001, PKey: 0x8001}})
	g, ok := db.Group(mgidBcast)
	if !ok || g.WellKnown || len(g.Members) != 1 {
		t.Fatalf("unlisted group with a member: %+v %v", g, ok)
	}
	mustOK(t, db, portB, leaveReq(mgidBcast, portB.GID, 1))
	if _, ok := db.Group(mgidBcast); ok {
		t.Error("demoted group survived its last member")
	}
	// A non-full member alone does not keep an unlisted group.
	db.SetConfiguredGroups([]GroupParams{{MGID: mgidBc8001, PKey: 0x8001}, {MGID: mgidBcast, PKey: 0xffff}})
	mustOK(t, db, portB, joinReq(mgidBcast, portB.GID, 0xffff, 2))
	db.SetConfiguredGroups([]GroupParams{{MGID: mgidBc8001, PKey: 0x8001}})
	if _, ok := db.Group(mgidBcast); ok {
		t.Error("unlisted group with only a NonMember survived")
	}
}

func TestRemovePort(t *testing.T) {
	db := newTestDB(t)
	created := gid("ff12:401b:ffff::1")
	mustOK(t, db, portB, joinReq(mgidBcast, portB.GID, 0xffff, 1))
	mustOK(t, db, portC, joinReq(mgidBcast, portC.GID, 0xffff, 1))
	mustOK(t, db, portB, mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(created, portB.GID, 1)))
	mustOK(t, db, portC, joinReq(created, portC.GID, 0xffff, 2))
	if !db.RemovePort(portB.GID) {
		t.Fatal("no change")
	}
	if _, ok := db.Group(created); ok {
		t.Error("created group survived its only full member")
	}
	diff(t, "broadcast members", []Member{{GID: portC.GID, JoinState: 1}}, memberOf(t, db, mgidBcast))
	if db.RemovePort(portB.GID) {
		t.Error("second RemovePort reported a change")
	}
}

func TestMemberOrder(t *testing.T) {
	// OpenSM's port map is keyed by the GUID in network byte order.
	p1 := Port{GUID: 0x0200000000000001, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 0x0200000000000001), LID: 1, MTU: 4, Rate: 3, PKeys: []verbs.PKey{0xffff}}
	p2 := Port{GUID: 0x0100000000000002, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 0x0100000000000002), LID: 2, MTU: 4, Rate: 3, PKeys: []verbs.PKey{0xffff}}
	db := New(&fakeFabric{ports: []Port{p1, p2}})
	db.SetConfiguredGroups([]GroupParams{{MGID: mgidBcast, PKey: 0xffff}})
	mustOK(t, db, p2, joinReq(mgidBcast, p2.GID, 0xffff, 1))
	mustOK(t, db, p1, joinReq(mgidBcast, p1.GID, 0xffff, 1))
	got := memberOf(t, db, mgidBcast)
	if len(got) != 2 || got[0].GID != p1.GID {
		t.Errorf("members %+v, want %v first", got, p1.GID)
	}
}

func TestConcurrent(t *testing.T) {
	db := newTestDB(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := allPorts[i%3+1] // B, C, D
			pk := src.PKeys[0]
			mgid := gid(fmt.Sprintf("ff12:401b:ffff::%x", i%3+1))
			for range 50 {
				for _, req := range []mad.SAMAD{
					joinReq(mgidBcast, src.GID, pk, 2),
					mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(mgid, src.GID, 1)),
					leaveReq(mgid, src.GID, 1),
					mcReq(mad.MethodGetTable, 0, mad.MCMemberRecord{}),
					prReq(mad.MethodGet, ipoibPath, pathBC()),
				} {
					// The GetTable of everything is longer than one MAD.
					if m := send(t, db, src, req); req.Method == mad.MethodGetTable && m.long == nil {
						t.Errorf("GetTable of every group answered in one MAD")
					}
				}
				_ = db.Groups()
				_ = db.Version()
				db.SetConfiguredGroups(testGroups())
				db.RemovePort(portE.GID)
			}
		}()
	}
	wg.Wait()
}

func FuzzHandle(f *testing.F) {
	for _, m := range []mad.SAMAD{
		joinReq(mgidBcast, portB.GID, 0xffff, 1),
		mcReq(mad.MethodSet, mad.IPoIBCreateJoinMask, ipoibCreate(gid("ff12:401b:ffff::1"), portB.GID, 1)),
		mcReq(mad.MethodSet, createMask|mad.CompMCScope, mad.MCMemberRecord{PortGID: portB.GID, PKey: 0xffff, JoinState: 1, Scope: 8}),
		leaveReq(mgidBcast, portB.GID, 1),
		withSMKey(mcReq(mad.MethodGetTable, 0, mad.MCMemberRecord{}), DefaultSMKey),
		prReq(mad.MethodGet, ipoibPath, pathBC()),
		prReq(mad.MethodGetTable, 0, mad.PathRecord{}),
		prReq(mad.MethodGet, mad.CompPRDGID, mad.PathRecord{DGID: mgidBcast}),
		mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 1, 0),
	} {
		f.Add(m.Bytes(), uint8(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, who uint8) {
		db := New(listingFabric{&fakeFabric{ports: allPorts}})
		db.SetConfiguredGroups(testGroups())
		src := allPorts[int(who)%len(allPorts)]
		for range 2 { // twice: the first request may have created state
			resp := db.Handle(src, b)
			if resp == nil {
				continue
			}
			if len(resp) > mad.Size {
				// A long GetTable answer: it must cut into segments and join up again.
				if resp[3] != mad.MethodGetTableResp {
					t.Fatalf("long answer to method %#x", resp[3])
				}
				segs, err := mad.SplitRMPP(resp)
				if err != nil {
					t.Fatal(err)
				}
				var r mad.Reassembly
				for _, s := range segs {
					if _, _, err := r.Add(s); err != nil {
						t.Fatal(err)
					}
				}
				if l := r.Long(); !bytes.Equal(l[mad.SADataOffset:], resp[mad.SADataOffset:]) || !bytes.Equal(l[:mad.HeaderSize], resp[:mad.HeaderSize]) {
					t.Fatal("long answer does not survive RMPP")
				}
				resp = segs[0]
			}
			if len(resp) != mad.Size {
				t.Fatalf("response of %d bytes", len(resp))
			}
			var m mad.SAMAD
			if err := mad.ParseSA(resp, &m); err != nil {
				t.Fatal(err)
			}
			if !m.IsResponse() || m.MgmtClass != mad.ClassSA || m.SA.SMKey != 0 {
				t.Fatalf("not an SA response: %+v", m.Header)
			}
		}
		for _, g := range db.Groups() {
			if !g.MLID.IsMulticast() {
				t.Fatalf("group %v with MLID %#x", g.MGID, g.MLID)
			}
			if !g.WellKnown && len(g.Members) == 0 {
				t.Fatalf("empty non-well-known group %v", g.MGID)
			}
		}
	})
}
