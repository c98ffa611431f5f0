package ipoib

import (
	"fmt"
	"sync"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// slotDev is a soft HCA whose send queues keep their slots as verbs/rdma's (and a
// real send queue's) do: a posted send holds its slot until a completion retires it
// and every send posted before it, and unsignalled sends complete only when they fail.
type slotDev struct {
	verbs.Device
	mu  sync.Mutex
	qps map[verbs.QPN]*slotQP
}

type slotQP struct {
	verbs.QP
	d    *slotDev
	max  int
	fifo []bool // posted and not retired: signalled?
}

type slotCQ struct {
	verbs.CQ
	d *slotDev
}

func (d *slotDev) CreateCQ(attr verbs.CQAttr) (verbs.CQ, error) {
	cq, err := d.Device.CreateCQ(attr)
	if err != nil {
		return nil, err
	}
	return &slotCQ{cq, d}, nil
}

func (d *slotDev) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	// The QP takes the wrapped CQs: the device polls its own, this test the wrappers.
	if c, ok := attr.SendCQ.(*slotCQ); ok {
		attr.SendCQ = c.CQ
	}
	if c, ok := attr.RecvCQ.(*slotCQ); ok {
		attr.RecvCQ = c.CQ
	}
	q, err := d.Device.CreateQP(attr)
	if err != nil {
		return nil, err
	}
	sq := &slotQP{QP: q, d: d, max: attr.MaxSendWR}
	d.mu.Lock()
	d.qps[q.Num()] = sq
	d.mu.Unlock()
	return sq, nil
}

func (q *slotQP) PostSend(wrs []verbs.SendWR) (int, error) {
	q.d.mu.Lock()
	take := min(len(wrs), q.max-len(q.fifo))
	q.d.mu.Unlock()
	n, err := q.QP.PostSend(wrs[:take])
	q.d.mu.Lock()
	for _, wr := range wrs[:n] {
		q.fifo = append(q.fifo, wr.Signaled)
	}
	q.d.mu.Unlock()
	if err == nil && n < len(wrs) {
		err = &verbs.Error{Op: "post_send", Obj: "test", Err: verbs.ErrQueueFull}
	}
	return n, err
}

func (c *slotCQ) Poll(wc []verbs.WC) int {
	n := c.CQ.Poll(wc)
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	for _, w := range wc[:n] {
		q := c.d.qps[w.QPN]
		if w.Opcode != verbs.WCSend || q == nil {
			continue
		}
		for len(q.fifo) > 0 { // this send and every one posted before it
			sig := q.fifo[0]
			q.fifo = q.fifo[1:]
			if sig || w.Status != verbs.WCSuccess {
				break
			}
		}
	}
	return n
}

// With send queues that keep their slots until a completion (verbs/rdma), datagram
// and connected mode send ten times a queue's worth: the engine signals one send in
// signalEvery and reaps the completions, so the slots come back (it signalled none:
// after a queue's worth every post failed, and the queues never had room again).
func TestSendQueueSlotsComeBack(t *testing.T) {
	for _, mode := range []Mode{Datagram, Connected} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			var sd *slotDev
			nodes := wrappedPair(t, func(h *soft.HCA) verbs.Device {
				sd = &slotDev{Device: h, qps: map[verbs.QPN]*slotQP{}}
				return sd
			})
			if mode == Connected {
				for _, n := range nodes {
					if err := n.ib0.SetMode(Connected); err != nil {
						t.Fatal(err)
					}
					waitFor(t, "carrier", n.ib0.Carrier)
				}
			}
			a, b := nodes[0], nodes[1]
			ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
			before := a.ib0.Stats()
			total := 10 * a.e.params.SendQueueSize
			pkt := icmp4("10.0.0.1", "10.0.0.2", 8, 2, 56)
			// Each batch waits for room, as the driver's queue stops when full (a
			// connection's sends hold their slots until the peer acknowledges them).
			room := func() bool {
				sd.mu.Lock()
				defer sd.mu.Unlock()
				for _, q := range sd.qps {
					if q.max > 8 && len(q.fifo) > q.max-8 {
						return false
					}
				}
				return true
			}
			for sent := 0; sent < total; sent += 8 {
				waitFor(t, "room in the send queues", room)
				a.ib0.Transmit([][]byte{pkt, pkt, pkt, pkt, pkt, pkt, pkt, pkt})
			}
			after := a.ib0.Stats()
			if d := after.TxPackets - before.TxPackets; d != uint64(total) {
				t.Errorf("%d of %d packets posted; tx_errors +%d, tx_dropped +%d", d, total,
					after.TxErrors-before.TxErrors, after.TxDropped-before.TxDropped)
			}
		})
	}
}
