package mad_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// distinct GIDs whose bytes are all non-zero and differ from each other
func testGID(seed byte) verbs.GID {
	var g verbs.GID
	for i := range g {
		g[i] = seed + byte(i)*3 + 1
	}
	return g
}

func fullMCMemberRecord() mad.MCMemberRecord {
	return mad.MCMemberRecord{
		MGID:                   testGID(0x10),
		PortGID:                testGID(0x80),
		QKey:                   0x8badf00d,
		MLID:                   0xc123,
		MTUSelector:            1,
		MTU:                    0x2d, // 6 bits
		TClass:                 0xa7,
		PKey:                   0x8001,
		RateSelector:           2,
		Rate:                   0x3e,
		PacketLifeTimeSelector: 3,
		PacketLifeTime:         0x15,
		SL:                     0xb,
		FlowLabel:              0xabcde,
		HopLimit:               0x5f,
		Scope:                  0xe,
		JoinState:              0x9,
		ProxyJoin:              true,
	}
}

func fullPathRecord() mad.PathRecord {
	return mad.PathRecord{
		ServiceID:              0x0123456789abcdef,
		DGID:                   testGID(0x20),
		SGID:                   testGID(0x40),
		DLID:                   0x1234,
		SLID:                   0x5678,
		RawTraffic:             true,
		FlowLabel:              0xfedcb,
		HopLimit:               0x3c,
		TClass:                 0xe1,
		Reversible:             true,
		NumbPath:               0x5a,
		PKey:                   0x7fff,
		QoSClass:               0xabc,
		SL:                     0xd,
		MTUSelector:            1,
		MTU:                    0x2a,
		RateSelector:           2,
		Rate:                   0x17,
		PacketLifeTimeSelector: 3,
		PacketLifeTime:         0x2b,
		Preference:             0x99,
	}
}

func fullClassPortInfo() mad.ClassPortInfo {
	return mad.ClassPortInfo{
		BaseVersion:     1,
		ClassVersion:    2,
		CapabilityMask:  0xa5c3,
		CapabilityMask2: 0x5abcdef, // 27 bits
		RespTimeValue:   0x13,
		RedirectGID:     testGID(0x33),
		RedirectTC:      0xc4,
		RedirectSL:      0x9,
		RedirectFL:      0x54321,
		RedirectLID:     0xbeef,
		RedirectPKey:    0x8002,
		RedirectQP:      0xabcdef,
		RedirectQKey:    0x80010000,
		TrapGID:         testGID(0x66),
		TrapTC:          0x3b,
		TrapSL:          0x6,
		TrapFL:          0x12345,
		TrapLID:         0x0102,
		TrapPKey:        0xffff,
		TrapHL:          0x40,
		TrapQP:          0x123456,
		TrapQKey:        0x0b1b0b1b,
	}
}

func TestMCMemberRecordRoundTrip(t *testing.T) {
	in := fullMCMemberRecord()
	b := make([]byte, mad.MCMemberRecordSize)
	in.Marshal(b)
	var out mad.MCMemberRecord
	if err := out.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out); d != "" {
		t.Errorf("round trip (-in +out):\n%s", d)
	}
	want := "" +
		hex.EncodeToString(in.MGID[:]) + hex.EncodeToString(in.PortGID[:]) +
		"8badf00d" + "c123" +
		"6d" + // sel 1, MTU 0x2d
		"a7" + "8001" +
		"be" + // sel 2, rate 0x3e
		"d5" + // sel 3, life 0x15
		"babcde5f" + // SL b | FlowLabel abcde | HopLimit 5f
		"e9" + // scope e, join 9
		"80" + "0000"
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("wire bytes\n got %s\nwant %s", got, want)
	}
}

