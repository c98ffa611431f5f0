package cm_test

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/mad"
)

// A peer's REQ sets the passive side's timers. These tests send REQs with the largest
// values the fields hold (CM response timeouts 31, 4.096 µs × 2^31 ≈ 2.4 h; Max CM
// Retries 15) and check the documented bounds: 8.6 s per try (exponent 21), and a
// record the peer never completes gone within 34 tries.
var (
	maxTry      = mad.CMTimeout(21)
	recordBound = 34 * maxTry // ≈ 292 s
)

// slowReq is a REQ from p asking for the longest timeouts and the most retries.
func slowReq(p *rawPeer, commID uint32, qpn verbs.QPN, to *node) *mad.CMREQ {
	r := p.req(commID, qpn, to)
	r.LocalCMResponseTimeout, r.RemoteCMResponseTimeout, r.MaxCMRetries = 31, 31, 15
	return r
}

// records returns the manager's records and its half-open ones, checking that its
// running count of the latter agrees with its records.
func records(t *testing.T, m *cm.Manager) (all, halfOpen int) {
	t.Helper()
	all, halfOpen, now, _ := m.Records()
	if halfOpen != now {
		t.Fatalf("half-open count %d, but %d records are half open", halfOpen, now)
	}
	if !m.SourceCountsAgree() {
		t.Fatal("the per-source half-open counts differ from the records")
	}
	return all, halfOpen
}

// TestNeverCompletedREQBounded: a REQ with the largest timeouts whose REP is never
// answered, and two MRAs with the largest service timeout, keep the record no longer
// than the documented bound: the REP is resent every 8.6 s, the first MRA adds at most
// two tries, the second none, and timewait lasts 16 tries. In timewait the record no
// longer holds the QP or the listener's callbacks.
func TestNeverCompletedREQBounded(t *testing.T) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	p := newRawPeer(t, f, 3)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	start := f.clk.Now()
	p.send(t, 2, 0xabc, slowReq(p, 0x77, 0x300, b))
	rep := p.expect(t, mad.AttrCMREP).msg.(*mad.CMREP)
	wantNext(t, f, maxTry, "the REP's retransmission")
	f.clk.Advance(15 * maxTry)
	if n := sentN(f, mad.AttrCMREP); n != 16 {
		t.Fatalf("%d REPs after 15 tries, want 1 + 15", n)
	}
	f.clk.Advance(maxTry - 1) // just before giving up
	mra := &mad.CMMRA{LocalCommID: 0x77, RemoteCommID: rep.LocalCommID, MessageMRAed: mad.CMMsgREP, ServiceTimeout: 31}
	p.send(t, 2, 0xabc, mra)
	p.sync(t, 2)
	wantNext(t, f, 2*maxTry, "the wait after an MRA (service timeout clamped, plus one try)")
	f.clk.Advance(maxTry)
	p.send(t, 2, 0xabc, mra) // only the first MRA counts
	p.sync(t, 2)
	wantNext(t, f, maxTry, "the wait after a second MRA")
	f.clk.Advance(maxTry)
	if err := recv(t, l.failed, "Failed"); !errors.Is(err, verbs.ErrTimeout) {
		t.Errorf("Failed(%v), want ErrTimeout", err)
	}
	if rej := rejOf(t, p.expect(t, mad.AttrCMREJ)); rej.Reason != mad.RejTimeout {
		t.Errorf("REJ %v, want timeout", rej.Reason)
	}
	if all, half := records(t, b.m); all != 1 || half != 1 {
		t.Errorf("%d records (%d half open) in timewait, want 1", all, half)
	}
	if n := b.m.TimewaitHeld(); n != 0 {
		t.Errorf("%d records in timewait still hold the QP, callbacks or buffers", n)
	}
	wantNext(t, f, 16*maxTry, "the end of timewait")
	f.clk.Advance(16 * maxTry)
	if all, _ := records(t, b.m); all != 0 {
		t.Errorf("%d records after %v", all, f.clk.Since(start))
	}
	if d := f.clk.Since(start); d > recordBound {
		t.Errorf("record lived %v, more than the bound %v", d, recordBound)
	}
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed after timewait", n)
	}
}

