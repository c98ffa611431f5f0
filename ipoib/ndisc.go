package ipoib

import (
	"encoding/binary"
	"net/netip"

	"ipoibfs/verbs"
)

// IPv6 neighbour discovery over InfiniBand (RFC 4391 §9.1): the link-layer address
// option has length 3 (24 bytes): type, length, two bytes of zero padding, then the
// 20-byte address.
const (
	icmpv6NS      = 135
	icmpv6NA      = 136
	ndOptSrcLL    = 1
	ndOptTgtLL    = 2
	ndOptLen      = 24
	ipv6HdrLen    = 40
	protoICMPv6   = 58
	naFlagSolicit = 0x40
	naFlagOverrid = 0x20
)

// isNDMessage reports whether an IPv6 packet is a neighbour solicitation or
// advertisement (no extension headers, as ND messages never carry them).
func isNDMessage(pkt []byte) bool {
	return len(pkt) >= ipv6HdrLen+24 && pkt[0]>>4 == 6 && pkt[6] == protoICMPv6 &&
		(pkt[ipv6HdrLen] == icmpv6NS || pkt[ipv6HdrLen] == icmpv6NA)
}

// ndLLOption finds a link-layer address option of the given type.
func ndLLOption(opts []byte, typ byte) (HWAddr, bool) {
	for len(opts) >= 8 {
		l := int(opts[1]) * 8
		if l == 0 || l > len(opts) {
			return HWAddr{}, false
		}
		if opts[0] == typ && l == ndOptLen {
			return HWAddr(opts[4:24]), true
		}
		opts = opts[l:]
	}
	return HWAddr{}, false
}

// handleND learns from solicitations and advertisements (a neighbour is made only for
// the sender of a solicitation for one of our addresses: RFC 4861 §7.2.5 drops an
// advertisement for a target with no entry) and answers solicitations for
// our addresses.
func (i *Interface) handleND(pkt []byte) {
	// The message is what the IPv6 payload length says (what follows is the link's
	// padding, not options); RFC 4861 §7.1 wants 24 bytes of it or more, hop limit
	// 255 and a valid checksum.
	n := int(binary.BigEndian.Uint16(pkt[4:]))
	if n < 24 || ipv6HdrLen+n > len(pkt) || pkt[7] != 255 || icmpv6Checksum(pkt) != 0 {
		i.stats.rxDropped.Add(1)
		return
	}
	pkt = pkt[:ipv6HdrLen+n]
	src := netip.AddrFrom16([16]byte(pkt[8:24]))
	icmp := pkt[ipv6HdrLen:]
	target := netip.AddrFrom16([16]byte(icmp[8:24]))
	opts := icmp[24:]
	var learnIP netip.Addr
	var learnHW HWAddr
	switch icmp[0] {
	case icmpv6NS:
		if hw, ok := ndLLOption(opts, ndOptSrcLL); ok && !src.IsUnspecified() {
			learnIP, learnHW = src, hw
		}
	case icmpv6NA:
		if hw, ok := ndLLOption(opts, ndOptTgtLL); ok {
			learnIP, learnHW = target, hw
		}
	}
	mine := false
	for _, a := range i.ownAddrs() {
		if a == target {
			mine = true
		}
	}
	var flush [][]byte
	i.dmu.Lock()
	if learnIP.IsValid() {
		if _, known := i.neigh[learnIP]; known || mine && icmp[0] == icmpv6NS {
			flush = i.learnLocked(learnIP, learnHW)
		}
	}
	var na []byte
	dst := src
	if icmp[0] == icmpv6NS && mine {
		flags := byte(naFlagSolicit | naFlagOverrid)
		if src.IsUnspecified() { // answer to DAD goes to all nodes, unsolicited
			flags = naFlagOverrid
			dst = netip.MustParseAddr("ff02::1")
		}
		na = i.ndFrame(icmpv6NA, target, dst, target, ndOptTgtLL, flags)
	}
	i.dmu.Unlock()
	i.resend(learnHW, flush)
	if na == nil {
		return
	}
	i.dmu.Lock()
	var ah verbs.AH
	var qpn verbs.QPN
	var ok bool
	if dst.IsMulticast() {
		ah, ok = i.sendMulticastLocked(mgidForIP(dst, i.data().bcast), na)
		qpn = verbs.MulticastQPN
	} else {
		ah, qpn, ok = i.sendToHWLocked(learnHW, [][]byte{na})
	}
	i.dmu.Unlock()
	if ok {
		i.sendFrames([][]byte{na}, ah, qpn)
	}
}

// sendNS multicasts a neighbour solicitation for ip to its solicited-node group.
func (i *Interface) sendNS(ip netip.Addr) {
	i.dmu.Lock()
	src, _ := i.sourceFor(ip)
	dst := solicitedNode(ip)
	frame := i.ndFrame(icmpv6NS, src, dst, ip, ndOptSrcLL, 0)
	ah, ok := i.sendMulticastLocked(mgidForIP(dst, i.data().bcast), frame)
	i.dmu.Unlock()
	if ok {
		i.sendFrames([][]byte{frame}, ah, verbs.MulticastQPN)
	}
}

// ndFrame builds an encapsulated NS or NA carrying our link-layer address.
func (i *Interface) ndFrame(typ byte, src, dst, target netip.Addr, optType byte, flags byte) []byte {
	const icmpLen = 24 + ndOptLen
	b := make([]byte, encapLen+ipv6HdrLen+icmpLen)
	binary.BigEndian.PutUint16(b, etherIPv6)
	p := b[encapLen:]
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], icmpLen)
	p[6], p[7] = protoICMPv6, 255
	s, d, t := src.As16(), dst.As16(), target.As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	icmp := p[ipv6HdrLen:]
	icmp[0] = typ
	icmp[4] = flags
	copy(icmp[8:], t[:])
	icmp[24], icmp[25] = optType, ndOptLen/8
	copy(icmp[28:], i.hw[:])
	binary.BigEndian.PutUint16(icmp[2:], icmpv6Checksum(p))
	return b
}

// icmpv6Checksum returns the ICMPv6 checksum over the pseudo header and message; on a
// packet with a correct checksum it returns 0.
func icmpv6Checksum(pkt []byte) uint16 {
	icmp := pkt[ipv6HdrLen:]
	if n := int(binary.BigEndian.Uint16(pkt[4:])); n < len(icmp) {
		icmp = icmp[:n]
	}
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(b[0])<<8 | uint32(b[1])
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	add(pkt[8:40])
	sum += uint32(len(icmp)) + protoICMPv6
	add(icmp)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