func TestPathRecordRoundTrip(t *testing.T) {
	in := fullPathRecord()
	b := make([]byte, mad.PathRecordSize)
	in.Marshal(b)
	var out mad.PathRecord
	if err := out.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out); d != "" {
		t.Errorf("round trip (-in +out):\n%s", d)
	}
	want := "0123456789abcdef" +
		hex.EncodeToString(in.DGID[:]) + hex.EncodeToString(in.SGID[:]) +
		"1234" + "5678" +
		"8fedcb3c" + // RawTraffic | FlowLabel fedcb | HopLimit 3c
		"e1" + "da" + // TClass, Reversible|NumbPath 5a
		"7fff" + "abcd" + // P_Key, QoSClass abc | SL d
		"6a" + "97" + "eb" + "99" + // MTU, rate, life (with selectors), preference
		"000000000000"
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("wire bytes\n got %s\nwant %s", got, want)
	}
}

func TestClassPortInfoRoundTrip(t *testing.T) {
	in := fullClassPortInfo()
	b := make([]byte, mad.ClassPortInfoSize)
	in.Marshal(b)
	var out mad.ClassPortInfo
	if err := out.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out); d != "" {
		t.Errorf("round trip (-in +out):\n%s", d)
	}
	want := "0102" + "a5c3" +
		"b579bdf3" + // CapMask2 0x5abcdef<<5 | RespTime 0x13
		hex.EncodeToString(in.RedirectGID[:]) +
		"c4954321" + "beef" + "8002" + "00abcdef" + "80010000" +
		hex.EncodeToString(in.TrapGID[:]) +
		"3b612345" + "0102" + "ffff" + "40123456" + "0b1b0b1b"
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("wire bytes\n got %s\nwant %s", got, want)
	}
}

// Out-of-range values are masked to their field width and never leak into neighbours.
func TestMarshalMasksOverwideFields(t *testing.T) {
	t.Run("MCMemberRecord", func(t *testing.T) {
		r := mad.MCMemberRecord{
			MTUSelector: 0xff, MTU: 0xff, RateSelector: 0xfe, Rate: 0xff,
			PacketLifeTimeSelector: 0xfd, PacketLifeTime: 0xff,
			SL: 0xff, FlowLabel: 0xffffffff, Scope: 0xff, JoinState: 0xff,
		}
		b := make([]byte, mad.MCMemberRecordSize)
		r.Marshal(b)
		if got := hex.EncodeToString(b[36:52]); got != "0000ff000000bf7fffffff00ff000000" {
			t.Errorf("bytes 36..51 = %s", got)
		}
		// Each over-wide field alone sets exactly its own bits.
		for _, c := range []struct {
			name string
			r    mad.MCMemberRecord
			want map[int]byte // non-zero bytes among 32..51
		}{
			{"MTU", mad.MCMemberRecord{MTU: 0xff}, map[int]byte{38: 0x3f}},
			{"MTUSelector", mad.MCMemberRecord{MTUSelector: 0xff}, map[int]byte{38: 0xc0}},
			{"Rate", mad.MCMemberRecord{Rate: 0xff}, map[int]byte{42: 0x3f}},
			{"PacketLifeTimeSelector", mad.MCMemberRecord{PacketLifeTimeSelector: 0xff}, map[int]byte{43: 0xc0}},
			{"SL", mad.MCMemberRecord{SL: 0xff}, map[int]byte{44: 0xf0}},
			{"FlowLabel", mad.MCMemberRecord{FlowLabel: 0xffffffff}, map[int]byte{44: 0x0f, 45: 0xff, 46: 0xff}},
			{"HopLimit", mad.MCMemberRecord{HopLimit: 0xff}, map[int]byte{47: 0xff}},
			{"Scope", mad.MCMemberRecord{Scope: 0xff}, map[int]byte{48: 0xf0}},
			{"JoinState", mad.MCMemberRecord{JoinState: 0xff}, map[int]byte{48: 0x0f}},
			{"ProxyJoin", mad.MCMemberRecord{ProxyJoin: true}, map[int]byte{49: 0x80}},
		} {
			b := bytes.Repeat([]byte{0xaa}, mad.MCMemberRecordSize)
			c.r.Marshal(b)
			checkBytes(t, c.name, b, 32, c.want)
		}
	})
	t.Run("PathRecord", func(t *testing.T) {
		for _, c := range []struct {
			name string
			r    mad.PathRecord
			want map[int]byte // non-zero bytes among 40..63
		}{
			{"FlowLabel", mad.PathRecord{FlowLabel: 0xffffffff}, map[int]byte{44: 0x0f, 45: 0xff, 46: 0xff}},
			{"RawTraffic", mad.PathRecord{RawTraffic: true}, map[int]byte{44: 0x80}},
			{"HopLimit", mad.PathRecord{HopLimit: 0xff}, map[int]byte{47: 0xff}},
			{"NumbPath", mad.PathRecord{NumbPath: 0xff}, map[int]byte{49: 0x7f}},
			{"Reversible", mad.PathRecord{Reversible: true}, map[int]byte{49: 0x80}},
			{"QoSClass", mad.PathRecord{QoSClass: 0xffff}, map[int]byte{52: 0xff, 53: 0xf0}},
			{"SL", mad.PathRecord{SL: 0xff}, map[int]byte{53: 0x0f}},
			{"MTU", mad.PathRecord{MTU: 0xff}, map[int]byte{54: 0x3f}},
			{"RateSelector", mad.PathRecord{RateSelector: 0xff}, map[int]byte{55: 0xc0}},
			{"PacketLifeTime", mad.PathRecord{PacketLifeTime: 0xff}, map[int]byte{56: 0x3f}},
			{"Preference", mad.PathRecord{Preference: 0xff}, map[int]byte{57: 0xff}},
		} {
			b := bytes.Repeat([]byte{0xaa}, mad.PathRecordSize)
			c.r.Marshal(b)
			checkBytes(t, c.name, b, 40, c.want)
		}
	})
	t.Run("ClassPortInfo", func(t *testing.T) {
		c := mad.ClassPortInfo{CapabilityMask2: 0xffffffff, RedirectSL: 0xff, RedirectFL: 0xffffffff, TrapQP: 0xffffffff}
		b := make([]byte, mad.ClassPortInfoSize)
		c.Marshal(b)
		if got := hex.EncodeToString(b[4:8]); got != "ffffffe0" {
			t.Errorf("CapMask2/RespTime = %s", got)
		}
		if got := hex.EncodeToString(b[24:28]); got != "00ffffff" {
			t.Errorf("Redirect TC/SL/FL = %s", got)
		}
		if got := hex.EncodeToString(b[64:68]); got != "00ffffff" {
			t.Errorf("Trap HL/QP = %s", got)
		}
	})
}