// TestRejectedREQTimewaitBounded: a REQ the listener rejects is kept one (clamped)
// CM response timeout to answer its retransmissions with the same REJ, holding
// nothing of the listener's, and then forgotten.
func TestRejectedREQTimewaitBounded(t *testing.T) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	p := newRawPeer(t, f, 3)
	var calls atomic.Int32
	if _, err := b.m.Listen(svc, func(*cm.Request) cm.Decision {
		calls.Add(1)
		return cm.Reject{Reason: mad.RejConsumerDefined}
	}); err != nil {
		t.Fatal(err)
	}
	req := slowReq(p, 0x77, 0x300, b)
	p.send(t, 2, 0xabc, req)
	rej := p.expect(t, mad.AttrCMREJ)
	if r := rejOf(t, rej); r.Reason != mad.RejConsumerDefined {
		t.Fatalf("REJ %v", r.Reason)
	}
	wantNext(t, f, maxTry, "the end of the rejected REQ's timewait")
	if all, half := records(t, b.m); all != 1 || half != 1 {
		t.Errorf("%d records (%d half open), want 1", all, half)
	}
	if n := b.m.TimewaitHeld(); n != 0 {
		t.Errorf("%d records in timewait still hold the QP, callbacks or buffers", n)
	}
	// A retransmission of the REQ gets the same REJ, without asking the listener.
	f.clk.Advance(maxTry - 1)
	p.send(t, 2, 0xabc, req)
	if again := p.expect(t, mad.AttrCMREJ); !bytes.Equal(again.b, rej.b) {
		t.Errorf("REJ from timewait differs:\n%x\n%x", again.b, rej.b)
	}
	f.clk.Advance(1)
	if all, _ := records(t, b.m); all != 0 {
		t.Errorf("%d records after the rejected REQ's timewait", all)
	}
	if n := f.clk.Armed(); n != 0 {
		t.Errorf("%d timers armed after timewait", n)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("listener called %d times, want 1", n)
	}
}

// TestPassiveDisconnectBounded: Disconnect of a passive connection whose peer asked
// for the largest timeouts and never answers the DREQ returns after at most 16 tries
// of 8.6 s.
func TestPassiveDisconnectBounded(t *testing.T) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	p := newRawPeer(t, f, 3)
	l := newAcceptAll(b)
	if _, err := b.m.Listen(svc, l.handle); err != nil {
		t.Fatal(err)
	}
	p.send(t, 2, 0xabc, slowReq(p, 0x77, 0x300, b))
	rep := p.expect(t, mad.AttrCMREP).msg.(*mad.CMREP)
	p.send(t, 2, 0xabc, &mad.CMRTU{LocalCommID: 0x77, RemoteCommID: rep.LocalCommID})
	bc := recv(t, l.est, "established")
	if all, half := records(t, b.m); all != 1 || half != 0 {
		t.Errorf("%d records (%d half open) once established, want 1 (0)", all, half)
	}
	disc := make(chan error, 1)
	go func() { disc <- bc.Disconnect() }()
	waitSent(t, f, mad.AttrCMDREQ, 1)
	wantNext(t, f, maxTry, "the DREQ's retransmission")
	f.clk.Advance(16*maxTry - 1)
	notYet(t, disc, "Disconnect returned")
	f.clk.Advance(1)
	if err := recv(t, disc, "Disconnect"); !errors.Is(err, verbs.ErrTimeout) {
		t.Errorf("Disconnect: %v, want ErrTimeout", err)
	}
	if n := sentN(f, mad.AttrCMDREQ); n != 16 {
		t.Errorf("%d DREQs, want 1 + 15", n)
	}
	if n := b.m.TimewaitHeld(); n != 0 {
		t.Errorf("%d records in timewait still hold the QP, callbacks or buffers", n)
	}
}

