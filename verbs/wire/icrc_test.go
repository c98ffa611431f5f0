package wire

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"ipoibfs/verbs"
)

// canonicalByHand builds the canonical ICRC input for pkt field by field, without any
// of the package's helpers.
func canonicalByHand(pkt []byte, sgid, dgid verbs.GID) []byte {
	var c bytes.Buffer
	c.Write(bytes.Repeat([]byte{0xff}, 8))  // masked LRH
	c.Write([]byte{0x6f, 0xff, 0xff, 0xff}) // IPv6 version 6, TClass and flow label all ones
	l := uint16(8 + len(pkt))
	c.Write([]byte{byte(l >> 8), byte(l)}) // payload length = UDP length
	c.Write([]byte{17, 0xff})              // next header UDP, hop limit all ones
	c.Write(sgid[:])
	c.Write(dgid[:])
	c.Write([]byte{0xc0, 0x00, 0x12, 0xb7}) // UDP ports 49152 -> 4791
	c.Write([]byte{byte(l >> 8), byte(l)})  // UDP length
	c.Write([]byte{0xff, 0xff})             // UDP checksum all ones
	c.Write(pkt[:4])
	c.WriteByte(0xff) // FECN/BECN/resv6
	c.Write(pkt[5 : len(pkt)-4])
	return c.Bytes()
}

// crc32LE is the kernel's crc32_le: the reflected IEEE CRC register update with no
// inversion on entry or exit, bit by bit.
func crc32LE(crc uint32, p []byte) uint32 {
	for _, b := range p {
		crc ^= uint32(b)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xedb88320
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}

func TestICRCKnownAnswer(t *testing.T) {
	sgid := mustGID(t, "fe80::2:c903:0:1")
	dgid := mustGID(t, "fe80::2:c903:0:2")
	if sgid != gidA || dgid != gidB {
		t.Fatal("test GIDs disagree")
	}
	// UD SEND_ONLY, P_Key 0xffff, DestQP 0x48, PSN 0x123456, Q_Key 0xb1b, SrcQP 0x49,
	// 8 payload bytes. Golden ICRC from Python's zlib.crc32 over the canonical string.
	pkt := unhex(t, "6400ffff 00000048 00123456 00000b1b 00000049 08000000deadbeef 4dc22c7b")
	const golden = 0x7b2cc24d

	canon := canonicalByHand(pkt, sgid, dgid)
	if len(canon) != 8+40+8+len(pkt)-4 {
		t.Fatalf("canonical string is %d bytes", len(canon))
	}
	if got := crc32.ChecksumIEEE(canon); got != golden {
		t.Fatalf("hand-built canonical CRC = %#08x, want golden %#08x", got, golden)
	}
	if got := ICRC(pkt, sgid, dgid); got != golden {
		t.Fatalf("ICRC = %#08x, want %#08x", got, golden)
	}
	if !CheckICRC(pkt, sgid, dgid) {
		t.Fatal("CheckICRC rejects the golden packet")
	}
	p := Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0x48, PSN: 0x123456},
		DETH: DETH{QKey: 0xb1b, SrcQP: 0x49}, Payload: unhex(t, "08000000deadbeef")}
	if got := p.AppendTo(nil, sgid, dgid); !bytes.Equal(got, pkt) {
		t.Fatalf("AppendTo\n% x\nwant\n% x", got, pkt)
	}

	// rxe semantics: crc32_le seeded with 0xdebb20e3 (the register after 8 bytes of 0xff
	// from ~0) over the pseudo header without the LRH, complemented, stored in host
	// (little-endian) order.
	if s := crc32LE(0xffffffff, bytes.Repeat([]byte{0xff}, 8)); s != 0xdebb20e3 {
		t.Fatalf("register after 8 x 0xff = %#08x, want 0xdebb20e3", s)
	}
	rxe := ^crc32LE(0xdebb20e3, canon[8:])
	if got := binary.LittleEndian.Uint32(pkt[len(pkt)-4:]); got != rxe {
		t.Fatalf("stored ICRC %#08x, rxe computes %#08x", got, rxe)
	}
	// A standard CRC-32 checker run over canonical string + stored ICRC bytes finds the
	// residue, as for an Ethernet frame with its FCS.
	if r := crc32.ChecksumIEEE(append(canon, pkt[len(pkt)-4:]...)); r != 0x2144df1c {
		t.Fatalf("residue %#08x, want 0x2144df1c", r)
	}
}

func TestICRCMatchesHandBuiltRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		pkt := randomPacket(rng)
		sgid, dgid := randomGID(rng), randomGID(rng)
		want := crc32.ChecksumIEEE(canonicalByHand(pkt, sgid, dgid))
		if got := ICRC(pkt, sgid, dgid); got != want {
			t.Fatalf("len %d: ICRC %#08x, hand-built %#08x", len(pkt), got, want)
		}
	}
}

func TestICRCFlipAnyBit(t *testing.T) {
	for _, tmpl := range templates() {
		p := tmpl
		p.Payload = []byte("0123456789abc") // 13 bytes: 3 pad bytes
		pkt := p.AppendTo(nil, gidA, gidB)
		for i := range pkt {
			for bit := 0; bit < 8; bit++ {
				b := append([]byte(nil), pkt...)
				b[i] ^= 1 << bit
				if i == 4 {
					if !CheckICRC(b, gidA, gidB) {
						t.Fatalf("op %02x: flipping masked BTH byte 4 bit %d breaks the ICRC", p.BTH.Opcode, bit)
					}
					continue
				}
				if CheckICRC(b, gidA, gidB) {
					t.Fatalf("op %02x: flipping byte %d bit %d keeps the ICRC valid", p.BTH.Opcode, i, bit)
				}
			}
		}
		// Any value of the masked byte passes; DestQP in bytes 5..7 is covered.
		for v := 0; v < 256; v++ {
			b := append([]byte(nil), pkt...)
			b[4] = byte(v)
			if !CheckICRC(b, gidA, gidB) {
				t.Fatalf("byte 4 = %#02x breaks the ICRC", v)
			}
		}
		// Changing the packet length (appending a word) breaks it too.
		longer := append(append([]byte(nil), pkt[:len(pkt)-4]...), 0, 0, 0, 0)
		longer = append(longer, pkt[len(pkt)-4:]...)
		if CheckICRC(longer, gidA, gidB) {
			t.Fatal("appending a zero word keeps the ICRC valid")
		}
		// Wrong GIDs.
		if CheckICRC(pkt, gidB, gidA) || CheckICRC(pkt, gidA, gidMC) {
			t.Fatal("CheckICRC accepts the wrong GIDs")
		}
		for i := 0; i < 16; i++ {
			s, d := gidA, gidB
			s[i] ^= 0x80
			d[i] ^= 1
			if CheckICRC(pkt, s, gidB) || CheckICRC(pkt, gidA, d) {
				t.Fatalf("CheckICRC ignores GID byte %d", i)
			}
		}
	}
}

func TestICRCIgnoresFECNBECN(t *testing.T) {
	for _, fecn := range []bool{false, true} {
		for _, becn := range []bool{false, true} {
			p := Packet{BTH: BTH{Opcode: OpUDSendOnly, PKey: 0xffff, DestQP: 0x48, FECN: fecn, BECN: becn},
				DETH: DETH{QKey: 0xb1b, SrcQP: 0x49}, Payload: []byte("hello")}
			pkt := p.AppendTo(nil, gidA, gidB)
			if got, want := pkt[4]>>6, b2u(fecn)<<1|b2u(becn); got != want {
				t.Fatalf("FECN/BECN bits = %b, want %b", got, want)
			}
			// The ICRC is that of the packet without congestion bits.
			p.BTH.FECN, p.BTH.BECN = false, false
			ref := p.AppendTo(nil, gidA, gidB)
			if !bytes.Equal(pkt[len(pkt)-4:], ref[len(ref)-4:]) {
				t.Fatalf("FECN=%v BECN=%v changes the ICRC", fecn, becn)
			}
			// Setting them in flight keeps the ICRC valid.
			ref[4] |= 0xc0
			if !CheckICRC(ref, gidA, gidB) {
				t.Fatal("setting FECN/BECN in flight breaks the ICRC")
			}
		}
	}
}

