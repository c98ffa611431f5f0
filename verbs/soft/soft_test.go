package soft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
	"ipoibfs/verbs/soft/partitions"
)

const testHB = 20 * time.Millisecond

func mustParts(t testing.TB, conf string) *partitions.Config {
	t.Helper()
	c, err := partitions.Parse("test.conf", strings.NewReader(conf))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fabric starts an in-process fabric: node "sm" hosts the subnet manager, the others join.
func fabric(t testing.TB, conf string, names ...string) (*MemNetwork, *HCA, []*HCA) {
	t.Helper()
	return fabricOn(t, nil, conf, names...)
}

// fabricOn is fabric with every HCA on clk (nil: the real clock).
func fabricOn(t testing.TB, clk clock.Clock, conf string, names ...string) (*MemNetwork, *HCA, []*HCA) {
	t.Helper()
	n := NewMemNetwork()
	var parts *partitions.Config
	if conf != "" {
		parts = mustParts(t, conf)
	}
	smh, err := New(Config{Name: "sm", Network: n, HostSM: true, Partitions: parts, Heartbeat: testHB, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	var nodes []*HCA
	for _, name := range names {
		h, err := New(Config{Name: name, Network: n, SM: smh.Endpoint(1), Heartbeat: testHB, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		nodes = append(nodes, h)
	}
	for _, h := range append([]*HCA{smh}, nodes...) {
		waitFor(t, fmt.Sprintf("%s port 1 ACTIVE with routes", h.Name()), func() bool {
			p := h.SoftPort(1)
			p.mu.RLock()
			defer p.mu.RUnlock()
			return p.attr.State == verbs.PortActive && len(p.uni) == len(names)+1
		})
	}
	return n, smh, nodes
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type udEnd struct {
	qp       verbs.QP
	scq, rcq verbs.CQ
	h        *HCA
	bufs     []verbs.RecvWR
}

func newUD(t testing.TB, h *HCA, pkeyIndex int, qkey uint32) *udEnd {
	t.Helper()
	e, err := openUD(h, pkeyIndex, qkey)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// openUD creates a UD QP in RTS on port 1 with 64 posted 4 KB receive buffers.
func openUD(h *HCA, pkeyIndex int, qkey uint32) (*udEnd, error) {
	scq, _ := h.CreateCQ(verbs.CQAttr{Entries: 256})
	rcq, _ := h.CreateCQ(verbs.CQAttr{Entries: 256})
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: 1, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 128, MaxRecvWR: 128})
	if err != nil {
		return nil, err
	}
	if err := verbs.UDToRTS(qp, pkeyIndex, qkey); err != nil {
		return nil, err
	}
	bufs := make([]verbs.RecvWR, 64)
	for i := range bufs {
		bufs[i] = verbs.RecvWR{ID: uint64(i), Buf: make([]byte, 4096+40)}
	}
	if _, err := qp.PostRecv(bufs); err != nil {
		return nil, err
	}
	return &udEnd{qp: qp, scq: scq, rcq: rcq, h: h, bufs: bufs}, nil
}

func (e *udEnd) lid() verbs.LID { return e.h.SoftPort(1).Attr().LID }

func (e *udEnd) send(t testing.TB, dlid verbs.LID, dqp verbs.QPN, qkey uint32, data []byte) {
	t.Helper()
	ah, err := e.h.CreateAH(verbs.AHAttr{Port: 1, DLID: dlid})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.qp.PostSend([]verbs.SendWR{{ID: 7, AH: ah, RemoteQPN: dqp, RemoteQKey: qkey, Data: [][]byte{data}, Signaled: true}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WC, 4)
	waitFor(t, "send completion", func() bool { return e.scq.Poll(wc) > 0 })
	if wc[0].Status != verbs.WCSuccess || wc[0].WRID != 7 {
		t.Fatalf("send completion %+v", wc[0])
	}
}

// recv waits up to d for one receive completion; ok=false if none arrived.
func (e *udEnd) recv(t testing.TB, d time.Duration) (verbs.WC, bool) {
	t.Helper()
	wc := make([]verbs.WC, 1)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if e.rcq.Poll(wc) == 1 {
			return wc[0], true
		}
		time.Sleep(time.Millisecond)
	}
	return verbs.WC{}, false
}

func TestPortsComeUpWithLIDsAndPKeys(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	seen := map[verbs.LID]bool{}
	for _, h := range append([]*HCA{smh}, nodes...) {
		a := h.SoftPort(1).Attr()
		if a.LID == 0 || seen[a.LID] || a.SMLID != smh.SoftPort(1).Attr().LID {
			t.Fatalf("%s: LID %#x SM LID %#x (seen %v)", h.Name(), a.LID, a.SMLID, seen)
		}
		seen[a.LID] = true
		if got := h.SoftPort(1).PKeyTable(); len(got) == 0 || got[0] != 0xffff {
			t.Fatalf("%s: P_Key table %v, want 0xffff at index 0", h.Name(), got)
		}
	}
	if smh.SoftPort(1).Attr().LID != 1 {
		t.Fatalf("SM port LID %#x, want 1", smh.SoftPort(1).Attr().LID)
	}
}

func TestUDExchange(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	a, b := newUD(t, nodes[0], 0, 0x0b1b), newUD(t, nodes[1], 0, 0x0b1b)
	msg := bytes.Repeat([]byte("ipoib"), 400)
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, msg)
	wc, ok := b.recv(t, 2*time.Second)
	if !ok {
		t.Fatal("no receive completion")
	}
	if wc.Status != verbs.WCSuccess || wc.SrcQP != a.qp.Num() || wc.SLID != a.lid() || !wc.GRH || wc.ByteLen != 40+len(msg) {
		t.Fatalf("receive completion %+v", wc)
	}
	// The GRH carries the sender's and our GIDs.
	ga, _ := nodes[0].SoftPort(1).GID(0)
	gb, _ := nodes[1].SoftPort(1).GID(0)
	buf := b.bufFor(wc)
	if !bytes.Equal(buf[8:24], ga[:]) || !bytes.Equal(buf[24:40], gb[:]) || !bytes.Equal(buf[40:wc.ByteLen], msg) {
		t.Fatalf("GRH/payload mismatch")
	}
}

// bufFor returns the receive buffer a completion names.
func (e *udEnd) bufFor(wc verbs.WC) []byte { return e.bufs[wc.WRID].Buf }

func TestQKeyViolationDroppedAndCounted(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	a, b := newUD(t, nodes[0], 0, 0x0b1b), newUD(t, nodes[1], 0, 0x0b1b)
	a.send(t, b.lid(), b.qp.Num(), 0x1234, []byte("wrong qkey"))
	waitFor(t, "bad Q_Key counter", func() bool { return nodes[1].SoftPort(1).Counters().BadQKey == 1 })
	if _, ok := b.recv(t, 50*time.Millisecond); ok {
		t.Fatal("packet with the wrong Q_Key was delivered")
	}
	if got := nodes[1].SoftPort(1).Attr().QKeyViolCnt; got != 1 {
		t.Fatalf("QKeyViolCnt %d", got)
	}
}

func TestPKeyRules(t *testing.T) {
	ga, gb, gc := GUIDFromName("a", 1), GUIDFromName("b", 1), GUIDFromName("c", 1)
	conf := fmt.Sprintf("Default=0x7fff, ipoib : ALL=full;\nP1=0x8001, ipoib : %#x=limited, %#x=limited, %#x=full;\nP2=0x0002 : %#x=full;\n", uint64(ga), uint64(gb), uint64(gc), uint64(ga))
	_, _, nodes := fabric(t, conf, "a", "b", "c")
	ix := func(h *HCA, k verbs.PKey) int {
		i, ok := h.SoftPort(1).FindPKey(k)
		if !ok {
			t.Fatalf("%s: P_Key %v not in table %v", h.Name(), k, h.SoftPort(1).PKeyTable())
		}
		return i
	}
	a := newUD(t, nodes[0], ix(nodes[0], 0x0001), 0x0b1b)
	b := newUD(t, nodes[1], ix(nodes[1], 0x0001), 0x0b1b)
	c := newUD(t, nodes[2], ix(nodes[2], 0x8001), 0x0b1b)
	if k := nodes[0].SoftPort(1).PKeyTable()[ix(nodes[0], 0x0001)]; k != 0x0001 {
		t.Fatalf("limited member holds %v", k)
	}
	// limited <-> limited: dropped at the receiver as a P_Key violation.
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, []byte("limited to limited"))
	waitFor(t, "bad P_Key counter on b", func() bool { return nodes[1].SoftPort(1).Counters().BadPKey == 1 })
	if _, ok := b.recv(t, 50*time.Millisecond); ok {
		t.Fatal("limited member reached another limited member")
	}
	// limited <-> full works both ways.
	a.send(t, c.lid(), c.qp.Num(), 0x0b1b, []byte("limited to full"))
	if _, ok := c.recv(t, 2*time.Second); !ok {
		t.Fatal("limited -> full not delivered")
	}
	c.send(t, a.lid(), a.qp.Num(), 0x0b1b, []byte("full to limited"))
	if _, ok := a.recv(t, 2*time.Second); !ok {
		t.Fatal("full -> limited not delivered")
	}
	// c is not in partition 2: a's QP on 0x8002 cannot reach c's default-partition QP.
	a2 := newUD(t, nodes[0], ix(nodes[0], 0x8002), 0x0b1b)
	cd := newUD(t, nodes[2], 0, 0x0b1b)
	a2.send(t, cd.lid(), cd.qp.Num(), 0x0b1b, []byte("other partition"))
	waitFor(t, "bad P_Key counter on c", func() bool { return nodes[2].SoftPort(1).Counters().BadPKey == 1 })
}

func TestPartitionReloadEvent(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a")
	ev, cancel := nodes[0].Subscribe(16)
	defer cancel()
	smh.SM().SetPartitions(mustParts(t, "Default=0x7fff, ipoib : ALL=full;\nP5=0x0005, ipoib : ALL=full;\n"))
	waitForEvent(t, ev, verbs.EventPKeyChange)
	tab := nodes[0].SoftPort(1).PKeyTable()
	if len(tab) != 2 || tab[0] != 0xffff || tab[1] != 0x8005 {
		t.Fatalf("P_Key table after reload %v", tab)
	}
	if _, ok := smh.SM().DB().Group(mustGID(t, "ff12:401b:8005::ffff:ffff")); !ok {
		t.Fatal("no broadcast group for the new partition")
	}
}

func waitForEvent(t testing.TB, ch <-chan verbs.Event, want verbs.EventType) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-ch:
			if e.Type == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %v event", want)
		}
	}
}

