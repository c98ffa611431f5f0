package verbs

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Device is one HCA: a node with ports, able to create completion queues, queue pairs
// and address handles. Implementations are safe for concurrent use.
type Device interface {
	Name() string
	NodeGUID() GUID
	NodeDesc() string
	FWVersion() string
	NumPorts() int
	// Port returns port num (1-based).
	Port(num int) (Port, error)
	// Subscribe returns a channel of asynchronous events for all ports and a function that
	// cancels the subscription. Events are dropped (and counted) if the subscriber does not
	// keep up with a buffer of size buf.
	Subscribe(buf int) (<-chan Event, func())
	CreateCQ(attr CQAttr) (CQ, error)
	CreateQP(attr QPAttr) (QP, error)
	CreateAH(attr AHAttr) (AH, error)
	Close() error
}

// PortAttr is a snapshot of a port's attributes (ibv_port_attr).
type PortAttr struct {
	State       PortState
	PhysState   PhysState
	LID         LID
	SMLID       LID
	SMSL        uint8
	LMC         uint8
	MaxMTU      MTU
	ActiveMTU   MTU
	Rate        Rate // active rate (width x speed)
	Width       int  // lanes: 1, 4, 8, 12
	LaneMbps    int  // per-lane signalling speed in Mb/s (SDR 2500, QDR 10000 ...)
	GUID        GUID
	GIDPrefix   uint64
	PKeyTabLen  int
	LinkLayer   string // "InfiniBand"
	SMEpoch     uint64 // changes when a different or restarted subnet manager takes over
	CapMask     uint32
	QKeyViolCnt uint64
	PKeyViolCnt uint64
}

// PortCounters are the port's error and traffic counters.
type PortCounters struct {
	XmitPackets, RcvPackets uint64
	XmitBytes, RcvBytes     uint64
	BadPKey                 uint64 // P_Key violations on receive
	BadQKey                 uint64 // Q_Key violations on receive
	Malformed               uint64 // runt or undecodable packets
	BadICRC                 uint64 // ICRC mismatch (including multicast for no attached group)
	NoQP                    uint64 // destination QP does not exist or is not ready
	RcvDropped              uint64 // no receive buffer posted (UD RNR drops)
	XmitDiscards            uint64 // send failed (unknown destination LID, transport error)
	AuthFailures            uint64 // management messages without a valid fabric-key MAC
}

// Port is one port of a Device.
type Port interface {
	Num() int
	Attr() PortAttr
	// GID returns the entry at index of the GID table (index 0: subnet prefix + port GUID).
	GID(index int) (GID, error)
	// PKeyTable returns a copy of the port's P_Key table as programmed by the subnet manager.
	PKeyTable() []PKey
	// FindPKey returns the table index of key, matching the 15-bit partition and
	// preferring an entry with the same membership bit, as ib_find_pkey does.
	FindPKey(key PKey) (int, bool)
	Counters() PortCounters
	// MAD returns the port's general services agent (QP1) for SA and CM requests.
	MAD() MADAgent
}

// EventType is an asynchronous event kind (ib_event_type subset).
type EventType uint8

const (
	EventPortActive EventType = iota + 1
	EventPortErr
	EventLIDChange
	EventPKeyChange
	EventSMChange
	EventClientReregister
	EventGIDChange
)

