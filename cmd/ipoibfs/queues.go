package main

import (
	"encoding/binary"
	"runtime"

	"ipoibfs/ipoib/kernel"
)

// defaultQueues is the TUN queues per interface without -queues: one per CPU (the
// vendor's enhanced IPoIB has a send and a receive queue per core), at most 8.
func defaultQueues() int { return min(runtime.NumCPU(), 8) }

// spread hands the packets, pkts[k][offset:], to write in runs that each go to one of
// dev's queues, the queue of their flow (flowQueue), in order: a flow's packets keep
// their order, and a batch of one flow, the common case, is one write.
func spread(dev *kernel.Device, pkts [][]byte, offset int, write func(q *kernel.Queue, pkts [][]byte)) {
	n := dev.Queues()
	if n <= 1 || len(pkts) == 0 {
		write(dev.Queue(0), pkts)
		return
	}
	start, cur := 0, flowQueue(pkts[0], offset, n)
	for k := 1; k < len(pkts); k++ {
		if q := flowQueue(pkts[k], offset, n); q != cur {
			write(dev.Queue(cur), pkts[start:k])
			start, cur = k, q
		}
	}
	write(dev.Queue(cur), pkts[start:])
}

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
	return int(uint64(h) * uint64(n) >> 32)
}
