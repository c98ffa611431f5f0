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

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/mad"
)

// A small fake of the verbs interfaces: MAD agents on a fabric that delivers MADs
// asynchronously (one goroutine per agent, in order) and can drop or duplicate them,
// and RC QPs that record their Modify calls and enforce the RC transition order. The
// managers of a fabric's nodes share its virtual clock.

// fabric connects fake MAD agents by LID.
type fabric struct {
	t      testing.TB
	clk    *clock.Mock
	mu     sync.Mutex
	agents map[verbs.LID]*fakeAgent
	// filter decides how many copies of a MAD from -> to are delivered (0 drops it,
	// 2 duplicates it). nil delivers every MAD once.
	filter func(from, to verbs.LID, attr uint16, n int) int
	count  map[uint16]int // MADs sent per attribute
	log    []sentMAD
	// inflight counts MADs queued to an agent and not yet handled (the handler has
	// not returned); changed is closed and replaced when it or log changes.
	inflight int
	changed  chan struct{}
	// roce makes the nodes added from now on ports without LIDs (RoCE): their ports
	// say LID 0, MADs to LID 0 are lost, and they are reached by GID (SendGID).
	roce bool
}

type sentMAD struct {
	from, to verbs.LID
	b        []byte
}

func newFabric(t testing.TB) *fabric {
	return &fabric{t: t, clk: clock.NewMock(t), agents: map[verbs.LID]*fakeAgent{}, count: map[uint16]int{},
		changed: make(chan struct{})}
}

// changedLocked wakes waitFor.
func (f *fabric) changedLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// waitFor waits until cond (called with f.mu held) holds. The bound only keeps a
// broken test from hanging: in a passing test the condition comes true without any
// time passing.
func (f *fabric) waitFor(what string, cond func() bool) {
	f.t.Helper()
	stop := time.NewTimer(10 * time.Second)
	defer stop.Stop()
	for {
		f.mu.Lock()
		ok, ch := cond(), f.changed
		f.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-stop.C:
			f.t.Fatalf("fake fabric: timed out waiting for %s", what)
		}
	}
}

// settle waits until every MAD sent so far has been handled (and the answers the
// handlers sent at once too). Work the managers do on goroutines of their own (a
// listener deciding, callbacks) may still be under way.
func (f *fabric) settle() {
	f.t.Helper()
	f.waitFor("the fabric to settle", func() bool { return f.inflight == 0 })
}

func (f *fabric) handled() {
	f.mu.Lock()
	f.inflight--
	f.changedLocked()
	f.mu.Unlock()
}

func (f *fabric) setFilter(fn func(from, to verbs.LID, attr uint16, n int) int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filter = fn
}

// sent returns the MADs of one attribute sent so far (decoded), in order.
func (f *fabric) sent(attr uint16) []sentMAD {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sentMAD
	for _, s := range f.log {
		if binary.BigEndian.Uint16(s.b[16:]) == attr {
			out = append(out, s)
		}
	}
	return out
}

func (f *fabric) addAgent(lid verbs.LID, gid verbs.GID) *fakeAgent {
	a := &fakeAgent{f: f, lid: lid, src: lid, gid: gid, in: make(chan delivery, 1024), stop: make(chan struct{})}
	if f.roce {
		a.src = 0
	}
	f.mu.Lock()
	f.agents[lid] = a
	f.mu.Unlock()
	a.wg.Add(1)
	go a.run()
	f.t.Cleanup(a.close)
	return a
}

type delivery struct {
	src verbs.MADSource
	b   []byte
}

type fakeAgent struct {
	f    *fabric
	lid  verbs.LID // the fabric's key for it (0 is never used)
	src  verbs.LID // the LID its MADs come from: lid, or 0 on RoCE
	gid  verbs.GID
	mu   sync.Mutex
	h    map[uint8]verbs.MADHandler
	in   chan delivery
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (a *fakeAgent) close() {
	a.once.Do(func() { close(a.stop) })
	a.wg.Wait()
}

func (a *fakeAgent) run() {
	defer a.wg.Done()
	for {
		select {
		case <-a.stop:
			return
		case d := <-a.in:
			a.mu.Lock()
			h := a.h[d.b[1]]
			a.mu.Unlock()
			if h != nil {
				if resp := h(d.src, d.b); resp != nil {
					if d.src.LID == 0 {
						_ = a.SendGID(d.src.GID, d.src.QPN, resp)
					} else {
						_ = a.Send(d.src.LID, d.src.QPN, resp)
					}
				}
			}
			a.f.handled()
		}
	}
}

func (a *fakeAgent) Call(context.Context, verbs.LID, []byte, time.Duration, int) ([]byte, error) {
	return nil, errors.New("fake agent: Call not implemented")
}

func (a *fakeAgent) Register(class uint8, h verbs.MADHandler) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.h == nil {
		a.h = map[uint8]verbs.MADHandler{}
	}
	if h == nil {
		delete(a.h, class)
	} else {
		a.h[class] = h
	}
}

