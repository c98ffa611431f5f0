package cm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/mad"
)

const svc = 0x1000000000000048 // IPoIB-CM service ID of UD QPN 0x48

// ipoibPD is IPoIB-CM private data: UD QPN and receive MTU.
func ipoibPD(qpn uint32) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, qpn)
	binary.BigEndian.PutUint32(b[4:], 65524)
	return b
}

func padded(b []byte, n int) []byte { return append(bytes.Clone(b), make([]byte, n-len(b))...) }

// rto is the CM response timeout of params: Timeout 1 is 8.192 µs, floored to
// MinResponseTimeout.
const rto = cm.MinResponseTimeout

func params(qp verbs.QP, dst *node) cm.ConnectParams {
	return cm.ConnectParams{ServiceID: svc, QP: qp, DLID: dst.lid, DGID: dst.gid, PKey: 0xffff,
		PathMTU: verbs.MTU2048, PrivateData: ipoibPD(0x48), RetryCount: 6, RNRRetry: 3, AckTimeout: 14,
		Timeout: 1, MaxCMRetries: 5}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// waitSent waits until at least n MADs of attr have been sent and returns them.
func waitSent(t *testing.T, f *fabric, attr uint16, n int) []sentMAD {
	t.Helper()
	f.waitFor(fmt.Sprintf("%d MADs of attribute %#x", n, attr), func() bool {
		c := 0
		for _, s := range f.log {
			if binary.BigEndian.Uint16(s.b[16:]) == attr {
				c++
			}
		}
		return c >= n
	})
	return f.sent(attr)
}

// sentN is how many MADs of attr have been sent.
func sentN(f *fabric, attr uint16) int { return len(f.sent(attr)) }

// wantNext checks that the next timer of the fabric's clock is due in d.
func wantNext(t *testing.T, f *fabric, d time.Duration, what string) {
	t.Helper()
	if got, ok := f.clk.Peek(); !ok || got != d {
		t.Fatalf("%s: next timer in %v (armed: %v), want %v", what, got, ok, d)
	}
}

// notYet checks that ch has nothing yet.
func notYet[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s already: %v", what, v)
	default:
	}
}

func waitDone(t *testing.T, c *cm.Conn, what string) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// acceptAll is a listener that accepts on fresh QPs of n and reports on channels.
type acceptAll struct {
	n      *node
	reqs   chan *cm.Request
	est    chan *cm.Conn
	failed chan error
	calls  atomic.Int32
	qps    sync.Map // remote QPN -> *fakeQP
	pd     []byte
	srq    bool // Accept.SRQ
}

func newAcceptAll(n *node) *acceptAll {
	return &acceptAll{n: n, reqs: make(chan *cm.Request, 64), est: make(chan *cm.Conn, 64),
		failed: make(chan error, 64), pd: ipoibPD(0x49)}
}

func (l *acceptAll) handle(r *cm.Request) cm.Decision {
	l.calls.Add(1)
	l.reqs <- r
	qp := l.n.dev.newQP(verbs.QPTypeRC)
	l.qps.Store(r.RemoteQPN, qp)
	return cm.Accept{QP: qp, PrivateData: l.pd, SRQ: l.srq,
		Established: func(c *cm.Conn) { l.est <- c },
		Failed:      func(err error) { l.failed <- err }}
}

func (l *acceptAll) qp(remote verbs.QPN) *fakeQP {
	v, _ := l.qps.Load(remote)
	return v.(*fakeQP)
}

