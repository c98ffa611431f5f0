package ipoib

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"ipoibfs/verbs"
)

// FuzzReceiveLocal feeds an interface the frames it takes for itself from the fabric
// (ARP and ND, as rxClassify sorts them), one fabric for the whole run: no panic, and
// nobody fills the neighbour table by announcing addresses. A new entry is made only
// for the sender of an ARP request or NS whose target is one of our addresses; any
// other packet may only update an entry already there. fixSum recomputes the ICMPv6
// checksum so that the fuzzer gets past it.
func FuzzReceiveLocal(f *testing.F) {
	i, peerGID := fuzzIface(f, "10.0.0.1/24", "fd00::1/64")
	own := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1"), i.LinkLocal()}
	us := i.HWAddr()
	peer := MakeHWAddr(0, 0x48, peerGID)
	ip := netip.MustParseAddr

	arp := func(op uint16, sip netip.Addr, thw HWAddr, tip netip.Addr) []byte {
		a := arpPacket{Op: op, SenderHW: peer, SenderIP: sip, TargetHW: thw, TargetIP: tip}
		return a.appendFrame(nil)[encapLen:]
	}
	req := arp(arpRequest, ip("10.0.0.2"), HWAddr{}, ip("10.0.0.1"))
	f.Add(uint16(etherARP), req, false)
	f.Add(uint16(etherARP), arp(arpReply, ip("10.0.0.2"), us, ip("10.0.0.1")), false)
	// Gratuitous ones from senders we do not know: they must not make entries.
	f.Add(uint16(etherARP), arp(arpReply, ip("10.0.0.77"), HWAddr{}, ip("10.0.0.77")), false)
	f.Add(uint16(etherARP), arp(arpRequest, ip("10.0.0.78"), HWAddr{}, ip("10.0.0.78")), false)
	f.Add(uint16(etherARP), req[:30], false)

	ns := ndPacket(icmpv6NS, ip("fd00::2"), solicitedNode(ip("fd00::1")), ip("fd00::1"), ndOptSrcLL, peer, 0)
	f.Add(uint16(etherIPv6), ns, false)
	f.Add(uint16(etherIPv6), ndPacket(icmpv6NS, ip("fe80::2"), solicitedNode(own[2]), own[2], ndOptSrcLL, peer, 0), false)
	f.Add(uint16(etherIPv6), ndPacket(icmpv6NS, ip("::"), solicitedNode(ip("fd00::1")), ip("fd00::1"), 0, HWAddr{}, 0), false) // DAD
	f.Add(uint16(etherIPv6), ndPacket(icmpv6NA, ip("fd00::2"), ip("fd00::1"), ip("fd00::2"), ndOptTgtLL, peer, naFlagSolicit|naFlagOverrid), false)
	// An unsolicited NA for an unknown address: no entry.
	f.Add(uint16(etherIPv6), ndPacket(icmpv6NA, ip("fd00::99"), ip("ff02::1"), ip("fd00::99"), ndOptTgtLL, peer, naFlagOverrid), false)
	f.Add(uint16(etherIPv6), ns[:ipv6HdrLen+24], true) // NS without its option
	f.Add(uint16(etherIPv6), ns[:ipv6HdrLen+20], false)
	f.Add(uint16(0x1234), []byte("\x00\x01garbage"), false)
	f.Add(uint16(etherIPv6), []byte("\x60\x00\x00\x00\xff\xff\x3a\xff"), true)

	// The harness reaches the learning: a request for our address makes its entry
	// (else the rule below would hold for nothing). The table starts empty again.
	i.handleARP(req)
	i.handleND(ns)
	for _, a := range []string{"10.0.0.2", "fd00::2"} {
		if _, ok := neighOf(i, a); !ok {
			f.Fatalf("a request from %s for our address made no neighbour", a)
		}
	}
	i.dmu.Lock()
	i.flushNeighLocked()
	i.dmu.Unlock()

	qualified := 0 // inputs that may make an entry, over the whole run
	f.Fuzz(func(t *testing.T, et uint16, pkt []byte, fixSum bool) {
		pkt = slices.Clone(pkt)
		kind := rxClassify(et, pkt)
		if kind != rxARP && kind != rxND {
			return
		}
		// The addresses the packet names, which a handler could enter, and the one
		// it may enter if the packet asks for one of ours.
		var named []netip.Addr
		var allowed netip.Addr
		if kind == rxARP {
			if len(pkt) >= arpLen {
				sip, tip := netip.AddrFrom4([4]byte(pkt[28:32])), netip.AddrFrom4([4]byte(pkt[52:56]))
				named = []netip.Addr{sip, tip}
				if binary.BigEndian.Uint16(pkt[6:]) == arpRequest && slices.Contains(own, tip) {
					allowed = sip
				}
			}
		} else {
			if fixSum {
				pkt[ipv6HdrLen+2], pkt[ipv6HdrLen+3] = 0, 0
				binary.BigEndian.PutUint16(pkt[ipv6HdrLen+2:], icmpv6Checksum(pkt))
			}
			src := netip.AddrFrom16([16]byte(pkt[8:24]))
			tgt := netip.AddrFrom16([16]byte(pkt[ipv6HdrLen+8 : ipv6HdrLen+24]))
			named = []netip.Addr{src, netip.AddrFrom16([16]byte(pkt[24:40])), tgt}
			n := int(binary.BigEndian.Uint16(pkt[4:])) // the message's length (RFC 4861 §7.1: 24 or more)
			if pkt[ipv6HdrLen] == icmpv6NS && slices.Contains(own, tgt) && n >= 24 && ipv6HdrLen+n <= len(pkt) {
				allowed = src
			}
		}
		if allowed.IsValid() {
			qualified++
		}
		had := make([]bool, len(named))
		i.dmu.Lock()
		before := len(i.neigh)
		for k, a := range named {
			_, had[k] = i.neigh[a]
		}
		i.dmu.Unlock()

		if kind == rxARP {
			i.handleARP(pkt)
		} else {
			i.handleND(pkt)
		}

		// Entries are only checked against the input: the GC may drop some meanwhile,
		// and one learned earlier may be updated by any packet.
		i.dmu.Lock()
		defer i.dmu.Unlock()
		for k, a := range named {
			if _, ok := i.neigh[a]; ok && !had[k] && a != allowed {
				t.Fatalf("kind %d: new neighbour %s from a packet that does not ask for our address (allowed: %v)", kind, a, allowed)
			}
		}
		grown := len(i.neigh) - before
		if grown > 1 || grown == 1 && !allowed.IsValid() {
			t.Fatalf("kind %d: neighbour table grew by %d (allowed: %v)", kind, grown, allowed)
		}
		if len(i.neigh) > min(qualified, maxNeigh) {
			t.Fatalf("%d neighbours after %d inputs that may make one", len(i.neigh), qualified)
		}
	})
}

