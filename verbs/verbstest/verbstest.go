// Package verbstest is the provider conformance suite: one set of checks, run against
// every verbs provider (verbs/soft on an in-process fabric, verbs/rdma on two rdma_rxe
// devices in the QEMU guest), that wants the same results for the same operations.
//
// It uses only the verbs interfaces. What legitimately differs between providers (how
// the peer is addressed, what the link layer is called, whether CQ moderation exists,
// how a multicast group is made reachable) comes from the Fixture, and the suite checks
// the declared behaviour instead of skipping.
package verbstest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"ipoibfs/verbs"
)

// Fixture is what a provider's test gives the suite.
type Fixture struct {
	// Dev are two opened devices whose ports Port can reach each other. The suite
	// closes them in its last check ("close").
	Dev  [2]verbs.Device
	Port int
	// LinkLayer is what PortAttr.LinkLayer must say ("InfiniBand", "Ethernet").
	LinkLayer string
	// PKeyIndex and QKey are used for every UD QP; the P_Key table entry at PKeyIndex
	// must be the default partition 0xffff.
	PKeyIndex int
	QKey      uint32
	// Dest is the address handle attribute that reaches device to's port from the
	// other device (DLID on an InfiniBand port, DGID with GRH on RoCE).
	Dest func(t *testing.T, to int) verbs.AHAttr
	// Multicast makes mgid deliverable to device to's port (an SA join on InfiniBand,
	// a host-side IPv6 membership on rxe where the kernel does not join itself) and
	// returns the LID for Attach/DetachMcast and the attribute with which the other
	// device sends to the group. Cleanup is the fixture's (t.Cleanup).
	Multicast func(t *testing.T, to int, mgid verbs.GID) (verbs.LID, verbs.AHAttr)
	// ModerationErr is nil if CQ.SetModeration works, otherwise the error (errors.Is)
	// it must fail with: a provider without moderation must say so, not pretend.
	ModerationErr error
	// RecvTooSmallStatus is the completion status of a receive whose buffer is too
	// small for the datagram (IBTA: local length error), and RecvTooSmallQPErr says
	// whether the QP goes to ERR after it (takes no more datagrams; its receives come
	// back flushed).
	RecvTooSmallStatus verbs.WCStatus
	RecvTooSmallQPErr  bool
	// OversizeSendStatus is the send completion status of a UD datagram 100 bytes
	// above the port's active MTU (IBTA: local length error); it is never delivered.
	OversizeSendStatus verbs.WCStatus
	// Wait bounds every wait for a completion that must come (default 10 s); Quiet is
	// how long to wait to conclude that one does not come (default 500 ms).
	Wait, Quiet time.Duration
}

// Names are the subtests Run runs, in order (the rdma guest test expects a PASS line
// for each).
var Names = []string{"attrs", "cq", "qpstates", "ud", "qkey", "batch", "recvtoosmall", "oversize", "multicast", "flush", "reset", "rc", "rnr", "srq", "sourceqpn", "close"}

// Run runs the suite as subtests of t.
func Run(t *testing.T, f Fixture) {
	if f.Wait == 0 {
		f.Wait = 10 * time.Second
	}
	if f.Quiet == 0 {
		f.Quiet = 500 * time.Millisecond
	}
	s := &suite{f: f}
	tests := map[string]func(*testing.T){
		"attrs": s.attrs, "cq": s.cq, "qpstates": s.qpStates, "ud": s.ud, "qkey": s.qkey,
		"batch": s.batch, "recvtoosmall": s.recvTooSmall, "oversize": s.oversize, "multicast": s.multicast,
		"flush": s.flush, "reset": s.reset, "rc": s.rc, "rnr": s.rnr, "srq": s.srq, "sourceqpn": s.sourceQPN, "close": s.close,
	}
	for _, name := range Names {
		t.Run(name, tests[name])
	}
}

type suite struct{ f Fixture }

// end is a UD QP on one device, with its two CQs.
type end struct {
	i        int
	dev      verbs.Device
	qp       verbs.QP
	scq, rcq verbs.CQ
	gid      verbs.GID
}

func (s *suite) cqOn(t *testing.T, i, entries int) verbs.CQ {
	t.Helper()
	cq, err := s.f.Dev[i].CreateCQ(verbs.CQAttr{Entries: entries})
	if err != nil {
		t.Fatalf("dev %d CreateCQ: %v", i, err)
	}
	t.Cleanup(func() { cq.Close() })
	return cq
}

// newQP creates a UD QP in RESET (the cleanup closes it before its CQs).
func (s *suite) newQP(t *testing.T, i, nsend, nrecv int) *end {
	t.Helper()
	e := &end{i: i, dev: s.f.Dev[i], scq: s.cqOn(t, i, 256), rcq: s.cqOn(t, i, 256)}
	qp, err := e.dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: s.f.Port, SendCQ: e.scq, RecvCQ: e.rcq, MaxSendWR: nsend, MaxRecvWR: nrecv})
	if err != nil {
		t.Fatalf("dev %d CreateQP: %v", i, err)
	}
	t.Cleanup(func() { qp.Close() })
	e.qp = qp
	p, err := e.dev.Port(s.f.Port)
	if err != nil {
		t.Fatal(err)
	}
	if e.gid, err = p.GID(0); err != nil {
		t.Fatal(err)
	}
	return e
}

func (s *suite) toRTS(t *testing.T, e *end, qkey uint32) {
	t.Helper()
	for _, m := range []verbs.QPModify{
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex | verbs.QPMaskQKey, State: verbs.QPInit, PKeyIndex: s.f.PKeyIndex, QKey: qkey},
		{Mask: verbs.QPMaskState, State: verbs.QPRTR},
		{Mask: verbs.QPMaskState | verbs.QPMaskSQPSN, State: verbs.QPRTS},
	} {
		if err := e.qp.Modify(m); err != nil {
			t.Fatalf("dev %d QP to %v: %v", e.i, m.State, err)
		}
	}
}

// pair is a UD QP in RTS on each device with the fixture's Q_Key.
func (s *suite) pair(t *testing.T) [2]*end {
	t.Helper()
	var p [2]*end
	for i := range p {
		p[i] = s.newQP(t, i, 64, 128)
		s.toRTS(t, p[i], s.f.QKey)
	}
	return p
}

func (s *suite) ah(t *testing.T, from int, attr verbs.AHAttr) verbs.AH {
	t.Helper()
	ah, err := s.f.Dev[from].CreateAH(attr)
	if err != nil {
		t.Fatalf("dev %d CreateAH(%+v): %v", from, attr, err)
	}
	t.Cleanup(func() { ah.Close() })
	return ah
}

func (s *suite) ahTo(t *testing.T, to int) verbs.AH {
	t.Helper()
	return s.ah(t, 1-to, s.f.Dest(t, to))
}

