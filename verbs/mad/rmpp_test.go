package mad_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"ipoibfs/verbs/mad"
)

func longMAD(n int) []byte {
	req := mad.NewSARequest(mad.MethodGetTable, mad.AttrNodeRecord, 0x1234, 0)
	hdr := req.Response(mad.StatusOK)
	hdr.SA.AttrOffset = 14
	b := hdr.Bytes()[:mad.SADataOffset]
	for i := range n {
		b = append(b, byte(i*7+1))
	}
	return b
}

func segField(s []byte, off int) uint32 { return binary.BigEndian.Uint32(s[mad.HeaderSize+off:]) }

// The segments carry the kernel's flags, numbers and PayloadLength (mad_rmpp.c
// send_next_seg: the first holds the whole transfer's length, the last its own).
func TestSplitRMPPLikeTheKernel(t *testing.T) {
	for _, tc := range []struct{ data, segs int }{{0, 1}, {1, 1}, {200, 1}, {201, 2}, {450, 3}, {784, 4}} {
		segs, err := mad.SplitRMPP(longMAD(tc.data))
		if err != nil {
			t.Fatal(err)
		}
		if len(segs) != tc.segs {
			t.Fatalf("%d bytes: %d segments, want %d", tc.data, len(segs), tc.segs)
		}
		pad := tc.segs*200 - tc.data
		for i, s := range segs {
			flags := s[mad.HeaderSize+2] & 7
			wantFlags := byte(mad.RMPPFlagActive)
			var wantLen uint32
			if i == 0 {
				wantFlags |= mad.RMPPFlagFirst
				wantLen = uint32(tc.segs*220 - pad)
			}
			if i == len(segs)-1 {
				wantFlags |= mad.RMPPFlagLast
				wantLen = uint32(220 - pad)
			}
			if flags != wantFlags || segField(s, 4) != uint32(i+1) || segField(s, 8) != wantLen || mad.RMPPType(s) != mad.RMPPTypeData {
				t.Errorf("%d bytes, segment %d: flags %#x seg %d paylen %d, want %#x %d %d",
					tc.data, i+1, flags, segField(s, 4), segField(s, 8), wantFlags, i+1, wantLen)
			}
		}
	}
}

func TestReassemblyRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 199, 200, 201, 4000, 200 * 130} {
		long := longMAD(n)
		segs, err := mad.SplitRMPP(long)
		if err != nil {
			t.Fatal(err)
		}
		var r mad.Reassembly
		var acks []uint32
		for i, s := range segs {
			ack, done, err := r.Add(s)
			if err != nil {
				t.Fatal(err)
			}
			if ack != nil {
				last, win, ok := mad.RMPPAckOf(ack)
				if !ok || ack[3]&mad.MethodResp != 0 {
					t.Fatalf("ACK not an RMPP ACK request: %x", ack[:40])
				}
				if win < last {
					t.Fatalf("ACK window %d before its segment %d", win, last)
				}
				acks = append(acks, last)
			}
			if done != (i == len(segs)-1) {
				t.Fatalf("%d bytes: done=%v at segment %d of %d", n, done, i+1, len(segs))
			}
		}
		// ACKed: segment 1 (the initial window), every window end, the last.
		if acks[0] != 1 || acks[len(acks)-1] != uint32(len(segs)) {
			t.Fatalf("%d bytes: ACKs for segments %v", n, acks)
		}
		if len(segs) > 65 && acks[1] != 65 {
			t.Fatalf("second ACK at segment %d, want 65 (window 64)", acks[1])
		}
		// The joined-up MAD has the first segment's header and exactly the data.
		// (A one-segment transfer is that MAD: padded to its size.)
		got := r.Long()
		if len(got) != max(mad.Size, len(long)) || !bytes.Equal(got[mad.SADataOffset:len(long)], long[mad.SADataOffset:]) ||
			!bytes.Equal(got[:mad.HeaderSize], long[:mad.HeaderSize]) {
			t.Fatalf("%d bytes: reassembled differs", n)
		}
	}
}

