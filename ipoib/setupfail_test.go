package ipoib

import (
	"errors"
	"sync"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// countDev counts the CQs and QPs open on a device and can refuse the nth creation
// from when it is armed, as an HCA at its limits does.
type countDev struct {
	verbs.Device
	mu      sync.Mutex
	open    int
	creates int
	failAt  int // 0: never; otherwise the creation that fails, counted from arm
}

var errOutOfResources = errors.New("test: out of QPs and CQs")

func (d *countDev) arm(n int) {
	d.mu.Lock()
	d.creates, d.failAt = 0, n
	d.mu.Unlock()
}

func (d *countDev) made() (fail bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.creates++
	if d.failAt != 0 && d.creates == d.failAt {
		return true
	}
	d.open++
	return false
}

func (d *countDev) closed() {
	d.mu.Lock()
	d.open--
	d.mu.Unlock()
}

func (d *countDev) openCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.open
}

type countCQ struct {
	verbs.CQ
	d    *countDev
	once sync.Once
}

func (c *countCQ) Close() error {
	c.once.Do(c.d.closed)
	return c.CQ.Close()
}

type countQP struct {
	verbs.QP
	d    *countDev
	once sync.Once
}

func (q *countQP) Close() error {
	q.once.Do(q.d.closed)
	return q.QP.Close()
}

func unwrapCQ(c verbs.CQ) verbs.CQ {
	if w, ok := c.(*countCQ); ok {
		return w.CQ
	}
	return c
}

func (d *countDev) CreateCQ(attr verbs.CQAttr) (verbs.CQ, error) {
	if d.made() {
		return nil, errOutOfResources
	}
	c, err := d.Device.CreateCQ(attr)
	if err != nil {
		d.closed()
		return nil, err
	}
	return &countCQ{CQ: c, d: d}, nil
}

func (d *countDev) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	if d.made() {
		return nil, errOutOfResources
	}
	attr.SendCQ, attr.RecvCQ = unwrapCQ(attr.SendCQ), unwrapCQ(attr.RecvCQ)
	q, err := d.Device.CreateQP(attr)
	if err != nil {
		d.closed()
		return nil, err
	}
	return &countQP{QP: q, d: d}, nil
}

// A child whose QP or CQ cannot be made leaves nothing of what it did make: each
// creation of CreateChild refused in turn, the device holds as many as before.
func TestFailedChildSetupLeavesNothing(t *testing.T) {
	r := newRig(t)
	h, err := soft.New(soft.Config{Name: "a", Network: r.net, SM: r.smh.Endpoint(1), Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	waitFor(t, "port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
	d := &countDev{Device: h}
	e, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ib0, _ := e.Interface("ib0")
	if ib0.cmMgr == nil {
		t.Fatal("no connected mode on the soft HCA: the CM's CQs go untested")
	}
	base := d.openCount()
	// A child makes a send and a receive CQ, its UD QP, then connected mode's two CQs.
	const creates = 5
	for n := 1; n <= creates; n++ {
		d.arm(n)
		if _, err := ib0.CreateChild(0x8001); err == nil {
			t.Fatalf("creation %d refused: the child was made anyway", n)
		}
		if got := d.openCount(); got != base {
			t.Errorf("creation %d refused: %d CQs and QPs open, %d before", n, got, base)
		}
		if _, ok := e.Interface("ib0.8001"); ok {
			t.Errorf("creation %d refused: ib0.8001 listed", n)
		}
	}
	d.arm(0)
	c, err := ib0.CreateChild(0x8001)
	if err != nil {
		t.Fatalf("with the device's resources back: %v", err)
	}
	d.mu.Lock()
	made := d.creates
	d.mu.Unlock()
	if made != creates {
		t.Errorf("a child made %d CQs and QPs; the test refuses each of %d", made, creates)
	}
	if err := ib0.RemoveChild(c); err != nil {
		t.Fatal(err)
	}
	if got := d.openCount(); got != base {
		t.Errorf("after the child's delete %d open, %d before", got, base)
	}
}
