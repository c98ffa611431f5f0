// Package dhcp is the DHCPv4 client of an IPoIB interface (BOOTPROTO=dhcp), as RFC 4390
// has it: htype 32, hlen 0, chaddr zero, the broadcast flag set and the client named by
// its client identifier (option 61). The packet codec is gopacket's layers.DHCPv4; this
// package is the RFC 2131 state machine: DISCOVER, OFFER, REQUEST, ACK or NAK, renewal
// at T1 (unicast to the server), rebinding at T2 (broadcast), expiry, and RELEASE when
// the client is closed.
//
// The client owns nothing of the interface: the address goes on and off through a Host
// (the kernel device), packets through a Transport (a UDP socket bound to the device),
// and time through a Clock, so that tests drive all three.
package dhcp

import (
	"bytes"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/gopacket/layers"
)

// Transport carries the client's messages: requests to the servers' port 67, replies
// to port 68.
type Transport interface {
	// Send sends to a server; the zero Addr is the limited broadcast.
	Send(b []byte, to netip.Addr) error
	// Recv blocks for the next datagram; it fails once the transport is closed.
	Recv(b []byte) (int, error)
	Close() error
}

// Host is where the leased address goes (the interface's kernel device).
type Host interface {
	AddAddr(p netip.Prefix, broadcast netip.Addr) error
	DelAddr(p netip.Prefix) error
}

// Clock is the client's time.
type Clock interface {
	Now() time.Time
	// At returns a channel that fires once t is reached, and a function to stop it.
	At(t time.Time) (<-chan time.Time, func())
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) At(t time.Time) (<-chan time.Time, func()) {
	tm := time.NewTimer(time.Until(t))
	return tm.C, func() { tm.Stop() }
}

// Config is one client.
type Config struct {
	ClientID  []byte // option 61, type byte first (2..255 bytes)
	Transport Transport
	Host      Host
	OnLease   func(*Lease) // every change of the lease; nil: none any more
	Logf      func(format string, args ...any)
	Clock     Clock // nil: the real one
}

// Lease is an address the client holds.
type Lease struct {
	Addr      netip.Prefix
	Server    netip.Addr // option 54, where renewals and the release go
	Router    netip.Addr // shown, not installed as a route
	Broadcast netip.Addr
	Time      time.Duration
	Start     time.Time // when the request was sent: the times count from there
	Renew     time.Time // T1
	Rebind    time.Time // T2
	Expiry    time.Time
}

// String is the text of class/net/<if>/dhcp/lease.
func (l *Lease) String() string {
	var b strings.Builder
	b.WriteString("address " + l.Addr.String() + "\n")
	b.WriteString("server " + l.Server.String() + "\n")
	if l.Router.IsValid() {
		b.WriteString("router " + l.Router.String() + "\n")
	}
	b.WriteString("lease_time " + strconv.FormatInt(int64(l.Time/time.Second), 10) + "\n")
	b.WriteString("renew_at " + l.Renew.Format(time.RFC3339) + "\n")
	b.WriteString("rebind_at " + l.Rebind.Format(time.RFC3339) + "\n")
	b.WriteString("expires_at " + l.Expiry.Format(time.RFC3339) + "\n")
	return b.String()
}

type state uint8

const (
	selecting  state = iota // DISCOVERs out, waiting for an OFFER
	requesting              // REQUEST for the offer out, waiting for ACK or NAK
	bound
	renewing  // past T1: REQUEST unicast to the lease's server
	rebinding // past T2: REQUEST broadcast to any server
)

const (
	maxRequests = 4                // REQUESTs for one offer before discovering again
	minRetry    = 60 * time.Second // RFC 2131 §4.4.5, for renewing and rebinding
)

// Client runs one interface's DHCP exchanges until Close.
type Client struct {
	cfg    Config
	clock  Clock
	rx     chan *reply
	stop   chan struct{}
	done   chan struct{}
	rxDone chan struct{}

	// Owned by run.
	state state
	xid   uint32
	tries int
	naks  int       // NAKs since the last ACK
	next  time.Time // when timeout runs
	sent  time.Time // first REQUEST of the current exchange
	offer *reply
	lease *Lease
}

// Start starts the client: it discovers at once.
func Start(cfg Config) *Client {
	c := &Client{cfg: cfg, clock: cfg.Clock, rx: make(chan *reply), stop: make(chan struct{}),
		done: make(chan struct{}), rxDone: make(chan struct{})}
	if c.clock == nil {
		c.clock = realClock{}
	}
	if c.cfg.Logf == nil {
		c.cfg.Logf = func(string, ...any) {}
	}
	c.next = c.clock.Now()
	go c.recvLoop()
	go c.run()
	return c
}

