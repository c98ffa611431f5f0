package mad_test

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// Byte-exact MADs captured from OpenSM 3.3.23 on ibsim (shared/tools/ibsim-sa/README.md,
// "Byte-exact example"): 16 hex digits per group, every later byte zero.
const (
	goldenJoinReq = `0103020200000000 0000000012345678 0038000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000010083
		ff12401bffff0000 00000000ffffffff fe80000000000000 0000000000100003 0000000000000000 ffff000000000000 0100000000000000`
	goldenJoinResp = `0103028100000000 0001000012345678 0038000000000000 0000000000000000 0000000000000000 0000000000070000 0000000000010083
		ff12401bffff0000 00000000ffffffff fe80000000000000 0000000000100003 00000b1bc0008400 ffff839200000000 2100000000000000`
	goldenPathReq = `0103020100000000 0000000012345679 0035000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000003c0c
		0000000000000000 fe80000000000000 0000000000100005 fe80000000000000 0000000000100003 0000000000000000 0081ffff00000000`
	goldenPathResp = `0103028100000000 0001000012345679 0035000000000000 0000000000000000 0000000000000000 0000000000080000 0000000000003c0c
		0000000000000000 fe80000000000000 0000000000100005 fe80000000000000 0000000000100003 0004000300000000 0080ffff00008483 92`
)

// goldenMAD decodes one of the hex dumps above into a 256-byte MAD.
func goldenMAD(t *testing.T, s string) []byte {
	t.Helper()
	h := strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatalf("bad golden hex: %v", err)
	}
	if len(b) > mad.Size {
		t.Fatalf("golden MAD is %d bytes", len(b))
	}
	return append(b, make([]byte, mad.Size-len(b))...)
}

func gid(t testing.TB, s string) verbs.GID {
	t.Helper()
	g, err := verbs.ParseGID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func parseSA(t *testing.T, b []byte) mad.SAMAD {
	t.Helper()
	var m mad.SAMAD
	if err := mad.ParseSA(b, &m); err != nil {
		t.Fatalf("ParseSA: %v", err)
	}
	return m
}

func TestGoldenJoinRequest(t *testing.T) {
	raw := goldenMAD(t, goldenJoinReq)
	m := parseSA(t, raw)
	wantHdr := mad.Header{
		BaseVersion: 1, MgmtClass: mad.ClassSA, ClassVersion: mad.SAClassVersion,
		Method: mad.MethodSet, TID: 0x12345678, AttrID: mad.AttrMCMemberRecord,
	}
	if d := cmp.Diff(wantHdr, m.Header); d != "" {
		t.Errorf("header (-want +got):\n%s", d)
	}
	if d := cmp.Diff(mad.SAHeader{CompMask: 0x10083}, m.SA); d != "" {
		t.Errorf("SA header (-want +got):\n%s", d)
	}
	if m.SA.CompMask != mad.IPoIBBroadcastJoinMask {
		t.Errorf("mask %#x, want IPoIBBroadcastJoinMask %#x", m.SA.CompMask, mad.IPoIBBroadcastJoinMask)
	}
	if m.IsResponse() {
		t.Error("request reported as response")
	}
	var rec mad.MCMemberRecord
	if err := rec.Unmarshal(m.Record()); err != nil {
		t.Fatal(err)
	}
	want := mad.MCMemberRecord{
		MGID:      gid(t, "ff12:401b:ffff::ffff:ffff"),
		PortGID:   gid(t, "fe80::10:3"),
		PKey:      0xffff,
		JoinState: mad.JoinFull,
	}
	if d := cmp.Diff(want, rec); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}

	// Encode the same request from fields: it must be byte-identical.
	req := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, 0x12345678, mad.IPoIBBroadcastJoinMask)
	want.Marshal(req.Record())
	if got := req.Bytes(); !bytes.Equal(got, raw) {
		t.Errorf("encoded join request differs:\n got %x\nwant %x", got, raw)
	}
	// And re-marshalling the parsed MAD reproduces it too.
	if got := m.Bytes(); !bytes.Equal(got, raw) {
		t.Errorf("re-marshalled join request differs:\n got %x\nwant %x", got, raw)
	}
}