// checkBytes asserts that b[from:] is zero except for the bytes in want.
func checkBytes(t *testing.T, name string, b []byte, from int, want map[int]byte) {
	t.Helper()
	for i := from; i < len(b); i++ {
		if b[i] != want[i] {
			t.Errorf("%s: byte %d = %#02x, want %#02x (bytes %d.. = %x)", name, i, b[i], want[i], from, b[from:])
			return
		}
	}
}

func TestUnmarshalShort(t *testing.T) {
	var mc mad.MCMemberRecord
	var pr mad.PathRecord
	var cpi mad.ClassPortInfo
	var h mad.Header
	var sa mad.SAMAD
	for name, err := range map[string]error{
		"MCMemberRecord": mc.Unmarshal(make([]byte, mad.MCMemberRecordSize-1)),
		"PathRecord":     pr.Unmarshal(make([]byte, mad.PathRecordSize-1)),
		"ClassPortInfo":  cpi.Unmarshal(make([]byte, mad.ClassPortInfoSize-1)),
		"Header":         mad.ParseHeader(make([]byte, mad.HeaderSize-1), &h),
		"SA":             mad.ParseSA(make([]byte, mad.Size-1), &sa),
		"SA nil":         mad.ParseSA(nil, &sa),
	} {
		if !errors.Is(err, mad.ErrShort) {
			t.Errorf("%s: err = %v, want ErrShort", name, err)
		}
	}
	if err := mad.ParseHeader(make([]byte, mad.HeaderSize), &h); err != nil {
		t.Errorf("ParseHeader(24 bytes): %v", err)
	}
	if err := mad.ParseSA(make([]byte, mad.Size+40), &sa); err != nil {
		t.Errorf("ParseSA(296 bytes): %v", err)
	}
}

