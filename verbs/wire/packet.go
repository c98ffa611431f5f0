package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"ipoibfs/verbs"
)

// UDPPort is the RoCEv2 UDP destination port, also the default of Wireshark's
// infiniband.rroce.port preference.
const UDPPort = 4791

// UDPSrcPort is the UDP source port of the canonical pseudo header (and of the frames
// written by PcapWriter): the bottom of the dynamic range, as rxe uses before adding
// its per-QP hash.
const UDPSrcPort = 0xC000

// Header and trailer sizes in bytes.
const (
	BTHLen  = 12
	DETHLen = 8
	AETHLen = 4
	ImmLen  = 4
	ICRCLen = 4
	// MinPacketLen is the size of the smallest well-formed packet: a BTH and the ICRC.
	MinPacketLen = BTHLen + ICRCLen
)

// Opcodes (BTH byte 0). The top three bits are the transport: RC 000, UC 001, RD 010,
// UD 011.
const (
	OpRCSendFirst   = 0x00
	OpRCSendMiddle  = 0x01
	OpRCSendLast    = 0x02
	OpRCSendLastImm = 0x03
	OpRCSendOnly    = 0x04
	OpRCSendOnlyImm = 0x05
	OpRCAck         = 0x11
	OpUDSendOnly    = 0x64
	OpUDSendOnlyImm = 0x65
)

// Largest values of the 24-bit fields.
const (
	MaxQPN = 0xffffff
	MaxPSN = 0xffffff
	MaxMSN = 0xffffff
)

// opFlags describes which extension headers follow the BTH for an opcode.
type opFlags uint8

const (
	opOK   opFlags = 1 << iota // supported by this package
	opDETH                     // DETH follows the BTH
	opAETH                     // AETH follows
	opImm                      // ImmDt follows (after DETH/AETH)
)

var opTable = [256]opFlags{
	OpRCSendFirst:   opOK,
	OpRCSendMiddle:  opOK,
	OpRCSendLast:    opOK,
	OpRCSendLastImm: opOK | opImm,
	OpRCSendOnly:    opOK,
	OpRCSendOnlyImm: opOK | opImm,
	OpRCAck:         opOK | opAETH,
	OpUDSendOnly:    opOK | opDETH,
	OpUDSendOnlyImm: opOK | opDETH | opImm,
}

// IsUD reports whether op belongs to the Unreliable Datagram transport (0x60..0x7f).
func IsUD(op uint8) bool { return op>>5 == 3 }

// IsRC reports whether op belongs to the Reliable Connection transport (0x00..0x1f).
func IsRC(op uint8) bool { return op>>5 == 0 }

// Supported reports whether this package encodes and parses op.
func Supported(op uint8) bool { return opTable[op]&opOK != 0 }

// HasDETH reports whether a packet with opcode op carries a DETH (all UD opcodes).
func HasDETH(op uint8) bool { return IsUD(op) }

// HasAETH reports whether a supported opcode op carries an AETH.
func HasAETH(op uint8) bool { return opTable[op]&opAETH != 0 }

// HasImm reports whether a supported opcode op carries immediate data.
func HasImm(op uint8) bool { return opTable[op]&opImm != 0 }

// HeaderLen returns the number of header bytes (BTH and the extension headers the
// opcode calls for) before the payload.
func HeaderLen(op uint8) int {
	n := BTHLen
	if HasDETH(op) {
		n += DETHLen
	}
	f := opTable[op]
	if f&opAETH != 0 {
		n += AETHLen
	}
	if f&opImm != 0 {
		n += ImmLen
	}
	return n
}

// PadLen returns the number of pad bytes that follow a payload of n bytes.
func PadLen(n int) int { return -n & 3 }

// BTH is the 12-byte Base Transport Header.
type BTH struct {
	Opcode uint8
	SE     bool   // solicited event
	MigReq bool   // migration state
	PadCnt uint8  // 2 bits; AppendTo computes it from the payload length
	TVer   uint8  // 4 bits, must be 0
	PKey   uint16 // partition key
	FECN   bool   // variant, masked out of the ICRC
	BECN   bool   // variant, masked out of the ICRC
	DestQP uint32 // 24 bits
	AckReq bool
	PSN    uint32 // 24 bits
}

