package mad

import "encoding/binary"

// SA MAD geometry: the common header, then a 32-byte SA header (12-byte RMPP header,
// SM_Key, AttributeOffset, reserved, ComponentMask), then 200 bytes of record data.
const (
	SAHeaderSize = 32                        // SA header after the common header
	SADataOffset = HeaderSize + SAHeaderSize // 56: first byte of the record data
	SADataSize   = Size - SADataOffset       // 200
)

// rmppSAHeaderLen is the part of the SA header after the RMPP header (SM_Key 8,
// AttributeOffset 2, reserved 2, ComponentMask 8). RMPP's PayloadLength counts it.
const rmppSAHeaderLen = 20

// RMPP header values (IBA 13.6.2). This package builds only single-segment transfers;
// multi-segment RMPP (windows, ACKs, reassembly) is not implemented yet.
const (
	RMPPVersion1   = 1
	RMPPTypeData   = 1
	RMPPTypeAck    = 2
	RMPPTypeStop   = 3
	RMPPTypeAbort  = 4
	RMPPFlagActive = 0x01
	RMPPFlagFirst  = 0x02
	RMPPFlagLast   = 0x04
)

// SAHeader is the SA class header that follows the common header: the RMPP header,
// SM_Key, AttributeOffset and ComponentMask. The 16 reserved bits after
// AttributeOffset are written as zero.
type SAHeader struct {
	RMPPVersion       uint8
	RMPPType          uint8
	RMPPRespTimeFlags uint8 // RRespTime in bits 7..3, flags (Active, First, Last) in 2..0
	RMPPStatus        uint8
	SegNum            uint32
	PayloadLen        uint32 // PayloadLength, or NewWindowLast in an ACK
	SMKey             uint64
	AttrOffset        uint16 // record stride of a table response, in 8-byte units
	CompMask          uint64
}

// Marshal writes the SA header into b[:SAHeaderSize] (b starts right after the common
// header). It panics if b is shorter.
func (s *SAHeader) Marshal(b []byte) {
	_ = b[SAHeaderSize-1]
	b[0] = s.RMPPVersion
	b[1] = s.RMPPType
	b[2] = s.RMPPRespTimeFlags
	b[3] = s.RMPPStatus
	binary.BigEndian.PutUint32(b[4:], s.SegNum)
	binary.BigEndian.PutUint32(b[8:], s.PayloadLen)
	binary.BigEndian.PutUint64(b[12:], s.SMKey)
	binary.BigEndian.PutUint16(b[20:], s.AttrOffset)
	b[22], b[23] = 0, 0
	binary.BigEndian.PutUint64(b[24:], s.CompMask)
}

// Unmarshal decodes the SA header from b, which must hold SAHeaderSize bytes.
func (s *SAHeader) Unmarshal(b []byte) error {
	if len(b) < SAHeaderSize {
		return short("SA header", len(b), SAHeaderSize)
	}
	s.RMPPVersion = b[0]
	s.RMPPType = b[1]
	s.RMPPRespTimeFlags = b[2]
	s.RMPPStatus = b[3]
	s.SegNum = binary.BigEndian.Uint32(b[4:])
	s.PayloadLen = binary.BigEndian.Uint32(b[8:])
	s.SMKey = binary.BigEndian.Uint64(b[12:])
	s.AttrOffset = binary.BigEndian.Uint16(b[20:])
	s.CompMask = binary.BigEndian.Uint64(b[24:])
	return nil
}

// SAMAD is a whole SA MAD: common header, SA header and the 200-byte data area.
type SAMAD struct {
	Header
	SA   SAHeader
	Data [SADataSize]byte
}

// NewSARequest returns an SA request (base version 1, class SA, class version 2) with
// the given method, attribute, transaction ID and component mask; the data area is
// zero.
func NewSARequest(method uint8, attr uint16, tid uint64, mask uint64) SAMAD {
	return SAMAD{
		Header: Header{
			BaseVersion:  BaseVersion,
			MgmtClass:    ClassSA,
			ClassVersion: SAClassVersion,
			Method:       method,
			TID:          tid,
			AttrID:       attr,
		},
		SA: SAHeader{CompMask: mask},
	}
}

// Response returns the skeleton of the response to m: the common header copied with
// the response method (ResponseMethod) and the given status, the request's component
// mask, SM_Key zero (C15-0.1.5), no RMPP, AttributeOffset zero and an empty data area.
// Fill the data with SetTableRecords (which also sets AttributeOffset) or copy a
// record into Record().
func (m *SAMAD) Response(status Status) SAMAD {
	r := SAMAD{Header: m.Header, SA: SAHeader{CompMask: m.SA.CompMask}}
	r.Method = ResponseMethod(m.Method)
	r.Status = status
	return r
}

