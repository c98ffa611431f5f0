package ipoib

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"ipoibfs/verbs"
)

// ARP over InfiniBand (RFC 4391 §8): hardware type 32, 20-byte hardware addresses.
const (
	arpHrdInfiniband = 32
	arpRequest       = 1
	arpReply         = 2
	arpLen           = 8 + 2*(HWAddrLen+4)
)

// arpPacket is an IPv4-over-InfiniBand ARP packet.
type arpPacket struct {
	Op       uint16
	SenderHW HWAddr
	SenderIP netip.Addr
	TargetHW HWAddr
	TargetIP netip.Addr
}

var errARP = errors.New("not an IPoIB IPv4 ARP packet")

func parseARP(b []byte) (arpPacket, error) {
	var a arpPacket
	if len(b) < arpLen || binary.BigEndian.Uint16(b) != arpHrdInfiniband ||
		binary.BigEndian.Uint16(b[2:]) != etherIPv4 || b[4] != HWAddrLen || b[5] != 4 {
		return a, errARP
	}
	a.Op = binary.BigEndian.Uint16(b[6:])
	copy(a.SenderHW[:], b[8:28])
	a.SenderIP = netip.AddrFrom4([4]byte(b[28:32]))
	copy(a.TargetHW[:], b[32:52])
	a.TargetIP = netip.AddrFrom4([4]byte(b[52:56]))
	return a, nil
}

// appendARP appends the encapsulated ARP frame (IPoIB header included).
func (a *arpPacket) appendFrame(b []byte) []byte {
	b = append(b, etherARP>>8, etherARP&0xff, 0, 0)
	b = binary.BigEndian.AppendUint16(b, arpHrdInfiniband)
	b = binary.BigEndian.AppendUint16(b, etherIPv4)
	b = append(b, HWAddrLen, 4)
	b = binary.BigEndian.AppendUint16(b, a.Op)
	b = append(b, a.SenderHW[:]...)
	s4 := a.SenderIP.As4()
	b = append(b, s4[:]...)
	b = append(b, a.TargetHW[:]...)
	t4 := a.TargetIP.As4()
	return append(b, t4[:]...)
}

// handleARP learns the sender and answers requests for our addresses. Like the
// kernel with arp_accept off, it makes a neighbour only for the sender of a request
// for one of our addresses; any other ARP (a reply, a gratuitous one) updates a
// neighbour already there, so nobody fills the table by announcing addresses.
func (i *Interface) handleARP(b []byte) {
	a, err := parseARP(b)
	if err != nil || !a.SenderIP.Is4() {
		i.stats.rxDropped.Add(1)
		return
	}
	own := i.ownAddrs()
	mine := false
	for _, o := range own {
		if o == a.TargetIP {
			mine = true
		}
	}
	var flush [][]byte
	i.dmu.Lock()
	if _, known := i.neigh[a.SenderIP]; known || mine && a.Op == arpRequest {
		flush = i.learnLocked(a.SenderIP, a.SenderHW)
	}
	var reply []byte
	if a.Op == arpRequest && mine {
		r := arpPacket{Op: arpReply, SenderHW: i.hw, SenderIP: a.TargetIP, TargetHW: a.SenderHW, TargetIP: a.SenderIP}
		reply = r.appendFrame(nil)
	}
	i.dmu.Unlock()
	i.resend(a.SenderHW, flush)
	if reply != nil {
		i.dmu.Lock()
		ah, qpn, ok := i.sendToHWLocked(a.SenderHW, [][]byte{reply})
		i.dmu.Unlock()
		if ok {
			i.sendFrames([][]byte{reply}, ah, qpn)
		}
	}
}

// sendARPRequest broadcasts a who-has for ip from the matching local address.
func (i *Interface) sendARPRequest(ip netip.Addr) {
	i.dmu.Lock()
	src, ok := i.sourceFor(ip)
	if !ok {
		i.dmu.Unlock()
		return
	}
	r := arpPacket{Op: arpRequest, SenderHW: i.hw, SenderIP: src, TargetIP: ip}
	frame := r.appendFrame(nil)
	ah, sendNow := i.sendMulticastLocked(i.data().bcast.GID(), frame)
	i.dmu.Unlock()
	if sendNow {
		i.sendFrames([][]byte{frame}, ah, verbs.MulticastQPN)
	}
}

// sourceFor picks the local address of the same family whose prefix contains
// dst, or the first of that family.
func (i *Interface) sourceFor(dst netip.Addr) (netip.Addr, bool) {
	var first netip.Addr
	for _, p := range i.data().hostAddrs {
		if p.Addr().Is4() != dst.Is4() {
			continue
		}
		if p.Contains(dst) {
			return p.Addr(), true
		}
		if !first.IsValid() {
			first = p.Addr()
		}
	}
	if !dst.Is4() && !first.IsValid() || dst.IsLinkLocalUnicast() {
		return linkLocal(i.hw.GID().GUID()), true
	}
	return first, first.IsValid()
}
