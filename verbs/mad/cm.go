package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"ipoibfs/verbs"
)

// Communication Management MADs (IBA 1.3 vol. 1 chapter 12.6, class 0x07, class
// version 2). A CM MAD is the 24-byte common header followed directly by a 232-byte
// message: unlike the SA there is no class header. Every CM message is sent with method
// Send (0x03); replies are matched by communication IDs, not by the R bit, although a
// REP, REJ or DREP carries the transaction ID of the message it answers.
//
// The message structs below keep every field of IBA tables 106-113 at its bit
// position. Fields narrower than their Go type are masked on encoding. Private data is
// a fixed-size array because the wire carries no length: a receiver always sees the
// whole area, zero padded by the sender.

// CM message geometry.
const (
	CMDataOffset = HeaderSize        // 24: first byte of the CM message
	CMDataSize   = Size - HeaderSize // 232
)

// CM attribute IDs (IBA table 104).
const (
	AttrCMClassPortInfo = 0x0001
	AttrCMREQ           = 0x0010
	AttrCMMRA           = 0x0011
	AttrCMREJ           = 0x0012
	AttrCMREP           = 0x0013
	AttrCMRTU           = 0x0014
	AttrCMDREQ          = 0x0015
	AttrCMDREP          = 0x0016
	AttrCMSIDRREQ       = 0x0017
	AttrCMSIDRREP       = 0x0018
	AttrCMLAP           = 0x0019
	AttrCMAPR           = 0x001a
)

// Private data and additional-information sizes of the CM messages.
const (
	CMREQPrivateDataSize  = 92
	CMMRAPrivateDataSize  = 222
	CMREJPrivateDataSize  = 148
	CMREJARISize          = 72
	CMREPPrivateDataSize  = 196
	CMRTUPrivateDataSize  = 224
	CMDREQPrivateDataSize = 220
	CMDREPPrivateDataSize = 224
)

// CM transport service types (REQ Transport Service Type).
const (
	CMTransportRC  = 0
	CMTransportUC  = 1
	CMTransportRD  = 2
	CMTransportExt = 3 // see ExtendedTransportType (1 = XRC)
)

// Values of the "message MRAed / REJected" fields of MRA and REJ.
const (
	CMMsgREQ   = 0
	CMMsgREP   = 1
	CMMsgOther = 2 // LAP for MRA; anything else for REJ
)

// REP Failover Accepted values.
const (
	CMFailoverAccepted    = 0
	CMFailoverRejected    = 1
	CMFailoverUnsupported = 2
)

// CMRejectReason is the 16-bit REJ reason (IBA table 109; kernel enum
// ib_cm_rej_reason).
type CMRejectReason uint16

const (
	RejNoQP                      CMRejectReason = 1
	RejNoEEC                     CMRejectReason = 2
	RejNoResources               CMRejectReason = 3
	RejTimeout                   CMRejectReason = 4
	RejUnsupported               CMRejectReason = 5
	RejInvalidCommID             CMRejectReason = 6
	RejInvalidCommInstance       CMRejectReason = 7
	RejInvalidServiceID          CMRejectReason = 8
	RejInvalidTransportType      CMRejectReason = 9
	RejStaleConn                 CMRejectReason = 10
	RejRDCNotExist               CMRejectReason = 11
	RejInvalidGID                CMRejectReason = 12
	RejInvalidLID                CMRejectReason = 13
	RejInvalidSL                 CMRejectReason = 14
	RejInvalidTrafficClass       CMRejectReason = 15
	RejInvalidHopLimit           CMRejectReason = 16
	RejInvalidPacketRate         CMRejectReason = 17
	RejInvalidAltGID             CMRejectReason = 18
	RejInvalidAltLID             CMRejectReason = 19
	RejInvalidAltSL              CMRejectReason = 20
	RejInvalidAltTrafficClass    CMRejectReason = 21
	RejInvalidAltHopLimit        CMRejectReason = 22
	RejInvalidAltPacketRate      CMRejectReason = 23
	RejPortCMRedirect            CMRejectReason = 24
	RejPortRedirect              CMRejectReason = 25
	RejInvalidMTU                CMRejectReason = 26
	RejInsufficientRespResources CMRejectReason = 27
	RejConsumerDefined           CMRejectReason = 28
	RejInvalidRNRRetry           CMRejectReason = 29
	RejDuplicateLocalCommID      CMRejectReason = 30
	RejInvalidClassVersion       CMRejectReason = 31
	RejInvalidFlowLabel          CMRejectReason = 32
	RejInvalidAltFlowLabel       CMRejectReason = 33
	RejVendorOptionNotSupported  CMRejectReason = 35
)