func mustGID(t testing.TB, s string) verbs.GID {
	g, err := verbs.ParseGID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestMulticastJoinAndDelivery(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b", "c")
	ctx := context.Background()
	bcast := mustGID(t, "ff12:401b:ffff::ffff:ffff")
	var ends []*udEnd
	for _, h := range nodes[:2] {
		p := h.SoftPort(1)
		g, _ := p.GID(0)
		cl := &sa.Client{Port: p}
		rec, err := cl.Join(ctx, mad.MCMemberRecord{MGID: bcast, PortGID: g, PKey: 0xffff, JoinState: mad.JoinFull}, mad.IPoIBBroadcastJoinMask)
		if err != nil {
			t.Fatalf("%s join: %v", h.Name(), err)
		}
		if rec.QKey != 0x0b1b || rec.MTU != verbs.MTU2048 || !rec.MLID.IsMulticast() {
			t.Fatalf("join answer %+v", rec)
		}
		e := newUD(t, h, 0, rec.QKey)
		if err := e.qp.AttachMcast(bcast, rec.MLID); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, e)
	}
	mlid, _ := nodes[0].SoftPort(1).mlid(bcast)
	// Wait until the SM published both members to the sender.
	waitFor(t, "multicast route with 2 members", func() bool {
		p := nodes[2].SoftPort(1)
		p.mu.RLock()
		defer p.mu.RUnlock()
		return len(p.multi[mlid].Members) == 2
	})
	// c is not a member but sends to the group (as a send-only sender would).
	sender := newUD(t, nodes[2], 0, 0x0b1b)
	ah, err := nodes[2].CreateAH(verbs.AHAttr{Port: 1, DLID: mlid, GRH: true, DGID: bcast})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sender.qp.PostSend([]verbs.SendWR{{AH: ah, RemoteQPN: verbs.MulticastQPN, RemoteQKey: 0x0b1b, Data: [][]byte{[]byte("to all")}}}); err != nil {
		t.Fatal(err)
	}
	for i, e := range ends {
		wc, ok := e.recv(t, 2*time.Second)
		if !ok {
			t.Fatalf("member %d got nothing", i)
		}
		if buf := e.bufFor(wc); !bytes.Equal(buf[24:40], bcast[:]) {
			t.Fatalf("member %d: GRH DGID %x, want the MGID", i, buf[24:40])
		}
	}
	// Leave: b stops receiving.
	pb := nodes[1].SoftPort(1)
	gb, _ := pb.GID(0)
	if err := (&sa.Client{Port: pb}).Leave(ctx, mad.MCMemberRecord{MGID: bcast, PortGID: gb, JoinState: mad.JoinFull}, mad.LeaveMask); err != nil {
		t.Fatal(err)
	}
	var se *sa.StatusError
	if err := (&sa.Client{Port: pb}).Leave(ctx, mad.MCMemberRecord{MGID: bcast, PortGID: gb, JoinState: mad.JoinFull}, mad.LeaveMask); !errors.As(err, &se) || se.Status != mad.StatusSAReqInvalid {
		t.Fatalf("second leave: %v, want status 0x0200", err)
	}
	waitFor(t, "multicast route with 1 member", func() bool {
		p := nodes[2].SoftPort(1)
		p.mu.RLock()
		defer p.mu.RUnlock()
		return len(p.multi[mlid].Members) == 1
	})
}

