//go:build rdma && linux

package rdma

/*
#cgo LDFLAGS: -libumad
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/umad.h>

// ipoibfs_wait blocks until fd is readable (1) or wakefd is (2), or timeout_ms
// passes (0; -1 waits for ever); -errno on error. poll goes through the C library, so
// libumad2sim (LD_PRELOAD) sees it, as it must. The device's event and completion
// loops use it too (device.go, queue.go).
int ipoibfs_wait(int fd, int wakefd, int timeout_ms) {
	struct pollfd p[2];
	memset(p, 0, sizeof p);
	p[0].fd = fd;
	p[0].events = POLLIN;
	p[1].fd = wakefd;
	p[1].events = POLLIN;
	for (;;) {
		int n = poll(p, 2, timeout_ms);
		if (n == 0)
			return 0;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (p[1].revents)
			return 2;
		if (p[0].revents & POLLIN)
			return 1;
		if (p[0].revents & (POLLERR | POLLHUP | POLLNVAL))
			return -EIO;
	}
}

// ipoibfs_umad_register registers an agent for one class and version: a client (no
// methods: it receives only the responses to what it sends) or a server (every
// request method, 0x01-0x7f).
static int ipoibfs_umad_register(int portid, int cls, int version, int rmpp, int server) {
	long mask[16 / sizeof(long)];
	int m;
	if (!server)
		return umad_register(portid, cls, version, (uint8_t)rmpp, NULL);
	memset(mask, 0, sizeof mask);
	for (m = 1; m < 0x80; m++)
		mask[m / (8 * sizeof(long))] |= 1L << (m % (8 * sizeof(long)));
	return umad_register(portid, cls, version, (uint8_t)rmpp, mask);
}

// ipoibfs_umad_send sends len bytes of mad from agent to dqp at dlid; buf holds
// umad_size() + len bytes. timeout_ms > 0 makes it a request the MAD layer tracks.
// With gid non-NULL the MAD carries a GRH to it (a port without LIDs: RoCE).
static int ipoibfs_umad_send(int portid, int agent, void *buf, const void *mad, int len,
                             int dlid, int dqp, int qkey, int timeout_ms, const void *gid) {
	memset(buf, 0, umad_size());
	memcpy(umad_get_mad(buf), mad, len);
	umad_set_addr(buf, dlid, dqp, 0, qkey);
	if (gid) {
		struct ib_user_mad *u = buf;
		u->addr.grh_present = 1;
		u->addr.gid_index = 0;
		u->addr.hop_limit = 64; // RoCE v2 carries it as the IPv6 hop limit
		memcpy(u->addr.gid, gid, 16);
	}
	if (umad_send(portid, agent, buf, len, timeout_ms, 0) < 0)
		return errno ? -errno : -EIO;
	return 0;
}

struct ipoibfs_rcv {
	int len;      // MAD bytes (or bytes needed, for -ENOSPC)
	int agent;
	int status;   // the MAD layer's status (ETIMEDOUT for a request that got no answer)
	int slid;
	int sqp;
	int grh;
	uint8_t gid[16];
};

// ipoibfs_umad_recv reads one MAD into buf (umad_size() + cap bytes): 0, -ENOSPC with
// r->len the size needed (the MAD stays queued), -EAGAIN, or another -errno.
static int ipoibfs_umad_recv(int portid, void *buf, int cap, struct ipoibfs_rcv *r) {
	int len = cap, n;
	ib_mad_addr_t *a;
	memset(buf, 0, umad_size());
	n = umad_recv(portid, buf, &len, 0);
	if (n < 0) {
		if (n == -ENOSPC || errno == ENOSPC) {
			r->len = len;
			return -ENOSPC;
		}
		return errno ? -errno : n;
	}
	a = umad_get_mad_addr(buf);
	r->len = len;
	r->agent = n;
	r->status = umad_status(buf);
	r->slid = ntohs(a->lid);
	r->sqp = ntohl(a->qpn);
	r->grh = a->grh_present;
	memcpy(r->gid, a->gid, 16);
	return 0;
}

static void ipoibfs_port_info(umad_port_t *p, uint64_t *prefix, uint64_t *guid, uint32_t *capmask) {
	*prefix = be64toh(p->gid_prefix);
	*guid = be64toh(p->port_guid);
	*capmask = ntohl(p->capmask);
}

static uint16_t ipoibfs_pkey_at(umad_port_t *p, unsigned i) { return p->pkeys[i]; }
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

var umadInit = sync.OnceValue(func() error {
	if C.umad_init() < 0 {
		return errors.New("umad_init failed")
	}
	return nil
})

// maxLongMAD bounds a joined-up RMPP answer this agent reads (the kernel's MAD layer
// joins it; mad.MaxRMPPSegments segments of class data).
const maxLongMAD = mad.SADataOffset + mad.MaxRMPPSegments*mad.RMPPSegData

// callGrace is how long Call waits beyond its timeout for the MAD layer's own timeout
// notice before it resends anyway (umad2sim never sends one).
const callGrace = 50 * time.Millisecond

type agentKey struct {
	class, version uint8
	server         bool
}

type pendingCall struct {
	resp chan []byte // the response
	fail chan int    // the MAD layer's status for a try that got no answer (ETIMEDOUT)
}

// Agent is a port's QP1 MAD agent over libibumad (verbs.MADAgent). One receive
// goroutine per agent blocks in poll(2) on the umad file and a wake pipe; Close ends it.
type Agent struct {
	ca   string
	port int
	id   C.int // umad port id
	fd   C.int
	wake [2]int

	smu  sync.Mutex // sbuf and the umad send path
	sbuf unsafe.Pointer

	mu      sync.Mutex
	agents  map[agentKey]C.int
	pending map[uint32]*pendingCall
	handler map[uint8]verbs.MADHandler
	closed  bool

	tid     atomic.Uint32
	closing atomic.Bool
	done    chan struct{} // closed when the receive loop ends
	Errors  atomic.Uint64 // receive errors and MADs dropped (no handler, bad size)
}

// OpenAgent opens the umad port of ca (a device name; "" = the first) and port (0 =
// the first active) and starts its receive loop.
func OpenAgent(ca string, port int) (*Agent, error) {
	if err := umadInit(); err != nil {
		return nil, err
	}
	p, err := getUmadPort(ca, port)
	if err != nil {
		return nil, err
	}
	cname := C.CString(p.ca)
	defer C.free(unsafe.Pointer(cname))
	id := C.umad_open_port(cname, C.int(p.num))
	if id < 0 {
		return nil, &verbs.Error{Op: "umad_open_port", Obj: fmt.Sprintf("%s port %d", p.ca, p.num), Err: syscall.Errno(-id)}
	}
	a := &Agent{ca: p.ca, port: p.num, id: id, fd: C.umad_get_fd(id),
		agents: map[agentKey]C.int{}, pending: map[uint32]*pendingCall{}, handler: map[uint8]verbs.MADHandler{},
		done: make(chan struct{})}
	if err := syscall.Pipe2(a.wake[:], syscall.O_CLOEXEC); err != nil {
		C.umad_close_port(id)
		return nil, err
	}
	a.sbuf = C.calloc(1, C.size_t(C.umad_size()+mad.Size))
	a.tid.Store(uint32(time.Now().UnixNano()) & 0x00ffffff) // distinct across restarts
	go a.loop()
	return a, nil
}

func (a *Agent) String() string { return fmt.Sprintf("%s port %d", a.ca, a.port) }

// CA returns the device name and port number the agent is open on.
func (a *Agent) CA() (string, int) { return a.ca, a.port }

// agentFor returns the umad agent id for a class, registering it on first use. The SA
// class is registered with RMPP version 1: the MAD layer joins long answers.
func (a *Agent) agentFor(class, version uint8, server bool) (C.int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return -1, verbs.ErrClosed
	}
	k := agentKey{class, version, server}
	if id, ok := a.agents[k]; ok {
		return id, nil
	}
	rmpp := 0
	if class == mad.ClassSA {
		rmpp = 1
	}
	srv := 0
	if server {
		srv = 1
	}
	id := C.ipoibfs_umad_register(a.id, C.int(class), C.int(version), C.int(rmpp), C.int(srv))
	if id < 0 {
		return -1, &verbs.Error{Op: "umad_register", Obj: fmt.Sprintf("%s class %#02x", a, class), Err: syscall.Errno(-id)}
	}
	a.agents[k] = id
	return id, nil
}

// sendAgent picks the agent a MAD of class goes out on: the server agent of the class
// if there is one, else its client agent.
func (a *Agent) sendAgent(class, version uint8) (C.int, error) {
	a.mu.Lock()
	id, ok := a.agents[agentKey{class, version, true}]
	a.mu.Unlock()
	if ok {
		return id, nil
	}
	return a.agentFor(class, version, false)
}

func (a *Agent) send(agent C.int, dlid verbs.LID, dqp verbs.QPN, m []byte, timeout time.Duration) error {
	return a.sendTo(agent, dlid, nil, dqp, m, timeout)
}

// sendTo is send with, when dgid is not nil, a GRH to dgid.
func (a *Agent) sendTo(agent C.int, dlid verbs.LID, dgid *verbs.GID, dqp verbs.QPN, m []byte, timeout time.Duration) error {
	if len(m) > mad.Size {
		return fmt.Errorf("%w: MAD of %d bytes (long answers are not sent from userspace)", verbs.ErrInvalid, len(m))
	}
	a.smu.Lock()
	defer a.smu.Unlock()
	if a.sbuf == nil {
		return verbs.ErrClosed
	}
	var gid unsafe.Pointer
	var g [16]C.uint8_t // C memory for the GID: cgo may not keep a Go pointer
	if dgid != nil {
		for k := range g {
			g[k] = C.uint8_t(dgid[k])
		}
		gid = unsafe.Pointer(&g[0])
	}
	r := C.ipoibfs_umad_send(a.id, agent, a.sbuf, unsafe.Pointer(unsafe.SliceData(m)), C.int(len(m)),
		C.int(dlid), C.int(dqp), C.int(gsiQKey), C.int(timeout.Milliseconds()), gid)
	if r < 0 {
		return syscall.Errno(-r)
	}
	return nil
}

// Call sends a request MAD to QP1 at dlid and waits for the response whose
// transaction ID has the same low 32 bits (the MAD layer puts its agent number in the
// high ones; the caller's high bits are put back in the answer). After each timeout
// the request is sent again, retries times.
func (a *Agent) Call(ctx context.Context, dlid verbs.LID, req []byte, timeout time.Duration, retries int) ([]byte, error) {
	if len(req) < mad.HeaderSize || len(req) > mad.Size {
		return nil, &verbs.Error{Op: "mad_call", Obj: a.String(), Err: fmt.Errorf("%w: MAD of %d bytes", verbs.ErrInvalid, len(req))}
	}
	if timeout <= 0 {
		timeout = time.Second
	}
	agent, err := a.agentFor(req[1], req[2], false)
	if err != nil {
		return nil, &verbs.Error{Op: "mad_call", Obj: a.String(), Err: err}
	}
	req = slices.Clone(req)
	hi := binary.BigEndian.Uint32(req[8:])
	tid := a.tid.Add(1)
	binary.BigEndian.PutUint32(req[12:], tid)
	c := &pendingCall{resp: make(chan []byte, 1), fail: make(chan int, 1)}
	a.mu.Lock()
	a.pending[tid] = c
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.pending, tid)
		a.mu.Unlock()
	}()
	for try := 0; try <= retries; try++ {
		if err := a.send(agent, dlid, verbs.GSIQPN, req, timeout); err != nil {
			return nil, &verbs.Error{Op: "mad_call", Obj: a.String(), Err: err}
		}
		sent := time.Now()
		t := time.NewTimer(timeout + callGrace)
		select {
		case resp := <-c.resp:
			t.Stop()
			binary.BigEndian.PutUint32(resp[8:], hi)
			return resp, nil
		case <-c.fail:
			// The MAD layer gave up on this try: the kernel after the timeout, ibsim
			// at once for a LID it cannot route (also as ETIMEDOUT). A try is never
			// shorter than the timeout, so the rest of it is waited out.
			if rest := timeout - time.Since(sent); rest > 0 {
				t.Reset(rest)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return nil, ctx.Err()
				}
			}
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-a.done:
			t.Stop()
			return nil, &verbs.Error{Op: "mad_call", Obj: a.String(), Err: verbs.ErrClosed}
		}
		t.Stop()
	}
	return nil, &verbs.Error{Op: "mad_call", Obj: fmt.Sprintf("%s to LID %#x", a, dlid), Err: verbs.ErrTimeout}
}

// Send sends a MAD from QP1 to dqp at dlid without waiting for anything.
func (a *Agent) Send(dlid verbs.LID, dqp verbs.QPN, m []byte) error {
	if len(m) < mad.HeaderSize {
		return &verbs.Error{Op: "mad_send", Obj: a.String(), Err: verbs.ErrInvalid}
	}
	agent, err := a.sendAgent(m[1], m[2])
	if err == nil {
		err = a.send(agent, dlid, dqp, m, 0)
	}
	if err != nil {
		return &verbs.Error{Op: "mad_send", Obj: a.String(), Err: err}
	}
	return nil
}

// SendGID sends a MAD to dqp at the port with dgid, with a GRH (verbs.GIDMADSender):
// how QP1 is reached on a port without LIDs (RoCE).
func (a *Agent) SendGID(dgid verbs.GID, dqp verbs.QPN, m []byte) error {
	if len(m) < mad.HeaderSize {
		return &verbs.Error{Op: "mad_send", Obj: a.String(), Err: verbs.ErrInvalid}
	}
	agent, err := a.sendAgent(m[1], m[2])
	if err == nil {
		err = a.sendTo(agent, 0, &dgid, dqp, m, 0)
	}
	if err != nil {
		return &verbs.Error{Op: "mad_send", Obj: fmt.Sprintf("%s to %v", a, dgid), Err: err}
	}
	return nil
}

// Register installs the handler of a management class (class version 2 for SA and
// CM, 1 for the others), registering a umad agent for its request methods; nil
// removes the handler. Where another agent (the kernel's ib_cm, for one) already owns
// the class's methods, the registration fails and is counted in Errors.
func (a *Agent) Register(class uint8, h verbs.MADHandler) {
	if h != nil {
		if _, err := a.agentFor(class, classVersion(class), true); err != nil {
			a.Errors.Add(1)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if h == nil {
		delete(a.handler, class)
		return
	}
	a.handler[class] = h
}

func classVersion(class uint8) uint8 {
	switch class {
	case mad.ClassSA, mad.ClassCM:
		return 2
	}
	return 1
}

// waitTimeout is how long the receive loop blocks in poll before it looks at closing:
// for ever, since Close wakes it through the pipe, except under libumad2sim, whose
// poll(2) wrapper (ibsim 0.10) does not return for the wake pipe, so it wakes every
// 200 ms there.
func waitTimeout() int {
	if strings.Contains(os.Getenv("LD_PRELOAD"), "umad2sim") {
		return 200
	}
	return -1
}

// loop receives MADs until Close.
func (a *Agent) loop() {
	defer close(a.done)
	capacity := mad.Size
	buf := C.calloc(1, C.size_t(C.umad_size()+C.size_t(capacity)))
	defer func() { C.free(buf) }()
	var r C.struct_ipoibfs_rcv
	for {
		w := C.ipoibfs_wait(a.fd, C.int(a.wake[0]), C.int(waitTimeout()))
		if w == 2 || a.closing.Load() {
			return
		}
		if w == 0 {
			continue
		}
		if w < 0 {
			a.Errors.Add(1)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		n := C.ipoibfs_umad_recv(a.id, buf, C.int(capacity), &r)
		switch {
		case n == -C.ENOSPC && int(r.len) > capacity && int(r.len) <= maxLongMAD:
			capacity = int(r.len)
			C.free(buf)
			buf = C.calloc(1, C.size_t(C.umad_size()+C.size_t(capacity)))
			continue
		case n == -C.EAGAIN:
			continue
		case n < 0:
			a.Errors.Add(1)
			continue
		}
		l := min(int(r.len), capacity)
		m := received(unsafe.Slice((*byte)(C.umad_get_mad(buf)), l))
		src := verbs.MADSource{LID: verbs.LID(r.slid), QPN: verbs.QPN(r.sqp) & 0xffffff}
		if r.grh != 0 {
			src.GID = verbs.GID(C.GoBytes(unsafe.Pointer(&r.gid[0]), 16))
		}
		a.dispatch(src, int(r.agent), int(r.status), m)
	}
}

// received copies a MAD read from the umad file. A MAD shorter than 256 bytes is
// padded with zeros, as the MAD layer's buffer is. One case is completed rather than
// padded: an SA answer that a userspace RMPP sender (OpenSM's vendor layer) wrote
// with only the ACTIVE flag set, leaving version, type, segment number and
// PayloadLength to its kernel MAD layer, arrives that way when no kernel is in between
// (libumad2sim). It becomes the one DATA segment the kernel would have sent (version
// 1, ACTIVE, FIRST, LAST, its PayloadLength), so a GetTable answer says how many
// records it holds. The kernel itself delivers short MADs only as complete transfers.
func received(b []byte) []byte {
	h := mad.HeaderSize
	if len(b) >= mad.SADataOffset && len(b) < mad.Size && b[1] == mad.ClassSA &&
		b[h+2]&mad.RMPPFlagActive != 0 && (b[h] != mad.RMPPVersion1 || b[h+1] != mad.RMPPTypeData) {
		if segs, err := mad.SplitRMPP(b); err == nil && len(segs) == 1 {
			return segs[0]
		}
	}
	m := make([]byte, max(len(b), mad.Size))
	copy(m, b)
	return m
}

// Received says what a received MAD is for the agent.
type Received uint8

const (
	RecvDrop     Received = iota // too short to be a MAD
	RecvFailed                   // the MAD layer's notice that a request got no answer
	RecvResponse                 // a response (match it to a Call by TID)
	RecvRequest                  // anything else: for the class handler
)

// Classify says what a MAD read from the umad file with the given status is, and
// the low 32 bits of its TID. It is all the parsing the agent does of input.
func Classify(status int, m []byte) (Received, uint32) {
	if len(m) < mad.HeaderSize {
		return RecvDrop, 0
	}
	tid := binary.BigEndian.Uint32(m[12:])
	switch {
	case status != 0:
		return RecvFailed, tid
	case m[3]&mad.MethodResp != 0:
		return RecvResponse, tid
	}
	return RecvRequest, tid
}

func (a *Agent) dispatch(src verbs.MADSource, agent, status int, m []byte) {
	kind, tid := Classify(status, m)
	if kind == RecvFailed {
		a.mu.Lock()
		c := a.pending[tid]
		a.mu.Unlock()
		if c != nil {
			select {
			case c.fail <- status:
			default:
			}
		}
		return // a Send's failure, or a Call that gave up
	}
	switch kind {
	case RecvDrop:
		a.Errors.Add(1)
		return
	case RecvResponse:
		a.mu.Lock()
		c := a.pending[tid]
		a.mu.Unlock()
		if c != nil {
			select {
			case c.resp <- m:
			default: // a duplicate answer to a resent request
			}
			return
		}
	}
	a.mu.Lock()
	h := a.handler[m[1]]
	a.mu.Unlock()
	if h == nil {
		a.Errors.Add(1)
		return
	}
	if resp := h(src, m); resp != nil {
		var dgid *verbs.GID
		if src.LID == 0 && !src.GID.IsZero() { // came by GID (RoCE): answer the same way
			dgid = &src.GID
		}
		err := a.sendTo(C.int(agent), src.LID, dgid, src.QPN, resp, 0)
		if err != nil {
			a.Errors.Add(1)
		}
	}
}

// Close unregisters the agents and closes the umad port; pending Calls fail.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	a.closing.Store(true)
	_, _ = syscall.Write(a.wake[1], []byte{1})
	<-a.done
	a.smu.Lock()
	defer a.smu.Unlock()
	for _, id := range a.agents {
		C.umad_unregister(a.id, id)
	}
	C.umad_close_port(a.id)
	C.free(a.sbuf)
	a.sbuf = nil
	syscall.Close(a.wake[0])
	syscall.Close(a.wake[1])
	return nil
}

// umadPort is what libibumad tells of a port (sysfs).
type umadPort struct {
	ca                 string
	num                int
	attr               verbs.PortAttr
	pkeys              []verbs.PKey
	rateGbps           int
	nodeGUID, sysGUID  verbs.GUID
	fw, hw, caType     string
	numPorts, nodeType int
}

func getUmadPort(ca string, port int) (umadPort, error) {
	if err := umadInit(); err != nil {
		return umadPort{}, err
	}
	var cname *C.char
	if ca != "" {
		cname = C.CString(ca)
		defer C.free(unsafe.Pointer(cname))
	}
	var p C.umad_port_t
	if r := C.umad_get_port(cname, C.int(port), &p); r < 0 {
		name := ca
		if name == "" {
			name = "(first)"
		}
		return umadPort{}, &verbs.Error{Op: "umad_get_port", Obj: fmt.Sprintf("%s port %d", name, port), Err: syscall.Errno(-r)}
	}
	defer C.umad_release_port(&p)
	var prefix, guid C.uint64_t
	var capmask C.uint32_t
	C.ipoibfs_port_info(&p, &prefix, &guid, &capmask)
	u := umadPort{ca: C.GoString(&p.ca_name[0]), num: int(p.portnum), rateGbps: int(p.rate)}
	u.attr = verbs.PortAttr{
		State: verbs.PortState(p.state), PhysState: verbs.PhysState(p.phys_state),
		LID: verbs.LID(p.base_lid), SMLID: verbs.LID(p.sm_lid), SMSL: uint8(p.sm_sl), LMC: uint8(p.lmc),
		GUID: verbs.GUID(guid), GIDPrefix: uint64(prefix), PKeyTabLen: int(p.pkeys_size),
		LinkLayer: C.GoString(&p.link_layer[0]), CapMask: uint32(capmask),
	}
	if u.attr.LinkLayer == "" {
		u.attr.LinkLayer = "InfiniBand"
	}
	for i := range uint(p.pkeys_size) {
		u.pkeys = append(u.pkeys, verbs.PKey(C.ipoibfs_pkey_at(&p, C.uint(i))))
	}
	return u, nil
}

// MADPort is a port known only through libibumad: attributes from sysfs and the QP1
// agent, no queue pairs. It is what the SA client needs, and all a host without an
// ibverbs device (or a process under libumad2sim, which emulates no verbs) can have.
type MADPort struct {
	ca    string
	num   int
	agent *Agent
}

// OpenMADPort opens the QP1 agent of ca's port (ca "" = the first device, port 0 = its
// first active port).
func OpenMADPort(ca string, port int) (*MADPort, error) {
	a, err := OpenAgent(ca, port)
	if err != nil {
		return nil, err
	}
	return &MADPort{ca: a.ca, num: a.port, agent: a}, nil
}

func (p *MADPort) Num() int { return p.num }

// CA is the device name of the port.
func (p *MADPort) CA() string { return p.ca }

func (p *MADPort) snapshot() umadPort {
	u, err := getUmadPort(p.ca, p.num)
	if err != nil {
		return umadPort{attr: verbs.PortAttr{State: verbs.PortDown}}
	}
	return u
}

// Attr reads the port's attributes from sysfs. libibumad does not show the MTU: it
// is zero here (a Device's ports have it from ibv_query_port).
func (p *MADPort) Attr() verbs.PortAttr {
	u := p.snapshot()
	u.attr.Rate = rateFromGbps(u.rateGbps)
	return u.attr
}

// GID returns entry 0 (subnet prefix + port GUID), the only one sysfs shows libibumad.
func (p *MADPort) GID(index int) (verbs.GID, error) {
	if index != 0 {
		return verbs.GID{}, &verbs.Error{Op: "query_gid", Obj: fmt.Sprintf("%s port %d index %d", p.ca, p.num, index), Err: verbs.ErrInvalid}
	}
	a := p.snapshot().attr
	return verbs.MakeGID(a.GIDPrefix, a.GUID), nil
}

func (p *MADPort) PKeyTable() []verbs.PKey { return p.snapshot().pkeys }

func (p *MADPort) FindPKey(key verbs.PKey) (int, bool) { return findPKey(p.PKeyTable(), key) }

// Counters reads the port's counters from sysfs (counters.go).
func (p *MADPort) Counters() verbs.PortCounters { return readCounters(p.ca, p.num) }

func (p *MADPort) MAD() verbs.MADAgent { return p.agent }

// Close closes the agent.
func (p *MADPort) Close() error { return p.agent.Close() }

// findPKey is ib_find_pkey: the exact key, else the first entry of the same partition.
func findPKey(tab []verbs.PKey, key verbs.PKey) (int, bool) {
	partial := -1
	for i, k := range tab {
		if k == key && k.Valid() {
			return i, true
		}
		if k.Valid() && k.Base() == key.Base() && partial < 0 {
			partial = i
		}
	}
	return partial, partial >= 0
}

// rateFromGbps maps sysfs's whole Gb/s (libibumad's rate) to the static rate code.
func rateFromGbps(g int) verbs.Rate {
	switch g {
	case 2, 3: // 2.5 prints as 2 in umad's integer
		return 2
	case 5:
		return 5
	case 10:
		return 3
	case 14:
		return 11
	case 20:
		return 6
	case 25:
		return 15
	case 30:
		return 4
	case 40:
		return 7
	case 56:
		return 12
	case 60:
		return 8
	case 80:
		return 9
	case 100:
		return 16
	case 112:
		return 13
	case 120:
		return 10
	case 168:
		return 14
	case 200:
		return 17
	case 300:
		return 18
	case 50:
		return 20
	case 400:
		return 21
	case 600:
		return 22
	case 800:
		return 23
	case 1200:
		return 24
	}
	return 0
}

// gsiQKey is verbs.GSIQKey as the C int umad_set_addr takes (same bits).
var gsiQKey = func() int32 { k := verbs.GSIQKey; return int32(k) }()

// exitProcess ends the process through the C library's exit, so atexit handlers run:
// libumad2sim detaches from ibsim and removes its sysfs copy there, which os.Exit
// would skip. For test helper processes.
func exitProcess(code int) { C.exit(C.int(code)) }
