package ipoib

import (
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// sqeDev is a soft HCA whose UD QPs can be made to fail their next send, which moves
// the QP to SQE as a real HCA's failed send does.
type sqeDev struct {
	verbs.Device
	mu  sync.Mutex
	qps []*sqeQP
}

type sqeQP struct {
	verbs.QP
	fail  atomic.Bool
	after atomic.Value // verbs.QPState after the failed post
	// refuse is an error the next post returns without posting (RC QPs).
	refuse atomic.Pointer[error]
}

func (d *sqeDev) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	q, err := d.Device.CreateQP(attr)
	if err != nil {
		return q, err
	}
	w := &sqeQP{QP: q}
	d.mu.Lock()
	if attr.Type == verbs.QPTypeUD {
		d.qps = append(d.qps, w)
	}
	d.mu.Unlock()
	return w, nil
}

func (q *sqeQP) PostSend(wrs []verbs.SendWR) (int, error) {
	if e := q.refuse.Swap(nil); e != nil {
		return 0, *e
	}
	if len(wrs) == 0 || !q.fail.Swap(false) {
		return q.QP.PostSend(wrs)
	}
	bad := append([]verbs.SendWR(nil), wrs...)
	bad[0].AH = nil // the HCA fails it: local QP operation error
	n, err := q.QP.PostSend(bad)
	q.after.Store(q.QP.State())
	return n, err
}

// A send that fails moves a UD QP to SQE, where every later send is flushed; the
// interface moves it back to RTS, as ipoib_qp_state_validate_work does, so that
// pings go through again, on the interface's QP and on a second send queue's.
func TestSendQueueErrorRecovers(t *testing.T) {
	var sd *sqeDev
	nodes := wrappedPair(t, func(h *soft.HCA) verbs.Device {
		sd = &sqeDev{Device: h}
		return sd
	})
	a, b := nodes[0], nodes[1]
	var logged strings.Builder
	var lmu sync.Mutex
	a.e.log.SetOutput(writerFunc(func(p []byte) (int, error) { lmu.Lock(); defer lmu.Unlock(); return logged.Write(p) }))
	if err := a.ib0.SetSendQueues(2); err != nil {
		t.Fatal(err)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	pingQueue(t, a.ib0, 1, b.host, 2)
	sd.mu.Lock()
	qps := append([]*sqeQP(nil), sd.qps...)
	sd.mu.Unlock()
	if len(qps) != 2 {
		t.Fatalf("%d UD QPs made, want ib0's and a second send queue's", len(qps))
	}
	for _, q := range qps {
		q.fail.Store(true)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 3)
	pingQueue(t, a.ib0, 1, b.host, 4)
	for k, q := range qps {
		if st, _ := q.after.Load().(verbs.QPState); st != verbs.QPSQE {
			t.Errorf("QP %d after its failed send: %v, want SQE", k, st)
		}
		if st := q.State(); st != verbs.QPRTS {
			t.Errorf("QP %d now %v, want RTS", k, st)
		}
	}
	lmu.Lock()
	if n := strings.Count(logged.String(), "moved from SQE to RTS"); n != 2 {
		t.Errorf("%d moves from SQE logged, want 2:\n%s", n, logged.String())
	}
	lmu.Unlock()
	// Seen to at once, not at the next batch (which SQE would flush) or the task's
	// next round: the packet after a failed one goes out, sent once.
	qps[0].fail.Store(true)
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 5, 56)})
	if st := qps[0].State(); st != verbs.QPRTS {
		t.Errorf("after the Transmit whose send failed the QP is in %v, want RTS", st)
	}
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 6, 56)})
	waitFor(t, "the packet after the failed one, sent once", func() bool { return len(b.host.take(isICMP4(6))) > 0 })
}

// A connected-mode post the HCA refuses counts in tx_errors and keeps the connection,
// as ipoib_cm_send (the next packet goes on the same QP); only a QP that is no longer
// sending (not in RTS) is torn down, to be made again.
func TestConnectedPostFailureKeepsTheConnection(t *testing.T) {
	nodes := wrappedPair(t, func(h *soft.HCA) verbs.Device { return &sqeDev{Device: h} })
	a, b := nodes[0], nodes[1]
	for _, n := range nodes {
		if err := n.ib0.SetMode(Connected); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "carrier", n.ib0.Carrier)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	conn := func() *sqeQP {
		a.ib0.dmu.Lock()
		defer a.ib0.dmu.Unlock()
		for _, tx := range a.ib0.tx {
			if q, ok := tx.qp.(*sqeQP); ok {
				return q
			}
		}
		return nil
	}
	q := conn()
	if q == nil {
		t.Fatal("no connection to b after a ping in connected mode")
	}
	before := a.ib0.Stats()
	var busy error = &verbs.Error{Op: "post_send", Obj: "test", Err: syscall.ENOMEM}
	q.refuse.Store(&busy)
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 2, 56)})
	if d := a.ib0.Stats().TxErrors - before.TxErrors; d != 1 {
		t.Errorf("tx_errors +%d after a refused post, want +1", d)
	}
	if conn() != q {
		t.Fatal("the connection whose post was refused is gone")
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 3)
	if conn() != q {
		t.Fatal("the next ping made a new connection")
	}
	var down error = &verbs.Error{Op: "post_send", Obj: "test", Err: verbs.ErrInvalidState}
	q.refuse.Store(&down)
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 4, 56)})
	if conn() == q {
		t.Fatal("a connection whose QP is not sending is kept")
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 5)
}
