package soft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

// ---- helpers ----

type rcEnd struct {
	h        *HCA
	qp       verbs.QP
	q        *QP
	scq, rcq verbs.CQ
}

type rcOpts struct {
	mtu                 verbs.MTU
	maxSend, maxRecv    int
	cqEntries           int
	timeout             uint8
	noTimeout           bool // Timeout 0: no ACK timeout, so no early retransmission either
	retryCnt, rnrRetry  uint8
	sigAll              bool
	psnA, psnB          uint32 // starting PSNs of a's and b's send queues
	pkeyA, pkeyB        int    // P_Key indexes of a's and b's QPs
	skipSecondDirection bool
}

func (o *rcOpts) defaults() {
	if o.mtu == 0 {
		o.mtu = verbs.MTU4096
	}
	if o.maxSend == 0 {
		o.maxSend = 256
	}
	if o.maxRecv == 0 {
		o.maxRecv = 512
	}
	if o.cqEntries == 0 {
		o.cqEntries = 4096
	}
	if o.noTimeout {
		o.timeout = 0
	} else if o.timeout == 0 {
		o.timeout = 14 // 67 ms
	}
}

func newRCEnd(t testing.TB, h *HCA, o rcOpts) *rcEnd {
	t.Helper()
	scq, err := h.CreateCQ(verbs.CQAttr{Entries: o.cqEntries})
	if err != nil {
		t.Fatal(err)
	}
	rcq, _ := h.CreateCQ(verbs.CQAttr{Entries: o.cqEntries})
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: 1, SendCQ: scq, RecvCQ: rcq,
		MaxSendWR: o.maxSend, MaxRecvWR: o.maxRecv, SigAll: o.sigAll})
	if err != nil {
		t.Fatal(err)
	}
	if qp.Type() != verbs.QPTypeRC || qp.State() != verbs.QPReset {
		t.Fatalf("new QP: type %v state %v", qp.Type(), qp.State())
	}
	t.Cleanup(func() { qp.Close() })
	return &rcEnd{h: h, qp: qp, q: qp.(*QP), scq: scq, rcq: rcq}
}

func (e *rcEnd) lid() verbs.LID { return e.h.SoftPort(1).Attr().LID }

// connect moves e from any state through RESET, INIT and RTR to RTS, connected to the
// QP peer at peerLID, sending from sqpsn and expecting rqpsn.
func (e *rcEnd) connect(peer verbs.QPN, peerLID verbs.LID, sqpsn, rqpsn uint32, pkeyIx int, o rcOpts) error {
	for _, m := range []verbs.QPModify{
		{Mask: verbs.QPMaskState, State: verbs.QPReset},
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit, PKeyIndex: pkeyIx},
		{Mask: verbs.QPMaskState | verbs.QPMaskDestQPN | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskRQPSN,
			State: verbs.QPRTR, DestQPN: peer, AH: verbs.AHAttr{Port: 1, DLID: peerLID}, PathMTU: o.mtu, RQPSN: rqpsn},
		{Mask: verbs.QPMaskState | verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry,
			State: verbs.QPRTS, SQPSN: sqpsn, Timeout: o.timeout, RetryCnt: o.retryCnt, RNRRetry: o.rnrRetry},
	} {
		if err := e.qp.Modify(m); err != nil {
			return err
		}
	}
	return nil
}

// rcPair creates connected RC QPs on ha and hb.
func rcPair(t testing.TB, ha, hb *HCA, o rcOpts) (*rcEnd, *rcEnd) {
	t.Helper()
	o.defaults()
	a, b := newRCEnd(t, ha, o), newRCEnd(t, hb, o)
	if err := a.connect(b.qp.Num(), b.lid(), o.psnA, o.psnB, o.pkeyA, o); err != nil {
		t.Fatal(err)
	}
	if err := b.connect(a.qp.Num(), a.lid(), o.psnB, o.psnA, o.pkeyB, o); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func (e *rcEnd) post(t testing.TB, wrs ...verbs.SendWR) {
	t.Helper()
	if n, err := e.qp.PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("post_send: %d of %d: %v", n, len(wrs), err)
	}
}

func (e *rcEnd) postRecv(t testing.TB, bufs ...verbs.RecvWR) {
	t.Helper()
	if n, err := e.qp.PostRecv(bufs); err != nil || n != len(bufs) {
		t.Fatalf("post_recv: %d of %d: %v", n, len(bufs), err)
	}
}

// poll waits up to d for n completions on cq.
func pollN(t testing.TB, cq verbs.CQ, n int, d time.Duration) []verbs.WC {
	t.Helper()
	out := make([]verbs.WC, 0, n)
	buf := make([]verbs.WC, 64)
	deadline := time.Now().Add(d)
	for len(out) < n {
		k := cq.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d completions after %v: %+v", len(out), n, d, out)
		}
		select {
		case <-cq.Notify():
		case <-time.After(time.Millisecond):
		}
	}
	return out
}

// quiet checks that cq stays empty for d.
func quiet(t testing.TB, cq verbs.CQ, d time.Duration, what string) {
	t.Helper()
	time.Sleep(d)
	wc := make([]verbs.WC, 1)
	if cq.Poll(wc) > 0 {
		t.Fatalf("%s: unexpected completion %+v", what, wc[0])
	}
}

func wantErr(t testing.TB, err, target error, what string) {
	t.Helper()
	var ve *verbs.Error
	if !errors.Is(err, target) || !errors.As(err, &ve) {
		t.Fatalf("%s: got %v, want a *verbs.Error wrapping %v", what, err, target)
	}
}

// pattern returns n bytes derived from seed.
func pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for i := 0; i < n; i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(b[i:], w[:])
	}
	return b
}

// ---- tests ----

func TestRCMessageSizesBothWaysWithPSNWrap(t *testing.T) {
	for _, mtu := range []verbs.MTU{verbs.MTU256, verbs.MTU4096} {
		t.Run(fmt.Sprintf("mtu%d", mtu.Bytes()), func(t *testing.T) {
			_, _, nodes := fabric(t, "", "a", "b")
			m := mtu.Bytes()
			// a's send PSNs wrap after 3 packets; b's a few packets later. Retries,
			// because with a 4 MiB window each way the ACKs queue behind the data, and
			// on a loaded machine under -race that has outlasted one ACK timeout.
			o := rcOpts{mtu: mtu, psnA: 0xfffffd, psnB: 0xfffff0, retryCnt: 7}
			newUD(t, nodes[1], 0, 1) // so that the two QPNs differ
			a, b := rcPair(t, nodes[0], nodes[1], o)
			if a.qp.Num() == b.qp.Num() {
				t.Fatal("both QPs have the same number")
			}
			sizes := []int{0, 1, m - 1, m, m + 1, 65524, 1 << 20, 5}
			bufs := map[*rcEnd][][]byte{}
			for _, e := range []*rcEnd{a, b} {
				for i := range sizes {
					buf := make([]byte, 1<<20+7)
					bufs[e] = append(bufs[e], buf)
					e.postRecv(t, verbs.RecvWR{ID: uint64(100 + i), Buf: buf})
				}
			}
			msgs := make([][]byte, len(sizes))
			for i, n := range sizes {
				msgs[i] = pattern(uint64(i), n)
			}
			var wg sync.WaitGroup
			for k, pair := range [][2]*rcEnd{{a, b}, {b, a}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					src := pair[0]
					for i, msg := range msgs {
						wr := verbs.SendWR{ID: uint64(i), Signaled: i%2 == 0 || i == len(msgs)-1}
						// A gather list of several pieces, cut at odd places.
						cut1, cut2 := len(msg)/3, len(msg)/3+len(msg)/5
						wr.Data = [][]byte{msg[:cut1], {}, msg[cut1:cut2], msg[cut2:]}
						if i%3 == 1 {
							wr.WithImm, wr.Imm = true, 0xdead0000+uint32(i+k)
						}
						if _, err := src.qp.PostSend([]verbs.SendWR{wr}); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for k, pair := range [][2]*rcEnd{{a, b}, {b, a}} {
				src, dst := pair[0], pair[1]
				wcs := pollN(t, dst.rcq, len(sizes), 10*time.Second)
				for i, wc := range wcs {
					if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.WRID != uint64(100+i) ||
						wc.ByteLen != sizes[i] || wc.QPN != dst.qp.Num() || wc.SrcQP != src.qp.Num() ||
						wc.SLID != src.lid() || wc.GRH || wc.PKeyIndex != 0 {
						t.Fatalf("direction %d message %d (%d bytes): completion %+v", k, i, sizes[i], wc)
					}
					if imm := i%3 == 1; wc.WithImm != imm || imm && wc.Imm != 0xdead0000+uint32(i+k) {
						t.Fatalf("direction %d message %d: immediate %v %#x", k, i, wc.WithImm, wc.Imm)
					}
				}
				for i, wc := range wcs {
					if got := bufs[dst][wc.WRID-100][:wc.ByteLen]; !bytes.Equal(got, msgs[i]) {
						t.Fatalf("direction %d message %d (%d bytes): content differs", k, i, sizes[i])
					}
				}
				swc := pollN(t, src.scq, (len(sizes)+1)/2+1, 5*time.Second)
				var want []uint64
				for i := range sizes {
					if i%2 == 0 || i == len(sizes)-1 {
						want = append(want, uint64(i))
					}
				}
				for j, wc := range swc {
					if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend || wc.WRID != want[j] || wc.ByteLen != sizes[want[j]] {
						t.Fatalf("direction %d send completion %d: %+v, want WRID %d", k, j, wc, want[j])
					}
				}
				quiet(t, src.scq, 10*time.Millisecond, "unsignaled sends")
			}
			// The PSNs wrapped past 0xffffff.
			for _, e := range []*rcEnd{a, b} {
				e.q.mu.Lock()
				una, end := e.q.rc.req.una, e.q.rc.req.end
				e.q.mu.Unlock()
				if una != end || una > 0x10000 {
					t.Fatalf("send PSN after the transfer %#x (end %#x): no wrap", una, end)
				}
			}
		})
	}
}

// TestRCPayloadBytes checks delivered bytes (the test above checks completions).
func TestRCPayloadBytes(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU1024, psnA: 0xfffffe})
	sizes := []int{0, 1, 1023, 1024, 1025, 65524, 1 << 20}
	bufs := make([][]byte, len(sizes))
	for i := range sizes {
		bufs[i] = bytes.Repeat([]byte{0xee}, 1<<20+16)
		b.postRecv(t, verbs.RecvWR{ID: uint64(i), Buf: bufs[i]})
	}
	var wrs []verbs.SendWR
	msgs := make([][]byte, len(sizes))
	for i, n := range sizes {
		msgs[i] = pattern(uint64(1000+i), n)
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Data: [][]byte{msgs[i]}})
	}
	a.post(t, wrs...)
	// The caller's buffers are free once PostSend returns.
	for _, m := range msgs {
		clear(m)
	}
	wcs := pollN(t, b.rcq, len(sizes), 10*time.Second)
	for i, wc := range wcs {
		want := pattern(uint64(1000+i), sizes[i])
		if wc.WRID != uint64(i) || wc.ByteLen != sizes[i] || !bytes.Equal(bufs[i][:wc.ByteLen], want) {
			t.Fatalf("message %d: %+v, content equal %v", i, wc, bytes.Equal(bufs[i][:min(wc.ByteLen, len(bufs[i]))], want))
		}
		if bufs[i][wc.ByteLen] != 0xee {
			t.Fatalf("message %d: wrote past its length", i)
		}
	}
}

