package ipoib

import (
	"encoding/binary"

	"ipoibfs/internal/inet"
)

// tooBig builds the ICMP error the kernel driver sends the local sender when a packet
// is too long for the UD path (ipoib_cm_skb_too_long): IPv4 destination unreachable /
// fragmentation needed, or ICMPv6 packet too big, carrying mtu (always the broadcast
// group's MTU, whatever path was tried). The error appears to come from the packet's
// destination, so the kernel updates its path MTU for that destination. It returns nil
// when pkt is not something an ICMP error may be sent about.
func tooBig(pkt []byte, mtu int) []byte {
	switch {
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		ihl := int(pkt[0]&0x0f) * 4
		if ihl < 20 || len(pkt) < ihl || pkt[9] == 1 && len(pkt) > ihl && pkt[ihl] != 0 && pkt[ihl] != 8 {
			return nil // never about ICMP errors (RFC 1122 §3.2.2)
		}
		quote := pkt[:min(len(pkt), ihl+8)]
		out := make([]byte, 20+8+len(quote))
		out[0], out[8], out[9] = 0x45, 64, 1
		binary.BigEndian.PutUint16(out[2:], uint16(len(out)))
		copy(out[12:16], pkt[16:20]) // from the destination
		copy(out[16:20], pkt[12:16]) // to the sender
		binary.BigEndian.PutUint16(out[10:], inet.Checksum(out[:20]))
		icmp := out[20:]
		icmp[0], icmp[1] = 3, 4 // destination unreachable, fragmentation needed
		binary.BigEndian.PutUint16(icmp[6:], uint16(mtu))
		copy(icmp[8:], quote)
		binary.BigEndian.PutUint16(icmp[2:], inet.Checksum(icmp))
		return out
	case len(pkt) >= ipv6HdrLen && pkt[0]>>4 == 6:
		if pkt[6] == protoICMPv6 && len(pkt) > ipv6HdrLen && pkt[ipv6HdrLen] < 128 {
			return nil // never about ICMPv6 errors (RFC 4443 §2.4)
		}
		quote := pkt[:min(len(pkt), 1280-ipv6HdrLen-8)]
		out := make([]byte, ipv6HdrLen+8+len(quote))
		out[0] = 0x60
		binary.BigEndian.PutUint16(out[4:], uint16(8+len(quote)))
		out[6], out[7] = protoICMPv6, 64
		copy(out[8:24], pkt[24:40])
		copy(out[24:40], pkt[8:24])
		icmp := out[ipv6HdrLen:]
		icmp[0] = 2 // packet too big
		binary.BigEndian.PutUint32(icmp[4:], uint32(mtu))
		copy(icmp[8:], quote)
		binary.BigEndian.PutUint16(icmp[2:], icmpv6Checksum(out))
		return out
	}
	return nil
}
