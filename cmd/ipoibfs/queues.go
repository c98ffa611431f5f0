package main

import (
	"encoding/binary"
	"runtime"
	"sync"

	"ipoibfs/ipoib/kernel"
)

// defaultQueues is the TUN queues of a port's interface without -queues: one per CPU
// (the vendor's enhanced IPoIB has a send and a receive queue per core), at most 8.
func defaultQueues() int { return min(runtime.NumCPU(), 8) }

// spread hands the packets, pkts[k][offset:], to write grouped by the queue of their
// flow among n (flowQueue): one write per queue, its packets in their order. A flow's packets
// keep their order, and a write is where GRO coalesces a flow's segments, so
// interleaved flows are not cut into writes of one packet each. write must not keep
// the slice it is given.
//
// The writes of a batch that spans several queues run at once (receive side scaling):
// the first on the caller's goroutine, each other on one of its own. A TUN write runs
// the kernel's receive path (GRO, IP, TCP) in the writer's system call, so flows on
// different queues go through the stack on different CPUs. spread returns when all are
// written, so a flow, which stays in one queue, keeps its order across batches too; a
// batch of one flow (a single stream, a ping) is written by the caller with no
// hand-off. write must be safe for calls on different queues at once.
func spread(n int, pkts [][]byte, offset int, write func(q int, pkts [][]byte)) {
	if n <= 1 || len(pkts) == 0 {
		write(0, pkts)
		return
	}
	s := spreadScratch.Get().(*spreadBufs)
	defer spreadScratch.Put(s)
	qs := s.qs[:0]
	same := true
	for _, p := range pkts {
		q := uint8(flowQueue(p, offset, n)) // n <= kernel.MaxQueues (256)
		qs = append(qs, q)
		same = same && q == qs[0]
	}
	s.qs = qs
	if same { // the common case: a batch of one flow
		write(int(qs[0]), pkts)
		return
	}
	var done [kernel.MaxQueues]bool
	groups, gq := s.groups, s.gq[:0]
	for k, q := range qs {
		if done[q] {
			continue
		}
		done[q] = true
		if len(gq) == len(groups) {
			groups = append(groups, nil)
		}
		out := groups[len(gq)][:0]
		for j := k; j < len(pkts); j++ {
			if qs[j] == q {
				out = append(out, pkts[j])
			}
		}
		groups[len(gq)] = out
		gq = append(gq, q)
	}
	var wg sync.WaitGroup
	defer wg.Wait() // should the caller's write panic, the scratch goes back to the pool after the others
	for g := 1; g < len(gq); g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			write(int(gq[g]), groups[g])
		}()
	}
	write(int(gq[0]), groups[0])
	wg.Wait()
	for g := range gq {
		clear(groups[g]) // the pool keeps no packet alive
	}
	s.groups, s.gq = groups, gq
}

// spreadBufs is spread's scratch: the queue of each packet, and each queue's packets
// with the queue they go to.
type spreadBufs struct {
	qs     []uint8
	groups [][][]byte
	gq     []uint8
}

var spreadScratch = sync.Pool{New: func() any { return new(spreadBufs) }}

// flowQueue picks one of n queues for the IP packet b[offset:] by its flow: a hash of
// its addresses and protocol and, for TCP, UDP, SCTP and UDP-Lite outside fragments,
// its ports. Fragments and other protocols hash by their addresses alone, so that all
// of a datagram's fragments go one way. Anything else goes to queue 0.
func flowQueue(b []byte, offset, n int) int {
	if n <= 1 || offset > len(b) {
		return 0
	}
	p := b[offset:]
	h := uint32(2166136261) // FNV-1a
	mix := func(b []byte) {
		for _, c := range b {
			h = (h ^ uint32(c)) * 16777619
		}
	}
	var proto byte
	var l4 []byte
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		proto = p[9]
		mix(p[12:20])
		if ihl := int(p[0]&15) * 4; binary.BigEndian.Uint16(p[6:])&0x3fff == 0 && ihl >= 20 && len(p) >= ihl {
			l4 = p[ihl:]
		}
	case len(p) >= 40 && p[0]>>4 == 6:
		proto = p[6] // a fragment's or an extension header's: addresses alone
		mix(p[8:40])
		l4 = p[40:]
	default:
		return 0
	}
	mix([]byte{proto})
	switch proto {
	case 6, 17, 132, 136: // TCP, UDP, SCTP, UDP-Lite
		if len(l4) >= 4 {
			mix(l4[:4])
		}
	}
	// FNV-1a leaves the last bytes it mixes in its low bits: flows that differ only in
	// the low byte of a port (iperf3 -P, a client's successive connections) would share
	// the top bits that pick the queue. murmur3's finalizer spreads every input bit
	// over all of them.
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return int(uint64(h) * uint64(n) >> 32)
}
