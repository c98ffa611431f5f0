//go:build rdma && linux

package rdma

/*
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

int ipoibfs_wait(int fd, int wakefd, int timeout_ms);

static int ipoibfs_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return ibv_poll_cq(cq, n, wc); }
static int ipoibfs_arm_cq(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }
static int ipoibfs_moderate_cq(struct ibv_cq *cq, uint16_t count, uint16_t usecs) {
	struct ibv_modify_cq_attr a;
	memset(&a, 0, sizeof a);
	a.attr_mask = IBV_CQ_ATTR_MODERATE;
	a.moderate.cq_count = count;
	a.moderate.cq_period = usecs;
	return ibv_modify_cq(cq, &a);
}

// ipoibfs_cq_event takes one completion event off the channel, acknowledges it and
// re-arms the CQ: 0, or -errno.
static int ipoibfs_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx))
		return errno ? -errno : -EIO;
	ibv_ack_cq_events(cq, 1);
	return ibv_req_notify_cq(cq, 0) ? -EIO : 0;
}

static struct ibv_wc *ipoibfs_wc_at(struct ibv_wc *w, int i) { return &w[i]; }
static uint32_t ipoibfs_wc_imm(struct ibv_wc *w) { return be32toh(w->imm_data); }

static int ipoibfs_post_send(struct ibv_qp *qp, uint64_t id, void *addr, uint32_t len, uint32_t lkey,
                             struct ibv_ah *ah, uint32_t rqpn, uint32_t rqkey, int signaled, int with_imm, uint32_t imm) {
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	wr.imm_data = htobe32(imm);
	if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = rqpn;
		wr.wr.ud.remote_qkey = rqkey;
	}
	return ibv_post_send(qp, &wr, &bad);
}

// ipoibfs_post_recv posts one receive buffer to the QP, or to srq when it is set.
static int ipoibfs_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, uint64_t id, void *addr, uint32_t len, uint32_t lkey) {
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
}

// ipoibfs_fill_ah fills an address vector: by LID, and with grh by GID too.
static void ipoibfs_fill_ah(struct ibv_ah_attr *a, int port, int dlid, int sl, int grh,
                            const void *dgid, int sgid_index, uint32_t flow, int hop, int tclass) {
	a->dlid = dlid;
	a->sl = sl;
	a->port_num = port;
	if (grh) {
		a->is_global = 1;
		memcpy(a->grh.dgid.raw, dgid, 16);
		a->grh.sgid_index = sgid_index;
		a->grh.flow_label = flow;
		a->grh.hop_limit = hop;
		a->grh.traffic_class = tclass;
	}
}

static int ipoibfs_modify_qp(struct ibv_qp *qp, int state, int pkey_index, int port, uint32_t qkey, int mask) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	a.pkey_index = pkey_index;
	a.port_num = port;
	a.qkey = qkey;
	a.sq_psn = 0;
	return ibv_modify_qp(qp, &a, mask);
}

// ipoibfs_modify_rc moves an RC QP; the caller's mask says which attributes count.
static int ipoibfs_modify_rc(struct ibv_qp *qp, int state, int mask, int pkey_index, int port,
                             uint32_t dqpn, int mtu, uint32_t rq_psn, uint32_t sq_psn, int timeout, int retry, int rnr,
                             int dlid, int sl, int grh, const void *dgid, int sgid_index, uint32_t flow, int hop, int tclass) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	a.pkey_index = pkey_index;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
	a.dest_qp_num = dqpn;
	a.path_mtu = mtu;
	a.rq_psn = rq_psn;
	a.sq_psn = sq_psn;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = rnr;
	a.min_rnr_timer = 12; // 0.64 ms, as the kernel's ipoib_cm
	a.max_dest_rd_atomic = 1;
	a.max_rd_atomic = 1;
	ipoibfs_fill_ah(&a.ah_attr, port, dlid, sl, grh, dgid, sgid_index, flow, hop, tclass);
	return ibv_modify_qp(qp, &a, mask);
}

static struct ibv_ah *ipoibfs_create_ah(struct ibv_pd *pd, int port, int dlid, int sl, int rate, int grh,
                                        const void *dgid, int sgid_index, uint32_t flow, int hop, int tclass) {
	struct ibv_ah_attr a;
	memset(&a, 0, sizeof a);
	ipoibfs_fill_ah(&a, port, dlid, sl, grh, dgid, sgid_index, flow, hop, tclass);
	a.static_rate = rate;
	return ibv_create_ah(pd, &a);
}

// ipoibfs_qp_state is the QP's state as the device has it (it moves a QP to ERR on
// its own after some errors): an ibv_qp_state, or -1.
static int ipoibfs_qp_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return -1;
	return a.qp_state;
}

static int ipoibfs_mcast(struct ibv_qp *qp, const void *gid, int lid, int attach) {
	union ibv_gid g;
	memcpy(g.raw, gid, 16);
	return attach ? ibv_attach_mcast(qp, &g, lid) : ibv_detach_mcast(qp, &g, lid);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"ipoibfs/verbs"
)

// CQ is a completion queue with its own completion channel: a goroutine blocks in
// poll(2) on the channel and, when the CQ has completions, re-arms it and runs the
// CQ's handler (verbs.CQAttr.Handler) or signals Notify, so nothing is lost and
// nothing spins.
type CQ struct {
	dev     *Device
	cq      *C.struct_ibv_cq
	ch      *C.struct_ibv_comp_channel
	notify  chan struct{}
	handler func() bool
	wake    [2]int
	done    chan struct{}

	mu  sync.Mutex // wcs
	wcs *C.struct_ibv_wc
	n   int

	overruns  atomic.Uint64
	closeOnce sync.Once
}

const wcBatch = 64

func (d *Device) CreateCQ(attr verbs.CQAttr) (verbs.CQ, error) {
	entries := max(attr.Entries, 1)
	c := &CQ{dev: d, notify: make(chan struct{}, 1), handler: attr.Handler, done: make(chan struct{}), n: wcBatch}
	c.ch = C.ibv_create_comp_channel(d.ctx)
	if c.ch == nil {
		return nil, &verbs.Error{Op: "ibv_create_comp_channel", Obj: d.name, Err: syscall.ENOMEM}
	}
	c.cq = C.ibv_create_cq(d.ctx, C.int(entries), nil, c.ch, 0)
	if c.cq == nil {
		C.ibv_destroy_comp_channel(c.ch)
		return nil, &verbs.Error{Op: "ibv_create_cq", Obj: fmt.Sprintf("%s %d entries", d.name, entries), Err: syscall.ENOMEM}
	}
	if err := syscall.Pipe2(c.wake[:], syscall.O_CLOEXEC); err != nil {
		C.ibv_destroy_cq(c.cq)
		C.ibv_destroy_comp_channel(c.ch)
		return nil, err
	}
	c.wcs = (*C.struct_ibv_wc)(C.calloc(C.size_t(c.n), C.size_t(unsafe.Sizeof(C.struct_ibv_wc{}))))
	C.ipoibfs_arm_cq(c.cq)
	go c.loop()
	return c, nil
}

func (c *CQ) loop() {
	defer close(c.done)
	for {
		w := C.ipoibfs_wait(c.ch.fd, C.int(c.wake[0]), -1)
		if w != 1 {
			return
		}
		if C.ipoibfs_cq_event(c.ch) < 0 {
			continue
		}
		if c.handler != nil && c.handler() {
			continue // polled where the event came in: no goroutine to wake (the CQ is armed again)
		}
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

func (c *CQ) Notify() <-chan struct{} { return c.notify }

var wcStatus = map[C.enum_ibv_wc_status]verbs.WCStatus{
	C.IBV_WC_SUCCESS: verbs.WCSuccess, C.IBV_WC_LOC_LEN_ERR: verbs.WCLocLenErr, C.IBV_WC_LOC_QP_OP_ERR: verbs.WCLocQPOpErr,
	C.IBV_WC_LOC_PROT_ERR: verbs.WCLocProtErr, C.IBV_WC_WR_FLUSH_ERR: verbs.WCWRFlushErr, C.IBV_WC_LOC_ACCESS_ERR: verbs.WCLocProtErr,
	C.IBV_WC_REM_INV_REQ_ERR: verbs.WCRemInvReqErr, C.IBV_WC_REM_ACCESS_ERR: verbs.WCRemAccessErr,
	C.IBV_WC_RETRY_EXC_ERR: verbs.WCRetryExcErr, C.IBV_WC_RNR_RETRY_EXC_ERR: verbs.WCRNRRetryExcErr,
}

// Poll moves up to len(wc) completions out. Receive data is copied from the queue
// pair's registered slot into the buffer PostRecv was given.
func (c *CQ) Poll(wc []verbs.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wcs == nil {
		return 0
	}
	done := 0
	for done < len(wc) {
		k := min(c.n, len(wc)-done)
		n := int(C.ipoibfs_poll_cq(c.cq, C.int(k), c.wcs))
		if n < 0 {
			c.overruns.Add(1)
			return done
		}
		for i := range n {
			w := C.ipoibfs_wc_at(c.wcs, C.int(i))
			out := &wc[done]
			st, ok := wcStatus[w.status]
			if !ok {
				st = verbs.WCGeneralErr
			}
			*out = verbs.WC{Status: st, QPN: verbs.QPN(w.qp_num), SrcQP: verbs.QPN(w.src_qp), SLID: verbs.LID(w.slid),
				SL: uint8(w.sl), PKeyIndex: int(w.pkey_index), ByteLen: int(w.byte_len),
				GRH: w.wc_flags&C.IBV_WC_GRH != 0, WithImm: w.wc_flags&C.IBV_WC_WITH_IMM != 0}
			if out.WithImm {
				out.Imm = uint32(C.ipoibfs_wc_imm(w))
			}
			if qp := c.dev.qpByNum(uint32(w.qp_num)); qp != nil {
				if !qp.complete(uint64(w.wr_id), out) {
					continue // a request a reset dropped: its slot is posted anew
				}
			} else {
				out.WRID = uint64(w.wr_id)
			}
			done++
		}
		if n < k {
			break
		}
	}
	return done
}

func (c *CQ) SetModeration(count, usecs uint16) error {
	if r := C.ipoibfs_moderate_cq(c.cq, C.uint16_t(count), C.uint16_t(usecs)); r != 0 {
		return &verbs.Error{Op: "ibv_modify_cq", Obj: c.dev.name, Err: syscall.Errno(max(int(r), 1))}
	}
	return nil
}

func (c *CQ) Overruns() uint64 { return c.overruns.Load() }

func (c *CQ) Close() error {
	c.closeOnce.Do(func() {
		_, _ = syscall.Write(c.wake[1], []byte{1})
		<-c.done
		syscall.Close(c.wake[0])
		syscall.Close(c.wake[1])
		c.mu.Lock()
		C.ibv_destroy_cq(c.cq)
		C.ibv_destroy_comp_channel(c.ch)
		C.free(unsafe.Pointer(c.wcs))
		c.wcs = nil
		c.mu.Unlock()
	})
	return nil
}

// slotSize is one registered buffer slot of a UD QP: a 4096-byte IB MTU payload plus
// the 40-byte GRH a UD receive starts with, rounded up. An RC message can be as large
// as connected mode's 65520-byte MTU with its 4-byte header: rcSlotSize.
const (
	slotSize   = 4224
	rcSlotSize = 65536
)

// recvBit marks receive work request IDs: flushed completions do not say their
// opcode. Below it, bits 32-62 are the generation of the slots the request was posted
// in (recvSlots.gen, QP.sendGen) and bits 0-31 its slot.
const recvBit = 1 << 63

// slotID is the hardware work request ID of slot k posted in generation gen.
func slotID(gen uint32, k int) uint64 { return uint64(gen&0x7fffffff)<<32 | uint64(uint32(k)) }

// slotOf splits a hardware work request ID (recvBit cleared) into generation and slot.
func slotOf(id uint64) (gen uint32, k int) { return uint32(id>>32) & 0x7fffffff, int(uint32(id)) }

// recvSlots are registered receive slots and the caller's buffers posted in them: a
// QP's own receive queue or an SRQ's. The caller's lock guards them.
type recvSlots struct {
	mem  unsafe.Pointer // slot 0
	size int
	free []int
	id   []uint64
	buf  [][]byte
	// gen bumps when a reset takes every slot back (a QP moved to RESET drops its
	// posted requests without completing them): a completion polled later for a
	// request of an older generation is not the slot's current one.
	gen uint32
}

func newRecvSlots(mem unsafe.Pointer, n, size int) recvSlots {
	r := recvSlots{mem: mem, size: size, id: make([]uint64, n), buf: make([][]byte, n)}
	for i := range n {
		r.free = append(r.free, i)
	}
	return r
}

// post posts a free slot for each buffer through postC (work request ID: slotID with
// recvBit) and returns how many were posted.
func (r *recvSlots) post(wrs []verbs.RecvWR, obj string, postC func(id uint64, addr unsafe.Pointer, n int) C.int) (int, error) {
	for i, wr := range wrs {
		if len(r.free) == 0 {
			return i, &verbs.Error{Op: "post_recv", Obj: obj, Err: verbs.ErrQueueFull}
		}
		k := r.free[len(r.free)-1]
		if e := postC(slotID(r.gen, k)|recvBit, unsafe.Add(r.mem, k*r.size), min(len(wr.Buf), r.size)); e != 0 {
			return i, &verbs.Error{Op: "ibv_post_recv", Obj: obj, Err: syscall.Errno(e)}
		}
		r.free = r.free[:len(r.free)-1]
		r.id[k], r.buf[k] = wr.ID, wr.Buf
	}
	return len(wrs), nil
}

// complete turns a receive's work request ID back into the caller's, copies the data
// into the caller's buffer and frees the slot. It reports false for a completion of
// an older generation, whose slot a reset took back already: the caller drops it.
func (r *recvSlots) complete(id uint64, wc *verbs.WC) bool {
	gen, k := slotOf(id &^ recvBit)
	if k >= len(r.id) || gen != r.gen&0x7fffffff {
		return false
	}
	wc.Opcode, wc.WRID = verbs.WCRecv, r.id[k]
	if wc.Status == verbs.WCSuccess {
		copy(r.buf[k], unsafe.Slice((*byte)(unsafe.Add(r.mem, k*r.size)), min(wc.ByteLen, r.size)))
	}
	r.buf[k] = nil
	r.free = append(r.free, k)
	return true
}

// reset takes every slot back, as a QP moved to RESET drops what was posted.
func (r *recvSlots) reset() {
	r.gen++
	r.free = r.free[:0]
	for k := range r.id {
		r.free = append(r.free, k)
	}
	clear(r.id)
	clear(r.buf)
}

// QP is a UD queue pair with one registered memory region of send and receive slots.
type QP struct {
	dev    *Device
	qp     *C.struct_ibv_qp
	typ    verbs.QPType
	port   int
	num    verbs.QPN
	mem    unsafe.Pointer
	mr     *C.struct_ibv_mr
	slotSz int
	sigAll bool
	srq    *SRQ // receives come from here when set

	mu       sync.Mutex
	state    verbs.QPState
	qkey     uint32 // as last set by Modify: sent for a RemoteQKey with the high bit set
	sendFree []int
	sendQ    []int     // slots in posting order (unsignaled sends free with the next completion)
	sendID   []uint64  // by slot
	sendGen  uint32    // as recvSlots.gen, for the send slots
	recv     recvSlots // its own receive queue (none with an SRQ)
	closed   bool
}

func (d *Device) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	if attr.Type != verbs.QPTypeUD && attr.Type != verbs.QPTypeRC {
		return nil, &verbs.Error{Op: "create_qp", Obj: d.name, Err: fmt.Errorf("%w: QP type %v not supported", verbs.ErrInvalid, attr.Type)}
	}
	scq, ok1 := attr.SendCQ.(*CQ)
	rcq, ok2 := attr.RecvCQ.(*CQ)
	if !ok1 || !ok2 || attr.Port < 1 || attr.Port > len(d.ports) {
		return nil, &verbs.Error{Op: "create_qp", Obj: d.name, Err: verbs.ErrInvalid}
	}
	if attr.SourceQPN != 0 {
		// IBV_QP_CREATE_SOURCE_QPN is for the kernel's IPoIB underlay QPs on mlx5
		// alone (rxe and the other providers refuse it), and there is no HCA here to
		// try it on: one send QP per interface on real HCAs.
		return nil, &verbs.Error{Op: "create_qp", Obj: d.name, Err: fmt.Errorf("source QPN: %w", errors.ErrUnsupported)}
	}
	var srq *SRQ
	if attr.SRQ != nil {
		var ok bool
		if srq, ok = attr.SRQ.(*SRQ); !ok || srq == nil || srq.dev != d {
			return nil, &verbs.Error{Op: "create_qp", Obj: d.name, Err: fmt.Errorf("%w: the SRQ must belong to this device", verbs.ErrInvalid)}
		}
		if attr.Type != verbs.QPTypeRC {
			return nil, &verbs.Error{Op: "create_qp", Obj: d.name, Err: fmt.Errorf("%w: a shared receive queue on a %v QP is not supported", verbs.ErrInvalid, attr.Type)}
		}
	}
	ns, nr := max(attr.MaxSendWR, 1), max(attr.MaxRecvWR, 1)
	if srq != nil {
		nr = 0
	}
	var init C.struct_ibv_qp_init_attr
	init.send_cq, init.recv_cq = scq.cq, rcq.cq
	init.cap.max_send_wr, init.cap.max_recv_wr = C.uint32_t(ns), C.uint32_t(nr)
	init.cap.max_send_sge, init.cap.max_recv_sge = 1, 1
	init.qp_type = C.IBV_QPT_UD
	sz := slotSize
	if attr.Type == verbs.QPTypeRC {
		init.qp_type, sz = C.IBV_QPT_RC, rcSlotSize
	}
	if srq != nil {
		init.srq = srq.srq
	}
	if attr.SigAll {
		init.sq_sig_all = 1
	}
	q := &QP{dev: d, typ: attr.Type, port: attr.Port, slotSz: sz, sigAll: attr.SigAll, srq: srq,
		sendID: make([]uint64, ns)}
	size := C.size_t((ns + nr) * sz)
	q.mem = C.calloc(1, size)
	if q.mem == nil {
		return nil, &verbs.Error{Op: "create_qp", Obj: d.name, Err: syscall.ENOMEM}
	}
	q.mr = C.ibv_reg_mr(d.pd, q.mem, size, C.IBV_ACCESS_LOCAL_WRITE)
	if q.mr == nil {
		C.free(q.mem)
		return nil, &verbs.Error{Op: "ibv_reg_mr", Obj: d.name, Err: syscall.ENOMEM}
	}
	q.qp = C.ibv_create_qp(d.pd, &init)
	if q.qp == nil {
		C.ibv_dereg_mr(q.mr)
		C.free(q.mem)
		return nil, &verbs.Error{Op: "ibv_create_qp", Obj: d.name, Err: syscall.ENOMEM}
	}
	q.num = verbs.QPN(q.qp.qp_num)
	if srq != nil {
		srq.use(1)
	}
	for i := range ns {
		q.sendFree = append(q.sendFree, i)
	}
	q.recv = newRecvSlots(q.slot(ns), nr, sz)
	d.qpMu.Lock()
	d.qps[uint32(q.num)] = q
	d.qpMu.Unlock()
	return q, nil
}

func (q *QP) String() string {
	return fmt.Sprintf("%s port %d qp %#x", q.dev.name, q.port, uint32(q.num))
}
func (q *QP) Num() verbs.QPN            { return q.num }
func (q *QP) Type() verbs.QPType        { return q.typ }
func (q *QP) slot(i int) unsafe.Pointer { return unsafe.Add(q.mem, i*q.slotSz) }

// State is the device's view (ibv_query_qp), which differs from the last Modify when
// the device moved the QP to ERR itself (rxe after a receive that did not fit).
func (q *QP) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stateLocked()
}

func (q *QP) stateLocked() verbs.QPState {
	if !q.closed {
		s := C.ipoibfs_qp_state(q.qp)
		for v, c := range qpStates {
			if c == s {
				return v
			}
		}
	}
	return q.state
}

var qpStates = map[verbs.QPState]C.int{verbs.QPReset: C.IBV_QPS_RESET, verbs.QPInit: C.IBV_QPS_INIT,
	verbs.QPRTR: C.IBV_QPS_RTR, verbs.QPRTS: C.IBV_QPS_RTS, verbs.QPSQD: C.IBV_QPS_SQD, verbs.QPSQE: C.IBV_QPS_SQE, verbs.QPErr: C.IBV_QPS_ERR}

// Modify moves the UD queue pair through its states: INIT takes the P_Key index and
// Q_Key (and the port it was created on), RTS starts the send PSN at 0. Without
// QPMaskState the QP stays in its state and only the Q_Key (or P_Key index) changes,
// as the engine sets the broadcast group's Q_Key on a QP in RTS (RTS to RTS).
//
// The QP's lock is held over the device's transition, so that no post comes between
// a move to RESET and the slots it takes back (resetSlotsLocked).
func (q *QP) Modify(m verbs.QPModify) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return &verbs.Error{Op: "modify_qp", Obj: q.String(), Err: verbs.ErrClosed}
	}
	if q.typ == verbs.QPTypeRC {
		return q.modifyRCLocked(m)
	}
	keep := m.Mask&verbs.QPMaskState == 0
	if keep {
		m.State = q.stateLocked()
	}
	st, ok := qpStates[m.State]
	if !ok || keep && m.Mask&(verbs.QPMaskQKey|verbs.QPMaskPKeyIndex) == 0 {
		return &verbs.Error{Op: "modify_qp", Obj: q.String(), Err: verbs.ErrInvalid}
	}
	mask := C.int(C.IBV_QP_STATE)
	if keep {
		mask = 0
	}
	if m.Mask&verbs.QPMaskPKeyIndex != 0 {
		mask |= C.IBV_QP_PKEY_INDEX
	}
	if m.Mask&verbs.QPMaskQKey != 0 {
		mask |= C.IBV_QP_QKEY
	}
	switch {
	case keep:
	case m.State == verbs.QPInit:
		mask |= C.IBV_QP_PORT | C.IBV_QP_PKEY_INDEX | C.IBV_QP_QKEY
	case m.State == verbs.QPRTS && q.stateLocked() == verbs.QPRTR:
		// Only RTR to RTS takes the send PSN: SQE to RTS (after a failed send)
		// and RTS to RTS refuse it (EINVAL).
		mask |= C.IBV_QP_SQ_PSN
	}
	if r := C.ipoibfs_modify_qp(q.qp, st, C.int(m.PKeyIndex), C.int(q.port), C.uint32_t(m.QKey), mask); r != 0 {
		err := error(syscall.Errno(r))
		if !keep && r == C.EINVAL {
			// A transition the state machine does not allow (RESET to RTR ...): the
			// same error kind as verbs/soft's.
			err = fmt.Errorf("%w: %v -> %v (%w)", verbs.ErrInvalidState, q.stateLocked(), m.State, err)
		}
		return &verbs.Error{Op: "ibv_modify_qp", Obj: fmt.Sprintf("%s to %v", q, m.State), Err: err}
	}
	q.state = m.State
	if mask&C.IBV_QP_QKEY != 0 {
		q.qkey = m.QKey
	}
	if !keep && m.State == verbs.QPReset {
		q.resetSlotsLocked()
	}
	return nil
}

// modifyRCLocked moves an RC queue pair as the CM does: INIT takes the port and P_Key
// index, RTR the peer (QPN, address, path MTU, receive PSN), RTS the send PSN and the
// retry parameters; the attributes each transition needs come from m whatever its
// mask says, since the device refuses a transition without them. Called with q.mu
// held.
func (q *QP) modifyRCLocked(m verbs.QPModify) error {
	if m.Mask&verbs.QPMaskState == 0 {
		return &verbs.Error{Op: "modify_qp", Obj: q.String(), Err: fmt.Errorf("%w: an RC QP changes only with its state", verbs.ErrInvalid)}
	}
	st, ok := qpStates[m.State]
	if !ok {
		return &verbs.Error{Op: "modify_qp", Obj: q.String(), Err: verbs.ErrInvalid}
	}
	mask := C.int(C.IBV_QP_STATE)
	cur := q.stateLocked()
	switch {
	case m.State == verbs.QPInit && cur == verbs.QPReset:
		mask |= C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT | C.IBV_QP_ACCESS_FLAGS
	case m.State == verbs.QPRTR && cur == verbs.QPInit:
		mask |= C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_DEST_QPN | C.IBV_QP_RQ_PSN |
			C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER
	case m.State == verbs.QPRTS && cur == verbs.QPRTR:
		mask |= C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY | C.IBV_QP_SQ_PSN | C.IBV_QP_MAX_QP_RD_ATOMIC
	}
	a := m.AH
	grh, hop := 0, a.HopLimit
	if a.GRH {
		grh = 1
		if hop == 0 {
			hop = 64 // a routed (RoCEv2) packet with hop limit 0 would be dropped at once
		}
	}
	if r := C.ipoibfs_modify_rc(q.qp, st, mask, C.int(m.PKeyIndex), C.int(q.port), C.uint32_t(m.DestQPN), C.int(m.PathMTU),
		C.uint32_t(m.RQPSN&0xffffff), C.uint32_t(m.SQPSN&0xffffff), C.int(m.Timeout), C.int(m.RetryCnt), C.int(m.RNRRetry),
		C.int(a.DLID), C.int(a.SL), C.int(grh), unsafe.Pointer(&a.DGID[0]), C.int(a.SGIDIndex), C.uint32_t(a.FlowLabel),
		C.int(hop), C.int(a.TClass)); r != 0 {
		err := error(syscall.Errno(r))
		if r == C.EINVAL {
			err = fmt.Errorf("%w: %v -> %v (%w)", verbs.ErrInvalidState, cur, m.State, err)
		}
		return &verbs.Error{Op: "ibv_modify_qp", Obj: fmt.Sprintf("%s to %v", q, m.State), Err: err}
	}
	q.state = m.State
	if m.State == verbs.QPReset {
		q.resetSlotsLocked()
	}
	return nil
}

// PostSend copies each request's gather list into a send slot and posts it.
func (q *QP) PostSend(wrs []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, &verbs.Error{Op: "post_send", Obj: q.String(), Err: verbs.ErrClosed}
	}
	if q.state != verbs.QPRTS {
		// Refused here, with the same error kind as verbs/soft, not left to the device.
		return 0, &verbs.Error{Op: "post_send", Obj: q.String(), Err: verbs.ErrInvalidState}
	}
	for i, wr := range wrs {
		if len(q.sendFree) == 0 {
			return i, &verbs.Error{Op: "post_send", Obj: q.String(), Err: verbs.ErrQueueFull}
		}
		ah, _ := wr.AH.(*AH)
		var cah *C.struct_ibv_ah
		if q.typ == verbs.QPTypeUD {
			if ah == nil {
				return i, &verbs.Error{Op: "post_send", Obj: q.String(), Err: fmt.Errorf("%w: UD send without an address handle", verbs.ErrInvalid)}
			}
			cah = ah.ah
		}
		s := q.sendFree[len(q.sendFree)-1]
		buf := unsafe.Slice((*byte)(q.slot(s)), q.slotSz)
		n := 0
		for _, d := range wr.Data {
			if n+len(d) > q.slotSz {
				return i, &verbs.Error{Op: "post_send", Obj: q.String(), Err: fmt.Errorf("%w: %d bytes exceed a slot", verbs.ErrInvalid, n+len(d))}
			}
			n += copy(buf[n:], d)
		}
		sig, imm := 0, 0
		if wr.Signaled || q.sigAll {
			sig = 1
		}
		if wr.WithImm {
			imm = 1
		}
		// A Q_Key with the high bit set means the QP's own (verbs.SendWR): done here,
		// since not every device does it (the 6.1 kernel's rxe sends the value as given).
		rqkey := wr.RemoteQKey
		if rqkey&0x80000000 != 0 {
			rqkey = q.qkey
		}
		r := C.ipoibfs_post_send(q.qp, C.uint64_t(slotID(q.sendGen, s)), q.slot(s), C.uint32_t(n), q.mr.lkey, cah,
			C.uint32_t(wr.RemoteQPN), C.uint32_t(rqkey), C.int(sig), C.int(imm), C.uint32_t(wr.Imm))
		if r != 0 {
			return i, &verbs.Error{Op: "ibv_post_send", Obj: q.String(), Err: syscall.Errno(r)}
		}
		q.sendFree = q.sendFree[:len(q.sendFree)-1]
		q.sendID[s] = wr.ID
		q.sendQ = append(q.sendQ, s)
	}
	return len(wrs), nil
}

// PostRecv posts a registered slot for each buffer; the data is copied into the
// buffer when Poll returns its completion.
func (q *QP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: verbs.ErrClosed}
	}
	if q.srq != nil {
		return 0, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: fmt.Errorf("%w: the QP receives from a shared receive queue", verbs.ErrInvalid)}
	}
	if q.state == verbs.QPReset {
		return 0, &verbs.Error{Op: "post_recv", Obj: q.String(), Err: verbs.ErrInvalidState}
	}
	return q.recv.post(wrs, q.String(), func(id uint64, addr unsafe.Pointer, n int) C.int {
		return C.ipoibfs_post_recv(q.qp, nil, C.uint64_t(id), addr, C.uint32_t(n), q.mr.lkey)
	})
}

// complete turns a hardware work request ID back into the caller's, frees the slot
// and, for a receive, copies the data out. It reports false for a completion of a request a reset dropped, or of a QP
// closed since the poll found it (its slots are freed memory): the poll leaves it out.
func (q *QP) complete(id uint64, wc *verbs.WC) bool {
	if q.typ == verbs.QPTypeRC {
		// RoCE devices flag every receive that came with a GRH, but an RC receive
		// never puts it in the buffer, which is what WC.GRH says.
		wc.GRH = false
	}
	if id&recvBit != 0 && q.srq != nil {
		return q.srq.complete(id, wc)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	if id&recvBit != 0 {
		return q.recv.complete(id, wc)
	}
	gen, s := slotOf(id)
	if s >= len(q.sendID) || gen != q.sendGen&0x7fffffff {
		return false
	}
	wc.Opcode, wc.WRID = verbs.WCSend, q.sendID[s]
	// This completion also retires every unsignaled send posted before it.
	for len(q.sendQ) > 0 {
		f := q.sendQ[0]
		q.sendQ = q.sendQ[1:]
		q.sendFree = append(q.sendFree, f)
		if f == s {
			break
		}
	}
	return true
}

// resetSlotsLocked takes every send slot and the QP's own receive slots back after a
// move to RESET, which drops the posted requests without completing them (after ERR
// they come back flushed, but a consumer may reset directly). An SRQ's slots stay as
// they are: what a reset of one of its QPs drops on the device (mlx5 gives the
// entries of completions it cleans back to the SRQ) is not known here, so a QP on an
// SRQ must be moved to ERR and drained before a reset, as the engine's connected mode
// destroys its QPs instead. Called with q.mu held.
func (q *QP) resetSlotsLocked() {
	q.sendGen++
	q.sendQ = q.sendQ[:0]
	q.sendFree = q.sendFree[:0]
	for k := range q.sendID {
		q.sendFree = append(q.sendFree, k)
	}
	clear(q.sendID)
	if q.srq == nil {
		q.recv.reset()
	}
}

func (q *QP) AttachMcast(gid verbs.GID, lid verbs.LID) error {
	if r := C.ipoibfs_mcast(q.qp, unsafe.Pointer(&gid[0]), C.int(lid), 1); r != 0 {
		return &verbs.Error{Op: "ibv_attach_mcast", Obj: fmt.Sprintf("%s %v", q, gid), Err: syscall.Errno(r)}
	}
	return nil
}

func (q *QP) DetachMcast(gid verbs.GID, lid verbs.LID) error {
	if r := C.ipoibfs_mcast(q.qp, unsafe.Pointer(&gid[0]), C.int(lid), 0); r != 0 {
		return &verbs.Error{Op: "ibv_detach_mcast", Obj: fmt.Sprintf("%s %v", q, gid), Err: syscall.Errno(r)}
	}
	return nil
}

func (q *QP) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.mu.Unlock()
	q.dev.qpMu.Lock()
	delete(q.dev.qps, uint32(q.num))
	q.dev.qpMu.Unlock()
	C.ibv_destroy_qp(q.qp)
	C.ibv_dereg_mr(q.mr)
	C.free(q.mem)
	if q.srq != nil {
		q.srq.use(-1)
	}
	return nil
}

// SRQ is a shared receive queue with its own registered slots (RC-sized); a
// completion on any of its QPs copies the data out of the slot the device filled.
type SRQ struct {
	dev *Device
	srq *C.struct_ibv_srq
	mem unsafe.Pointer
	mr  *C.struct_ibv_mr

	mu     sync.Mutex
	slots  recvSlots
	users  int
	closed bool
}

// CreateSRQ creates a shared receive queue of attr.MaxWR RC-sized slots, if the
// device has shared receive queues (ibv_device_attr.max_srq).
func (d *Device) CreateSRQ(attr verbs.SRQAttr) (verbs.SRQ, error) {
	fail := func(err error) (verbs.SRQ, error) {
		return nil, &verbs.Error{Op: "create_srq", Obj: d.name, Err: err}
	}
	if attr.MaxWR <= 0 || attr.MaxWR > int(d.attr.max_srq_wr) {
		return fail(fmt.Errorf("%w: max_wr %d (the device allows 1 to %d)", verbs.ErrInvalid, attr.MaxWR, int(d.attr.max_srq_wr)))
	}
	if d.attr.max_srq == 0 {
		return fail(fmt.Errorf("%w: the device has no shared receive queues", verbs.ErrInvalid))
	}
	var init C.struct_ibv_srq_init_attr
	init.attr.max_wr, init.attr.max_sge = C.uint32_t(attr.MaxWR), 1
	s := &SRQ{dev: d}
	size := C.size_t(attr.MaxWR * rcSlotSize)
	if s.mem = C.calloc(1, size); s.mem == nil {
		return fail(syscall.ENOMEM)
	}
	if s.mr = C.ibv_reg_mr(d.pd, s.mem, size, C.IBV_ACCESS_LOCAL_WRITE); s.mr == nil {
		C.free(s.mem)
		return fail(syscall.ENOMEM)
	}
	srq, err := C.ibv_create_srq(d.pd, &init)
	if srq == nil {
		C.ibv_dereg_mr(s.mr)
		C.free(s.mem)
		if err == nil {
			err = syscall.ENOMEM
		}
		return nil, &verbs.Error{Op: "ibv_create_srq", Obj: d.name, Err: err}
	}
	s.srq = srq
	s.slots = newRecvSlots(s.mem, attr.MaxWR, rcSlotSize)
	return s, nil
}

func (s *SRQ) String() string { return s.dev.name + " srq" }

func (s *SRQ) use(n int) {
	s.mu.Lock()
	s.users += n
	s.mu.Unlock()
}

// PostRecv posts a registered slot for each buffer.
func (s *SRQ) PostRecv(wrs []verbs.RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, &verbs.Error{Op: "post_srq_recv", Obj: s.String(), Err: verbs.ErrClosed}
	}
	return s.slots.post(wrs, s.String(), func(id uint64, addr unsafe.Pointer, n int) C.int {
		return C.ipoibfs_post_recv(nil, s.srq, C.uint64_t(id), addr, C.uint32_t(n), s.mr.lkey)
	})
}

// complete turns the slot back into the caller's work request ID and copies the data.
func (s *SRQ) complete(id uint64, wc *verbs.WC) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && s.slots.complete(id, wc)
}

// Close destroys the SRQ once no QP uses it (the kernel says EBUSY otherwise).
func (s *SRQ) Close() error {
	s.mu.Lock()
	if s.users > 0 {
		n := s.users
		s.mu.Unlock()
		return &verbs.Error{Op: "destroy_srq", Obj: s.String(), Err: fmt.Errorf("%w: %d QPs use it", verbs.ErrBusy, n)}
	}
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if !already {
		C.ibv_destroy_srq(s.srq)
		C.ibv_dereg_mr(s.mr)
		C.free(s.mem)
	}
	return nil
}

// AH is an address handle.
type AH struct {
	ah   *C.struct_ibv_ah
	attr verbs.AHAttr
}

func (d *Device) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	grh := 0
	if attr.GRH {
		grh = 1
	}
	ah, err := C.ipoibfs_create_ah(d.pd, C.int(attr.Port), C.int(attr.DLID), C.int(attr.SL), C.int(attr.StaticRate), C.int(grh),
		unsafe.Pointer(&attr.DGID[0]), C.int(attr.SGIDIndex), C.uint32_t(attr.FlowLabel), C.int(attr.HopLimit), C.int(attr.TClass))
	if ah == nil {
		if err == nil {
			err = syscall.EINVAL
		}
		obj := fmt.Sprintf("%s LID %#x", d.name, attr.DLID)
		if attr.GRH {
			obj += fmt.Sprintf(" GID %v", attr.DGID)
		}
		return nil, &verbs.Error{Op: "ibv_create_ah", Obj: obj, Err: err}
	}
	return &AH{ah: ah, attr: attr}, nil
}

func (a *AH) Attr() verbs.AHAttr { return a.attr }
func (a *AH) Close() error {
	if a.ah != nil {
		C.ibv_destroy_ah(a.ah)
		a.ah = nil
	}
	return nil
}