func TestConnectEstablishDisconnect(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	qpA := a.dev.newQP(verbs.QPTypeRC) // RESET: the manager does RESET->INIT
	qpB := b.dev.newQP(verbs.QPTypeRC)
	if err := qpB.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: 1}); err != nil {
		t.Fatal(err)
	}
	reqs, est := make(chan *cm.Request, 1), make(chan *cm.Conn, 1)
	stop, err := b.m.Listen(svc, func(r *cm.Request) cm.Decision {
		reqs <- r
		return &cm.Accept{QP: qpB, PrivateData: ipoibPD(0x49),
			Established: func(c *cm.Conn) { est <- c },
			Failed:      func(err error) { t.Errorf("passive side failed: %v", err) }}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	conn, err := a.m.Connect(ctxT(t), params(qpA, b))
	if err != nil {
		t.Fatal(err)
	}
	r := recv(t, reqs, "the request")
	bc := recv(t, est, "the passive connection")

	wantReq := &cm.Request{ServiceID: svc, RemoteQPN: qpA.num, RemoteLID: 1, RemoteGID: a.gid,
		RemoteCAGUID: a.dev.guid, PKey: 0xffff, PKeyIndex: 0, PathMTU: verbs.MTU2048,
		StartingPSN: r.StartingPSN, RetryCount: 6, RNRRetry: 3,
		PrivateData: padded(ipoibPD(0x48), mad.CMREQPrivateDataSize)}
	if d := cmp.Diff(wantReq, r); d != "" {
		t.Errorf("request (-want +got):\n%s", d)
	}
	if r.StartingPSN > 0xffffff {
		t.Errorf("starting PSN %#x wider than 24 bits", r.StartingPSN)
	}

	// The active QP: RESET->INIT, INIT->RTR with the REP's QPN and PSN, RTR->RTS with
	// our REQ's PSN.
	rtsB := qpB.modsTo(verbs.QPRTS)
	if len(rtsB) != 1 {
		t.Fatalf("passive QP moved to RTS %d times", len(rtsB))
	}
	pskB := rtsB[0].SQPSN
	wantA := []verbs.QPModify{
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: 0},
		{Mask: verbs.QPMaskState | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskDestQPN | verbs.QPMaskRQPSN,
			State: verbs.QPRTR, AH: verbs.AHAttr{Port: 1, DLID: 2, DGID: b.gid}, PathMTU: verbs.MTU2048,
			DestQPN: qpB.num, RQPSN: pskB},
		{Mask: verbs.QPMaskState | verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry,
			State: verbs.QPRTS, SQPSN: r.StartingPSN, Timeout: 14, RetryCnt: 6, RNRRetry: 3},
	}
	if d := cmp.Diff(wantA, qpA.mods); d != "" {
		t.Errorf("active QP transitions (-want +got):\n%s", d)
	}
	wantB := []verbs.QPModify{
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: 1}, // the test's own
		{Mask: verbs.QPMaskState | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskDestQPN | verbs.QPMaskRQPSN,
			State: verbs.QPRTR, AH: verbs.AHAttr{Port: 1, DLID: 1, DGID: a.gid, StaticRate: 3}, PathMTU: verbs.MTU2048,
			DestQPN: qpA.num, RQPSN: r.StartingPSN},
		{Mask: verbs.QPMaskState | verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry,
			State: verbs.QPRTS, SQPSN: pskB, Timeout: 14, RetryCnt: 6, RNRRetry: 3},
	}
	if d := cmp.Diff(wantB, qpB.mods); d != "" {
		t.Errorf("passive QP transitions (-want +got):\n%s", d)
	}

	if conn.RemoteQPN != qpB.num || conn.QP != verbs.QP(qpA) || !conn.Active || conn.ServiceID != svc ||
		conn.RemoteLID != 2 || conn.RemoteGID != b.gid || conn.RemoteCAGUID != b.dev.guid {
		t.Errorf("active conn %+v", conn)
	}
	if !bytes.Equal(conn.RemotePrivateData, padded(ipoibPD(0x49), mad.CMREPPrivateDataSize)) {
		t.Errorf("REP private data %x", conn.RemotePrivateData)
	}
	if bc.RemoteQPN != qpA.num || bc.QP != verbs.QP(qpB) || bc.Active || bc.RemoteLID != 1 ||
		bc.LocalCommID != conn.RemoteCommID || bc.RemoteCommID != conn.LocalCommID || bc.LocalCommID == 0 || conn.LocalCommID == 0 {
		t.Errorf("passive conn %+v, active comm IDs %#x/%#x", bc, conn.LocalCommID, conn.RemoteCommID)
	}
	if !bytes.Equal(bc.RemotePrivateData, r.PrivateData) {
		t.Errorf("passive conn private data %x", bc.RemotePrivateData)
	}
	if conn.Err() != nil || bc.Err() != nil {
		t.Errorf("Err before disconnect: %v, %v", conn.Err(), bc.Err())
	}

	// The REQ on the wire carries the IPoIB parameters we asked for.
	var req mad.CMREQ
	_ = req.Unmarshal(f.sent(mad.AttrCMREQ)[0].b[mad.CMDataOffset:])
	if req.MaxCMRetries != 5 || req.RemoteCMResponseTimeout != 1 || req.LocalCMResponseTimeout != 1 ||
		req.TransportServiceType != mad.CMTransportRC || req.Primary.LocalACKTimeout != 14 ||
		req.Primary.LocalLID != 1 || req.Primary.RemoteLID != 2 || !req.Primary.SubnetLocal {
		t.Errorf("REQ %+v", req)
	}

	if err := conn.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	waitDone(t, conn, "active Done")
	waitDone(t, bc, "passive Done")
	if !errors.Is(conn.Err(), cm.ErrLocalDisconnect) || !errors.Is(bc.Err(), cm.ErrDisconnected) {
		t.Errorf("Err after disconnect: %v, %v", conn.Err(), bc.Err())
	}
	if qpA.State() != verbs.QPErr || qpB.State() != verbs.QPErr {
		t.Errorf("QP states after disconnect: %v, %v", qpA.State(), qpB.State())
	}
	if err := conn.Disconnect(); err != nil {
		t.Errorf("second Disconnect: %v", err)
	}
	if err := bc.Disconnect(); err != nil {
		t.Errorf("Disconnect of a peer-disconnected conn: %v", err)
	}
	if n := len(f.sent(mad.AttrCMDREP)); n != 1 {
		t.Errorf("%d DREPs sent", n)
	}
}