var rejectReasonNames = map[CMRejectReason]string{
	RejNoQP: "no QP", RejNoEEC: "no EEC", RejNoResources: "no resources", RejTimeout: "timeout",
	RejUnsupported: "unsupported request", RejInvalidCommID: "invalid communication ID",
	RejInvalidCommInstance: "invalid communication instance", RejInvalidServiceID: "invalid service ID",
	RejInvalidTransportType: "invalid transport service type", RejStaleConn: "stale connection",
	RejRDCNotExist: "RDC does not exist", RejInvalidGID: "invalid primary GID",
	RejInvalidLID: "invalid primary LID", RejInvalidSL: "invalid primary SL",
	RejInvalidTrafficClass: "invalid primary traffic class", RejInvalidHopLimit: "invalid primary hop limit",
	RejInvalidPacketRate: "invalid primary packet rate", RejInvalidAltGID: "invalid alternate GID",
	RejInvalidAltLID: "invalid alternate LID", RejInvalidAltSL: "invalid alternate SL",
	RejInvalidAltTrafficClass: "invalid alternate traffic class", RejInvalidAltHopLimit: "invalid alternate hop limit",
	RejInvalidAltPacketRate: "invalid alternate packet rate", RejPortCMRedirect: "port and CM redirection",
	RejPortRedirect: "port redirection", RejInvalidMTU: "invalid path MTU",
	RejInsufficientRespResources: "insufficient responder resources", RejConsumerDefined: "consumer reject",
	RejInvalidRNRRetry: "invalid RNR retry count", RejDuplicateLocalCommID: "duplicate local communication ID",
	RejInvalidClassVersion: "unsupported class version", RejInvalidFlowLabel: "invalid primary flow label",
	RejInvalidAltFlowLabel: "invalid alternate flow label", RejVendorOptionNotSupported: "vendor option not supported",
}

func (r CMRejectReason) String() string {
	if n, ok := rejectReasonNames[r]; ok {
		return fmt.Sprintf("%s (%d)", n, uint16(r))
	}
	return fmt.Sprintf("reject reason %d", uint16(r))
}

// CMMessage is one of the CM message structs. Marshal writes the message into the
// 232-byte data area b[:CMDataSize] (b starts right after the common header) and
// panics if b is shorter; Unmarshal decodes it and fails only if b is shorter.
type CMMessage interface {
	AttrID() uint16
	Marshal(b []byte)
	Unmarshal(b []byte) error
}

// ErrUnknownCMAttr is returned (wrapped) by ParseCM for an attribute it has no message
// type for.
var ErrUnknownCMAttr = errors.New("mad: unknown CM attribute")

// NewCMMAD returns a complete 256-byte CM MAD: base version 1, class CM, class version
// 2, method Send, the given transaction ID and msg's attribute ID, followed by msg.
func NewCMMAD(tid uint64, msg CMMessage) []byte {
	b := make([]byte, Size)
	h := Header{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: CMClassVersion,
		Method: MethodSend, TID: tid, AttrID: msg.AttrID()}
	h.Marshal(b)
	msg.Marshal(b[CMDataOffset:])
	return b
}

// NewCMMessage returns a zero message for a CM attribute ID, or nil if the attribute
// has no message type here (ClassPortInfo, SIDR, LAP and APR).
func NewCMMessage(attr uint16) CMMessage {
	switch attr {
	case AttrCMREQ:
		return new(CMREQ)
	case AttrCMMRA:
		return new(CMMRA)
	case AttrCMREJ:
		return new(CMREJ)
	case AttrCMREP:
		return new(CMREP)
	case AttrCMRTU:
		return new(CMRTU)
	case AttrCMDREQ:
		return new(CMDREQ)
	case AttrCMDREP:
		return new(CMDREP)
	}
	return nil
}