var eventNames = [...]string{"", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE", "SM_CHANGE", "CLIENT_REREGISTER", "GID_CHANGE"}

func (e EventType) String() string {
	if int(e) < len(eventNames) && e != 0 {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", e)
}

// Event is an asynchronous port event.
type Event struct {
	Type EventType
	Port int
}

// CQAttr describes a completion queue.
type CQAttr struct {
	Entries int // capacity; completions beyond it are lost and the CQ enters overrun
	// Handler, if set, may be called where the HCA makes the completions, as the kernel
	// calls a CQ's completion handler from the device's interrupt: a consumer that
	// polls there saves the hand-off to a goroutine waiting on Notify (on an idle
	// machine two thread wakeups per packet). It returns true if it polled the CQ until
	// it was empty, false to have Notify signalled instead (another poller is busy, or
	// the consumer is closing). It runs on the HCA's receive path: it must not block
	// for long nor call into the HCA's receive (posting receives and sends is fine).
	// A provider may never call it. The soft HCA calls it at the end of a received
	// batch that left at most a few completions (verbs/soft, cqDeferMax; with
	// moderation, once its count is reached) and signals Notify for more, for a
	// completion that took a QP's last posted buffer, and for moderation's timer;
	// verbs/rdma calls it on its completion channel's goroutine, in place of the
	// signal.
	Handler func() bool
}

// CQ is a completion queue. Poll moves completions out in batches; Notify delivers a
// signal whenever completions are ready, subject to moderation, unless the CQ's
// handler took them (CQAttr.Handler).
type CQ interface {
	// Poll fills wc with up to len(wc) completions and returns how many it wrote.
	Poll(wc []WC) int
	// Notify returns a channel that receives a value when completions are pending. With
	// moderation set, the signal waits for count completions or usecs microseconds after
	// the first pending one, whichever comes first.
	Notify() <-chan struct{}
	// SetModeration sets CQ moderation (count completions, usecs microseconds); 0,0 = off.
	SetModeration(count, usecs uint16) error
	Overruns() uint64
	Close() error
}

// WCStatus is a work completion status.
type WCStatus uint8

const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocProtErr
	WCWRFlushErr
	WCRemAccessErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCRemInvReqErr
	WCGeneralErr
)

var wcStatusNames = [...]string{"success", "local length error", "local QP operation error",
	"local protection error", "WR flushed", "remote access error", "transport retry counter exceeded",
	"RNR retry counter exceeded", "remote invalid request", "general error"}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", s)
}

// WCOpcode says which kind of work request completed.
type WCOpcode uint8

const (
	WCSend WCOpcode = iota
	WCRecv
)

// WC is a work completion.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	ByteLen   int // receive: bytes written into the buffer, GRH included for UD
	QPN       QPN // local QP
	SrcQP     QPN // receive: sender's QP (UD)
	SLID      LID // receive: sender's LID
	SL        uint8
	PKeyIndex int
	GRH       bool // receive: a 40-byte GRH precedes the payload (always for UD)
	WithImm   bool
	Imm       uint32
}

// QPType is a queue pair transport type.
type QPType uint8

const (
	QPTypeUD QPType = iota + 1
	QPTypeRC
)

func (t QPType) String() string {
	switch t {
	case QPTypeUD:
		return "UD"
	case QPTypeRC:
		return "RC"
	}
	return fmt.Sprintf("QPType(%d)", t)
}

// QPState is a queue pair state.
type QPState uint8

const (
	QPReset QPState = iota
	QPInit
	QPRTR
	QPRTS
	QPSQD
	QPSQE
	QPErr
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", s)
}

// QPAttr describes a queue pair at creation.
type QPAttr struct {
	Type      QPType
	Port      int
	SendCQ    CQ
	RecvCQ    CQ
	MaxSendWR int
	MaxRecvWR int  // ignored with SRQ
	SigAll    bool // every send generates a completion
	// SRQ, when set, is where the QP's receive buffers come from (RC); the QP then has
	// no receive queue of its own and PostRecv on it fails.
	SRQ SRQ
	// SourceQPN, when set on a UD QP, makes it a send-only queue whose packets carry
	// that QP number, a UD QP of the same device and port, as their source: peers see
	// and answer the owner of the number, and the new QP receives nothing (PostRecv
	// fails; MaxRecvWR is ignored). This is the kernel's IB_QP_CREATE_SOURCE_QPN, with
	// which IPoIB gives one address several send queues (the vendor's TSS). A device
	// without it fails CreateQP with an error matching errors.ErrUnsupported.
	SourceQPN QPN
}

// SRQDevice is a device with shared receive queues (ibv_create_srq). Optional: a
// Device without it gives every QP its own receive queue.
type SRQDevice interface {
	CreateSRQ(attr SRQAttr) (SRQ, error)
}

// SRQAttr describes a shared receive queue.
type SRQAttr struct {
	MaxWR int // buffers that can be posted at once
}

// SRQ is a shared receive queue: one pool of receive buffers that every QP created
// with it takes from, in posting order. A receive completes on the receiving QP's
// receive CQ, WC.QPN naming that QP; buffers still posted stay in the pool when a QP
// fails or closes.
type SRQ interface {
	PostRecv(wrs []RecvWR) (int, error)
	// Close destroys the SRQ; it fails with ErrBusy while a QP still uses it.
	Close() error
}

// UDToRTS takes a UD QP in RESET through INIT (on the P_Key at pkeyIndex, with qkey)
// and RTR to RTS, the way every UD consumer brings one up; the error is the first
// transition's that failed.
func UDToRTS(qp QP, pkeyIndex int, qkey uint32) error {
	for _, m := range []QPModify{
		{Mask: QPMaskState | QPMaskPKeyIndex | QPMaskQKey, State: QPInit, PKeyIndex: pkeyIndex, QKey: qkey},
		{Mask: QPMaskState, State: QPRTR},
		{Mask: QPMaskState, State: QPRTS},
	} {
		if err := qp.Modify(m); err != nil {
			return err
		}
	}
	return nil
}

