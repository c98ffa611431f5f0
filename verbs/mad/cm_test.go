package mad_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/wire"
)

// pattern returns n bytes seed, seed+7, seed+14 ... (mod 256).
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func fullCMREQ() *mad.CMREQ {
	r := &mad.CMREQ{
		LocalCommID:             0x11223344,
		ServiceID:               0x1000000000abcdef,
		LocalCAGUID:             0x0002c90300a1b2c3,
		LocalQKey:               0x0badcafe,
		LocalQPN:                0xabcdef,
		ResponderResources:      0x44,
		LocalEECN:               0x123456,
		InitiatorDepth:          0x55,
		RemoteEECN:              0x654321,
		RemoteCMResponseTimeout: 0x15,
		TransportServiceType:    3,
		EndToEndFlowControl:     true,
		StartingPSN:             0xfedcba,
		LocalCMResponseTimeout:  0x1b,
		RetryCount:              6,
		PKey:                    0x8001,
		PathMTU:                 0x9,
		RDCExists:               true,
		RNRRetryCount:           5,
		MaxCMRetries:            0xe,
		SRQ:                     true,
		ExtendedTransportType:   5,
		Primary: mad.CMPath{
			LocalLID: 0x0102, RemoteLID: 0x0304, LocalGID: testGID(0x10), RemoteGID: testGID(0x30),
			FlowLabel: 0xabcde, PacketRate: 0x2b, TrafficClass: 0x77, HopLimit: 0x88, SL: 0xc,
			SubnetLocal: true, LocalACKTimeout: 0x13,
		},
		Alternate: mad.CMPath{
			LocalLID: 0x0506, RemoteLID: 0x0708, LocalGID: testGID(0x50), RemoteGID: testGID(0x70),
			FlowLabel: 0x54321, PacketRate: 0x31, TrafficClass: 0x99, HopLimit: 0xaa, SL: 0x5,
			SubnetLocal: true, LocalACKTimeout: 0x1d,
		},
		SAPSupported: true,
	}
	copy(r.PrivateData[:], pattern(mad.CMREQPrivateDataSize, 0x21))
	return r
}

func fullCMMRA() *mad.CMMRA {
	m := &mad.CMMRA{LocalCommID: 0xa1a2a3a4, RemoteCommID: 0xb1b2b3b4, MessageMRAed: 2, ServiceTimeout: 0x17}
	copy(m.PrivateData[:], pattern(mad.CMMRAPrivateDataSize, 0x31))
	return m
}

func fullCMREJ() *mad.CMREJ {
	r := &mad.CMREJ{LocalCommID: 0xc1c2c3c4, RemoteCommID: 0xd1d2d3d4, MessageRejected: 1,
		RejectInfoLength: 0x48, Reason: mad.RejConsumerDefined}
	copy(r.ARI[:], pattern(mad.CMREJARISize, 0x41))
	copy(r.PrivateData[:], pattern(mad.CMREJPrivateDataSize, 0x51))
	return r
}

func fullCMREP() *mad.CMREP {
	r := &mad.CMREP{
		LocalCommID: 0xe1e2e3e4, RemoteCommID: 0xf1f2f3f4, LocalQKey: 0x01020304, LocalQPN: 0x0a0b0c,
		LocalEECN: 0x0d0e0f, StartingPSN: 0x9abcde, ResponderResources: 0x66, InitiatorDepth: 0x77,
		TargetACKDelay: 0x1e, FailoverAccepted: 2, EndToEndFlowControl: true, RNRRetryCount: 7,
		SRQ: true, LocalCAGUID: 0x0011223344556677,
	}
	copy(r.PrivateData[:], pattern(mad.CMREPPrivateDataSize, 0x61))
	return r
}

func fullCMRTU() *mad.CMRTU {
	r := &mad.CMRTU{LocalCommID: 0x12345678, RemoteCommID: 0x9abcdef0}
	copy(r.PrivateData[:], pattern(mad.CMRTUPrivateDataSize, 0x71))
	return r
}

func fullCMDREQ() *mad.CMDREQ {
	r := &mad.CMDREQ{LocalCommID: 0x0f0e0d0c, RemoteCommID: 0x0b0a0908, RemoteQPN: 0xfeed01}
	copy(r.PrivateData[:], pattern(mad.CMDREQPrivateDataSize, 0x81))
	return r
}