// fuzzIface starts a fabric with an engine whose ib0 is up with these addresses (as
// testFabric and bringUp do, for a testing.TB), and returns it with the GID of another
// port on the fabric: a neighbour there has a path (one without is dropped when the
// answer to its request finds none, which a test may see happen).
func fuzzIface(tb testing.TB, addrs ...string) (*Interface, verbs.GID) {
	tb.Helper()
	r := newRig(tb)
	i := iface(tb, r.engine("a", 1, Options{}), "ib0")
	bringUp(tb, i, addrs...)
	gid, err := r.smh.SoftPort(1).GID(0)
	if err != nil {
		tb.Fatal(err)
	}
	return i, gid
}

// ndPacket builds an IPv6 NS or NA (hop limit 255, valid checksum) with a link-layer
// option of optType carrying hw (none when optType is 0).
func ndPacket(typ byte, src, dst, target netip.Addr, optType byte, hw HWAddr, flags byte) []byte {
	icmpLen := 24
	if optType != 0 {
		icmpLen += ndOptLen
	}
	p := make([]byte, ipv6HdrLen+icmpLen)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], uint16(icmpLen))
	p[6], p[7] = protoICMPv6, 255
	s, d, t := src.As16(), dst.As16(), target.As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	icmp := p[ipv6HdrLen:]
	icmp[0], icmp[4] = typ, flags
	copy(icmp[8:], t[:])
	if optType != 0 {
		icmp[24], icmp[25] = optType, ndOptLen/8
		copy(icmp[28:], hw[:])
	}
	binary.BigEndian.PutUint16(icmp[2:], icmpv6Checksum(p))
	return p
}

// An ND message is what the IPv6 payload length says: one shorter than 24 bytes, or
// longer than the packet, is dropped, and bytes after it (a link's padding) are not
// read as options.
func TestNDHonoursPayloadLength(t *testing.T) {
	i, peerGID := fuzzIface(t, "fd00::1/64")
	ip := netip.MustParseAddr
	peer := MakeHWAddr(0, 0x48, peerGID)
	ns := func(from string) []byte {
		return ndPacket(icmpv6NS, ip(from), solicitedNode(ip("fd00::1")), ip("fd00::1"), ndOptSrcLL, peer, 0)
	}
	// withLen sets the payload length field to n and the checksum over that much.
	withLen := func(p []byte, n int) []byte {
		binary.BigEndian.PutUint16(p[4:], uint16(n))
		p[ipv6HdrLen+2], p[ipv6HdrLen+3] = 0, 0
		binary.BigEndian.PutUint16(p[ipv6HdrLen+2:], icmpv6Checksum(p))
		return p
	}
	for _, c := range []struct {
		what, from string
		pkt        []byte
		dropped    bool
	}{
		{"the option after the message's end", "fd00::3", withLen(ns("fd00::3"), 24), false},
		{"a message of 20 bytes", "fd00::4", withLen(ns("fd00::4"), 20), true},
		{"a length beyond the packet", "fd00::5", withLen(ns("fd00::5"), 24+ndOptLen+8), true},
	} {
		drops := i.stats.rxDropped.Load()
		i.handleND(c.pkt)
		if _, ok := neighOf(i, c.from); ok {
			t.Errorf("%s: a neighbour was made for %s", c.what, c.from)
		}
		if got := i.stats.rxDropped.Load() - drops; got != map[bool]uint64{false: 0, true: 1}[c.dropped] {
			t.Errorf("%s: %d drops counted", c.what, got)
		}
	}
	i.handleND(ns("fd00::6")) // the same solicitation whole: learned
	if _, ok := neighOf(i, "fd00::6"); !ok {
		t.Fatal("a whole solicitation for our address made no neighbour")
	}
}