func TestGoldenJoinResponse(t *testing.T) {
	raw := goldenMAD(t, goldenJoinResp)
	m := parseSA(t, raw)
	if m.Status != mad.StatusOK {
		t.Errorf("status %v", m.Status)
	}
	if m.Method != mad.MethodGetResp || !m.IsResponse() {
		t.Errorf("method %#x, IsResponse %v; want GetResp", m.Method, m.IsResponse())
	}
	if m.TIDLow() != 0x12345678 || m.TID != 0x0001000012345678 {
		t.Errorf("TID %#x", m.TID)
	}
	if m.AttrID != mad.AttrMCMemberRecord || m.MgmtClass != mad.ClassSA || m.ClassVersion != 2 || m.BaseVersion != 1 {
		t.Errorf("header %+v", m.Header)
	}
	if m.SA.AttrOffset != 7 || m.SA.AttrOffset != mad.AttrOffsetFor(mad.MCMemberRecordSize) {
		t.Errorf("AttrOffset %d, want 7", m.SA.AttrOffset)
	}
	if m.SA.CompMask != 0x10083 || m.SA.SMKey != 0 {
		t.Errorf("SA header %+v", m.SA)
	}
	var rec mad.MCMemberRecord
	if err := rec.Unmarshal(m.Record()); err != nil {
		t.Fatal(err)
	}
	want := mad.MCMemberRecord{
		MGID:                   gid(t, "ff12:401b:ffff::ffff:ffff"),
		PortGID:                gid(t, "fe80::10:3"),
		QKey:                   0xb1b,
		MLID:                   0xc000,
		MTUSelector:            mad.SelExactly,
		MTU:                    verbs.MTU2048,
		PKey:                   0xffff,
		RateSelector:           mad.SelExactly,
		Rate:                   3,
		PacketLifeTimeSelector: mad.SelExactly,
		PacketLifeTime:         18, // 0x92
		Scope:                  mad.ScopeLinkLocal,
		JoinState:              mad.JoinFull,
	}
	if d := cmp.Diff(want, rec); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	if got := m.Bytes(); !bytes.Equal(got, raw) {
		t.Errorf("re-marshalled join response differs:\n got %x\nwant %x", got, raw)
	}

	// Build the same response the way an SM would and compare bytes.
	req := parseSA(t, goldenMAD(t, goldenJoinReq))
	resp := req.Response(mad.StatusOK)
	resp.TID = 0x0001000012345678 // the MAD layer's agent bits, as captured
	buf := make([]byte, mad.MCMemberRecordSize)
	want.Marshal(buf)
	if n := resp.SetTableRecords(mad.MCMemberRecordSize, [][]byte{buf}); n != 1 {
		t.Fatalf("SetTableRecords = %d", n)
	}
	if got := resp.Bytes(); !bytes.Equal(got, raw) {
		t.Errorf("SM-built join response differs:\n got %x\nwant %x", got, raw)
	}
}

func TestGoldenPathRequest(t *testing.T) {
	raw := goldenMAD(t, goldenPathReq)
	m := parseSA(t, raw)
	if m.Method != mad.MethodGet || m.AttrID != mad.AttrPathRecord || m.TID != 0x12345679 {
		t.Errorf("header %+v", m.Header)
	}
	wantMask := mad.CompPRDGID | mad.CompPRSGID | mad.CompPRTClass | mad.CompPRReversible | mad.CompPRNumbPath | mad.CompPRPKey
	if m.SA.CompMask != 0x3c0c || wantMask != 0x3c0c {
		t.Errorf("mask %#x, composed %#x, want 0x3c0c", m.SA.CompMask, wantMask)
	}
	if got := mad.IPoIBPathMask | mad.CompPRReversible; got != m.SA.CompMask {
		t.Errorf("IPoIBPathMask|CompPRReversible = %#x", got)
	}
	var rec mad.PathRecord
	if err := rec.Unmarshal(m.Record()); err != nil {
		t.Fatal(err)
	}
	want := mad.PathRecord{
		DGID:       gid(t, "fe80::10:5"),
		SGID:       gid(t, "fe80::10:3"),
		Reversible: true,
		NumbPath:   1,
		PKey:       0xffff,
	}
	if d := cmp.Diff(want, rec); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	req := mad.NewSARequest(mad.MethodGet, mad.AttrPathRecord, 0x12345679, wantMask)
	want.Marshal(req.Record())
	if got := req.Bytes(); !bytes.Equal(got, raw) {
		t.Errorf("encoded path request differs:\n got %x\nwant %x", got, raw)
	}
}

func TestGoldenPathResponse(t *testing.T) {
	raw := goldenMAD(t, goldenPathResp)
	m := parseSA(t, raw)
	if m.Status != mad.StatusOK || m.Method != mad.MethodGetResp || m.TIDLow() != 0x12345679 {
		t.Errorf("header %+v", m.Header)
	}
	if m.SA.AttrOffset != 8 || m.SA.AttrOffset != mad.AttrOffsetFor(mad.PathRecordSize) || m.SA.CompMask != 0x3c0c {
		t.Errorf("SA header %+v", m.SA)
	}
	var rec mad.PathRecord
	if err := rec.Unmarshal(m.Record()); err != nil {
		t.Fatal(err)
	}
	want := mad.PathRecord{
		DGID:                   gid(t, "fe80::10:5"),
		SGID:                   gid(t, "fe80::10:3"),
		DLID:                   4,
		SLID:                   3,
		Reversible:             true,
		NumbPath:               0,
		PKey:                   0xffff,
		MTUSelector:            mad.SelExactly,
		MTU:                    verbs.MTU2048, // 0x84
		RateSelector:           mad.SelExactly,
		Rate:                   3, // 0x83
		PacketLifeTimeSelector: mad.SelExactly,
		PacketLifeTime:         18, // 0x92
	}
	if d := cmp.Diff(want, rec); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	if got := m.Bytes(); !bytes.Equal(got, raw) {
		t.Errorf("re-marshalled path response differs:\n got %x\nwant %x", got, raw)
	}
}