// SendGID reaches the agent whose port has dgid (verbs.GIDMADSender).
func (a *fakeAgent) SendGID(dgid verbs.GID, dqp verbs.QPN, b []byte) error {
	a.f.mu.Lock()
	var dlid verbs.LID
	for l, o := range a.f.agents {
		if o.gid == dgid {
			dlid = l
		}
	}
	a.f.mu.Unlock()
	if dlid == 0 {
		return nil // nobody has it: lost
	}
	return a.send(dlid, dqp, b)
}

func (a *fakeAgent) Send(dlid verbs.LID, dqp verbs.QPN, b []byte) error {
	if a.f.roce && dlid != 0 {
		return fmt.Errorf("fake agent: MAD to LID %d on a fabric without LIDs", dlid)
	}
	return a.send(dlid, dqp, b)
}

func (a *fakeAgent) send(dlid verbs.LID, dqp verbs.QPN, b []byte) error {
	if len(b) != mad.Size {
		return fmt.Errorf("fake agent: %d-byte MAD", len(b))
	}
	if dqp != verbs.GSIQPN {
		return fmt.Errorf("fake agent: MAD to QP %d", dqp)
	}
	b = bytes.Clone(b)
	attr := binary.BigEndian.Uint16(b[16:])
	f := a.f
	f.mu.Lock()
	f.count[attr]++
	n := f.count[attr]
	f.log = append(f.log, sentMAD{a.lid, dlid, b})
	copies := 1
	if f.filter != nil {
		copies = f.filter(a.lid, dlid, attr, n)
	}
	dst := f.agents[dlid]
	if dst == nil {
		copies = 0 // nobody there: lost, like on a real fabric
	}
	for range copies {
		select {
		case dst.in <- delivery{verbs.MADSource{LID: a.src, GID: a.gid, QPN: verbs.GSIQPN}, b}:
			f.inflight++
		default:
			f.t.Errorf("fake fabric: queue of LID %d full", dlid)
		}
	}
	f.changedLocked()
	f.mu.Unlock()
	return nil
}

// fakeDevice is a one-port HCA.
type fakeDevice struct {
	name    string
	guid    verbs.GUID
	port    *fakePort
	nextQPN atomic.Uint32
}

func (d *fakeDevice) Name() string                               { return d.name }
func (d *fakeDevice) NodeGUID() verbs.GUID                       { return d.guid }
func (d *fakeDevice) NodeDesc() string                           { return "fake " + d.name }
func (d *fakeDevice) FWVersion() string                          { return "0" }
func (d *fakeDevice) NumPorts() int                              { return 1 }
func (d *fakeDevice) Subscribe(int) (<-chan verbs.Event, func()) { return nil, func() {} }
func (d *fakeDevice) CreateCQ(verbs.CQAttr) (verbs.CQ, error)    { return nil, verbs.ErrInvalid }
func (d *fakeDevice) CreateAH(verbs.AHAttr) (verbs.AH, error)    { return nil, verbs.ErrInvalid }
func (d *fakeDevice) Close() error                               { return nil }
func (d *fakeDevice) CreateQP(a verbs.QPAttr) (verbs.QP, error)  { return d.newQP(a.Type), nil }
func (d *fakeDevice) Port(n int) (verbs.Port, error) {
	if n != 1 {
		return nil, verbs.ErrNoPort
	}
	return d.port, nil
}

func (d *fakeDevice) newQP(t verbs.QPType) *fakeQP {
	return &fakeQP{num: verbs.QPN(d.nextQPN.Add(1)), typ: t}
}

type fakePort struct {
	lid   verbs.LID
	gid   verbs.GID
	agent *fakeAgent
	pkeys []verbs.PKey
}