// WaitWC waits on the CQ's Notify channel and polls until n completions have come or
// d has passed, and returns what came.
func WaitWC(cq verbs.CQ, n int, d time.Duration) []verbs.WC {
	var got []verbs.WC
	buf := make([]verbs.WC, 16)
	deadline := time.After(d)
	for {
		k := cq.Poll(buf)
		got = append(got, buf[:k]...)
		if len(got) >= n {
			return got
		}
		if k == len(buf) {
			continue
		}
		select {
		case <-cq.Notify():
		case <-deadline:
			return got
		}
	}
}

func (e *end) postRecv(t *testing.T, n int, id uint64, size int) [][]byte {
	t.Helper()
	bufs := make([][]byte, n)
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		bufs[i] = make([]byte, size)
		wrs[i] = verbs.RecvWR{ID: id + uint64(i), Buf: bufs[i]}
	}
	if k, err := e.qp.PostRecv(wrs); k != n || err != nil {
		t.Fatalf("dev %d PostRecv: %d of %d: %v", e.i, k, n, err)
	}
	return bufs
}

// send posts one signalled send and waits for its successful completion.
func (s *suite) send(t *testing.T, e *end, wr verbs.SendWR) {
	t.Helper()
	wr.Signaled = true
	if n, err := e.qp.PostSend([]verbs.SendWR{wr}); n != 1 || err != nil {
		t.Fatalf("dev %d PostSend: %d %v", e.i, n, err)
	}
	wcs := WaitWC(e.scq, 1, s.f.Wait)
	if len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].Opcode != verbs.WCSend || wcs[0].WRID != wr.ID {
		t.Errorf("dev %d send completion %+v, want one successful send with WRID %d", e.i, wcs, wr.ID)
	}
}

const grh = 40

// attrs: device and port attributes every provider reports the same way.
func (s *suite) attrs(t *testing.T) {
	for i, d := range s.f.Dev {
		if d.Name() == "" || d.NumPorts() < s.f.Port {
			t.Errorf("dev %d: name %q, %d ports (the fixture uses port %d)", i, d.Name(), d.NumPorts(), s.f.Port)
		}
		for _, bad := range []int{0, d.NumPorts() + 1} {
			if _, err := d.Port(bad); !errors.Is(err, verbs.ErrNoPort) {
				t.Errorf("dev %d Port(%d): %v, want ErrNoPort", i, bad, err)
			}
		}
		p, err := d.Port(s.f.Port)
		if err != nil {
			t.Fatalf("dev %d Port(%d): %v", i, s.f.Port, err)
		}
		if p.Num() != s.f.Port {
			t.Errorf("dev %d port Num %d", i, p.Num())
		}
		a := p.Attr()
		if a.State != verbs.PortActive || a.LinkLayer != s.f.LinkLayer || a.ActiveMTU.Bytes() == 0 || a.MaxMTU < a.ActiveMTU {
			t.Errorf("dev %d port: state %v link layer %q (want ACTIVE, %q), MTU active %d max %d", i, a.State, a.LinkLayer, s.f.LinkLayer, a.ActiveMTU, a.MaxMTU)
		}
		g, err := p.GID(0)
		if err != nil {
			t.Fatalf("dev %d GID(0): %v", i, err)
		}
		if g.IsZero() || g != verbs.MakeGID(a.GIDPrefix, a.GUID) {
			t.Errorf("dev %d GID 0 %v, attr prefix %#x GUID %v", i, g, a.GIDPrefix, a.GUID)
		}
		tab := p.PKeyTable()
		if s.f.PKeyIndex >= len(tab) || tab[s.f.PKeyIndex] != verbs.DefaultPKey {
			t.Errorf("dev %d P_Key table %v: want 0xffff at index %d", i, tab, s.f.PKeyIndex)
		}
		if ix, ok := p.FindPKey(verbs.DefaultPKey); !ok || ix != s.f.PKeyIndex {
			t.Errorf("dev %d FindPKey(0xffff) = %d %v, want %d", i, ix, ok, s.f.PKeyIndex)
		}
		if len(tab) > a.PKeyTabLen && a.PKeyTabLen != 0 {
			t.Errorf("dev %d P_Key table of %d entries, attr says %d", i, len(tab), a.PKeyTabLen)
		}
		t.Logf("dev %d %s port %d: %v %s lid %d MTU %d/%d gid0 %v pkeys %d", i, d.Name(), s.f.Port, a.State, a.LinkLayer,
			a.LID, a.ActiveMTU.Bytes(), a.MaxMTU.Bytes(), g, len(tab))
	}
	if g0, g1 := s.f.Dev[0].NodeGUID(), s.f.Dev[1].NodeGUID(); g0 == g1 || g0 == 0 {
		t.Errorf("node GUIDs %v and %v: want distinct and non-zero", g0, g1)
	}
}

// cq: the completion channel signals once a completion is there, not before; moderation
// works or fails as declared.
func (s *suite) cq(t *testing.T) {
	if cq, err := s.f.Dev[0].CreateCQ(verbs.CQAttr{Entries: 0}); err == nil {
		t.Logf("CreateCQ with 0 entries accepted") // rdma rounds up to 1; soft refuses
		cq.Close()
	}
	p := s.pair(t)
	a, b := p[0], p[1]
	select {
	case <-a.scq.Notify():
		t.Errorf("Notify signalled on an empty CQ")
	case <-time.After(s.f.Quiet / 5):
	}
	if n := a.scq.Poll(make([]verbs.WC, 4)); n != 0 {
		t.Errorf("Poll on an empty CQ: %d", n)
	}
	err := a.rcq.SetModeration(16, 10)
	switch {
	case s.f.ModerationErr == nil && err != nil:
		t.Errorf("SetModeration: %v", err)
	case s.f.ModerationErr != nil && !errors.Is(err, s.f.ModerationErr):
		t.Errorf("SetModeration: %v, want %v (declared by the fixture)", err, s.f.ModerationErr)
	}
	if s.f.ModerationErr == nil {
		if err := a.rcq.SetModeration(0, 0); err != nil {
			t.Errorf("SetModeration(0, 0): %v", err)
		}
	}
	b.postRecv(t, 1, 1, grh+64)
	ah := s.ahTo(t, 1)
	if n, err := a.qp.PostSend([]verbs.SendWR{{ID: 5, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("ping")}, Signaled: true}}); n != 1 || err != nil {
		t.Fatalf("PostSend: %d %v", n, err)
	}
	for _, c := range []struct {
		name string
		cq   verbs.CQ
	}{{"send", a.scq}, {"receive", b.rcq}} {
		select {
		case <-c.cq.Notify():
		case <-time.After(s.f.Wait):
			t.Fatalf("no Notify on the %s CQ within %v", c.name, s.f.Wait)
		}
		wc := make([]verbs.WC, 4)
		if n := c.cq.Poll(wc); n != 1 || wc[0].Status != verbs.WCSuccess {
			t.Errorf("%s CQ after Notify: %d completions %+v", c.name, n, wc[:n])
		}
	}
}

