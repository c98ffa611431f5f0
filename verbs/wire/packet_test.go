package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"ipoibfs/verbs"
)

func mustGID(t testing.TB, s string) verbs.GID {
	t.Helper()
	g, err := verbs.ParseGID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	gidA  = verbs.GID{0xfe, 0x80, 8: 0x00, 0x02, 0xc9, 0x03, 0, 0, 0, 0x01} // fe80::2:c903:0:1
	gidB  = verbs.GID{0xfe, 0x80, 8: 0x00, 0x02, 0xc9, 0x03, 0, 0, 0, 0x02} // fe80::2:c903:0:2
	gidMC = verbs.GID{0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 12: 0xff, 0xff, 0xff, 0xff}
)

// templates covers every supported opcode class with all header fields non-zero.
func templates() []Packet {
	bth := BTH{SE: true, MigReq: true, PKey: 0x8001, FECN: true, BECN: true,
		DestQP: 0xabcdef, AckReq: true, PSN: 0xfedcba}
	with := func(op uint8) BTH { b := bth; b.Opcode = op; return b }
	return []Packet{
		{BTH: with(OpUDSendOnly), DETH: DETH{QKey: 0x80010000, SrcQP: 0x123456}},
		{BTH: with(OpUDSendOnlyImm), DETH: DETH{QKey: 0x00000b1b, SrcQP: 0xffffff}, Imm: 0xdeadbeef},
		{BTH: with(OpRCSendFirst)},
		{BTH: with(OpRCSendMiddle)},
		{BTH: with(OpRCSendLast)},
		{BTH: with(OpRCSendLastImm), Imm: 0x01020304},
		{BTH: with(OpRCSendOnly)},
		{BTH: with(OpRCSendOnlyImm), Imm: 0xffffffff},
		{BTH: with(OpRCAck), AETH: AETH{Syndrome: 0x1f, MSN: 0x00a5a5}},
		{BTH: BTH{Opcode: OpRCAck, PKey: 0xffff}, AETH: AETH{Syndrome: 0x60, MSN: 1}},
		{BTH: BTH{Opcode: OpUDSendOnly}},
	}
}

func wantHeaderLen(op uint8) int {
	switch op {
	case OpUDSendOnly:
		return 20
	case OpUDSendOnlyImm:
		return 24
	case OpRCSendLastImm, OpRCSendOnlyImm, OpRCAck:
		return 16
	default:
		return 12
	}
}

var cmpPacket = cmpopts.EquateEmpty()

func TestRoundTrip(t *testing.T) {
	prefix := []byte("prefix")
	for _, tmpl := range templates() {
		for n := 0; n < 8; n++ {
			p := tmpl
			p.Payload = bytes.Repeat([]byte{0xa0 + byte(n)}, n)
			p.BTH.PadCnt = 3 // must be ignored and recomputed
			t.Run(fmt.Sprintf("op%02x/len%d", p.BTH.Opcode, n), func(t *testing.T) {
				if got, want := p.HeaderLen(), wantHeaderLen(p.BTH.Opcode); got != want {
					t.Fatalf("HeaderLen = %d, want %d", got, want)
				}
				b := p.AppendTo(append([]byte(nil), prefix...), gidA, gidB)
				if !bytes.Equal(b[:len(prefix)], prefix) {
					t.Fatalf("AppendTo clobbered the prefix: %q", b[:len(prefix)])
				}
				pkt := b[len(prefix):]
				pad := (4 - n%4) % 4
				if want := wantHeaderLen(p.BTH.Opcode) + n + pad + 4; len(pkt) != want || p.EncodedLen() != want {
					t.Fatalf("encoded %d bytes (EncodedLen %d), want %d", len(pkt), p.EncodedLen(), want)
				}
				if p.BTH.PadCnt != 3 {
					t.Fatal("AppendTo modified p")
				}
				if got := int(pkt[1]>>4) & 3; got != pad {
					t.Fatalf("PadCnt on the wire = %d, want %d", got, pad)
				}
				hl := wantHeaderLen(p.BTH.Opcode)
				if !bytes.Equal(pkt[hl+n:hl+n+pad], make([]byte, pad)) {
					t.Fatalf("pad bytes not zero: % x", pkt[hl+n:hl+n+pad])
				}
				if !CheckICRC(pkt, gidA, gidB) {
					t.Fatal("CheckICRC rejects a freshly encoded packet")
				}
				var got Packet
				if err := Parse(pkt, &got); err != nil {
					t.Fatal(err)
				}
				want := p
				want.BTH.PadCnt = uint8(pad)
				if d := cmp.Diff(want, got, cmpPacket); d != "" {
					t.Fatalf("round trip (-want +got):\n%s", d)
				}
				if n > 0 && &got.Payload[0] != &pkt[hl] {
					t.Fatal("Payload does not alias the input")
				}
				if cap(got.Payload) != len(got.Payload) {
					t.Fatal("Payload capacity reaches into pad/ICRC")
				}
			})
		}
	}
}

