//go:build linux

package kernel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/tun"

	"ipoibfs/internal/testenv"

	"golang.org/x/sys/unix"
)

// A device with queues is a multi-queue TUN with that many queues in the kernel, and
// the kernel sends each flow's replies out of the queue the flow came in on (the TUN
// driver's flow steering): a reader per queue gets the flows written to its queue.
func TestMultiQueue(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "q")
	const queues = 3
	d := open(t, Config{Name: uniq("q"), MTU: 1500, NetNS: ns, Queues: queues})
	if d.Queues() != queues {
		t.Fatalf("Queues() = %d, want %d", d.Queues(), queues)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "ls", "/sys/class/net/"+d.Name()+"/queues").CombinedOutput()
	if err != nil {
		t.Fatalf("ls queues: %v %s", err, out)
	}
	var want []string
	for _, dir := range []string{"rx", "tx"} {
		for k := range queues {
			want = append(want, fmt.Sprintf("%s-%d", dir, k))
		}
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, want) {
		t.Fatalf("the kernel's queues of %s: %v, want %v", d.Name(), got, want)
	}
	// What Open checks its queues against (a device renamed or deleted meanwhile would
	// have fewer).
	if l, err := nlHandle(t, ns).LinkByName(d.Name()); err != nil {
		t.Fatal(err)
	} else if tt, ok := l.(*netlink.Tuntap); !ok || tt.Queues != queues {
		t.Fatalf("netlink shows %s as %T %+v, want a tuntap with %d queues", d.Name(), l, l, queues)
	}
	addAddr(t, ns, d.Name(), "10.56.0.1/24")
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf."+d.Name()+".disable_ipv6=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v %s", err, out)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	type reply struct {
		queue int
		peer  [4]byte
	}
	replies := make(chan reply, 16)
	for k := range queues {
		go func() {
			bufs, sizes := [][]byte{make([]byte, 1500)}, make([]int, 1)
			for {
				n, err := d.Queue(k).Read(bufs, sizes)
				if err != nil {
					return // closed
				}
				if p := bufs[0][:sizes[0]]; n == 1 && len(p) >= 28 && p[9] == 1 && p[20] == 0 {
					replies <- reply{k, [4]byte(p[16:20])}
				}
			}
		}()
	}
	ping := func(k int, peer [4]byte) int {
		t.Helper()
		if _, err := d.Queue(k).Write([][]byte{echoRequest4(peer, [4]byte{10, 56, 0, 1}, uint16(k))}); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-replies:
			if r.peer != peer {
				t.Fatalf("a reply to %v, want one to %v", r.peer, peer)
			}
			return r.queue
		case <-time.After(5 * time.Second):
			t.Fatalf("no reply to %v", peer)
		}
		return -1
	}
	// A peer's echo requests go in through queue k; its replies must come out of
	// queue k. The kernel learns a flow's queue after handing its packet up, so the
	// reply to a flow's first packet goes by hash alone: each peer's first is not
	// counted.
	for k := range queues {
		for n := range 3 {
			peer := [4]byte{10, 56, 0, byte(10 + 10*n + k)}
			ping(k, peer)
			for range 2 {
				if got := ping(k, peer); got != k {
					t.Fatalf("the reply to %v came out of queue %d, its flow came in on %d", peer, got, k)
				}
			}
		}
	}
}

// echoRequest4 is an ICMP echo request from src to dst.
func echoRequest4(src, dst [4]byte, id uint16) []byte {
	p := make([]byte, 20+8+16)
	putIPv4(p, 1, src, dst)
	icmp := p[20:]
	icmp[0] = 8
	binary.BigEndian.PutUint16(icmp[4:], id)
	binary.BigEndian.PutUint16(icmp[2:], inetChecksum(icmp))
	return p
}