func TestSAMADRoundTrip(t *testing.T) {
	in := mad.SAMAD{
		Header: mad.Header{
			BaseVersion: 0x11, MgmtClass: 0x22, ClassVersion: 0x33, Method: 0x44,
			Status: 0x5566, ClassSpecific: 0x7788, TID: 0x99aabbccddeeff01,
			AttrID: 0x0203, AttrMod: 0x04050607,
		},
		SA: mad.SAHeader{
			RMPPVersion: 0x08, RMPPType: 0x09, RMPPRespTimeFlags: 0x0a, RMPPStatus: 0x0b,
			SegNum: 0x0c0d0e0f, PayloadLen: 0x10111213, SMKey: 0x1415161718191a1b,
			AttrOffset: 0x1c1d, CompMask: 0x1e1f202122232425,
		},
	}
	for i := range in.Data {
		in.Data[i] = byte(0x26 + i)
	}
	b := in.Bytes()
	if len(b) != mad.Size {
		t.Fatalf("len %d", len(b))
	}
	want := "1122334455667788" + "99aabbccddeeff01" + "0203000004050607" +
		"08090a0b0c0d0e0f" + "101112131415161718191a1b" + "1c1d0000" + "1e1f202122232425"
	if got := hex.EncodeToString(b[:mad.SADataOffset]); got != want {
		t.Errorf("headers\n got %s\nwant %s", got, want)
	}
	if !bytes.Equal(b[mad.SADataOffset:], in.Data[:]) {
		t.Error("data area not at offset 56")
	}
	var out mad.SAMAD
	if err := mad.ParseSA(b, &out); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out); d != "" {
		t.Errorf("round trip (-in +out):\n%s", d)
	}
	// Reserved fields are ignored when reading and zeroed when writing.
	b[18], b[19], b[46], b[47] = 0xff, 0xff, 0xff, 0xff
	if err := mad.ParseSA(b, &out); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out); d != "" {
		t.Errorf("reserved bytes changed the parse (-in +out):\n%s", d)
	}
	buf := bytes.Repeat([]byte{0xee}, mad.Size)
	out.Marshal(buf)
	if buf[18]|buf[19]|buf[46]|buf[47] != 0 {
		t.Errorf("reserved bytes not zeroed: %x %x", buf[18:20], buf[46:48])
	}
}

func TestHeaderIsResponse(t *testing.T) {
	for m, want := range map[uint8]bool{
		mad.MethodGet: false, mad.MethodSet: false, mad.MethodGetTable: false, mad.MethodDelete: false,
		mad.MethodGetResp: true, mad.MethodGetTableResp: true, mad.MethodDeleteResp: true, mad.MethodReportResp: true,
	} {
		if got := (mad.Header{Method: m}).IsResponse(); got != want {
			t.Errorf("method %#x: IsResponse %v", m, got)
		}
	}
}

func TestResponseMethod(t *testing.T) {
	for req, want := range map[uint8]uint8{
		mad.MethodGet:           0x81,
		mad.MethodSet:           0x81,
		mad.MethodGetTable:      0x92,
		mad.MethodGetTraceTable: 0x93,
		mad.MethodGetMulti:      0x94,
		mad.MethodDelete:        0x95,
		mad.MethodReport:        0x86,
		mad.MethodTrap:          mad.MethodTrapRepress,
		mad.MethodSend:          0x83,
	} {
		if got := mad.ResponseMethod(req); got != want {
			t.Errorf("ResponseMethod(%#x) = %#x, want %#x", req, got, want)
		}
	}
}