// ErrorResponse is Response plus a copy of the request's data area, which is how
// OpenSM answers with an error status (AttributeOffset stays 0).
func (m *SAMAD) ErrorResponse(status Status) SAMAD {
	r := m.Response(status)
	r.Data = m.Data
	return r
}

// Record returns the data area (200 bytes), which aliases m.Data.
func (m *SAMAD) Record() []byte { return m.Data[:] }

// Marshal writes the MAD into b[:Size]. It panics if b is shorter.
func (m *SAMAD) Marshal(b []byte) {
	_ = b[Size-1]
	m.Header.Marshal(b)
	m.SA.Marshal(b[HeaderSize:])
	copy(b[SADataOffset:Size], m.Data[:])
}

// Bytes returns the MAD as a new Size-byte slice.
func (m *SAMAD) Bytes() []byte {
	b := make([]byte, Size)
	m.Marshal(b)
	return b
}

// ParseSA decodes an SA MAD from b[:Size]. b must hold at least Size bytes (a short
// MAD is an error); anything beyond Size is ignored. Header fields are not validated:
// check MgmtClass, ClassVersion and Method yourself.
func ParseSA(b []byte, m *SAMAD) error {
	if len(b) < Size {
		return short("SA MAD", len(b), Size)
	}
	_ = ParseHeader(b, &m.Header)
	_ = m.SA.Unmarshal(b[HeaderSize:])
	copy(m.Data[:], b[SADataOffset:Size])
	return nil
}

// AttrOffsetFor returns the AttributeOffset for records of size bytes: the size
// rounded up to 8-byte units (MCMemberRecord 52 → 7, PathRecord 64 → 8).
func AttrOffsetFor(size int) uint16 { return uint16((size + 7) / 8) }

// SetTableRecords lays recs out in the data area with a stride of AttrOffsetFor(size)*8
// bytes, sets AttributeOffset, zeroes the rest of the data area and returns how many
// records fit (the first n of recs). Each record is truncated or zero-padded to size
// bytes. Use it for a single-record Get/Set/Delete response too (OpenSM sets the
// AttributeOffset there as well).
//
// Only one MAD is filled: a GetTable answer with more records needs a multi-segment
// RMPP transfer, which this package does not implement yet. For a table response
// that fits in one MAD, call SetSingleSegmentRMPP(n) afterwards so that RMPP
// requesters (the kernel's ib_sa) learn the record count.
func (m *SAMAD) SetTableRecords(size int, recs [][]byte) (n int) {
	m.Data = [SADataSize]byte{}
	if size <= 0 {
		m.SA.AttrOffset = 0
		return 0
	}
	m.SA.AttrOffset = AttrOffsetFor(size)
	stride := int(m.SA.AttrOffset) * 8
	for _, r := range recs {
		off := n * stride
		if off+size > SADataSize {
			break
		}
		copy(m.Data[off:off+size], r)
		n++
	}
	return n
}

// SetSingleSegmentRMPP marks the MAD as the only segment of an RMPP transfer holding n
// records of AttributeOffset*8 bytes: RMPP version 1, type DATA, flags
// Active|First|Last, segment 1, PayloadLength = 20 (the SA header after the RMPP
// header) + n*stride.
func (m *SAMAD) SetSingleSegmentRMPP(n int) {
	m.SA.RMPPVersion = RMPPVersion1
	m.SA.RMPPType = RMPPTypeData
	m.SA.RMPPRespTimeFlags = m.SA.RMPPRespTimeFlags&^0x07 | RMPPFlagActive | RMPPFlagFirst | RMPPFlagLast
	m.SA.RMPPStatus = 0
	m.SA.SegNum = 1
	m.SA.PayloadLen = uint32(rmppSAHeaderLen + n*int(m.SA.AttrOffset)*8)
}

// TableRecords returns the records in the data area, each AttributeOffset*8 bytes long
// (aliasing m.Data). If the MAD is an active RMPP DATA segment, the count comes from
// PayloadLength; otherwise every whole stride in the data area is returned, including
// trailing all-zero slots. It returns nil if AttributeOffset is zero.
func (m *SAMAD) TableRecords() [][]byte {
	stride := int(m.SA.AttrOffset) * 8
	if stride == 0 {
		return nil
	}
	n := SADataSize / stride
	if m.SA.RMPPVersion != 0 && m.SA.RMPPRespTimeFlags&RMPPFlagActive != 0 && m.SA.RMPPType == RMPPTypeData {
		if p := int(m.SA.PayloadLen); p >= rmppSAHeaderLen {
			n = min(n, (p-rmppSAHeaderLen)/stride)
		} else {
			n = 0
		}
	}
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = m.Data[i*stride : (i+1)*stride]
	}
	return recs
}