func TestPassiveDisconnect(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	conn, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
	if err != nil {
		t.Fatal(err)
	}
	bc := recv(t, l.est, "established")
	if err := bc.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, conn, "active Done")
	if !errors.Is(conn.Err(), cm.ErrDisconnected) {
		t.Errorf("active Err %v", conn.Err())
	}
	// The DREQ names the active QP.
	var dreq mad.CMDREQ
	_ = dreq.Unmarshal(f.sent(mad.AttrCMDREQ)[0].b[mad.CMDataOffset:])
	if dreq.RemoteQPN != conn.QP.Num() || dreq.LocalCommID != bc.LocalCommID || dreq.RemoteCommID != conn.LocalCommID {
		t.Errorf("DREQ %+v", dreq)
	}
}

func rejectErr(t *testing.T, err error) *cm.RejectError {
	t.Helper()
	var re *cm.RejectError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a *RejectError", err)
	}
	return re
}

func TestRejectByListener(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	// Every MAD is delivered twice: the duplicate REQ must not reach the listener again.
	f.setFilter(func(_, _ verbs.LID, _ uint16, _ int) int { return 2 })
	var calls atomic.Int32
	if _, err := b.m.Listen(svc, func(*cm.Request) cm.Decision {
		calls.Add(1)
		return cm.Reject{Reason: mad.RejConsumerDefined, PrivateData: []byte("go away")}
	}); err != nil {
		t.Fatal(err)
	}
	_, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
	re := rejectErr(t, err)
	if re.Reason != mad.RejConsumerDefined || !bytes.Equal(re.PrivateData, padded([]byte("go away"), mad.CMREJPrivateDataSize)) {
		t.Errorf("reject %v %q", re.Reason, re.PrivateData)
	}
	f.settle() // the duplicate REQ has been handled too
	if n := calls.Load(); n != 1 {
		t.Errorf("listener called %d times", n)
	}
	rejs := f.sent(mad.AttrCMREJ)
	for _, r := range rejs[1:] {
		if !bytes.Equal(r.b, rejs[0].b) {
			t.Errorf("REJs differ:\n%x\n%x", r.b, rejs[0].b)
		}
	}
}

func TestUnknownServiceID(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	_, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
	if re := rejectErr(t, err); re.Reason != mad.RejInvalidServiceID {
		t.Errorf("reason %v", re.Reason)
	}
	var rej mad.CMREJ
	rejs := f.sent(mad.AttrCMREJ)
	_ = rej.Unmarshal(rejs[0].b[mad.CMDataOffset:])
	var req mad.CMREQ
	reqMAD := f.sent(mad.AttrCMREQ)[0].b
	_ = req.Unmarshal(reqMAD[mad.CMDataOffset:])
	if rej.MessageRejected != mad.CMMsgREQ || rej.RemoteCommID != req.LocalCommID ||
		!bytes.Equal(rejs[0].b[8:16], reqMAD[8:16]) {
		t.Errorf("REJ %+v for REQ comm ID %#x (TID %x / %x)", rej, req.LocalCommID, rejs[0].b[8:16], reqMAD[8:16])
	}
}

