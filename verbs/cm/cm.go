// Package cm is an InfiniBand communication manager (IBA vol. 1 chapter 12) for
// reliable-connected queue pairs, sized to what IPoIB connected mode needs: the
// REQ / REP / RTU handshake, REJ, MRA (honoured, never sent) and the DREQ / DREP
// disconnect. Every message is a CM MAD (verbs/mad) sent and received through the
// port's QP1 agent (verbs.MADAgent); the manager keeps per-connection state, resends
// unanswered messages and moves the queue pairs through INIT -> RTR -> RTS with the
// values the peer announced.
//
// # Behaviour, as the Linux ib_cm implements it
//
//   - Local communication IDs are unique per Manager (random start, then sequential,
//     never 0, never one still in use).
//   - The active side resends the REQ after each CM response timeout (4.096 µs ×
//     2^Timeout, but at least MinResponseTimeout) up to MaxCMRetries times, then gives
//     up with an error wrapping verbs.ErrTimeout and sends a REJ (reason 4, timeout,
//     ARI = local CA GUID) so that the passive side stops too. The passive side resends
//     the REP after the REQ's local CM response timeout, up to the REQ's Max CM Retries,
//     and gives up the same way. A DREQ is resent likewise.
//   - A duplicate REQ (same remote communication ID and CA GUID) is answered with the
//     same REP while waiting for the RTU, ignored while the listener is still deciding
//     or once established, answered with the same REJ if it was rejected, and with REJ
//     reason 10 (stale connection) once the connection is in timewait. A new REQ from a
//     remote QP that already has a live connection here is rejected as stale (10).
//   - A duplicate REP once established means the RTU was lost: the RTU is resent.
//   - A REQ for a service ID nobody listens on is rejected with reason 8 (invalid service
//     ID); a transport other than RC with 9; a P_Key missing from the port's table with
//     12 (invalid GID, ARI = the GID, as the kernel does when it cannot build the
//     address vector); an invalid path MTU with 26; a listener's Accept without a usable
//     RC QP, or a QP that refuses a transition, with 1 (no QP). A listener returning nil
//     rejects with 28 (consumer defined).
//   - A REP for an unknown local communication ID is rejected with 6 (invalid
//     communication ID); a DREQ for an unknown one is answered with a DREP (the peer
//     may be retrying a DREQ whose DREP was lost). Other messages for unknown or stale
//     IDs, and messages in a state that does not expect them, are ignored.
//   - After a connection ends it stays in timewait for the peer's retry window (the
//     longer CM response timeout × (Max CM Retries + 1)), answering duplicate DREQs
//     with a DREP and duplicate REQs as above; then it is forgotten. A REQ this side
//     rejected stays only one CM response timeout, long enough to answer the REQ's
//     retransmissions that crossed the REJ. A record in timewait keeps no QP and no
//     callback, only what recognises duplicates.
//   - What a peer's REQ sets is bounded: CM response timeouts and MRA service
//     timeouts at 4.096 µs × 2^21 ≈ 8.6 s, retries at 15, one MRA honoured per
//     connection (as the kernel). A passive connection the peer never completes is
//     forgotten within about 292 s. At most 4096 passive connections may be half
//     open (REQ received, REP sent but no RTU yet, or in timewait), 1024 of them from
//     one source address; a REQ beyond that is rejected with reason 3 (no resources).
//   - When a connection ends (DREQ either way, REJ, timeout, Close) the manager moves
//     its QP to ERR if it had got past INIT, which flushes posted work requests.
//
// Every timer of the manager runs on its clock (WithClock; the time package by
// default), so tests can drive retransmissions, timeouts and timewait on virtual time.
//
// The passive side moves its QP to RTR before sending the REP and to RTS when the RTU
// arrives; it does not treat the first received data packet as an implicit RTU.
package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// Defaults and limits.
const (
	// DefaultCMResponseTimeout is the CM response timeout exponent used when
	// ConnectParams.Timeout is 0: 20 (4.096 µs × 2^20 ≈ 4.3 s), as IPoIB uses.
	DefaultCMResponseTimeout = 20
	// DefaultMaxCMRetries is used when ConnectParams.MaxCMRetries is 0 (IPoIB's value,
	// and the most the 4-bit REQ field holds).
	DefaultMaxCMRetries = 15
	// MinResponseTimeout is the floor of every retransmission timeout. The IBA
	// exponents go down to microseconds, which a software fabric sharing CPUs with
	// everything else cannot meet.
	MinResponseTimeout = 10 * time.Millisecond
)

// Limits on what a peer can make the manager keep. A passive connection's timers come
// from values in the peer's REQ (and MRA), and every REQ with a new communication ID
// makes a record, so without them a peer could make the manager hold state for days
// (exponent 31 × 16 tries is about 39 hours in REP_SENT, as much again in timewait)
// and without bound in number.
const (
	// maxPeerCMTimeout is the largest CM response timeout (and MRA service timeout)
	// exponent taken from a peer: 21, 4.096 µs × 2^21 ≈ 8.6 s per try. IPoIB asks for
	// 20 and is unaffected; a peer asking for more is answered and given up on sooner.
	// With at most 15 retries, a passive record the peer never completes lives at most
	// 34 such timeouts ≈ 292 s: 16 in REP_SENT, 2 more for the one MRA honoured, 16 in
	// timewait. A DREQ to the peer is given up on after at most 16 ≈ 137 s.
	maxPeerCMTimeout = 21
	// maxPeerCMRetries is the most retries of our messages a peer can ask for (the
	// REQ's 4-bit Max CM Retries field holds no more).
	maxPeerCMRetries = 15
	// maxHalfOpen caps the passive records that no consumer holds yet or any longer:
	// REQ received, REP sent without an RTU yet, and timewait. A REQ beyond it is
	// rejected (reason 3, no resources) without making a record.
	maxHalfOpen = 4096
	// maxHalfOpenPerSource caps the half-open records of one source (the address its
	// CM messages come from), so that one peer flooding REQs leaves the others three
	// quarters of maxHalfOpen.
	maxHalfOpenPerSource = maxHalfOpen / 4
)

// ErrDisconnected is the Err of a connection that the peer disconnected (DREQ).
var ErrDisconnected = errors.New("cm: disconnected by peer")

// RejectError is a REJ received from the peer.
type RejectError struct {
	Reason      mad.CMRejectReason
	ARI         []byte // the valid part of the additional reject information
	PrivateData []byte // all 148 bytes of the REJ's private data
}