// sink keeps nbuf receive buffers of size bytes posted on e and hands every received
// message to fn until the returned stop is called.
func (e *rcEnd) sink(t testing.TB, nbuf, size int, fn func(wc verbs.WC, data []byte)) (stop func()) {
	bufs := make([][]byte, nbuf)
	for i := range bufs {
		bufs[i] = make([]byte, size)
		e.postRecv(t, verbs.RecvWR{ID: uint64(i), Buf: bufs[i]})
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		wc := make([]verbs.WC, 64)
		for {
			n := e.rcq.Poll(wc)
			for _, c := range wc[:n] {
				if c.Status != verbs.WCSuccess {
					fn(c, nil)
					continue
				}
				fn(c, bufs[c.WRID][:c.ByteLen])
				if _, err := e.qp.PostRecv([]verbs.RecvWR{{ID: c.WRID, Buf: bufs[c.WRID]}}); err != nil {
					t.Errorf("repost: %v", err)
					return
				}
			}
			if n > 0 {
				continue
			}
			select {
			case <-done:
				return
			case <-e.rcq.Notify():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-finished }
}

// stream sends count messages made by gen with at most window outstanding and
// returns when all have completed successfully.
func (e *rcEnd) stream(t testing.TB, count, window int, gen func(i int) []byte) {
	if err := e.streamErr(count, window, gen); err != nil {
		t.Fatal(err)
	}
}

func (e *rcEnd) streamErr(count, window int, gen func(i int) []byte) error {
	outstanding := 0
	wc := make([]verbs.WC, 64)
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; i < count || outstanding > 0; {
		for i < count && outstanding < window {
			if _, err := e.qp.PostSend([]verbs.SendWR{{ID: uint64(i), Data: [][]byte{gen(i)}, Signaled: true}}); err != nil {
				return fmt.Errorf("post %d: %w", i, err)
			}
			i++
			outstanding++
		}
		n := e.scq.Poll(wc)
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				return fmt.Errorf("send completion %+v (QP %v)", c, e.qp.State())
			}
		}
		outstanding -= n
		if n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("stream stalled: %d posted, %d outstanding, QP %v", i, outstanding, e.qp.State())
			}
			select {
			case <-e.scq.Notify():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return nil
}

// TestRCDeliversA100MBStreamExactlyAt5PercentLoss sends 100 MB as 64 KB messages one
// way and 1 MiB messages the other way at the same time, over a fabric that loses 5%
// of the packets (requests, ACKs and NAKs alike), duplicates 1% and reorders 2%, with
// both send PSNs wrapping early: every message arrives exactly once, in order and
// intact, and both QPs end in RTS with their invariants kept. It logs the throughput
// and how many packets the transfer took.
func TestRCDeliversA100MBStreamExactlyAt5PercentLoss(t *testing.T) {
	const total = 100 << 20
	const size, big = 64 << 10, 1 << 20
	f := Faults{Loss: 0.05, Dup: 0.01, Reorder: 0.02}
	moved, ratio, stats := rcLossyTransfer(t, f, total, size, big)
	// Selective repeat. (Packets sent per data packet, 1.2-1.4 against 2.4 going
	// back N, are not asserted: under the race detector the in-memory fabric's
	// queues overflow, and bursts of loss dominate.)
	if stats.selects == 0 || stats.kept == 0 {
		t.Errorf("%.2f packets sent per data packet; %s", ratio, stats)
	}
	t.Logf("%d MB (%d×64 KB one way, %d×1 MiB the other) at %.0f MB/s; %.2f packets sent per data packet; %s",
		moved>>20, total/size, total/big/8, float64(moved)/1e6/stats.el.Seconds(), ratio, stats)
}

// rcTransferStats sums the protocol events of both QPs of a transfer.
type rcTransferStats struct {
	rcStats
	el time.Duration
}

func (s rcTransferStats) String() string {
	return fmt.Sprintf("in %v: %d sequence NAKs (%d repeated), %d selective resends, %d go-back-N, %d early retransmissions, %d ACK timeouts, %d RNR NAKs; %d requests kept beyond gaps, %d not",
		s.el.Round(time.Millisecond), s.seqNAKs, s.reNAKs, s.selects, s.goBacks, s.early, s.timeouts, s.rnrNAKs, s.kept, s.notKept)
}

// rcLossyTransfer moves total bytes as size-byte messages from a to b and total/8 as
// big-byte messages from b to a at the same time, with the faults f on the fabric
// and the path MTU 2048, and checks that every message arrives exactly once, in
// order and intact. It returns the bytes moved, the packets both ports sent per data
// packet, and the QPs' protocol events.
func rcLossyTransfer(t testing.TB, f Faults, total, size, big int) (moved int, ratio float64, st rcTransferStats) {
	count := total / size
	bigCount := total / big / 8
	_, smh, nodes := fabric(t, "", "a", "b")
	// Both send PSNs wrap early in the transfer.
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU2048, timeout: 14, retryCnt: 7, rnrRetry: 7,
		psnA: 0xffff00, psnB: 0xfff000, maxRecv: 1024})
	setFaults(t, smh, nodes, f)
	// Message i is a slice of pool that depends on i, starting with i itself.
	pool := pattern(42, 2<<20)
	msgOff := func(i, n int) int { return (i * 4099) % (len(pool) - n) }
	type dir struct {
		src, dst *rcEnd
		size, n  int
		buf      []byte
		mu       sync.Mutex
		next     int
		bad      int // wrong messages seen
		stop     func()
	}
	dirs := []*dir{{src: a, dst: b, size: size, n: count}, {src: b, dst: a, size: big, n: bigCount}}
	for _, d := range dirs {
		d.buf = make([]byte, d.size)
		d.stop = d.dst.sink(t, 4*1024*1024/d.size+64, d.size, func(wc verbs.WC, data []byte) {
			d.mu.Lock()
			defer d.mu.Unlock()
			off := msgOff(d.next, d.size)
			var bad string
			switch {
			case data == nil:
				bad = fmt.Sprintf("receive completion %+v", wc)
			case len(data) != d.size || binary.BigEndian.Uint64(data) != uint64(d.next):
				bad = fmt.Sprintf("%d bytes, sequence %d", len(data), binary.BigEndian.Uint64(data))
			case !bytes.Equal(data[8:], pool[off+8:off+d.size]):
				bad = "content differs"
			}
			if bad != "" {
				if d.bad++; d.bad <= 10 {
					t.Errorf("%d-byte message %d: %s", d.size, d.next, bad)
				}
			}
			d.next++
		})
	}
	// PostSend copies the message, so one buffer per direction serves all.
	gen := func(d *dir) func(i int) []byte {
		return func(i int) []byte {
			off := msgOff(i, d.size)
			copy(d.buf, pool[off:off+d.size])
			binary.BigEndian.PutUint64(d.buf, uint64(i))
			return d.buf
		}
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- b.streamErr(bigCount, 8, gen(dirs[1])) }()
	a.stream(t, count, 128, gen(dirs[0]))
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		waitFor(t, "all messages received", func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.next >= d.n })
	}
	st.el = time.Since(start)
	time.Sleep(20 * time.Millisecond) // duplicates still on their way must not be delivered
	for _, d := range dirs {
		d.stop()
		if n := d.dst.rcq.Poll(make([]verbs.WC, 1)); n != 0 || d.next != d.n {
			t.Fatalf("%d-byte messages: %d delivered for %d sent", d.size, d.next+n, d.n)
		}
	}
	moved = count*size + bigCount*big
	ca, cb := nodes[0].SoftPort(1).Counters(), nodes[1].SoftPort(1).Counters()
	ratio = float64(ca.XmitPackets+cb.XmitPackets) / float64(moved/2048)
	if !f.zero() {
		// Not vacuous: the faults bit, so duplicates and resends were on their way
		// when delivery was checked.
		var lost, dup uint64
		for _, h := range nodes {
			lost += h.SoftPort(1).ep.lost.Load()
			dup += h.SoftPort(1).ep.duplicated.Load()
		}
		if lost == 0 || f.Dup > 0 && dup == 0 {
			t.Fatalf("the fabric lost %d and duplicated %d packets: the faults did not bite", lost, dup)
		}
	}
	for _, h := range nodes {
		// Everything was delivered: nothing is kept beyond a gap any more.
		if n := h.oooBytes.Load(); n != 0 {
			t.Fatalf("%s keeps %d bytes of requests after the transfer", h.Name(), n)
		}
	}
	for _, e := range []*rcEnd{a, b} {
		if st := e.qp.State(); st != verbs.QPRTS {
			t.Fatalf("%v in %v after the transfer", e.qp, st)
		}
		if err := rcCheck(e.q); err != nil {
			t.Fatal(err)
		}
		e.q.mu.Lock()
		s := e.q.rc.stats
		e.q.mu.Unlock()
		st.seqNAKs += s.seqNAKs
		st.reNAKs += s.reNAKs
		st.goBacks += s.goBacks
		st.selects += s.selects
		st.kept += s.kept
		st.notKept += s.notKept
		st.early += s.early
		st.timeouts += s.timeouts
		st.rnrNAKs += s.rnrNAKs
	}
	return moved, ratio, st
}

