package mad_test

import (
	"bytes"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"ipoibfs/internal/ibsimsa"
	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// OpenSM conformance: MADs encoded by this package are sent to unmodified OpenSM (the
// Debian 3.3.23 package) running on an ibsim fabric, and its answers are decoded by
// this package. See shared/tools/ibsim-sa/README.md for the fabric and what the
// selftest saw. Skipped with -short, and (outside CI) when the tools are missing.

var conformanceTID atomic.Uint32

// saClient sends SA MADs through one relay and checks the generic response fields.
type saClient struct {
	t *testing.T
	r *ibsimsa.Relay
	f *ibsimsa.Fabric
}

func (c saClient) do(t *testing.T, req mad.SAMAD) mad.SAMAD {
	t.Helper()
	raw, err := c.r.Do(req.Bytes())
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	var resp mad.SAMAD
	if err := mad.ParseSA(raw, &resp); err != nil {
		t.Fatalf("ParseSA(response): %v", err)
	}
	if resp.BaseVersion != mad.BaseVersion || resp.MgmtClass != mad.ClassSA || resp.ClassVersion != mad.SAClassVersion {
		t.Errorf("response header %+v", resp.Header)
	}
	if resp.TIDLow() != req.TIDLow() {
		t.Errorf("response TID %#x for request TID %#x", resp.TID, req.TID)
	}
	if resp.AttrID != req.AttrID {
		t.Errorf("response attribute %#x for request attribute %#x", resp.AttrID, req.AttrID)
	}
	if want := mad.ResponseMethod(req.Method); resp.Method != want || !resp.IsResponse() {
		t.Errorf("response method %#x for request method %#x, want %#x", resp.Method, req.Method, want)
	}
	if resp.SA.SMKey != 0 {
		t.Errorf("response SM_Key %#x, want 0", resp.SA.SMKey)
	}
	return resp
}

// expect sends req and requires the given status. On an error status it logs the
// OpenSM ERR lines the request produced.
func (c saClient) expect(t *testing.T, req mad.SAMAD, want mad.Status) mad.SAMAD {
	t.Helper()
	before := len(c.f.OpenSMLog())
	resp := c.do(t, req)
	if resp.Status != want {
		t.Fatalf("status %v, want %v", resp.Status, want)
	}
	if want != mad.StatusOK {
		if log := c.f.OpenSMLog(); len(log) >= before {
			for _, l := range errLine.FindAllString(log[before:], -1) {
				t.Logf("OpenSM: %s", strings.TrimSpace(l))
			}
		}
	}
	return resp
}

var errLine = regexp.MustCompile(`ERR [0-9A-F]{4}:[^\n]*`)

func newTID() uint64 { return 0x4d41_0000 | uint64(conformanceTID.Add(1)) }

func mcmrRequest(method uint8, mask uint64, r mad.MCMemberRecord) mad.SAMAD {
	req := mad.NewSARequest(method, mad.AttrMCMemberRecord, newTID(), mask)
	r.Marshal(req.Record())
	return req
}

func mcmrOf(t *testing.T, m mad.SAMAD) mad.MCMemberRecord {
	t.Helper()
	var r mad.MCMemberRecord
	if err := r.Unmarshal(m.Record()); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestOpenSMConformance(t *testing.T) {
	testenv.Short(t, "starts ibsim and OpenSM")
	f := ibsimsa.Start(t, "")
	hca2 := saClient{t: t, r: f.Relay(t, ibsimsa.HostHca2), f: f}
	hca3 := saClient{t: t, r: f.Relay(t, ibsimsa.HostHca3), f: f}

	gid2 := gid(t, "fe80::10:3")
	gid3 := gid(t, "fe80::10:5")
	bcast8001 := gid(t, "ff12:401b:8001::ffff:ffff")
	bcastFFFF := gid(t, "ff12:401b:ffff::ffff:ffff")
	mdns8001 := gid(t, "ff12:401b:8001::e000:fb") // IPoIB MGID of 224.0.0.251 in P_Key 0x8001

	t.Run("ClassPortInfo", func(t *testing.T) {
		resp := hca2.expect(t, mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, newTID(), 0), mad.StatusOK)
		var cpi mad.ClassPortInfo
		if err := cpi.Unmarshal(resp.Record()); err != nil {
			t.Fatal(err)
		}
		t.Logf("OpenSM ClassPortInfo: CapabilityMask %#04x CapabilityMask2 %#07x RespTimeValue %d RedirectQP %#x RedirectQKey %#x TrapQKey %#x (AttrOffset %d)",
			cpi.CapabilityMask, cpi.CapabilityMask2, cpi.RespTimeValue, cpi.RedirectQP, cpi.RedirectQKey, cpi.TrapQKey, resp.SA.AttrOffset)
		if cpi.BaseVersion != 1 || cpi.ClassVersion != mad.SAClassVersion {
			t.Errorf("versions %d/%d, want 1/2", cpi.BaseVersion, cpi.ClassVersion)
		}
		if cpi.CapabilityMask&mad.CapSAUDMulticast == 0 {
			t.Errorf("CapabilityMask %#x lacks UD multicast (bit 9)", cpi.CapabilityMask)
		}
		if cpi.CapabilityMask2&mad.CapMask2SendOnlyFullMemberSupport == 0 {
			t.Errorf("CapabilityMask2 %#x lacks SendOnlyFullMember support (bit 12)", cpi.CapabilityMask2)
		}
		if cpi.RedirectQKey != verbs.GSIQKey || cpi.TrapQKey != verbs.GSIQKey {
			t.Errorf("Q_Keys %#x/%#x, want GSI Q_Key", cpi.RedirectQKey, cpi.TrapQKey)
		}
	})

	var bcastMLID verbs.LID
	t.Run("BroadcastJoin8001", func(t *testing.T) {
		resp := hca2.expect(t, mcmrRequest(mad.MethodSet, mad.IPoIBBroadcastJoinMask, mad.MCMemberRecord{
			MGID: bcast8001, PortGID: gid2, PKey: 0x8001, JoinState: mad.JoinFull,
		}), mad.StatusOK)
		if resp.SA.AttrOffset != 7 || resp.SA.CompMask != mad.IPoIBBroadcastJoinMask {
			t.Errorf("SA header %+v", resp.SA)
		}
		r := mcmrOf(t, resp)
		t.Logf("joined: %+v", r)
		if r.MGID != bcast8001 || r.PortGID != gid2 {
			t.Errorf("MGID %v PortGID %v", r.MGID, r.PortGID)
		}
		if r.QKey != verbs.IPoIBQKey || r.MTU != verbs.MTU2048 || r.MTUSelector != mad.SelExactly ||
			r.Rate != 3 || r.RateSelector != mad.SelExactly || r.Scope != mad.ScopeLinkLocal ||
			r.JoinState != mad.JoinFull || r.PKey != 0x8001 || r.SL != 0 || r.TClass != 0 {
			t.Errorf("group parameters %+v", r)
		}
		if !r.MLID.IsMulticast() {
			t.Errorf("MLID %#x is not multicast", r.MLID)
		}
		bcastMLID = r.MLID
	})

	t.Run("BroadcastJoinFFFFMTU4096", func(t *testing.T) {
		// The Default partition's group has MTU 4096 (mtu=5) but ibsim ports cap at
		// 2048: OpenSM refuses the join (ERR 1B12).
		hca2.expect(t, mcmrRequest(mad.MethodSet, mad.IPoIBBroadcastJoinMask, mad.MCMemberRecord{
			MGID: bcastFFFF, PortGID: gid2, PKey: 0xffff, JoinState: mad.JoinFull,
		}), mad.StatusSAReqInvalid)
	})

	t.Run("CreateInsufficientComponents", func(t *testing.T) {
		req := mcmrRequest(mad.MethodSet, mad.IPoIBBroadcastJoinMask, mad.MCMemberRecord{
			MGID: mdns8001, PortGID: gid2, PKey: 0x8001, JoinState: mad.JoinFull,
		})
		resp := hca2.expect(t, req, mad.StatusSAInsufficientComponents)
		// OpenSM's error responses echo the request record (AttributeOffset 0), but
		// the last 24 bytes of the MAD are not the request's: they hold leftover
		// OpenSM memory, so a client must not read past the record.
		if !bytes.Equal(resp.Data[:mad.MCMemberRecordSize], req.Data[:mad.MCMemberRecordSize]) || resp.SA.AttrOffset != 0 {
			t.Errorf("error response data %x, AttrOffset %d; want the request record", resp.Data, resp.SA.AttrOffset)
		}
		// ErrorResponse builds the same bytes (up to the record's end), given the
		// MAD layer's TID rewrite.
		mine := req.ErrorResponse(mad.StatusSAInsufficientComponents)
		mine.TID = resp.TID
		n := mad.SADataOffset + mad.MCMemberRecordSize
		if got, want := mine.Bytes()[:n], resp.Bytes()[:n]; !bytes.Equal(got, want) {
			t.Errorf("ErrorResponse differs from OpenSM's answer\n got %x\nwant %x", got, want)
		}
		if !bytes.Equal(resp.Data[:], req.Data[:]) {
			t.Logf("error response data beyond the record differs from the request: %x", resp.Data[mad.MCMemberRecordSize:])
		}
	})

	create := mad.MCMemberRecord{
		MGID: mdns8001, PortGID: gid2, PKey: 0x8001, JoinState: mad.JoinFull,
		QKey: verbs.GSIQKey, MTUSelector: mad.SelExactly, MTU: verbs.MTU2048,
		RateSelector: mad.SelExactly, Rate: 3,
	}
	t.Run("CreateWrongQKey", func(t *testing.T) {
		hca2.expect(t, mcmrRequest(mad.MethodSet, mad.IPoIBCreateJoinMask, create), mad.StatusSAReqInvalid)
	})

	var groupMLID verbs.LID
	t.Run("Create", func(t *testing.T) {
		create.QKey = verbs.IPoIBQKey
		resp := hca2.expect(t, mcmrRequest(mad.MethodSet, mad.IPoIBCreateJoinMask, create), mad.StatusOK)
		if resp.SA.CompMask != 0x173f7 {
			t.Errorf("mask echoed as %#x", resp.SA.CompMask)
		}
		r := mcmrOf(t, resp)
		t.Logf("created: %+v", r)
		if r.MGID != mdns8001 || r.QKey != verbs.IPoIBQKey || r.MTU != verbs.MTU2048 || r.Rate != 3 ||
			r.JoinState != mad.JoinFull || r.PKey != 0x8001 {
			t.Errorf("group parameters %+v", r)
		}
		// Scope and PacketLifeTime are not in the create mask; OpenSM 3.3.23 keeps
		// the request's values (0) instead of deriving the scope from the MGID.
		if r.Scope != create.Scope || r.PacketLifeTime != create.PacketLifeTime {
			t.Errorf("Scope %d PacketLifeTime %d, want the request's %d/%d", r.Scope, r.PacketLifeTime, create.Scope, create.PacketLifeTime)
		}
		if !r.MLID.IsMulticast() || r.MLID == bcastMLID {
			t.Errorf("MLID %#x (broadcast group has %#x)", r.MLID, bcastMLID)
		}
		groupMLID = r.MLID
	})

	t.Run("SecondMemberJoins", func(t *testing.T) {
		resp := hca3.expect(t, mcmrRequest(mad.MethodSet, mad.IPoIBBroadcastJoinMask, mad.MCMemberRecord{
			MGID: mdns8001, PortGID: gid3, PKey: 0x8001, JoinState: mad.JoinFull,
		}), mad.StatusOK)
		if r := mcmrOf(t, resp); r.MLID != groupMLID || r.PortGID != gid3 {
			t.Errorf("MLID %#x PortGID %v, want %#x %v", r.MLID, r.PortGID, groupMLID, gid3)
		}
	})

	leave := mad.MCMemberRecord{MGID: mdns8001, PortGID: gid2, PKey: 0x8001, JoinState: mad.JoinFull}
	t.Run("Leave", func(t *testing.T) {
		resp := hca2.expect(t, mcmrRequest(mad.MethodDelete, mad.IPoIBBroadcastJoinMask, leave), mad.StatusOK)
		if resp.Method != mad.MethodDeleteResp {
			t.Errorf("method %#x, want DeleteResp 0x95", resp.Method)
		}
		r := mcmrOf(t, resp)
		t.Logf("leave response: JoinState %d MLID %#x", r.JoinState, r.MLID)
		if r.MGID != mdns8001 || r.PortGID != gid2 {
			t.Errorf("record %+v", r)
		}
	})

	t.Run("LeaveAgain", func(t *testing.T) {
		resp := hca2.expect(t, mcmrRequest(mad.MethodDelete, mad.IPoIBBroadcastJoinMask, leave), mad.StatusSAReqInvalid)
		if resp.Method != mad.MethodDeleteResp {
			t.Errorf("method %#x, want DeleteResp 0x95", resp.Method)
		}
	})

	t.Run("KernelLeaveMask", func(t *testing.T) {
		// The last member leaves with the kernel multicast module's mask; the group
		// is then gone and a Get for it finds no records.
		hca3.expect(t, mcmrRequest(mad.MethodDelete, mad.LeaveMask, mad.MCMemberRecord{
			MGID: mdns8001, PortGID: gid3, JoinState: mad.JoinFull,
		}), mad.StatusOK)
		hca3.expect(t, mcmrRequest(mad.MethodGet, mad.CompMCMGID, mad.MCMemberRecord{MGID: mdns8001}), mad.StatusSANoRecords)
	})

	t.Run("GetTableGroup", func(t *testing.T) {
		resp := hca3.expect(t, mcmrRequest(mad.MethodGetTable, mad.CompMCMGID, mad.MCMemberRecord{MGID: bcast8001}), mad.StatusOK)
		recs := resp.TableRecords()
		t.Logf("GetTableResp: RMPP version %d type %d flags %#x seg %d paylen %d, AttrOffset %d, %d record slot(s)",
			resp.SA.RMPPVersion, resp.SA.RMPPType, resp.SA.RMPPRespTimeFlags, resp.SA.SegNum, resp.SA.PayloadLen, resp.SA.AttrOffset, len(recs))
		if resp.SA.AttrOffset != 7 || len(recs) == 0 {
			t.Fatalf("AttrOffset %d, %d records", resp.SA.AttrOffset, len(recs))
		}
		var r mad.MCMemberRecord
		if err := r.Unmarshal(recs[0]); err != nil {
			t.Fatal(err)
		}
		if r.MGID != bcast8001 || r.MLID != bcastMLID || r.QKey != verbs.IPoIBQKey {
			t.Errorf("record %+v", r)
		}
	})

	pathReq := func(mask uint64) mad.SAMAD {
		req := mad.NewSARequest(mad.MethodGet, mad.AttrPathRecord, newTID(), mask)
		pr := mad.PathRecord{DGID: gid3, SGID: gid2, Reversible: true, NumbPath: 1, PKey: 0xffff}
		pr.Marshal(req.Record())
		return req
	}
	checkPath := func(t *testing.T, resp mad.SAMAD) {
		t.Helper()
		var pr mad.PathRecord
		if err := pr.Unmarshal(resp.Record()); err != nil {
			t.Fatal(err)
		}
		t.Logf("path: %+v", pr)
		if resp.SA.AttrOffset != 8 {
			t.Errorf("AttrOffset %d", resp.SA.AttrOffset)
		}
		if pr.DLID != 4 || pr.SLID != 3 || pr.DGID != gid3 || pr.SGID != gid2 || pr.PKey != 0xffff ||
			pr.MTU != verbs.MTU2048 || pr.Rate != 3 || !pr.Reversible || pr.SL != 0 {
			t.Errorf("path %+v", pr)
		}
	}
	t.Run("PathRecord", func(t *testing.T) {
		mask := mad.CompPRDGID | mad.CompPRSGID | mad.CompPRTClass | mad.CompPRReversible | mad.CompPRNumbPath | mad.CompPRPKey
		if mask != 0x3c0c {
			t.Fatalf("mask %#x", mask)
		}
		checkPath(t, hca2.expect(t, pathReq(mask), mad.StatusOK))
	})
	t.Run("PathRecordIPoIBMask", func(t *testing.T) {
		checkPath(t, hca2.expect(t, pathReq(mad.IPoIBPathMask), mad.StatusOK))
	})

	t.Run("BroadcastJoinFFFFMTU2048", func(t *testing.T) {
		// Restart OpenSM with the Default partition at mtu=4: now the kernel's exact
		// broadcast join of P_Key 0xffff succeeds (the README's byte-exact example).
		f.StartOpenSM(t, "Default=0xffff, ipoib, mtu=4 : ALL=full;\nP1=0x8001, ipoib : ALL=full;\n")
		resp := hca2.expect(t, mcmrRequest(mad.MethodSet, mad.IPoIBBroadcastJoinMask, mad.MCMemberRecord{
			MGID: bcastFFFF, PortGID: gid2, PKey: 0xffff, JoinState: mad.JoinFull,
		}), mad.StatusOK)
		r := mcmrOf(t, resp)
		if r.MLID != 0xc000 || r.QKey != verbs.IPoIBQKey || r.MTU != verbs.MTU2048 || r.Scope != mad.ScopeLinkLocal ||
			r.PacketLifeTimeSelector != mad.SelExactly || r.PacketLifeTime != 18 {
			t.Errorf("record %+v", r)
		}
	})
}