// qpstates: the UD state machine, refused transitions and posting in the wrong state.
func (s *suite) qpStates(t *testing.T) {
	e := s.newQP(t, 0, 4, 4)
	if e.qp.Type() != verbs.QPTypeUD || e.qp.State() != verbs.QPReset || e.qp.Num() == 0 || e.qp.Num() == verbs.MulticastQPN {
		t.Errorf("new QP: type %v state %v QPN %#x", e.qp.Type(), e.qp.State(), uint32(e.qp.Num()))
	}
	refuse := func(to verbs.QPState) {
		t.Helper()
		from := e.qp.State()
		if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: to}); !errors.Is(err, verbs.ErrInvalidState) {
			t.Errorf("%v -> %v: %v, want ErrInvalidState", from, to, err)
		}
		if st := e.qp.State(); st != from {
			t.Errorf("%v -> %v refused, state now %v", from, to, st)
		}
	}
	if n, err := e.qp.PostRecv([]verbs.RecvWR{{ID: 1, Buf: make([]byte, 128)}}); n != 0 || !errors.Is(err, verbs.ErrInvalidState) {
		t.Errorf("PostRecv in RESET: %d %v, want 0 and ErrInvalidState", n, err)
	}
	refuse(verbs.QPRTR)
	refuse(verbs.QPRTS)
	if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex | verbs.QPMaskQKey, State: verbs.QPInit, PKeyIndex: s.f.PKeyIndex, QKey: s.f.QKey}); err != nil || e.qp.State() != verbs.QPInit {
		t.Fatalf("RESET -> INIT: %v (state %v)", err, e.qp.State())
	}
	refuse(verbs.QPRTS)
	ah := s.ahTo(t, 1)
	wr := verbs.SendWR{ID: 1, AH: ah, RemoteQPN: 2, RemoteQKey: s.f.QKey, Data: [][]byte{{1}}, Signaled: true}
	if n, err := e.qp.PostSend([]verbs.SendWR{wr}); n != 0 || !errors.Is(err, verbs.ErrInvalidState) {
		t.Errorf("PostSend in INIT: %d %v, want 0 and ErrInvalidState", n, err)
	}
	// Receives may be posted from INIT on; the queue holds MaxRecvWR of them.
	wrs := make([]verbs.RecvWR, 6)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(10 + i), Buf: make([]byte, 128)}
	}
	if n, err := e.qp.PostRecv(wrs); n != 4 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Errorf("posting 6 receives on a queue of 4: %d %v, want 4 and ErrQueueFull", n, err)
	}
	for _, st := range []verbs.QPState{verbs.QPRTR, verbs.QPRTS} {
		if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: st}); err != nil || e.qp.State() != st {
			t.Fatalf("-> %v: %v (state %v)", st, err, e.qp.State())
		}
	}
	refuse(verbs.QPInit)
	refuse(verbs.QPRTR)
	// A Q_Key-only modify keeps RTS.
	if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskQKey, QKey: s.f.QKey + 1}); err != nil || e.qp.State() != verbs.QPRTS {
		t.Errorf("Q_Key-only modify in RTS: %v (state %v)", err, e.qp.State())
	}
	// ERR, then RESET, then up again.
	if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr}); err != nil || e.qp.State() != verbs.QPErr {
		t.Fatalf("RTS -> ERR: %v (state %v)", err, e.qp.State())
	}
	if wcs := WaitWC(e.rcq, 4, s.f.Wait); len(wcs) != 4 {
		t.Errorf("%d flushed receives, want 4: %+v", len(wcs), wcs)
	}
	refuse(verbs.QPRTS)
	if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPReset}); err != nil || e.qp.State() != verbs.QPReset {
		t.Fatalf("ERR -> RESET: %v (state %v)", err, e.qp.State())
	}
	s.toRTS(t, e, s.f.QKey)
	if e.qp.State() != verbs.QPRTS {
		t.Errorf("after RESET and up again: %v", e.qp.State())
	}
	if n := e.rcq.Poll(make([]verbs.WC, 4)); n != 0 {
		t.Errorf("%d completions after RESET", n)
	}
}

// ud: a datagram each way, with a gather list, with and without immediate data.
func (s *suite) ud(t *testing.T) {
	p := s.pair(t)
	for dir, pair := range [][2]*end{{p[0], p[1]}, {p[1], p[0]}} {
		src, dst := pair[0], pair[1]
		bufs := dst.postRecv(t, 2, 100, grh+1024)
		ah := s.ahTo(t, dst.i)
		msg := []byte(fmt.Sprintf("conformance datagram, direction %d: %s", dir, bytes.Repeat([]byte{'x'}, 200)))
		imm := dir == 1
		s.send(t, src, verbs.SendWR{ID: 7, AH: ah, RemoteQPN: dst.qp.Num(), RemoteQKey: s.f.QKey,
			Data: [][]byte{msg[:3], {}, msg[3:50], msg[50:]}, WithImm: imm, Imm: 0xdeadbeef})
		wcs := WaitWC(dst.rcq, 1, s.f.Wait)
		if len(wcs) != 1 {
			t.Fatalf("direction %d: %d receive completions", dir, len(wcs))
		}
		wc := wcs[0]
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.WRID != 100 || wc.ByteLen != grh+len(msg) ||
			wc.QPN != dst.qp.Num() || wc.SrcQP != src.qp.Num() || !wc.GRH || wc.WithImm != imm || imm && wc.Imm != 0xdeadbeef || !imm && wc.Imm != 0 {
			t.Errorf("direction %d: receive completion %+v (sent %d bytes from QPN %#x, imm %v)", dir, wc, len(msg), uint32(src.qp.Num()), imm)
		}
		if wc.WRID != 100 {
			continue
		}
		b := bufs[0]
		if !bytes.Equal(b[grh:grh+len(msg)], msg) {
			t.Errorf("direction %d: payload %q", dir, b[grh:grh+len(msg)])
		}
		// The GRH slot: an IPv6-format header from the sender's GID 0 to the receiver's.
		if b[0]>>4 != 6 || verbs.GID(b[8:24]) != src.gid || verbs.GID(b[24:40]) != dst.gid {
			t.Errorf("direction %d: GRH % x, want version 6 from %v to %v", dir, b[:grh], src.gid, dst.gid)
		}
		if wcs := WaitWC(dst.rcq, 1, s.f.Quiet); len(wcs) != 0 {
			t.Errorf("direction %d: more completions %+v", dir, wcs)
		}
	}
}