// TestRCSequenceNAKResends loses a message on the fabric, then hands the sender a PSN
// sequence error NAK: it must resend at once (there is no ACK timeout, so nothing else
// makes it resend), and only once for a duplicated NAK. It resends the NAKed packet
// alone (twice, asking for an ACK); the ACK for it alone says the responder kept
// nothing after it, and the sender goes back N for the rest: 4 packets for the
// 3-packet message.
func TestRCSequenceNAKResends(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU256, noTimeout: true, retryCnt: 7, rnrRetry: 7, psnA: 500})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 1000)})
	setFaults(t, smh, nodes, Faults{Loss: 1})
	msg := pattern(5, 700) // 3 packets
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{msg}, Signaled: true})
	quiet(t, b.rcq, 20*time.Millisecond, "receiver with all packets lost")
	setFaults(t, smh, nodes, Faults{})
	pa := nodes[0].SoftPort(1)
	before := pa.Counters().XmitPackets
	nak := craft(t, nodes[1], nodes[0], wire.Packet{BTH: wire.BTH{Opcode: wire.OpRCAck, PKey: 0xffff, DestQP: uint32(a.qp.Num()), PSN: 500},
		AETH: wire.AETH{Syndrome: 0x60}})
	start := time.Now()
	pa.receive([]Datagram{{Addr: nodes[1].Endpoint(1), Data: nak}, {Addr: nodes[1].Endpoint(1), Data: nak}}, true)
	wc := pollN(t, b.rcq, 1, time.Second)[0]
	if wc.Status != verbs.WCSuccess || wc.ByteLen != len(msg) {
		t.Fatalf("after the NAK: %+v", wc)
	}
	if wc := pollN(t, a.scq, 1, time.Second)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("send: %+v", wc)
	}
	if n := pa.Counters().XmitPackets - before; n != 4 {
		t.Fatalf("%d packets resent for a 3-packet message and a duplicated NAK, want 4", n)
	}
	if st := rcStatsOf(a); st.selects != 1 || st.goBacks != 1 {
		t.Fatalf("requester: %+v, want one selective resend, then one go-back", st)
	}
	t.Logf("resent and delivered %v after the NAK", time.Since(start))
}

// TestRCSelectiveRepeat: packets lost on the fabric are resent alone. The first of
// four one-packet messages is lost; the responder keeps the three after the gap and
// NAKs it; the requester resends that packet alone (twice) and all four are delivered
// in order, 6 packets sent in all (go-back-N sends 8). With the HCA's budget for kept
// requests spent, the responder keeps nothing and NAKs the next PSN once the gap is
// filled; a NAK for the PSN right after a resend says a burst was lost, and the rest
// is resent as a run. With room for two, the gap behind them draws a NAK of its own
// once the first is filled (there is no ACK timeout here: without that NAK the
// transfer would stall), once: the ACK for that resend alone then sends the requester
// back N. A burst of three lost is resent as a run after the second NAK. Both PSN
// spaces wrap in the middle.
func TestRCSelectiveRepeat(t *testing.T) {
	cases := []struct {
		name                string
		msgs, lost          int
		room                int // kept requests the budget allows; -1: all
		sent                uint64
		selects, goBacks    uint64
		kept, notKept, naks uint64
		// The run arrives in batches the fabric's reader makes: the end of each
		// but the last, with the gap still open, draws a NAK the requester takes
		// for what it is (the run on its way).
		moreNAKs bool
	}{
		{"one lost", 4, 1, -1, 4 + 2, 1, 0, 3, 0, 1, false},
		{"budget spent", 4, 1, 0, 4 + 2 + 3, 2, 0, 0, 3, 2, true},
		{"room for two", 6, 1, 2, 6 + 2 + 2 + 2, 2, 1, 2, 3, 2, false},
		{"a burst", 8, 3, -1, 8 + 2 + 7, 2, 0, 5, 0, 2, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, smh, nodes := fabric(t, "", "a", "b")
			a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU256, noTimeout: true, retryCnt: 7, rnrRetry: 7,
				psnA: wire.MaxPSN - 1, psnB: wire.MaxPSN})
			for i := range c.msgs {
				b.postRecv(t, verbs.RecvWR{ID: uint64(i), Buf: make([]byte, 100)})
			}
			used := int64(0)
			if c.room >= 0 {
				used = rcOOOBudget - int64(c.room)*oooBufCap
				nodes[1].oooBytes.Add(used)
			}
			pa := nodes[0].SoftPort(1)
			before := pa.Counters().XmitPackets
			wr := func(i int) verbs.SendWR {
				return verbs.SendWR{ID: uint64(i), Data: [][]byte{[]byte(fmt.Sprintf("message %d", i))}, Signaled: true}
			}
			setFaults(t, smh, nodes, Faults{Loss: 1})
			for i := range c.lost {
				a.post(t, wr(i))
			}
			setFaults(t, smh, nodes, Faults{})
			// In one post, so that the rest are on their way before the NAK is.
			var rest []verbs.SendWR
			for i := c.lost; i < c.msgs; i++ {
				rest = append(rest, wr(i))
			}
			a.post(t, rest...)
			for i := range c.msgs {
				wc := pollN(t, b.rcq, 1, time.Second)[0]
				if wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) || wc.ByteLen != len(wr(i).Data[0]) {
					t.Fatalf("delivery %d: %+v", i, wc)
				}
			}
			for i := range c.msgs {
				if wc := pollN(t, a.scq, 1, time.Second)[0]; wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) {
					t.Fatalf("send completion %d: %+v", i, wc)
				}
			}
			quiet(t, b.rcq, 20*time.Millisecond, "after the messages")
			sa, sb := rcStatsOf(a), rcStatsOf(b)
			naksOK := sb.seqNAKs == c.naks || c.moreNAKs && sb.seqNAKs > c.naks
			if sa.selects != c.selects || sa.goBacks != c.goBacks || sb.kept != c.kept || sb.notKept != c.notKept || !naksOK {
				t.Fatalf("requester %+v, responder %+v: want %d selective resends, %d go-backs, %d kept, %d not, %d NAKs",
					sa, sb, c.selects, c.goBacks, c.kept, c.notKept, c.naks)
			}
			if n := pa.Counters().XmitPackets - before; n != c.sent {
				t.Fatalf("%d packets sent for %d one-packet messages, the first %d lost once: want %d", n, c.msgs, c.lost, c.sent)
			}
			if n := nodes[1].oooBytes.Load(); n != used {
				t.Fatalf("%d bytes kept after the transfer", n-used)
			}
			nodes[1].oooBytes.Add(-used)
			for _, e := range []*rcEnd{a, b} {
				if err := rcCheck(e.q); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// setFaults sets the fabric's faults through the subnet manager and waits until every
// node applies them.
func setFaults(t testing.TB, smh *HCA, nodes []*HCA, f Faults) {
	t.Helper()
	if err := smh.SM().SetFaults(f); err != nil {
		t.Fatal(err)
	}
	for _, h := range nodes {
		waitFor(t, "faults on "+h.Name(), func() bool {
			g := h.SoftPort(1).ep.faults.Load()
			return g == nil && f.zero() || g != nil && *g == f
		})
	}
}

func rcStatsOf(e *rcEnd) rcStats {
	e.q.mu.Lock()
	defer e.q.mu.Unlock()
	return e.q.rc.stats
}

// TestRCRepeatedNAK: the requester ignores the second copy of a sequence NAK, but a
// NAK for the same PSN that comes after its resend says the resend was lost too, and
// it resends again at once (there is no ACK timeout, so nothing else makes it resend).
// Each resend is the NAKed packet alone, sent twice and asking for an ACK; when it
// arrives, its ACK says nothing after it was kept, and the rest follows (go-back-N).
func TestRCRepeatedNAK(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU256, noTimeout: true, retryCnt: 7, rnrRetry: 7, psnA: 500})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 1000)})
	setFaults(t, smh, nodes, Faults{Loss: 1})
	msg := pattern(6, 700) // 3 packets
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{msg}, Signaled: true})
	pa := nodes[0].SoftPort(1)
	nak := craft(t, nodes[1], nodes[0], wire.Packet{BTH: wire.BTH{Opcode: wire.OpRCAck, PKey: 0xffff, DestQP: uint32(a.qp.Num()), PSN: 500},
		AETH: wire.AETH{Syndrome: 0x60}})
	// What a sends: PSN and AckReq of every request packet the fabric does not lose.
	var mu sync.Mutex
	var sent []string
	stop := pa.tap.subscribe(func(rec []byte) {
		var pkt wire.Packet
		if len(rec) < 16+28 || wire.Parse(rec[16+28:], &pkt) != nil || pkt.BTH.Opcode == wire.OpRCAck {
			return
		}
		mu.Lock()
		sent = append(sent, fmt.Sprintf("%d ackreq=%v", pkt.BTH.PSN, pkt.BTH.AckReq))
		mu.Unlock()
	})
	defer stop()
	resent := func(naks int) uint64 {
		mu.Lock()
		sent = nil
		mu.Unlock()
		before := pa.Counters().XmitPackets
		batch := make([]Datagram, naks)
		for i := range batch {
			batch[i] = Datagram{Addr: nodes[1].Endpoint(1), Data: nak}
		}
		pa.receive(batch, true)
		return pa.Counters().XmitPackets - before
	}
	if n := resent(2); n != 2 {
		t.Fatalf("a NAK and its copy: %d packets resent, want 2", n)
	}
	// The resends were lost too: the responder NAKs again.
	if n := resent(1); n != 2 {
		t.Fatalf("a NAK after the resend: %d packets resent, want 2", n)
	}
	setFaults(t, smh, nodes, Faults{})
	resent(1) // the rest may follow before it returns: what was sent is checked below
	if wc := pollN(t, b.rcq, 1, time.Second)[0]; wc.Status != verbs.WCSuccess || wc.ByteLen != len(msg) {
		t.Fatalf("after the NAKs: %+v", wc)
	}
	if wc := pollN(t, a.scq, 1, time.Second)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("send: %+v", wc)
	}
	mu.Lock()
	got := strings.Join(sent, ", ")
	mu.Unlock()
	if want := "500 ackreq=true, 500 ackreq=true, 501 ackreq=false, 502 ackreq=true"; got != want {
		t.Fatalf("after the third NAK: sent %q, want %q", got, want)
	}
	if st := rcStatsOf(a); st.selects != 3 || st.goBacks != 1 || st.timeouts != 0 {
		t.Fatalf("requester: %+v, want 3 selective resends, a go-back and no timeout", st)
	}
}

