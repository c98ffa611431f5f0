package wire

import (
	"encoding/binary"
	"hash/crc32"

	"ipoibfs/verbs"
)

// Layout of the canonical pseudo header (see the package documentation).
const (
	canonLRH  = 8                 // masked LRH: 8 × 0xff
	canonIP   = canonLRH          // IPv6 header, 40 bytes
	canonSGID = canonIP + 8       // IPv6 source address
	canonDGID = canonSGID + 16    // IPv6 destination address
	canonUDP  = canonDGID + 16    // UDP header, 8 bytes
	canonBTH  = canonUDP + 8      // BTH with byte 4 masked
	canonLen  = canonBTH + BTHLen // 68 bytes in all
	crcPoly   = 0xedb88320        // CRC-32/IEEE, reflected
	crcX0     = uint32(1) << 31   // the polynomial 1 (x^0) in reflected form
	crcX1     = uint32(1) << 30   // the polynomial x
	icrcMinIn = BTHLen + ICRCLen  // shortest input ICRC accepts
)

// canonHeader fills h with the canonical pseudo header of the IB packet pkt
// (len(pkt) >= BTHLen) sent from sgid to dgid.
func canonHeader(h *[canonLen]byte, pkt []byte, sgid, dgid *verbs.GID) {
	for i := range canonLRH {
		h[i] = 0xff
	}
	l := uint16(8 + len(pkt))
	// IPv6: version 6, traffic class and flow label masked.
	h[canonIP+0], h[canonIP+1], h[canonIP+2], h[canonIP+3] = 0x6f, 0xff, 0xff, 0xff
	binary.BigEndian.PutUint16(h[canonIP+4:], l)
	h[canonIP+6] = 17   // next header UDP
	h[canonIP+7] = 0xff // hop limit, masked
	copy(h[canonSGID:canonSGID+16], sgid[:])
	copy(h[canonDGID:canonDGID+16], dgid[:])
	binary.BigEndian.PutUint16(h[canonUDP+0:], UDPSrcPort)
	binary.BigEndian.PutUint16(h[canonUDP+2:], UDPPort)
	binary.BigEndian.PutUint16(h[canonUDP+4:], l)
	h[canonUDP+6], h[canonUDP+7] = 0xff, 0xff // checksum, masked
	copy(h[canonBTH:canonBTH+BTHLen], pkt[:BTHLen])
	h[canonBTH+4] = 0xff // FECN, BECN, reserved: masked
}

// ICRC returns the invariant CRC of the encoded packet pkt sent from sgid to dgid: the
// CRC-32/IEEE of the canonical pseudo header and pkt up to, excluding, its last 4 bytes
// (where the ICRC is stored, little-endian). It returns 0 for packets shorter than
// MinPacketLen. It does not allocate.
func ICRC(pkt []byte, sgid, dgid verbs.GID) uint32 {
	var c ICRCCache
	return c.ICRC(pkt, sgid, dgid)
}

// ICRCCache keeps the CRC of the canonical pseudo header's part before the BTH, which
// depends only on the GIDs and the packet's length: the packets of one message, or a
// batch's datagrams to one peer, share it, and then only the BTH's 12 bytes go through
// the table-driven CRC instead of 68 (that CRC was 4-5% of a sending daemon's CPU). The
// zero value is empty. It is not safe for concurrent use; callers keep one per batch.
type ICRCCache struct {
	ok         bool
	sgid, dgid verbs.GID
	n          int // the packet's length
	crc        uint32
}

// ICRC is the package's ICRC, with the prefix's CRC from c when it matches.
func (c *ICRCCache) ICRC(pkt []byte, sgid, dgid verbs.GID) uint32 {
	if len(pkt) < icrcMinIn {
		return 0
	}
	var h [canonLen]byte
	if !c.ok || c.n != len(pkt) || c.sgid != sgid || c.dgid != dgid {
		canonHeader(&h, pkt, &sgid, &dgid)
		*c = ICRCCache{ok: true, sgid: sgid, dgid: dgid, n: len(pkt), crc: crcSoft(0, h[:canonBTH])}
	} else {
		copy(h[canonBTH:], pkt[:BTHLen])
		h[canonBTH+4] = 0xff // FECN, BECN, reserved: masked
	}
	crc := crcSoft(c.crc, h[canonBTH:])
	return crc32.Update(crc, crc32.IEEETable, pkt[BTHLen:len(pkt)-ICRCLen])
}

