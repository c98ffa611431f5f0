// Package mad is the encoding layer for InfiniBand management datagrams (MADs) as used
// by ipoibfs's subnet administrator and SA client: the common MAD header, the SA class
// header, and the SA records IPoIB needs (MCMemberRecord, PathRecord, ClassPortInfo).
//
// Layouts follow IBA 1.3 vol. 1: common MAD header 13.4.3, status 13.4.7, ClassPortInfo
// 13.4.8.1, RMPP header 13.6.2, SA header 15.2.1.1, PathRecord 15.2.5.16 and
// MCMemberRecord 15.2.5.17. All multi-byte fields are big-endian on the wire. Every MAD
// is exactly Size (256) bytes. The package does no I/O.
//
// Decoding is lax on purpose: Parse functions only reject input that is too short, so a
// subnet manager can answer a malformed request with the proper MAD status instead of
// dropping it. Encoding masks every field to its wire width, so an out-of-range value
// never spills into a neighbouring field. Reserved bits and bytes are written as zero and
// ignored when read.
package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Size is the length of every MAD in bytes.
const Size = 256

// HeaderSize is the length of the common MAD header.
const HeaderSize = 24

// Management classes and class versions.
const (
	BaseVersion       = 1    // the only MAD base version
	ClassSubnLID      = 0x01 // subnet management, LID routed (SMP)
	ClassSubnDirected = 0x81 // subnet management, directed route (SMP)
	ClassSA           = 0x03 // subnet administration
	ClassPerf         = 0x04 // performance management
	ClassCM           = 0x07 // communication management
	SAClassVersion    = 2
	CMClassVersion    = 2
)

// Methods. A response carries the request's method with the R bit (MethodResp) set,
// except that Set is answered with GetResp and Trap with TrapRepress (see
// ResponseMethod).
const (
	MethodGet               = 0x01
	MethodSet               = 0x02
	MethodSend              = 0x03
	MethodTrap              = 0x05
	MethodReport            = 0x06
	MethodTrapRepress       = 0x07
	MethodGetTable          = 0x12
	MethodGetTraceTable     = 0x13
	MethodGetMulti          = 0x14
	MethodDelete            = 0x15
	MethodResp              = 0x80 // the R bit
	MethodGetResp           = 0x81
	MethodReportResp        = 0x86
	MethodGetTableResp      = 0x92
	MethodGetTraceTableResp = 0x93
	MethodGetMultiResp      = 0x94
	MethodDeleteResp        = 0x95
)

// Attribute IDs: the ones common to all classes (ClassPortInfo, Notice, InformInfo)
// and the SA records.
const (
	AttrClassPortInfo            = 0x0001
	AttrNotice                   = 0x0002
	AttrInformInfo               = 0x0003
	AttrNodeRecord               = 0x0011
	AttrPortInfoRecord           = 0x0012
	AttrSLToVLTableRecord        = 0x0013
	AttrSwitchInfoRecord         = 0x0014
	AttrLinearFDBRecord          = 0x0015
	AttrRandomFDBRecord          = 0x0016
	AttrMulticastFDBRecord       = 0x0017
	AttrSMInfoRecord             = 0x0018
	AttrLinkRecord               = 0x0020
	AttrGUIDInfoRecord           = 0x0030
	AttrServiceRecord            = 0x0031
	AttrPKeyTableRecord          = 0x0033
	AttrPathRecord               = 0x0035
	AttrVLArbitrationTableRecord = 0x0036
	AttrMCMemberRecord           = 0x0038
	AttrTraceRecord              = 0x0039
	AttrMultiPathRecord          = 0x003a
	AttrServiceAssociationRecord = 0x003b
	AttrInformInfoRecord         = 0x00f3
)

// ResponseMethod returns the method of the response to a request with method m:
// Set is answered with GetResp (IBA 13.4.5; OpenSM does the same), Trap with
// TrapRepress, and everything else with the R bit added (Get→0x81, GetTable→0x92,
// Delete→0x95, Report→0x86).
func ResponseMethod(m uint8) uint8 {
	switch m {
	case MethodSet:
		return MethodGetResp
	case MethodTrap:
		return MethodTrapRepress
	}
	return m | MethodResp
}

// Status is the 16-bit MAD status in MAD byte order (bit 0 is the least significant
// bit of the big-endian field). Bits 0..4 are common to all classes; bits 8..15 are
// class specific (for the SA: table 172, the StatusSA* constants).
type Status uint16

const (
	StatusOK            Status = 0x0000
	StatusBusy          Status = 0x0001 // bit 0
	StatusRedirect      Status = 0x0002 // bit 1
	StatusBadVersion    Status = 0x0004 // field code 1: unsupported base or class version
	StatusBadMethod     Status = 0x0008 // field code 2: method not supported
	StatusBadMethodAttr Status = 0x000c // field code 3: method/attribute combination not supported
	StatusInvalidField  Status = 0x001c // field code 7: invalid value in attribute or modifier

	StatusSANoResources            Status = 0x0100 // ERR_NO_RESOURCES
	StatusSAReqInvalid             Status = 0x0200 // ERR_REQ_INVALID
	StatusSANoRecords              Status = 0x0300 // ERR_NO_RECORDS
	StatusSATooManyRecords         Status = 0x0400 // ERR_TOO_MANY_RECORDS
	StatusSAInvalidGID             Status = 0x0500 // ERR_REQ_INVALID_GID
	StatusSAInsufficientComponents Status = 0x0600 // ERR_REQ_INSUFFICIENT_COMPONENTS
	StatusSADenied                 Status = 0x0700 // ERR_REQ_DENIED
	StatusSAPrioritySuggested      Status = 0x0800 // ERR_STATUS_PRIO_SUGGESTED
)