func fullCMDREP() *mad.CMDREP {
	r := &mad.CMDREP{LocalCommID: 0x76543210, RemoteCommID: 0xfedcba98}
	copy(r.PrivateData[:], pattern(mad.CMDREPPrivateDataSize, 0x91))
	return r
}

func fullCMMessages() []mad.CMMessage {
	return []mad.CMMessage{fullCMREQ(), fullCMMRA(), fullCMREJ(), fullCMREP(), fullCMRTU(), fullCMDREQ(), fullCMDREP()}
}

func TestCMRoundTrip(t *testing.T) {
	for _, m := range fullCMMessages() {
		t.Run(fmt.Sprintf("%#04x", m.AttrID()), func(t *testing.T) {
			b := make([]byte, mad.CMDataSize)
			m.Marshal(b)
			got := mad.NewCMMessage(m.AttrID())
			if err := got.Unmarshal(b); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(m, got); d != "" {
				t.Errorf("round trip (-want +got):\n%s", d)
			}

			// And as a whole MAD.
			const tid = 0x0000_0001_dead_beef
			raw := mad.NewCMMAD(tid, m)
			if len(raw) != mad.Size || !bytes.Equal(raw[mad.CMDataOffset:], b) {
				t.Fatalf("NewCMMAD: %d bytes, data %x", len(raw), raw[mad.CMDataOffset:])
			}
			h, msg, err := mad.ParseCM(raw)
			if err != nil {
				t.Fatal(err)
			}
			want := mad.Header{BaseVersion: 1, MgmtClass: mad.ClassCM, ClassVersion: 2, Method: mad.MethodSend,
				TID: tid, AttrID: m.AttrID()}
			if d := cmp.Diff(want, h); d != "" {
				t.Errorf("header (-want +got):\n%s", d)
			}
			if d := cmp.Diff(m, msg); d != "" {
				t.Errorf("ParseCM (-want +got):\n%s", d)
			}
		})
	}
}

func TestCMShortAndUnknown(t *testing.T) {
	for _, m := range fullCMMessages() {
		if err := m.Unmarshal(make([]byte, mad.CMDataSize-1)); !errors.Is(err, mad.ErrShort) {
			t.Errorf("%T.Unmarshal(231 bytes) = %v, want ErrShort", m, err)
		}
	}
	if _, _, err := mad.ParseCM(make([]byte, mad.Size-1)); !errors.Is(err, mad.ErrShort) {
		t.Errorf("ParseCM(255 bytes) = %v", err)
	}
	b := make([]byte, mad.Size)
	binary.BigEndian.PutUint16(b[16:], mad.AttrCMLAP)
	h, msg, err := mad.ParseCM(b)
	if !errors.Is(err, mad.ErrUnknownCMAttr) || msg != nil || h.AttrID != mad.AttrCMLAP {
		t.Errorf("ParseCM(LAP) = %+v, %v, %v", h, msg, err)
	}
}