// Close releases the lease (DHCPRELEASE to its server, the address removed) and stops.
func (c *Client) Close() {
	close(c.stop)
	<-c.done
	c.cfg.Transport.Close()
	<-c.rxDone
}

func (c *Client) recvLoop() {
	defer close(c.rxDone)
	buf := make([]byte, 4096)
	for {
		n, err := c.cfg.Transport.Recv(buf)
		if err != nil {
			select {
			case <-c.stop:
				return
			default:
			}
			c.cfg.Logf("dhcp: receive: %v", err)
			select { // a persistent error must not spin
			case <-c.stop:
				return
			case <-time.After(time.Second):
			}
			continue
		}
		r, err := parseReply(buf[:n])
		if err != nil {
			continue // not for us, or not DHCP
		}
		select {
		case c.rx <- r:
		case <-c.stop:
			return
		}
	}
}

func (c *Client) run() {
	defer close(c.done)
	for {
		fire, cancel := c.clock.At(c.next)
		select {
		case <-c.stop:
			cancel()
			c.release()
			return
		case r := <-c.rx:
			cancel()
			c.receive(r)
		case <-fire:
			c.timeout()
		}
	}
}

func (c *Client) timeout() {
	now := c.clock.Now()
	switch c.state {
	case selecting:
		if c.tries == 0 {
			c.xid = rand.Uint32()
		}
		c.send(&request{typ: layers.DHCPMsgTypeDiscover, xid: c.xid}, netip.Addr{})
		c.tries++
		c.next = now.Add(backoff(c.tries))
	case requesting:
		if c.tries >= maxRequests {
			c.cfg.Logf("dhcp: no answer to the request for %s from %s; discovering again", c.offer.yiaddr, c.offer.server)
			c.restart(now)
			return
		}
		if c.tries == 0 {
			c.sent = now
		}
		c.send(&request{typ: layers.DHCPMsgTypeRequest, xid: c.xid, reqAddr: c.offer.yiaddr, server: c.offer.server}, netip.Addr{})
		c.tries++
		c.next = now.Add(backoff(c.tries))
	default:
		l := c.lease
		switch {
		case !now.Before(l.Expiry):
			c.cfg.Logf("dhcp: lease of %s expired; discovering again", l.Addr)
			c.drop()
			c.restart(now)
		case !now.Before(l.Rebind):
			if c.state != rebinding {
				c.state, c.xid, c.sent = rebinding, rand.Uint32(), now
				c.cfg.Logf("dhcp: no renewal of %s from %s; rebinding with any server", l.Addr, l.Server)
			}
			c.send(&request{typ: layers.DHCPMsgTypeRequest, xid: c.xid, ciaddr: l.Addr.Addr()}, netip.Addr{})
			c.next = retry(now, l.Expiry)
		case !now.Before(l.Renew):
			if c.state != renewing {
				c.state, c.xid, c.sent = renewing, rand.Uint32(), now
			}
			c.send(&request{typ: layers.DHCPMsgTypeRequest, xid: c.xid, ciaddr: l.Addr.Addr()}, l.Server)
			c.next = retry(now, l.Rebind)
		default:
			c.next = l.Renew
		}
	}
}

func (c *Client) receive(r *reply) {
	if r.xid != c.xid || (r.clientID != nil && !bytes.Equal(r.clientID, c.cfg.ClientID)) {
		return
	}
	now := c.clock.Now()
	switch {
	case c.state == selecting && r.typ == layers.DHCPMsgTypeOffer:
		if !r.yiaddr.IsValid() || r.yiaddr.IsUnspecified() || !r.server.IsValid() {
			return
		}
		c.offer, c.state, c.tries = r, requesting, 0
		c.timeout() // the REQUEST goes out now
	case c.state == selecting || c.state == bound:
		// stray or late replies
	case r.typ == layers.DHCPMsgTypeAck:
		c.bind(r)
	case r.typ == layers.DHCPMsgTypeNak:
		c.cfg.Logf("dhcp: NAK from %s: %q; discovering again", r.server, r.message)
		c.drop()
		c.naks++
		// A server that keeps refusing is asked again less and less often.
		delay := time.Duration(0)
		if c.naks > 1 {
			delay = backoff(c.naks - 1)
		}
		c.restart(now.Add(delay))
	}
}