// sourceQPN: a send-only UD QP made with another QP's number sends as that QP (the
// receiver sees its number, and answers reach it) and receives nothing. A provider
// without it must say so with errors.ErrUnsupported and make nothing.
func (s *suite) sourceQPN(t *testing.T) {
	p := s.pair(t)
	owner, dst := p[0], p[1]
	dev := owner.dev
	scq := s.cqOn(t, 0, 64)
	attr := verbs.QPAttr{Type: verbs.QPTypeUD, Port: s.f.Port, SendCQ: scq, RecvCQ: scq, MaxSendWR: 64, MaxRecvWR: 1,
		SourceQPN: owner.qp.Num()}
	qp, err := dev.CreateQP(attr)
	if errors.Is(err, errors.ErrUnsupported) {
		if qp != nil {
			t.Errorf("CreateQP returned a QP with %v", err)
		}
		t.Logf("source QPN not supported by the provider: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("CreateQP with source QPN %#x: %v", uint32(owner.qp.Num()), err)
	}
	t.Cleanup(func() { qp.Close() })
	so := &end{i: 0, dev: dev, qp: qp, scq: scq, rcq: scq, gid: owner.gid}
	s.toRTS(t, so, s.f.QKey)
	if n, err := qp.PostRecv([]verbs.RecvWR{{ID: 1, Buf: make([]byte, 256)}}); n != 0 || !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("PostRecv on a send-only QP: %d, %v; want 0 and ErrInvalid", n, err)
	}
	for _, bad := range []verbs.QPAttr{
		{Type: verbs.QPTypeUD, SourceQPN: qp.Num()},       // itself send-only
		{Type: verbs.QPTypeUD, SourceQPN: 0x7ffff0},       // no such QP
		{Type: verbs.QPTypeRC, SourceQPN: owner.qp.Num()}, // UD only
	} {
		bad.Port, bad.SendCQ, bad.RecvCQ, bad.MaxSendWR, bad.MaxRecvWR = s.f.Port, scq, scq, 8, 8
		if q, err := dev.CreateQP(bad); err == nil {
			q.Close()
			t.Errorf("CreateQP(%v, source QPN %#x) succeeded", bad.Type, uint32(bad.SourceQPN))
		}
	}

	// Out through the send-only QP: the receiver sees the owner's number.
	dst.postRecv(t, 1, 200, grh+256)
	s.send(t, so, verbs.SendWR{ID: 9, AH: s.ahTo(t, 1), RemoteQPN: dst.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("from the send queue")}})
	wcs := WaitWC(dst.rcq, 1, s.f.Wait)
	if len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].SrcQP != owner.qp.Num() {
		t.Fatalf("receive completion %+v, want one from source QPN %#x", wcs, uint32(owner.qp.Num()))
	}
	// The answer to that number reaches the owner; one to the send-only QP's own
	// number reaches nobody.
	obufs := owner.postRecv(t, 2, 300, grh+256)
	back := s.ahTo(t, 0)
	s.send(t, dst, verbs.SendWR{ID: 10, AH: back, RemoteQPN: qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("to the send queue")}})
	s.send(t, dst, verbs.SendWR{ID: 11, AH: back, RemoteQPN: wcs[0].SrcQP, RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("answer")}})
	got := WaitWC(owner.rcq, 1, s.f.Wait)
	if len(got) != 1 || got[0].WRID != 300 || string(obufs[0][grh:grh+got[0].ByteLen-grh]) != "answer" {
		t.Fatalf("owner's receive completions %+v, want the answer alone", got)
	}
	if more := WaitWC(owner.rcq, 1, s.f.Quiet); len(more) != 0 {
		t.Errorf("owner received %+v: a datagram to the send-only QP's number", more)
	}
	if more := WaitWC(scq, 1, s.f.Quiet); len(more) != 0 {
		t.Errorf("send-only QP's CQ has %+v", more)
	}
}

// qkey: a wrong Q_Key is dropped; one with the high bit set means the sending QP's own.
func (s *suite) qkey(t *testing.T) {
	p := s.pair(t)
	a, b := p[0], p[1]
	ah := s.ahTo(t, 1)
	bufs := b.postRecv(t, 1, 300, grh+64)
	s.send(t, a, verbs.SendWR{ID: 1, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey ^ 0x1234, Data: [][]byte{{1}}})
	if wcs := WaitWC(b.rcq, 1, s.f.Quiet); len(wcs) != 0 {
		t.Errorf("received with Q_Key %#x (the QP's is %#x): %+v", s.f.QKey^0x1234, s.f.QKey, wcs)
	}
	s.send(t, a, verbs.SendWR{ID: 2, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 0x80000000, Data: [][]byte{{2}}})
	if wcs := WaitWC(b.rcq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].WRID != 300 || bufs[0][grh] != 2 {
		t.Errorf("Q_Key 0x80000000 (the sender's own, %#x): %+v", s.f.QKey, wcs)
	}
	// The sender's own Q_Key is what is sent, not the receiver's: with the sender's
	// changed, the same send is dropped.
	if err := a.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskQKey, QKey: s.f.QKey ^ 0x55}); err != nil {
		t.Fatal(err)
	}
	b.postRecv(t, 1, 310, grh+64)
	s.send(t, a, verbs.SendWR{ID: 3, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 0x80000000, Data: [][]byte{{3}}})
	if wcs := WaitWC(b.rcq, 1, s.f.Quiet); len(wcs) != 0 {
		t.Errorf("received a high-bit Q_Key from a QP whose own is %#x: %+v", s.f.QKey^0x55, wcs)
	}
	// The receiver takes a new Q_Key without leaving RTS.
	if err := b.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskQKey, QKey: s.f.QKey ^ 0x55}); err != nil || b.qp.State() != verbs.QPRTS {
		t.Fatalf("Q_Key-only modify: %v, state %v", err, b.qp.State())
	}
	s.send(t, a, verbs.SendWR{ID: 4, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey ^ 0x55, Data: [][]byte{{4}}})
	if wcs := WaitWC(b.rcq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].WRID != 310 {
		t.Errorf("Q_Key %#x after the Q_Key-only modify: %+v", s.f.QKey^0x55, wcs)
	}
}