// TestCMMasksOverwideFields: values wider than their field never spill over.
func TestCMMasksOverwideFields(t *testing.T) {
	req := &mad.CMREQ{LocalQPN: 0xffffffff, StartingPSN: 0xffffffff, RemoteEECN: 0xffffffff,
		LocalEECN: 0xffffffff, PathMTU: 0xff, RNRRetryCount: 0xff, RetryCount: 0xff,
		MaxCMRetries: 0xff, ExtendedTransportType: 0xff, TransportServiceType: 0xff,
		RemoteCMResponseTimeout: 0xff, LocalCMResponseTimeout: 0xff,
		Primary: mad.CMPath{FlowLabel: 0xffffffff, PacketRate: 0xff, SL: 0xff, LocalACKTimeout: 0xff}}
	b := make([]byte, mad.CMDataSize)
	req.Marshal(b)
	checkBytes(t, "REQ", b, 0, map[int]byte{
		32: 0xff, 33: 0xff, 34: 0xff, 35: 0, // local QPN, responder resources
		36: 0xff, 37: 0xff, 38: 0xff, 39: 0, // local EECN, initiator depth
		40: 0xff, 41: 0xff, 42: 0xff, 43: 0xfe, // remote EECN, timeout, type; flow control clear
		44: 0xff, 45: 0xff, 46: 0xff, 47: 0xff,
		50: 0xf7, 51: 0xf7, // RDC and SRQ stay clear
		88: 0xff, 89: 0xff, 90: 0xf0, 91: 0x3f, 94: 0xf0, 95: 0xf8,
	})
	rep := &mad.CMREP{LocalQPN: 0xffffffff, LocalEECN: 0xffffffff, StartingPSN: 0xffffffff,
		TargetACKDelay: 0xff, FailoverAccepted: 0xff, RNRRetryCount: 0xff}
	rep.Marshal(b)
	checkBytes(t, "REP", b, 0, map[int]byte{12: 0xff, 13: 0xff, 14: 0xff, 15: 0, 16: 0xff, 17: 0xff, 18: 0xff, 19: 0,
		20: 0xff, 21: 0xff, 22: 0xff, 23: 0, 26: 0xfe, 27: 0xe0})
	rej := &mad.CMREJ{MessageRejected: 0xff, RejectInfoLength: 0xff}
	rej.Marshal(b)
	checkBytes(t, "REJ", b, 0, map[int]byte{8: 0xc0, 9: 0xfe})
	mra := &mad.CMMRA{MessageMRAed: 0xff, ServiceTimeout: 0xff}
	mra.Marshal(b)
	checkBytes(t, "MRA", b, 0, map[int]byte{8: 0xc0, 9: 0xf8})
	dreq := &mad.CMDREQ{RemoteQPN: 0xffffffff}
	dreq.Marshal(b)
	checkBytes(t, "DREQ", b, 0, map[int]byte{8: 0xff, 9: 0xff, 10: 0xff, 11: 0})
}

// ---- independent layout: IBA vol. 1 tables 106-113 ----
//
// Each field is given the way the IBA tables (and the kernel's ibta_vol1_c12.h) give
// it: byte offset into the message (after the 24-byte MAD header), bit offset within
// that byte counted from the most significant bit, and width in bits. setBits places a
// value there without sharing any code with cm.go.

type cmField struct {
	name         string
	byteOff, bit int
	width        int    // bits
	val          uint64 // for width <= 64
	raw          []byte // for GIDs, ARI and private data (width = 8*len)
}

func setBits(b []byte, f cmField) {
	if f.raw != nil {
		if f.bit != 0 || f.width != 8*len(f.raw) {
			panic("bad raw field " + f.name)
		}
		copy(b[f.byteOff:], f.raw)
		return
	}
	for i := 0; i < f.width; i++ {
		p := f.byteOff*8 + f.bit + i
		if f.val>>(f.width-1-i)&1 != 0 {
			b[p/8] |= 0x80 >> (p % 8)
		}
	}
}