// ParseCM decodes a CM MAD: the common header and, by attribute ID, the message. b
// must hold at least Size bytes. The header is not validated (check MgmtClass,
// ClassVersion and Method yourself); an attribute without a message type returns the
// header, a nil message and an error wrapping ErrUnknownCMAttr.
func ParseCM(b []byte) (Header, CMMessage, error) {
	var h Header
	if len(b) < Size {
		return h, nil, short("CM MAD", len(b), Size)
	}
	_ = ParseHeader(b, &h)
	msg := NewCMMessage(h.AttrID)
	if msg == nil {
		return h, nil, fmt.Errorf("%w %#04x", ErrUnknownCMAttr, h.AttrID)
	}
	_ = msg.Unmarshal(b[CMDataOffset:Size])
	return h, msg, nil
}

// CMTimeout converts a 5-bit CM time exponent (CM response timeout, MRA service
// timeout, local ACK timeout) to its duration, 4.096 µs × 2^t.
func CMTimeout(t uint8) time.Duration { return 4096 * time.Nanosecond << (t & 0x1f) }

// be24 reads the 24-bit big-endian value at b[0:3].
func be24(b []byte) uint32 { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

// put24 writes the low 24 bits of v big-endian into b[0:3].
func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

func bit(v bool, mask uint8) uint8 {
	if v {
		return mask
	}
	return 0
}

// CMPathSize is the size of the primary and alternate path blocks of a REQ.
const CMPathSize = 44

// CMPath is one path block of a REQ (bytes 52..95 for the primary path, 96..139 for
// the alternate). "Local" is the active side (the REQ sender).
type CMPath struct {
	LocalLID        verbs.LID
	RemoteLID       verbs.LID
	LocalGID        verbs.GID
	RemoteGID       verbs.GID
	FlowLabel       uint32     // 20 bits
	PacketRate      verbs.Rate // 6 bits
	TrafficClass    uint8
	HopLimit        uint8
	SL              uint8 // 4 bits
	SubnetLocal     bool
	LocalACKTimeout uint8 // 5 bits
}

// marshal writes the path into b[:CMPathSize]; the low 3 bits of the last byte are
// left as zero (the REQ uses one of them for SAP support).
func (p *CMPath) marshal(b []byte) {
	_ = b[CMPathSize-1]
	binary.BigEndian.PutUint16(b[0:], uint16(p.LocalLID))
	binary.BigEndian.PutUint16(b[2:], uint16(p.RemoteLID))
	copy(b[4:20], p.LocalGID[:])
	copy(b[20:36], p.RemoteGID[:])
	// Flow label 20 bits, reserved 6, packet rate 6.
	binary.BigEndian.PutUint32(b[36:], (p.FlowLabel&0xfffff)<<12|uint32(p.PacketRate&0x3f))
	b[40] = p.TrafficClass
	b[41] = p.HopLimit
	b[42] = (p.SL&0xf)<<4 | bit(p.SubnetLocal, 0x08)
	b[43] = (p.LocalACKTimeout & 0x1f) << 3
}

func (p *CMPath) unmarshal(b []byte) {
	_ = b[CMPathSize-1]
	p.LocalLID = verbs.LID(binary.BigEndian.Uint16(b[0:]))
	p.RemoteLID = verbs.LID(binary.BigEndian.Uint16(b[2:]))
	copy(p.LocalGID[:], b[4:20])
	copy(p.RemoteGID[:], b[20:36])
	w := binary.BigEndian.Uint32(b[36:])
	p.FlowLabel = w >> 12
	p.PacketRate = verbs.Rate(w & 0x3f)
	p.TrafficClass = b[40]
	p.HopLimit = b[41]
	p.SL = b[42] >> 4
	p.SubnetLocal = b[42]&0x08 != 0
	p.LocalACKTimeout = b[43] >> 3
}

// CMREQ is the connection request (attribute 0x0010, IBA table 106). Offsets in the
// comments are bytes into the data area.
type CMREQ struct {
	LocalCommID             uint32                     // 0
	ServiceID               uint64                     // 8
	LocalCAGUID             verbs.GUID                 // 16
	LocalQKey               uint32                     // 28
	LocalQPN                verbs.QPN                  // 32, 24 bits
	ResponderResources      uint8                      // 35
	LocalEECN               uint32                     // 36, 24 bits
	InitiatorDepth          uint8                      // 39
	RemoteEECN              uint32                     // 40, 24 bits
	RemoteCMResponseTimeout uint8                      // 43 bits 7..3
	TransportServiceType    uint8                      // 43 bits 2..1 (CMTransport*)
	EndToEndFlowControl     bool                       // 43 bit 0
	StartingPSN             uint32                     // 44, 24 bits
	LocalCMResponseTimeout  uint8                      // 47 bits 7..3
	RetryCount              uint8                      // 47 bits 2..0
	PKey                    verbs.PKey                 // 48
	PathMTU                 verbs.MTU                  // 50 bits 7..4
	RDCExists               bool                       // 50 bit 3
	RNRRetryCount           uint8                      // 50 bits 2..0
	MaxCMRetries            uint8                      // 51 bits 7..4
	SRQ                     bool                       // 51 bit 3
	ExtendedTransportType   uint8                      // 51 bits 2..0 (1 = XRC)
	Primary                 CMPath                     // 52..95
	Alternate               CMPath                     // 96..139
	SAPSupported            bool                       // 139 bit 2 (IBA 1.4; reserved before)
	PrivateData             [CMREQPrivateDataSize]byte // 140..231
}

func (*CMREQ) AttrID() uint16 { return AttrCMREQ }

func (r *CMREQ) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], r.LocalCommID)
	clear(b[4:8])
	binary.BigEndian.PutUint64(b[8:], r.ServiceID)
	binary.BigEndian.PutUint64(b[16:], uint64(r.LocalCAGUID))
	clear(b[24:28])
	binary.BigEndian.PutUint32(b[28:], r.LocalQKey)
	put24(b[32:], uint32(r.LocalQPN))
	b[35] = r.ResponderResources
	put24(b[36:], r.LocalEECN)
	b[39] = r.InitiatorDepth
	put24(b[40:], r.RemoteEECN)
	b[43] = (r.RemoteCMResponseTimeout&0x1f)<<3 | (r.TransportServiceType&3)<<1 | bit(r.EndToEndFlowControl, 0x01)
	put24(b[44:], r.StartingPSN)
	b[47] = (r.LocalCMResponseTimeout&0x1f)<<3 | r.RetryCount&7
	binary.BigEndian.PutUint16(b[48:], uint16(r.PKey))
	b[50] = uint8(r.PathMTU&0xf)<<4 | bit(r.RDCExists, 0x08) | r.RNRRetryCount&7
	b[51] = (r.MaxCMRetries&0xf)<<4 | bit(r.SRQ, 0x08) | r.ExtendedTransportType&7
	r.Primary.marshal(b[52:96])
	r.Alternate.marshal(b[96:140])
	b[139] |= bit(r.SAPSupported, 0x04)
	copy(b[140:CMDataSize], r.PrivateData[:])
}