func TestICRCShort(t *testing.T) {
	for n := 0; n < MinPacketLen; n++ {
		b := make([]byte, n)
		if ICRC(b, gidA, gidB) != 0 || CheckICRC(b, gidA, gidB) || MatchICRC(b, gidA, []verbs.GID{gidB}) != -1 {
			t.Fatalf("len %d: short packet not rejected", n)
		}
	}
	// The smallest packet: a bare BTH and its ICRC.
	pkt := (&Packet{BTH: BTH{Opcode: OpRCSendOnly}}).AppendTo(nil, gidA, gidB)
	if len(pkt) != MinPacketLen || !CheckICRC(pkt, gidA, gidB) || MatchICRC(pkt, gidA, []verbs.GID{gidMC, gidB}) != 1 {
		t.Fatal("minimal packet")
	}
}

func TestCRCSoftMatchesStdlib(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 300; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		seed := rng.Uint32()
		if got, want := crcSoft(seed, b), crc32.Update(seed, crc32.IEEETable, b); got != want {
			t.Fatalf("len %d: crcSoft %#08x, crc32.Update %#08x", n, got, want)
		}
	}
}

func TestCRC32Combine(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	lens := []int{0, 1, 2, 3, 4, 7, 8, 31, 64, 255, 256, 1000, 4096, 65536 + 17}
	for _, la := range []int{0, 1, 68, 300} {
		for _, lb := range lens {
			a := make([]byte, la)
			b := make([]byte, lb)
			for i := range a {
				a[i] = byte(rng.Uint32())
			}
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			want := crc32.ChecksumIEEE(append(append([]byte(nil), a...), b...))
			got := crc32Combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), x8nModP(lb))
			if got != want {
				t.Fatalf("len(A)=%d len(B)=%d: combine %#08x, direct %#08x", la, lb, got, want)
			}
		}
	}
	// x^0 and x^8 sanity: shifting by zero bytes is the identity.
	if x8nModP(0) != crcX0 {
		t.Fatal("x^0 is not 1")
	}
	for _, v := range []uint32{0, 1, 0xdeadbeef, 0xffffffff} {
		if mulModP(crcX0, v) != v || mulModP(v, crcX0) != v {
			t.Fatalf("1·%#x != %#x", v, v)
		}
	}
}

func naiveMatch(pkt []byte, sgid verbs.GID, dgids []verbs.GID) int {
	for i, d := range dgids {
		if CheckICRC(pkt, sgid, d) {
			return i
		}
	}
	return -1
}

func randomGID(rng *rand.Rand) verbs.GID {
	var g verbs.GID
	for i := range g {
		g[i] = byte(rng.Uint32())
	}
	if rng.IntN(2) == 0 {
		g[0], g[1] = 0xff, 0x12
	}
	return g
}

// randomPacket returns a random well-formed packet with a bogus ICRC.
func randomPacket(rng *rand.Rand) []byte {
	ops := []uint8{OpRCSendFirst, OpRCSendMiddle, OpRCSendLast, OpRCSendLastImm, OpRCSendOnly,
		OpRCSendOnlyImm, OpRCAck, OpUDSendOnly, OpUDSendOnlyImm}
	p := Packet{BTH: BTH{Opcode: ops[rng.IntN(len(ops))], PKey: uint16(rng.Uint32()),
		DestQP: rng.Uint32(), PSN: rng.Uint32()},
		DETH: DETH{QKey: rng.Uint32(), SrcQP: rng.Uint32()}, Imm: rng.Uint32()}
	sizes := []int{0, 1, 5, 60, 63, 64, 65, 200, 2044, 4092}
	p.Payload = make([]byte, sizes[rng.IntN(len(sizes))])
	for i := range p.Payload {
		p.Payload[i] = byte(rng.Uint32())
	}
	b := p.AppendTo(nil, randomGID(rng), randomGID(rng))
	binary.LittleEndian.PutUint32(b[len(b)-4:], rng.Uint32())
	return b
}

func TestMatchICRCEqualsNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	hits := 0
	for iter := 0; iter < 2000; iter++ {
		pkt := randomPacket(rng)
		sgid := randomGID(rng)
		cands := make([]verbs.GID, rng.IntN(6))
		for i := range cands {
			cands[i] = randomGID(rng)
			if i > 0 && rng.IntN(4) == 0 {
				cands[i] = cands[rng.IntN(i)] // duplicates
			}
		}
		if len(cands) > 0 && rng.IntN(4) != 0 {
			// Give the packet the right ICRC for one candidate (sometimes a duplicate).
			k := rng.IntN(len(cands))
			binary.LittleEndian.PutUint32(pkt[len(pkt)-4:], ICRC(pkt, sgid, cands[k]))
		}
		want := naiveMatch(pkt, sgid, cands)
		if want >= 0 {
			hits++
		}
		if got := MatchICRC(pkt, sgid, cands); got != want {
			t.Fatalf("iter %d len %d: MatchICRC = %d, naive = %d", iter, len(pkt), got, want)
		}
		// A wrong SGID matches nothing (with overwhelming probability).
		if want >= 0 {
			bad := sgid
			bad[15] ^= 1
			if got := MatchICRC(pkt, bad, cands); got != naiveMatch(pkt, bad, cands) {
				t.Fatalf("wrong sgid: MatchICRC = %d", got)
			}
		}
	}
	if hits < 1000 {
		t.Fatalf("only %d of 2000 cases had a match: test is not exercising matches", hits)
	}
}

func BenchmarkICRC(b *testing.B) {
	p := Packet{BTH: BTH{Opcode: OpUDSendOnly}, Payload: make([]byte, 2044)}
	pkt := p.AppendTo(nil, gidA, gidB)
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		CheckICRC(pkt, gidA, gidB)
	}
}

func BenchmarkMatchICRC8(b *testing.B) {
	p := Packet{BTH: BTH{Opcode: OpUDSendOnly}, Payload: make([]byte, 2044)}
	cands := make([]verbs.GID, 8)
	for i := range cands {
		cands[i] = gidMC
		cands[i][15] = byte(i)
	}
	pkt := p.AppendTo(nil, gidA, cands[7])
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if MatchICRC(pkt, gidA, cands) != 7 {
			b.Fatal("no match")
		}
	}
}

// A cache carries the prefix of one packet to the next: packets of the same length
// between the same GIDs with different BTHs and bodies, then another length, another
// pair of GIDs, and back, all get the ICRC computed afresh, and the cache does not
// allocate.
func TestICRCCacheAcrossPackets(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	mk := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	gids := []verbs.GID{gidA, gidB, gidMC}
	var c ICRCCache
	for i := range 200 {
		n := []int{64, 64, 64, 2060, 2060, 100}[i%6]
		pkt := mk(n)
		s, d := gids[i/7%3], gids[(i/11+1)%3]
		if got, want := c.ICRC(pkt, s, d), ICRC(pkt, s, d); got != want {
			t.Fatalf("packet %d (%d bytes): cached %#08x, fresh %#08x", i, n, got, want)
		}
	}
	pkt := mk(2060)
	if a := testing.AllocsPerRun(100, func() { c.ICRC(pkt, gidA, gidB) }); a != 0 {
		t.Errorf("ICRCCache.ICRC allocates %v times", a)
	}
}
