package ipoib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// laneDev records the send-only QPs an engine makes and the posts on each QP; with
// refuse it is a device without source QPNs (verbs/rdma).
type laneDev struct {
	verbs.Device
	refuse bool
	mu     sync.Mutex
	made   []verbs.QPN             // send-only QPs in the order made
	src    map[verbs.QPN]verbs.QPN // open send-only QP -> the number it sends as
	posts  map[verbs.QPN]int       // PostSend calls per QP
	mods   map[verbs.QPN]int       // Modify calls per QP
	// failAfter, when above 0, makes a PostSend take that many requests at most and
	// fail the rest with failErr (default: verbs.ErrInvalid), as a provider refusing
	// a post (0: no failures).
	failAfter int
	failErr   error
}

func (d *laneDev) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	if attr.SourceQPN != 0 && d.refuse {
		return nil, &verbs.Error{Op: "create_qp", Obj: "test", Err: fmt.Errorf("source QPN: %w", errors.ErrUnsupported)}
	}
	q, err := d.Device.CreateQP(attr)
	if err != nil {
		return nil, err
	}
	if attr.SourceQPN != 0 {
		d.mu.Lock()
		d.made = append(d.made, q.Num())
		d.src[q.Num()] = attr.SourceQPN
		d.mu.Unlock()
	}
	return &laneQP{q, d}, nil
}

type laneQP struct {
	verbs.QP
	d *laneDev
}

func (q *laneQP) PostSend(wrs []verbs.SendWR) (int, error) {
	q.d.mu.Lock()
	q.d.posts[q.Num()]++
	fail, ferr := q.d.failAfter, q.d.failErr
	q.d.mu.Unlock()
	if fail > 0 && len(wrs) > fail {
		n, err := q.QP.PostSend(wrs[:fail])
		if ferr == nil {
			ferr = verbs.ErrInvalid
		}
		if err == nil {
			err = &verbs.Error{Op: "post_send", Obj: "test", Err: ferr}
		}
		return n, err
	}
	return q.QP.PostSend(wrs)
}

func (q *laneQP) Modify(m verbs.QPModify) error {
	q.d.mu.Lock()
	q.d.mods[q.Num()]++
	q.d.mu.Unlock()
	return q.QP.Modify(m)
}

func (q *laneQP) Close() error {
	q.d.mu.Lock()
	delete(q.d.src, q.Num())
	q.d.mu.Unlock()
	return q.QP.Close()
}

func (d *laneDev) postsOn(n verbs.QPN) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.posts[n]
}

func (d *laneDev) modifiesOf(n verbs.QPN) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mods[n]
}

func (d *laneDev) open() map[verbs.QPN]verbs.QPN {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[verbs.QPN]verbs.QPN{}
	for k, v := range d.src {
		m[k] = v
	}
	return m
}

// laneNodes brings up ib0 on two engines, a's HCA seen through a laneDev, addressed
// 10.0.0.1 and .2.
func laneNodes(t *testing.T, refuse bool) (*laneDev, *Engine, [2]*node) {
	var ld *laneDev
	nodes := wrappedPair(t, func(h *soft.HCA) verbs.Device {
		ld = &laneDev{Device: h, refuse: refuse, src: map[verbs.QPN]verbs.QPN{}, posts: map[verbs.QPN]int{}, mods: map[verbs.QPN]int{}}
		return ld
	})
	return ld, nodes[0].e, nodes
}