func b2u(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func gidRaw(g verbs.GID) []byte { return g[:] }

func pathFields(prefix string, off int, p mad.CMPath) []cmField {
	return []cmField{
		{prefix + "LocalLID", off, 0, 16, uint64(p.LocalLID), nil},
		{prefix + "RemoteLID", off + 2, 0, 16, uint64(p.RemoteLID), nil},
		{prefix + "LocalGID", off + 4, 0, 128, 0, gidRaw(p.LocalGID)},
		{prefix + "RemoteGID", off + 20, 0, 128, 0, gidRaw(p.RemoteGID)},
		{prefix + "FlowLabel", off + 36, 0, 20, uint64(p.FlowLabel), nil},
		{prefix + "PacketRate", off + 39, 2, 6, uint64(p.PacketRate), nil},
		{prefix + "TrafficClass", off + 40, 0, 8, uint64(p.TrafficClass), nil},
		{prefix + "HopLimit", off + 41, 0, 8, uint64(p.HopLimit), nil},
		{prefix + "SL", off + 42, 0, 4, uint64(p.SL), nil},
		{prefix + "SubnetLocal", off + 42, 4, 1, b2u(p.SubnetLocal), nil},
		{prefix + "LocalACKTimeout", off + 43, 0, 5, uint64(p.LocalACKTimeout), nil},
	}
}

// cmLayout lists the fields of m with m's values, as the spec places them.
func cmLayout(m mad.CMMessage) []cmField {
	switch m := m.(type) {
	case *mad.CMREQ:
		f := []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"ServiceID", 8, 0, 64, m.ServiceID, nil},
			{"LocalCAGUID", 16, 0, 64, uint64(m.LocalCAGUID), nil},
			{"LocalQKey", 28, 0, 32, uint64(m.LocalQKey), nil},
			{"LocalQPN", 32, 0, 24, uint64(m.LocalQPN), nil},
			{"ResponderResources", 35, 0, 8, uint64(m.ResponderResources), nil},
			{"LocalEECN", 36, 0, 24, uint64(m.LocalEECN), nil},
			{"InitiatorDepth", 39, 0, 8, uint64(m.InitiatorDepth), nil},
			{"RemoteEECN", 40, 0, 24, uint64(m.RemoteEECN), nil},
			{"RemoteCMResponseTimeout", 43, 0, 5, uint64(m.RemoteCMResponseTimeout), nil},
			{"TransportServiceType", 43, 5, 2, uint64(m.TransportServiceType), nil},
			{"EndToEndFlowControl", 43, 7, 1, b2u(m.EndToEndFlowControl), nil},
			{"StartingPSN", 44, 0, 24, uint64(m.StartingPSN), nil},
			{"LocalCMResponseTimeout", 47, 0, 5, uint64(m.LocalCMResponseTimeout), nil},
			{"RetryCount", 47, 5, 3, uint64(m.RetryCount), nil},
			{"PKey", 48, 0, 16, uint64(m.PKey), nil},
			{"PathMTU", 50, 0, 4, uint64(m.PathMTU), nil},
			{"RDCExists", 50, 4, 1, b2u(m.RDCExists), nil},
			{"RNRRetryCount", 50, 5, 3, uint64(m.RNRRetryCount), nil},
			{"MaxCMRetries", 51, 0, 4, uint64(m.MaxCMRetries), nil},
			{"SRQ", 51, 4, 1, b2u(m.SRQ), nil},
			{"ExtendedTransportType", 51, 5, 3, uint64(m.ExtendedTransportType), nil},
		}
		f = append(f, pathFields("Primary.", 52, m.Primary)...)
		f = append(f, pathFields("Alternate.", 96, m.Alternate)...)
		return append(f,
			cmField{"SAPSupported", 139, 5, 1, b2u(m.SAPSupported), nil},
			cmField{"PrivateData", 140, 0, 92 * 8, 0, m.PrivateData[:]})
	case *mad.CMMRA:
		return []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"RemoteCommID", 4, 0, 32, uint64(m.RemoteCommID), nil},
			{"MessageMRAed", 8, 0, 2, uint64(m.MessageMRAed), nil},
			{"ServiceTimeout", 9, 0, 5, uint64(m.ServiceTimeout), nil},
			{"PrivateData", 10, 0, 222 * 8, 0, m.PrivateData[:]},
		}
	case *mad.CMREJ:
		return []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"RemoteCommID", 4, 0, 32, uint64(m.RemoteCommID), nil},
			{"MessageRejected", 8, 0, 2, uint64(m.MessageRejected), nil},
			{"RejectInfoLength", 9, 0, 7, uint64(m.RejectInfoLength), nil},
			{"Reason", 10, 0, 16, uint64(m.Reason), nil},
			{"ARI", 12, 0, 72 * 8, 0, m.ARI[:]},
			{"PrivateData", 84, 0, 148 * 8, 0, m.PrivateData[:]},
		}
	case *mad.CMREP:
		return []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"RemoteCommID", 4, 0, 32, uint64(m.RemoteCommID), nil},
			{"LocalQKey", 8, 0, 32, uint64(m.LocalQKey), nil},
			{"LocalQPN", 12, 0, 24, uint64(m.LocalQPN), nil},
			{"LocalEECN", 16, 0, 24, uint64(m.LocalEECN), nil},
			{"StartingPSN", 20, 0, 24, uint64(m.StartingPSN), nil},
			{"ResponderResources", 24, 0, 8, uint64(m.ResponderResources), nil},
			{"InitiatorDepth", 25, 0, 8, uint64(m.InitiatorDepth), nil},
			{"TargetACKDelay", 26, 0, 5, uint64(m.TargetACKDelay), nil},
			{"FailoverAccepted", 26, 5, 2, uint64(m.FailoverAccepted), nil},
			{"EndToEndFlowControl", 26, 7, 1, b2u(m.EndToEndFlowControl), nil},
			{"RNRRetryCount", 27, 0, 3, uint64(m.RNRRetryCount), nil},
			{"SRQ", 27, 3, 1, b2u(m.SRQ), nil},
			{"LocalCAGUID", 28, 0, 64, uint64(m.LocalCAGUID), nil},
			{"PrivateData", 36, 0, 196 * 8, 0, m.PrivateData[:]},
		}
	case *mad.CMRTU:
		return []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"RemoteCommID", 4, 0, 32, uint64(m.RemoteCommID), nil},
			{"PrivateData", 8, 0, 224 * 8, 0, m.PrivateData[:]},
		}
	case *mad.CMDREQ:
		return []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"RemoteCommID", 4, 0, 32, uint64(m.RemoteCommID), nil},
			{"RemoteQPN", 8, 0, 24, uint64(m.RemoteQPN), nil},
			{"PrivateData", 12, 0, 220 * 8, 0, m.PrivateData[:]},
		}
	case *mad.CMDREP:
		return []cmField{
			{"LocalCommID", 0, 0, 32, uint64(m.LocalCommID), nil},
			{"RemoteCommID", 4, 0, 32, uint64(m.RemoteCommID), nil},
			{"PrivateData", 8, 0, 224 * 8, 0, m.PrivateData[:]},
		}
	}
	panic(fmt.Sprintf("no layout for %T", m))
}

