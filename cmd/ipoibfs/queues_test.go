package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// ip4 is an IPv4 packet of protocol proto from src:sport to dst:dport (ports written
// for any protocol), with the fragment field frag.
func ip4(src, dst string, proto byte, sport, dport uint16, frag uint16) []byte {
	p := make([]byte, 40)
	p[0], p[9] = 0x45, proto
	binary.BigEndian.PutUint16(p[6:], frag)
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dport)
	return p
}

func ip6(src, dst string, next byte, sport, dport uint16) []byte {
	p := make([]byte, 60)
	p[0], p[6] = 0x60, next
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	binary.BigEndian.PutUint16(p[40:], sport)
	binary.BigEndian.PutUint16(p[42:], dport)
	return p
}

// A flow's packets go to one queue, flows spread over all of them, and what
// distinguishes flows is the addresses, the protocol and (TCP, UDP) the ports; a
// datagram's fragments go one way whatever their offset.
func TestFlowQueue(t *testing.T) {
	const n = 4
	seen := map[int]int{}
	for port := uint16(1000); port < 1064; port++ {
		q := flowQueue(ip4("10.0.0.1", "10.0.0.2", 6, port, 5201, 0), 0, n)
		if q < 0 || q >= n {
			t.Fatalf("queue %d of %d", q, n)
		}
		if again := flowQueue(ip4("10.0.0.1", "10.0.0.2", 6, port, 5201, 0), 0, n); again != q {
			t.Fatalf("one TCP flow went to queues %d and %d", q, again)
		}
		seen[q]++
		seen[flowQueue(ip6("fd00::1", "fd00::2", 17, port, 53), 0, n)+n]++
	}
	for q := range 2 * n {
		if seen[q] < 4 { // 64 flows over 4 queues, IPv4 TCP and IPv6 UDP
			t.Errorf("64 flows put %d on queue %d: %v", seen[q], q%n, seen)
		}
	}
	// A client's successive connections (iperf3 -P 8) differ in the low bits of their
	// port alone, in the last bytes hashed on the way back: they must spread too. With
	// a hash that spreads its input, 8 flows land on one queue of 4 once in 16384.
	for _, step := range []uint16{1, 2} { // Linux steps connect()'s ports by 2
		for base := uint16(32768); base < 60000; base += 97 {
			back, out := map[int]bool{}, map[int]bool{}
			for k := range uint16(8) {
				back[flowQueue(ip4("10.0.0.2", "10.0.0.1", 6, 5201, base+k*step, 0), 0, n)] = true
				out[flowQueue(ip4("10.0.0.1", "10.0.0.2", 6, base+k*step, 5201, 0), 0, n)] = true
			}
			if len(back) == 1 || len(out) == 1 {
				t.Fatalf("8 flows from ports %d, %d, ... all went to one queue of %d (back %v, out %v)", base, base+step, n, back, out)
			}
		}
	}
	// Ports count for TCP and UDP only; fragments hash by addresses.
	diff := func(a, b []byte) bool {
		for k := 0; k < 16; k++ { // queues out of 1<<16: a collision is 1 in 65536
			if flowQueue(a, 0, 1<<16) != flowQueue(b, 0, 1<<16) {
				return true
			}
		}
		return false
	}
	if !diff(ip4("10.0.0.1", "10.0.0.2", 17, 1, 2, 0), ip4("10.0.0.1", "10.0.0.2", 17, 1, 3, 0)) {
		t.Error("two UDP flows differing in a port hash alike")
	}
	if diff(ip4("10.0.0.1", "10.0.0.2", 1, 1, 2, 0), ip4("10.0.0.1", "10.0.0.2", 1, 7, 9, 0)) {
		t.Error("ICMP packets hash by the bytes where ports would be")
	}
	first := ip4("10.0.0.1", "10.0.0.2", 17, 1, 2, 0x2000) // more fragments, offset 0
	rest := ip4("10.0.0.1", "10.0.0.2", 17, 0xabcd, 0x1234, 0x00b9)
	if diff(first, rest) {
		t.Error("a datagram's fragments hash by their payload")
	}
	// The offset is where the packet starts; junk before it does not count.
	framed := append([]byte{9, 9, 9, 9}, first...)
	if flowQueue(framed, 4, 1<<16) != flowQueue(first, 0, 1<<16) {
		t.Error("the bytes before the offset changed the queue")
	}
	if flowQueue(first, 0, 1) != 0 || flowQueue([]byte{0x45}, 0, n) != 0 || flowQueue(first, 99, n) != 0 {
		t.Error("one queue, a short packet or an offset past the end is not queue 0")
	}
}