func (e *RejectError) Error() string { return "cm: rejected: " + e.Reason.String() }

// Request is a connection request as a listener sees it. "Remote" is the active side.
type Request struct {
	ServiceID    uint64
	RemoteQPN    verbs.QPN
	RemoteLID    verbs.LID // primary path, active side's port
	RemoteGID    verbs.GID
	RemoteCAGUID verbs.GUID
	PKey         verbs.PKey
	PKeyIndex    int // index of PKey in the local port's table
	PathMTU      verbs.MTU
	StartingPSN  uint32 // the active side's first send PSN (our receive PSN)
	RetryCount   uint8
	RNRRetry     uint8 // RNR retry count for our QP's sends; the REP echoes it
	SRQ          bool
	PrivateData  []byte // all 92 bytes of the REQ's private data
}

// Decision is what a listener returns for a Request: Accept or Reject.
type Decision interface{ decision() }

// Accept accepts a connection on QP, an RC QP in RESET or INIT (the manager does
// RESET->INIT with the request's P_Key index, INIT->RTR before sending the REP and
// RTR->RTS when the RTU arrives).
//
// Exactly one of the callbacks runs, on a goroutine of its own: Established with the
// connection once the RTU has arrived, or Failed if the connection is not established
// (REP retries exhausted, REJ from the active side, QP transition refused, manager
// closed). Either may be nil.
type Accept struct {
	QP          verbs.QP
	PrivateData []byte // at most 196 bytes
	SRQ         bool   // the REP says QP receives from a shared receive queue
	Established func(*Conn)
	Failed      func(error)
}

// Reject refuses a connection with a REJ carrying Reason (RejConsumerDefined for an
// application decision) and up to 148 bytes of private data.
type Reject struct {
	Reason      mad.CMRejectReason
	PrivateData []byte
}

func (Accept) decision() {}
func (Reject) decision() {}

// ConnectParams describes an active connection.
type ConnectParams struct {
	ServiceID uint64
	QP        verbs.QP // RC, in RESET or INIT
	DLID      verbs.LID
	DGID      verbs.GID
	SL        uint8
	// PKey selects the partition; 0 uses the entry at PKeyIndex of the port's table.
	// Otherwise PKeyIndex is looked up (verbs.Port.FindPKey) when its entry does not
	// hold PKey.
	PKey      verbs.PKey
	PKeyIndex int
	PathMTU   verbs.MTU // 0: the port's active MTU
	// PrivateData goes into the REQ (at most 92 bytes).
	PrivateData []byte
	// RetryCount is the transport retry count of both QPs; RNRRetry the RNR retry count
	// the passive side's QP should use (the REP tells ours). AckTimeout is the QP local
	// ACK timeout exponent of both sides (0 = infinite, as in IBA).
	RetryCount, RNRRetry uint8
	AckTimeout           uint8
	// Timeout is the CM response timeout exponent, sent as both the local and the
	// remote CM response timeout (0: DefaultCMResponseTimeout).
	Timeout uint8
	// MaxCMRetries is how often an unanswered REQ (and later DREQ) is resent: 0 means
	// DefaultMaxCMRetries, a negative value none; at most 15.
	MaxCMRetries int
	SRQ          bool
}

// Conn is an established connection. Its fields do not change.
type Conn struct {
	ServiceID         uint64
	QP                verbs.QP
	LocalCommID       uint32
	RemoteCommID      uint32
	RemoteQPN         verbs.QPN
	RemoteLID         verbs.LID
	RemoteGID         verbs.GID
	RemoteCAGUID      verbs.GUID
	RemotePrivateData []byte // the REP's (active side) or REQ's (passive side)
	Active            bool   // this side sent the REQ

	c *conn
}

// Done is closed when the connection ends: the peer disconnected (DREQ), rejected it
// later (REJ, for example because the RTU never arrived), Disconnect was called, or
// the manager was closed. Err tells which.
func (c *Conn) Done() <-chan struct{} { return c.c.done }

// Err returns nil while the connection is up, then why it ended: ErrDisconnected,
// a *RejectError, an error wrapping verbs.ErrTimeout, verbs.ErrClosed (manager
// closed) or ErrLocalDisconnect.
func (c *Conn) Err() error {
	m := c.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	return c.c.err
}

// ErrLocalDisconnect is the Err of a connection ended by Disconnect.
var ErrLocalDisconnect = errors.New("cm: disconnected")

// Disconnect sends a DREQ (resent like the REQ) and waits for the DREP. The QP is moved
// to ERR and Done closed right away. It returns nil once the DREP arrives or if the
// connection had already ended, and an error wrapping verbs.ErrTimeout if the peer
// never answered (the connection is down locally all the same).
func (c *Conn) Disconnect() error {
	cc := c.c
	m := cc.m
	m.mu.Lock()
	switch cc.state {
	case stEstablished:
		m.sendDREQLocked(cc)
	case stDreqSent:
	default:
		m.mu.Unlock()
		return nil
	}
	ch := cc.discDone
	m.mu.Unlock()
	<-ch
	m.mu.Lock()
	defer m.mu.Unlock()
	return cc.discErr
}

type connState uint8

const (
	stReqSent     connState = iota // active: REQ sent, waiting for the REP
	stReqRcvd                      // passive: the listener is deciding
	stRepSent                      // passive: REP sent, waiting for the RTU
	stEstablished                  // RTU sent (active) or received (passive)
	stDreqSent                     // Disconnect: DREQ sent, waiting for the DREP
	stTimewait                     // ended; answers duplicates until the timer runs out
)