func (c *Client) bind(r *reply) {
	if !r.yiaddr.IsValid() || r.yiaddr.IsUnspecified() || r.lease <= 0 {
		c.cfg.Logf("dhcp: ACK from %s without an address or lease time ignored", r.server)
		return
	}
	l := &Lease{Server: r.server, Router: r.router, Broadcast: r.broadcast, Time: r.lease, Start: c.sent}
	if !l.Server.IsValid() && c.lease != nil {
		l.Server = c.lease.Server
	} else if !l.Server.IsValid() && c.offer != nil {
		l.Server = c.offer.server
	}
	l.Addr = netip.PrefixFrom(r.yiaddr, maskBits(r.mask, r.yiaddr))
	t1, t2 := r.t1, r.t2
	if t2 <= 0 || t2 > r.lease {
		// Divided first: lease*7 overflows for leases beyond 41 years, and the
		// infinite one (0xffffffff s, RFC 2131) put T1 and T2 in the past, so the
		// client renewed as fast as the server answered.
		t2 = r.lease / 8 * 7
	}
	if t1 <= 0 || t1 > t2 {
		t1 = min(r.lease/2, t2)
	}
	l.Renew, l.Rebind, l.Expiry = l.Start.Add(t1), l.Start.Add(t2), l.Start.Add(r.lease)
	old := c.lease
	if old != nil && old.Addr != l.Addr {
		c.delAddr(old.Addr)
	}
	// Also on a renewal: the device may have been made again meanwhile.
	if err := c.cfg.Host.AddAddr(l.Addr, l.Broadcast); err != nil {
		c.cfg.Logf("dhcp: %v", err)
	}
	if old == nil || old.Addr != l.Addr {
		c.cfg.Logf("dhcp: bound to %s from %s, lease %s", l.Addr, l.Server, l.Time)
	} else {
		c.cfg.Logf("dhcp: lease of %s renewed from %s, %s", l.Addr, l.Server, l.Time)
	}
	c.lease, c.state, c.tries, c.naks, c.offer = l, bound, 0, 0, nil
	c.next = l.Renew
	c.onLease()
}

// release gives the lease back: one unacknowledged RELEASE, as RFC 2131 has it.
func (c *Client) release() {
	l := c.lease
	if l == nil {
		return
	}
	c.send(&request{typ: layers.DHCPMsgTypeRelease, xid: rand.Uint32(), ciaddr: l.Addr.Addr(), server: l.Server}, l.Server)
	c.cfg.Logf("dhcp: released %s to %s", l.Addr, l.Server)
	c.drop()
}

// drop forgets the lease and takes its address off the device.
func (c *Client) drop() {
	if c.lease == nil {
		return
	}
	c.delAddr(c.lease.Addr)
	c.lease = nil
	c.onLease()
}

func (c *Client) delAddr(p netip.Prefix) {
	if err := c.cfg.Host.DelAddr(p); err != nil {
		c.cfg.Logf("dhcp: %v", err)
	}
}

func (c *Client) restart(at time.Time) {
	c.state, c.tries, c.offer, c.next = selecting, 0, nil, at
}

func (c *Client) onLease() {
	if c.cfg.OnLease != nil {
		c.cfg.OnLease(c.lease)
	}
}

func (c *Client) send(q *request, to netip.Addr) {
	q.clientID = c.cfg.ClientID
	b, err := q.encode()
	if err == nil {
		err = c.cfg.Transport.Send(b, to)
	}
	if err != nil {
		c.cfg.Logf("dhcp: send %v: %v", q.typ, err)
	}
}

// backoff is RFC 2131 §4.1's retransmission delay: 4 s doubling up to 64 s, ±1 s.
func backoff(try int) time.Duration {
	d := 4 * time.Second << min(try-1, 4)
	return d + time.Duration(rand.Int64N(int64(2*time.Second))) - time.Second
}

// retry is the next retransmission in RENEWING and REBINDING: half the time left
// before until, at least a minute, never past until.
func retry(now, until time.Time) time.Time {
	t := now.Add(max(until.Sub(now)/2, minRetry))
	if t.After(until) {
		return until
	}
	return t
}

// maskBits is the prefix length of a subnet mask; without a (contiguous) one, the
// address's class, as ifup's ipcalc does.
func maskBits(mask, addr netip.Addr) int {
	if mask.Is4() {
		b := mask.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		if n := bits.LeadingZeros32(^v); v<<n == 0 {
			return n
		}
	}
	switch first := addr.As4()[0]; {
	case first < 128:
		return 8
	case first < 192:
		return 16
	}
	return 24
}
