package dhcp

import (
	"encoding/binary"
	"errors"

	"golang.org/x/net/bpf"

	"ipoibfs/internal/inet"
)

// clientPort is the port DHCP replies go to.
const clientPort = 68

// replyFilter passes IPv4 UDP datagrams to port 68 that are not fragments (from the
// IP header on: the socket is SOCK_DGRAM); udpPayload checks the rest.
var replyFilter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 9, Size: 1}, // protocol
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 17, SkipTrue: 6},
	bpf.LoadAbsolute{Off: 6, Size: 2}, // flags and fragment offset
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x3fff, SkipTrue: 4},
	bpf.LoadMemShift{Off: 0},          // X = the IP header's length
	bpf.LoadIndirect{Off: 2, Size: 2}, // UDP destination port
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: clientPort, SkipTrue: 1},
	bpf.RetConstant{Val: 1 << 18},
	bpf.RetConstant{Val: 0},
}

// udpPayload returns the payload of an IPv4 packet that is a UDP datagram to the
// client's port, as a packet socket receives it (from the IP header on). It checks
// what the IP layer would have before a UDP socket saw it: the IPv4 header and its
// checksum, the lengths, no fragment, and the UDP checksum unless csumOK says the
// kernel vouches for it (a packet received with its checksum verified, or sent from
// this host with it still to be completed) or the sender sent none (0).
func udpPayload(p []byte, csumOK bool) ([]byte, error) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return nil, errors.New("not IPv4")
	}
	ihl := int(p[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(p[2:]))
	if ihl < 20 || total < ihl+8 || total > len(p) {
		return nil, errors.New("bad IPv4 lengths")
	}
	if inet.Fold(inet.Sum(0, p[:ihl])) != 0xffff {
		return nil, errors.New("bad IPv4 header checksum")
	}
	if binary.BigEndian.Uint16(p[6:])&0x3fff != 0 { // more fragments, or an offset
		return nil, errors.New("a fragment")
	}
	if p[9] != 17 {
		return nil, errors.New("not UDP")
	}
	p = p[:total]
	u := p[ihl:]
	if binary.BigEndian.Uint16(u[2:]) != clientPort {
		return nil, errors.New("not to the client's port")
	}
	ulen := int(binary.BigEndian.Uint16(u[4:]))
	if ulen < 8 || ulen > len(u) {
		return nil, errors.New("bad UDP length")
	}
	u = u[:ulen]
	if !csumOK && binary.BigEndian.Uint16(u[6:]) != 0 {
		// The pseudo-header: addresses, protocol, UDP length.
		s := inet.Sum(uint32(17)+uint32(ulen), p[12:20])
		if inet.Fold(inet.Sum(s, u)) != 0xffff {
			return nil, errors.New("bad UDP checksum")
		}
	}
	return u[8:], nil
}