var stateNames = [...]string{"REQ_SENT", "REQ_RCVD", "REP_SENT", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT"}

func (s connState) String() string { return stateNames[s] }

type remoteKey struct {
	guid verbs.GUID
	id   uint32
}

type remoteQPKey struct {
	guid verbs.GUID
	qpn  verbs.QPN
}

// conn is the manager's state of one connection; all fields are guarded by m.mu.
type conn struct {
	m        *Manager
	pub      *Conn
	active   bool
	state    connState
	localID  uint32
	remoteID uint32
	rguid    verbs.GUID
	rqpn     verbs.QPN
	madTo    madAddr // where the peer's CM MADs come from and ours go
	qp       verbs.QP
	lqpn     verbs.QPN // qp's number, kept in timewait to match duplicate DREQs
	hasQP    bool      // lqpn is set
	psn      uint32    // our starting (send) PSN
	tid      uint64    // transaction ID of the REQ, reused by REP, RTU and their REJ

	// QP attributes for RTR and RTS.
	ah         verbs.AHAttr
	mtu        verbs.MTU
	rqpsn      uint32
	ackTimeout uint8
	retryCnt   uint8
	rnrRetry   uint8

	// Retransmission of the message awaiting an answer (REQ, REP or DREQ).
	timeout time.Duration
	retries int
	twait   time.Duration // how long the peer may still retransmit after the end
	msg     []byte
	sent    int
	timer   clock.Timer
	gen     uint64
	mraSeen bool          // an MRA has extended the wait; later ones are ignored
	rejWait time.Duration // passive: timewait after our REJ of the REQ

	reply []byte // cached answer to duplicates: REP or REJ (passive), RTU (active)

	connectCh chan error // active: result of Connect
	accept    Accept     // passive: the listener's callbacks

	done     chan struct{}
	err      error
	discDone chan struct{}
	discErr  error
}

type listener struct{ h func(*Request) Decision }

type outMAD struct {
	to madAddr
	b  []byte
}

// roceHopLimit is the GRH hop limit of a path routed by GID alone (RoCE v2 carries it
// as the IPv6 hop limit; 0 would be dropped at the first hop).
const roceHopLimit = 64

// Manager is the communication manager of one port. Create it with New; it registers
// itself as the port's handler of the CM management class, so there must be only one
// per port.
type Manager struct {
	dev     verbs.Device
	port    verbs.Port
	portNum int
	agent   verbs.MADAgent
	guid    verbs.GUID
	clk     clock.Clock
	tidSeq  atomic.Uint32

	mu         flushMutex // every release sends what was queued under it
	closed     bool
	nextID     uint32
	conns      map[uint32]*conn // by local communication ID
	byRemote   map[remoteKey]*conn
	byRemoteQP map[remoteQPKey]*conn // live connections only
	listeners  map[uint64]*listener
	// halfOpen counts the passive records in REQ_RCVD, REP_SENT or TIMEWAIT (see
	// setStateLocked); a REQ that would take it past maxHalfOpen is rejected, and
	// overLimit counts those REQs.
	halfOpen    int
	maxHalfOpen int
	overLimit   uint64
	// halfOpenBy counts the half-open records per source (sourceKey), against
	// maxHalfOpenPerSource (maxPerSource); a REQ past it is rejected the same way.
	halfOpenBy   map[madAddr]int
	maxPerSource int
}

// flushMutex is the manager's lock. MADs and user callbacks are queued while it is
// held (sendLocked, callLocked) and leave when it is released, whichever path
// releases it: none is sent or called under the lock, and none can be forgotten by a
// path that unlocks without flushing.
type flushMutex struct {
	mu    sync.Mutex
	outq  []outMAD
	calls []func()
	send  func(outMAD)
}

func (l *flushMutex) Lock() { l.mu.Lock() }

// Unlock releases the lock, then sends the queued MADs in order and starts each queued
// callback on a goroutine of its own.
func (l *flushMutex) Unlock() {
	q, calls := l.outq, l.calls
	l.outq, l.calls = nil, nil
	l.mu.Unlock()
	for _, o := range q {
		l.send(o)
	}
	for _, f := range calls {
		go f()
	}
}

// Option configures a Manager (New).
type Option func(*Manager)

// WithClock runs the manager's timers (retransmissions, timeouts, timewait) on c
// instead of the time package (clock.Real, also what a nil c means).
func WithClock(c clock.Clock) Option { return func(m *Manager) { m.clk = c } }

// New creates the communication manager of port (1-based) of dev and registers it
// with the port's MAD agent for class mad.ClassCM.
func New(dev verbs.Device, port int, opts ...Option) (*Manager, error) {
	p, err := dev.Port(port)
	if err != nil {
		return nil, fmt.Errorf("cm: %w", err)
	}
	m := &Manager{
		dev: dev, port: p, portNum: port, agent: p.MAD(), guid: dev.NodeGUID(),
		clk:         clock.Real{},
		nextID:      rand.Uint32(),
		conns:       map[uint32]*conn{},
		byRemote:    map[remoteKey]*conn{},
		byRemoteQP:  map[remoteQPKey]*conn{},
		listeners:   map[uint64]*listener{},
		maxHalfOpen: maxHalfOpen,
		halfOpenBy:  map[madAddr]int{}, maxPerSource: maxHalfOpenPerSource,
	}
	m.mu.send = func(o outMAD) { _ = m.sendMAD(o.to, o.b) }
	for _, o := range opts {
		o(m)
	}
	if m.clk == nil {
		m.clk = clock.Real{}
	}
	m.tidSeq.Store(rand.Uint32())
	m.agent.Register(mad.ClassCM, m.handleMAD)
	return m, nil
}

// Close unregisters the manager. Connections in progress fail with verbs.ErrClosed
// (the peer gets a REJ, reason timeout); established connections get one DREQ (not
// resent), their QPs go to ERR and Done is closed with Err verbs.ErrClosed.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.agent.Register(mad.ClassCM, nil)
	for _, c := range m.conns {
		switch c.state {
		case stReqSent, stRepSent:
			m.sendLocked(c.madTo, m.rejTimeoutMAD(c))
		case stEstablished:
			m.sendLocked(c.madTo, m.dreqMAD(c))
		}
		m.endLocked(c, verbs.ErrClosed)
		m.enterTimewaitLocked(c) // lets go of the QP and callbacks; arms nothing once closed
		c.stopTimer()
	}
	m.listeners = map[uint64]*listener{}
	m.mu.Unlock()
}

// Listen accepts REQs for serviceID: h decides for each new request, on a goroutine of
// its own. stop ends listening (connections in progress continue). Listening twice on
// one service ID is an error.
func (m *Manager) Listen(serviceID uint64, h func(*Request) Decision) (stop func(), err error) {
	if h == nil {
		return nil, fmt.Errorf("cm: listen: %w: nil handler", verbs.ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("cm: listen: %w", verbs.ErrClosed)
	}
	if m.listeners[serviceID] != nil {
		return nil, fmt.Errorf("cm: listen: service ID %#016x: %w: already listening", serviceID, verbs.ErrInvalid)
	}
	l := &listener{h: h}
	m.listeners[serviceID] = l
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.listeners[serviceID] == l {
			delete(m.listeners, serviceID)
		}
	}, nil
}

