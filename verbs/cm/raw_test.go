package cm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/mad"
)

// rawPeer speaks CM by hand from a node without a Manager, to drive one side of the
// protocol message by message.
type rawPeer struct {
	*node
	in     chan rawMAD
	probes uint32
}

type rawMAD struct {
	h   mad.Header
	msg mad.CMMessage
	b   []byte
}

func newRawPeer(t *testing.T, f *fabric, lid verbs.LID) *rawPeer {
	p := &rawPeer{node: newNode(t, f, lid, false), in: make(chan rawMAD, 256)}
	p.agent.Register(mad.ClassCM, func(_ verbs.MADSource, b []byte) []byte {
		h, msg, err := mad.ParseCM(b)
		if err != nil {
			t.Errorf("raw peer got a bad MAD: %v", err)
			return nil
		}
		p.in <- rawMAD{h, msg, bytes.Clone(b)}
		return nil
	})
	return p
}

func (p *rawPeer) send(t *testing.T, to verbs.LID, tid uint64, msg mad.CMMessage) {
	t.Helper()
	if err := p.agent.Send(to, verbs.GSIQPN, mad.NewCMMAD(tid, msg)); err != nil {
		t.Fatal(err)
	}
}

// expect returns the next MAD of attribute attr, skipping others (attr 0: any MAD).
func (p *rawPeer) expect(t *testing.T, attr uint16) rawMAD {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-p.in:
			if m.h.AttrID == attr || attr == 0 {
				if m.h.Method != mad.MethodSend || m.h.ClassVersion != 2 || m.h.MgmtClass != mad.ClassCM {
					t.Errorf("header %+v", m.h)
				}
				return m
			}
		case <-deadline:
			t.Fatalf("no MAD with attribute %#x", attr)
		}
	}
}

// sync returns the MADs that arrived from the manager at lid before it handled
// everything p sent it so far: p sends a probe, a DREQ for communication ID 0 (which no
// connection has, so the manager answers with a DREP at once and changes nothing), and
// collects what arrives until the probe's DREP. The agents handle MADs in order and the
// manager sends its immediate answers before it handles the next MAD, so whatever
// p's earlier MADs caused at once arrives before the probe's answer.
func (p *rawPeer) sync(t *testing.T, lid verbs.LID) []rawMAD {
	t.Helper()
	p.probes++
	id := 0xfeed0000 + p.probes
	p.send(t, lid, 0xfeed, &mad.CMDREQ{LocalCommID: id, RemoteCommID: 0})
	var got []rawMAD
	for {
		m := p.expect(t, 0)
		if d, ok := m.msg.(*mad.CMDREP); ok && d.RemoteCommID == id {
			return got
		}
		got = append(got, m)
	}
}

// quiet asserts that the manager at lid answered nothing p sent it since the last MAD
// p took.
func (p *rawPeer) quiet(t *testing.T, lid verbs.LID) {
	t.Helper()
	for _, m := range p.sync(t, lid) {
		t.Errorf("unexpected MAD %#x: %+v", m.h.AttrID, m.msg)
	}
}

func (p *rawPeer) req(commID uint32, qpn verbs.QPN, to *node) *mad.CMREQ {
	r := &mad.CMREQ{LocalCommID: commID, ServiceID: svc, LocalCAGUID: p.dev.guid, LocalQPN: qpn,
		RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20, StartingPSN: 0x111, RetryCount: 7,
		RNRRetryCount: 6, PKey: 0xffff, PathMTU: verbs.MTU2048, MaxCMRetries: 15,
		Primary: mad.CMPath{LocalLID: p.lid, RemoteLID: to.lid, LocalGID: p.gid, RemoteGID: to.gid,
			SubnetLocal: true, LocalACKTimeout: 18}}
	copy(r.PrivateData[:], ipoibPD(0x300))
	return r
}

func rejOf(t *testing.T, m rawMAD) *mad.CMREJ {
	t.Helper()
	r, ok := m.msg.(*mad.CMREJ)
	if !ok {
		t.Fatalf("%T, want REJ", m.msg)
	}
	return r
}