// putIPv4 writes a 20-byte IPv4 header of protocol proto from src to dst at the start
// of p, for a packet of p's length.
func putIPv4(p []byte, proto byte, src, dst [4]byte) {
	p[0], p[8], p[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	copy(p[12:], src[:])
	copy(p[16:], dst[:])
	binary.BigEndian.PutUint16(p[10:], inetChecksum(p[:20]))
}

// l4Checksum is the TCP or UDP checksum over the pseudo-header and segment of the IPv4
// packet p (a 20-byte header): 0 when the segment's own is right, the value to put
// there when that is 0.
func l4Checksum(p []byte) uint16 {
	seg := p[20:]
	pseudo := make([]byte, 12, 12+len(seg)) // addresses, zero, protocol, length
	copy(pseudo, p[12:20])
	pseudo[9] = p[9]
	binary.BigEndian.PutUint16(pseudo[10:], uint16(len(seg)))
	return inetChecksum(append(pseudo, seg...))
}

func inetChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// A UDP datagram whose checksum, completed on the kernel's behalf (checksum offload),
// comes to 0 leaves as 0xffff: 0 means "no checksum" for UDP (and over IPv6 is
// dropped), as the kernel's own skb_checksum_help writes it.
func TestUDPChecksumZeroIsSentAsFFFF(t *testing.T) {
	prereqs(t)
	ns, d := ipv4Device(t, "z", "10.81.0.1/24")
	fd := testenv.InNetns(t, ns, func() (int, error) { return unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0) })
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 40000, Addr: [4]byte{10, 81, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// The payload's last two bytes make the one's-complement sum of pseudo-header,
	// header and data 0xffff: the checksum computed is 0.
	payload := bytes.Repeat([]byte{0x37}, 64)
	seg := make([]byte, 12+8+len(payload))
	copy(seg, []byte{10, 81, 0, 1, 10, 81, 0, 2, 0, unix.IPPROTO_UDP})
	binary.BigEndian.PutUint16(seg[10:], uint16(8+len(payload)))
	binary.BigEndian.PutUint16(seg[12:], 40000)
	binary.BigEndian.PutUint16(seg[14:], 9)
	binary.BigEndian.PutUint16(seg[16:], uint16(8+len(payload)))
	binary.BigEndian.PutUint16(payload[len(payload)-2:], 0)
	copy(seg[20:], payload)
	sum := ^inetChecksum(seg) // the folded sum without the last two bytes
	binary.BigEndian.PutUint16(payload[len(payload)-2:], 0xffff-sum)
	if err := unix.Sendto(fd, payload, 0, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{10, 81, 0, 2}}); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := [][]byte{make([]byte, 1500)}, make([]int, 1)
	for {
		n, err := d.Read(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		p := bufs[0][:sizes[0]]
		if n == 1 && len(p) >= 28 && p[9] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(p[22:]) == 9 {
			if got := binary.BigEndian.Uint16(p[26:]); got != 0xffff {
				t.Fatalf("UDP checksum %#04x, want 0xffff", got)
			}
			if l4Checksum(p) != 0 {
				t.Fatal("the UDP checksum does not verify")
			}
			return
		}
	}
}

// panickyTUN returns one packet from a read and panics in the read without waiting
// that follows, as a slip in the copied split code would.
type panickyTUN struct {
	tun.Device
}

func (panickyTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	sizes[0] = copy(bufs[0][offset:], "packet")
	return 1, nil
}

func (panickyTUN) TryRead(bufs [][]byte, sizes []int, offset int) (int, error) {
	panic("index out of range")
}

func (panickyTUN) ReadKept() bool { return false }

// A panic recovered in a read keeps the packets of the reads before it in the batch
// and returns its error from the next call, as any error after the first packet.
func TestReadPanicKeepsTheBatch(t *testing.T) {
	d := &Device{name: "fake"}
	d.mtu.Store(1500)
	q := &Queue{d: d, tun: panickyTUN{}}
	bufs := [][]byte{make([]byte, 1500), make([]byte, 1500)}
	sizes := make([]int, 2)
	n, err := q.Read(bufs, sizes)
	if err != nil || n != 1 || string(bufs[0][:sizes[0]]) != "packet" {
		t.Fatalf("read: %d packets, %v (%q); want the packet read before the panic", n, err, bufs[0][:sizes[0]])
	}
	if n, err := q.Read(bufs, sizes); n != 0 || err == nil || !strings.Contains(err.Error(), "index out of range") {
		t.Fatalf("the read after: %d packets, %v; want the panic's error", n, err)
	}
}

// A TCP super-packet over IPv6 with a Routing header (here a segment routing header,
// as SRv6 adds) is split with each segment's checksum over the final destination, the
// routing header's last segment, as RFC 8200 8.1 and the sender's kernel compute it,
// not over the header's destination, the next hop. It is injected through a packet
// socket with a virtio-net header, as the kernel hands a TSO packet to the TUN.
func TestSplitIPv6RoutingHeaderChecksum(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "r")
	d := open(t, Config{Name: uniq("r"), MTU: 1500, NetNS: ns, Offloads: Offloads{TxChecksum: true, TSO: true}})
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	src, next, final := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::9")
	const mss, payload = 1000, 2500
	srh := make([]byte, 8+2*16) // next header TCP, length, type 4, segments left 1, last entry 1
	srh[0], srh[1], srh[2], srh[3], srh[4] = unix.IPPROTO_TCP, byte(len(srh)/8-1), 4, 1, 1
	copy(srh[8:], final.AsSlice()) // segment list[0] is the last segment
	copy(srh[24:], next.AsSlice())
	tcp := make([]byte, 20+payload)
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 9)
	binary.BigEndian.PutUint32(tcp[4:], 1000)
	tcp[12], tcp[13] = 5<<4, 0x18 // data offset 5, PSH|ACK
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	for k := range payload {
		tcp[20+k] = byte(k * 7)
	}
	ip6 := make([]byte, 40)
	ip6[0] = 6 << 4
	binary.BigEndian.PutUint16(ip6[4:], uint16(len(srh)+len(tcp)))
	ip6[6], ip6[7] = 43, 64 // routing header, hop limit
	copy(ip6[8:], src.AsSlice())
	copy(ip6[24:], next.AsSlice())
	// The partial checksum the kernel leaves for the device: the pseudo-header's sum
	// over the final destination, not complemented.
	pseudo := append(append(src.AsSlice(), final.AsSlice()...), 0, 0, 0, 0, 0, 0, 0, unix.IPPROTO_TCP)
	binary.BigEndian.PutUint16(pseudo[34:], uint16(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], ^inetChecksum(pseudo))
	pkt := append(append(ip6, srh...), tcp...)
	hdrLen := uint16(40 + len(srh) + 20)
	vnet := make([]byte, 10) // virtio_net_hdr, little endian
	vnet[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	vnet[1] = unix.VIRTIO_NET_HDR_GSO_TCPV6
	binary.LittleEndian.PutUint16(vnet[2:], hdrLen)
	binary.LittleEndian.PutUint16(vnet[4:], mss)
	binary.LittleEndian.PutUint16(vnet[6:], 40+uint16(len(srh)))
	binary.LittleEndian.PutUint16(vnet[8:], 16)

	fd := testenv.InNetns(t, ns, func() (int, error) {
		return unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_IPV6)))
	})
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendto(fd, append(vnet, pkt...), 0, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: d.Index()}); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := make([][]byte, 8), make([]int, 8)
	for k := range bufs {
		bufs[k] = make([]byte, 1600)
	}
	var got [][]byte
	for len(got) < 3 {
		n, err := d.Read(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		for k := range n {
			p := bufs[k][:sizes[k]]
			if len(p) > 40 && p[0]>>4 == 6 && p[6] == 43 {
				got = append(got, slices.Clone(p))
			}
		}
	}
	for k, p := range got {
		seg := p[hdrLen-20:]
		ps := append(append(src.AsSlice(), final.AsSlice()...), 0, 0, 0, 0, 0, 0, 0, unix.IPPROTO_TCP)
		binary.BigEndian.PutUint16(ps[34:], uint16(len(seg)))
		if c := inetChecksum(append(ps, seg...)); c != 0 {
			t.Errorf("segment %d (%d bytes): the TCP checksum does not verify over the final destination", k, len(p))
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
