package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"ipoibfs/internal/inet"
	"ipoibfs/verbs"
)

// Pcap file constants.
const (
	PcapSnapLen      = 262144
	LinkTypeEthernet = 1

	pcapMagic     = 0xa1b2c3d4 // microsecond timestamps, written little-endian
	pcapRecHdrLen = 16
	ethHdrLen     = 14
	ipv6HdrLen    = 40
	udpHdrLen     = 8
	frameHdrLen   = ethHdrLen + ipv6HdrLen + udpHdrLen
	pcapHopLimit  = 64
)

// PcapWriter writes fabric packets to a classic pcap capture (LINKTYPE_ETHERNET), each
// framed as Ethernet / IPv6 / UDP (source port 0xC000, destination 4791) so that
// Wireshark and tshark dissect them as RoCEv2 with no "decode as". It is safe for
// concurrent use; each packet is written with a single Write call.
type PcapWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewPcapWriter writes the pcap global header (version 2.4, little-endian, microsecond
// timestamps, snaplen 262144, LINKTYPE_ETHERNET) to w and returns a writer for packets.
func NewPcapWriter(w io.Writer) (*PcapWriter, error) {
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], pcapMagic)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	// thiszone and sigfigs stay 0.
	binary.LittleEndian.PutUint32(h[16:], PcapSnapLen)
	binary.LittleEndian.PutUint32(h[20:], LinkTypeEthernet)
	if _, err := w.Write(h[:]); err != nil {
		return nil, fmt.Errorf("wire: writing pcap header: %w", err)
	}
	return &PcapWriter{w: w}, nil
}

// WritePacket writes one record holding ib (an encoded IB packet as produced by
// Packet.AppendTo) sent from sgid to dgid at time ts. The frame is Ethernet (MACs from
// GIDs, see GIDMAC; EtherType 0x86dd) + IPv6 (source SGID, destination DGID, hop limit
// 64, next header UDP) + UDP (0xC000 -> 4791, valid checksum) + ib.
func (w *PcapWriter) WritePacket(ts time.Time, sgid, dgid verbs.GID, ib []byte) error {
	udpLen := udpHdrLen + len(ib)
	if udpLen > 0xffff {
		return fmt.Errorf("wire: pcap: %d-byte IB packet does not fit in a UDP datagram", len(ib))
	}
	frameLen := frameHdrLen + len(ib)

	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], make([]byte, pcapRecHdrLen+frameHdrLen)...)
	b = append(b, ib...)
	w.buf = b

	// Record header.
	binary.LittleEndian.PutUint32(b[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(b[4:], uint32(ts.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(b[8:], uint32(frameLen))
	binary.LittleEndian.PutUint32(b[12:], uint32(frameLen))
	f := b[pcapRecHdrLen:]

	// Ethernet.
	dmac, smac := GIDMAC(dgid), GIDMAC(sgid)
	copy(f[0:6], dmac[:])
	copy(f[6:12], smac[:])
	binary.BigEndian.PutUint16(f[12:], 0x86dd)

	// IPv6.
	ip := f[ethHdrLen:]
	binary.BigEndian.PutUint32(ip[0:], 6<<28)
	binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
	ip[6] = 17
	ip[7] = pcapHopLimit
	copy(ip[8:24], sgid[:])
	copy(ip[24:40], dgid[:])

	// UDP.
	u := ip[ipv6HdrLen:]
	binary.BigEndian.PutUint16(u[0:], UDPSrcPort)
	binary.BigEndian.PutUint16(u[2:], UDPPort)
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen))
	binary.BigEndian.PutUint16(u[6:], 0)
	// Checksum over the IPv6 pseudo header (addresses, upper-layer length, next header)
	// and the UDP header and payload; 0 is sent as 0xffff (RFC 8200 §8.1).
	sum := inet.Sum(0, ip[8:40])
	sum += uint32(udpLen) + 17
	sum = inet.Sum(sum, u[:udpLen])
	c := ^inet.Fold(sum)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)

	if _, err := w.w.Write(b); err != nil {
		return fmt.Errorf("wire: writing pcap record: %w", err)
	}
	return nil
}

// GIDMAC returns the Ethernet address PcapWriter uses for a GID: 33:33 followed by the
// last 4 bytes for a multicast GID (as IPv6 multicast maps to Ethernet), otherwise the
// locally administered unicast 02 followed by the last 5 bytes of the GUID.
func GIDMAC(g verbs.GID) [6]byte {
	var m [6]byte
	if g.IsMulticast() {
		m[0], m[1] = 0x33, 0x33
		copy(m[2:], g[12:16])
		return m
	}
	m[0] = 0x02
	copy(m[1:], g[11:16])
	return m
}