func TestReassemblyDuplicatesGapsAndAborts(t *testing.T) {
	segs, _ := mad.SplitRMPP(longMAD(1000)) // 5 segments
	var r mad.Reassembly
	if ack, _, _ := r.Add(segs[0]); ack == nil {
		t.Fatal("segment 1 not ACKed")
	}
	// A gap (3 before 2) is dropped silently; 2 then 3 are taken.
	if ack, done, err := r.Add(segs[2]); ack != nil || done || err != nil {
		t.Fatalf("gap: ack %v done %v err %v", ack != nil, done, err)
	}
	for _, s := range segs[1:4] {
		if _, _, err := r.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	// A duplicate is re-ACKed with where the receiver is (a lost ACK).
	ack, _, err := r.Add(segs[1])
	if last, _, ok := mad.RMPPAckOf(ack); err != nil || !ok || last != 4 {
		t.Fatalf("duplicate: ACK for %d (%v), want 4", last, err)
	}
	if _, done, _ := r.Add(segs[4]); !done {
		t.Fatal("not done after the last segment")
	}
	if got := r.Long(); !bytes.Equal(got[mad.SADataOffset:], longMAD(1000)[mad.SADataOffset:]) {
		t.Fatal("data differs after gap and duplicate")
	}

	var r2 mad.Reassembly
	if _, _, err := r2.Add(segs[0]); err != nil {
		t.Fatal(err)
	}
	abort := bytes.Clone(segs[1])
	abort[mad.HeaderSize+1] = mad.RMPPTypeAbort
	if _, _, err := r2.Add(abort); !errors.Is(err, mad.ErrRMPP) {
		t.Fatalf("ABORT: %v, want ErrRMPP", err)
	}
	noFirst := bytes.Clone(segs[0])
	noFirst[mad.HeaderSize+2] &^= mad.RMPPFlagFirst
	if _, _, err := new(mad.Reassembly).Add(noFirst); !errors.Is(err, mad.ErrRMPP) {
		t.Fatalf("segment 1 without First: %v", err)
	}
}

// Records laid out by LongTable come back from TableOf, across segment borders too.
func TestLongTableAndTableOf(t *testing.T) {
	req := mad.NewSARequest(mad.MethodGetTable, mad.AttrNodeRecord, 1, 0)
	hdr := req.Response(mad.StatusOK)
	var recs [][]byte
	for i := range 9 {
		r := mad.NodeRecord{LID: 0x10, NodeType: mad.NodeTypeCA, NumPorts: 1, NodeGUID: 0x100, Desc: "node", LocalPort: uint8(i + 1)}
		b := make([]byte, mad.NodeRecordSize)
		r.Marshal(b)
		recs = append(recs, b)
	}
	long := mad.LongTable(&hdr, mad.NodeRecordSize, recs)
	got, err := mad.TableOf(long)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("%d records, want %d", len(got), len(recs))
	}
	for i := range recs {
		var n mad.NodeRecord
		if err := n.Unmarshal(got[i]); err != nil || n.LocalPort != uint8(i+1) || n.Desc != "node" {
			t.Fatalf("record %d: %+v %v", i, n, err)
		}
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var b [mad.NodeRecordSize]byte
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		b[2], b[3] = 0, 0 // reserved
		var n mad.NodeRecord
		_ = n.Unmarshal(b[:])
		b2 := make([]byte, mad.NodeRecordSize)
		n.Marshal(b2)
		var n2 mad.NodeRecord
		_ = n2.Unmarshal(b2)
		if n != n2 {
			t.Fatalf("NodeRecord round trip: %+v != %+v", n, n2)
		}
		var pk mad.PKeyTableRecord
		_ = pk.Unmarshal(b[:mad.PKeyTableRecordSize])
		pb := make([]byte, mad.PKeyTableRecordSize)
		pk.Marshal(pb)
		if !bytes.Equal(pb[8:], b[8:mad.PKeyTableRecordSize]) || !bytes.Equal(pb[:5], b[:5]) {
			t.Fatal("P_KeyTableRecord round trip differs")
		}
		var pi mad.PortInfoRecord
		_ = pi.Unmarshal(b[:mad.PortInfoRecordSize])
		ib := make([]byte, mad.PortInfoRecordSize)
		pi.Marshal(ib)
		var pi2 mad.PortInfoRecord
		_ = pi2.Unmarshal(ib)
		if pi.LID != pi2.LID || pi.PortLID != pi2.PortLID || pi.MasterSMLID != pi2.MasterSMLID || pi.State != pi2.State ||
			pi.MTUCap != pi2.MTUCap || pi.NeighborMTU != pi2.NeighborMTU || pi.GIDPrefix != pi2.GIDPrefix {
			t.Fatalf("PortInfoRecord round trip: %+v != %+v", pi, pi2)
		}
	}
}

// Segments from a peer: whatever arrives, Add neither panics nor holds more than the
// segments it was given, and a completed transfer is what was sent.
func FuzzReassembly(f *testing.F) {
	segs, _ := mad.SplitRMPP(longMAD(700))
	f.Add(bytes.Join(segs, nil))
	f.Add(segs[0])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r mad.Reassembly
		n := 0
		for len(b) >= mad.Size {
			_, done, err := r.Add(b[:mad.Size])
			b = b[mad.Size:]
			n++
			if err != nil {
				return
			}
			if done {
				if l := len(r.Long()); l > mad.SADataOffset+n*mad.RMPPSegData {
					t.Fatalf("%d bytes from %d segments", l, n)
				}
				return
			}
		}
	})
}

func FuzzTableOf(f *testing.F) {
	f.Add(longMAD(1000))
	f.Add(make([]byte, mad.Size))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := mad.TableOf(b)
		if err != nil {
			return
		}
		for _, r := range recs {
			var n mad.NodeRecord
			_ = n.Unmarshal(r)
			var p mad.PortInfoRecord
			_ = p.Unmarshal(r)
			var k mad.PKeyTableRecord
			_ = k.Unmarshal(r)
			var m mad.MCMemberRecord
			_ = m.Unmarshal(r)
		}
	})
}