// TestEncodeLayout pins the byte layout against hand-written packets, which a round
// trip alone cannot do (a field swapped in both directions would still round-trip).
func TestEncodeLayout(t *testing.T) {
	cases := []struct {
		name string
		p    Packet
		want string // without ICRC
	}{
		{
			name: "UD SEND_ONLY",
			p: Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0x48, PSN: 0x123456},
				DETH: DETH{QKey: 0xb1b, SrcQP: 0x49}, Payload: unhex(t, "08000000deadbeef")},
			want: "64 00 ffff | 00 000048 | 00 123456 | 00000b1b 00 000049 | 08000000deadbeef",
		},
		{
			name: "UD SEND_ONLY_IMM flags pad",
			p: Packet{BTH: BTH{Opcode: OpUDSendOnlyImm, SE: true, PKey: 0x8001, FECN: true,
				DestQP: 0xffffff, AckReq: true, PSN: 0xffffff},
				DETH: DETH{QKey: 0x80010000, SrcQP: 1}, Imm: 0x11223344, Payload: []byte{0xaa}},
			want: "65 b0 8001 | 80 ffffff | 80 ffffff | 80010000 00 000001 | 11223344 | aa 000000",
		},
		{
			name: "RC SEND_LAST_IMM migreq becn",
			p: Packet{BTH: BTH{Opcode: OpRCSendLastImm, MigReq: true, PKey: 0x7fff, BECN: true,
				DestQP: 0x000102, PSN: 7}, Imm: 0xcafef00d, Payload: []byte{1, 2}},
			want: "03 60 7fff | 40 000102 | 00 000007 | cafef00d | 0102 0000",
		},
		{
			name: "RC ACK",
			p: Packet{BTH: BTH{Opcode: OpRCAck, PKey: 0xffff, DestQP: 0x11, PSN: 0x0a0b0c},
				AETH: AETH{Syndrome: 0x1f, MSN: 0x345678}},
			want: "11 00 ffff | 00 000011 | 00 0a0b0c | 1f 345678",
		},
		{
			name: "24-bit fields truncated",
			p:    Packet{BTH: BTH{Opcode: OpRCSendOnly, TVer: 0x1f, DestQP: 0xff000001, PSN: 0xff000002}},
			want: "04 0f 0000 | 00 000001 | 00 000002",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.p.AppendTo(nil, gidA, gidB)
			want := unhex(t, c.want)
			if !bytes.Equal(b[:len(b)-4], want) {
				t.Fatalf("encoded\n% x\nwant\n% x", b[:len(b)-4], want)
			}
		})
	}
}

func TestOpcodeClasses(t *testing.T) {
	for op := 0; op < 256; op++ {
		o := uint8(op)
		if IsUD(o) != (op >= 0x60 && op <= 0x7f) {
			t.Errorf("IsUD(0x%02x) = %v", op, IsUD(o))
		}
		if IsRC(o) != (op <= 0x1f) {
			t.Errorf("IsRC(0x%02x) = %v", op, IsRC(o))
		}
		supported := map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true,
			0x11: true, 0x64: true, 0x65: true}[op]
		if Supported(o) != supported {
			t.Errorf("Supported(0x%02x) = %v", op, Supported(o))
		}
		if supported {
			if got, want := HeaderLen(o), wantHeaderLen(o); got != want {
				t.Errorf("HeaderLen(0x%02x) = %d, want %d", op, got, want)
			}
		}
	}
}

func parseErr(t *testing.T, b []byte) error {
	t.Helper()
	var p Packet
	p.BTH.PKey = 0x1234 // must be reset
	err := Parse(b, &p)
	if err != nil {
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Fatalf("Parse error %v (%T) is not a *ParseError", err, err)
		}
		if !strings.HasPrefix(err.Error(), "wire: ") || pe.Detail == "" {
			t.Errorf("error %q lacks detail", err)
		}
		if d := cmp.Diff(Packet{}, p); d != "" {
			t.Errorf("p not zeroed after error: %s", d)
		}
	}
	return err
}