// Connect runs the active side of a connection: it sends a REQ (resent after each CM
// response timeout, at most MaxCMRetries times), and on the REP moves p.QP to RTR and
// RTS with the REP's QPN and starting PSN and sends the RTU. A REJ returns a
// *RejectError, no answer an error wrapping verbs.ErrTimeout; if ctx ends first the
// peer gets a REJ (timeout) and ctx's error is returned.
func (m *Manager) Connect(ctx context.Context, p ConnectParams) (*Conn, error) {
	fail := func(err error) (*Conn, error) { return nil, fmt.Errorf("cm: connect: %w", err) }
	qp := p.QP
	if qp == nil || qp.Type() != verbs.QPTypeRC {
		return fail(fmt.Errorf("%w: need an RC QP", verbs.ErrInvalid))
	}
	if len(p.PrivateData) > mad.CMREQPrivateDataSize {
		return fail(fmt.Errorf("%w: %d bytes of private data (REQ holds %d)", verbs.ErrInvalid, len(p.PrivateData), mad.CMREQPrivateDataSize))
	}
	if p.DLID == 0 {
		// Without a LID the peer can only be reached by GID, over an agent that can.
		if _, ok := m.agent.(verbs.GIDMADSender); !ok || p.DGID.IsZero() {
			return fail(fmt.Errorf("%w: no destination LID (and no GID this port's MADs can be sent to)", verbs.ErrInvalid))
		}
	}
	attr := m.port.Attr()
	if attr.State != verbs.PortActive {
		return fail(verbs.ErrPortDown)
	}
	pkey, pkeyIndex := p.PKey, p.PKeyIndex
	table := m.port.PKeyTable()
	switch {
	case pkey == 0 && (pkeyIndex < 0 || pkeyIndex >= len(table)):
		return fail(fmt.Errorf("%w: P_Key index %d", verbs.ErrInvalid, pkeyIndex))
	case pkey == 0:
		pkey = table[pkeyIndex]
	case pkeyIndex < 0 || pkeyIndex >= len(table) || table[pkeyIndex] != pkey:
		i, ok := m.port.FindPKey(pkey)
		if !ok {
			return fail(fmt.Errorf("%w: P_Key %v not in the port's table", verbs.ErrInvalid, pkey))
		}
		pkeyIndex = i
	}
	mtu := p.PathMTU
	if mtu == 0 {
		mtu = attr.ActiveMTU
	}
	if mtu.Bytes() == 0 {
		return fail(fmt.Errorf("%w: path MTU %d", verbs.ErrInvalid, mtu))
	}
	tmo := p.Timeout
	if tmo == 0 {
		tmo = DefaultCMResponseTimeout
	}
	retries := p.MaxCMRetries
	switch {
	case retries == 0:
		retries = DefaultMaxCMRetries
	case retries < 0:
		retries = 0
	case retries > 15:
		retries = 15
	}
	switch qp.State() {
	case verbs.QPReset:
		if err := qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: pkeyIndex}); err != nil {
			return fail(err)
		}
	case verbs.QPInit:
	default:
		return fail(fmt.Errorf("%w: QP is %v, need RESET or INIT", verbs.ErrInvalidState, qp.State()))
	}
	sgid, _ := m.port.GID(0)

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fail(verbs.ErrClosed)
	}
	c := m.newConnLocked(true)
	c.setQP(qp)
	c.madTo = madAddr{p.DLID, p.DGID}
	c.psn = rand.Uint32() & 0xffffff
	c.ah = verbs.AHAttr{Port: m.portNum, DLID: p.DLID, SL: p.SL & 0xf, DGID: p.DGID}
	if p.DLID == 0 { // no LIDs (RoCE): the GRH routes
		c.ah.GRH, c.ah.HopLimit = true, roceHopLimit
	}
	c.mtu, c.ackTimeout, c.retryCnt = mtu, p.AckTimeout&0x1f, p.RetryCount&7
	c.timeout, c.retries = responseTimeout(tmo), retries
	c.twait = c.timeout * time.Duration(retries+1)
	c.connectCh = make(chan error, 1)
	c.tid = m.newTID(c)
	req := &mad.CMREQ{
		LocalCommID: c.localID, ServiceID: p.ServiceID, LocalCAGUID: m.guid, LocalQPN: qp.Num(),
		RemoteCMResponseTimeout: tmo, TransportServiceType: mad.CMTransportRC, StartingPSN: c.psn,
		LocalCMResponseTimeout: tmo, RetryCount: p.RetryCount, PKey: pkey, PathMTU: mtu,
		RNRRetryCount: p.RNRRetry, MaxCMRetries: uint8(retries), SRQ: p.SRQ,
		Primary: mad.CMPath{LocalLID: attr.LID, RemoteLID: p.DLID, LocalGID: sgid, RemoteGID: p.DGID,
			PacketRate: attr.Rate, SL: p.SL, SubnetLocal: true, LocalACKTimeout: p.AckTimeout},
	}
	copy(req.PrivateData[:], p.PrivateData)
	c.msg = mad.NewCMMAD(c.tid, req)
	c.sent = 1
	c.pub.ServiceID = p.ServiceID
	pub := c.pub // timewait clears c.pub under the lock; read it here
	m.armLocked(c, c.timeout)
	m.mu.Unlock()

	// The first REQ is sent synchronously so that an unreachable destination fails now.
	if err := m.sendMAD(c.madTo, c.msg); err != nil {
		m.mu.Lock()
		if c.state == stReqSent {
			m.endLocked(c, err)
			m.removeLocked(c)
		}
		m.mu.Unlock()
		return fail(err)
	}

	select {
	case err := <-c.connectCh:
		if err != nil {
			return fail(err)
		}
		return pub, nil
	case <-ctx.Done():
	}
	m.mu.Lock()
	if c.state == stReqSent {
		m.sendLocked(c.madTo, m.rejTimeoutMAD(c))
		m.endLocked(c, ctx.Err())
		m.enterTimewaitLocked(c)
	}
	m.mu.Unlock()
	// The handshake may have finished (or failed) just before ctx ended.
	if err := <-c.connectCh; err != nil {
		return fail(err)
	}
	return pub, nil
}

// responseTimeout converts a CM response timeout exponent to the retransmission
// timeout, floored at MinResponseTimeout.
func responseTimeout(t uint8) time.Duration { return max(mad.CMTimeout(t), MinResponseTimeout) }

// peerTimeout is responseTimeout of an exponent a peer chose, clamped to
// maxPeerCMTimeout so that the peer cannot make us keep a record for hours.
func peerTimeout(t uint8) time.Duration { return responseTimeout(min(t&0x1f, maxPeerCMTimeout)) }