// batch: N sends in one PostSend with only the last signalled give one send completion;
// all N arrive; then a whole send queue's worth goes out again.
func (s *suite) batch(t *testing.T) {
	p := s.pair(t)
	a, b := p[0], p[1]
	const n = 40
	bufs := b.postRecv(t, n, 1000, grh+1024)
	ah := s.ahTo(t, 1)
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		msg := bytes.Repeat([]byte{byte(i)}, 100+i*20) // up to 880 bytes: below a 1024-byte MTU
		wrs[i] = verbs.SendWR{ID: uint64(i), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{msg[:10], msg[10:]}, Signaled: i == n-1}
	}
	if k, err := a.qp.PostSend(wrs); k != n || err != nil {
		t.Fatalf("PostSend: %d %v", k, err)
	}
	if wcs := WaitWC(a.scq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].WRID != n-1 || wcs[0].Status != verbs.WCSuccess {
		t.Errorf("send completions %+v, want only the last, signalled one", wcs)
	}
	wcs := WaitWC(b.rcq, n, 2*s.f.Wait)
	if len(wcs) != n {
		t.Fatalf("%d of %d received", len(wcs), n)
	}
	for k, wc := range wcs {
		i := int(wc.WRID - 1000)
		// UD keeps order between one pair of QPs on these links: buffer k has message k.
		if wc.Status != verbs.WCSuccess || i != k || wc.ByteLen != grh+100+k*20 {
			t.Errorf("completion %d: %+v", k, wc)
			continue
		}
		if !bytes.Equal(bufs[i][grh:wc.ByteLen], bytes.Repeat([]byte{byte(k)}, 100+k*20)) {
			t.Errorf("buffer %d: not message %d", i, k)
		}
	}
	if wcs := WaitWC(a.scq, 1, s.f.Quiet/5); len(wcs) != 0 {
		t.Errorf("more send completions %+v", wcs)
	}
	// The unsignalled sends' slots are free again: the whole queue goes out once more.
	more := make([]verbs.SendWR, 64)
	for i := range more {
		more[i] = verbs.SendWR{ID: uint64(100 + i), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{{byte(i)}}, Signaled: i == len(more)-1}
	}
	b.postRecv(t, 64, 5000, grh+64)
	if k, err := a.qp.PostSend(more); k != len(more) || err != nil {
		t.Errorf("second batch: %d %v", k, err)
	}
	if wcs := WaitWC(a.scq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].WRID != 163 {
		t.Errorf("second batch send completions %+v", wcs)
	}
	if got := WaitWC(b.rcq, 64, 2*s.f.Wait); len(got) != 64 {
		t.Errorf("second batch: %d of 64 received", len(got))
	}
}

// recvtoosmall: a datagram larger than the posted buffer completes that receive in error
// with its WRID, the status the fixture declares, and nothing written past the buffer.
// What the QP does next is declared too (RecvTooSmallQPErr).
func (s *suite) recvTooSmall(t *testing.T) {
	p := s.pair(t)
	a, b := p[0], p[1]
	ah := s.ahTo(t, 1)
	big := make([]byte, 256)
	const size = grh + 16
	if k, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 400, Buf: big[:size:size]}}); k != 1 || err != nil {
		t.Fatalf("PostRecv: %d %v", k, err)
	}
	s.send(t, a, verbs.SendWR{ID: 1, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{bytes.Repeat([]byte{7}, 100)}})
	wcs := WaitWC(b.rcq, 1, s.f.Wait)
	if len(wcs) != 1 || wcs[0].WRID != 400 || wcs[0].Opcode != verbs.WCRecv || wcs[0].Status != s.f.RecvTooSmallStatus {
		t.Errorf("receive of 100 bytes into %d: %+v, want one %q completion (declared by the fixture)", size, wcs, s.f.RecvTooSmallStatus)
	}
	if bytes.Count(big[size:], []byte{0}) != len(big)-size {
		t.Errorf("written past the %d-byte buffer: % x", size, big[size:])
	}
	want := verbs.QPRTS
	if s.f.RecvTooSmallQPErr {
		want = verbs.QPErr
	}
	if st := b.qp.State(); st != want {
		t.Errorf("QP state after the error completion: %v, want %v (declared)", st, want)
	}
	// Then a datagram that fits: received if the QP stayed up; if it went to ERR, not
	// received, and the buffer comes back flushed (at the latest when the QP is moved
	// to ERR explicitly).
	bufs := b.postRecv(t, 1, 401, grh+256)
	s.send(t, a, verbs.SendWR{ID: 2, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("fits")}})
	if !s.f.RecvTooSmallQPErr {
		wcs = WaitWC(b.rcq, 1, s.f.Wait)
		if len(wcs) != 1 || wcs[0].WRID != 401 || wcs[0].Status != verbs.WCSuccess || string(bufs[0][grh:grh+4]) != "fits" {
			t.Errorf("the next receive %+v: want the datagram, the QP still up (declared)", wcs)
		}
		return
	}
	wcs = WaitWC(b.rcq, 1, s.f.Quiet)
	t.Logf("the next datagram after the error, before an explicit move to ERR: %+v", wcs)
	// A QP in ERR sends nothing either: a send completes flushed.
	if n, err := b.qp.PostSend([]verbs.SendWR{{ID: 3, AH: s.ahTo(t, 0), RemoteQPN: a.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{{3}}, Signaled: true}}); n != 1 || err != nil {
		t.Logf("PostSend on the QP in ERR refused: %d %v", n, err)
	} else if sw := WaitWC(b.scq, 1, s.f.Wait); len(sw) != 1 || sw[0].WRID != 3 || sw[0].Status != verbs.WCWRFlushErr {
		t.Errorf("send on the QP in ERR: %+v, want it flushed", sw)
	}
	if len(wcs) == 0 {
		if err := b.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr}); err != nil {
			t.Errorf("to ERR: %v", err)
		}
		wcs = WaitWC(b.rcq, 1, s.f.Wait)
	}
	if len(wcs) != 1 || wcs[0].WRID != 401 || wcs[0].Status != verbs.WCWRFlushErr {
		t.Errorf("the next receive %+v: want it flushed, the QP in ERR (declared)", wcs)
	}
}

// oversize: a datagram above the active MTU is not delivered; its send completes with
// the declared status, and the QP sends afterwards (after a move from SQE to RTS when
// the send failed).
func (s *suite) oversize(t *testing.T) {
	p := s.pair(t)
	a, b := p[0], p[1]
	pt, err := a.dev.Port(s.f.Port)
	if err != nil {
		t.Fatal(err)
	}
	mtu := pt.Attr().ActiveMTU.Bytes()
	ah := s.ahTo(t, 1)
	b.postRecv(t, 2, 600, grh+mtu+200)
	wr := verbs.SendWR{ID: 1, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{bytes.Repeat([]byte{5}, mtu+100)}, Signaled: true}
	if n, err := a.qp.PostSend([]verbs.SendWR{wr}); n != 1 || err != nil {
		t.Fatalf("PostSend of %d bytes (MTU %d): %d %v", mtu+100, mtu, n, err)
	}
	if wcs := WaitWC(a.scq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].WRID != 1 || wcs[0].Status != s.f.OversizeSendStatus {
		t.Errorf("send of %d bytes on a %d-byte MTU: %+v, want status %q (declared)", mtu+100, mtu, wcs, s.f.OversizeSendStatus)
	}
	if wcs := WaitWC(b.rcq, 1, s.f.Quiet); len(wcs) != 0 {
		t.Errorf("the datagram above the MTU was received: %+v", wcs)
	}
	if s.f.OversizeSendStatus != verbs.WCSuccess {
		// A UD send that fails leaves the QP in SQE (IBTA 10.3.1): the next send is
		// flushed, and a move back to RTS lets the QP send again.
		if st := a.qp.State(); st != verbs.QPSQE {
			t.Errorf("after a failed send the QP is in %v, want SQE", st)
		}
		if n, err := a.qp.PostSend([]verbs.SendWR{{ID: 3, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{{3}}, Signaled: true}}); n != 1 || err != nil {
			t.Errorf("PostSend on the QP in SQE: %d %v", n, err)
		} else if wcs := WaitWC(a.scq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].WRID != 3 || wcs[0].Status != verbs.WCWRFlushErr {
			t.Errorf("a send on the QP in SQE: %+v, want it flushed", wcs)
		}
		if err := a.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPRTS}); err != nil {
			t.Fatalf("SQE to RTS: %v", err)
		}
	}
	s.send(t, a, verbs.SendWR{ID: 2, AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{bytes.Repeat([]byte{6}, mtu)}})
	if wcs := WaitWC(b.rcq, 1, s.f.Wait); len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].ByteLen != grh+mtu {
		t.Errorf("a datagram of exactly the MTU afterwards: %+v", wcs)
	}
}

