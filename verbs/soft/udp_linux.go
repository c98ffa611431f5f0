//go:build linux

package soft

import (
	"encoding/binary"
	"errors"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// forceSockBufs sets the socket buffers to n bytes beyond rmem_max/wmem_max, which
// needs CAP_NET_ADMIN; without it the sizes set by SetReadBuffer/SetWriteBuffer stay.
func forceSockBufs(c *net.UDPConn, n int) {
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n)
		})
	}
}

// udpGSOCmsgSpace is the size of a UDP_SEGMENT control message (a uint16 gso_size).
var udpGSOCmsgSpace = unix.CmsgSpace(2)

// udpGSOSupported reports whether the kernel knows UDP_SEGMENT (Linux 4.18). Older
// kernels would ignore the control message and send one oversized datagram, so GSO is
// only used when the socket option can be read.
func udpGSOSupported(c *net.UDPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		_, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
	}); err != nil {
		return false
	}
	return serr == nil
}

// setUDPGRO turns UDP_GRO (Linux 5.0) on or off: with it on, a run of equal-size
// datagrams from one source may be received as one message with a UDP_GRO control
// message giving the segment size.
func setUDPGRO(c *net.UDPConn, on bool) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	v := 0
	if on {
		v = 1
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, v)
	}); err != nil {
		return err
	}
	return serr
}

// putUDPGSOSize appends a UDP_SEGMENT control message for segments of size bytes to b,
// which must have udpGSOCmsgSpace bytes of capacity left at an 8-byte aligned offset.
func putUDPGSOSize(b []byte, size int) []byte {
	n := len(b)
	b = b[:n+udpGSOCmsgSpace]
	clear(b[n:])
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[n]))
	h.Level = unix.IPPROTO_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[n+unix.CmsgLen(0):], uint16(size))
	return b
}

// udpGROSize returns the segment size of a UDP_GRO control message in oob, or 0.
func udpGROSize(oob []byte) int {
	for len(oob) >= unix.SizeofCmsghdr {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO {
			// The kernel puts an int; read it in full when it is there.
			switch {
			case len(data) >= 4:
				return int(binary.NativeEndian.Uint32(data))
			case len(data) >= 2:
				return int(binary.NativeEndian.Uint16(data))
			}
			return 0
		}
		oob = rest
	}
	return 0
}

// udpGSORefused reports whether a send error on a UDP_SEGMENT message means that the
// kernel will not do GSO on this socket or path: EIO when the device has no tx
// checksum offload, EINVAL (segment larger than the path MTU, checksums off),
// ENOPROTOOPT, EOPNOTSUPP.
func udpGSORefused(err error) bool {
	return errors.Is(err, unix.EIO) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENOPROTOOPT) || errors.Is(err, unix.EOPNOTSUPP)
}