// TestHalfOpenCap: a flood of REQs with fresh communication IDs and QPNs that never
// complete makes no more records than the cap (lowered to 64 here); the REQs beyond
// are rejected with "no resources" and reach no listener. Records in timewait still
// count; within the bound they are all forgotten and REQs are accepted again.
func TestHalfOpenCap(t *testing.T) { floodHalfOpen(t, 64, true) }

// TestHalfOpenCapDefault floods a manager with the default cap, MaxHalfOpen.
func TestHalfOpenCapDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("4096 records on the mock clock take seconds")
	}
	floodHalfOpen(t, 0, false)
}

// floodHalfOpen sends limit + 100 never-completed REQs with fresh communication IDs
// and QPNs to a manager with its cap lowered to limit (0: the default) and checks that
// limit of them make records, the rest get a REJ (no resources) and reach no
// listener. With lifecycle it then lets the records give up (they still count in
// timewait) and expire, within the bound, and checks that a REQ is accepted again.
func floodHalfOpen(t *testing.T, limit int, lifecycle bool) {
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	if limit == 0 {
		limit = cm.MaxHalfOpen
		b.m.SetMaxHalfOpenPerSource(limit) // the whole cap from one peer (TestHalfOpenPerSource: a quarter)
	} else {
		b.m.SetMaxHalfOpen(limit)
	}
	p := &rawPeer{node: newNode(t, f, 3, false)}
	var mu sync.Mutex
	var reps, noRes, other int
	p.agent.Register(mad.ClassCM, func(_ verbs.MADSource, m []byte) []byte {
		_, msg, err := mad.ParseCM(m)
		mu.Lock()
		defer mu.Unlock()
		switch msg := msg.(type) {
		case *mad.CMREP:
			reps++
		case *mad.CMREJ:
			if msg.Reason == mad.RejNoResources && msg.MessageRejected == mad.CMMsgREQ {
				noRes++
			} else {
				other++
			}
		default:
			if err != nil {
				t.Errorf("bad MAD: %v", err)
			}
			other++
		}
		return nil
	})
	waitAnswers := func(what string, cond func(reps, noRes, other int) bool) {
		t.Helper()
		f.waitFor(what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return cond(reps, noRes, other)
		})
	}
	// The mass retransmissions and REJs when the records give up would overflow the
	// fake fabric's queues: drop what b sends while they happen, and at the end.
	var quiet atomic.Bool
	f.setFilter(func(from, _ verbs.LID, _ uint16, _ int) int {
		if from == 2 && quiet.Load() {
			return 0
		}
		return 1
	})
	t.Cleanup(func() { quiet.Store(true) }) // runs before the managers close
	var calls atomic.Int32
	if _, err := b.m.Listen(svc, func(*cm.Request) cm.Decision {
		calls.Add(1)
		return cm.Accept{QP: b.dev.newQP(verbs.QPTypeRC)}
	}); err != nil {
		t.Fatal(err)
	}

	const extra = 100
	n := limit + extra
	sent := 0
	for sent < n {
		// In batches that fit the fake fabric's queues; each REQ is answered (by the
		// listener's REP or the manager's REJ) before the next batch.
		for range min(256, n-sent) {
			id := uint32(0x10000 + sent)
			p.send(t, 2, uint64(id), slowReq(p, id, verbs.QPN(id), b))
			sent++
		}
		waitAnswers("answers to the REQs", func(r, nr, o int) bool { return r+nr+o == sent })
	}
	mu.Lock()
	r, nr, o := reps, noRes, other
	mu.Unlock()
	if r != limit || nr != extra || o != 0 {
		t.Errorf("%d REPs, %d REJs (no resources), %d other answers; want %d, %d, 0", r, nr, o, limit, extra)
	}
	if all, half := records(t, b.m); all != limit || half != limit {
		t.Errorf("%d records (%d half open), want %d", all, half, limit)
	}
	if _, _, _, over := b.m.Records(); over != extra {
		t.Errorf("%d REQs counted over the limit, want %d", over, extra)
	}
	if c := int(calls.Load()); c != limit {
		t.Errorf("listener called %d times, want %d", c, limit)
	}
	if !lifecycle {
		return
	}

	// After 16 tries the records give up and go to timewait, where they still count.
	quiet.Store(true)
	f.clk.Advance(16 * maxTry)
	quiet.Store(false)
	if all, half := records(t, b.m); all != limit || half != limit {
		t.Errorf("%d records (%d half open) in timewait, want %d", all, half, limit)
	}
	if n := b.m.TimewaitHeld(); n != 0 {
		t.Errorf("%d records in timewait still hold the QP, callbacks or buffers", n)
	}
	p.send(t, 2, 0x1, slowReq(p, 0x1, 0x1, b))
	waitAnswers("a REJ (no resources)", func(_, nr, _ int) bool { return nr == extra+1 })

	// Within the bound they are all forgotten, and a REQ is accepted again.
	quiet.Store(true)
	f.clk.Advance(recordBound - 16*maxTry)
	quiet.Store(false)
	if all, half := records(t, b.m); all != 0 || half != 0 {
		t.Errorf("%d records (%d half open) after %v, want none", all, half, recordBound)
	}
	p.send(t, 2, 0x2, slowReq(p, 0x2, 0x2, b))
	waitAnswers("the REP to a REQ", func(r, _, _ int) bool { return r == limit+1 })
	if all, half := records(t, b.m); all != 1 || half != 1 {
		t.Errorf("%d records (%d half open), want 1", all, half)
	}
}