func (m *Manager) newConnLocked(active bool) *conn {
	for m.nextID == 0 || m.conns[m.nextID] != nil {
		m.nextID++
	}
	c := &conn{m: m, active: active, localID: m.nextID, done: make(chan struct{})}
	if active {
		c.state = stReqSent
	} else {
		c.state = stReqRcvd // counted half open by the caller, once madTo is set
	}
	m.nextID++
	c.pub = &Conn{LocalCommID: c.localID, Active: active, c: c}
	m.conns[c.localID] = c
	return c
}

// isHalfOpen reports whether c counts against maxHalfOpen: a passive record that no
// consumer holds yet (REQ_RCVD, REP_SENT) or any longer (TIMEWAIT).
func (c *conn) isHalfOpen() bool {
	return !c.active && (c.state == stReqRcvd || c.state == stRepSent || c.state == stTimewait)
}

// setStateLocked moves c to s, keeping m.halfOpen in step while c is a record of m.
func (m *Manager) setStateLocked(c *conn, s connState) {
	was := c.isHalfOpen()
	c.state = s
	if m.conns[c.localID] != c {
		return
	}
	switch now := c.isHalfOpen(); {
	case now && !was:
		m.countHalfOpenLocked(c, 1)
	case was && !now:
		m.countHalfOpenLocked(c, -1)
	}
}

// countHalfOpenLocked adds d to the half-open counts, the manager's and c's source's.
func (m *Manager) countHalfOpenLocked(c *conn, d int) {
	m.halfOpen += d
	k := sourceKey(c.madTo)
	if n := m.halfOpenBy[k] + d; n > 0 {
		m.halfOpenBy[k] = n
	} else {
		delete(m.halfOpenBy, k)
	}
}

// sourceKey is what a peer's half-open records are counted under: its LID where it
// has one (the same port with a GRH or without counts once), its GID on RoCE (LID 0).
func sourceKey(a madAddr) madAddr {
	if a.lid != 0 {
		return madAddr{lid: a.lid}
	}
	return a
}

// setQP gives c its QP, and remembers the QP's number for after the QP is
// let go of.
func (c *conn) setQP(qp verbs.QP) {
	c.qp, c.lqpn, c.hasQP = qp, qp.Num(), true
}

// newTID returns a transaction ID for a message that starts an exchange (REQ, DREQ):
// the local communication ID in the low 32 bits, as the kernel's cm_form_tid does, and
// a sequence number above it.
func (m *Manager) newTID(c *conn) uint64 {
	return uint64(m.tidSeq.Add(1))<<32 | uint64(c.localID)
}

// sendLocked queues a MAD to QP1 at lid; releasing m.mu sends it.
func (m *Manager) sendLocked(to madAddr, b []byte) {
	m.mu.outq = append(m.mu.outq, outMAD{to, b})
}

// madAddr is where a peer's CM is: its LID, or on a port without LIDs (RoCE, LID 0)
// its GID.
type madAddr struct {
	lid verbs.LID
	gid verbs.GID
}

// sendMAD sends a CM MAD to the peer's QP1, by GID where it has no LID.
func (m *Manager) sendMAD(to madAddr, b []byte) error {
	if to.lid == 0 && !to.gid.IsZero() {
		if gs, ok := m.agent.(verbs.GIDMADSender); ok {
			return gs.SendGID(to.gid, verbs.GSIQPN, b)
		}
	}
	return m.agent.Send(to.lid, verbs.GSIQPN, b)
}

// callLocked queues a user callback; releasing m.mu starts it on its own goroutine.
func (m *Manager) callLocked(f func()) { m.mu.calls = append(m.mu.calls, f) }

// armLocked (re)starts c's retransmission timer.
func (m *Manager) armLocked(c *conn, d time.Duration) {
	c.stopTimer()
	c.gen++
	gen := c.gen
	c.timer = m.clk.AfterFunc(d, func() { m.fire(c, gen) })
}

func (c *conn) stopTimer() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.gen++
}

// fire handles the expiry of c's timer: resend the pending message, give up, or end
// timewait.
func (m *Manager) fire(c *conn, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || gen != c.gen {
		return
	}
	c.timer = nil
	switch c.state {
	case stReqSent, stRepSent, stDreqSent:
		if c.sent <= c.retries {
			c.sent++
			m.sendLocked(c.madTo, c.msg)
			m.armLocked(c, c.timeout)
			return
		}
		err := fmt.Errorf("no answer to %s after %d tries: %w", msgName(c.msg), c.sent, verbs.ErrTimeout)
		if c.state != stDreqSent {
			m.sendLocked(c.madTo, m.rejTimeoutMAD(c))
		}
		m.endLocked(c, err)
		m.enterTimewaitLocked(c)
	case stTimewait:
		m.removeLocked(c)
	}
}

func msgName(b []byte) string {
	switch binary.BigEndian.Uint16(b[16:]) {
	case mad.AttrCMREQ:
		return "REQ"
	case mad.AttrCMREP:
		return "REP"
	case mad.AttrCMDREQ:
		return "DREQ"
	}
	return "MAD"
}

// endLocked records the end of c with err and delivers it to whoever waits: Connect,
// the listener's Failed, Disconnect, Done. The QP goes to ERR if it had left INIT.
func (m *Manager) endLocked(c *conn, err error) {
	switch c.state {
	case stReqSent:
		c.connectCh <- err
	case stReqRcvd:
		// The listener goroutine reports the failure when it returns.
		c.err = err
	case stRepSent:
		if f := c.accept.Failed; f != nil {
			m.callLocked(func() { f(err) })
		}
		qpToErr(c.qp)
	case stEstablished:
		c.err = err
		close(c.done)
		qpToErr(c.qp)
	case stDreqSent:
		if errors.Is(err, verbs.ErrTimeout) || errors.Is(err, verbs.ErrClosed) {
			c.discErr = fmt.Errorf("cm: disconnect: %w", err)
		}
		close(c.discDone)
	case stTimewait:
		return
	}
	m.setStateLocked(c, stTimewait)
	c.stopTimer()
}

func qpToErr(qp verbs.QP) {
	if qp != nil {
		_ = qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr})
	}
}

// enterTimewaitLocked keeps c (already in stTimewait) for the peer's retry window, then
// forgets it. Its remote QP may be connected again right away.
func (m *Manager) enterTimewaitLocked(c *conn) {
	m.timewaitLocked(c, c.twait)
}