func (p *fakePort) Num() int { return 1 }
func (p *fakePort) Attr() verbs.PortAttr {
	return verbs.PortAttr{State: verbs.PortActive, PhysState: verbs.PhysLinkUp, LID: p.lid, SMLID: 1,
		MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096, Rate: 3, Width: 4, LaneMbps: 2500,
		GUID: p.gid.GUID(), GIDPrefix: p.gid.Prefix(), PKeyTabLen: len(p.pkeys), LinkLayer: "InfiniBand"}
}
func (p *fakePort) GID(i int) (verbs.GID, error) {
	if i != 0 {
		return verbs.GID{}, verbs.ErrInvalid
	}
	return p.gid, nil
}
func (p *fakePort) PKeyTable() []verbs.PKey      { return append([]verbs.PKey(nil), p.pkeys...) }
func (p *fakePort) Counters() verbs.PortCounters { return verbs.PortCounters{} }
func (p *fakePort) MAD() verbs.MADAgent          { return p.agent }
func (p *fakePort) FindPKey(key verbs.PKey) (int, bool) {
	partial := -1
	for i, k := range p.pkeys {
		if k == key {
			return i, true
		}
		if k.Base() == key.Base() && partial < 0 {
			partial = i
		}
	}
	return partial, partial >= 0
}

// fakeQP is an RC (or UD) QP that records Modify calls and checks the RC rules.
type fakeQP struct {
	num verbs.QPN
	typ verbs.QPType

	mu    sync.Mutex
	state verbs.QPState
	mods  []verbs.QPModify
	fail  verbs.QPState // a transition to this state fails (0: none; RESET never fails)
}

func (q *fakeQP) Num() verbs.QPN     { return q.num }
func (q *fakeQP) Type() verbs.QPType { return q.typ }
func (q *fakeQP) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *fakeQP) Modify(m verbs.QPModify) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.mods = append(q.mods, m)
	if m.Mask&verbs.QPMaskState == 0 {
		return fmt.Errorf("fake QP: modify without state")
	}
	need := func(mask verbs.QPMask) error {
		if m.Mask&mask != mask {
			return fmt.Errorf("fake QP: %v -> %v with mask %#x, need %#x", q.state, m.State, m.Mask, mask)
		}
		return nil
	}
	var err error
	switch {
	case m.State == verbs.QPErr || m.State == verbs.QPReset:
	case q.state == verbs.QPReset && m.State == verbs.QPInit:
		err = need(verbs.QPMaskPKeyIndex)
	case q.state == verbs.QPInit && m.State == verbs.QPRTR:
		err = need(verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskDestQPN | verbs.QPMaskRQPSN)
	case q.state == verbs.QPRTR && m.State == verbs.QPRTS:
		err = need(verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry)
	default:
		err = fmt.Errorf("fake QP: %v -> %v: %w", q.state, m.State, verbs.ErrInvalidState)
	}
	if err == nil && q.fail != 0 && m.State == q.fail {
		err = fmt.Errorf("fake QP: injected failure of -> %v", m.State)
	}
	if err != nil {
		return err
	}
	q.state = m.State
	return nil
}

// modsTo returns the recorded Modify calls that target state s.
func (q *fakeQP) modsTo(s verbs.QPState) []verbs.QPModify {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []verbs.QPModify
	for _, m := range q.mods {
		if m.State == s {
			out = append(out, m)
		}
	}
	return out
}

func (q *fakeQP) PostSend([]verbs.SendWR) (int, error)   { return 0, verbs.ErrInvalid }
func (q *fakeQP) PostRecv([]verbs.RecvWR) (int, error)   { return 0, verbs.ErrInvalid }
func (q *fakeQP) AttachMcast(verbs.GID, verbs.LID) error { return verbs.ErrInvalid }
func (q *fakeQP) DetachMcast(verbs.GID, verbs.LID) error { return verbs.ErrInvalid }
func (q *fakeQP) Close() error                           { return nil }

// node is a fake HCA with its CM.
type node struct {
	dev   *fakeDevice
	agent *fakeAgent
	m     *cm.Manager
	lid   verbs.LID
	gid   verbs.GID
}

// newNode adds a node at lid; withCM false leaves its QP1 without a CM (MADs to it are
// swallowed).
func newNode(t testing.TB, f *fabric, lid verbs.LID, withCM bool) *node {
	t.Helper()
	guid := verbs.GUID(0x0002c90300000000 | uint64(lid))
	gid := verbs.MakeGID(verbs.DefaultGIDPrefix, guid)
	a := f.addAgent(lid, gid)
	d := &fakeDevice{name: fmt.Sprintf("fake%d", lid), guid: guid,
		port: &fakePort{lid: a.src, gid: gid, agent: a, pkeys: []verbs.PKey{0xffff, 0x8001}}}
	d.nextQPN.Store(uint32(lid) << 8)
	n := &node{dev: d, agent: a, lid: lid, gid: gid}
	if withCM {
		m, err := cm.New(d, 1, cm.WithClock(f.clk))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		n.m = m
	}
	return n
}
