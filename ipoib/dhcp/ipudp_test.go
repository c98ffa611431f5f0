package dhcp

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/net/bpf"

	"ipoibfs/internal/inet"
)

// udpReply is an IPv4 UDP datagram from the server's port 67 to port dport with
// correct checksums, as gopacket serialises it.
func udpReply(t testing.TB, dport uint16, payload []byte) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IPv4(10, 67, 0, 1), DstIP: net.IPv4(255, 255, 255, 255)}
	udp := &layers.UDP{SrcPort: 67, DstPort: layers.UDPPort(dport)}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// refix recomputes the IPv4 header checksum after a test changed the header.
func refix(p []byte) {
	p[10], p[11] = 0, 0
	binary.BigEndian.PutUint16(p[10:], inet.Checksum(p[:int(p[0]&0x0f)*4]))
}

func TestUDPPayload(t *testing.T) {
	msg := []byte("a DHCP reply, odd length")
	good := udpReply(t, clientPort, msg)
	if p, err := udpPayload(good, false); err != nil || !bytes.Equal(p, msg) {
		t.Fatalf("a good reply: %q, %v", p, err)
	}
	// Bytes after the IP packet's length (a link's padding) are not the payload's.
	if p, err := udpPayload(append(bytes.Clone(good), 0, 0, 0, 0), false); err != nil || !bytes.Equal(p, msg) {
		t.Fatalf("a padded reply: %q, %v", p, err)
	}
	badUDP := bytes.Clone(good)
	badUDP[len(badUDP)-1] ^= 1
	if _, err := udpPayload(badUDP, false); err == nil {
		t.Error("a corrupted payload with a UDP checksum was taken")
	}
	if p, err := udpPayload(badUDP, true); err != nil || len(p) != len(msg) {
		t.Errorf("a payload whose checksum the kernel vouches for: %v", err)
	}
	noSum := bytes.Clone(badUDP)
	noSum[20+6], noSum[20+7] = 0, 0
	if _, err := udpPayload(noSum, false); err != nil {
		t.Errorf("a datagram sent without a checksum (0): %v", err)
	}
	for name, mangle := range map[string]func(p []byte) []byte{
		"IPv4 header checksum": func(p []byte) []byte { p[8]--; return p },
		"fragment":             func(p []byte) []byte { p[6] |= 0x20; refix(p); return p },
		"fragment offset":      func(p []byte) []byte { p[7] = 1; refix(p); return p },
		"TCP":                  func(p []byte) []byte { p[9] = 6; refix(p); return p },
		"other port":           func(p []byte) []byte { p[23] = 69; return p },
		"truncated":            func(p []byte) []byte { return p[:len(p)-1] },
		"UDP length too long":  func(p []byte) []byte { binary.BigEndian.PutUint16(p[24:], 200); return p },
		"UDP length too short": func(p []byte) []byte { binary.BigEndian.PutUint16(p[24:], 7); return p },
		"IPv6":                 func(p []byte) []byte { p[0] = 0x60; return p },
		"IHL below 5":          func(p []byte) []byte { p[0] = 0x44; return p },
	} {
		if _, err := udpPayload(mangle(bytes.Clone(good)), true); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
}

// The packet socket's filter passes replies to port 68 and nothing else, as
// udpPayload's header checks do.
func TestReplyFilter(t *testing.T) {
	vm, err := bpf.NewVM(replyFilter)
	if err != nil {
		t.Fatal(err)
	}
	good := udpReply(t, clientPort, []byte("offer"))
	opts := bytes.Clone(good) // an IP header with options: 24 bytes
	opts = append(append(append([]byte{}, opts[:20]...), 1, 1, 1, 0), opts[20:]...)
	opts[0] = 0x46
	binary.BigEndian.PutUint16(opts[2:], uint16(len(opts)))
	refix(opts)
	for name, c := range map[string]struct {
		p    []byte
		pass bool
	}{
		"reply":             {good, true},
		"reply, IP options": {opts, true},
		"to port 67":        {udpReply(t, 67, []byte("discover")), false},
		"fragment":          {func() []byte { p := bytes.Clone(good); p[6] |= 0x20; return p }(), false},
		"TCP":               {func() []byte { p := bytes.Clone(good); p[9] = 6; return p }(), false},
	} {
		n, err := vm.Run(c.p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if (n > 0) != c.pass {
			t.Errorf("%s: filter returned %d", name, n)
		}
	}
	if _, err := udpPayload(opts, false); err != nil {
		t.Errorf("a reply with IP options: %v", err)
	}
}

func FuzzUDPPayload(f *testing.F) {
	f.Add(udpReply(f, clientPort, []byte("offer")), false)
	f.Add(udpReply(f, clientPort, nil), true)
	f.Fuzz(func(t *testing.T, p []byte, csumOK bool) {
		out, err := udpPayload(p, csumOK)
		if err != nil {
			return
		}
		if len(out) > len(p)-28 {
			t.Fatalf("a payload of %d bytes from a %d-byte packet", len(out), len(p))
		}
	})
}
