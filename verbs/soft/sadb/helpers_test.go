package sadb

import (
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

func gid(s string) verbs.GID {
	g, err := verbs.ParseGID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// fakeFabric is a map-backed Fabric; with list set it is also a PortLister.
type fakeFabric struct {
	ports []Port
	list  bool
}

func (f *fakeFabric) PortByGID(g verbs.GID) (Port, bool) {
	for _, p := range f.ports {
		if p.GID == g {
			return p, true
		}
	}
	return Port{}, false
}

func (f *fakeFabric) PortByLID(l verbs.LID) (Port, bool) {
	for _, p := range f.ports {
		if p.LID == l {
			return p, true
		}
	}
	return Port{}, false
}

type listingFabric struct{ *fakeFabric }

func (f listingFabric) Ports() []Port { return append([]Port(nil), f.ports...) }

// The test fabric: full and limited members, 2048- and 4096-MTU ports, 10, 40 and
// 5 Gb/s ports.
var (
	portA = Port{GUID: 0x100001, GID: gid("fe80::10:1"), LID: 1, IsSM: true, MTU: verbs.MTU2048, Rate: 3,
		PKeys: []verbs.PKey{0xffff, 0x8001}}
	portB = Port{GUID: 0x100003, GID: gid("fe80::10:3"), LID: 3, MTU: verbs.MTU2048, Rate: 3,
		PKeys: []verbs.PKey{0xffff, 0x8001, 0x8002, 0x0003}}
	portC = Port{GUID: 0x100005, GID: gid("fe80::10:5"), LID: 4, MTU: verbs.MTU4096, Rate: 7,
		PKeys: []verbs.PKey{0xffff, 0x8001, 0x0002, 0x0003}}
	// D and E are limited members of the default partition.
	portD = Port{GUID: 0x100007, GID: gid("fe80::10:7"), LID: 5, MTU: verbs.MTU4096, Rate: 5,
		PKeys: []verbs.PKey{0x7fff, 0x8004}}
	portE = Port{GUID: 0x100009, GID: gid("fe80::10:9"), LID: 6, MTU: verbs.MTU2048, Rate: 3,
		PKeys: []verbs.PKey{0x7fff, 0x8005}}
	allPorts = []Port{portA, portB, portC, portD, portE}
)

// Configured groups of the test fabric.
var (
	mgidBcast  = gid("ff12:401b:ffff::ffff:ffff") // 0xc000
	mgidBc8001 = gid("ff12:401b:8001::ffff:ffff") // 0xc001
	mgidBc8002 = gid("ff12:401b:8002::ffff:ffff") // 0xc002, SL 3
	mgid4K     = gid("ff12:1234:ffff::4")         // 0xc003, MTU 4096, 40 Gb/s
	mgidSlow   = gid("ff12:1234:ffff::5")         // 0xc004, 5 Gb/s (code 5 > code 3, but slower)
	mgid14G    = gid("ff12:1234:ffff::14")        // 0xc005, 14 Gb/s (code 11 > code 7, but slower)
)

func testGroups() []GroupParams {
	ipoib := func(m verbs.GID, pk verbs.PKey) GroupParams {
		return GroupParams{MGID: m, PKey: pk, QKey: verbs.IPoIBQKey, MTU: verbs.MTU2048, Rate: 3, Scope: 2, PacketLifeTime: 18}
	}
	b82 := ipoib(mgidBc8002, 0x8002)
	b82.SL = 3
	return []GroupParams{
		ipoib(mgidBcast, 0xffff),
		ipoib(mgidBc8001, 0x8001),
		b82,
		{MGID: mgid4K, PKey: 0xffff, QKey: 0x4444, MTU: verbs.MTU4096, Rate: 7},
		{MGID: mgidSlow, PKey: 0xffff, QKey: 0x5555, Rate: 5},
		{MGID: mgid14G, PKey: 0xffff, QKey: 0x1414, Rate: 11},
	}
}

func newTestDB(t testing.TB) *DB {
	t.Helper()
	db := New(&fakeFabric{ports: allPorts})
	if !db.SetConfiguredGroups(testGroups()) {
		t.Fatal("SetConfiguredGroups reported no change on an empty DB")
	}
	return db
}

var tidSeq atomic.Uint64 // request TIDs

// send runs one request through db.Handle and decodes the response.
// answer is an SA answer: one MAD, or (long set) a GetTable answer longer than one
// MAD, which QP1 sends as an RMPP transfer.
type answer struct {
	mad.SAMAD
	long []byte
}

func send(t testing.TB, db *DB, src Port, req mad.SAMAD) answer {
	t.Helper()
	b := req.Bytes()
	resp := db.Handle(src, b)
	var long []byte
	if len(resp) > mad.Size && req.Method == mad.MethodGetTable {
		// What the requester gets after the wire: the RMPP segments joined up.
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
		long = r.Long()
		resp = segs[0]
	}
	if len(resp) != mad.Size {
		t.Fatalf("Handle returned %d bytes for method %#x attr %#x", len(resp), req.Method, req.AttrID)
	}
	var m answer
	m.long = long
	if err := mad.ParseSA(resp, &m.SAMAD); err != nil {
		t.Fatal(err)
	}
	if m.TID != req.TID || m.AttrID != req.AttrID || m.MgmtClass != mad.ClassSA {
		t.Fatalf("response header %+v does not match request %+v", m.Header, req.Header)
	}
	if m.SA.SMKey != 0 {
		t.Errorf("response SM_Key %#x, want 0", m.SA.SMKey)
	}
	return m
}

func mcReq(method uint8, mask uint64, r mad.MCMemberRecord) mad.SAMAD {
	m := mad.NewSARequest(method, mad.AttrMCMemberRecord, 0x5a000000+tidSeq.Add(1), mask)
	r.Marshal(m.Data[:])
	return m
}

func prReq(method uint8, mask uint64, r mad.PathRecord) mad.SAMAD {
	m := mad.NewSARequest(method, mad.AttrPathRecord, 0x5a000000+tidSeq.Add(1), mask)
	r.Marshal(m.Data[:])
	return m
}

func withSMKey(m mad.SAMAD, k uint64) mad.SAMAD {
	m.SA.SMKey = k
	return m
}

// mcRecs decodes the MCMemberRecords of a response (one for Get/Set/Delete, the
// RMPP-counted ones for GetTable).
func mcRecs(t testing.TB, m answer) []mad.MCMemberRecord {
	t.Helper()
	if m.Status != mad.StatusOK {
		return nil
	}
	var out []mad.MCMemberRecord
	for _, b := range dataRecs(t, m, mad.MCMemberRecordSize) {
		var r mad.MCMemberRecord
		if err := r.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func prRecs(t testing.TB, m answer) []mad.PathRecord {
	t.Helper()
	if m.Status != mad.StatusOK {
		return nil
	}
	var out []mad.PathRecord
	for _, b := range dataRecs(t, m, mad.PathRecordSize) {
		var r mad.PathRecord
		if err := r.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func dataRecs(t testing.TB, m answer, size int) [][]byte {
	t.Helper()
	if m.long != nil {
		if want := mad.AttrOffsetFor(size); m.SA.AttrOffset != want {
			t.Errorf("AttributeOffset %d, want %d", m.SA.AttrOffset, want)
		}
		recs, err := mad.TableOf(m.long)
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	if m.Method == mad.MethodGetTableResp {
		if m.SA.RMPPVersion != 1 || m.SA.RMPPRespTimeFlags&7 != 7 || m.SA.RMPPType != mad.RMPPTypeData || m.SA.SegNum != 1 {
			t.Errorf("GetTableResp RMPP header %+v is not a single DATA segment", m.SA)
		}
		recs := m.TableRecords()
		if len(recs) == 0 && m.SA.AttrOffset != 0 {
			t.Errorf("empty GetTableResp with AttributeOffset %d", m.SA.AttrOffset)
		}
		return recs
	}
	if want := mad.AttrOffsetFor(size); m.SA.AttrOffset != want {
		t.Errorf("AttributeOffset %d, want %d", m.SA.AttrOffset, want)
	}
	return [][]byte{m.Data[:size]}
}

// bcastRec is the record OpenSM returns for a join of the P_Key 0xffff broadcast group.
func bcastRec(port verbs.GID, js uint8) mad.MCMemberRecord {
	return mad.MCMemberRecord{MGID: mgidBcast, PortGID: port, QKey: verbs.IPoIBQKey, MLID: 0xc000,
		MTUSelector: 2, MTU: verbs.MTU2048, PKey: 0xffff, RateSelector: 2, Rate: 3,
		PacketLifeTimeSelector: 2, PacketLifeTime: 18, Scope: 2, JoinState: js}
}

func joinReq(mgid, port verbs.GID, pkey verbs.PKey, js uint8) mad.SAMAD {
	return mcReq(mad.MethodSet, mad.IPoIBBroadcastJoinMask, mad.MCMemberRecord{MGID: mgid, PortGID: port, PKey: pkey, JoinState: js})
}

func leaveReq(mgid, port verbs.GID, js uint8) mad.SAMAD {
	return mcReq(mad.MethodDelete, mad.LeaveMask, mad.MCMemberRecord{MGID: mgid, PortGID: port, JoinState: js})
}

// ipoibCreate is a kernel-style create of a non-broadcast group in the 0xffff
// partition (values copied from the broadcast group, selectors "exactly").
func ipoibCreate(mgid, port verbs.GID, js uint8) mad.MCMemberRecord {
	return mad.MCMemberRecord{MGID: mgid, PortGID: port, QKey: verbs.IPoIBQKey, PKey: 0xffff,
		MTUSelector: 2, MTU: verbs.MTU2048, RateSelector: 2, Rate: 3, JoinState: js}
}

// mustOK runs a request that has to succeed.
func mustOK(t testing.TB, db *DB, src Port, req mad.SAMAD) answer {
	t.Helper()
	m := send(t, db, src, req)
	if m.Status != mad.StatusOK {
		t.Fatalf("setup request (method %#x) failed: %v", req.Method, m.Status)
	}
	return m
}

func diff(t testing.TB, what string, want, got any) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", what, d)
	}
}