// QPModify carries the attributes of a state transition; Mask says which are valid.
type QPModify struct {
	Mask      QPMask
	State     QPState
	PKeyIndex int
	QKey      uint32
	// RC only:
	DestQPN  QPN
	AH       AHAttr
	PathMTU  MTU
	RQPSN    uint32
	SQPSN    uint32
	Timeout  uint8
	RetryCnt uint8
	RNRRetry uint8
}

// QPMask selects the QPModify fields to apply.
type QPMask uint32

const (
	QPMaskState QPMask = 1 << iota
	QPMaskPKeyIndex
	QPMaskQKey
	QPMaskDestQPN
	QPMaskAH
	QPMaskPathMTU
	QPMaskRQPSN
	QPMaskSQPSN
	QPMaskTimeout
	QPMaskRetry
)

// SendWR is a send work request. Data is the gather list.
type SendWR struct {
	ID         uint64
	AH         AH     // UD: destination
	RemoteQPN  QPN    // UD: destination QP
	RemoteQKey uint32 // UD: Q_Key; MSB set means "use the QP's own Q_Key"
	Data       [][]byte
	WithImm    bool
	Imm        uint32
	Signaled   bool
}

// RecvWR posts one receive buffer.
type RecvWR struct {
	ID  uint64
	Buf []byte
}

// QP is a queue pair.
type QP interface {
	Num() QPN
	Type() QPType
	State() QPState
	Modify(m QPModify) error
	// PostSend queues a batch of send requests and returns how many were accepted.
	PostSend(wrs []SendWR) (int, error)
	// PostRecv queues a batch of receive buffers and returns how many were accepted.
	PostRecv(wrs []RecvWR) (int, error)
	AttachMcast(gid GID, lid LID) error
	DetachMcast(gid GID, lid LID) error
	Close() error
}

// AHAttr describes a destination.
type AHAttr struct {
	Port       int
	DLID       LID
	SL         uint8
	StaticRate Rate
	GRH        bool
	DGID       GID
	SGIDIndex  int
	FlowLabel  uint32
	HopLimit   uint8
	TClass     uint8
}

// AH is an address handle.
type AH interface {
	Attr() AHAttr
	Close() error
}

// MADAgent sends management datagrams from a port's QP1 and matches responses by
// transaction ID, like the kernel's MAD layer.
type MADAgent interface {
	// Call sends a 256-byte request MAD to QP1 at dlid and waits for the response with the
	// same transaction ID, resending after each timeout up to retries times.
	Call(ctx context.Context, dlid LID, req []byte, timeout time.Duration, retries int) ([]byte, error)
	// Send sends a MAD to dqp at dlid without waiting for anything.
	Send(dlid LID, dqp QPN, mad []byte) error
	// Register installs the handler for MADs of one management class that no Call is
	// waiting for (requests, and unsolicited responses such as a CM REP); nil removes
	// it. A non-nil return value is sent back to the source.
	Register(class uint8, h MADHandler)
}

// GIDMADSender is a MADAgent that can address a MAD by GID, carried in a GRH, as a
// port without LIDs (RoCE) must. Optional: the CM uses it for a peer whose LID is 0.
type GIDMADSender interface {
	SendGID(dgid GID, dqp QPN, mad []byte) error
}

// MADHandler serves MADs of one management class.
type MADHandler func(src MADSource, mad []byte) []byte

// MADSource says where a received MAD came from.
type MADSource struct {
	LID LID
	GID GID
	QPN QPN
}

// Errors shared by providers.
var (
	ErrClosed       = errors.New("closed")
	ErrNoPort       = errors.New("no such port")
	ErrInvalidState = errors.New("invalid QP state for this operation")
	ErrQueueFull    = errors.New("work queue full")
	ErrTimeout      = errors.New("MAD timed out")
	ErrPortDown     = errors.New("port not active")
	ErrInvalid      = errors.New("invalid argument")
	ErrBusy         = errors.New("resource busy")
)

// Error is a verbs error naming the operation and object.
type Error struct {
	Op  string // "create_qp", "post_send", "attach_mcast" ...
	Obj string // "mlx_0 port 1 qp 0x48"
	Err error
}

func (e *Error) Error() string { return e.Op + " " + e.Obj + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }
