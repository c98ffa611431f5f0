package ipoib

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"ipoibfs/verbs"
)

// HWAddrLen is the length of an IPoIB link-layer address (RFC 4391 §9.1.1).
const HWAddrLen = 20

// FlagRC in byte 0 of a hardware address says the interface accepts connected mode.
const FlagRC = 0x80

// HWAddr is an IPoIB hardware address: flags (1 byte), QPN (3 bytes), GID (16 bytes).
type HWAddr [HWAddrLen]byte

// MakeHWAddr builds an address from flags, QPN and GID.
func MakeHWAddr(flags byte, qpn verbs.QPN, gid verbs.GID) HWAddr {
	var a HWAddr
	a[0] = flags
	a[1], a[2], a[3] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	copy(a[4:], gid[:])
	return a
}

// QPN returns the 24-bit queue pair number.
func (a HWAddr) QPN() verbs.QPN { return verbs.QPN(a[1])<<16 | verbs.QPN(a[2])<<8 | verbs.QPN(a[3]) }

// GID returns the port (or multicast) GID.
func (a HWAddr) GID() verbs.GID { return verbs.GID(a[4:20]) }

// Flags returns byte 0.
func (a HWAddr) Flags() byte { return a[0] }

// IsMulticast reports whether the GID part is a multicast GID.
func (a HWAddr) IsMulticast() bool { return a[4] == 0xff }

// String prints the address as sysfs does: 20 colon-separated lowercase hex bytes.
func (a HWAddr) String() string {
	var b strings.Builder
	for i, c := range a {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x", c)
	}
	return b.String()
}

// broadcastAddr returns the initial broadcast address with the P_Key inserted:
// 00:ff:ff:ff:ff:12:40:1b:PP:PP:00:00:00:00:00:00:ff:ff:ff:ff.
func broadcastAddr(pkey verbs.PKey) HWAddr {
	a := HWAddr{0x00, 0xff, 0xff, 0xff, 0xff, 0x12, 0x40, 0x1b}
	binary.BigEndian.PutUint16(a[8:], uint16(pkey|verbs.PKeyFullMember))
	a[16], a[17], a[18], a[19] = 0xff, 0xff, 0xff, 0xff
	return a
}

// mgidForIP maps an IPv4 or IPv6 multicast destination to its MGID (RFC 4391 §4),
// taking scope and P_Key from the broadcast address as the kernel's ip_ib_mc_map and
// ipv6_ib_mc_map do. IPv4 limited broadcast maps to the broadcast group.
func mgidForIP(dst netip.Addr, bcast HWAddr) verbs.GID {
	var g verbs.GID
	g[0] = 0xff
	g[1] = 0x10 | bcast[5]&0x0f
	g[4], g[5] = bcast[8], bcast[9]
	if dst.Is4() {
		a := dst.As4()
		if a == [4]byte{255, 255, 255, 255} {
			return bcast.GID()
		}
		g[2], g[3] = 0x40, 0x1b
		g[12], g[13], g[14], g[15] = a[0]&0x0f, a[1], a[2], a[3]
		return g
	}
	a := dst.As16()
	g[2], g[3] = 0x60, 0x1b
	copy(g[6:], a[6:])
	return g
}

// solicitedNode returns the IPv6 solicited-node multicast address of a.
func solicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// linkLocal returns the IPv6 link-local address derived from a port GUID
// (addrconf_ifid_infiniband: GUID with the universal/local bit flipped on).
func linkLocal(guid verbs.GUID) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	binary.BigEndian.PutUint64(b[8:], uint64(guid))
	b[8] |= 0x02
	return netip.AddrFrom16(b)
}
