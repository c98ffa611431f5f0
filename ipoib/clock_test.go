package ipoib

import (
	"testing"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// taskRound makes i's task run one round now and waits until it has finished, so a
// check after it sees what that round decided at the clock's present time.
func taskRound(t *testing.T, i *Interface) {
	t.Helper()
	before := i.taskRounds.Load()
	i.wake()
	waitFor(t, "a task round of "+i.Name(), func() bool { return i.taskRounds.Load() > before })
}

// On virtual time, exactly: a passive connection idle for cmRxIdle (512 s, the
// driver's IPOIB_CM_RX_TIMEOUT) stays; a nanosecond more and the next round tears it
// down (ipoib_cm_rx_reap), and the peer's next large packet builds a new one.
func TestPassiveConnectionReapedAfter512sIdle(t *testing.T) {
	clk := clock.NewMock(t)
	_, nodes := testFabricWith(t, "", func(c *soft.Config, o *Options) {
		if c.Name == "a" {
			o.Clock = clk
		}
	}, "a", "b")
	a, b := nodes[0], nodes[1]
	connectedNodes(t, nodes)
	ping(t, b.ib0, a.ib0, a.host, "10.0.0.2", "10.0.0.1", 1)
	bigTo := func(seq uint16) {
		t.Helper()
		for k := 0; ; k++ {
			b.ib0.Transmit([][]byte{icmp4("10.0.0.2", "10.0.0.1", 8, seq, 20000)})
			time.Sleep(20 * time.Millisecond)
			if len(a.host.take(isICMP4(seq))) > 0 {
				return
			}
			if k == 250 {
				t.Fatalf("no 20000-byte packet %d over a connection", seq)
			}
		}
	}
	passive := func() (n int, established bool) {
		a.ib0.dmu.Lock()
		defer a.ib0.dmu.Unlock()
		for _, r := range a.ib0.rx {
			established = established || r.conn != nil
		}
		return len(a.ib0.rx), established
	}
	bigTo(2)
	waitFor(t, "a's passive connection established", func() bool { n, est := passive(); return n == 1 && est })

	clk.Advance(cmRxIdle)
	taskRound(t, a.ib0)
	if n, _ := passive(); n != 1 {
		t.Fatalf("after exactly %v idle: %d passive connections, want the one still there", cmRxIdle, n)
	}
	clk.Advance(time.Nanosecond)
	taskRound(t, a.ib0)
	if n, _ := passive(); n != 0 {
		t.Fatalf("after %v idle: %d passive connections, want it reaped", cmRxIdle+time.Nanosecond, n)
	}
	// b learns of the teardown (DREQ) and connects again for its next large packet.
	bigTo(3)
	if n, est := passive(); n != 1 || !est {
		t.Fatalf("after the reap and new traffic: %d passive connections (established %v), want 1", n, est)
	}

	// One never established (a REQ whose RTU never came: its QP made, no connection)
	// is reaped the same way.
	qp, err := a.e.dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: a.ib0.port, SendCQ: a.ib0.cmScq, RecvCQ: a.ib0.cmRcq, MaxSendWR: 1, MaxRecvWR: 1})
	if err != nil {
		t.Fatal(err)
	}
	half := &cmRx{qp: qp, last: clk.Now()}
	a.ib0.dmu.Lock()
	a.ib0.rx[qp.Num()] = half
	a.ib0.dmu.Unlock()
	clk.Advance(cmRxIdle + time.Nanosecond)
	taskRound(t, a.ib0)
	a.ib0.dmu.Lock()
	_, stays := a.ib0.rx[qp.Num()]
	dead := half.dead
	a.ib0.dmu.Unlock()
	if stays || !dead {
		t.Fatalf("a passive connection never established: still there %v, destroyed %v", stays, dead)
	}

	// Closed (a deleted child), the interface holds none of its buffers or tables,
	// though a connection's teardown may keep it reachable for a while.
	a.ib0.dmu.Lock()
	had := a.ib0.cmSRQBufs != nil
	a.ib0.dmu.Unlock()
	a.ib0.close()
	a.ib0.mu.Lock()
	ring := a.ib0.recvBufs != nil
	a.ib0.mu.Unlock()
	a.ib0.dmu.Lock()
	pool, neighs, paths := a.ib0.cmSRQBufs != nil, len(a.ib0.neigh), len(a.ib0.paths)
	a.ib0.dmu.Unlock()
	if !had || ring || pool || neighs != 0 || paths != 0 {
		t.Fatalf("closed: shared pool before %v; ring %v, pool %v, %d neighbours, %d paths", had, ring, pool, neighs, paths)
	}
}