// TestConnectTimeout: an unanswered REQ is resent at exactly every CM response
// timeout, MaxCMRetries times; one timeout after the last, Connect fails with
// ErrTimeout and a REJ (timeout, ARI = CA GUID) tells the passive side. The connection
// then stays in timewait for (MaxCMRetries + 1) timeouts and is forgotten.
func TestConnectTimeout(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, false) // b has no CM
	p := params(a.dev.newQP(verbs.QPTypeRC), b)
	p.MaxCMRetries = 3
	ctx := ctxT(t)
	errc := make(chan error, 1)
	go func() {
		_, err := a.m.Connect(ctx, p)
		errc <- err
	}()
	waitSent(t, f, mad.AttrCMREQ, 1) // the timer is armed before the first REQ goes out
	for n := 1; n <= 4; n++ {
		wantNext(t, f, rto, fmt.Sprintf("after REQ %d", n))
		f.clk.Advance(rto - 1)
		if got := sentN(f, mad.AttrCMREQ); got != n {
			t.Fatalf("%d REQs sent just before timeout %d, want %d", got, n, n)
		}
		notYet(t, errc, "Connect returned")
		f.clk.Advance(1)
		if n < 4 {
			if got := sentN(f, mad.AttrCMREQ); got != n+1 {
				t.Fatalf("%d REQs sent at timeout %d, want %d", got, n, n+1)
			}
			notYet(t, errc, "Connect returned")
		}
	}
	if err := recv(t, errc, "Connect"); !errors.Is(err, verbs.ErrTimeout) {
		t.Fatalf("Connect: %v, want ErrTimeout", err)
	}
	reqs := f.sent(mad.AttrCMREQ)
	if len(reqs) != 4 {
		t.Errorf("%d REQs sent, want 1 + 3 retries", len(reqs))
	}
	for _, r := range reqs[1:] {
		if !bytes.Equal(r.b, reqs[0].b) {
			t.Error("retransmitted REQ differs")
		}
	}
	// The active side tells the passive side it gave up: REJ timeout, ARI = CA GUID.
	rejs := f.sent(mad.AttrCMREJ)
	if len(rejs) != 1 {
		t.Fatalf("%d REJs", len(rejs))
	}
	var rej mad.CMREJ
	_ = rej.Unmarshal(rejs[0].b[mad.CMDataOffset:])
	if rej.Reason != mad.RejTimeout || rej.RejectInfoLength != 8 ||
		binary.BigEndian.Uint64(rej.ARI[:]) != uint64(a.dev.guid) {
		t.Errorf("REJ %+v", rej)
	}
	wantNext(t, f, 4*rto, "timewait")
	f.clk.Advance(4 * rto)
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed after timewait", n)
	}
	if n := sentN(f, mad.AttrCMREQ) + sentN(f, mad.AttrCMREJ); n != 5 {
		t.Errorf("%d REQs and REJs in all, want 4 + 1", n)
	}
}

// TestConnectCancel: a Connect whose context ends sends a REJ (timeout) at once and
// returns the context's error; the REQ is not resent.
func TestConnectCancel(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := params(a.dev.newQP(verbs.QPTypeRC), b)
	p.Timeout = 20 // 4.096 µs × 2^20 ≈ 4.3 s
	errc := make(chan error, 1)
	go func() {
		_, err := a.m.Connect(ctx, p)
		errc <- err
	}()
	waitSent(t, f, mad.AttrCMREQ, 1)
	tmo := max(mad.CMTimeout(20), cm.MinResponseTimeout)
	wantNext(t, f, tmo, "the REQ's retransmission")
	cancel()
	if err := recv(t, errc, "Connect"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect: %v", err)
	}
	if n := sentN(f, mad.AttrCMREJ); n != 1 {
		t.Errorf("%d REJs after cancel", n)
	}
	wantNext(t, f, 6*tmo, "timewait") // MaxCMRetries 5
	if n := sentN(f, mad.AttrCMREQ); n != 1 {
		t.Errorf("%d REQs", n)
	}
}