// cmCovered returns the mask of the bits of the data area that the layout of the
// message type assigns to a field; the rest is reserved.
func cmCovered(attr uint16) []byte {
	mask := make([]byte, mad.CMDataSize)
	for _, f := range cmLayout(mad.NewCMMessage(attr)) {
		for i := 0; i < f.width; i++ {
			p := f.byteOff*8 + f.bit + i
			mask[p/8] |= 0x80 >> (p % 8)
		}
	}
	return mask
}

func TestCMLayoutByteExact(t *testing.T) {
	for _, m := range fullCMMessages() {
		t.Run(fmt.Sprintf("%#04x", m.AttrID()), func(t *testing.T) {
			want := make([]byte, mad.CMDataSize)
			seen := make([]byte, mad.CMDataSize)
			for _, f := range cmLayout(m) {
				// Fields must not overlap and must end inside the 232 bytes.
				for i := 0; i < f.width; i++ {
					p := f.byteOff*8 + f.bit + i
					if p/8 >= mad.CMDataSize || seen[p/8]&(0x80>>(p%8)) != 0 {
						t.Fatalf("layout table: field %s overlaps or overflows at bit %d", f.name, p)
					}
					seen[p/8] |= 0x80 >> (p % 8)
				}
				setBits(want, f)
			}
			got := make([]byte, mad.CMDataSize)
			for i := range got {
				got[i] = 0xee // Marshal must overwrite reserved bytes with zero
			}
			m.Marshal(got)
			if !bytes.Equal(got, want) {
				for i := range got {
					if got[i] != want[i] {
						t.Errorf("byte %d: got %#02x want %#02x", i, got[i], want[i])
					}
				}
			}
		})
	}
	// The private data areas end exactly at the end of the MAD (and start where IBA
	// says): REQ 140+92, MRA 10+222, REJ 84+148, REP 36+196, RTU 8+224, DREQ 12+220,
	// DREP 8+224 = 232.
	for _, m := range fullCMMessages() {
		l := cmLayout(m)
		last := l[len(l)-1]
		if last.name != "PrivateData" || last.byteOff+len(last.raw) != mad.CMDataSize {
			t.Errorf("%T: private data %d+%d", m, last.byteOff, len(last.raw))
		}
	}
}

// TestCMREQHandOffsets spells out a few REQ offsets by hand, as raw MAD offsets
// (header included), for an IPoIB-CM style REQ.
func TestCMREQHandOffsets(t *testing.T) {
	req := &mad.CMREQ{LocalCommID: 0xcafe0001, ServiceID: 0x1000000000000048, LocalQPN: 0x4a,
		StartingPSN: 0x123456, PKey: 0xffff, PathMTU: verbs.MTU2048, RemoteCMResponseTimeout: 20,
		LocalCMResponseTimeout: 20, MaxCMRetries: 15, ResponderResources: 4}
	copy(req.PrivateData[:], []byte{0, 0, 0, 0x48, 0, 0, 0xff, 0xf4})
	b := mad.NewCMMAD(7, req)
	check := func(what string, off int, want []byte) {
		t.Helper()
		if got := b[off : off+len(want)]; !bytes.Equal(got, want) {
			t.Errorf("%s at %d: %x, want %x", what, off, got, want)
		}
	}
	check("header", 0, []byte{1, 7, 2, 3})
	check("attribute", 16, []byte{0x00, 0x10})
	check("local comm ID", 24, []byte{0xca, 0xfe, 0, 1})
	check("service ID", 32, []byte{0x10, 0, 0, 0, 0, 0, 0, 0x48})
	check("local QPN + responder resources", 56, []byte{0, 0, 0x4a, 4})
	check("remote CM response timeout", 67, []byte{20 << 3})
	check("starting PSN + local timeout", 68, []byte{0x12, 0x34, 0x56, 20 << 3})
	check("P_Key", 72, []byte{0xff, 0xff})
	check("path MTU", 74, []byte{0x40})
	check("max CM retries", 75, []byte{0xf0})
	check("private data", 164, []byte{0, 0, 0, 0x48, 0, 0, 0xff, 0xf4})
}

func TestCMTimeout(t *testing.T) {
	for _, c := range []struct {
		t    uint8
		want time.Duration
	}{{0, 4096 * time.Nanosecond}, {8, 1048576 * time.Nanosecond}, {20, 4294967296 * time.Nanosecond}, {31, 4096 << 31}} {
		if got := mad.CMTimeout(c.t); got != c.want {
			t.Errorf("CMTimeout(%d) = %v, want %v", c.t, got, c.want)
		}
	}
}

func TestCMRejectReasonString(t *testing.T) {
	for r, want := range map[mad.CMRejectReason]string{
		mad.RejNoQP: "no QP (1)", mad.RejInvalidServiceID: "invalid service ID (8)",
		mad.RejStaleConn: "stale connection (10)", mad.RejConsumerDefined: "consumer reject (28)",
		34: "reject reason 34",
	} {
		if got := r.String(); got != want {
			t.Errorf("%d: %q, want %q", uint16(r), got, want)
		}
	}
	r := fullCMREJ()
	r.RejectInfoLength = 8
	if got := r.ValidARI(); !bytes.Equal(got, r.ARI[:8]) {
		t.Errorf("ValidARI %x", got)
	}
	r.RejectInfoLength = 0x7f
	if len(r.ValidARI()) != mad.CMREJARISize {
		t.Error("ValidARI beyond the ARI")
	}
}