// multicast: attach, delivery to the attached QP, detach stops it, a second detach fails.
func (s *suite) multicast(t *testing.T) {
	p := s.pair(t)
	a, b := p[0], p[1]
	mgid, _ := verbs.ParseGID("ff12:401b:ffff::ffff:ffff") // IPoIB broadcast, P_Key 0xffff
	lid, attr := s.f.Multicast(t, 1, mgid)
	if err := b.qp.AttachMcast(mgid, lid); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.AttachMcast(mgid, lid); err != nil {
		t.Errorf("second AttachMcast of the same group: %v", err)
	}
	bufs := b.postRecv(t, 4, 200, grh+256)
	ah := s.ah(t, 0, attr)
	msg := []byte("to the group")
	s.send(t, a, verbs.SendWR{ID: 1, AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: s.f.QKey, Data: [][]byte{msg}})
	wcs := WaitWC(b.rcq, 1, s.f.Wait)
	if len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].ByteLen != grh+len(msg) || wcs[0].SrcQP != a.qp.Num() || wcs[0].WRID != 200 {
		t.Fatalf("multicast receive: %+v", wcs)
	}
	if b := bufs[0]; !bytes.Equal(b[grh:grh+len(msg)], msg) || verbs.GID(b[24:40]) != mgid || verbs.GID(b[8:24]) != a.gid {
		t.Errorf("multicast buffer: GRH % x payload %q: want from %v to %v", b[:grh], b[grh:grh+len(msg)], a.gid, mgid)
	}
	if err := b.qp.DetachMcast(mgid, lid); err != nil {
		t.Fatal(err)
	}
	s.send(t, a, verbs.SendWR{ID: 2, AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: s.f.QKey, Data: [][]byte{msg}})
	if wcs := WaitWC(b.rcq, 1, s.f.Quiet); len(wcs) != 0 {
		t.Errorf("received after DetachMcast: %+v", wcs)
	}
	if err := b.qp.DetachMcast(mgid, lid); err == nil {
		t.Errorf("second DetachMcast succeeded")
	}
}

// flush: moving a QP with posted receives to ERR completes each once, with its WRID.
func (s *suite) flush(t *testing.T) {
	e := s.newQP(t, 0, 4, 16)
	s.toRTS(t, e, s.f.QKey)
	e.postRecv(t, 5, 900, grh+64)
	if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr}); err != nil {
		t.Fatal(err)
	}
	wcs := WaitWC(e.rcq, 5, s.f.Wait)
	seen := map[uint64]bool{}
	for _, wc := range wcs {
		if wc.Status != verbs.WCWRFlushErr || wc.Opcode != verbs.WCRecv || wc.QPN != e.qp.Num() || wc.WRID < 900 || wc.WRID > 904 || seen[wc.WRID] {
			t.Errorf("flushed completion %+v", wc)
		}
		seen[wc.WRID] = true
	}
	if len(seen) != 5 {
		t.Errorf("flushed %+v, want WRIDs 900-904 once each", wcs)
	}
	if more := WaitWC(e.rcq, 1, s.f.Quiet/5); len(more) != 0 {
		t.Errorf("completions after the flush: %+v", more)
	}
}

// reset: a QP moved to RESET with every receive and send slot in use (nothing flushed
// first) takes a full queue of each again once back in RTS, and what arrives then
// completes with the new requests' IDs. A provider that keeps slots of its own must
// take them back at the reset (verbs/rdma lost them, and the next ring found the
// queue full), and a completion made before the reset and polled after it must not
// come back under a request posted since (the slot's new owner).
func (s *suite) reset(t *testing.T) {
	b := s.pair(t)[1]
	const nsend, nrecv = 4, 8
	e := s.newQP(t, 0, nsend, nrecv)
	s.toRTS(t, e, s.f.QKey)
	e.postRecv(t, nrecv, 500, grh+64)
	ah := s.ahTo(t, 1)
	wrs := make([]verbs.SendWR, nsend) // unsignaled: their slots free with a later completion
	for k := range wrs {
		wrs[k] = verbs.SendWR{ID: uint64(600 + k), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("before the reset")}}
	}
	if n, err := e.qp.PostSend(wrs); n != nsend || err != nil {
		t.Fatalf("PostSend of %d: %d, %v", nsend, n, err)
	}
	if wcs := WaitWC(e.scq, 1, s.f.Quiet); len(wcs) != 0 {
		t.Fatalf("unsignaled sends completed: %+v", wcs)
	}
	// One datagram received and left on the CQ, unpolled, over the reset.
	s.send(t, b, verbs.SendWR{ID: 2, AH: s.ahTo(t, 0), RemoteQPN: e.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("before")}})
	time.Sleep(s.f.Quiet)
	if err := e.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPReset}); err != nil {
		t.Fatal(err)
	}
	s.toRTS(t, e, s.f.QKey)
	bufs := e.postRecv(t, nrecv, 700, grh+64)
	// Nothing was sent since: the datagram's completion, if the provider reports it
	// at all, names its own request.
	for _, wc := range WaitWC(e.rcq, 1, s.f.Quiet/5) {
		if wc.WRID >= 700 {
			t.Errorf("a completion from before the reset came back as request %d, posted after it: %+v", wc.WRID, wc)
		}
	}
	if wcs := WaitWC(e.scq, 1, s.f.Quiet/5); len(wcs) != 0 {
		t.Errorf("send completions after a reset: %+v", wcs)
	}
	for k := range wrs {
		wrs[k].ID, wrs[k].Signaled = uint64(800+k), true
	}
	if n, err := e.qp.PostSend(wrs); n != nsend || err != nil {
		t.Fatalf("PostSend of %d after the reset: %d, %v", nsend, n, err)
	}
	sent := map[uint64]bool{}
	for _, wc := range WaitWC(e.scq, nsend, s.f.Wait) {
		if wc.Status != verbs.WCSuccess || wc.WRID < 800 || wc.WRID >= 800+nsend || sent[wc.WRID] {
			t.Errorf("send completion after the reset: %+v", wc)
		}
		sent[wc.WRID] = true
	}
	if len(sent) != nsend {
		t.Errorf("%d send completions after the reset, want %d", len(sent), nsend)
	}
	s.send(t, b, verbs.SendWR{ID: 1, AH: s.ahTo(t, 0), RemoteQPN: e.qp.Num(), RemoteQKey: s.f.QKey, Data: [][]byte{[]byte("after")}})
	wcs := WaitWC(e.rcq, 1, s.f.Wait)
	if len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].WRID < 700 || wcs[0].WRID >= 700+nrecv {
		t.Fatalf("receive after the reset: %+v, want one of WRIDs 700-%d", wcs, 700+nrecv-1)
	}
	if got := string(bufs[wcs[0].WRID-700][grh : grh+5]); got != "after" {
		t.Errorf("received %q into the buffer of WRID %d", got, wcs[0].WRID)
	}
}