// DETH is the 8-byte Datagram Extended Transport Header of UD packets.
type DETH struct {
	QKey  uint32
	SrcQP uint32 // 24 bits
}

// AETH is the 4-byte ACK Extended Transport Header.
type AETH struct {
	Syndrome uint8
	MSN      uint32 // 24 bits
}

// Packet is a decoded fabric packet. Headers the opcode does not call for are zero
// after Parse and ignored by AppendTo.
type Packet struct {
	BTH     BTH
	DETH    DETH   // present iff the opcode is UD (0x60..0x7f)
	AETH    AETH   // present iff the opcode carries an AETH (RC ACKNOWLEDGE)
	Imm     uint32 // present iff the opcode carries ImmDt (0x03, 0x05, 0x65)
	Payload []byte // after Parse: aliases the input, pad and ICRC removed
}

// HeaderLen returns the number of header bytes p.BTH.Opcode calls for.
func (p *Packet) HeaderLen() int { return HeaderLen(p.BTH.Opcode) }

// EncodedLen returns the length of the encoded packet: headers, payload, pad and ICRC.
func (p *Packet) EncodedLen() int {
	return p.HeaderLen() + len(p.Payload) + PadLen(len(p.Payload)) + ICRCLen
}

// AppendTo appends the encoded packet (headers, payload, zero pad with PadCnt set from
// the payload length, ICRC for sgid/dgid) to b and returns the extended slice. p is not
// modified; p.BTH.PadCnt is ignored. 24-bit fields are truncated to 24 bits, TVer to 4.
// It does not allocate when b has enough capacity.
func (p *Packet) AppendTo(b []byte, sgid, dgid verbs.GID) []byte {
	var c ICRCCache
	return p.AppendToCached(b, sgid, dgid, &c)
}