// timewaitLocked keeps c in timewait for d. It lets go of everything a timewait record
// does not need to recognise duplicates (IDs, QP numbers and a REJ to repeat are
// enough), so that a record kept for the peer holds no QP, callback or buffer of the
// consumer's.
func (m *Manager) timewaitLocked(c *conn, d time.Duration) {
	m.setStateLocked(c, stTimewait)
	if k := (remoteQPKey{c.rguid, c.rqpn}); m.byRemoteQP[k] == c {
		delete(m.byRemoteQP, k)
	}
	c.qp, c.accept, c.pub, c.msg = nil, Accept{}, nil, nil
	if c.reply != nil && binary.BigEndian.Uint16(c.reply[16:]) != mad.AttrCMREJ {
		c.reply = nil // a REP or RTU is not repeated from timewait
	}
	if m.closed {
		return
	}
	m.armLocked(c, d)
}

func (m *Manager) removeLocked(c *conn) {
	c.stopTimer()
	if m.conns[c.localID] == c {
		delete(m.conns, c.localID)
		if c.isHalfOpen() {
			m.countHalfOpenLocked(c, -1)
		}
	}
	if k := (remoteKey{c.rguid, c.remoteID}); m.byRemote[k] == c {
		delete(m.byRemote, k)
	}
	if k := (remoteQPKey{c.rguid, c.rqpn}); m.byRemoteQP[k] == c {
		delete(m.byRemoteQP, k)
	}
}

// ---- message construction ----

func (m *Manager) rejMAD(tid uint64, local, remote uint32, msgRejected uint8, reason mad.CMRejectReason, ari, pd []byte) []byte {
	r := &mad.CMREJ{LocalCommID: local, RemoteCommID: remote, MessageRejected: msgRejected, Reason: reason,
		RejectInfoLength: uint8(min(len(ari), mad.CMREJARISize))}
	copy(r.ARI[:], ari)
	copy(r.PrivateData[:], pd)
	return mad.NewCMMAD(tid, r)
}

// rejTimeoutMAD is the REJ sent when c gives up: reason timeout, ARI = our CA GUID.
func (m *Manager) rejTimeoutMAD(c *conn) []byte {
	var ari [8]byte
	binary.BigEndian.PutUint64(ari[:], uint64(m.guid))
	return m.rejMAD(c.tid, c.localID, c.remoteID, mad.CMMsgOther, mad.RejTimeout, ari[:], nil)
}

func (m *Manager) dreqMAD(c *conn) []byte {
	return mad.NewCMMAD(m.newTID(c), &mad.CMDREQ{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.rqpn})
}

func (m *Manager) sendDREQLocked(c *conn) {
	m.setStateLocked(c, stDreqSent)
	c.err = ErrLocalDisconnect
	close(c.done)
	qpToErr(c.qp)
	c.discDone = make(chan struct{})
	c.msg = m.dreqMAD(c)
	c.sent = 1
	m.sendLocked(c.madTo, c.msg)
	m.armLocked(c, c.timeout)
}

// ---- receive path ----