// TestCMTshark writes one connection's worth of CM MADs as UD packets to QP1 into a
// pcap and checks that tshark's InfiniBand dissector decodes them with our values.
func TestCMTshark(t *testing.T) {
	tshark := testenv.Tool(t, "tshark")
	active, passive := testGID(0x01), testGID(0x41)
	const svc = 0x1000000000000048 // IPOIB_CM_IETF_ID | UD QPN 0x48
	ipoibPD := func(qpn uint32) []byte {
		pd := make([]byte, 8)
		binary.BigEndian.PutUint32(pd, qpn)
		binary.BigEndian.PutUint32(pd[4:], 65524)
		return pd
	}

	req := &mad.CMREQ{LocalCommID: 0x1001, ServiceID: svc, LocalCAGUID: 0x0002c903000a0b0c, LocalQPN: 0x4b,
		ResponderResources: 4, RemoteCMResponseTimeout: 20, StartingPSN: 0x0abcde, LocalCMResponseTimeout: 20,
		PKey: 0xffff, PathMTU: verbs.MTU2048, MaxCMRetries: 15,
		Primary: mad.CMPath{LocalLID: 2, RemoteLID: 3, LocalGID: active, RemoteGID: passive, PacketRate: 3,
			SubnetLocal: true, LocalACKTimeout: 19}}
	copy(req.PrivateData[:], ipoibPD(0x48))
	rep := &mad.CMREP{LocalCommID: 0x2002, RemoteCommID: 0x1001, LocalQPN: 0x4c, StartingPSN: 0x123456,
		LocalCAGUID: 0x0002c903000d0e0f}
	copy(rep.PrivateData[:], ipoibPD(0x49))
	rtu := &mad.CMRTU{LocalCommID: 0x1001, RemoteCommID: 0x2002}
	rej := &mad.CMREJ{LocalCommID: 0x2003, RemoteCommID: 0x1004, Reason: mad.RejInvalidServiceID}
	copy(rej.PrivateData[:], "no such service")
	dreq := &mad.CMDREQ{LocalCommID: 0x1001, RemoteCommID: 0x2002, RemoteQPN: 0x4c}
	drep := &mad.CMDREP{LocalCommID: 0x2002, RemoteCommID: 0x1001}

	path := filepath.Join(t.TempDir(), "cm.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	pw, err := wire.NewPcapWriter(f)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 0)
	for i, m := range []struct {
		msg      mad.CMMessage
		src, dst verbs.GID
	}{{req, active, passive}, {rep, passive, active}, {rtu, active, passive},
		{rej, passive, active}, {dreq, active, passive}, {drep, passive, active}} {
		pkt := wire.Packet{
			BTH:     wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: 1, PSN: uint32(i)},
			DETH:    wire.DETH{QKey: verbs.GSIQKey, SrcQP: 1},
			Payload: mad.NewCMMAD(uint64(0x100+i), m.msg),
		}
		if err := pw.WritePacket(ts.Add(time.Duration(i)*time.Millisecond), m.src, m.dst, pkt.AppendTo(nil, m.src, m.dst)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	fields := []string{
		"infiniband.mad.mgmtclass", "infiniband.mad.attributeid",
		"infiniband.cm.req", "infiniband.cm.req.serviceid", "infiniband.cm.req.localqpn",
		"infiniband.cm.req.startpsn", "infiniband.cm.req.pkey", "infiniband.cm.req.pppmtu",
		"infiniband.cm.req.maxcmretr", "infiniband.cm.req.remoteresptout", "infiniband.cm.req.prim_remotegid",
		"infiniband.cm.req.private",
		"infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqpn", "infiniband.cm.rep.startpsn",
		"infiniband.cm.rep.private",
		"infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid",
		"infiniband.cm.rej.reason", "infiniband.cm.rej.remotecommid", "infiniband.cm.rej.private",
		"infiniband.cm.dreq.localcommid", "infiniband.cm.req.remoteqpneecn",
		"infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid",
	}
	args := []string{"-n", "-r", path, "-T", "fields", "-E", "separator=|"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, out)
	}
	var lines []map[string]string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(l, "Running as user") {
			continue
		}
		v := strings.Split(l, "|")
		if len(v) != len(fields) {
			t.Fatalf("tshark line has %d fields, want %d: %q", len(v), len(fields), l)
		}
		m := map[string]string{}
		for i, f := range fields {
			if v[i] != "" {
				m[f] = v[i]
			}
		}
		lines = append(lines, m)
	}
	pdHex := hex.EncodeToString
	pad := func(b []byte, n int) []byte { return append(bytes.Clone(b), make([]byte, n-len(b))...) }
	want := []map[string]string{
		{
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.attributeid": "0x0010",
			"infiniband.cm.req": "0x00001001", "infiniband.cm.req.serviceid": "0x1000000000000048",
			"infiniband.cm.req.localqpn": "0x00004b", "infiniband.cm.req.startpsn": "0x0abcde",
			"infiniband.cm.req.pkey": "0xffff", "infiniband.cm.req.pppmtu": "0x04",
			"infiniband.cm.req.maxcmretr": "0x0f", "infiniband.cm.req.remoteresptout": "0x14",
			"infiniband.cm.req.prim_remotegid": passive.String(),
			"infiniband.cm.req.private":        pdHex(pad(ipoibPD(0x48), mad.CMREQPrivateDataSize)),
		},
		{
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.attributeid": "0x0013",
			"infiniband.cm.rep.remotecommid": "0x00001001", "infiniband.cm.rep.localqpn": "0x00004c",
			"infiniband.cm.rep.startpsn": "0x123456",
			"infiniband.cm.rep.private":  pdHex(pad(ipoibPD(0x49), mad.CMREPPrivateDataSize)),
		},
		{
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.attributeid": "0x0014",
			"infiniband.cm.rtu.localcommid": "0x00001001", "infiniband.cm.rtu.remotecommid": "0x00002002",
		},
		{
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.attributeid": "0x0012",
			"infiniband.cm.rej.reason": "0x0008", "infiniband.cm.rej.remotecommid": "0x00001004",
			"infiniband.cm.rej.private": pdHex(pad([]byte("no such service"), mad.CMREJPrivateDataSize)),
		},
		{
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.attributeid": "0x0015",
			"infiniband.cm.dreq.localcommid": "0x00001001", "infiniband.cm.req.remoteqpneecn": "0x00004c",
		},
		{
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.attributeid": "0x0016",
			"infiniband.cm.drsp.localcommid": "0x00002002", "infiniband.cm.drsp.remotecommid": "0x00001001",
		},
	}
	if len(lines) != len(want) {
		t.Fatalf("tshark decoded %d packets, want %d:\n%s", len(lines), len(want), out)
	}
	for i := range want {
		for k, v := range want[i] {
			if lines[i][k] != v {
				t.Errorf("packet %d: %s = %q, want %q", i, k, lines[i][k], v)
			}
		}
	}
	if t.Failed() {
		t.Logf("tshark output:\n%s", out)
	}
}