func TestParseErrors(t *testing.T) {
	valid := (&Packet{BTH: BTH{Opcode: OpUDSendOnly}, Payload: []byte{1, 2, 3, 4}}).AppendTo(nil, gidA, gidB)
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), valid...)) }
	sentinels := []error{ErrTruncated, ErrVersion, ErrOpcode, ErrPad}
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"nil", nil, ErrTruncated},
		{"short BTH", valid[:11], ErrTruncated},
		{"TVer 1", mod(func(b []byte) []byte { b[1] |= 1; return b }), ErrVersion},
		{"TVer 15", mod(func(b []byte) []byte { b[1] |= 0x0f; return b }), ErrVersion},
		{"TVer on bare BTH", mod(func(b []byte) []byte { b[1] |= 8; return b[:12] }), ErrVersion},
		{"opcode 0x06 RC RDMA write", mod(func(b []byte) []byte { b[0] = 0x06; return b }), ErrOpcode},
		{"opcode 0x66", mod(func(b []byte) []byte { b[0] = 0x66; return b }), ErrOpcode},
		{"opcode 0x81 CNP", mod(func(b []byte) []byte { b[0] = 0x81; return b }), ErrOpcode},
		{"opcode on bare BTH", mod(func(b []byte) []byte { b[0] = 0x24; return b[:12] }), ErrOpcode},
		{"no DETH", valid[:16], ErrTruncated},
		{"no ICRC", valid[:20], ErrTruncated},
		{"odd length", append(append([]byte(nil), valid...), 0), ErrTruncated},
		{"pad beyond empty payload", mod(func(b []byte) []byte { b[1] |= 0x10; return b[:24] }), ErrPad},
		{"pad 3 of 0", mod(func(b []byte) []byte { b[1] |= 0x30; return b[:24] }), ErrPad},
		{"ack pad", (&Packet{BTH: BTH{Opcode: OpRCAck, PadCnt: 1}}).AppendTo(nil, gidA, gidB), nil},
		{"ack pad set by hand", func() []byte {
			b := (&Packet{BTH: BTH{Opcode: OpRCAck}}).AppendTo(nil, gidA, gidB)
			b[1] |= 0x10
			return b
		}(), ErrPad},
		{"pad 3 of 4 ok", mod(func(b []byte) []byte { b[1] |= 0x30; return b }), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := parseErr(t, c.b)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Parse error = %v, want %v", err, c.want)
			}
			for _, s := range sentinels {
				if s != c.want && errors.Is(err, s) {
					t.Errorf("error %v also matches %v", err, s)
				}
			}
		})
	}
}

// TestParseTruncation cuts every valid packet at every length. A cut that leaves the
// length a multiple of 4 with room for headers, ICRC and pad is indistinguishable from
// a shorter packet for Parse; there the ICRC must catch it.
func TestParseTruncation(t *testing.T) {
	for _, tmpl := range templates() {
		for n := 0; n < 8; n++ {
			p := tmpl
			p.Payload = bytes.Repeat([]byte{0x5a}, n+4)
			full := p.AppendTo(nil, gidA, gidB)
			hl := p.HeaderLen()
			pad := PadLen(len(p.Payload))
			for cut := 0; cut < len(full); cut++ {
				b := append([]byte(nil), full[:cut]...) // exact capacity: out-of-range reads panic
				var want error
				switch {
				case cut < BTHLen, cut < hl+ICRCLen, cut%4 != 0:
					want = ErrTruncated
				case cut-hl-ICRCLen < pad:
					want = ErrPad
				}
				err := parseErr(t, b)
				if want == nil {
					if err != nil {
						t.Fatalf("op %02x payload %d cut %d: %v", p.BTH.Opcode, n+4, cut, err)
					}
					if CheckICRC(b, gidA, gidB) {
						t.Fatalf("op %02x payload %d cut %d: truncated packet passes the ICRC", p.BTH.Opcode, n+4, cut)
					}
					continue
				}
				if !errors.Is(err, want) {
					t.Fatalf("op %02x payload %d cut %d: err %v, want %v", p.BTH.Opcode, n+4, cut, err, want)
				}
			}
		}
	}
}

