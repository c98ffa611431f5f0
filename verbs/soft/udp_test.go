//go:build linux

package soft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"ipoibfs/internal/testenv"
)

// udpRx collects copies of what an endpoint receives, per source address.
type udpRx struct {
	mu  sync.Mutex
	got map[netip.AddrPort][][]byte
	n   int
}

func (r *udpRx) handle(batch []Datagram, _ bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = make(map[netip.AddrPort][][]byte)
	}
	for _, d := range batch {
		r.got[d.Addr] = append(r.got[d.Addr], bytes.Clone(d.Data))
		r.n++
	}
}

func (r *udpRx) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// ended reports whether the last datagram from src is the end marker.
func (r *udpRx) ended(src netip.AddrPort) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.got[src]
	return len(g) > 0 && bytes.Equal(g[len(g)-1], endMarker)
}

func (r *udpRx) from(src netip.AddrPort) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[src]
}

// listenUDP opens a loopback endpoint; it is started by the caller.
func listenUDP(t *testing.T) *udpEndpoint {
	t.Helper()
	ep, err := UDPNetwork{}.Listen(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep.(*udpEndpoint)
}

// udpPayload is a datagram of size bytes (at least 6) that names its stream and
// sequence number and whose content depends on both.
func udpPayload(stream byte, seq, size int) []byte {
	b := make([]byte, size)
	b[0] = stream
	binary.BigEndian.PutUint32(b[1:], uint32(seq))
	for i := 5; i < size; i++ {
		b[i] = byte(i*7 + seq*13 + int(stream))
	}
	return b
}

// udpBurst builds a batch to dst1 and dst2: a run of 200 equal-size datagrams to dst1
// with a shorter tail, interrupted by datagrams to dst2 (of the same size), a larger and
// an empty datagram and a slightly shorter one; then 70 datagrams of 1400 bytes to dst2
// (more than fit one GSO message by bytes) and a lone datagram of each size. It returns
// the batch and what each destination must receive, in order.
func udpBurst(dst1, dst2 netip.AddrPort) (batch []Datagram, want map[netip.AddrPort][][]byte) {
	want = make(map[netip.AddrPort][][]byte)
	seq := 0
	add := func(dst netip.AddrPort, size int) {
		var b []byte
		if size > 0 {
			b = udpPayload(1, seq, size)
		}
		seq++
		batch = append(batch, Datagram{dst, b})
		want[dst] = append(want[dst], b)
	}
	add(dst2, 100) // a lone first message: a refused GSO send is not the first one
	for i := range 200 {
		add(dst1, 1000)
		switch i {
		case 50:
			add(dst2, 1000)
			add(dst2, 1000)
		case 120:
			add(dst1, 1200)
			add(dst1, 0)
		case 170:
			add(dst1, 999)
		}
	}
	add(dst1, 333)
	for range 70 {
		add(dst2, 1400)
	}
	add(dst1, 1000)
	add(dst2, 7)
	return batch, want
}

// endMarker follows a test's datagrams from the same socket: loopback keeps one
// socket's datagrams in order, so once it has arrived, anything extra the batch caused
// (duplicates, stray segments) has arrived too.
var endMarker = []byte("end of the test's datagrams")

func checkReceived(t *testing.T, s *udpEndpoint, want map[netip.AddrPort][][]byte, rx map[netip.AddrPort]*udpRx) {
	t.Helper()
	src := s.Addr()
	for dst := range want {
		if err := s.Send([]Datagram{{dst, endMarker}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for dst := range want {
		for !rx[dst].ended(src) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !rx[dst].ended(src) {
			t.Fatalf("%s: the end marker from %s never arrived", dst, src)
		}
	}
	for dst, w := range want {
		r := rx[dst]
		if n := r.count() - 1; n != len(w) {
			t.Errorf("%s received %d datagrams, want %d", dst, n, len(w))
		}
		got := r.from(src)
		got = got[:len(got)-1] // the marker
		for i := range min(len(got), len(w)) {
			if !bytes.Equal(got[i], w[i]) {
				t.Fatalf("%s: datagram %d from %s: got %d bytes %x..., want %d bytes %x...",
					dst, i, src, len(got[i]), got[i][:min(8, len(got[i]))], len(w[i]), w[i][:min(8, len(w[i]))])
			}
		}
		if len(got) != len(w) {
			t.Errorf("%s: %d datagrams from %s, want %d", dst, len(got), src, len(w))
		}
	}
}

// udpPair starts two receivers and returns them with their collectors.
func udpPair(t *testing.T) (r1, r2 *udpEndpoint, rx map[netip.AddrPort]*udpRx) {
	r1, r2 = listenUDP(t), listenUDP(t)
	rx = map[netip.AddrPort]*udpRx{r1.Addr(): {}, r2.Addr(): {}}
	return r1, r2, rx
}

func requireOffload(t *testing.T, e *udpEndpoint) {
	t.Helper()
	if !e.gso.Load() || !e.gro {
		testenv.Missing(t, fmt.Sprintf("kernel UDP GSO/GRO (gso %v, gro %v)", e.gso.Load(), e.gro))
	}
}

func TestUDPPackGSO(t *testing.T) {
	e := listenUDP(t)
	requireOffload(t, e)
	a := netip.MustParseAddrPort("127.0.0.1:5000")
	b := netip.MustParseAddrPort("127.0.0.1:5001")
	batch, _ := udpBurst(a, b)
	// Port 0 is never merged (its EINVAL must not look like a GSO refusal).
	zero := netip.MustParseAddrPort("127.0.0.1:0")
	batch = append(batch, Datagram{zero, make([]byte, 10)}, Datagram{zero, make([]byte, 10)})
	sv := newUDPSend()
	rest, merged := batch, 0
	for len(rest) > 0 {
		n, used := sv.pack(rest, true)
		if n == 0 || n > udpBatch || used > len(rest) {
			t.Fatalf("pack: %d messages, %d datagrams of %d", n, used, len(rest))
		}
		k := 0
		for i, m := range sv.msgs[:n] {
			if sv.first[i] != k {
				t.Fatalf("message %d starts at %d, want %d", i, sv.first[i], k)
			}
			total := 0
			for j, buf := range m.Buffers {
				d := rest[k+j]
				if ua := m.Addr.String(); ua != d.Addr.String() {
					t.Fatalf("message %d datagram %d: address %s, want %s", i, j, ua, d.Addr)
				}
				if !bytes.Equal(buf, d.Data) {
					t.Fatalf("message %d datagram %d: data differs", i, j)
				}
				total += len(buf)
			}
			seg := len(m.Buffers[0])
			if len(m.Buffers) == 1 {
				if len(m.OOB) != 0 {
					t.Fatalf("message %d: a single datagram with a control message", i)
				}
			} else {
				merged++
				if got := udpSegmentSize(t, m.OOB); got != seg {
					t.Fatalf("message %d: UDP_SEGMENT %d, want %d", i, got, seg)
				}
				if len(m.Buffers) > udpGSOMaxSegs || total > udpGSOMaxBytes || seg == 0 {
					t.Fatalf("message %d: %d segments of %d, %d bytes", i, len(m.Buffers), seg, total)
				}
				for j, buf := range m.Buffers {
					if l := len(buf); l > seg || l == 0 || (l < seg && j != len(m.Buffers)-1) {
						t.Fatalf("message %d: segment %d has %d bytes, gso size %d", i, j, l, seg)
					}
				}
				if m.Addr.String() == zero.String() {
					t.Fatal("datagrams to port 0 merged")
				}
			}
			k += len(m.Buffers)
		}
		if k != used {
			t.Fatalf("messages hold %d datagrams, pack says %d", k, used)
		}
		rest = rest[used:]
	}
	if merged < 8 {
		t.Fatalf("only %d GSO messages", merged)
	}
}

// udpSegmentSize parses the UDP_SEGMENT control message in oob.
func udpSegmentSize(t *testing.T, oob []byte) int {
	t.Helper()
	h, data, _, err := unix.ParseOneSocketControlMessage(oob)
	if err != nil || h.Level != unix.IPPROTO_UDP || h.Type != unix.UDP_SEGMENT || len(data) < 2 {
		t.Fatalf("bad UDP_SEGMENT control message %x (%v)", oob, err)
	}
	return int(binary.NativeEndian.Uint16(data))
}

func TestUDPGSOAndGRO(t *testing.T) {
	s := listenUDP(t)
	requireOffload(t, s)
	r1, r2, rx := udpPair(t)
	r1.Start(rx[r1.Addr()].handle)
	r2.Start(rx[r2.Addr()].handle)
	batch, want := udpBurst(r1.Addr(), r2.Addr())
	if err := s.Send(batch); err != nil {
		t.Fatal(err)
	}
	checkReceived(t, s, want, rx)
	if s.gsoSends.Load() == 0 || s.gsoSegs.Load() <= s.gsoSends.Load() {
		t.Errorf("no GSO: %d messages, %d segments", s.gsoSends.Load(), s.gsoSegs.Load())
	}
	if r1.groSplits.Load() == 0 || r2.groSplits.Load() == 0 {
		t.Errorf("no GRO messages split: %d, %d", r1.groSplits.Load(), r2.groSplits.Load())
	}
	if s.gsoRefusals.Load() != 0 {
		t.Errorf("GSO refused %d times", s.gsoRefusals.Load())
	}
	t.Logf("sent %d datagrams in %d GSO messages + %d plain; received %d in %d GRO messages",
		len(batch), s.gsoSends.Load(), uint64(len(batch))-s.gsoSegs.Load(),
		r1.groSegs.Load()+r2.groSegs.Load(), r1.groSplits.Load()+r2.groSplits.Load())
}

// TestUDPGSOForcedOff sends without GSO: every datagram is its own message.
func TestUDPGSOForcedOff(t *testing.T) {
	s := listenUDP(t)
	s.gso.Store(false)
	r1, r2, rx := udpPair(t)
	r1.Start(rx[r1.Addr()].handle)
	r2.Start(rx[r2.Addr()].handle)
	batch, want := udpBurst(r1.Addr(), r2.Addr())
	if err := s.Send(batch); err != nil {
		t.Fatal(err)
	}
	checkReceived(t, s, want, rx)
	if n := s.gsoSends.Load(); n != 0 {
		t.Errorf("%d GSO messages with GSO off", n)
	}
	if n := r1.groSplits.Load() + r2.groSplits.Load(); n != 0 {
		t.Errorf("%d GRO messages from a sender without GSO", n)
	}
}

// TestUDPGROOff receives GSO messages on a socket without UDP_GRO: the kernel splits them.
func TestUDPGROOff(t *testing.T) {
	s := listenUDP(t)
	requireOffload(t, s)
	r1, r2, rx := udpPair(t)
	for _, r := range []*udpEndpoint{r1, r2} {
		if err := setUDPGRO(r.conn, false); err != nil {
			t.Fatal(err)
		}
		r.gro = false
		r.Start(rx[r.Addr()].handle)
	}
	batch, want := udpBurst(r1.Addr(), r2.Addr())
	if err := s.Send(batch); err != nil {
		t.Fatal(err)
	}
	checkReceived(t, s, want, rx)
	if s.gsoSends.Load() == 0 {
		t.Error("no GSO messages sent")
	}
	if n := r1.groSplits.Load() + r2.groSplits.Load(); n != 0 {
		t.Errorf("%d GRO messages without UDP_GRO", n)
	}
}

// TestUDPGSORefused makes the kernel refuse GSO (it does on a socket without UDP
// checksums, SO_NO_CHECK, with EINVAL): the endpoint must turn GSO off and lose nothing.
func TestUDPGSORefused(t *testing.T) {
	s := listenUDP(t)
	requireOffload(t, s)
	var serr error
	rc, _ := s.conn.SyscallConn()
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) })
	if serr != nil {
		testenv.Missing(t, "SO_NO_CHECK on a UDP socket: "+serr.Error())
	}
	r1, r2, rx := udpPair(t)
	r1.Start(rx[r1.Addr()].handle)
	r2.Start(rx[r2.Addr()].handle)
	batch, want := udpBurst(r1.Addr(), r2.Addr())
	if err := s.Send(batch); err != nil {
		t.Fatal(err)
	}
	checkReceived(t, s, want, rx)
	gso := s.gso.Load()
	if gso || s.gsoRefusals.Load() != 1 || s.gsoSends.Load() != 0 {
		t.Errorf("after a refusal: gso %v, %d refusals, %d GSO messages", gso, s.gsoRefusals.Load(), s.gsoSends.Load())
	}
	// Later sends go plainly at once, to new receivers.
	_ = r1.Close()
	_ = r2.Close()
	r1, r2, rx = udpPair(t)
	r1.Start(rx[r1.Addr()].handle)
	r2.Start(rx[r2.Addr()].handle)
	batch, want = udpBurst(r1.Addr(), r2.Addr())
	if err := s.Send(batch); err != nil {
		t.Fatal(err)
	}
	checkReceived(t, s, want, rx)
	if s.gsoRefusals.Load() != 1 {
		t.Errorf("%d refusals, want 1", s.gsoRefusals.Load())
	}
}

// TestUDPConcurrentSend sends from several goroutines and endpoints at once: each
// stream must arrive complete and in order, with the right source.
func TestUDPConcurrentSend(t *testing.T) {
	r := listenUDP(t)
	rx := &udpRx{}
	r.Start(rx.handle)
	s1, s2 := listenUDP(t), listenUDP(t)
	const streams, sends, per = 3, 10, 25
	var wg sync.WaitGroup
	for _, s := range []*udpEndpoint{s1, s2} {
		for st := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range sends {
					batch := make([]Datagram, per)
					for j := range batch {
						size := 600
						if j == per-1 {
							size = 100 + st
						}
						batch[j] = Datagram{r.Addr(), udpPayload(byte(st), i*per+j, size)}
					}
					if err := s.Send(batch); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	total := 2 * streams * sends * per
	for deadline := time.Now().Add(5 * time.Second); rx.count() < total && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := rx.count(); n != total {
		t.Fatalf("received %d datagrams, want %d", n, total)
	}
	for _, s := range []*udpEndpoint{s1, s2} {
		next := make([]int, streams)
		for _, d := range rx.from(s.Addr()) {
			st, seq := int(d[0]), int(binary.BigEndian.Uint32(d[1:]))
			size := 600
			if seq%per == per-1 {
				size = 100 + st
			}
			if st >= streams || seq != next[st] || !bytes.Equal(d, udpPayload(byte(st), seq, size)) {
				t.Fatalf("from %s: stream %d datagram %d (%d bytes), want %d", s.Addr(), st, seq, len(d), next[min(st, streams-1)])
			}
			next[st]++
		}
		if fmt.Sprint(next) != fmt.Sprint([]int{sends * per, sends * per, sends * per}) {
			t.Fatalf("from %s: streams ended at %v", s.Addr(), next)
		}
	}
}
