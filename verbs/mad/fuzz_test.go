package mad_test

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs/mad"
)

func goldenSeeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, s := range []string{goldenJoinReq, goldenJoinResp, goldenPathReq, goldenPathResp} {
		b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, append(b, make([]byte, mad.Size-len(b))...))
	}
	return out
}

// maskReserved returns a copy of b with the given reserved bits cleared, i.e. what a
// correct Marshal produces after Unmarshal(b).
func maskReserved(b []byte, reserved map[int]byte) []byte {
	c := bytes.Clone(b)
	for i, m := range reserved {
		c[i] &^= m
	}
	return c
}

func FuzzParseSA(f *testing.F) {
	for _, s := range goldenSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte{})
	f.Add(make([]byte, mad.Size-1))
	f.Add(bytes.Repeat([]byte{0xff}, mad.Size+3))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m mad.SAMAD
		err := mad.ParseSA(b, &m)
		if len(b) < mad.Size {
			if err == nil {
				t.Fatalf("ParseSA accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatalf("ParseSA(%d bytes): %v", len(b), err)
		}
		out := m.Bytes()
		// Marshal reproduces the input except the two reserved 16-bit fields.
		if want := maskReserved(b[:mad.Size], map[int]byte{18: 0xff, 19: 0xff, 46: 0xff, 47: 0xff}); !bytes.Equal(out, want) {
			t.Fatalf("marshal differs from input\n got %x\nwant %x", out, want)
		}
		var m2 mad.SAMAD
		if err := mad.ParseSA(out, &m2); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(m, m2); d != "" {
			t.Fatalf("parse/marshal/parse unstable (-first +second):\n%s", d)
		}
		var h mad.Header
		if err := mad.ParseHeader(b, &h); err != nil || h != m.Header {
			t.Fatalf("ParseHeader %+v, %v; ParseSA header %+v", h, err, m.Header)
		}
		// The helpers must not panic on arbitrary input.
		_ = m.Status.String()
		_ = m.TableRecords()
		_ = m.Response(m.Status)
	})
}

func FuzzMCMemberRecord(f *testing.F) {
	for _, s := range goldenSeeds(f)[:2] {
		f.Add(s[mad.SADataOffset : mad.SADataOffset+mad.MCMemberRecordSize])
	}
	full := make([]byte, mad.MCMemberRecordSize)
	r := fullMCMemberRecord()
	r.Marshal(full)
	f.Add(full)
	f.Add(bytes.Repeat([]byte{0xff}, mad.MCMemberRecordSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r mad.MCMemberRecord
		err := r.Unmarshal(b)
		if len(b) < mad.MCMemberRecordSize {
			if err == nil {
				t.Fatalf("Unmarshal accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, mad.MCMemberRecordSize)
		r.Marshal(out)
		// Reserved: the low 7 bits of byte 49 and bytes 50..51.
		if want := maskReserved(b[:mad.MCMemberRecordSize], map[int]byte{49: 0x7f, 50: 0xff, 51: 0xff}); !bytes.Equal(out, want) {
			t.Fatalf("marshal differs from input\n got %x\nwant %x", out, want)
		}
		var r2 mad.MCMemberRecord
		if err := r2.Unmarshal(out); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(r, r2); d != "" {
			t.Fatalf("unstable (-first +second):\n%s", d)
		}
	})
}

func FuzzPathRecord(f *testing.F) {
	for _, s := range goldenSeeds(f)[2:] {
		f.Add(s[mad.SADataOffset : mad.SADataOffset+mad.PathRecordSize])
	}
	full := make([]byte, mad.PathRecordSize)
	r := fullPathRecord()
	r.Marshal(full)
	f.Add(full)
	f.Add(bytes.Repeat([]byte{0xff}, mad.PathRecordSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r mad.PathRecord
		err := r.Unmarshal(b)
		if len(b) < mad.PathRecordSize {
			if err == nil {
				t.Fatalf("Unmarshal accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, mad.PathRecordSize)
		r.Marshal(out)
		// Reserved: bits 30..28 of the RawTraffic/FlowLabel/HopLimit word, bytes 58..63.
		reserved := map[int]byte{44: 0x70}
		for i := 58; i < 64; i++ {
			reserved[i] = 0xff
		}
		if want := maskReserved(b[:mad.PathRecordSize], reserved); !bytes.Equal(out, want) {
			t.Fatalf("marshal differs from input\n got %x\nwant %x", out, want)
		}
		var r2 mad.PathRecord
		if err := r2.Unmarshal(out); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(r, r2); d != "" {
			t.Fatalf("unstable (-first +second):\n%s", d)
		}
	})
}

func FuzzClassPortInfo(f *testing.F) {
	full := make([]byte, mad.ClassPortInfoSize)
	c := fullClassPortInfo()
	c.Marshal(full)
	f.Add(full)
	f.Add(bytes.Repeat([]byte{0xff}, mad.ClassPortInfoSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c mad.ClassPortInfo
		err := c.Unmarshal(b)
		if len(b) < mad.ClassPortInfoSize {
			if err == nil {
				t.Fatalf("Unmarshal accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, mad.ClassPortInfoSize)
		c.Marshal(out)
		// Reserved: the byte before RedirectQP.
		if want := maskReserved(b[:mad.ClassPortInfoSize], map[int]byte{32: 0xff}); !bytes.Equal(out, want) {
			t.Fatalf("marshal differs from input\n got %x\nwant %x", out, want)
		}
		var c2 mad.ClassPortInfo
		if err := c2.Unmarshal(out); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(c, c2); d != "" {
			t.Fatalf("unstable (-first +second):\n%s", d)
		}
	})
}