func (m *Manager) handleMAD(src verbs.MADSource, b []byte) []byte {
	h, msg, err := mad.ParseCM(b)
	if err != nil || h.BaseVersion != mad.BaseVersion || h.MgmtClass != mad.ClassCM ||
		h.ClassVersion != mad.CMClassVersion || h.Method != mad.MethodSend {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	switch msg := msg.(type) {
	case *mad.CMREQ:
		m.onREQ(src, h.TID, msg)
	case *mad.CMREP:
		m.onREP(src, h.TID, msg)
	case *mad.CMRTU:
		m.onRTU(msg)
	case *mad.CMREJ:
		m.onREJ(msg)
	case *mad.CMMRA:
		m.onMRA(msg)
	case *mad.CMDREQ:
		m.onDREQ(src, h.TID, msg)
	case *mad.CMDREP:
		m.onDREP(msg)
	}
	return nil
}

func (m *Manager) onREQ(src verbs.MADSource, tid uint64, req *mad.CMREQ) {
	reject := func(reason mad.CMRejectReason, ari []byte) {
		m.sendLocked(madAddr{src.LID, src.GID}, m.rejMAD(tid, 0, req.LocalCommID, mad.CMMsgREQ, reason, ari, nil))
	}
	if c := m.byRemote[remoteKey{req.LocalCAGUID, req.LocalCommID}]; c != nil {
		// A retransmission of a REQ we know.
		switch {
		case c.state == stRepSent && c.reply != nil:
			m.sendLocked(c.madTo, c.reply)
		case c.state == stTimewait && c.reply != nil && binary.BigEndian.Uint16(c.reply[16:]) == mad.AttrCMREJ:
			m.sendLocked(c.madTo, c.reply)
		case c.state == stTimewait:
			reject(mad.RejStaleConn, nil)
		}
		return
	}
	if c := m.byRemoteQP[remoteQPKey{req.LocalCAGUID, req.LocalQPN}]; c != nil {
		reject(mad.RejStaleConn, nil)
		return
	}
	l := m.listeners[req.ServiceID]
	if l == nil {
		reject(mad.RejInvalidServiceID, nil)
		return
	}
	if req.TransportServiceType != mad.CMTransportRC {
		reject(mad.RejInvalidTransportType, nil)
		return
	}
	if req.PathMTU.Bytes() == 0 {
		reject(mad.RejInvalidMTU, nil)
		return
	}
	pkeyIndex, ok := m.port.FindPKey(req.PKey)
	if !ok {
		reject(mad.RejInvalidGID, req.Primary.LocalGID[:])
		return
	}
	from := madAddr{src.LID, src.GID}
	if m.halfOpen >= m.maxHalfOpen || m.halfOpenBy[sourceKey(from)] >= m.maxPerSource {
		// The REJ needs no record, so a flood of REQs costs no memory here.
		m.overLimit++
		reject(mad.RejNoResources, nil)
		return
	}

	c := m.newConnLocked(false)
	c.remoteID, c.rguid, c.rqpn, c.madTo, c.tid = req.LocalCommID, req.LocalCAGUID, req.LocalQPN, from, tid
	m.countHalfOpenLocked(c, 1)
	pp := req.Primary
	c.ah = verbs.AHAttr{Port: m.portNum, DLID: pp.LocalLID, SL: pp.SL, StaticRate: pp.PacketRate,
		GRH: !pp.SubnetLocal || pp.LocalLID == 0, DGID: pp.LocalGID, FlowLabel: pp.FlowLabel, HopLimit: pp.HopLimit, TClass: pp.TrafficClass}
	if c.ah.GRH && c.ah.HopLimit == 0 {
		c.ah.HopLimit = roceHopLimit
	}
	c.mtu, c.rqpsn = req.PathMTU, req.StartingPSN
	c.ackTimeout, c.retryCnt, c.rnrRetry = pp.LocalACKTimeout, req.RetryCount, req.RNRRetryCount
	// The REQ's timeouts and retries drive our REP and DREQ retries and timewait:
	// clamped, so that the peer cannot make us keep the record for long.
	c.timeout, c.retries = peerTimeout(req.LocalCMResponseTimeout), min(int(req.MaxCMRetries), maxPeerCMRetries)
	c.rejWait = max(c.timeout, peerTimeout(req.RemoteCMResponseTimeout))
	c.twait = c.rejWait * time.Duration(c.retries+1)
	m.byRemote[remoteKey{c.rguid, c.remoteID}] = c
	m.byRemoteQP[remoteQPKey{c.rguid, c.rqpn}] = c
	pub := c.pub
	pub.ServiceID, pub.RemoteCommID, pub.RemoteQPN = req.ServiceID, req.LocalCommID, req.LocalQPN
	pub.RemoteLID, pub.RemoteGID, pub.RemoteCAGUID = pp.LocalLID, pp.LocalGID, req.LocalCAGUID
	pub.RemotePrivateData = append([]byte(nil), req.PrivateData[:]...)
	r := &Request{
		ServiceID: req.ServiceID, RemoteQPN: req.LocalQPN, RemoteLID: pp.LocalLID, RemoteGID: pp.LocalGID,
		RemoteCAGUID: req.LocalCAGUID, PKey: req.PKey, PKeyIndex: pkeyIndex, PathMTU: req.PathMTU,
		StartingPSN: req.StartingPSN, RetryCount: req.RetryCount, RNRRetry: req.RNRRetryCount, SRQ: req.SRQ,
		PrivateData: append([]byte(nil), req.PrivateData[:]...),
	}
	// The failover field of the REP: this manager never loads an alternate path.
	failover := uint8(mad.CMFailoverAccepted)
	if req.Alternate.LocalLID != 0 {
		failover = mad.CMFailoverUnsupported
	}
	m.callLocked(func() { m.decide(c, l.h, r, failover) })
}

// decide runs the listener for c and carries out its decision.
func (m *Manager) decide(c *conn, h func(*Request) Decision, r *Request, failover uint8) {
	var acc *Accept
	var rej *Reject
	switch d := h(r).(type) {
	case Accept:
		acc = &d
	case *Accept:
		acc = d
	case Reject:
		rej = &d
	case *Reject:
		rej = d
	}
	if acc == nil && rej == nil {
		rej = &Reject{Reason: mad.RejConsumerDefined}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if c.state != stReqRcvd || m.closed {
		// The active side gave up (REJ) or the manager closed while the listener decided.
		if acc != nil {
			err := c.err
			if err == nil {
				err = verbs.ErrClosed
			}
			m.failAccept(*acc, fmt.Errorf("cm: accept: %w", err))
		}
		return
	}
	if rej != nil {
		m.rejectLocked(c, rej.Reason, nil, rej.PrivateData)
		return
	}
	if reason, err := m.acceptLocked(c, acc, r, failover); err != nil {
		m.rejectLocked(c, reason, nil, nil)
		m.failAccept(*acc, fmt.Errorf("cm: accept: %w", err))
	}
}

// acceptLocked moves the listener's QP to RTR and sends the REP.
func (m *Manager) acceptLocked(c *conn, acc *Accept, r *Request, failover uint8) (mad.CMRejectReason, error) {
	if len(acc.PrivateData) > mad.CMREPPrivateDataSize {
		return mad.RejConsumerDefined, fmt.Errorf("%w: %d bytes of private data (REP holds %d)", verbs.ErrInvalid, len(acc.PrivateData), mad.CMREPPrivateDataSize)
	}
	qp := acc.QP
	if qp == nil || qp.Type() != verbs.QPTypeRC {
		return mad.RejNoQP, fmt.Errorf("%w: need an RC QP", verbs.ErrInvalid)
	}
	switch st := qp.State(); st {
	case verbs.QPReset:
		if err := qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: r.PKeyIndex}); err != nil {
			return mad.RejNoQP, err
		}
	case verbs.QPInit:
	default:
		return mad.RejNoQP, fmt.Errorf("%w: QP is %v, need RESET or INIT", verbs.ErrInvalidState, st)
	}
	if err := m.toRTR(c, qp); err != nil {
		qpToErr(qp)
		return mad.RejNoQP, err
	}
	c.accept = *acc
	c.setQP(qp)
	c.pub.QP = qp
	c.psn = rand.Uint32() & 0xffffff
	rep := &mad.CMREP{LocalCommID: c.localID, RemoteCommID: c.remoteID, LocalQPN: qp.Num(), StartingPSN: c.psn,
		FailoverAccepted: failover, RNRRetryCount: r.RNRRetry, SRQ: acc.SRQ, LocalCAGUID: m.guid}
	copy(rep.PrivateData[:], acc.PrivateData)
	c.msg = mad.NewCMMAD(c.tid, rep)
	c.reply = c.msg
	c.sent = 1
	m.setStateLocked(c, stRepSent)
	m.sendLocked(c.madTo, c.msg)
	m.armLocked(c, c.timeout)
	return 0, nil
}

func (m *Manager) failAccept(acc Accept, err error) {
	if f := acc.Failed; f != nil {
		m.callLocked(func() { f(err) })
	}
}

// rejectLocked rejects the REQ of passive connection c and keeps the REJ for
// duplicates of the REQ during a short timewait: one CM response timeout covers the
// REQs that crossed the REJ, and the peer sends no more once the REJ arrives.
func (m *Manager) rejectLocked(c *conn, reason mad.CMRejectReason, ari, pd []byte) {
	c.reply = m.rejMAD(c.tid, c.localID, c.remoteID, mad.CMMsgREQ, reason, ari, pd)
	m.sendLocked(c.madTo, c.reply)
	m.timewaitLocked(c, c.rejWait)
}

func (m *Manager) toRTR(c *conn, qp verbs.QP) error {
	return qp.Modify(verbs.QPModify{
		Mask:  verbs.QPMaskState | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskDestQPN | verbs.QPMaskRQPSN,
		State: verbs.QPRTR, AH: c.ah, PathMTU: c.mtu, DestQPN: c.rqpn, RQPSN: c.rqpsn,
	})
}