func TestParseIgnoresReservedBits(t *testing.T) {
	p := Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0x48, PSN: 9},
		DETH: DETH{QKey: 0xb1b, SrcQP: 0x49}, Payload: []byte{1, 2, 3, 4}}
	b := p.AppendTo(nil, gidA, gidB)
	b[4] |= 0x3f  // BTH resv6
	b[8] |= 0x7f  // BTH resv7
	b[16] |= 0xff // DETH reserved
	var got Packet
	if err := Parse(b, &got); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(p, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestNoAllocs(t *testing.T) {
	p := Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0x48},
		DETH: DETH{QKey: 0xb1b, SrcQP: 0x49}, Payload: make([]byte, 2044)}
	buf := make([]byte, 0, 4096)
	var pkt []byte
	cands := []verbs.GID{gidA, gidMC, gidB}
	var q Packet
	allocs := testing.AllocsPerRun(100, func() {
		pkt = p.AppendTo(buf[:0], gidA, gidB)
		if !CheckICRC(pkt, gidA, gidB) || MatchICRC(pkt, gidA, cands) != 2 || Parse(pkt, &q) != nil {
			t.Fatal("bad packet")
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendTo+CheckICRC+MatchICRC+Parse allocate %v times per packet", allocs)
	}
}

// TestAppendToDirtyBuffer encodes into spare capacity full of garbage: every header bit,
// reserved bit and pad byte must be written, not merged.
func TestAppendToDirtyBuffer(t *testing.T) {
	for _, tmpl := range templates() {
		for n := 0; n < 8; n++ {
			p := tmpl
			p.Payload = bytes.Repeat([]byte{0x11}, n)
			clean := p.AppendTo(nil, gidA, gidB)
			dirty := bytes.Repeat([]byte{0xff}, 256)
			got := p.AppendTo(dirty[:3], gidA, gidB)
			if &got[0] != &dirty[0] {
				t.Fatal("AppendTo reallocated although the capacity sufficed")
			}
			if !bytes.Equal(got[3:], clean) {
				t.Fatalf("op %02x len %d: into dirty buffer\n% x\nwant\n% x", p.BTH.Opcode, n, got[3:], clean)
			}
		}
	}
}

// TestBTHFlagsIndependent sets each boolean and small field alone, so that swapped bit
// positions cannot cancel out in a round trip.
func TestBTHFlagsIndependent(t *testing.T) {
	base := Packet{BTH: BTH{Opcode: OpUDSendOnlyImm}}
	cases := []struct {
		name string
		set  func(p *Packet)
		byte int
		mask byte
	}{
		{"SE", func(p *Packet) { p.BTH.SE = true }, 1, 0x80},
		{"MigReq", func(p *Packet) { p.BTH.MigReq = true }, 1, 0x40},
		{"FECN", func(p *Packet) { p.BTH.FECN = true }, 4, 0x80},
		{"BECN", func(p *Packet) { p.BTH.BECN = true }, 4, 0x40},
		{"AckReq", func(p *Packet) { p.BTH.AckReq = true }, 8, 0x80},
		{"PKey hi", func(p *Packet) { p.BTH.PKey = 0x8000 }, 2, 0x80},
		{"PKey lo", func(p *Packet) { p.BTH.PKey = 0x0001 }, 3, 0x01},
		{"DestQP lo", func(p *Packet) { p.BTH.DestQP = 1 }, 7, 0x01},
		{"DestQP hi", func(p *Packet) { p.BTH.DestQP = 0x800000 }, 5, 0x80},
		{"PSN lo", func(p *Packet) { p.BTH.PSN = 1 }, 11, 0x01},
		{"PSN hi", func(p *Packet) { p.BTH.PSN = 0x800000 }, 9, 0x80},
		{"QKey", func(p *Packet) { p.DETH.QKey = 0x80000000 }, 12, 0x80},
		{"SrcQP", func(p *Packet) { p.DETH.SrcQP = 0x800000 }, 17, 0x80},
		{"Imm", func(p *Packet) { p.Imm = 1 }, 23, 0x01},
	}
	for _, c := range cases {
		p := base
		c.set(&p)
		b := p.AppendTo(nil, gidA, gidB)
		zero := base.AppendTo(nil, gidA, gidB)
		for i := 0; i < len(b)-4; i++ {
			want := zero[i]
			if i == c.byte {
				want |= c.mask
			}
			if b[i] != want {
				t.Errorf("%s: byte %d = %#02x, want %#02x", c.name, i, b[i], want)
			}
		}
		var got Packet
		if err := Parse(b, &got); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(p, got, cmpPacket); d != "" {
			t.Errorf("%s: (-want +got):\n%s", c.name, d)
		}
	}
}