func (p *Port) mlid(g verbs.GID) (verbs.LID, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	l, ok := p.mgidLID[g]
	return l, ok
}

func TestPathRecordAndClassPortInfo(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	pa, pb := nodes[0].SoftPort(1), nodes[1].SoftPort(1)
	ga, _ := pa.GID(0)
	gb, _ := pb.GID(0)
	cl := &sa.Client{Port: pa}
	pr, err := cl.PathRecord(context.Background(), ga, gb, 0xffff, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pr.DLID != pb.Attr().LID || pr.SLID != pa.Attr().LID || pr.PKey != 0xffff || pr.MTU != verbs.MTU4096 {
		t.Fatalf("path record %+v", pr)
	}
	var se *sa.StatusError
	if _, err := cl.PathRecord(context.Background(), ga, gb, 0x8123, 0); !errors.As(err, &se) {
		t.Fatalf("path in a partition nobody has: %v", err)
	}
	cpi, err := cl.ClassPortInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cpi.BaseVersion != 1 || cpi.ClassVersion != 2 || cpi.CapabilityMask2&mad.CapMask2SendOnlyFullMemberSupport == 0 {
		t.Fatalf("ClassPortInfo %+v", cpi)
	}
}

func TestSMRestartMakesPortsReregister(t *testing.T) {
	n := NewMemNetwork()
	smAddr := netip.MustParseAddrPort("127.0.0.1:4791")
	start := func() *HCA {
		h, err := New(Config{Name: "sm", Network: n, Listen: smAddr, HostSM: true, Heartbeat: testHB})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	smh := start()
	logs := &lockedBuffer{}
	node, err := New(Config{Name: "a", Network: n, SM: smAddr, Heartbeat: testHB, Logger: log.New(logs, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	waitFor(t, "port active", func() bool { return node.SoftPort(1).Attr().State == verbs.PortActive })
	ev, cancel := node.Subscribe(16)
	defer cancel()
	smh.Close()
	// The SM comes back only after the node has noticed it was gone.
	waitFor(t, "the node noticing the SM's silence", func() bool {
		return strings.Contains(logs.String(), "no answer from the subnet manager at "+smAddr.String()+" for ")
	})
	if node.SoftPort(1).Attr().State != verbs.PortActive {
		t.Fatal("port left ACTIVE when its SM went silent (an IB port stays ACTIVE)")
	}
	smh = start()
	defer smh.Close()
	waitForEvent(t, ev, verbs.EventClientReregister)
	if node.SoftPort(1).Attr().State != verbs.PortActive {
		t.Fatal("port not active after the SM came back")
	}
	waitFor(t, "the SM's return logged", func() bool { return strings.Contains(logs.String(), "answers after") })
}

func TestFaultInjection(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	a, b := newUD(t, nodes[0], 0, 0x0b1b), newUD(t, nodes[1], 0, 0x0b1b)
	if err := smh.SM().SetFaults(Faults{Loss: 1.5}); err == nil {
		t.Fatal("loss 1.5 accepted")
	}
	if err := smh.SM().SetFaults(Faults{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "faults reach the sender", func() bool { return nodes[0].SoftPort(1).ep.faults.Load() != nil })
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, []byte("lost"))
	if _, ok := b.recv(t, 50*time.Millisecond); ok {
		t.Fatal("delivered with 100% loss")
	}
	if err := smh.SM().SetFaults(Faults{Dup: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "dup setting", func() bool {
		f := nodes[0].SoftPort(1).ep.faults.Load()
		return f != nil && f.Dup == 1
	})
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, []byte("twice"))
	for i := 0; i < 2; i++ {
		if _, ok := b.recv(t, 2*time.Second); !ok {
			t.Fatalf("copy %d missing with 100%% duplication", i+1)
		}
	}
}

func TestGarbageIsCountedAndDropped(t *testing.T) {
	n, _, nodes := fabric(t, "", "a")
	ep, err := n.Listen(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	dst := nodes[0].Endpoint(1)
	junk := [][]byte{{}, {0x64}, bytes.Repeat([]byte{0xff}, 11), bytes.Repeat([]byte{0x64, 0, 0xff, 0xff, 0, 0, 0, 1}, 10)}
	for _, j := range junk {
		_ = ep.Send([]Datagram{{dst, j}})
	}
	p := nodes[0].SoftPort(1)
	waitFor(t, "malformed counter", func() bool {
		c := p.Counters()
		return c.Malformed+c.BadICRC >= uint64(len(junk))
	})
	if p.Attr().State != verbs.PortActive {
		t.Fatal("port state changed by garbage")
	}
}

// A subscription's channel is closed by its cancel function and by Close, so a
// subscriber ranging over it ends (the engine's event loop leaked otherwise).
func TestSubscriptionChannelsClose(t *testing.T) {
	h, err := New(Config{Name: "s", Network: NewMemNetwork(), HostSM: true, Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	closed := func(ch <-chan verbs.Event) bool {
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return true
				}
			case <-time.After(5 * time.Second):
				return false
			}
		}
	}
	a, cancelA := h.Subscribe(4)
	b, _ := h.Subscribe(4)
	cancelA()
	cancelA() // twice is harmless
	if !closed(a) {
		t.Error("cancel did not close the channel")
	}
	h.Close()
	if !closed(b) {
		t.Error("Close did not close a live subscription")
	}
	if c, _ := h.Subscribe(4); !closed(c) {
		t.Error("a subscription after Close is open")
	}
}

// CQ moderation signals every completion eventually, for every combination of
// rx-frames and rx-usecs: at once without a delay (0/0, frames only), at the count
// when it comes first, after the delay otherwise.
func TestCQModerationAlwaysSignals(t *testing.T) {
	ready := func(c *CQ) bool {
		select {
		case <-c.Notify():
			return true
		default:
			return false
		}
	}
	eventually := func(c *CQ) bool {
		select {
		case <-c.Notify():
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	for _, m := range []struct{ frames, usecs uint16 }{{0, 0}, {16, 0}, {0, 50}, {16, 50}, {4, 65535}} {
		c := newCQ(64)
		if err := c.SetModeration(m.frames, m.usecs); err != nil {
			t.Fatal(err)
		}
		c.push(verbs.WC{WRID: 1})
		if m.usecs == 0 && !ready(c) {
			t.Errorf("frames %d usecs %d: a lone completion is not signalled at once", m.frames, m.usecs)
		}
		if m.usecs != 0 && !eventually(c) {
			t.Errorf("frames %d usecs %d: a lone completion is never signalled", m.frames, m.usecs)
		}
		if n := c.Poll(make([]verbs.WC, 8)); n != 1 {
			t.Errorf("frames %d usecs %d: polled %d", m.frames, m.usecs, n)
		}
		if m.frames > 1 && m.usecs != 0 {
			// The count, reached before the delay, signals at the last push.
			for k := range int(m.frames) {
				c.push(verbs.WC{WRID: uint64(k)})
			}
			if m.usecs == 65535 && !ready(c) {
				t.Errorf("frames %d usecs %d: %d completions not signalled at the count", m.frames, m.usecs, m.frames)
			}
			if m.usecs != 65535 && !eventually(c) {
				t.Errorf("frames %d usecs %d: completions never signalled", m.frames, m.usecs)
			}
		}
		c.Close()
	}
}

// A port whose subnet manager does not answer says so (again every few seconds), and
// says when it answers; meanwhile the port is DOWN.
func TestUnreachableSMIsLogged(t *testing.T) {
	n := NewMemNetwork()
	logs := &lockedBuffer{}
	lg := log.New(logs, "", 0)
	// The SM's endpoint is taken before the SM exists: nothing answers there yet.
	hold, err := n.Listen(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	smAddr := hold.Addr()
	h, err := New(Config{Name: "lonely", Network: n, SM: smAddr, Heartbeat: 20 * time.Millisecond, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	waitFor(t, "two lines about the silent SM", func() bool {
		return strings.Count(logs.String(), "no answer from the subnet manager at "+smAddr.String()+" since it started") >= 2
	})
	if s := h.SoftPort(1).Attr().State; s != verbs.PortDown {
		t.Fatalf("port state %v without an SM, want DOWN", s)
	}
	hold.Close()
	smh, err := New(Config{Name: "sm", Network: n, Listen: smAddr, HostSM: true, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	waitFor(t, "the SM's arrival logged", func() bool {
		return strings.Contains(logs.String(), "the subnet manager at "+smAddr.String()+" answers after")
	})
	if s := h.SoftPort(1).Attr().State; s != verbs.PortActive {
		t.Fatalf("port state %v after the SM answered", s)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