func (m *Manager) toRTS(c *conn, qp verbs.QP) error {
	return qp.Modify(verbs.QPModify{
		Mask:  verbs.QPMaskState | verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry,
		State: verbs.QPRTS, SQPSN: c.psn, Timeout: c.ackTimeout, RetryCnt: c.retryCnt, RNRRetry: c.rnrRetry,
	})
}

func (m *Manager) onREP(src verbs.MADSource, tid uint64, rep *mad.CMREP) {
	c := m.conns[rep.RemoteCommID]
	if c == nil {
		m.sendLocked(madAddr{src.LID, src.GID}, m.rejMAD(tid, rep.RemoteCommID, rep.LocalCommID, mad.CMMsgREP, mad.RejInvalidCommID, nil, nil))
		return
	}
	if !c.active {
		return
	}
	switch c.state {
	case stEstablished:
		if rep.LocalCommID == c.remoteID && c.reply != nil {
			m.sendLocked(c.madTo, c.reply) // the RTU was lost
		}
		return
	case stReqSent:
	default:
		return
	}
	c.remoteID, c.rguid, c.rqpn, c.rqpsn = rep.LocalCommID, rep.LocalCAGUID, rep.LocalQPN, rep.StartingPSN
	c.rnrRetry = rep.RNRRetryCount
	c.stopTimer()
	err := m.toRTR(c, c.qp)
	if err == nil {
		err = m.toRTS(c, c.qp)
	}
	if err != nil {
		m.sendLocked(c.madTo, m.rejMAD(c.tid, c.localID, c.remoteID, mad.CMMsgREP, mad.RejNoQP, nil, nil))
		c.connectCh <- err
		qpToErr(c.qp)
		m.enterTimewaitLocked(c)
		return
	}
	pub := c.pub
	pub.QP, pub.RemoteCommID, pub.RemoteQPN = c.qp, c.remoteID, c.rqpn
	pub.RemoteLID, pub.RemoteGID, pub.RemoteCAGUID = c.ah.DLID, c.ah.DGID, c.rguid
	pub.RemotePrivateData = append([]byte(nil), rep.PrivateData[:]...)
	m.byRemote[remoteKey{c.rguid, c.remoteID}] = c
	c.reply = mad.NewCMMAD(c.tid, &mad.CMRTU{LocalCommID: c.localID, RemoteCommID: c.remoteID})
	m.sendLocked(c.madTo, c.reply)
	m.setStateLocked(c, stEstablished)
	c.connectCh <- nil
}

func (m *Manager) onRTU(rtu *mad.CMRTU) {
	c := m.conns[rtu.RemoteCommID]
	if c == nil || c.active || c.state != stRepSent || rtu.LocalCommID != c.remoteID {
		return
	}
	c.stopTimer()
	if err := m.toRTS(c, c.qp); err != nil {
		m.sendLocked(c.madTo, m.rejMAD(c.tid, c.localID, c.remoteID, mad.CMMsgOther, mad.RejNoQP, nil, nil))
		m.endLocked(c, fmt.Errorf("cm: accept: %w", err))
		m.enterTimewaitLocked(c)
		return
	}
	m.setStateLocked(c, stEstablished)
	if f := c.accept.Established; f != nil {
		pub := c.pub
		m.callLocked(func() { f(pub) })
	}
}

func (m *Manager) onREJ(rej *mad.CMREJ) {
	c := m.conns[rej.RemoteCommID]
	if c != nil && c.remoteID != 0 && rej.LocalCommID != 0 && rej.LocalCommID != c.remoteID {
		c = nil
	}
	if c == nil && rej.Reason == mad.RejTimeout && rej.RejectInfoLength >= 8 {
		// A peer that gives up names itself by CA GUID in the ARI.
		c = m.byRemote[remoteKey{verbs.GUID(binary.BigEndian.Uint64(rej.ARI[:8])), rej.LocalCommID}]
	}
	if c == nil {
		return
	}
	switch c.state {
	case stReqSent, stReqRcvd, stRepSent, stEstablished:
	default:
		return
	}
	err := &RejectError{Reason: rej.Reason, ARI: append([]byte(nil), rej.ValidARI()...),
		PrivateData: append([]byte(nil), rej.PrivateData[:]...)}
	m.endLocked(c, err)
	m.enterTimewaitLocked(c)
}

func (m *Manager) onMRA(mra *mad.CMMRA) {
	c := m.conns[mra.RemoteCommID]
	if c == nil {
		return
	}
	if !c.mraSeen && ((c.state == stReqSent && mra.MessageMRAed == mad.CMMsgREQ) ||
		(c.state == stRepSent && mra.MessageMRAed == mad.CMMsgREP)) {
		// The peer needs ServiceTimeout more: wait that long (plus the usual
		// timeout) before the next retransmission. Only for the first MRA, as the
		// kernel, and clamped like the REQ's timeouts: otherwise a peer could keep
		// the connection waiting for ever.
		c.mraSeen = true
		m.armLocked(c, mad.CMTimeout(min(mra.ServiceTimeout&0x1f, maxPeerCMTimeout))+c.timeout)
	}
}

func (m *Manager) onDREQ(src verbs.MADSource, tid uint64, dreq *mad.CMDREQ) {
	drep := func(local, remote uint32) []byte {
		return mad.NewCMMAD(tid, &mad.CMDREP{LocalCommID: local, RemoteCommID: remote})
	}
	c := m.conns[dreq.RemoteCommID]
	if c == nil {
		m.sendLocked(madAddr{src.LID, src.GID}, drep(dreq.RemoteCommID, dreq.LocalCommID))
		return
	}
	if dreq.LocalCommID != c.remoteID || !c.hasQP || dreq.RemoteQPN != c.lqpn {
		return
	}
	switch c.state {
	case stEstablished, stRepSent:
		m.endLocked(c, ErrDisconnected)
		m.enterTimewaitLocked(c)
	case stDreqSent:
		// Both sides disconnect at once: answer, and take the DREQ as our DREP.
		m.endLocked(c, nil)
		m.enterTimewaitLocked(c)
	case stTimewait:
	default:
		return
	}
	m.sendLocked(c.madTo, drep(c.localID, c.remoteID))
}

func (m *Manager) onDREP(drep *mad.CMDREP) {
	c := m.conns[drep.RemoteCommID]
	if c == nil || c.state != stDreqSent || drep.LocalCommID != c.remoteID {
		return
	}
	m.endLocked(c, nil)
	m.enterTimewaitLocked(c)
}