// close: queue pairs, then address handles and CQs, then the devices; every Close
// returns nil, also the second time, and a closed QP takes no more work.
func (s *suite) close(t *testing.T) {
	for i, d := range s.f.Dev {
		scq, err1 := d.CreateCQ(verbs.CQAttr{Entries: 16})
		rcq, err2 := d.CreateCQ(verbs.CQAttr{Entries: 16})
		if err1 != nil || err2 != nil {
			t.Fatalf("dev %d CreateCQ: %v %v", i, err1, err2)
		}
		qp, err := d.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: s.f.Port, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			t.Fatal(err)
		}
		ah, err := d.CreateAH(s.f.Dest(t, 1-i))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			what string
			f    func() error
		}{{"QP", qp.Close}, {"QP again", qp.Close}, {"AH", ah.Close}, {"AH again", ah.Close},
			{"send CQ", scq.Close}, {"receive CQ", rcq.Close}, {"CQ again", rcq.Close}} {
			if err := c.f(); err != nil {
				t.Errorf("dev %d %s Close: %v", i, c.what, err)
			}
		}
		if _, err := qp.PostRecv([]verbs.RecvWR{{ID: 1, Buf: make([]byte, 64)}}); err == nil {
			t.Errorf("dev %d PostRecv on a closed QP accepted", i)
		}
	}
	for i, d := range s.f.Dev {
		if err := d.Close(); err != nil {
			t.Errorf("dev %d Close: %v", i, err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("dev %d second Close: %v", i, err)
		}
	}
}

// rcEnd is an RC QP on one device with its CQs (the receive CQ may be shared).
type rcEnd struct {
	i        int
	qp       verbs.QP
	scq, rcq verbs.CQ
}

// newRC creates an RC QP in RESET on device i; srq, when set, supplies its receives.
func (s *suite) newRC(t *testing.T, i int, rcq verbs.CQ, srq verbs.SRQ) *rcEnd {
	t.Helper()
	e := &rcEnd{i: i, scq: s.cqOn(t, i, 256), rcq: rcq}
	if rcq == nil {
		e.rcq = s.cqOn(t, i, 256)
	}
	qp, err := s.f.Dev[i].CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: s.f.Port, SendCQ: e.scq, RecvCQ: e.rcq,
		MaxSendWR: 64, MaxRecvWR: 64, SRQ: srq})
	if err != nil {
		t.Fatalf("dev %d CreateQP(RC): %v", i, err)
	}
	t.Cleanup(func() { qp.Close() })
	if qp.Type() != verbs.QPTypeRC || qp.State() != verbs.QPReset {
		t.Errorf("new RC QP: type %v state %v", qp.Type(), qp.State())
	}
	e.qp = qp
	return e
}

// pathMTU is the RC path MTU: the smaller active MTU of the two ports.
func (s *suite) pathMTU(t *testing.T) verbs.MTU {
	t.Helper()
	var m verbs.MTU
	for i, d := range s.f.Dev {
		p, err := d.Port(s.f.Port)
		if err != nil {
			t.Fatal(err)
		}
		if a := p.Attr().ActiveMTU; i == 0 || a < m {
			m = a
		}
	}
	return m
}

// connectRC moves a and b through INIT and RTR to RTS, each connected to the other,
// as the CM would after REQ/REP/RTU.
func (s *suite) connectRC(t *testing.T, a, b *rcEnd, rnrRetry uint8) {
	t.Helper()
	mtu := s.pathMTU(t)
	psn := [2]uint32{0x123456, 0xabcdef}
	for k, e := range [2]*rcEnd{a, b} {
		peer := [2]*rcEnd{b, a}[k]
		for _, m := range []verbs.QPModify{
			{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: s.f.PKeyIndex},
			{Mask: verbs.QPMaskState | verbs.QPMaskDestQPN | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskRQPSN,
				State: verbs.QPRTR, DestQPN: peer.qp.Num(), AH: s.f.Dest(t, peer.i), PathMTU: mtu, RQPSN: psn[1-k]},
			{Mask: verbs.QPMaskState | verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry,
				State: verbs.QPRTS, SQPSN: psn[k], Timeout: 14, RetryCnt: 7, RNRRetry: rnrRetry},
		} {
			if err := e.qp.Modify(m); err != nil {
				t.Fatalf("dev %d RC QP to %v: %v", e.i, m.State, err)
			}
			if e.qp.State() != m.State {
				t.Errorf("dev %d RC QP in %v after the move to %v", e.i, e.qp.State(), m.State)
			}
		}
	}
}

// pattern is a message whose bytes say which message and offset they are.
func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(k*7 + seed)
	}
	return b
}