// TestRCResponderNAKs drives a responder with crafted packets: packets beyond the
// expected PSN are kept; when the expected one comes later in the same batch, all are
// accepted and an ACK names the last (twice, no NAK); a gap left at the end of a batch draws
// a NAK sent twice; the packets after it are kept silently until the requester is seen
// going back (two packets in order below the highest since the NAK) without the
// expected one, which draws the NAK once more; the expected one then delivers
// everything kept after it, and a gap behind those draws its own NAK (no ACK: the NAK
// acknowledges what came before it).
func TestRCResponderNAKs(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	_, b := rcPair(t, nodes[0], nodes[1], rcOpts{psnA: 1000, psnB: 2000})
	for i := range 16 {
		b.postRecv(t, verbs.RecvWR{ID: uint64(i), Buf: make([]byte, 100)})
	}
	pb := nodes[1].SoftPort(1)
	send := func(psn uint32) []byte {
		return craft(t, nodes[0], nodes[1], wire.Packet{BTH: wire.BTH{Opcode: wire.OpRCSendOnly, PKey: 0xffff,
			DestQP: uint32(b.qp.Num()), PSN: psn, AckReq: true}, Payload: []byte(fmt.Sprint(psn))})
	}
	// inject hands b one batch and returns the ACKs and NAKs b sent for it.
	var mu sync.Mutex
	var sent []string
	stop := pb.tap.subscribe(func(rec []byte) {
		var pkt wire.Packet
		if len(rec) < 16+28 || wire.Parse(rec[16+28:], &pkt) != nil || pkt.BTH.Opcode != wire.OpRCAck {
			return
		}
		kind := "ACK"
		switch {
		case pkt.AETH.Syndrome == 0x60:
			kind = "NAK"
		case pkt.AETH.Syndrome&0x60 == 0x20:
			kind = "RNR"
		}
		mu.Lock()
		sent = append(sent, fmt.Sprintf("%s %d", kind, pkt.BTH.PSN))
		mu.Unlock()
	})
	defer stop()
	inject := func(psns ...uint32) string {
		var batch []Datagram
		for _, psn := range psns {
			batch = append(batch, Datagram{Addr: nodes[0].Endpoint(1), Data: send(psn)})
		}
		mu.Lock()
		sent = nil
		mu.Unlock()
		pb.receive(batch, true)
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(sent, ", ")
	}
	delivered := func(want ...uint32) {
		t.Helper()
		for _, psn := range want {
			wc := pollN(t, b.rcq, 1, time.Second)[0]
			if wc.Status != verbs.WCSuccess || wc.ByteLen != len(fmt.Sprint(psn)) {
				t.Fatalf("delivery of PSN %d: %+v", psn, wc)
			}
		}
		quiet(t, b.rcq, 0, "after the deliveries")
	}
	steps := []struct {
		name string
		psns []uint32
		want string
	}{
		{"overtaken", []uint32{1001, 1000}, "ACK 1001, ACK 1001"},
		{"gap", []uint32{1003}, "NAK 1002, NAK 1002"},
		{"after the gap, two swapped", []uint32{1004, 1006, 1005, 1007}, ""},
		{"going back without the expected one", []uint32{1003, 1004}, "NAK 1002"},
		{"the rest of the resend", []uint32{1005, 1006}, ""},
		{"the expected one", []uint32{1002}, "ACK 1007, ACK 1007"},
		{"a copy of one kept", []uint32{1003}, "ACK 1007"},
		{"two gaps", []uint32{1009, 1011}, "NAK 1008, NAK 1008"},
		{"the first filled", []uint32{1008}, "NAK 1010, NAK 1010"},
		{"the second", []uint32{1010}, "ACK 1011, ACK 1011"},
	}
	for _, st := range steps {
		if got := inject(st.psns...); got != st.want {
			t.Fatalf("%s (PSNs %v): sent %q, want %q", st.name, st.psns, got, st.want)
		}
	}
	delivered(1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011)
	if st := rcStatsOf(b); st.seqNAKs != 3 || st.reNAKs != 1 || st.kept != 8 {
		t.Fatalf("responder: %+v, want three NAKs, one repeat, 8 requests kept", st)
	}
	// After an RNR NAK the requester goes back N: nothing is kept.
	for _, st := range []struct {
		name string
		psns []uint32
		want string
	}{
		{"the last four buffers", []uint32{1012, 1013, 1014, 1015}, "ACK 1012, ACK 1015"},
		{"no buffer", []uint32{1016}, "RNR 1016"},
		{"after the RNR NAK", []uint32{1017, 1018}, ""},
	} {
		if got := inject(st.psns...); got != st.want {
			t.Fatalf("%s (PSNs %v): sent %q, want %q", st.name, st.psns, got, st.want)
		}
	}
	delivered(1012, 1013, 1014, 1015)
	if st := rcStatsOf(b); st.kept != 8 {
		t.Fatalf("responder: %d requests kept, 8 before the RNR NAK", st.kept)
	}
	for i := range 3 {
		b.postRecv(t, verbs.RecvWR{ID: uint64(100 + i), Buf: make([]byte, 100)})
	}
	if got, want := inject(1016), "ACK 1016"; got != want {
		t.Fatalf("the resend after the RNR wait: sent %q, want %q", got, want)
	}
	if got, want := inject(1017, 1018), "ACK 1017, ACK 1018"; got != want {
		t.Fatalf("the rest of it: sent %q, want %q", got, want)
	}
	delivered(1016, 1017, 1018)
	if n := nodes[1].oooBytes.Load(); n != 0 {
		t.Fatalf("%d bytes still kept", n)
	}
}