func TestResponse(t *testing.T) {
	req := mad.NewSARequest(mad.MethodDelete, mad.AttrMCMemberRecord, 0xabcdef0012345678, mad.LeaveMask)
	req.AttrMod = 7
	req.ClassSpecific = 0x1234
	req.SA.SMKey = 1
	req.SA.AttrOffset = 7
	req.SA.RMPPVersion = 1
	req.SA.RMPPRespTimeFlags = 0x07
	req.Data[0] = 0xff
	resp := req.Response(mad.StatusSAReqInvalid)
	want := mad.SAMAD{
		Header: mad.Header{
			BaseVersion: 1, MgmtClass: mad.ClassSA, ClassVersion: 2, Method: mad.MethodDeleteResp,
			Status: mad.StatusSAReqInvalid, ClassSpecific: 0x1234, TID: 0xabcdef0012345678,
			AttrID: mad.AttrMCMemberRecord, AttrMod: 7,
		},
		SA: mad.SAHeader{CompMask: 0x10003},
	}
	if d := cmp.Diff(want, resp); d != "" {
		t.Errorf("Response (-want +got):\n%s", d)
	}
	errResp := req.ErrorResponse(mad.StatusSAReqInvalid)
	want.Data = req.Data
	if d := cmp.Diff(want, errResp); d != "" {
		t.Errorf("ErrorResponse (-want +got):\n%s", d)
	}
	set := mad.NewSARequest(mad.MethodSet, mad.AttrMCMemberRecord, 1, 0)
	if got := set.Response(mad.StatusOK).Method; got != mad.MethodGetResp {
		t.Errorf("Set response method %#x, want GetResp", got)
	}
}

func TestNewSARequest(t *testing.T) {
	m := mad.NewSARequest(mad.MethodGetTable, mad.AttrPathRecord, 0x1122334455667788, 0x3c0c)
	want := "0103021200000000" + "1122334455667788" + "0035000000000000" +
		strings.Repeat("00", 24) + "0000000000003c0c" + strings.Repeat("00", 200)
	if got := hex.EncodeToString(m.Bytes()); got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

func TestMasks(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"IPoIBBroadcastJoinMask", mad.IPoIBBroadcastJoinMask, 0x10083},
		{"IPoIBCreateJoinMask", mad.IPoIBCreateJoinMask, 0x173f7},
		{"LeaveMask", mad.LeaveMask, 0x10003},
		{"IPoIBPathMask", mad.IPoIBPathMask, 0x340c},
		{"CompMCProxyJoin", mad.CompMCProxyJoin, 1 << 17},
		{"CompMCScope", mad.CompMCScope, 0x8000},
		{"CompPRServiceID", mad.CompPRServiceID, 3},
		{"CompPRPKey", mad.CompPRPKey, 0x2000},
		{"CompPRPacketLifeTime", mad.CompPRPacketLifeTime, 1 << 21},
		{"CompPRPreference", mad.CompPRPreference, 1 << 22},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if mad.CapMask2SendOnlyFullMemberSupport != 1<<12 {
		t.Errorf("CapMask2SendOnlyFullMemberSupport = %#x", mad.CapMask2SendOnlyFullMemberSupport)
	}
}

func TestStatusString(t *testing.T) {
	for s, want := range map[mad.Status]string{
		mad.StatusOK:                       "success",
		mad.StatusBusy:                     "busy (0x0001)",
		mad.StatusRedirect:                 "redirect (0x0002)",
		mad.StatusBadVersion:               "bad version (0x0004)",
		mad.StatusBadMethod:                "method not supported (0x0008)",
		mad.StatusBadMethodAttr:            "method/attribute not supported (0x000c)",
		mad.StatusInvalidField:             "invalid field value (0x001c)",
		mad.StatusSANoResources:            "SA no resources (0x0100)",
		mad.StatusSAReqInvalid:             "SA request invalid (0x0200)",
		mad.StatusSANoRecords:              "SA no records (0x0300)",
		mad.StatusSATooManyRecords:         "SA too many records (0x0400)",
		mad.StatusSAInvalidGID:             "SA invalid GID (0x0500)",
		mad.StatusSAInsufficientComponents: "SA insufficient components (0x0600)",
		mad.StatusSADenied:                 "SA request denied (0x0700)",
		0x0301:                             "busy, SA no records (0x0301)",
		0x0010:                             "field code 4 (0x0010)",
		0x4200:                             "class code 0x42 (0x4200)",
		0x0020:                             "reserved bits (0x0020)",
	} {
		if got := s.String(); got != want {
			t.Errorf("Status(%#04x).String() = %q, want %q", uint16(s), got, want)
		}
	}
	if c := mad.StatusSAInsufficientComponents.ClassCode(); c != 6 {
		t.Errorf("ClassCode = %d", c)
	}
	if c := mad.StatusInvalidField.FieldCode(); c != 7 {
		t.Errorf("FieldCode = %d", c)
	}
}