func FuzzFlowQueue(f *testing.F) {
	f.Add(ip4("10.0.0.1", "10.0.0.2", 6, 1, 2, 0), 0, 4)
	f.Add(ip6("fd00::1", "fd00::2", 17, 1, 2), 0, 3)
	f.Add([]byte{0x4f, 0, 0, 0, 0, 0, 0, 0, 0, 6}, 0, 2)
	f.Fuzz(func(t *testing.T, p []byte, offset, n int) {
		if offset < 0 || n < 1 || n > 256 {
			return
		}
		if q := flowQueue(p, offset, n); q < 0 || q >= n {
			t.Fatalf("queue %d of %d", q, n)
		}
	})
}

// spread writes once per queue, each queue's packets in their order: interleaved
// flows are grouped (GRO coalesces within a write), not cut into single packets.
func TestSpreadGroupsByQueue(t *testing.T) {
	const n = 4
	// Flows on distinct queues.
	var flows [][]byte
	seen := map[int]bool{}
	for port := uint16(1); len(flows) < 3; port++ {
		p := ip4("10.0.0.1", "10.0.0.2", 6, port, 80, 0)
		if q := flowQueue(p, 0, n); !seen[q] {
			seen[q] = true
			flows = append(flows, p)
		}
	}
	// A, B, A, C, B, A: each packet a copy, tagged with its position in byte 39.
	var pkts [][]byte
	for k, f := range []int{0, 1, 0, 2, 1, 0} {
		p := append([]byte(nil), flows[f]...)
		p[39] = byte(k)
		pkts = append(pkts, p)
	}
	type write struct {
		q   int
		pos []byte
	}
	var got []write
	var mu sync.Mutex
	spread(n, pkts, 0, func(q int, ps [][]byte) {
		w := write{q: q}
		for _, p := range ps {
			w.pos = append(w.pos, p[39])
		}
		mu.Lock()
		got = append(got, w)
		mu.Unlock()
	})
	slices.SortFunc(got, func(a, b write) int { return int(a.pos[0]) - int(b.pos[0]) }) // written at once, in any order
	want := []write{
		{flowQueue(flows[0], 0, n), []byte{0, 2, 5}},
		{flowQueue(flows[1], 0, n), []byte{1, 4}},
		{flowQueue(flows[2], 0, n), []byte{3}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("writes %v, want %v", got, want)
	}
	// One flow: one write, the caller's slice; one queue: everything to queue 0.
	got = nil
	spread(n, pkts[:1], 0, func(q int, ps [][]byte) { got = append(got, write{q: q, pos: []byte{byte(len(ps))}}) })
	if len(got) != 1 || got[0].q != want[0].q {
		t.Fatalf("a one-flow batch: writes %v", got)
	}
	got = nil
	spread(1, pkts, 0, func(q int, ps [][]byte) { got = append(got, write{q: q, pos: []byte{byte(len(ps))}}) })
	if fmt.Sprint(got) != fmt.Sprint([]write{{0, []byte{6}}}) {
		t.Fatalf("one queue: writes %v", got)
	}
}

// spread writes the queues of a batch at once: each queue's write here waits until
// every other has begun, which only writes made in parallel can all do.
func TestSpreadWritesQueuesAtOnce(t *testing.T) {
	const n = 4
	var pkts [][]byte
	seen := map[int]bool{}
	for port := uint16(1); len(seen) < n; port++ {
		p := ip4("10.0.0.1", "10.0.0.2", 6, port, 80, 0)
		if q := flowQueue(p, 0, n); !seen[q] {
			seen[q] = true
			pkts = append(pkts, p, p)
		}
	}
	var begun sync.WaitGroup
	begun.Add(n)
	all := make(chan struct{})
	go func() { begun.Wait(); close(all) }()
	var mu sync.Mutex
	wrote := map[int]int{}
	spread(n, pkts, 0, func(q int, ps [][]byte) {
		begun.Done()
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			t.Errorf("queue %d's write waited 10 s for the others to begin: the writes are not made at once", q)
		}
		mu.Lock()
		wrote[q] += len(ps)
		mu.Unlock()
	})
	for q := range n { // spread returned: every write is done
		if wrote[q] != 2 {
			t.Errorf("queue %d got %d packets, want 2: %v", q, wrote[q], wrote)
		}
	}
}