// StatusFieldMask covers the common "invalid field" code in bits 2..4.
const StatusFieldMask Status = 0x001c

// StatusClassMask covers the class-specific code in bits 8..15.
const StatusClassMask Status = 0xff00

// FieldCode returns the common invalid-field code (bits 2..4, 0..7).
func (s Status) FieldCode() uint8 { return uint8(s&StatusFieldMask) >> 2 }

// ClassCode returns the class-specific code (bits 8..15).
func (s Status) ClassCode() uint8 { return uint8(s >> 8) }

var fieldCodeNames = [8]string{
	1: "bad version",
	2: "method not supported",
	3: "method/attribute not supported",
	7: "invalid field value",
}

var saCodeNames = [...]string{
	1: "SA no resources",
	2: "SA request invalid",
	3: "SA no records",
	4: "SA too many records",
	5: "SA invalid GID",
	6: "SA insufficient components",
	7: "SA request denied",
	8: "SA priority suggested",
}

// String describes the status, decoding the class-specific byte as an SA status, for
// example "SA no records (0x0300)".
func (s Status) String() string {
	if s == StatusOK {
		return "success"
	}
	var parts []string
	if s&StatusBusy != 0 {
		parts = append(parts, "busy")
	}
	if s&StatusRedirect != 0 {
		parts = append(parts, "redirect")
	}
	if c := s.FieldCode(); c != 0 {
		if n := fieldCodeNames[c]; n != "" {
			parts = append(parts, n)
		} else {
			parts = append(parts, fmt.Sprintf("field code %d", c))
		}
	}
	if c := s.ClassCode(); c != 0 {
		if int(c) < len(saCodeNames) && saCodeNames[c] != "" {
			parts = append(parts, saCodeNames[c])
		} else {
			parts = append(parts, fmt.Sprintf("class code 0x%02x", c))
		}
	}
	if s&0x00e0 != 0 {
		parts = append(parts, "reserved bits")
	}
	return fmt.Sprintf("%s (0x%04x)", strings.Join(parts, ", "), uint16(s))
}

// ErrShort is returned (wrapped) when a buffer is too short for what is being decoded.
var ErrShort = errors.New("mad: buffer too short")

func short(what string, n, want int) error {
	return fmt.Errorf("%w: %s needs %d bytes, have %d", ErrShort, what, want, n)
}

// Header is the 24-byte common MAD header. The 16 reserved bits after AttrID are not
// kept: they are written as zero.
type Header struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8 // including the R bit (MethodResp)
	Status        Status
	ClassSpecific uint16
	TID           uint64
	AttrID        uint16
	AttrMod       uint32
}

// Marshal writes the header into b[:HeaderSize]. It panics if b is shorter.
func (h *Header) Marshal(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = h.BaseVersion
	b[1] = h.MgmtClass
	b[2] = h.ClassVersion
	b[3] = h.Method
	binary.BigEndian.PutUint16(b[4:], uint16(h.Status))
	binary.BigEndian.PutUint16(b[6:], h.ClassSpecific)
	binary.BigEndian.PutUint64(b[8:], h.TID)
	binary.BigEndian.PutUint16(b[16:], h.AttrID)
	b[18], b[19] = 0, 0
	binary.BigEndian.PutUint32(b[20:], h.AttrMod)
}

// ParseHeader decodes the common header from b, which must hold at least HeaderSize
// bytes. No field is validated.
func ParseHeader(b []byte, h *Header) error {
	if len(b) < HeaderSize {
		return short("MAD header", len(b), HeaderSize)
	}
	h.BaseVersion = b[0]
	h.MgmtClass = b[1]
	h.ClassVersion = b[2]
	h.Method = b[3]
	h.Status = Status(binary.BigEndian.Uint16(b[4:]))
	h.ClassSpecific = binary.BigEndian.Uint16(b[6:])
	h.TID = binary.BigEndian.Uint64(b[8:])
	h.AttrID = binary.BigEndian.Uint16(b[16:])
	h.AttrMod = binary.BigEndian.Uint32(b[20:])
	return nil
}

// IsResponse reports whether the R bit of the method is set. (TrapRepress, the answer
// to a Trap, has no R bit and is not reported as a response.)
func (h Header) IsResponse() bool { return h.Method&MethodResp != 0 }

// TIDLow returns the low 32 bits of the transaction ID. The kernel MAD layer (and
// umad2sim) overwrite bits 32..47 of a request's TID with the agent number, so
// responses must be matched on these bits only.
func (h Header) TIDLow() uint32 { return uint32(h.TID) }