// TestRCEarlyRetransmission: when packets and ACKs are lost, the requester retransmits
// early, without waiting for its ACK timeout (4 s) and without counting a retry: a
// message posted while the fabric drops everything completes once the fabric heals,
// with no ACK timeout spent.
func TestRCEarlyRetransmission(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{timeout: 20, retryCnt: 1, rnrRetry: 7})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 100)}, verbs.RecvWR{ID: 2, Buf: make([]byte, 100)})
	// The first message measures the round trip.
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("first")}, Signaled: true})
	for _, cq := range []verbs.CQ{b.rcq, a.scq} {
		if wc := pollN(t, cq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess {
			t.Fatalf("first message: %+v", wc)
		}
	}
	setFaults(t, smh, nodes, Faults{Loss: 1})
	a.post(t, verbs.SendWR{ID: 2, Data: [][]byte{[]byte("second")}, Signaled: true})
	quiet(t, b.rcq, 20*time.Millisecond, "receiver on a fabric that drops everything")
	setFaults(t, smh, nodes, Faults{})
	for _, cq := range []verbs.CQ{b.rcq, a.scq} {
		if wc := pollN(t, cq, 1, 10*time.Second)[0]; wc.Status != verbs.WCSuccess || wc.WRID != 2 {
			t.Fatalf("second message: %+v", wc)
		}
	}
	if st := rcStatsOf(a); st.timeouts != 0 || st.early == 0 {
		t.Fatalf("requester: %+v, want early retransmissions and no ACK timeout", st)
	}
}

func TestRCRNRWaitsForReceiveBuffers(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	// Generous transport retries: only RNR is under test, and a loaded machine may
	// delay an RNR NAK past a short ACK timeout.
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{rnrRetry: 7, retryCnt: 7, timeout: 14})
	msgs := [][]byte{pattern(1, 100), pattern(2, 10000), pattern(3, 0)}
	for i, m := range msgs {
		a.post(t, verbs.SendWR{ID: uint64(i), Data: [][]byte{m}, Signaled: true})
	}
	before := nodes[0].SoftPort(1).Counters().XmitPackets
	quiet(t, a.scq, 100*time.Millisecond, "sender while the receiver has no buffers")
	retries := nodes[0].SoftPort(1).Counters().XmitPackets - before
	if a.qp.State() != verbs.QPRTS || retries == 0 {
		t.Fatalf("after 100 ms of RNR: state %v, %d packets resent", a.qp.State(), retries)
	}
	bufs := make([][]byte, len(msgs))
	for i := range bufs {
		bufs[i] = make([]byte, 20000)
		b.postRecv(t, verbs.RecvWR{ID: uint64(i), Buf: bufs[i]})
	}
	for i, wc := range pollN(t, b.rcq, len(msgs), 5*time.Second) {
		if wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) || !bytes.Equal(bufs[i][:wc.ByteLen], msgs[i]) {
			t.Fatalf("message %d: %+v", i, wc)
		}
	}
	for i, wc := range pollN(t, a.scq, len(msgs), 5*time.Second) {
		if wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
	t.Logf("%d packets resent during the 100 ms RNR wait", retries)
}

func TestRCRNRRetryExhausted(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	for _, rnr := range []uint8{0, 3} {
		a, b := rcPair(t, nodes[0], nodes[1], rcOpts{rnrRetry: rnr, retryCnt: 7})
		a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("no buffer")}},
			verbs.SendWR{ID: 2, Data: [][]byte{[]byte("behind it")}})
		wcs := pollN(t, a.scq, 2, 5*time.Second)
		if wcs[0].WRID != 1 || wcs[0].Status != verbs.WCRNRRetryExcErr || wcs[1].WRID != 2 || wcs[1].Status != verbs.WCWRFlushErr {
			t.Fatalf("RNR retry %d: completions %+v", rnr, wcs)
		}
		if a.qp.State() != verbs.QPErr || b.qp.State() != verbs.QPRTS {
			t.Fatalf("RNR retry %d: states %v %v", rnr, a.qp.State(), b.qp.State())
		}
	}
}

func TestRCPeerGoneRetryExceeded(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{timeout: 8, retryCnt: 3, rnrRetry: 7})
	b.postRecv(t, verbs.RecvWR{ID: 9, Buf: make([]byte, 100)})
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("hello")}, Signaled: true})
	if wc := pollN(t, a.scq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("first send %+v", wc)
	}
	nodes[1].Close()
	start := time.Now()
	a.post(t, verbs.SendWR{ID: 2, Data: [][]byte{make([]byte, 10000)}},
		verbs.SendWR{ID: 3, Data: [][]byte{[]byte("x")}}, verbs.SendWR{ID: 4, Data: [][]byte{{}}})
	wcs := pollN(t, a.scq, 3, 10*time.Second)
	el := time.Since(start)
	if wcs[0].WRID != 2 || wcs[0].Status != verbs.WCRetryExcErr {
		t.Fatalf("first completion %+v, want retry exceeded on WR 2", wcs[0])
	}
	for i, wc := range wcs[1:] {
		if wc.WRID != uint64(3+i) || wc.Status != verbs.WCWRFlushErr {
			t.Fatalf("completion %+v, want WR %d flushed", wc, 3+i)
		}
	}
	if st := a.qp.State(); st != verbs.QPErr {
		t.Fatalf("state %v after retry exhaustion", st)
	}
	// 1 transmission and 3 retries, each waiting the 1 ms floor of the timeout.
	if el < 4*time.Millisecond {
		t.Fatalf("retries exhausted after %v, faster than 4 timeouts", el)
	}
	// Work requests posted in ERR are flushed.
	a.post(t, verbs.SendWR{ID: 5, Data: [][]byte{[]byte("late")}})
	if wc := pollN(t, a.scq, 1, time.Second)[0]; wc.WRID != 5 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("WR posted in ERR: %+v", wc)
	}
	t.Logf("retry exhaustion after %v", el)
}