// TestDropsAndDuplicates loses the first two REQs, the first REP and the first RTU and
// duplicates every other MAD: the connection must still come up, with one listener
// call and one transition per QP state.
func TestDropsAndDuplicates(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	f.setFilter(func(_, _ verbs.LID, attr uint16, n int) int {
		switch {
		case attr == mad.AttrCMREQ && n <= 2, attr == mad.AttrCMREP && n == 1, attr == mad.AttrCMRTU && n == 1:
			return 0
		}
		return 2
	})
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	qpA := a.dev.newQP(verbs.QPTypeRC)
	ctx := ctxT(t)
	type result struct {
		c   *cm.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := a.m.Connect(ctx, params(qpA, b))
		done <- result{c, err}
	}()
	// The first two REQs are lost; the third arrives (twice).
	waitSent(t, f, mad.AttrCMREQ, 1)
	for n := 2; n <= 3; n++ {
		f.clk.Advance(rto)
		if got := sentN(f, mad.AttrCMREQ); got != n {
			t.Fatalf("%d REQs, want %d", got, n)
		}
	}
	// The listener decides on a goroutine of its own: wait for its REP (lost) before
	// moving the time on, as a listener this fast would on the real clock.
	recv(t, l.reqs, "the request")
	waitSent(t, f, mad.AttrCMREP, 1)
	// From here on the managers act only in their MAD handlers and timers. Fire the
	// timers one at a time until none is armed: a side waiting for a REP or an RTU
	// always has one, so then the handshake is over.
	for {
		f.settle()
		if _, ok := f.clk.Peek(); !ok {
			break
		}
		f.clk.AdvanceNext()
	}
	res := recv(t, done, "Connect")
	if res.err != nil {
		t.Fatal(res.err)
	}
	conn := res.c
	bc := recv(t, l.est, "established")
	// Not vacuous: the drops and duplicates happened (REQ sent again after two losses,
	// REP and RTU resent, each delivered twice).
	for _, c := range []struct {
		attr uint16
		min  int
	}{{mad.AttrCMREQ, 3}, {mad.AttrCMREP, 2}, {mad.AttrCMRTU, 2}} {
		if n := len(f.sent(c.attr)); n < c.min {
			t.Fatalf("attribute %#x sent %d times, want at least %d: the test did not lose and duplicate", c.attr, n, c.min)
		}
	}
	if n := l.calls.Load(); n != 1 {
		t.Errorf("listener called %d times", n)
	}
	select {
	case c := <-l.est:
		t.Errorf("second Established: %+v", c)
	case err := <-l.failed:
		t.Errorf("Failed: %v", err)
	default:
	}
	qpB := l.qp(qpA.num)
	for _, q := range []*fakeQP{qpA, qpB} {
		for _, s := range []verbs.QPState{verbs.QPInit, verbs.QPRTR, verbs.QPRTS} {
			if n := len(q.modsTo(s)); n != 1 {
				t.Errorf("QP %#x moved to %v %d times", q.num, s, n)
			}
		}
		if q.State() != verbs.QPRTS {
			t.Errorf("QP %#x in %v", q.num, q.State())
		}
	}
	reps := f.sent(mad.AttrCMREP)
	if len(reps) < 2 {
		t.Errorf("REP sent %d times", len(reps))
	}
	for _, r := range reps[1:] {
		if !bytes.Equal(r.b, reps[0].b) {
			t.Errorf("resent REP differs:\n%x\n%x", r.b, reps[0].b)
		}
	}
	if n := len(f.sent(mad.AttrCMRTU)); n < 2 {
		t.Errorf("RTU sent %d times", n)
	}
	if conn.RemoteCommID != bc.LocalCommID {
		t.Errorf("comm IDs %#x vs %#x", conn.RemoteCommID, bc.LocalCommID)
	}
	// Disconnect with the first DREP lost: the DREQ is resent and answered from
	// timewait.
	f.setFilter(func(_, _ verbs.LID, attr uint16, n int) int {
		if attr == mad.AttrCMDREP && n == 1 {
			return 0
		}
		return 1
	})
	disc := make(chan error, 1)
	go func() { disc <- conn.Disconnect() }()
	waitDone(t, bc, "passive Done")
	f.settle() // the first DREP is sent (and lost)
	wantNext(t, f, rto, "the DREQ's retransmission")
	f.clk.Advance(rto)
	if err := recv(t, disc, "Disconnect"); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	if nq, np := sentN(f, mad.AttrCMDREQ), sentN(f, mad.AttrCMDREP); nq != 2 || np != 2 {
		t.Errorf("%d DREQs, %d DREPs; want 2 each", nq, np)
	}
}