// wrappedPair brings up ib0 on two engines, a's HCA seen through wrap(HCA), addressed
// 10.0.0.1 and .2.
func wrappedPair(t *testing.T, wrap func(*soft.HCA) verbs.Device) [2]*node {
	r := newRig(t)
	var nodes [2]*node
	for k, name := range []string{"a", "b"} {
		h, err := soft.New(soft.Config{Name: name, Network: r.net, SM: r.smh.Endpoint(1), Heartbeat: hb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		waitFor(t, name+" port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
		var dev verbs.Device = h
		if k == 0 {
			dev = wrap(h)
		}
		e, err := New(dev, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		ib0, _ := e.Interface("ib0")
		host := bringUp(t, ib0, fmt.Sprintf("10.0.0.%d/24", k+1))
		nodes[k] = &node{h, e, ib0, host}
	}
	return nodes
}

// pingQueue is ping from host queue q.
func pingQueue(t *testing.T, a *Interface, q int, hb *fakeHost, seq uint16) {
	t.Helper()
	pkt := icmp4("10.0.0.1", "10.0.0.2", 8, seq, 56)
	waitFor(t, fmt.Sprintf("echo %d from queue %d", seq, q), func() bool {
		a.TransmitQueue(q, [][]byte{pkt})
		return len(hb.take(isICMP4(seq))) > 0
	})
}

// TestSendQueues: each host queue posts on its own QP, all of them sending as ib0's
// QP (the peer answers ib0), they follow the interface down and up, and close takes
// them with it.
func TestSendQueues(t *testing.T) {
	ld, ea, nodes := laneNodes(t, false)
	a, b := nodes[0], nodes[1]
	for _, n := range []int{0, maxSendQueues + 1} {
		if err := a.ib0.SetSendQueues(n); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("SetSendQueues(%d): %v, want EINVAL", n, err)
		}
	}
	if err := a.ib0.SetSendQueues(3); err != nil {
		t.Fatal(err)
	}
	if err := a.ib0.SetSendQueues(2); err != nil || a.ib0.SendQueues() != 3 {
		t.Fatalf("SetSendQueues(2) after 3: %v, %d queues; want no change", err, a.ib0.SendQueues())
	}
	own := a.ib0.HWAddr().QPN()
	lanes := ld.made
	if len(lanes) != 2 {
		t.Fatalf("%d send-only QPs made, want 2", len(lanes))
	}
	for n, src := range ld.open() {
		if src != own {
			t.Fatalf("send-only QP %#x sends as %#x, want ib0's %#x", uint32(n), uint32(src), uint32(own))
		}
	}
	qpOf := []verbs.QPN{own, lanes[0], lanes[1]}

	// Each queue's echo goes out on its own QP, and b answers ib0 from whichever
	// queue the echo left.
	check := func(round int) {
		t.Helper()
		for q := range 4 { // queue 3 wraps to 0
			before := ld.postsOn(qpOf[q%3])
			seq := uint16(round*10 + q)
			pingQueue(t, a.ib0, q, b.host, seq)
			if ld.postsOn(qpOf[q%3]) == before {
				t.Errorf("round %d: queue %d's echo was not posted on QP %#x", round, q, uint32(qpOf[q%3]))
			}
			reply := icmp4("10.0.0.2", "10.0.0.1", 0, seq, 56)
			waitFor(t, fmt.Sprintf("reply %d", seq), func() bool {
				b.ib0.Transmit([][]byte{reply})
				return len(a.host.take(isICMP4(seq))) > 0
			})
		}
	}
	check(1)

	// A broadcast from queue 2 loops back to a carrying ib0's number, which a drops as
	// its own (under another number a's kernel would get its own broadcast back).
	bc := icmp4("10.0.0.1", "10.0.0.255", 8, 77, 20)
	waitFor(t, "the broadcast at b", func() bool {
		a.ib0.TransmitQueue(2, [][]byte{bc})
		return len(b.host.take(isICMP4(77))) > 0
	})
	if got := a.host.take(isICMP4(77)); len(got) != 0 {
		t.Errorf("a's broadcast from queue 2 came back to a's host")
	}

	// Down and up: the queues' QPs are reset with ib0's and brought back with it.
	if err := a.ib0.SetUp(false); err != nil {
		t.Fatal(err)
	}
	for _, l := range (*a.ib0.lanes.Load())[1:] {
		if l.ready.Load() {
			t.Errorf("send queue QP %#x ready while ib0 is down", uint32(l.qp.Num()))
		}
	}
	if err := a.ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "carrier", func() bool { return a.ib0.Carrier() })
	check(2)

	// The queues post in parallel; every packet arrives.
	const per = 40
	burst := func(from, size int) {
		var wg sync.WaitGroup
		for q := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range per {
					a.ib0.TransmitQueue(q, [][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, uint16(from+q*per+k), size)})
				}
			}()
		}
		wg.Wait()
	}
	burst(1000, 56)
	waitFor(t, "the parallel echoes", func() bool {
		return countEchoes(b.host, 1000, 3*per) == 3*per
	})

	// Connected mode: the queues post to one connection at once, each queue's packets
	// in order.
	for _, n := range nodes {
		if err := n.ib0.SetMode(Connected); err != nil {
			t.Fatal(err)
		}
	}
	pingQueue(t, a.ib0, 1, b.host, 2000)
	b.host.take(func([]byte) bool { return true })
	burst(3000, 1400)
	waitFor(t, "the parallel echoes in connected mode", func() bool {
		return countEchoes(b.host, 3000, 3*per) == 3*per
	})
	next := [3]int{}
	for _, p := range b.host.take(isICMP4Range(3000, 3*per)) {
		seq := int(binary.BigEndian.Uint16(p[26:])) - 3000
		if q := seq / per; seq%per != next[q] {
			t.Errorf("queue %d: echo %d after %d", q, seq%per, next[q]-1)
		} else {
			next[q]++
		}
	}

	ea.Close()
	if open := ld.open(); len(open) != 0 {
		t.Errorf("send-only QPs left open after close: %v", open)
	}
}