func TestRCStateMachine(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	o := rcOpts{}
	o.defaults()
	a := newRCEnd(t, nodes[0], o)
	b := newRCEnd(t, nodes[1], o)
	st := func(s verbs.QPState) verbs.QPModify { return verbs.QPModify{Mask: verbs.QPMaskState, State: s} }
	rtr := verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskDestQPN | verbs.QPMaskAH | verbs.QPMaskPathMTU | verbs.QPMaskRQPSN,
		State: verbs.QPRTR, DestQPN: b.qp.Num(), AH: verbs.AHAttr{DLID: b.lid()}, PathMTU: verbs.MTU2048, RQPSN: 7}
	rts := verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskSQPSN | verbs.QPMaskTimeout | verbs.QPMaskRetry,
		State: verbs.QPRTS, SQPSN: 9, Timeout: 14, RetryCnt: 7, RNRRetry: 7}
	if _, err := a.qp.PostSend([]verbs.SendWR{{Data: [][]byte{[]byte("x")}}}); err == nil {
		t.Fatal("post_send in RESET accepted")
	} else {
		wantErr(t, err, verbs.ErrInvalidState, "post_send in RESET")
	}
	wantErr(t, a.qp.Modify(rtr), verbs.ErrInvalidState, "RESET -> RTR")
	wantErr(t, a.qp.Modify(st(verbs.QPInit)), verbs.ErrInvalidState, "RESET -> INIT without P_Key index")
	wantErr(t, a.qp.Modify(st(verbs.QPRTS)), verbs.ErrInvalidState, "RESET -> RTS")
	if err := a.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{Data: [][]byte{[]byte("x")}}}); err == nil {
		t.Fatal("post_send in INIT accepted")
	} else {
		wantErr(t, err, verbs.ErrInvalidState, "post_send in INIT")
	}
	wantErr(t, a.qp.Modify(rts), verbs.ErrInvalidState, "INIT -> RTS")
	missing := rtr
	missing.Mask &^= verbs.QPMaskDestQPN
	wantErr(t, a.qp.Modify(missing), verbs.ErrInvalidState, "INIT -> RTR without a destination QPN")
	extra := rtr
	extra.Mask |= verbs.QPMaskSQPSN
	wantErr(t, a.qp.Modify(extra), verbs.ErrInvalidState, "INIT -> RTR with an SQ PSN")
	badMTU := rtr
	badMTU.PathMTU = 0
	wantErr(t, a.qp.Modify(badMTU), verbs.ErrInvalid, "path MTU 0")
	badLID := rtr
	badLID.AH.DLID = 0xc001
	wantErr(t, a.qp.Modify(badLID), verbs.ErrInvalid, "multicast DLID")
	if err := a.qp.Modify(rtr); err != nil {
		t.Fatal(err)
	}
	wantErr(t, a.qp.Modify(rtr), verbs.ErrInvalidState, "RTR -> RTR")
	if _, err := a.qp.PostSend([]verbs.SendWR{{Data: [][]byte{[]byte("x")}}}); err == nil {
		t.Fatal("post_send in RTR accepted")
	} else {
		wantErr(t, err, verbs.ErrInvalidState, "post_send in RTR")
	}
	badRetry := rts
	badRetry.RetryCnt = 8
	wantErr(t, a.qp.Modify(badRetry), verbs.ErrInvalid, "retry count 8")
	if err := a.qp.Modify(rts); err != nil {
		t.Fatal(err)
	}
	if a.qp.State() != verbs.QPRTS {
		t.Fatalf("state %v", a.qp.State())
	}
	wantErr(t, a.qp.Modify(st(verbs.QPInit)), verbs.ErrInvalidState, "RTS -> INIT")
	wantErr(t, a.qp.Modify(rtr), verbs.ErrInvalidState, "RTS -> RTR")
	if err := a.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskTimeout, State: verbs.QPRTS, Timeout: 16}); err != nil {
		t.Fatalf("RTS -> RTS with a new timeout: %v", err)
	}
	if err := a.qp.AttachMcast(mustGID(t, "ff12:401b:ffff::1"), 0xc001); err == nil {
		t.Fatal("RC QP attached to a multicast group")
	}
	// ERR flushes posted receives; RESET and a new connection work again.
	a.postRecv(t, verbs.RecvWR{ID: 77, Buf: make([]byte, 10)})
	if err := a.qp.Modify(st(verbs.QPErr)); err != nil {
		t.Fatal(err)
	}
	if wc := pollN(t, a.rcq, 1, time.Second)[0]; wc.WRID != 77 || wc.Status != verbs.WCWRFlushErr {
		t.Fatalf("receive after ERR: %+v", wc)
	}
	wantErr(t, a.qp.Modify(st(verbs.QPRTS)), verbs.ErrInvalidState, "ERR -> RTS")
	if err := a.connect(b.qp.Num(), b.lid(), 5, 6, 0, o); err != nil {
		t.Fatal(err)
	}
	if err := b.connect(a.qp.Num(), a.lid(), 6, 5, 0, o); err != nil {
		t.Fatal(err)
	}
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 100)})
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("again")}, Signaled: true})
	if wc := pollN(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess || wc.ByteLen != 5 {
		t.Fatalf("after reconnect: %+v", wc)
	}
	// Oversized messages and a full send queue are refused at post time.
	n, err := a.qp.PostSend([]verbs.SendWR{{ID: 2, Data: [][]byte{make([]byte, 1<<20), {1}}}})
	if n != 0 {
		t.Fatalf("message of 1 MiB + 1 accepted")
	}
	wantErr(t, err, verbs.ErrInvalid, "message of 1 MiB + 1")
}

func TestRCSendQueueFull(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	a, _ := rcPair(t, nodes[0], nodes[1], rcOpts{maxSend: 4, rnrRetry: 7})
	wrs := make([]verbs.SendWR, 6)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Data: [][]byte{[]byte("waits for a receive buffer")}}
	}
	n, err := a.qp.PostSend(wrs)
	if n != 4 {
		t.Fatalf("%d of 6 accepted with MaxSendWR 4", n)
	}
	wantErr(t, err, verbs.ErrQueueFull, "post beyond MaxSendWR")
}

func TestRCMessageLargerThanRemoteBuffer(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{mtu: verbs.MTU1024})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 3000)}, verbs.RecvWR{ID: 2, Buf: make([]byte, 3000)})
	a.post(t, verbs.SendWR{ID: 10, Data: [][]byte{make([]byte, 2500)}},
		verbs.SendWR{ID: 11, Data: [][]byte{make([]byte, 5000)}},
		verbs.SendWR{ID: 12, Data: [][]byte{make([]byte, 10)}})
	wcs := pollN(t, a.scq, 2, 5*time.Second)
	if wcs[0].WRID != 11 || wcs[0].Status != verbs.WCRemInvReqErr || wcs[1].WRID != 12 || wcs[1].Status != verbs.WCWRFlushErr {
		t.Fatalf("sender completions %+v", wcs)
	}
	rwcs := pollN(t, b.rcq, 2, 5*time.Second)
	if rwcs[0].WRID != 1 || rwcs[0].Status != verbs.WCSuccess || rwcs[0].ByteLen != 2500 || rwcs[1].WRID != 2 || rwcs[1].Status != verbs.WCLocLenErr {
		t.Fatalf("receiver completions %+v", rwcs)
	}
	if a.qp.State() != verbs.QPErr || b.qp.State() != verbs.QPErr {
		t.Fatalf("states %v %v", a.qp.State(), b.qp.State())
	}
}

// TestRCPartitions checks that packets carry the P_Key of the QP's index: QPs in the
// same partition talk, a QP of another partition drops them as P_Key violations.
func TestRCPartitions(t *testing.T) {
	_, _, nodes := fabric(t, "Default=0x7fff, ipoib : ALL=full;\nP1=0x0001 : ALL=full;\n", "a", "b")
	ix := func(h *HCA, k verbs.PKey) int {
		i, ok := h.SoftPort(1).FindPKey(k)
		if !ok || i == 0 {
			t.Fatalf("%s: P_Key %v at %d in %v", h.Name(), k, i, h.SoftPort(1).PKeyTable())
		}
		return i
	}
	ia, ib := ix(nodes[0], 0x8001), ix(nodes[1], 0x8001)
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{pkeyA: ia, pkeyB: ib})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 100)})
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("in P1")}, Signaled: true})
	if wc := pollN(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess || wc.PKeyIndex != ib {
		t.Fatalf("receive in P1: %+v", wc)
	}
	if wc := pollN(t, a.scq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("send in P1: %+v", wc)
	}
	// a's QP in P1, b's in the default partition.
	a, b = rcPair(t, nodes[0], nodes[1], rcOpts{pkeyA: ia, pkeyB: 0, timeout: 8, retryCnt: 2})
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 100)})
	before := nodes[1].SoftPort(1).Counters().BadPKey
	a.post(t, verbs.SendWR{ID: 2, Data: [][]byte{[]byte("across")}})
	if wc := pollN(t, a.scq, 1, 5*time.Second)[0]; wc.WRID != 2 || wc.Status != verbs.WCRetryExcErr {
		t.Fatalf("send across partitions: %+v", wc)
	}
	if got := nodes[1].SoftPort(1).Counters().BadPKey - before; got != 3 {
		t.Fatalf("%d P_Key violations for 1 transmission and 2 retries", got)
	}
	quiet(t, b.rcq, 0, "receiver in another partition")
}

// craft encodes an RC packet from port src to port dst.
func craft(t testing.TB, src, dst *HCA, pkt wire.Packet) []byte {
	sg, _ := src.SoftPort(1).GID(0)
	dg, _ := dst.SoftPort(1).GID(0)
	return pkt.AppendTo(nil, sg, dg)
}