// TestRTUNeverArrives: the passive side resends the REP at exactly every CM response
// timeout of the REQ, up to its Max CM Retries, then gives up with a REJ (timeout) that
// tears the active connection down.
func TestRTUNeverArrives(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	f.setFilter(func(_, _ verbs.LID, attr uint16, _ int) int {
		if attr == mad.AttrCMRTU {
			return 0
		}
		return 1
	})
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	p := params(a.dev.newQP(verbs.QPTypeRC), b)
	p.MaxCMRetries = 2
	conn, err := a.m.Connect(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	// The active side answers each REP with a (lost) RTU.
	for n := 1; n <= 3; n++ {
		f.settle()
		if reps, rtus := sentN(f, mad.AttrCMREP), sentN(f, mad.AttrCMRTU); reps != n || rtus != n {
			t.Fatalf("%d REPs, %d RTUs; want %d each", reps, rtus, n)
		}
		wantNext(t, f, rto, fmt.Sprintf("after REP %d", n))
		f.clk.Advance(rto - 1)
		notYet(t, l.failed, "Failed")
		f.clk.Advance(1)
	}
	ferr := recv(t, l.failed, "Failed")
	if !errors.Is(ferr, verbs.ErrTimeout) {
		t.Errorf("Failed(%v), want ErrTimeout", ferr)
	}
	waitDone(t, conn, "active Done")
	if re := rejectErr(t, conn.Err()); re.Reason != mad.RejTimeout {
		t.Errorf("reason %v", re.Reason)
	}
	if conn.QP.State() != verbs.QPErr || l.qp(conn.QP.Num()).State() != verbs.QPErr {
		t.Errorf("QPs %v / %v", conn.QP.State(), l.qp(conn.QP.Num()).State())
	}
	f.settle()
	if reps, rtus := sentN(f, mad.AttrCMREP), sentN(f, mad.AttrCMRTU); reps != 3 || rtus != 3 {
		t.Errorf("%d REPs, %d RTUs; want 3 each", reps, rtus)
	}
	// Both sides keep the connection in timewait for 3 timeouts, then forget it.
	wantNext(t, f, 3*rto, "timewait")
	f.clk.Advance(3 * rto)
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed after timewait", n)
	}
}

// TestDisconnectTimeout: an unanswered DREQ is resent at exactly every CM response
// timeout, MaxCMRetries times; one timeout after the last, Disconnect returns
// ErrTimeout.
func TestDisconnectTimeout(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	p := params(a.dev.newQP(verbs.QPTypeRC), b)
	p.MaxCMRetries = 2
	conn, err := a.m.Connect(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, l.est, "established")
	f.settle()
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed for an established connection", n)
	}
	f.setFilter(func(_, _ verbs.LID, attr uint16, _ int) int {
		if attr == mad.AttrCMDREQ {
			return 0
		}
		return 1
	})
	disc := make(chan error, 1)
	go func() { disc <- conn.Disconnect() }()
	waitSent(t, f, mad.AttrCMDREQ, 1)
	waitDone(t, conn, "Done") // at once, not when the DREP comes
	for n := 1; n <= 3; n++ {
		wantNext(t, f, rto, fmt.Sprintf("after DREQ %d", n))
		f.clk.Advance(rto - 1)
		if got := sentN(f, mad.AttrCMDREQ); got != n {
			t.Fatalf("%d DREQs just before timeout %d, want %d", got, n, n)
		}
		notYet(t, disc, "Disconnect returned")
		f.clk.Advance(1)
	}
	if err := recv(t, disc, "Disconnect"); !errors.Is(err, verbs.ErrTimeout) {
		t.Errorf("Disconnect: %v, want ErrTimeout", err)
	}
	if n := sentN(f, mad.AttrCMDREQ); n != 3 {
		t.Errorf("%d DREQs, want 1 + 2 retries", n)
	}
}