// FuzzCM parses arbitrary bytes as a CM MAD. It must not panic; a decoded message must
// re-encode to the input with the reserved bits (per the spec layout above) cleared,
// and decode again to the same values.
func FuzzCM(f *testing.F) {
	for _, m := range fullCMMessages() {
		f.Add(mad.NewCMMAD(0x1234, m))
	}
	ones := bytes.Repeat([]byte{0xff}, mad.Size)
	for _, a := range []uint16{mad.AttrCMREQ, mad.AttrCMREP, mad.AttrCMREJ, mad.AttrCMMRA, mad.AttrCMDREQ} {
		b := bytes.Clone(ones)
		binary.BigEndian.PutUint16(b[16:], a)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, mad.Size))
	covered := map[uint16][]byte{}
	for _, m := range fullCMMessages() {
		covered[m.AttrID()] = cmCovered(m.AttrID())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, msg, err := mad.ParseCM(b)
		if len(b) < mad.Size {
			if err == nil {
				t.Fatalf("ParseCM accepted %d bytes", len(b))
			}
			return
		}
		if msg == nil {
			if !errors.Is(err, mad.ErrUnknownCMAttr) || covered[h.AttrID] != nil {
				t.Fatalf("attribute %#x: no message, err %v", h.AttrID, err)
			}
			return
		}
		if err != nil || msg.AttrID() != h.AttrID {
			t.Fatalf("ParseCM: %T, %v", msg, err)
		}
		out := make([]byte, mad.Size)
		h.Marshal(out)
		msg.Marshal(out[mad.CMDataOffset:])
		want := bytes.Clone(b[:mad.Size])
		want[18], want[19] = 0, 0
		for i, m := range covered[h.AttrID] {
			want[mad.CMDataOffset+i] &= m
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("re-encoding differs from input\n got %x\nwant %x", out, want)
		}
		h2, msg2, err := mad.ParseCM(out)
		if err != nil || h2 != h {
			t.Fatalf("second parse: %+v, %v", h2, err)
		}
		if d := cmp.Diff(msg, msg2); d != "" {
			t.Fatalf("unstable (-first +second):\n%s", d)
		}
		if r, ok := msg.(*mad.CMREJ); ok {
			_ = r.Reason.String()
			_ = r.ValidARI()
		}
	})
}
