package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// joinGroup joins port p to group k (created on the first join) with the broadcast
// group's parameters, as IPoIB joins its other groups.
func joinGroup(ctx context.Context, p *Port, mgid verbs.GID, b mad.MCMemberRecord) (mad.MCMemberRecord, error) {
	g, _ := p.GID(0)
	rec := mad.MCMemberRecord{MGID: mgid, PortGID: g, PKey: 0xffff, JoinState: mad.JoinFull,
		QKey: b.QKey, MTUSelector: mad.SelExactly, MTU: b.MTU, TClass: b.TClass,
		RateSelector: mad.SelExactly, Rate: b.Rate, SL: b.SL, FlowLabel: b.FlowLabel, HopLimit: b.HopLimit}
	return (&sa.Client{Port: p}).Join(ctx, rec, mad.IPoIBCreateJoinMask)
}

// joinBroadcast joins port p to the default partition's broadcast group as IPoIB does
// first; the other groups take its parameters.
func joinBroadcast(t *testing.T, p *Port) mad.MCMemberRecord {
	t.Helper()
	g, _ := p.GID(0)
	rec, err := (&sa.Client{Port: p}).Join(context.Background(), mad.MCMemberRecord{MGID: mustGID(t, "ff12:401b:ffff::ffff:ffff"),
		PortGID: g, PKey: 0xffff, JoinState: mad.JoinFull}, mad.IPoIBBroadcastJoinMask)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func groupMGID(k int) verbs.GID {
	var g verbs.GID
	g[0], g[1], g[2], g[3] = 0xff, 0x12, 0x60, 0x1b
	g[4], g[5] = 0xff, 0xff
	binary.BigEndian.PutUint32(g[12:], uint32(k+1))
	return g
}

// Many joins arriving together share the publishes of the forwarding tables (which
// carry every group to every port) instead of costing one each, and still every join
// is answered only after tables that hold its group went out: the joiner's port knows
// the group when the answer arrives, a second member can send to it at once, and in the
// end every port holds every group.
func TestConcurrentJoinsShareTablePublishes(t *testing.T) {
	smh, nodes := slowBeatFabric(t, "a", "b", "c")
	sm := smh.SM()
	ctx := context.Background()
	pa, pb, pc := nodes[0].SoftPort(1), nodes[1].SoftPort(1), nodes[2].SoftPort(1)
	bcast := joinBroadcast(t, pa)

	// a and b each join half of the groups, all at once.
	const joins = 2000
	before := sm.publishes.Load()
	var wg sync.WaitGroup
	errs := make(chan error, joins)
	var early atomic.Int32
	for k := range joins {
		p := pa
		if k%2 == 1 {
			p = pb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := joinGroup(ctx, p, groupMGID(k), bcast)
			if err != nil {
				errs <- err
				return
			}
			// Answered after the tables holding the group and this member: the port
			// applied them before it got the answer (both came the same way, in order).
			p.mu.RLock()
			m, ok := p.multi[rec.MLID]
			p.mu.RUnlock()
			if !ok || m.MGID != rec.MGID || !containsLID(m.Members, p.Attr().LID) {
				if early.Add(1) == 1 {
					t.Errorf("join of group %d answered before its routes reached the joiner: %+v", k, m)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := early.Load(); n > 0 {
		t.Fatalf("%d of %d joins answered before their routes", n, joins)
	}
	publishes := sm.publishes.Load() - before
	t.Logf("%d joins, %d publishes of the tables", joins, publishes)
	if publishes == 0 || publishes > joins/10 {
		t.Fatalf("%d joins caused %d publishes of the forwarding tables, want between 1 and %d", joins, publishes, joins/10)
	}

	// The last group: a is a member with a QP attached; c joins it too and sends at
	// once, without waiting for anything: the answer to c's join came after tables
	// that list a.
	last := groupMGID(joins - 1)
	if _, err := joinGroup(ctx, pa, last, bcast); err != nil {
		t.Fatal(err)
	}
	rec, err := joinGroup(ctx, pc, last, bcast)
	if err != nil {
		t.Fatal(err)
	}
	rx := newUD(t, nodes[0], 0, rec.QKey)
	if err := rx.qp.AttachMcast(last, rec.MLID); err != nil {
		t.Fatal(err)
	}
	tx := newUD(t, nodes[2], 0, rec.QKey)
	ah, err := nodes[2].CreateAH(verbs.AHAttr{Port: 1, DLID: rec.MLID, GRH: true, DGID: last})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.qp.PostSend([]verbs.SendWR{{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: rec.QKey,
		Data: [][]byte{[]byte("to the last group")}}}); err != nil {
		t.Fatal(err)
	}
	wc, ok := rx.recv(t, 5*time.Second)
	if !ok {
		t.Fatal("a send to the last-joined group did not reach its member")
	}
	if buf := rx.bufFor(wc); !bytes.Equal(buf[24:40], last[:]) || !bytes.Equal(buf[40:40+17], []byte("to the last group")) {
		t.Fatalf("received %q", buf[:40+17])
	}

	// Every port ends up with every group, the members as the SA has them.
	want := map[verbs.LID]int{}
	for _, g := range sm.DB().Groups() {
		want[g.MLID] = len(g.Members)
	}
	if len(want) < joins+1 {
		t.Fatalf("the SA has %d groups", len(want))
	}
	for _, h := range append([]*HCA{smh}, nodes...) {
		p := h.SoftPort(1)
		waitFor(t, h.Name()+"'s tables with every group", func() bool {
			p.mu.RLock()
			defer p.mu.RUnlock()
			if len(p.multi) != len(want) {
				return false
			}
			for l, n := range want {
				if len(p.multi[l].Members) != n {
					return false
				}
			}
			return true
		})
	}
}

// slowBeatFabric is fabric with the default heartbeat: a burst of thousands of SA
// requests (slower still under the race detector) can hold hellos up in the SM's
// queue longer than the 8 beats of testHB after which the SM drops a port.
func slowBeatFabric(t *testing.T, names ...string) (*HCA, []*HCA) {
	t.Helper()
	n := NewMemNetwork()
	smh, err := New(Config{Name: "sm", Network: n, HostSM: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	var nodes []*HCA
	for _, name := range names {
		h, err := New(Config{Name: name, Network: n, SM: smh.Endpoint(1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		nodes = append(nodes, h)
	}
	for _, h := range append([]*HCA{smh}, nodes...) {
		waitFor(t, h.Name()+" port 1 ACTIVE with routes", func() bool {
			p := h.SoftPort(1)
			p.mu.RLock()
			defer p.mu.RUnlock()
			return p.attr.State == verbs.PortActive && len(p.uni) == len(names)+1
		})
	}
	return smh, nodes
}

func containsLID(ls []verbs.LID, l verbs.LID) bool {
	for _, x := range ls {
		if x == l {
			return true
		}
	}
	return false
}

// A publish arranged while the publisher is idle goes out without another change to
// wake it, and closing the SM stops the publisher (the package's TestMain checks no
// goroutine is left) and releases whoever waits for a publish.
func TestPublishLastChangeAndClose(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a")
	sm := smh.SM()
	sm.mu.Lock()
	v0 := sm.routesV
	sm.mu.Unlock()
	if err := sm.SetFaults(Faults{Delay: time.Microsecond}); err != nil {
		t.Fatal(err)
	}
	// SetFaults returns once the tables carrying the faults went out; the SM's own
	// port applies them on the way.
	if f := smh.SoftPort(1).ep.faults.Load(); f == nil || f.Delay != time.Microsecond {
		t.Fatalf("SM port faults %+v after SetFaults", f)
	}
	waitFor(t, "the faults at a", func() bool {
		f := nodes[0].SoftPort(1).ep.faults.Load()
		return f != nil && f.Delay == time.Microsecond
	})
	own := smh.SoftPort(1)
	own.mu.RLock()
	ov := own.routesV
	own.mu.RUnlock()
	if ov <= v0 {
		t.Fatalf("routes version %d before SetFaults, the SM's port has %d after it returned", v0, ov)
	}
	smh.Close()
	sm.mu.Lock()
	sm.routesV++ // a change nobody will publish: publish must not wait for it
	sm.mu.Unlock()
	sm.publish()
}
