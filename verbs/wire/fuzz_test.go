package wire

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
)

func fuzzSeeds() [][]byte {
	var seeds [][]byte
	for _, tmpl := range templates() {
		for _, n := range []int{0, 1, 2, 3, 4, 9} {
			p := tmpl
			p.Payload = bytes.Repeat([]byte{0x42}, n)
			seeds = append(seeds, p.AppendTo(nil, gidA, gidB))
		}
	}
	return seeds
}

// FuzzParse: Parse never panics; a packet it accepts re-encodes to the same length and
// the same header bits (reserved bits cleared) and parses back to the same Packet.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...) // exact capacity
		var p Packet
		if err := Parse(b, &p); err != nil {
			if _, ok := err.(*ParseError); !ok {
				t.Fatalf("error %v is %T, not *ParseError", err, err)
			}
			return
		}
		enc := p.AppendTo(nil, gidA, gidMC)
		if len(enc) != len(b) {
			t.Fatalf("re-encoded %d bytes from %d", len(enc), len(b))
		}
		hl := p.HeaderLen()
		want := append([]byte(nil), b[:hl]...)
		want[4] &^= 0x3f // resv6
		want[8] &^= 0x7f // resv7
		if IsUD(p.BTH.Opcode) {
			want[BTHLen+4] = 0 // DETH reserved
		}
		if !bytes.Equal(enc[:hl], want) {
			t.Fatalf("re-encoded headers\n% x\nwant\n% x", enc[:hl], want)
		}
		if !bytes.Equal(enc[hl:hl+len(p.Payload)], p.Payload) {
			t.Fatal("payload differs")
		}
		if !CheckICRC(enc, gidA, gidMC) {
			t.Fatal("re-encoded packet fails its ICRC")
		}
		var q Packet
		if err := Parse(enc, &q); err != nil {
			t.Fatalf("re-encoded packet does not parse: %v", err)
		}
		if d := cmp.Diff(p, q); d != "" {
			t.Fatalf("parse(encode(parse(b))) differs (-first +second):\n%s", d)
		}
	})
}

// FuzzICRC: MatchICRC agrees with CheckICRC tried candidate by candidate, for arbitrary
// bytes and for the same bytes given the right ICRC for one candidate; ICRC agrees with
// the hand-built canonical string.
func FuzzICRC(f *testing.F) {
	for i, s := range fuzzSeeds() {
		f.Add(s, gidA[:], append(append([]byte(nil), gidMC[:]...), gidB[:]...), uint8(i))
	}
	f.Add([]byte{}, []byte{}, []byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, pkt, sg, cands []byte, k uint8) {
		var sgid verbs.GID
		copy(sgid[:], sg)
		dgids := make([]verbs.GID, 0, len(cands)/16+1)
		for len(cands) >= 16 && len(dgids) < 64 {
			dgids = append(dgids, verbs.GID(cands[:16]))
			cands = cands[16:]
		}
		pkt = append([]byte(nil), pkt...) // modified below
		check := func() {
			t.Helper()
			if got, want := MatchICRC(pkt, sgid, dgids), naiveMatch(pkt, sgid, dgids); got != want {
				t.Fatalf("MatchICRC = %d, naive = %d", got, want)
			}
		}
		check()
		if len(pkt) < MinPacketLen {
			return
		}
		if len(dgids) > 0 {
			d := dgids[int(k)%len(dgids)]
			if got, want := ICRC(pkt, sgid, d), crc32.ChecksumIEEE(canonicalByHand(pkt, sgid, d)); got != want {
				t.Fatalf("ICRC %#08x, hand-built %#08x", got, want)
			}
			// A cache used for every candidate in turn, twice, and for a packet with
			// another BTH and length in between, gives what ICRC gives.
			var c ICRCCache
			other := append(append([]byte(nil), pkt[:BTHLen]...), pkt...)
			other[0] ^= 0x55
			for range 2 {
				for _, d := range dgids {
					if got, want := c.ICRC(pkt, sgid, d), ICRC(pkt, sgid, d); got != want {
						t.Fatalf("cached ICRC %#08x, uncached %#08x", got, want)
					}
					if got, want := c.ICRC(other, sgid, d), ICRC(other, sgid, d); got != want {
						t.Fatalf("cached ICRC of another packet %#08x, uncached %#08x", got, want)
					}
				}
			}
			binary.LittleEndian.PutUint32(pkt[len(pkt)-4:], ICRC(pkt, sgid, d))
			check()
			if MatchICRC(pkt, sgid, dgids) < 0 {
				t.Fatal("no match although one candidate's ICRC was stored")
			}
		}
	})
}