func (r *CMREQ) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM REQ", len(b), CMDataSize)
	}
	r.LocalCommID = binary.BigEndian.Uint32(b[0:])
	r.ServiceID = binary.BigEndian.Uint64(b[8:])
	r.LocalCAGUID = verbs.GUID(binary.BigEndian.Uint64(b[16:]))
	r.LocalQKey = binary.BigEndian.Uint32(b[28:])
	r.LocalQPN = verbs.QPN(be24(b[32:]))
	r.ResponderResources = b[35]
	r.LocalEECN = be24(b[36:])
	r.InitiatorDepth = b[39]
	r.RemoteEECN = be24(b[40:])
	r.RemoteCMResponseTimeout = b[43] >> 3
	r.TransportServiceType = b[43] >> 1 & 3
	r.EndToEndFlowControl = b[43]&1 != 0
	r.StartingPSN = be24(b[44:])
	r.LocalCMResponseTimeout = b[47] >> 3
	r.RetryCount = b[47] & 7
	r.PKey = verbs.PKey(binary.BigEndian.Uint16(b[48:]))
	r.PathMTU = verbs.MTU(b[50] >> 4)
	r.RDCExists = b[50]&0x08 != 0
	r.RNRRetryCount = b[50] & 7
	r.MaxCMRetries = b[51] >> 4
	r.SRQ = b[51]&0x08 != 0
	r.ExtendedTransportType = b[51] & 7
	r.Primary.unmarshal(b[52:96])
	r.Alternate.unmarshal(b[96:140])
	r.SAPSupported = b[139]&0x04 != 0
	copy(r.PrivateData[:], b[140:CMDataSize])
	return nil
}