func TestSetTableRecords(t *testing.T) {
	recs := make([][]byte, 5)
	for i := range recs {
		recs[i] = bytes.Repeat([]byte{byte(i + 1)}, mad.MCMemberRecordSize)
	}
	var m mad.SAMAD
	m.Data[199] = 0xee // stale data must be cleared
	n := m.SetTableRecords(mad.MCMemberRecordSize, recs)
	if n != 3 { // 3*56 = 168 <= 200 < 4*56
		t.Fatalf("n = %d, want 3", n)
	}
	if m.SA.AttrOffset != 7 {
		t.Errorf("AttrOffset %d", m.SA.AttrOffset)
	}
	for i := 0; i < 3; i++ {
		slot := m.Data[i*56 : (i+1)*56]
		if !bytes.Equal(slot[:52], recs[i]) || !bytes.Equal(slot[52:], make([]byte, 4)) {
			t.Errorf("slot %d = %x", i, slot)
		}
	}
	if !bytes.Equal(m.Data[168:], make([]byte, 32)) {
		t.Errorf("tail not zero: %x", m.Data[168:])
	}

	got := m.TableRecords()
	if len(got) != 3 || !bytes.Equal(got[1][:52], recs[1]) {
		t.Errorf("TableRecords without RMPP: %d records", len(got))
	}
	m.SetSingleSegmentRMPP(2)
	want := mad.SAHeader{
		RMPPVersion: 1, RMPPType: mad.RMPPTypeData, RMPPRespTimeFlags: 0x07,
		SegNum: 1, PayloadLen: 20 + 2*56, AttrOffset: 7,
	}
	if d := cmp.Diff(want, m.SA); d != "" {
		t.Errorf("RMPP header (-want +got):\n%s", d)
	}
	if got := m.TableRecords(); len(got) != 2 || !bytes.Equal(got[0][:52], recs[0]) {
		t.Errorf("TableRecords with RMPP: %d records", len(got))
	}

	// PathRecords: stride 64, three fit; a short record is zero padded.
	n = m.SetTableRecords(mad.PathRecordSize, [][]byte{{1, 2, 3}, bytes.Repeat([]byte{9}, 64)})
	if n != 2 || m.SA.AttrOffset != 8 || m.Data[0] != 1 || m.Data[3] != 0 || m.Data[64] != 9 || m.Data[128] != 0 {
		t.Errorf("path records: n=%d offset=%d data=%x", n, m.SA.AttrOffset, m.Data[:130])
	}
	// ClassPortInfo-sized records: stride 72, two fit.
	if n := m.SetTableRecords(mad.ClassPortInfoSize, recs); n != 2 {
		t.Errorf("72-byte records: n=%d", n)
	}
	// Records that fill the data area exactly all fit.
	for _, c := range []struct{ size, n, want int }{{40, 6, 5}, {96, 3, 2}, {100, 3, 1}, {200, 2, 1}, {8, 30, 25}, {201, 1, 0}} {
		recs := make([][]byte, c.n)
		for i := range recs {
			recs[i] = bytes.Repeat([]byte{0x5a}, c.size)
		}
		if n := m.SetTableRecords(c.size, recs); n != c.want {
			t.Errorf("SetTableRecords(%d, %d records) = %d, want %d", c.size, c.n, n, c.want)
		}
	}
	if n := m.SetTableRecords(0, recs); n != 0 || m.SA.AttrOffset != 0 || m.TableRecords() != nil {
		t.Errorf("size 0: n=%d", n)
	}
}