func TestConcurrentConnectsUniqueCommIDs(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	const n = 16
	conns := make([]*cm.Conn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
			if err != nil {
				t.Error(err)
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	local, remote := map[uint32]bool{}, map[uint32]bool{}
	for _, c := range conns {
		if local[c.LocalCommID] || remote[c.RemoteCommID] {
			t.Errorf("duplicate comm ID in %#x/%#x", c.LocalCommID, c.RemoteCommID)
		}
		local[c.LocalCommID], remote[c.RemoteCommID] = true, true
	}
	for range n {
		recv(t, l.est, "established")
	}
}

func TestListen(t *testing.T) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	h := func(*cm.Request) cm.Decision { return nil }
	stop, err := b.m.Listen(svc, h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.m.Listen(svc, h); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("second Listen: %v", err)
	}
	stop()
	stop2, err := b.m.Listen(svc, h)
	if err != nil {
		t.Fatalf("Listen after stop: %v", err)
	}
	stop() // must not remove the new listener
	if _, err := b.m.Listen(svc, h); err == nil {
		t.Error("old stop removed the new listener")
	}
	stop2()
	if _, err := b.m.Listen(svc+1, nil); err == nil {
		t.Error("nil handler accepted")
	}
}

// A listener returning nil rejects with consumer defined.
func TestNilDecision(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	if _, err := b.m.Listen(svc, func(*cm.Request) cm.Decision { return nil }); err != nil {
		t.Fatal(err)
	}
	_, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
	if re := rejectErr(t, err); re.Reason != mad.RejConsumerDefined {
		t.Errorf("reason %v", re.Reason)
	}
}

// An Accept whose QP cannot be used is rejected with "no QP" and reported to Failed.
func TestAcceptBadQP(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	failed := make(chan error, 1)
	bad := b.dev.newQP(verbs.QPTypeRC)
	bad.fail = verbs.QPRTR
	if _, err := b.m.Listen(svc, func(*cm.Request) cm.Decision {
		return cm.Accept{QP: bad, Failed: func(err error) { failed <- err }}
	}); err != nil {
		t.Fatal(err)
	}
	_, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
	if re := rejectErr(t, err); re.Reason != mad.RejNoQP {
		t.Errorf("reason %v", re.Reason)
	}
	if err := recv(t, failed, "Failed"); err == nil {
		t.Error("Failed(nil)")
	}
}

// The active QP refusing RTR: the REP is rejected (no QP) and Connect fails.
func TestActiveQPFails(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	qp := a.dev.newQP(verbs.QPTypeRC)
	qp.fail = verbs.QPRTS
	if _, err := a.m.Connect(ctxT(t), params(qp, b)); err == nil {
		t.Fatal("Connect succeeded")
	}
	ferr := recv(t, l.failed, "passive Failed")
	if re := rejectErr(t, ferr); re.Reason != mad.RejNoQP {
		t.Errorf("passive side got %v", re.Reason)
	}
	if qp.State() != verbs.QPErr {
		t.Errorf("active QP %v", qp.State())
	}
}

func TestConnectValidation(t *testing.T) {
	f := newFabric(t)
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	ctx := ctxT(t)
	ud := params(a.dev.newQP(verbs.QPTypeUD), b)
	if _, err := a.m.Connect(ctx, ud); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("UD QP: %v", err)
	}
	rts := a.dev.newQP(verbs.QPTypeRC)
	rts.state = verbs.QPRTS
	if _, err := a.m.Connect(ctx, params(rts, b)); !errors.Is(err, verbs.ErrInvalidState) {
		t.Errorf("QP in RTS: %v", err)
	}
	long := params(a.dev.newQP(verbs.QPTypeRC), b)
	long.PrivateData = make([]byte, 93)
	if _, err := a.m.Connect(ctx, long); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("93 bytes of private data: %v", err)
	}
	pk := params(a.dev.newQP(verbs.QPTypeRC), b)
	pk.PKey = 0x7777
	if _, err := a.m.Connect(ctx, pk); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("unknown P_Key: %v", err)
	}
	if n := len(f.sent(mad.AttrCMREQ)); n != 0 {
		t.Errorf("%d REQs sent for invalid parameters", n)
	}
	// P_Key 0x8001 is found at index 1 and sent in the REQ.
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	qp := a.dev.newQP(verbs.QPTypeRC)
	p := params(qp, b)
	p.PKey = 0x8001
	if _, err := a.m.Connect(ctx, p); err != nil {
		t.Fatal(err)
	}
	if m := qp.modsTo(verbs.QPInit); len(m) != 1 || m[0].PKeyIndex != 1 {
		t.Errorf("INIT %+v", m)
	}
	if r := recv(t, l.reqs, "request"); r.PKey != 0x8001 || r.PKeyIndex != 1 {
		t.Errorf("request P_Key %v index %d", r.PKey, r.PKeyIndex)
	}
}

