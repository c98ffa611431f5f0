//go:build rdma && linux

package rdma

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// A GetTable answer as OpenSM's vendor layer writes it for its kernel MAD layer (only
// the RMPP ACTIVE flag set, its real length) arrives so under libumad2sim; received
// makes it the one segment the kernel would have sent, so the records are counted.
func TestReceivedCompletesUnsegmentedRMPP(t *testing.T) {
	req := mad.NewSARequest(mad.MethodGetTable, mad.AttrMCMemberRecord, 0, 0)
	long := req.Bytes()
	long[3] = mad.MethodGetTable | mad.MethodResp
	long[mad.HeaderSize+2] = mad.RMPPFlagActive
	binaryAttrOffset(long, mad.AttrOffsetFor(mad.MCMemberRecordSize))
	short := append(long[:mad.SADataOffset:mad.SADataOffset], make([]byte, 2*56)...)
	short[mad.SADataOffset] = 0xff // first record's MGID
	short[mad.SADataOffset+56] = 0xff
	m := received(short)
	if len(m) != mad.Size {
		t.Fatalf("len %d", len(m))
	}
	recs, err := mad.TableOf(m)
	if err != nil || len(recs) != 2 {
		t.Fatalf("TableOf: %d records, %v; want 2", len(recs), err)
	}
	if mad.RMPPType(m) != mad.RMPPTypeData {
		t.Errorf("RMPP header % x", m[mad.HeaderSize:mad.HeaderSize+12])
	}

	// Without the flag, or at full size, or another class: padded, not changed.
	for _, b := range [][]byte{append([]byte(nil), short[:100]...), long} {
		b = append([]byte(nil), b...)
		b[mad.HeaderSize+2] = 0
		if got := received(b); !bytes.Equal(got[:len(b)], b) || len(got) != max(len(b), mad.Size) {
			t.Errorf("received changed a MAD without RMPP")
		}
	}
	cm := append([]byte(nil), short...)
	cm[1] = mad.ClassCM
	if got := received(cm); !bytes.Equal(got[:len(cm)], cm) {
		t.Errorf("received changed a CM MAD")
	}
}

func binaryAttrOffset(b []byte, off uint16) {
	// SA header: SM_Key (8), AttributeOffset (2) after the 12-byte RMPP header.
	b[mad.HeaderSize+12+8] = byte(off >> 8)
	b[mad.HeaderSize+12+9] = byte(off)
}

func TestClassify(t *testing.T) {
	m := make([]byte, mad.Size)
	m[12], m[15] = 0x12, 0x34
	if k, tid := Classify(0, m); k != RecvRequest || tid != 0x12000034 {
		t.Errorf("request: %v %#x", k, tid)
	}
	m[3] = mad.MethodGet | mad.MethodResp
	if k, _ := Classify(0, m); k != RecvResponse {
		t.Errorf("response: %v", k)
	}
	if k, _ := Classify(int(syscall.ETIMEDOUT), m); k != RecvFailed {
		t.Errorf("timeout notice: %v", k)
	}
	if k, _ := Classify(0, m[:10]); k != RecvDrop {
		t.Errorf("runt: %v", k)
	}
}

// FuzzReceived: whatever the umad file gives, received returns at least a whole MAD
// that starts with what came in (apart from an RMPP header it completes), and
// Classify does not panic.
func FuzzReceived(f *testing.F) {
	f.Add(make([]byte, 168), 0)
	f.Add(make([]byte, 256), 110)
	f.Add([]byte{1, 3, 2, 0x92}, 0)
	f.Fuzz(func(t *testing.T, b []byte, status int) {
		Classify(status, b)
		m := received(b)
		if len(m) < mad.Size || len(m) < len(b) {
			t.Fatalf("received %d bytes from %d", len(m), len(b))
		}
		if !bytes.Equal(m[:min(len(b), mad.HeaderSize)], b[:min(len(b), mad.HeaderSize)]) {
			t.Fatalf("MAD header changed")
		}
		Classify(status, m)
	})
}

func TestRates(t *testing.T) {
	for _, c := range []struct {
		gbps int
		rate verbs.Rate
	}{{10, 3}, {40, 7}, {56, 12}, {100, 16}, {200, 17}, {7, 0}} {
		if r := rateFromGbps(c.gbps); r != c.rate {
			t.Errorf("rateFromGbps(%d) = %d, want %d", c.gbps, r, c.rate)
		}
	}
	// ibv_query_port's width and lane speed: 4X QDR, 4X FDR, 4X EDR, 4X HDR, 1X SDR.
	for _, c := range []struct {
		mbps int
		rate verbs.Rate
	}{{4 * 10000, 7}, {4 * 14062, 12}, {4 * 25781, 16}, {4 * 53125, 17}, {2500, 2}, {0, 0}} {
		if r := rateOf(c.mbps); r != c.rate {
			t.Errorf("rateOf(%d) = %d, want %d", c.mbps, r, c.rate)
		}
	}
}

// What libibverbs lists here must not be an error: an empty list on a host without
// RDMA devices. Opening a device that does not exist names the devices there are.
func TestDevices(t *testing.T) {
	devs, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		t.Logf("%s %v fw %s ports %d err %v", d.Name, d.NodeGUID, d.FW, len(d.Ports), d.Err)
	}
	if _, err := Open("ipoibfs-no-such-device"); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("Open of a missing device: %v, want ENODEV", err)
	}
}

func TestFindPKey(t *testing.T) {
	tab := []verbs.PKey{0xffff, 0x0002, 0x8002, 0}
	for _, c := range []struct {
		key verbs.PKey
		i   int
		ok  bool
	}{{0xffff, 0, true}, {0x7fff, 0, true}, {0x8002, 2, true}, {0x0002, 1, true}, {0x8003, -1, false}} {
		if i, ok := findPKey(tab, c.key); i != c.i || ok != c.ok {
			t.Errorf("findPKey(%v) = %d %v, want %d %v", c.key, i, ok, c.i, c.ok)
		}
	}
}