// TestHalfOpenPerSource: one peer's REQs make at most the per-source share of the
// half-open records (the rest get a REJ, no resources), and another peer still gets
// its own share.
func TestHalfOpenPerSource(t *testing.T) {
	const share, extra = 8, 4
	f := newFabric(t)
	b := newNode(t, f, 2, true)
	b.m.SetMaxHalfOpen(64)
	b.m.SetMaxHalfOpenPerSource(share)
	if _, err := b.m.Listen(svc, func(*cm.Request) cm.Decision {
		return cm.Accept{QP: b.dev.newQP(verbs.QPTypeRC)}
	}); err != nil {
		t.Fatal(err)
	}
	var quiet atomic.Bool // the records' retransmissions when the test ends
	f.setFilter(func(from, _ verbs.LID, _ uint16, _ int) int {
		if from == 2 && quiet.Load() {
			return 0
		}
		return 1
	})
	t.Cleanup(func() { quiet.Store(true) })
	for k, lid := range []verbs.LID{3, 4} {
		p := &rawPeer{node: newNode(t, f, lid, false)}
		var reps, noRes, other atomic.Int32
		p.agent.Register(mad.ClassCM, func(_ verbs.MADSource, m []byte) []byte {
			_, msg, _ := mad.ParseCM(m)
			switch msg := msg.(type) {
			case *mad.CMREP:
				reps.Add(1)
			case *mad.CMREJ:
				if msg.Reason == mad.RejNoResources {
					noRes.Add(1)
				} else {
					other.Add(1)
				}
			default:
				other.Add(1)
			}
			return nil
		})
		for n := range share + extra {
			id := uint32(0x10000*(k+1) + n)
			p.send(t, 2, uint64(id), slowReq(p, id, verbs.QPN(id), b))
		}
		f.waitFor("answers", func() bool { return int(reps.Load()+noRes.Load()+other.Load()) == share+extra })
		if r, nr, o := reps.Load(), noRes.Load(), other.Load(); r != share || nr != extra || o != 0 {
			t.Errorf("peer LID %d: %d REPs, %d REJs (no resources), %d other; want %d, %d, 0", lid, r, nr, o, share, extra)
		}
	}
	if all, half := records(t, b.m); all != 2*share || half != 2*share {
		t.Errorf("%d records (%d half open), want %d", all, half, 2*share)
	}
}
