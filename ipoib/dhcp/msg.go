package dhcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// htypeInfiniBand is ARP hardware type 32, which RFC 4390 puts in htype with hlen 0:
// the 20-byte hardware address does not fit chaddr, the client identifier names the
// client instead.
const htypeInfiniBand = 32

// flagBroadcast asks for broadcast replies (RFC 4390 §2.1: the server cannot address
// the client's hardware).
const flagBroadcast = 0x8000

// reply is what the client uses of a server's message.
type reply struct {
	typ       layers.DHCPMsgType
	xid       uint32
	yiaddr    netip.Addr
	server    netip.Addr // option 54
	clientID  []byte     // option 61 when the server echoes it (RFC 6842)
	mask      netip.Addr
	router    netip.Addr
	broadcast netip.Addr
	lease     time.Duration // option 51; 0: absent
	t1, t2    time.Duration
	message   string // option 56, a NAK's reason
}

// parseReply decodes a BOOTREPLY. Its input comes from the network: anything malformed
// is an error, never a panic.
func parseReply(b []byte) (*reply, error) {
	// gopacket slices chaddr by hlen without checking it (hlen 255 reads past the end).
	if len(b) < 240 || b[2] > 16 {
		return nil, errors.New("not a BOOTP message")
	}
	var d layers.DHCPv4
	if err := d.DecodeFromBytes(b, gopacket.NilDecodeFeedback); err != nil {
		return nil, err
	}
	if d.Operation != layers.DHCPOpReply {
		return nil, errors.New("not a BOOTREPLY")
	}
	r := &reply{xid: d.Xid, yiaddr: addr4(d.YourClientIP)}
	for _, o := range d.Options {
		switch o.Type {
		case layers.DHCPOptMessageType:
			if len(o.Data) == 1 {
				r.typ = layers.DHCPMsgType(o.Data[0])
			}
		case layers.DHCPOptServerID:
			r.server = addr4(o.Data)
		case layers.DHCPOptClientID:
			r.clientID = o.Data
		case layers.DHCPOptSubnetMask:
			r.mask = addr4(o.Data)
		case layers.DHCPOptRouter:
			if len(o.Data) >= 4 {
				r.router = addr4(o.Data[:4])
			}
		case layers.DHCPOptBroadcastAddr:
			r.broadcast = addr4(o.Data)
		case layers.DHCPOptLeaseTime:
			r.lease = seconds(o.Data)
		case layers.DHCPOptT1:
			r.t1 = seconds(o.Data)
		case layers.DHCPOptT2:
			r.t2 = seconds(o.Data)
		case layers.DHCPOptMessage:
			r.message = string(o.Data)
		}
	}
	if r.typ == layers.DHCPMsgTypeUnspecified {
		return nil, errors.New("no DHCP message type")
	}
	return r, nil
}

func addr4(b []byte) netip.Addr {
	if len(b) != 4 {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte(b))
}

func seconds(b []byte) time.Duration {
	if len(b) != 4 {
		return 0
	}
	return time.Duration(binary.BigEndian.Uint32(b)) * time.Second
}

// request is one BOOTREQUEST the client sends.
type request struct {
	typ      layers.DHCPMsgType
	xid      uint32
	ciaddr   netip.Addr // RENEWING, REBINDING, RELEASE
	reqAddr  netip.Addr // option 50 (SELECTING)
	server   netip.Addr // option 54 (SELECTING, RELEASE)
	clientID []byte
}

// params is the parameter request list: mask, router, broadcast, lease, T1, T2.
var params = []byte{1, 3, 28, 51, 58, 59}

// encode builds the message as RFC 4390 has it: htype 32, hlen 0, chaddr zero, the
// broadcast flag set, and the client identifier.
func (q *request) encode() ([]byte, error) {
	d := layers.DHCPv4{Operation: layers.DHCPOpRequest, HardwareType: htypeInfiniBand,
		Xid: q.xid, Flags: flagBroadcast,
		ClientIP: net.IPv4zero, YourClientIP: net.IPv4zero, NextServerIP: net.IPv4zero, RelayAgentIP: net.IPv4zero}
	if q.ciaddr.IsValid() {
		d.ClientIP = q.ciaddr.AsSlice()
	}
	opt := func(t layers.DHCPOpt, b []byte) { d.Options = append(d.Options, layers.NewDHCPOption(t, b)) }
	opt(layers.DHCPOptMessageType, []byte{byte(q.typ)})
	opt(layers.DHCPOptClientID, q.clientID)
	if q.reqAddr.IsValid() {
		opt(layers.DHCPOptRequestIP, q.reqAddr.AsSlice())
	}
	if q.server.IsValid() {
		opt(layers.DHCPOptServerID, q.server.AsSlice())
	}
	if q.typ != layers.DHCPMsgTypeRelease {
		opt(layers.DHCPOptParamsRequest, params)
	}
	if len(q.clientID) < 2 || len(q.clientID) > 255 {
		return nil, fmt.Errorf("client identifier of %d bytes (2..255)", len(q.clientID))
	}
	buf := gopacket.NewSerializeBuffer()
	if err := d.SerializeTo(buf, gopacket.SerializeOptions{}); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	// BOOTP's minimum of 300 bytes, which some relays and servers insist on; zeros
	// after the end option are padding.
	if len(b) < 300 {
		b = append(b, bytes.Repeat([]byte{0}, 300-len(b))...)
	}
	return b, nil
}