func TestRCGarbageIsCountedAndDropped(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b", "c")
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{psnA: 1000, psnB: 2000})
	ud := newUD(t, nodes[1], 0, 0x0b1b)
	pb := nodes[1].SoftPort(1)
	b.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 8192)})
	from := func(h *HCA) netip.AddrPort { return h.Endpoint(1) }
	inject := func(h *HCA, data []byte) { pb.receive([]Datagram{{Addr: from(h), Data: data}}, true) }
	send := func(psn uint32, payload string) wire.Packet {
		return wire.Packet{BTH: wire.BTH{Opcode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: uint32(b.qp.Num()), PSN: psn, AckReq: true},
			Payload: []byte(payload)}
	}
	type step struct {
		name  string
		from  *HCA
		data  []byte
		check func(before, after verbs.PortCounters) bool
	}
	good := craft(t, nodes[0], nodes[1], send(1000, "good"))
	unknown := send(1000, "nobody")
	unknown.BTH.DestQP = 0x123456
	toUD := send(1000, "rc to ud")
	toUD.BTH.DestQP = uint32(ud.qp.Num())
	badKey := send(1000, "other partition")
	badKey.BTH.PKey = 0x8005
	badICRC := bytes.Clone(good)
	badICRC[len(badICRC)-1] ^= 1
	udToRC := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: uint32(b.qp.Num())},
		DETH: wire.DETH{QKey: 0, SrcQP: 0x99}, Payload: []byte("ud to rc")}
	delta := func(f func(c verbs.PortCounters) uint64, n uint64) func(b, a verbs.PortCounters) bool {
		return func(b, a verbs.PortCounters) bool { return f(a)-f(b) == n }
	}
	noQP := func(c verbs.PortCounters) uint64 { return c.NoQP }
	malformed := func(c verbs.PortCounters) uint64 { return c.Malformed }
	xmit := func(c verbs.PortCounters) uint64 { return c.XmitPackets }
	steps := []step{
		{"unknown QPN", nodes[0], craft(t, nodes[0], nodes[1], unknown), delta(noQP, 1)},
		{"RC opcode to a UD QP", nodes[0], craft(t, nodes[0], nodes[1], toUD), delta(noQP, 1)},
		{"UD opcode to an RC QP", nodes[0], craft(t, nodes[0], nodes[1], udToRC), delta(noQP, 1)},
		{"truncated", nodes[0], good[:13], delta(malformed, 1)},
		{"truncated to a BTH", nodes[0], good[:12], delta(malformed, 1)},
		{"cut short by 4", nodes[0], good[:len(good)-4], func(b, a verbs.PortCounters) bool { return a.BadICRC-b.BadICRC == 1 }},
		{"bad ICRC", nodes[0], badICRC, func(b, a verbs.PortCounters) bool { return a.BadICRC-b.BadICRC == 1 }},
		{"bad P_Key", nodes[0], craft(t, nodes[0], nodes[1], badKey), func(b, a verbs.PortCounters) bool { return a.BadPKey-b.BadPKey == 1 }},
		{"not the connected peer", nodes[2], craft(t, nodes[2], nodes[1], send(1000, "stranger")), delta(noQP, 1)},
		// A PSN far ahead draws one NAK (sent twice, against its loss), a second one
		// none.
		{"PSN far ahead", nodes[0], craft(t, nodes[0], nodes[1], send(1000+5000, "ahead")), delta(xmit, 2)},
		{"PSN far ahead again", nodes[0], craft(t, nodes[0], nodes[1], send(1000+6000, "ahead")), delta(xmit, 0)},
		// An old PSN is a duplicate: acknowledged again, not delivered.
		{"old PSN", nodes[0], craft(t, nodes[0], nodes[1], send(1000-3, "old")), delta(xmit, 1)},
	}
	for _, s := range steps {
		before := pb.Counters()
		inject(s.from, s.data)
		after := pb.Counters()
		if !s.check(before, after) {
			t.Fatalf("%s: counters before %+v after %+v", s.name, before, after)
		}
		if n := b.rcq.Poll(make([]verbs.WC, 1)); n != 0 {
			t.Fatalf("%s: delivered", s.name)
		}
	}
	if b.qp.State() != verbs.QPRTS || a.qp.State() != verbs.QPRTS {
		t.Fatalf("garbage changed states: %v %v", a.qp.State(), b.qp.State())
	}
	// The connection still works: a's real first packet has the expected PSN.
	a.post(t, verbs.SendWR{ID: 1, Data: [][]byte{[]byte("real")}, Signaled: true})
	if wc := pollN(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess || wc.ByteLen != 4 {
		t.Fatalf("real message after garbage: %+v", wc)
	}
	if wc := pollN(t, a.scq, 1, 5*time.Second)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("real send after garbage: %+v", wc)
	}
	// An in-sequence packet that breaks the protocol (MIDDLE without FIRST) from the
	// peer is a remote invalid request: NAK and ERR, as the specification wants.
	mid := send(1001, "")
	mid.BTH.Opcode = wire.OpRCSendMiddle
	mid.Payload = make([]byte, 4096)
	before := pb.Counters()
	inject(nodes[0], craft(t, nodes[0], nodes[1], mid))
	// At least the NAK goes out (an ACK still owed for the real message may go with it).
	if after := pb.Counters(); after.XmitPackets-before.XmitPackets < 1 || b.qp.State() != verbs.QPErr {
		t.Fatalf("protocol violation: %d packets sent, state %v", after.XmitPackets-before.XmitPackets, b.qp.State())
	}
}

// rcCheck verifies the invariants of an RC QP's state.
func rcCheck(q *QP) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	rc := q.rc
	r, s := &rc.req, &rc.resp
	if q.recvH > len(q.recvQ) {
		return fmt.Errorf("receive head %d beyond %d", q.recvH, len(q.recvQ))
	}
	switch q.state {
	case verbs.QPErr:
		if r.h != len(r.sq) || s.inMsg || len(q.recvQ) != q.recvH {
			return fmt.Errorf("ERR with work outstanding: %d sends, inMsg %v, %d receives", len(r.sq)-r.h, s.inMsg, len(q.recvQ)-q.recvH)
		}
		return nil
	case verbs.QPRTS:
	default:
		return fmt.Errorf("state %v", q.state)
	}
	if psnDiff(r.una, r.nxt) > 0 || psnDiff(r.nxt, r.smax) > 0 || psnDiff(r.smax, r.end) > 0 {
		return fmt.Errorf("PSNs una %#x nxt %#x smax %#x end %#x out of order", r.una, r.nxt, r.smax, r.end)
	}
	if r.cwnd < rcWinMin || r.cwnd > rc.winMax() {
		return fmt.Errorf("window %d", r.cwnd)
	}
	if r.h == len(r.sq) {
		if r.una != r.end {
			return fmt.Errorf("no message outstanding but una %#x end %#x", r.una, r.end)
		}
	} else {
		if d := psnDiff(r.una, r.sq[r.h].first); d < 0 || d >= r.sq[r.h].n {
			return fmt.Errorf("una %#x outside the oldest message %#x+%d", r.una, r.sq[r.h].first, r.sq[r.h].n)
		}
		for i := r.h; i+1 < len(r.sq); i++ {
			if psnAdd(r.sq[i].last(), 1) != r.sq[i+1].first {
				return fmt.Errorf("messages %d and %d not contiguous", i, i+1)
			}
		}
		if psnAdd(r.sq[len(r.sq)-1].last(), 1) != r.end {
			return fmt.Errorf("last message does not end at %#x", r.end)
		}
	}
	for i, e := range s.ooo[:s.oooH] {
		if e.buf != nil {
			return fmt.Errorf("kept slot %d before the head %d still holds a buffer", i, s.oooH)
		}
	}
	if n := len(s.ooo) - s.oooH; n > 0 && psnDiff(s.ooo[len(s.ooo)-1].pkt.BTH.PSN, s.epsn) > rcWinMaxPkts {
		return fmt.Errorf("kept PSN %#x more than a window past %#x", s.ooo[len(s.ooo)-1].pkt.BTH.PSN, s.epsn)
	}
	prev := s.epsn
	for _, e := range s.ooo[s.oooH:] {
		if psnDiff(e.pkt.BTH.PSN, prev) <= 0 {
			return fmt.Errorf("kept PSN %#x after %#x (expected PSN %#x)", e.pkt.BTH.PSN, prev, s.epsn)
		}
		prev = e.pkt.BTH.PSN
	}
	if s.inMsg && s.n > len(s.wr.Buf) {
		return fmt.Errorf("received %d bytes into a %d-byte buffer", s.n, len(s.wr.Buf))
	}
	return nil
}