// CMMRA is the message receipt acknowledgement (attribute 0x0011, IBA table 107): the
// sender needs more time than the response timeout to answer.
type CMMRA struct {
	LocalCommID    uint32                     // 0
	RemoteCommID   uint32                     // 4
	MessageMRAed   uint8                      // 8 bits 7..6 (CMMsgREQ, CMMsgREP, CMMsgOther = LAP)
	ServiceTimeout uint8                      // 9 bits 7..3
	PrivateData    [CMMRAPrivateDataSize]byte // 10..231
}

func (*CMMRA) AttrID() uint16 { return AttrCMMRA }

func (m *CMMRA) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(b[4:], m.RemoteCommID)
	b[8] = (m.MessageMRAed & 3) << 6
	b[9] = (m.ServiceTimeout & 0x1f) << 3
	copy(b[10:CMDataSize], m.PrivateData[:])
}

func (m *CMMRA) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM MRA", len(b), CMDataSize)
	}
	m.LocalCommID = binary.BigEndian.Uint32(b[0:])
	m.RemoteCommID = binary.BigEndian.Uint32(b[4:])
	m.MessageMRAed = b[8] >> 6
	m.ServiceTimeout = b[9] >> 3
	copy(m.PrivateData[:], b[10:CMDataSize])
	return nil
}

// CMREJ is the reject message (attribute 0x0012, IBA table 108).
type CMREJ struct {
	LocalCommID      uint32                     // 0
	RemoteCommID     uint32                     // 4
	MessageRejected  uint8                      // 8 bits 7..6 (CMMsgREQ, CMMsgREP, CMMsgOther)
	RejectInfoLength uint8                      // 9 bits 7..1: valid bytes of ARI
	Reason           CMRejectReason             // 10
	ARI              [CMREJARISize]byte         // 12..83: additional reject information
	PrivateData      [CMREJPrivateDataSize]byte // 84..231
}

func (*CMREJ) AttrID() uint16 { return AttrCMREJ }

func (r *CMREJ) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(b[4:], r.RemoteCommID)
	b[8] = (r.MessageRejected & 3) << 6
	b[9] = (r.RejectInfoLength & 0x7f) << 1
	binary.BigEndian.PutUint16(b[10:], uint16(r.Reason))
	copy(b[12:84], r.ARI[:])
	copy(b[84:CMDataSize], r.PrivateData[:])
}

func (r *CMREJ) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM REJ", len(b), CMDataSize)
	}
	r.LocalCommID = binary.BigEndian.Uint32(b[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(b[4:])
	r.MessageRejected = b[8] >> 6
	r.RejectInfoLength = b[9] >> 1
	r.Reason = CMRejectReason(binary.BigEndian.Uint16(b[10:]))
	copy(r.ARI[:], b[12:84])
	copy(r.PrivateData[:], b[84:CMDataSize])
	return nil
}

// ValidARI returns the first RejectInfoLength bytes of the ARI (at most all 72).
func (r *CMREJ) ValidARI() []byte { return r.ARI[:min(int(r.RejectInfoLength), CMREJARISize)] }

// CMREP is the reply to a REQ (attribute 0x0013, IBA table 110).
type CMREP struct {
	LocalCommID         uint32                     // 0
	RemoteCommID        uint32                     // 4
	LocalQKey           uint32                     // 8
	LocalQPN            verbs.QPN                  // 12, 24 bits
	LocalEECN           uint32                     // 16, 24 bits
	StartingPSN         uint32                     // 20, 24 bits
	ResponderResources  uint8                      // 24
	InitiatorDepth      uint8                      // 25
	TargetACKDelay      uint8                      // 26 bits 7..3
	FailoverAccepted    uint8                      // 26 bits 2..1 (CMFailover*)
	EndToEndFlowControl bool                       // 26 bit 0
	RNRRetryCount       uint8                      // 27 bits 7..5
	SRQ                 bool                       // 27 bit 4
	LocalCAGUID         verbs.GUID                 // 28
	PrivateData         [CMREPPrivateDataSize]byte // 36..231
}

func (*CMREP) AttrID() uint16 { return AttrCMREP }

func (r *CMREP) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(b[4:], r.RemoteCommID)
	binary.BigEndian.PutUint32(b[8:], r.LocalQKey)
	put24(b[12:], uint32(r.LocalQPN))
	b[15] = 0
	put24(b[16:], r.LocalEECN)
	b[19] = 0
	put24(b[20:], r.StartingPSN)
	b[23] = 0
	b[24] = r.ResponderResources
	b[25] = r.InitiatorDepth
	b[26] = (r.TargetACKDelay&0x1f)<<3 | (r.FailoverAccepted&3)<<1 | bit(r.EndToEndFlowControl, 0x01)
	b[27] = (r.RNRRetryCount&7)<<5 | bit(r.SRQ, 0x10)
	binary.BigEndian.PutUint64(b[28:], uint64(r.LocalCAGUID))
	copy(b[36:CMDataSize], r.PrivateData[:])
}