func TestClose(t *testing.T) {
	f := newFabric(t)
	a, b, c := newNode(t, f, 1, true), newNode(t, f, 2, true), newNode(t, f, 3, false)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	conn, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b))
	if err != nil {
		t.Fatal(err)
	}
	bc := recv(t, l.est, "established")
	pending := make(chan error, 1)
	go func() {
		p := params(a.dev.newQP(verbs.QPTypeRC), c)
		p.Timeout = 20
		_, err := a.m.Connect(context.Background(), p)
		pending <- err
	}()
	waitSent(t, f, mad.AttrCMREQ, 2) // the pending Connect's REQ is out
	a.m.Close()
	if err := recv(t, pending, "pending Connect"); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("pending Connect: %v", err)
	}
	waitDone(t, conn, "Done")
	if !errors.Is(conn.Err(), verbs.ErrClosed) {
		t.Errorf("Err %v", conn.Err())
	}
	waitDone(t, bc, "peer Done") // the one DREQ sent by Close
	if !errors.Is(bc.Err(), cm.ErrDisconnected) {
		t.Errorf("peer Err %v", bc.Err())
	}
	if _, err := a.m.Listen(svc, l.handle); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Listen after Close: %v", err)
	}
	if _, err := a.m.Connect(ctxT(t), params(a.dev.newQP(verbs.QPTypeRC), b)); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Connect after Close: %v", err)
	}
	a.m.Close()
}

// On ports without LIDs (RoCE) the peer is reached by GID: every CM MAD goes by
// GID (verbs.GIDMADSender), the request names LID 0 and both QPs' address handles
// carry a GRH with the peer's GID and a usable hop limit; a disconnect reaches the
// other side the same way.
func TestConnectByGIDWithoutLIDs(t *testing.T) {
	f := newFabric(t)
	f.roce = true
	a, b := newNode(t, f, 1, true), newNode(t, f, 2, true)
	if a.dev.port.Attr().LID != 0 {
		t.Fatalf("RoCE fake port has LID %d", a.dev.port.Attr().LID)
	}
	qpA, qpB := a.dev.newQP(verbs.QPTypeRC), b.dev.newQP(verbs.QPTypeRC)
	reqs, est := make(chan *cm.Request, 1), make(chan *cm.Conn, 1)
	stop, err := b.m.Listen(svc, func(r *cm.Request) cm.Decision {
		reqs <- r
		return &cm.Accept{QP: qpB, PrivateData: ipoibPD(0x49), Established: func(c *cm.Conn) { est <- c }}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	p := params(qpA, b)
	p.DLID = 0
	conn, err := a.m.Connect(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	r := recv(t, reqs, "the request")
	bc := recv(t, est, "the passive connection")
	if r.RemoteLID != 0 || r.RemoteGID != a.gid {
		t.Errorf("request from LID %d GID %v, want LID 0 and %v", r.RemoteLID, r.RemoteGID, a.gid)
	}
	for _, c := range []struct {
		side string
		qp   *fakeQP
		peer verbs.GID
	}{{"active", qpA, b.gid}, {"passive", qpB, a.gid}} {
		rtr := c.qp.modsTo(verbs.QPRTR)
		if len(rtr) != 1 || rtr[0].AH.DLID != 0 || !rtr[0].AH.GRH || rtr[0].AH.DGID != c.peer || rtr[0].AH.HopLimit == 0 {
			t.Errorf("%s RTR %+v: want a GRH to %v with a hop limit, no LID", c.side, rtr, c.peer)
		}
	}
	if err := conn.Disconnect(); err != nil {
		t.Fatalf("disconnect by GID: %v", err)
	}
	recv(t, bc.Done(), "the passive side's end")
}