func FuzzRCReceive(f *testing.F) {
	_, _, nodes := fabric(f, "", "a", "b")
	o := rcOpts{mtu: verbs.MTU256, timeout: 10, retryCnt: 7, rnrRetry: 7, psnA: 0xfffff0, psnB: 77}
	a, b := rcPair(f, nodes[0], nodes[1], o)
	o.defaults()
	pb := nodes[1].SoftPort(1)
	sgid, _ := nodes[0].SoftPort(1).GID(0)
	dgid, _ := pb.GID(0)
	bufs := func(t *testing.T, e *rcEnd) {
		e.q.mu.Lock()
		n := len(e.q.recvQ) - e.q.recvH
		e.q.mu.Unlock()
		for ; n < 4; n++ {
			e.postRecv(t, verbs.RecvWR{ID: 1, Buf: make([]byte, 700)})
		}
	}
	reconnect := func(t *testing.T) {
		o.psnA, o.psnB = rand.Uint32()&0xffffff, rand.Uint32()&0xffffff
		if err := a.connect(b.qp.Num(), b.lid(), o.psnA, o.psnB, 0, o); err != nil {
			t.Fatal(err)
		}
		if err := b.connect(a.qp.Num(), a.lid(), o.psnB, o.psnA, 0, o); err != nil {
			t.Fatal(err)
		}
	}
	ops := []uint8{wire.OpRCSendFirst, wire.OpRCSendMiddle, wire.OpRCSendLast, wire.OpRCSendLastImm,
		wire.OpRCSendOnly, wire.OpRCSendOnlyImm, wire.OpRCAck}
	f.Add([]byte("hello"), uint8(4), int16(0), true, uint8(0x1f), true)
	f.Add(make([]byte, 256), uint8(0), int16(0), false, uint8(0), true)
	f.Add(make([]byte, 100), uint8(2), int16(1), true, uint8(0), true)
	f.Add([]byte{}, uint8(6), int16(2), false, uint8(0x1f), true)
	f.Add([]byte{}, uint8(6), int16(0), false, uint8(0x60), true)
	f.Add([]byte{}, uint8(6), int16(0), false, uint8(0x2c), true)
	f.Add([]byte{}, uint8(6), int16(1), false, uint8(0x61), true)
	f.Add([]byte{0x04, 0, 0xff, 0xff, 0, 0, 0, 0, 0x80, 0, 0, 0, 1, 2, 3, 4}, uint8(0), int16(0), false, uint8(0), false)
	f.Fuzz(func(t *testing.T, payload []byte, op uint8, psnOff int16, ackReq bool, syn uint8, fix bool) {
		if a.qp.State() != verbs.QPRTS || b.qp.State() != verbs.QPRTS {
			reconnect(t)
		}
		bufs(t, a)
		bufs(t, b)
		// Keep a send of b's outstanding, so ACKs and NAKs meet a requester with work.
		b.q.mu.Lock()
		idle := b.q.rc.req.h == len(b.q.rc.req.sq)
		epsn, una := b.q.rc.resp.epsn, b.q.rc.req.una
		b.q.mu.Unlock()
		if idle {
			_, _ = b.qp.PostSend([]verbs.SendWR{{Data: [][]byte{make([]byte, 600)}}})
		}
		var data []byte
		if fix {
			pkt := wire.Packet{BTH: wire.BTH{Opcode: ops[int(op)%len(ops)], PKey: 0xffff, DestQP: uint32(b.qp.Num()),
				AckReq: ackReq, PSN: psnAdd(epsn, int(psnOff))}, Imm: 7, Payload: payload}
			if pkt.BTH.Opcode == wire.OpRCAck {
				pkt.BTH.PSN = psnAdd(una, int(psnOff))
				pkt.AETH = wire.AETH{Syndrome: syn, MSN: 1}
				pkt.Payload = nil
			}
			data = pkt.AppendTo(nil, sgid, dgid)
		} else {
			data = bytes.Clone(payload)
			if len(data) >= 8 {
				data[5], data[6], data[7] = byte(b.qp.Num()>>16), byte(b.qp.Num()>>8), byte(b.qp.Num())
			}
			if len(data) >= wire.MinPacketLen && len(data)%4 == 0 {
				binary.LittleEndian.PutUint32(data[len(data)-4:], wire.ICRC(data, sgid, dgid))
			}
		}
		pb.receive([]Datagram{{Addr: nodes[0].Endpoint(1), Data: data}}, true)
		// b's batch is over (a's may not be: it answers b on its own): what it
		// keeps, it has NAKed the gap before, and the HCA's budget counts it.
		b.q.mu.Lock()
		kept, naked, st := len(b.q.rc.resp.ooo)-b.q.rc.resp.oooH, b.q.rc.resp.nakSent, b.q.state
		b.q.mu.Unlock()
		if kept > 0 && (!naked || st != verbs.QPRTS) {
			t.Fatalf("b keeps %d requests in %v, NAK sent %v", kept, st, naked)
		}
		if n := nodes[1].oooBytes.Load(); n != int64(kept)*oooBufCap {
			t.Fatalf("b keeps %d requests, the budget counts %d bytes", kept, n)
		}
		for _, e := range []*rcEnd{a, b} {
			if err := rcCheck(e.q); err != nil {
				t.Fatalf("%s: %v", e.h.Name(), err)
			}
			wc := make([]verbs.WC, 64)
			for e.scq.Poll(wc) > 0 {
			}
			for e.rcq.Poll(wc) > 0 {
			}
		}
	})
}

// udpFabric starts two nodes and a subnet manager on UDP sockets of this process.
func udpFabric(t testing.TB) []*HCA {
	_, nodes := udpFabricSM(t)
	return nodes
}

// udpFabricSM is udpFabric that also returns the SM's HCA.
func udpFabricSM(t testing.TB) (*HCA, []*HCA) {
	lo := netip.MustParseAddrPort("127.0.0.1:0")
	smh, err := New(Config{Name: "sm", Network: UDPNetwork{}, Listen: lo, HostSM: true, Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	var nodes []*HCA
	for _, name := range []string{"a", "b"} {
		h, err := New(Config{Name: name, Network: UDPNetwork{}, Listen: lo, SM: smh.Endpoint(1), Heartbeat: testHB})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		nodes = append(nodes, h)
	}
	for _, h := range append([]*HCA{smh}, nodes...) {
		waitFor(t, h.Name()+" active with routes", func() bool {
			p := h.SoftPort(1)
			p.mu.RLock()
			defer p.mu.RUnlock()
			return p.attr.State == verbs.PortActive && len(p.uni) == 3
		})
	}
	return smh, nodes
}

func TestRCOverUDP(t *testing.T) {
	nodes := udpFabric(t)
	a, b := rcPair(t, nodes[0], nodes[1], rcOpts{timeout: 12, retryCnt: 7, rnrRetry: 7})
	const size, count = 64 << 10, 200
	next := 0
	var mu sync.Mutex
	stop := b.sink(t, 64, size, func(wc verbs.WC, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		if data == nil || len(data) != size || binary.BigEndian.Uint64(data) != uint64(next) {
			t.Errorf("message %d: %+v", next, wc)
		}
		next++
	})
	defer stop()
	a.stream(t, count, 64, func(i int) []byte {
		m := make([]byte, size)
		binary.BigEndian.PutUint64(m, uint64(i))
		return m
	})
	waitFor(t, "all received", func() bool { mu.Lock(); defer mu.Unlock(); return next == count })
}

// BenchmarkRC measures one RC connection carrying 64 KB messages.
func BenchmarkRC(b *testing.B) {
	for _, net := range []string{"mem", "udp"} {
		b.Run(net, func(b *testing.B) {
			var nodes []*HCA
			if net == "mem" {
				_, _, nodes = fabric(b, "", "a", "b")
			} else {
				nodes = udpFabric(b)
			}
			src, dst := rcPair(b, nodes[0], nodes[1], rcOpts{timeout: 12, retryCnt: 7, rnrRetry: 7})
			const size = 64 << 10
			stop := dst.sink(b, 128, size, func(wc verbs.WC, data []byte) {
				if data == nil {
					b.Errorf("receive %+v", wc)
				}
			})
			msg := make([]byte, size)
			b.SetBytes(size)
			b.ResetTimer()
			src.stream(b, b.N, 64, func(int) []byte { return msg })
			b.StopTimer()
			stop()
			c := nodes[0].SoftPort(1).Counters()
			b.ReportMetric(float64(c.XmitPackets)/float64(b.N), "pkts/msg")
		})
	}
}

// BenchmarkRCLoss runs the transfer of TestRCDeliversA100MBStreamExactlyAt5PercentLoss
// (100 MB of 64 KB messages one way, 12 MiB of 1 MiB messages the other) without loss
// and at 2% and 5% loss (1% duplication and 2% reordering besides), reporting the
// throughput and the packets sent per data packet. Run it with -benchtime=1x.
func BenchmarkRCLoss(b *testing.B) {
	for _, loss := range []float64{0, 0.02, 0.05} {
		b.Run(fmt.Sprintf("loss=%g%%", loss*100), func(b *testing.B) {
			f := Faults{}
			if loss > 0 {
				f = Faults{Loss: loss, Dup: 0.01, Reorder: 0.02}
			}
			var moved int
			var ratio float64
			var el time.Duration
			for range b.N {
				m, r, st := rcLossyTransfer(b, f, 100<<20, 64<<10, 1<<20)
				b.Logf("%s", st)
				moved, ratio, el = moved+m, ratio+r, el+st.el
			}
			b.ReportMetric(float64(moved)/1e6/el.Seconds(), "MB/s")
			b.ReportMetric(ratio/float64(b.N), "pkts/datapkt")
		})
	}
}

// A connected-mode message's encoded packets come from a pool and go back when it is
// acknowledged: streaming 64 KB messages allocates far less than a message's size
// each (a fresh 66 KiB buffer per message, zeroed and collected, was 15-20% of the
// sending daemon's CPU).
func TestRCMessageBuffersAreReused(t *testing.T) {
	nodes := udpFabric(t)
	src, dst := rcPair(t, nodes[0], nodes[1], rcOpts{timeout: 12, retryCnt: 7, rnrRetry: 7})
	const size, count = 64 << 10, 400
	stop := dst.sink(t, 128, size, func(wc verbs.WC, data []byte) {
		if data == nil {
			t.Errorf("receive %+v", wc)
		}
	})
	defer stop()
	msg := make([]byte, size)
	src.stream(t, 50, 64, func(int) []byte { return msg }) // warm the pool
	var before, after runtime.MemStats
	// No collection while measuring: each one empties the pool (into its victim
	// cache, emptied by the next), and how many run depends on the machine's load.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.ReadMemStats(&before)
	src.stream(t, count, 64, func(int) []byte { return msg })
	runtime.ReadMemStats(&after)
	// Without the pool a message costs 74 KB. With it about 1 KB; under -race, where
	// sync.Pool drops a quarter of what is put back at random, 20-30 KB (33 KB seen on
	// a loaded machine), so the bound there is three quarters of the size.
	limit := uint64(size / 4)
	if raceEnabled {
		limit = size * 3 / 4
	}
	if per := (after.TotalAlloc - before.TotalAlloc) / count; per > limit {
		t.Errorf("%d bytes allocated per %d-byte message, want well under its size", per, size)
	} else {
		t.Logf("%d bytes allocated per %d-byte message", per, size)
	}
}
