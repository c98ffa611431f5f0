package ipoib

import (
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// A receive buffer polled across a QP restart belongs to the ring of before: the
// restart posted every buffer afresh, so re-posting it would put one buffer in the
// queue twice (two packets written into it). The receive loop re-posts only buffers
// of the current ring generation. The ring here is full, so a post that is made fails
// with "queue full" in the trace: the old generation's makes none, the current one's
// does (the check is not blind).
func TestRepostSkipsBuffersOfAnOlderRing(t *testing.T) {
	var buf testenv.Buffer
	smh, err := soft.New(soft.Config{Name: "sm", Network: soft.NewMemNetwork(), HostSM: true, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	e, err := New(smh, Options{Logger: log.New(&buf, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ib0, _ := e.Interface("ib0")
	_ = ib0.SetUp(true)
	waitFor(t, "carrier", ib0.Carrier)
	_ = ib0.SetUp(false) // down and up: the ring is posted again, one generation on
	_ = ib0.SetUp(true)
	waitFor(t, "carrier again", ib0.Carrier)
	d := ib0.data()
	if !d.qpReady || d.qpGen < 2 {
		t.Fatalf("after a restart: QP ready %v, ring generation %d", d.qpReady, d.qpGen)
	}
	if err := e.Params().SetParam("debug_level", "1"); err != nil {
		t.Fatal(err)
	}
	const line = "ib0: re-posting receive buffers"
	ib0.repostRecv([]verbs.RecvWR{{ID: recvWRID(d.qpGen-1, 3), Buf: ib0.recvBufs[3]}})
	if strings.Contains(buf.String(), line) {
		t.Fatalf("a buffer of the ring before the restart was posted again:\n%s", buf.String())
	}
	ib0.repostRecv([]verbs.RecvWR{{ID: recvWRID(d.qpGen, 3), Buf: ib0.recvBufs[3]}})
	if !strings.Contains(buf.String(), line) {
		t.Fatalf("a buffer of the current ring was not posted (no queue-full error on a full ring):\n%s", buf.String())
	}
}

// Transmit reads the mode and the tables under one lock (dmu) while the control path
// switches modes: once SetMode(Datagram) has returned, no connection made for the
// connected mode remains or appears, however the batches interleaved; and the race
// detector sees the data path and the control path share nothing unguarded.
func TestModeSwitchesUnderTraffic(t *testing.T) {
	a, b := connectedPair(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var batches atomic.Int64
	// more waits for the transmitters to send some batches in the current mode.
	more := func() {
		t.Helper()
		n := batches.Load() + 10
		waitFor(t, "ten batches", func() bool { return batches.Load() >= n })
	}
	for k := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint16(0); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, uint16(k)<<15|seq, 1000), icmp4("10.0.0.1", "10.0.0.2", 8, seq, 3000)})
				batches.Add(1)
			}
		}()
	}
	for k := range 200 {
		m := Datagram
		if k%2 == 1 {
			m = Connected
		}
		if err := a.ib0.SetMode(m); err != nil {
			t.Fatal(err)
		}
		if err := a.ib0.SetMTU(1500 + k%100); err != nil {
			t.Fatal(err)
		}
		more()
	}
	if err := a.ib0.SetMode(Datagram); err != nil {
		t.Fatal(err)
	}
	n := func() int { a.ib0.dmu.Lock(); defer a.ib0.dmu.Unlock(); return len(a.ib0.tx) }
	if got := n(); got != 0 {
		t.Fatalf("%d connections right after the switch to datagram mode", got)
	}
	more()
	close(stop)
	wg.Wait()
	if got := n(); got != 0 {
		t.Fatalf("%d connections made in datagram mode", got)
	}
	b.host.take(func([]byte) bool { return true })
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 7)
}