// isICMP4Range matches echo requests with sequence numbers from..from+n-1.
func isICMP4Range(from, n int) func([]byte) bool {
	return func(p []byte) bool {
		if len(p) < 28 || p[9] != 1 || p[20] != 8 {
			return false
		}
		s := int(binary.BigEndian.Uint16(p[26:]))
		return s >= from && s < from+n
	}
}

// countEchoes counts the distinct echo sequence numbers from..from+n-1 b's host got.
func countEchoes(h *fakeHost, from, n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[uint16]bool{}
	match := isICMP4Range(from, n)
	for _, p := range h.pkts {
		if match(p) {
			seen[binary.BigEndian.Uint16(p[26:])] = true
		}
	}
	return len(seen)
}

// TestSendQueuesUnsupported: an HCA without source QPNs leaves one queue, says why,
// and every host queue's packets still go out through it.
func TestSendQueuesUnsupported(t *testing.T) {
	ld, _, nodes := laneNodes(t, true)
	a, b := nodes[0], nodes[1]
	err := a.ib0.SetSendQueues(4)
	if !errors.Is(err, errors.ErrUnsupported) || a.ib0.SendQueues() != 1 {
		t.Fatalf("SetSendQueues(4) on a device without source QPNs: %v, %d queues", err, a.ib0.SendQueues())
	}
	t.Log(err)
	own := a.ib0.HWAddr().QPN()
	before := ld.postsOn(own)
	pingQueue(t, a.ib0, 3, b.host, 7)
	if ld.postsOn(own) == before {
		t.Errorf("queue 3's echo was not posted on ib0's QP")
	}
}

// A post the HCA refuses in part counts as ipoib_send's failed post: the refused
// packets in tx_errors only (not tx_dropped), and tx_packets and tx_bytes for the
// ones it took; a full queue drops what did not fit (tx_dropped).
func TestRefusedPostCountsAsTheDriver(t *testing.T) {
	ld, ea, nodes := laneNodes(t, false)
	a, b := nodes[0], nodes[1]
	var logged strings.Builder
	var logMu sync.Mutex
	ea.log.SetOutput(writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return logged.Write(p) }))
	pingQueue(t, a.ib0, 0, b.host, 1) // path and neighbour known
	pkt := icmp4("10.0.0.1", "10.0.0.2", 8, 2, 56)
	before := a.ib0.Stats()
	a.ib0.Transmit([][]byte{pkt})
	one := a.ib0.Stats()
	frame := one.TxBytes - before.TxBytes
	if one.TxPackets-before.TxPackets != 1 || frame == 0 {
		t.Fatalf("one packet: %+v, then %+v", before, one)
	}
	ld.mu.Lock()
	ld.failAfter = 1
	ld.mu.Unlock()
	a.ib0.Transmit([][]byte{pkt, pkt, pkt})
	after := a.ib0.Stats()
	got := [4]uint64{after.TxPackets - one.TxPackets, after.TxBytes - one.TxBytes, after.TxErrors - one.TxErrors, after.TxDropped - one.TxDropped}
	if want := [4]uint64{1, frame, 2, 0}; got != want {
		t.Errorf("three packets, the post taking one: tx_packets, tx_bytes, tx_errors, tx_dropped +%v, want +%v", got, want)
	}
	logMu.Lock()
	if !strings.Contains(logged.String(), "ib0: post_send failed") {
		t.Errorf("the refused post was not logged:\n%s", logged.String())
	}
	logMu.Unlock()
	// A full queue is not an error: what did not fit is dropped, as on a connection.
	ld.mu.Lock()
	ld.failErr = verbs.ErrQueueFull
	ld.mu.Unlock()
	a.ib0.Transmit([][]byte{pkt, pkt, pkt})
	full := a.ib0.Stats()
	got = [4]uint64{full.TxPackets - after.TxPackets, full.TxBytes - after.TxBytes, full.TxErrors - after.TxErrors, full.TxDropped - after.TxDropped}
	if want := [4]uint64{1, frame, 0, 2}; got != want {
		t.Errorf("three packets, a full queue taking one: tx_packets, tx_bytes, tx_errors, tx_dropped +%v, want +%v", got, want)
	}
}
