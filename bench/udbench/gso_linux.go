package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// The strongest plain-UDP reference the kernel offers on loopback: the sender hands
// the kernel one buffer of many equal datagrams per system call (UDP_SEGMENT, GSO),
// the receiver takes many per call (recvmmsg) with runs of them coalesced into one
// message (UDP_GRO). The fabric's UDP transport uses the same three.

// gsoSegments is how many datagrams of size bytes one GSO send carries (at most 64,
// and the whole within a 64 KiB UDP datagram).
func gsoSegments(size int) int { return min(64, 65000/size) }

// sendGSO writes datagrams of size bytes to conn, a run of gsoSegments per system call,
// until stop is set, and returns how many it sent.
func sendGSO(conn *net.UDPConn, size int, stop *atomic.Bool) (uint64, error) {
	n := gsoSegments(size)
	buf := make([]byte, n*size)
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(size))
	var sent uint64
	for !stop.Load() {
		if _, _, err := conn.WriteMsgUDP(buf, oob, nil); err != nil {
			if sent == 0 {
				return 0, fmt.Errorf("GSO send (UDP_SEGMENT): %w", err)
			}
			continue // a full socket buffer (ENOBUFS): try again
		}
		sent += uint64(n)
	}
	return sent, nil
}

// receiveGRO counts datagrams arriving on conn, read with recvmmsg and UDP_GRO, until
// conn is closed.
func receiveGRO(conn *net.UDPConn, count *atomic.Uint64) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("UDP_GRO: %w", serr)
	}
	pc := ipv4.NewPacketConn(conn)
	msgs := make([]ipv4.Message, 64)
	for k := range msgs {
		msgs[k].Buffers = [][]byte{make([]byte, 65536)}
		msgs[k].OOB = make([]byte, unix.CmsgSpace(4))
	}
	go func() {
		for {
			n, err := pc.ReadBatch(msgs, 0)
			if err != nil {
				return
			}
			var got uint64
			for _, m := range msgs[:n] {
				seg := groSize(m.OOB[:m.NN])
				if seg <= 0 || seg >= m.N {
					got++
					continue
				}
				got += uint64((m.N + seg - 1) / seg)
			}
			count.Add(got)
		}
	}()
	return nil
}

// groSize returns the segment size of a UDP_GRO control message in oob, or 0.
func groSize(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
			return int(binary.NativeEndian.Uint32(m.Data))
		}
	}
	return 0
}