// TestPassiveByHand drives the passive side with hand-made messages.
func TestPassiveByHand(t *testing.T) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	p := newRawPeer(t, f, 3)
	l := newAcceptAll(b)
	l.srq = true // the REP says so, whatever the REQ said (the active side's QP)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}

	// REQ -> REP (with the REQ's TID; the REQ's timeouts are 4 s, so nothing here is a
	// timer's doing).
	req := p.req(0x77, 0x300, b)
	p.send(t, 2, 0xabc, req)
	rep := p.expect(t, mad.AttrCMREP)
	r := rep.msg.(*mad.CMREP)
	qpB := l.qp(0x300)
	if rep.h.TID != 0xabc || r.RemoteCommID != 0x77 || r.LocalQPN != qpB.num || r.LocalCAGUID != b.dev.guid ||
		r.RNRRetryCount != 6 || r.FailoverAccepted != mad.CMFailoverAccepted || r.LocalCommID == 0 || !r.SRQ ||
		!bytes.Equal(r.PrivateData[:8], ipoibPD(0x49)) {
		t.Errorf("REP %+v (TID %#x)", r, rep.h.TID)
	}
	if rtr := qpB.modsTo(verbs.QPRTR); len(rtr) != 1 || rtr[0].RQPSN != 0x111 || rtr[0].DestQPN != 0x300 ||
		rtr[0].AH.DLID != 3 || rtr[0].PathMTU != verbs.MTU2048 {
		t.Errorf("RTR %+v", rtr)
	}
	// A retransmitted REQ gets the same REP.
	p.send(t, 2, 0xabc, req)
	if again := p.expect(t, mad.AttrCMREP); !bytes.Equal(again.b, rep.b) {
		t.Errorf("second REP differs:\n%x\n%x", again.b, rep.b)
	}
	// An RTU for another comm ID does nothing; the right one establishes.
	p.send(t, 2, 0xabc, &mad.CMRTU{LocalCommID: 0x76, RemoteCommID: r.LocalCommID})
	p.send(t, 2, 0xabc, &mad.CMRTU{LocalCommID: 0x77, RemoteCommID: r.LocalCommID})
	bc := recv(t, l.est, "established")
	if rts := qpB.modsTo(verbs.QPRTS); len(rts) != 1 || rts[0].SQPSN != r.StartingPSN || rts[0].RetryCnt != 7 ||
		rts[0].RNRRetry != 6 || rts[0].Timeout != 18 {
		t.Errorf("RTS %+v", rts)
	}
	// Once established, the old REQ is ignored; a new REQ from the same remote QP is a
	// stale connection.
	p.send(t, 2, 0xabc, req)
	p.quiet(t, 2)
	p.send(t, 2, 0xabd, p.req(0x78, 0x300, b))
	if rej := rejOf(t, p.expect(t, mad.AttrCMREJ)); rej.Reason != mad.RejStaleConn || rej.RemoteCommID != 0x78 {
		t.Errorf("REJ %+v", rej)
	}
	// A DREQ naming another QP is ignored; the right one is answered and ends the
	// connection; its retransmission is answered from timewait.
	p.send(t, 2, 0xdd, &mad.CMDREQ{LocalCommID: 0x77, RemoteCommID: bc.LocalCommID, RemoteQPN: qpB.num + 1})
	p.quiet(t, 2)
	p.send(t, 2, 0xde, &mad.CMDREQ{LocalCommID: 0x77, RemoteCommID: bc.LocalCommID, RemoteQPN: qpB.num})
	drep := p.expect(t, mad.AttrCMDREP)
	if d := drep.msg.(*mad.CMDREP); d.LocalCommID != bc.LocalCommID || d.RemoteCommID != 0x77 || drep.h.TID != 0xde {
		t.Errorf("DREP %+v TID %#x", d, drep.h.TID)
	}
	waitDone(t, bc, "Done")
	if !errors.Is(bc.Err(), cm.ErrDisconnected) || qpB.State() != verbs.QPErr {
		t.Errorf("Err %v, QP %v", bc.Err(), qpB.State())
	}
	p.send(t, 2, 0xdf, &mad.CMDREQ{LocalCommID: 0x77, RemoteCommID: bc.LocalCommID, RemoteQPN: qpB.num})
	p.expect(t, mad.AttrCMDREP)
	// The original REQ during timewait: stale.
	p.send(t, 2, 0xabc, req)
	if rej := rejOf(t, p.expect(t, mad.AttrCMREJ)); rej.Reason != mad.RejStaleConn || rej.RemoteCommID != 0x77 {
		t.Errorf("REJ %+v", rej)
	}
	// The remote QP may connect again with a new comm ID.
	p.send(t, 2, 0xac0, p.req(0x79, 0x300, b))
	if r2 := p.expect(t, mad.AttrCMREP).msg.(*mad.CMREP); r2.RemoteCommID != 0x79 || r2.LocalCommID == r.LocalCommID {
		t.Errorf("REP %+v", r2)
	}

	// Requests the manager refuses by itself.
	for _, c := range []struct {
		name   string
		mod    func(*mad.CMREQ)
		reason mad.CMRejectReason
		ari    []byte
	}{
		{"unknown service", func(r *mad.CMREQ) { r.ServiceID++ }, mad.RejInvalidServiceID, nil},
		{"UC", func(r *mad.CMREQ) { r.TransportServiceType = mad.CMTransportUC }, mad.RejInvalidTransportType, nil},
		{"bad MTU", func(r *mad.CMREQ) { r.PathMTU = 7 }, mad.RejInvalidMTU, nil},
		{"unknown P_Key", func(r *mad.CMREQ) { r.PKey = 0x1234 }, mad.RejInvalidGID, p.gid[:]},
	} {
		r := p.req(0x100, 0x400, b)
		c.mod(r)
		p.send(t, 2, 0x5000, r)
		rej := rejOf(t, p.expect(t, mad.AttrCMREJ))
		if rej.Reason != c.reason || rej.RemoteCommID != 0x100 || rej.MessageRejected != mad.CMMsgREQ ||
			!bytes.Equal(rej.ValidARI(), c.ari) {
			t.Errorf("%s: REJ %v, remote comm ID %#x, ARI %x", c.name, rej.Reason, rej.RemoteCommID, rej.ValidARI())
		}
	}
	// Messages for unknown comm IDs: a REP is rejected (invalid comm ID), a DREQ is
	// answered, the rest ignored.
	p.send(t, 2, 0x6000, &mad.CMREP{LocalCommID: 0x55, RemoteCommID: 0xdeadbeef, LocalQPN: 0x500})
	if rej := rejOf(t, p.expect(t, mad.AttrCMREJ)); rej.Reason != mad.RejInvalidCommID ||
		rej.MessageRejected != mad.CMMsgREP || rej.RemoteCommID != 0x55 || rej.LocalCommID != 0xdeadbeef {
		t.Errorf("REJ %+v", rej)
	}
	p.send(t, 2, 0x6001, &mad.CMDREQ{LocalCommID: 0x56, RemoteCommID: 0xdeadbeef, RemoteQPN: 0x1})
	if d := p.expect(t, mad.AttrCMDREP).msg.(*mad.CMDREP); d.RemoteCommID != 0x56 || d.LocalCommID != 0xdeadbeef {
		t.Errorf("DREP %+v", d)
	}
	p.send(t, 2, 0x6002, &mad.CMRTU{LocalCommID: 0x57, RemoteCommID: 0xdeadbeef})
	p.send(t, 2, 0x6003, &mad.CMDREP{LocalCommID: 0x57, RemoteCommID: 0xdeadbeef})
	p.send(t, 2, 0x6004, &mad.CMREJ{LocalCommID: 0x57, RemoteCommID: 0xdeadbeef, Reason: mad.RejTimeout})
	p.send(t, 2, 0x6005, &mad.CMMRA{LocalCommID: 0x57, RemoteCommID: 0xdeadbeef})
	p.quiet(t, 2)
	if n := l.calls.Load(); n != 2 {
		t.Errorf("listener called %d times, want 2", n)
	}
}