// rc: messages from one byte to several path MTUs arrive whole, in order, with their
// length and immediate data, both ways; RC receives carry no GRH.
func (s *suite) rc(t *testing.T) {
	a, b := s.newRC(t, 0, nil, nil), s.newRC(t, 1, nil, nil)
	s.connectRC(t, a, b, 7)
	mtu := s.pathMTU(t).Bytes()
	sizes := []int{1, mtu, mtu + 1, 3*mtu + 17, 16384}
	for _, dir := range [2][2]*rcEnd{{a, b}, {b, a}} {
		from, to := dir[0], dir[1]
		bufs := make([][]byte, len(sizes))
		wrs := make([]verbs.RecvWR, len(sizes))
		for k := range bufs {
			bufs[k] = make([]byte, 16384)
			wrs[k] = verbs.RecvWR{ID: uint64(300 + k), Buf: bufs[k]}
		}
		if n, err := to.qp.PostRecv(wrs); n != len(wrs) || err != nil {
			t.Fatalf("dev %d PostRecv: %d %v", to.i, n, err)
		}
		sends := make([]verbs.SendWR, len(sizes))
		for k, n := range sizes {
			sends[k] = verbs.SendWR{ID: uint64(k), Data: [][]byte{pattern(n, k+from.i)}, Signaled: true,
				WithImm: k == 2, Imm: 0xfeedf00d}
		}
		if n, err := from.qp.PostSend(sends); n != len(sends) || err != nil {
			t.Fatalf("dev %d PostSend: %d %v", from.i, n, err)
		}
		scs := WaitWC(from.scq, len(sizes), s.f.Wait)
		for k, wc := range scs {
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend || wc.WRID != uint64(k) || wc.QPN != from.qp.Num() {
				t.Errorf("dev %d send completion %d: %+v", from.i, k, wc)
			}
		}
		rcs := WaitWC(to.rcq, len(sizes), s.f.Wait)
		if len(scs) != len(sizes) || len(rcs) != len(sizes) {
			t.Fatalf("dev %d -> %d: %d send and %d receive completions, want %d each", from.i, to.i, len(scs), len(rcs), len(sizes))
		}
		for k, wc := range rcs {
			want := pattern(sizes[k], k+from.i)
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.WRID != uint64(300+k) || wc.QPN != to.qp.Num() ||
				wc.ByteLen != sizes[k] || wc.GRH || wc.WithImm != (k == 2) || (k == 2 && wc.Imm != 0xfeedf00d) {
				t.Errorf("dev %d receive completion %d: %+v, want WRID %d, %d bytes", to.i, k, wc, 300+k, sizes[k])
				continue
			}
			if !bytes.Equal(bufs[k][:sizes[k]], want) {
				t.Errorf("dev %d message %d (%d bytes) arrived changed", to.i, k, sizes[k])
			}
		}
	}
}

// rnr: a send finding no receive buffer does not complete (the responder says
// "receiver not ready" and the requester retries, RNR retry 7 meaning forever) and
// arrives once a buffer is posted.
func (s *suite) rnr(t *testing.T) {
	a, b := s.newRC(t, 0, nil, nil), s.newRC(t, 1, nil, nil)
	s.connectRC(t, a, b, 7)
	msg := pattern(100, 9)
	if n, err := a.qp.PostSend([]verbs.SendWR{{ID: 5, Data: [][]byte{msg}, Signaled: true}}); n != 1 || err != nil {
		t.Fatalf("PostSend: %d %v", n, err)
	}
	// Without a receive buffer the message cannot be acknowledged, so no send completion
	// can come however long we wait; the arrival below shows the send was made.
	if early := WaitWC(a.scq, 1, s.f.Quiet); len(early) != 0 {
		t.Fatalf("send completed with no receive buffer posted: %+v", early)
	}
	buf := make([]byte, 256)
	if n, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 6, Buf: buf}}); n != 1 || err != nil {
		t.Fatalf("PostRecv: %d %v", n, err)
	}
	rcs := WaitWC(b.rcq, 1, s.f.Wait)
	if len(rcs) != 1 || rcs[0].Status != verbs.WCSuccess || rcs[0].WRID != 6 || rcs[0].ByteLen != len(msg) || !bytes.Equal(buf[:len(msg)], msg) {
		t.Fatalf("receive after posting the buffer: %+v", rcs)
	}
	if scs := WaitWC(a.scq, 1, s.f.Wait); len(scs) != 1 || scs[0].Status != verbs.WCSuccess || scs[0].WRID != 5 {
		t.Errorf("send completion after the receive: %+v", scs)
	}
}

// srq: two RC QPs draw their receives from one shared receive queue, in posting
// order; each completion names the QP it came in on; the QPs refuse receives of their
// own; the SRQ cannot be destroyed while they use it.
func (s *suite) srq(t *testing.T) {
	sd, ok := s.f.Dev[0].(verbs.SRQDevice)
	if !ok {
		t.Fatalf("dev 0 (%T) has no shared receive queues", s.f.Dev[0])
	}
	if _, err := sd.CreateSRQ(verbs.SRQAttr{MaxWR: 0}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("CreateSRQ with max_wr 0: %v, want ErrInvalid", err)
	}
	srq, err := sd.CreateSRQ(verbs.SRQAttr{MaxWR: 8})
	if err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			srq.Close()
		}
	})
	shared := s.cqOn(t, 0, 64)
	rx := [2]*rcEnd{s.newRC(t, 0, shared, srq), s.newRC(t, 0, shared, srq)}
	tx := [2]*rcEnd{s.newRC(t, 1, nil, nil), s.newRC(t, 1, nil, nil)}
	for k := range rx {
		s.connectRC(t, tx[k], rx[k], 7)
	}
	if _, err := rx[0].qp.PostRecv([]verbs.RecvWR{{ID: 1, Buf: make([]byte, 64)}}); err == nil {
		t.Errorf("PostRecv on a QP with a shared receive queue accepted")
	}
	bufs := map[uint64][]byte{}
	wrs := make([]verbs.RecvWR, 6)
	for k := range wrs {
		wrs[k] = verbs.RecvWR{ID: uint64(100 + k), Buf: make([]byte, 512)}
		bufs[wrs[k].ID] = wrs[k].Buf
	}
	if n, err := srq.PostRecv(wrs); n != 6 || err != nil {
		t.Fatalf("SRQ PostRecv: %d %v", n, err)
	}
	// Two messages from each sender, the second sender after the first's have arrived,
	// so the buffers they take are known: the oldest posted first.
	for k, e := range tx {
		for m := 0; m < 2; m++ {
			if n, err := e.qp.PostSend([]verbs.SendWR{{ID: uint64(m), Data: [][]byte{pattern(100+k, 10*k+m)}, Signaled: true}}); n != 1 || err != nil {
				t.Fatalf("dev 1 PostSend: %d %v", n, err)
			}
		}
		if scs := WaitWC(e.scq, 2, s.f.Wait); len(scs) != 2 {
			t.Fatalf("sender %d: send completions %+v", k, scs)
		}
		rcs := WaitWC(shared, 2, s.f.Wait)
		if len(rcs) != 2 {
			t.Fatalf("sender %d: receive completions %+v", k, rcs)
		}
		for m, wc := range rcs {
			want := pattern(100+k, 10*k+m)
			id := uint64(100 + 2*k + m)
			if wc.Status != verbs.WCSuccess || wc.QPN != rx[k].qp.Num() || wc.WRID != id || wc.ByteLen != len(want) {
				t.Errorf("sender %d message %d: %+v, want QPN %#x WRID %d %d bytes", k, m, wc, uint32(rx[k].qp.Num()), id, len(want))
			} else if !bytes.Equal(bufs[id][:len(want)], want) {
				t.Errorf("sender %d message %d arrived changed", k, m)
			}
		}
	}
	if err := srq.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("SRQ Close with two QPs using it: %v, want ErrBusy", err)
	}
	for _, e := range rx {
		if err := e.qp.Close(); err != nil {
			t.Errorf("QP Close: %v", err)
		}
	}
	if err := srq.Close(); err != nil {
		t.Errorf("SRQ Close after its QPs: %v", err)
	}
	closed = true
}
