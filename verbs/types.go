// Package verbs is the HCA abstraction ipoibfs runs on, modelled on ibverbs and sized to
// what IPoIB needs: devices and ports, P_Key and GID tables, UD and RC queue pairs,
// completion queues with batch polling and moderation, address handles, multicast
// attach/detach, asynchronous port events and a MAD agent for the SA.
//
// The package holds only types and interfaces. verbs/soft implements them on a software
// fabric; a provider for real HCAs can implement them without touching ipoib.
package verbs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
)

// GID is a 128-bit InfiniBand global identifier: an 8-byte subnet prefix followed by an
// 8-byte interface ID (the port GUID for GID index 0).
type GID [16]byte

// DefaultGIDPrefix is the link-local subnet prefix fe80::/64.
const DefaultGIDPrefix uint64 = 0xfe80_0000_0000_0000

// MakeGID builds a GID from a subnet prefix and an interface ID.
func MakeGID(prefix uint64, guid GUID) GID {
	var g GID
	binary.BigEndian.PutUint64(g[:8], prefix)
	binary.BigEndian.PutUint64(g[8:], uint64(guid))
	return g
}

// Prefix returns the subnet prefix (first 8 bytes).
func (g GID) Prefix() uint64 { return binary.BigEndian.Uint64(g[:8]) }

// GUID returns the interface ID (last 8 bytes).
func (g GID) GUID() GUID { return GUID(binary.BigEndian.Uint64(g[8:])) }

// IsMulticast reports whether g is a multicast GID (first byte 0xff).
func (g GID) IsMulticast() bool { return g[0] == 0xff }

// IsZero reports whether every byte is zero.
func (g GID) IsZero() bool { return g == GID{} }

// String prints the GID as an IPv6 address in canonical (compressed) form.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// KernelString prints the GID the way the kernel's ipoib debugfs does: eight
// big-endian 16-bit words in lowercase hex without padding or "::" compression.
func (g GID) KernelString() string {
	b := make([]byte, 0, 40)
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b = append(b, ':')
		}
		b = strconv.AppendUint(b, uint64(binary.BigEndian.Uint16(g[i:])), 16)
	}
	return string(b)
}

// ParseGID parses an IPv6-style GID ("fe80::10:1", "ff12:401b:ffff:0:0:0:ffff:ffff").
func ParseGID(s string) (GID, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Zone() != "" {
		return GID{}, fmt.Errorf("invalid GID %q", s)
	}
	return GID(a.As16()), nil
}

// GUID is a 64-bit EUI-64 globally unique identifier of a node or port.
type GUID uint64

func (g GUID) String() string { return fmt.Sprintf("0x%016x", uint64(g)) }

// LID is a 16-bit local identifier assigned by the subnet manager. 0 is reserved,
// 0x0001-0xbfff are unicast, 0xc000-0xfffe multicast, 0xffff the permissive LID.
type LID uint16

const (
	LIDReserved       LID    = 0
	LIDMulticastBase  LID    = 0xc000
	LIDMulticastLast  LID    = 0xfffe
	LIDPermissive     LID    = 0xffff
	LIDUnicastLast    LID    = 0xbfff
	MulticastQPN      QPN    = 0xffffff
	GSIQPN            QPN    = 1
	SMIQPN            QPN    = 0
	GSIQKey           uint32 = 0x80010000
	IPoIBQKey         uint32 = 0x00000b1b
	DefaultPKey       PKey   = 0xffff
	InvalidPKey       PKey   = 0x0000
	PKeyFullMember    PKey   = 0x8000
	PKeyTableCapacity        = 64
)

// IsMulticast reports whether l is in the multicast LID range.
func (l LID) IsMulticast() bool { return l >= LIDMulticastBase && l <= LIDMulticastLast }

// QPN is a 24-bit queue pair number.
type QPN uint32

// PKey is a 16-bit partition key; bit 15 is the full-membership bit.
type PKey uint16

// Full reports whether the full-membership bit is set.
func (p PKey) Full() bool { return p&PKeyFullMember != 0 }

// Base returns the 15-bit partition number without the membership bit.
func (p PKey) Base() uint16 { return uint16(p) &^ uint16(PKeyFullMember) }

// Valid reports whether the key names a partition (low 15 bits non-zero).
func (p PKey) Valid() bool { return p.Base() != 0 }

// CanTalk reports whether two ports holding these keys may exchange packets: same
// partition and at least one of them a full member.
func (p PKey) CanTalk(q PKey) bool {
	return p.Valid() && p.Base() == q.Base() && (p.Full() || q.Full())
}

func (p PKey) String() string { return fmt.Sprintf("0x%04x", uint16(p)) }

// MTU is an IBTA MTU enumeration value (1=256 ... 5=4096).
type MTU uint8

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid enum.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the largest MTU enum not above n bytes, or 0 if n < 256.
func MTUFromBytes(n int) MTU {
	for m := MTU4096; m >= MTU256; m-- {
		if m.Bytes() <= n {
			return m
		}
	}
	return 0
}

// Rate is an IBTA static rate enumeration (3 = 10 Gb/s ...). Codes are not monotonic
// in bandwidth: compare with Mbps.
type Rate uint8

var rateMbps = map[Rate]int{
	2: 2500, 3: 10000, 4: 30000, 5: 5000, 6: 20000, 7: 40000, 8: 60000, 9: 80000,
	10: 120000, 11: 14062, 12: 56250, 13: 112500, 14: 168750, 15: 25781, 16: 103125,
	17: 206250, 18: 309375, 19: 28125, 20: 53125, 21: 425000, 22: 637500, 23: 850000,
	24: 1275000,
}

// Mbps returns the rate's bandwidth in Mb/s as the kernel's ib_rate_to_mbps does, or 0
// for an unknown code.
func (r Rate) Mbps() int { return rateMbps[r] }

// Valid reports whether r is a known rate code.
func (r Rate) Valid() bool { return rateMbps[r] != 0 }

// PortState is the IBTA logical port state.
type PortState uint8

const (
	PortNop    PortState = 0
	PortDown   PortState = 1
	PortInit   PortState = 2
	PortArmed  PortState = 3
	PortActive PortState = 4
)

var portStateNames = [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE"}

func (s PortState) String() string {
	if int(s) < len(portStateNames) {
		return portStateNames[s]
	}
	return fmt.Sprintf("PortState(%d)", s)
}

// PhysState is the IBTA port physical state.
type PhysState uint8

const (
	PhysSleep     PhysState = 1
	PhysPolling   PhysState = 2
	PhysDisabled  PhysState = 3
	PhysLinkUp    PhysState = 5
	PhysLinkError PhysState = 6
)

var physStateNames = map[PhysState]string{
	PhysSleep: "Sleep", PhysPolling: "Polling", PhysDisabled: "Disabled",
	PhysLinkUp: "LinkUp", PhysLinkError: "LinkErrorRecovery",
}

func (s PhysState) String() string {
	if n, ok := physStateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("PhysState(%d)", s)
}