// TestActiveByHand drives the active side: MRA, duplicate REP, REJ after
// establishment.
func TestActiveByHand(t *testing.T) {
	f := newFabric(t)
	a := newNode(t, f, 1, true)
	p := newRawPeer(t, f, 3)
	qp := a.dev.newQP(verbs.QPTypeRC)
	type result struct {
		c   *cm.Conn
		err error
	}
	done := make(chan result, 1)
	ctx := ctxT(t)
	go func() {
		prm := params(qp, p.node)
		prm.MaxCMRetries = 15
		c, err := a.m.Connect(ctx, prm)
		done <- result{c, err}
	}()
	reqm := p.expect(t, mad.AttrCMREQ)
	req := reqm.msg.(*mad.CMREQ)
	if req.ServiceID != svc || req.LocalQPN != qp.num || req.LocalCAGUID != a.dev.guid || req.RNRRetryCount != 3 ||
		req.RetryCount != 6 || req.PKey != 0xffff || req.PathMTU != verbs.MTU2048 || req.MaxCMRetries != 15 ||
		uint32(reqm.h.TID) != req.LocalCommID {
		t.Errorf("REQ %+v TID %#x", req, reqm.h.TID)
	}
	// The REQ is resent every CM response timeout...
	wantNext(t, f, rto, "the REQ's retransmission")
	f.clk.Advance(rto)
	if n := sentN(f, mad.AttrCMREQ); n != 2 {
		t.Fatalf("%d REQs after one timeout, want 2", n)
	}
	// ... until an MRA (service timeout 17: 4.096 µs × 2^17 ≈ 537 ms) pushes the next
	// retransmission out to the service timeout plus the response timeout; then they
	// come every response timeout again.
	p.send(t, 1, reqm.h.TID, &mad.CMMRA{LocalCommID: 0, RemoteCommID: req.LocalCommID, MessageMRAed: mad.CMMsgREQ, ServiceTimeout: 17})
	p.sync(t, 1)
	mra := mad.CMTimeout(17) + rto
	wantNext(t, f, mra, "the REQ's retransmission after the MRA")
	f.clk.Advance(mra - 1)
	if n := sentN(f, mad.AttrCMREQ); n != 2 {
		t.Fatalf("REQ resent during the MRA's service timeout (%d sent)", n)
	}
	f.clk.Advance(1)
	if n := sentN(f, mad.AttrCMREQ); n != 3 {
		t.Fatalf("%d REQs after the MRA's service timeout, want 3", n)
	}
	wantNext(t, f, rto, "the REQ's retransmission after the MRA's")

	rep := &mad.CMREP{LocalCommID: 0x99, RemoteCommID: req.LocalCommID, LocalQPN: 0x301, StartingPSN: 0x222,
		RNRRetryCount: 5, LocalCAGUID: p.dev.guid}
	copy(rep.PrivateData[:], ipoibPD(0x300))
	p.send(t, 1, reqm.h.TID, rep)
	res := recv(t, done, "Connect")
	if res.err != nil {
		t.Fatal(res.err)
	}
	c := res.c
	rtu := p.expect(t, mad.AttrCMRTU)
	if r := rtu.msg.(*mad.CMRTU); r.LocalCommID != c.LocalCommID || r.RemoteCommID != 0x99 || rtu.h.TID != reqm.h.TID {
		t.Errorf("RTU %+v TID %#x", r, rtu.h.TID)
	}
	if rts := qp.modsTo(verbs.QPRTS); len(rts) != 1 || rts[0].RNRRetry != 5 || rts[0].SQPSN != req.StartingPSN {
		t.Errorf("RTS %+v", rts)
	}
	if rtr := qp.modsTo(verbs.QPRTR); len(rtr) != 1 || rtr[0].RQPSN != 0x222 || rtr[0].DestQPN != 0x301 {
		t.Errorf("RTR %+v", rtr)
	}
	// A duplicate REP (the RTU was lost) gets the RTU again.
	p.send(t, 1, reqm.h.TID, rep)
	if again := p.expect(t, mad.AttrCMRTU); !bytes.Equal(again.b, rtu.b) {
		t.Error("resent RTU differs")
	}
	// A REJ for someone else is ignored.
	p.send(t, 1, 1, &mad.CMREJ{LocalCommID: 0x98, RemoteCommID: c.LocalCommID, Reason: mad.RejTimeout})
	p.quiet(t, 1)
	if c.Err() != nil {
		t.Fatalf("foreign REJ ended the connection: %v", c.Err())
	}
	// The peer gives up later, naming itself by CA GUID in the ARI as the kernel does
	// (no remote comm ID): the connection ends.
	rej := &mad.CMREJ{LocalCommID: 0x99, Reason: mad.RejTimeout, RejectInfoLength: 8}
	binary.BigEndian.PutUint64(rej.ARI[:], uint64(p.dev.guid))
	p.send(t, 1, 2, rej)
	waitDone(t, c, "Done")
	var re *cm.RejectError
	if !errors.As(c.Err(), &re) || re.Reason != mad.RejTimeout || len(re.ARI) != 8 {
		t.Errorf("Err %v", c.Err())
	}
	if qp.State() != verbs.QPErr {
		t.Errorf("QP %v", qp.State())
	}
}