// CheckICRC is the package's CheckICRC with c's prefix.
func (c *ICRCCache) CheckICRC(pkt []byte, sgid, dgid verbs.GID) bool {
	return len(pkt) >= icrcMinIn && c.ICRC(pkt, sgid, dgid) == StoredICRC(pkt)
}

// StoredICRC returns the ICRC stored in the last 4 bytes of pkt (little-endian), or 0
// if pkt is shorter than MinPacketLen.
func StoredICRC(pkt []byte) uint32 {
	if len(pkt) < icrcMinIn {
		return 0
	}
	return binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
}

// CheckICRC reports whether the ICRC stored in pkt is right for a packet sent from sgid
// to dgid. Packets shorter than MinPacketLen never pass.
func CheckICRC(pkt []byte, sgid, dgid verbs.GID) bool {
	var c ICRCCache
	return c.CheckICRC(pkt, sgid, dgid)
}

// MatchICRC returns the index of the first GID in dgids for which the ICRC stored in
// pkt is right, given source sgid, or -1 if there is none (or pkt is shorter than
// MinPacketLen). The CRC of the packet body is computed once; each candidate costs a
// 36-byte CRC and a GF(2) polynomial multiplication. It does not allocate.
func MatchICRC(pkt []byte, sgid verbs.GID, dgids []verbs.GID) int {
	if len(pkt) < icrcMinIn || len(dgids) == 0 {
		return -1
	}
	want := StoredICRC(pkt)
	body := pkt[BTHLen : len(pkt)-ICRCLen]
	bodyCRC := crc32.Update(0, crc32.IEEETable, body)
	shift := x8nModP(len(body))

	var h [canonLen]byte
	canonHeader(&h, pkt, &sgid, &dgids[0])
	prefix := crcSoft(0, h[:canonDGID])
	for i := range dgids {
		copy(h[canonDGID:canonDGID+16], dgids[i][:])
		hdr := crcSoft(prefix, h[canonDGID:])
		if crc32Combine(hdr, bodyCRC, shift) == want {
			return i
		}
	}
	return -1
}

// ---- CRC-32 helpers ------------------------------------------------------------------

// crcSlicing8 is the slicing-by-8 table for CRC-32/IEEE. crcSoft uses it for the
// canonical header, which lives in a stack array: handing it to hash/crc32 would make it
// escape (the hardware path is called through a function value) and allocate.
var crcSlicing8 = func() *[8][256]uint32 {
	var t [8][256]uint32
	for i := range 256 {
		c := uint32(i)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ crcPoly
			} else {
				c >>= 1
			}
		}
		t[0][i] = c
	}
	for i := range 256 {
		c := t[0][i]
		for k := 1; k < 8; k++ {
			c = t[0][c&0xff] ^ c>>8
			t[k][i] = c
		}
	}
	return &t
}()

// crcSoft continues the CRC-32/IEEE crc (as returned by crc32.ChecksumIEEE, i.e. with
// the final XOR applied) over p, exactly like crc32.Update(crc, crc32.IEEETable, p).
func crcSoft(crc uint32, p []byte) uint32 {
	t := crcSlicing8
	crc = ^crc
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xff] ^ t[6][crc>>8&0xff] ^ t[7][crc&0xff]
		p = p[8:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// The combination below follows zlib's crc32_combine (Mark Adler's x^(2^k) method):
// polynomials over GF(2) modulo the CRC polynomial P are held in reflected form (bit 31
// is x^0). For CRCs with equal initial value and final XOR,
//
//	crc(A‖B) = crc(A)·x^(8·len(B)) mod P  ⊕  crc(B)
//
// because the register contributions of the initial value cancel out.

// mulModP returns a·b mod P.
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := crcX0; a != 0 && m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a ^= m
		}
		if b&1 != 0 {
			b = b>>1 ^ crcPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2nTable[k] = x^(2^k) mod P.
var x2nTable = func() [32]uint32 {
	var t [32]uint32
	p := crcX1
	for k := range t {
		t[k] = p
		p = mulModP(p, p)
	}
	return t
}()

// x8nModP returns x^(8·n) mod P, the operator that appends n zero bytes.
func x8nModP(n int) uint32 {
	p := crcX0
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = mulModP(x2nTable[k&31], p)
		}
	}
	return p
}

// crc32Combine returns crc(A‖B) from crcA = crc(A), crcB = crc(B) and
// shift = x8nModP(len(B)).
func crc32Combine(crcA, crcB, shift uint32) uint32 {
	return mulModP(shift, crcA) ^ crcB
}