// AppendToCached is AppendTo computing the ICRC with c (a message's packets share
// their pseudo header's prefix).
func (p *Packet) AppendToCached(b []byte, sgid, dgid verbs.GID, c *ICRCCache) []byte {
	op := p.BTH.Opcode
	hl := HeaderLen(op)
	pad := PadLen(len(p.Payload))
	n := hl + len(p.Payload) + pad + ICRCLen
	start := len(b)
	b = slices.Grow(b, n)[:start+n]
	pkt := b[start:]

	h := &p.BTH
	pkt[0] = op
	pkt[1] = b2u(h.SE)<<7 | b2u(h.MigReq)<<6 | uint8(pad)<<4 | h.TVer&0x0f
	binary.BigEndian.PutUint16(pkt[2:], h.PKey)
	binary.BigEndian.PutUint32(pkt[4:], h.DestQP&MaxQPN)
	pkt[4] = b2u(h.FECN)<<7 | b2u(h.BECN)<<6
	binary.BigEndian.PutUint32(pkt[8:], h.PSN&MaxPSN)
	pkt[8] = b2u(h.AckReq) << 7

	off := BTHLen
	if HasDETH(op) {
		binary.BigEndian.PutUint32(pkt[off:], p.DETH.QKey)
		binary.BigEndian.PutUint32(pkt[off+4:], p.DETH.SrcQP&MaxQPN)
		off += DETHLen
	}
	f := opTable[op]
	if f&opAETH != 0 {
		binary.BigEndian.PutUint32(pkt[off:], p.AETH.MSN&MaxMSN)
		pkt[off] = p.AETH.Syndrome
		off += AETHLen
	}
	if f&opImm != 0 {
		binary.BigEndian.PutUint32(pkt[off:], p.Imm)
		off += ImmLen
	}
	off += copy(pkt[off:], p.Payload)
	clear(pkt[off : off+pad])
	binary.LittleEndian.PutUint32(pkt[n-ICRCLen:], c.ICRC(pkt, sgid, dgid))
	return b
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// Sentinel errors matched by the *ParseError values Parse returns.
var (
	ErrTruncated = errors.New("truncated packet")
	ErrVersion   = errors.New("unsupported transport header version")
	ErrOpcode    = errors.New("unsupported opcode")
	ErrPad       = errors.New("pad count beyond payload")
)

// ParseError describes why Parse rejected a packet. errors.Is(err, ErrX) matches its
// sentinel Err.
type ParseError struct {
	Err    error  // one of ErrTruncated, ErrVersion, ErrOpcode, ErrPad
	Opcode uint8  // BTH opcode, if the BTH was complete
	Len    int    // length of the rejected packet
	Detail string // what exactly was wrong
}

func (e *ParseError) Error() string {
	return "wire: " + e.Err.Error() + ": " + e.Detail
}

func (e *ParseError) Unwrap() error { return e.Err }

// Parse decodes the headers of the encoded packet b into p (which it overwrites) and
// sets p.Payload to the payload inside b, without pad and ICRC. It does not check the
// ICRC (see CheckICRC and MatchICRC). A packet is rejected with a *ParseError when it is
// shorter than its BTH (ErrTruncated), has TVer != 0 (ErrVersion), an opcode this
// package does not support (ErrOpcode), is shorter than its headers plus ICRC or not a
// multiple of 4 bytes long as every IB packet is (ErrTruncated), or has a PadCnt larger
// than the bytes between headers and ICRC (ErrPad). On error p is zeroed.
func Parse(b []byte, p *Packet) error {
	*p = Packet{}
	if len(b) < BTHLen {
		return &ParseError{Err: ErrTruncated, Len: len(b),
			Detail: fmt.Sprintf("%d bytes, shorter than the %d-byte BTH", len(b), BTHLen)}
	}
	op := b[0]
	if tver := b[1] & 0x0f; tver != 0 {
		return &ParseError{Err: ErrVersion, Opcode: op, Len: len(b),
			Detail: fmt.Sprintf("BTH TVer %d, want 0", tver)}
	}
	f := opTable[op]
	if f&opOK == 0 {
		return &ParseError{Err: ErrOpcode, Opcode: op, Len: len(b),
			Detail: fmt.Sprintf("opcode 0x%02x", op)}
	}
	hl := HeaderLen(op)
	if len(b) < hl+ICRCLen {
		return &ParseError{Err: ErrTruncated, Opcode: op, Len: len(b),
			Detail: fmt.Sprintf("%d bytes, opcode 0x%02x needs %d bytes of headers and %d of ICRC",
				len(b), op, hl, ICRCLen)}
	}
	if len(b)%4 != 0 {
		return &ParseError{Err: ErrTruncated, Opcode: op, Len: len(b),
			Detail: fmt.Sprintf("length %d is not a multiple of 4", len(b))}
	}
	pad := int(b[1]>>4) & 3
	end := len(b) - ICRCLen - pad
	if end < hl {
		return &ParseError{Err: ErrPad, Opcode: op, Len: len(b),
			Detail: fmt.Sprintf("PadCnt %d but only %d bytes between headers and ICRC",
				pad, len(b)-ICRCLen-hl)}
	}

	h := &p.BTH
	h.Opcode = op
	h.SE = b[1]&0x80 != 0
	h.MigReq = b[1]&0x40 != 0
	h.PadCnt = uint8(pad)
	h.PKey = binary.BigEndian.Uint16(b[2:])
	h.FECN = b[4]&0x80 != 0
	h.BECN = b[4]&0x40 != 0
	h.DestQP = binary.BigEndian.Uint32(b[4:]) & MaxQPN
	h.AckReq = b[8]&0x80 != 0
	h.PSN = binary.BigEndian.Uint32(b[8:]) & MaxPSN

	off := BTHLen
	if HasDETH(op) {
		p.DETH.QKey = binary.BigEndian.Uint32(b[off:])
		p.DETH.SrcQP = binary.BigEndian.Uint32(b[off+4:]) & MaxQPN
		off += DETHLen
	}
	if f&opAETH != 0 {
		p.AETH.Syndrome = b[off]
		p.AETH.MSN = binary.BigEndian.Uint32(b[off:]) & MaxMSN
		off += AETHLen
	}
	if f&opImm != 0 {
		p.Imm = binary.BigEndian.Uint32(b[off:])
		off += ImmLen
	}
	p.Payload = b[off:end:end]
	return nil
}