// TestTimewait: after a connection ends the passive side keeps it for the peer's retry
// window, the longer CM response timeout of the REQ × (Max CM Retries + 1), answering
// the REQ's retransmissions as stale, and forgets it exactly then.
func TestTimewait(t *testing.T) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	p := newRawPeer(t, f, 3)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	req := p.req(0x77, 0x300, b)
	// Local 10 ms (8 µs, floored), remote 4.096 µs × 2^13 ≈ 33.6 ms: the remote one
	// is the longer.
	req.LocalCMResponseTimeout, req.RemoteCMResponseTimeout, req.MaxCMRetries = 1, 13, 2
	p.send(t, 2, 0xabc, req)
	r := p.expect(t, mad.AttrCMREP).msg.(*mad.CMREP)
	wantNext(t, f, rto, "the REP's retransmission")
	p.send(t, 2, 0xabc, &mad.CMRTU{LocalCommID: 0x77, RemoteCommID: r.LocalCommID})
	bc := recv(t, l.est, "established")
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed for an established connection", n)
	}
	p.send(t, 2, 0xde, &mad.CMDREQ{LocalCommID: 0x77, RemoteCommID: bc.LocalCommID, RemoteQPN: bc.QP.Num()})
	p.expect(t, mad.AttrCMDREP)
	waitDone(t, bc, "Done")

	twait := 3 * mad.CMTimeout(13)
	wantNext(t, f, twait, "the end of timewait")
	f.clk.Advance(twait - 1)
	p.send(t, 2, 0xabc, req)
	if rej := rejOf(t, p.expect(t, mad.AttrCMREJ)); rej.Reason != mad.RejStaleConn || rej.RemoteCommID != 0x77 {
		t.Errorf("REQ during timewait: REJ %+v", rej)
	}
	f.clk.Advance(1)
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed after timewait", n)
	}
	// Forgotten: the same REQ is a new request now.
	p.send(t, 2, 0xabc, req)
	if r2 := p.expect(t, mad.AttrCMREP).msg.(*mad.CMREP); r2.RemoteCommID != 0x77 || r2.LocalCommID == r.LocalCommID {
		t.Errorf("REQ after timewait: REP %+v (first connection's comm ID %#x)", r2, r.LocalCommID)
	}
	if n := l.calls.Load(); n != 2 {
		t.Errorf("listener called %d times, want 2", n)
	}
}