func (r *CMREP) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM REP", len(b), CMDataSize)
	}
	r.LocalCommID = binary.BigEndian.Uint32(b[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(b[4:])
	r.LocalQKey = binary.BigEndian.Uint32(b[8:])
	r.LocalQPN = verbs.QPN(be24(b[12:]))
	r.LocalEECN = be24(b[16:])
	r.StartingPSN = be24(b[20:])
	r.ResponderResources = b[24]
	r.InitiatorDepth = b[25]
	r.TargetACKDelay = b[26] >> 3
	r.FailoverAccepted = b[26] >> 1 & 3
	r.EndToEndFlowControl = b[26]&1 != 0
	r.RNRRetryCount = b[27] >> 5
	r.SRQ = b[27]&0x10 != 0
	r.LocalCAGUID = verbs.GUID(binary.BigEndian.Uint64(b[28:]))
	copy(r.PrivateData[:], b[36:CMDataSize])
	return nil
}

// CMRTU is "ready to use", the active side's answer to a REP (attribute 0x0014, IBA
// table 111).
type CMRTU struct {
	LocalCommID  uint32                     // 0
	RemoteCommID uint32                     // 4
	PrivateData  [CMRTUPrivateDataSize]byte // 8..231
}

func (*CMRTU) AttrID() uint16 { return AttrCMRTU }

func (r *CMRTU) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(b[4:], r.RemoteCommID)
	copy(b[8:CMDataSize], r.PrivateData[:])
}

func (r *CMRTU) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM RTU", len(b), CMDataSize)
	}
	r.LocalCommID = binary.BigEndian.Uint32(b[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(b[4:])
	copy(r.PrivateData[:], b[8:CMDataSize])
	return nil
}

// CMDREQ is the disconnect request (attribute 0x0015, IBA table 112). RemoteQPN is the
// QPN (or EECN) of the receiver, which checks it against its own.
type CMDREQ struct {
	LocalCommID  uint32                      // 0
	RemoteCommID uint32                      // 4
	RemoteQPN    verbs.QPN                   // 8, 24 bits
	PrivateData  [CMDREQPrivateDataSize]byte // 12..231
}

func (*CMDREQ) AttrID() uint16 { return AttrCMDREQ }

func (r *CMDREQ) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(b[4:], r.RemoteCommID)
	put24(b[8:], uint32(r.RemoteQPN))
	b[11] = 0
	copy(b[12:CMDataSize], r.PrivateData[:])
}

func (r *CMDREQ) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM DREQ", len(b), CMDataSize)
	}
	r.LocalCommID = binary.BigEndian.Uint32(b[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(b[4:])
	r.RemoteQPN = verbs.QPN(be24(b[8:]))
	copy(r.PrivateData[:], b[12:CMDataSize])
	return nil
}

// CMDREP is the disconnect reply (attribute 0x0016, IBA table 113).
type CMDREP struct {
	LocalCommID  uint32                      // 0
	RemoteCommID uint32                      // 4
	PrivateData  [CMDREPPrivateDataSize]byte // 8..231
}

func (*CMDREP) AttrID() uint16 { return AttrCMDREP }

func (r *CMDREP) Marshal(b []byte) {
	_ = b[CMDataSize-1]
	binary.BigEndian.PutUint32(b[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(b[4:], r.RemoteCommID)
	copy(b[8:CMDataSize], r.PrivateData[:])
}

func (r *CMDREP) Unmarshal(b []byte) error {
	if len(b) < CMDataSize {
		return short("CM DREP", len(b), CMDataSize)
	}
	r.LocalCommID = binary.BigEndian.Uint32(b[0:])
	r.RemoteCommID = binary.BigEndian.Uint32(b[4:])
	copy(r.PrivateData[:], b[8:CMDataSize])
	return nil
}
