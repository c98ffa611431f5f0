package dhcp

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// fakeClock hands the client's timers to the test: armed reports each deadline the
// client waits for, fire reaches it.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	cur   chan time.Time
	armed chan time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) At(t time.Time) (<-chan time.Time, func()) {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.cur = ch
	c.mu.Unlock()
	c.armed <- t
	return ch, func() {}
}

type sent struct {
	msg *layers.DHCPv4
	to  netip.Addr
}

type fakeTransport struct {
	sent   chan sent
	in     chan []byte
	closed chan struct{}
	once   sync.Once
}

func (t *fakeTransport) Send(b []byte, to netip.Addr) error {
	var d layers.DHCPv4
	if err := d.DecodeFromBytes(bytes.Clone(b), gopacket.NilDecodeFeedback); err != nil {
		return err
	}
	t.sent <- sent{&d, to}
	return nil
}

func (t *fakeTransport) Recv(b []byte) (int, error) {
	select {
	case p := <-t.in:
		return copy(b, p), nil
	case <-t.closed:
		return 0, net.ErrClosed
	}
}

func (t *fakeTransport) Close() error { t.once.Do(func() { close(t.closed) }); return nil }

type fakeHost struct {
	mu    sync.Mutex
	addrs map[netip.Prefix]bool
}

func (h *fakeHost) AddAddr(p netip.Prefix, _ netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addrs[p] = true
	return nil
}

func (h *fakeHost) DelAddr(p netip.Prefix) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.addrs, p)
	return nil
}

func (h *fakeHost) has() []netip.Prefix {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []netip.Prefix
	for p := range h.addrs {
		out = append(out, p)
	}
	return out
}

var (
	clientID = []byte{0xff, 0, 0, 0, 0, 0, 0x02, 0, 0, 0x02, 0xc9, 0, 0, 0x02, 0xc9, 0x03, 0, 0, 0x10, 0x39}
	server   = netip.MustParseAddr("10.68.0.1")
	leased   = netip.MustParsePrefix("10.68.0.10/24")
	t0       = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
)

type harness struct {
	t     *testing.T
	clk   *fakeClock
	tr    *fakeTransport
	host  *fakeHost
	c     *Client
	mu    sync.Mutex
	lease *Lease
}

func start(t *testing.T) *harness {
	h := &harness{t: t, clk: &fakeClock{now: t0, armed: make(chan time.Time, 100)},
		tr:   &fakeTransport{sent: make(chan sent, 100), in: make(chan []byte), closed: make(chan struct{})},
		host: &fakeHost{addrs: map[netip.Prefix]bool{}}}
	h.c = Start(Config{ClientID: clientID, Transport: h.tr, Host: h.host, Clock: h.clk, Logf: t.Logf,
		OnLease: func(l *Lease) { h.mu.Lock(); h.lease = l; h.mu.Unlock() }})
	return h
}

// armed is the deadline the client waits for now.
func (h *harness) armed() time.Time {
	h.t.Helper()
	select {
	case d := <-h.clk.armed:
		return d
	case <-time.After(5 * time.Second):
		h.t.Fatal("the client armed no timer")
	}
	return time.Time{}
}

// fire moves the clock to the armed deadline and fires it; it returns that time.
func (h *harness) fire() time.Time {
	h.t.Helper()
	return h.fireAt(time.Time{})
}

// fireAt is fire, checking the deadline when want is set.
func (h *harness) fireAt(want time.Time) time.Time {
	h.t.Helper()
	d := h.armed()
	if !want.IsZero() && !d.Equal(want) {
		h.t.Fatalf("armed for %v, want %v", d, want)
	}
	h.clk.mu.Lock()
	h.clk.now = d
	ch := h.clk.cur
	h.clk.mu.Unlock()
	ch <- d
	return d
}

func (h *harness) next(typ layers.DHCPMsgType, to netip.Addr) *layers.DHCPv4 {
	h.t.Helper()
	select {
	case s := <-h.tr.sent:
		if got := msgType(s.msg); got != typ || s.to != to {
			h.t.Fatalf("sent %v to %v, want %v to %v", got, s.to, typ, to)
		}
		return s.msg
	case <-time.After(5 * time.Second):
		h.t.Fatalf("no %v sent", typ)
	}
	return nil
}

func (h *harness) reply(typ layers.DHCPMsgType, xid uint32, opts ...layers.DHCPOption) {
	h.t.Helper()
	h.tr.in <- encodeReply(h.t, typ, xid, opts...)
}

// encodeReply is a server's message to the client.
func encodeReply(t testing.TB, typ layers.DHCPMsgType, xid uint32, opts ...layers.DHCPOption) []byte {
	d := layers.DHCPv4{Operation: layers.DHCPOpReply, HardwareType: htypeInfiniBand, Xid: xid, Flags: flagBroadcast,
		ClientIP: net.IPv4zero, YourClientIP: leased.Addr().AsSlice(), NextServerIP: net.IPv4zero, RelayAgentIP: net.IPv4zero,
		Options: append([]layers.DHCPOption{
			layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(typ)}),
			layers.NewDHCPOption(layers.DHCPOptServerID, server.AsSlice()),
			layers.NewDHCPOption(layers.DHCPOptClientID, clientID),
		}, opts...)}
	if typ == layers.DHCPMsgTypeNak {
		d.YourClientIP = net.IPv4zero
	}
	buf := gopacket.NewSerializeBuffer()
	if err := d.SerializeTo(buf, gopacket.SerializeOptions{}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func (h *harness) ack(xid uint32, leaseSecs byte) {
	h.t.Helper()
	h.reply(layers.DHCPMsgTypeAck, xid,
		layers.NewDHCPOption(layers.DHCPOptLeaseTime, []byte{0, 0, 0, leaseSecs}),
		layers.NewDHCPOption(layers.DHCPOptSubnetMask, []byte{255, 255, 255, 0}),
		layers.NewDHCPOption(layers.DHCPOptRouter, server.AsSlice()))
}

func (h *harness) current() *Lease { h.mu.Lock(); defer h.mu.Unlock(); return h.lease }

func msgType(d *layers.DHCPv4) layers.DHCPMsgType {
	for _, o := range d.Options {
		if o.Type == layers.DHCPOptMessageType && len(o.Data) == 1 {
			return layers.DHCPMsgType(o.Data[0])
		}
	}
	return 0
}

func option(d *layers.DHCPv4, t layers.DHCPOpt) []byte {
	for _, o := range d.Options {
		if o.Type == t {
			return o.Data
		}
	}
	return nil
}

var bcast netip.Addr // the zero Addr: the limited broadcast

// bind runs DISCOVER, OFFER, REQUEST, ACK (lease 100 s, T1 50 s, T2 87.5 s).
func (h *harness) bind() {
	h.t.Helper()
	h.fire()
	d := h.next(layers.DHCPMsgTypeDiscover, bcast)
	h.armed() // the retransmission
	h.reply(layers.DHCPMsgTypeOffer, d.Xid)
	r := h.next(layers.DHCPMsgTypeRequest, bcast)
	if r.Xid != d.Xid || !bytes.Equal(option(r, layers.DHCPOptRequestIP), leased.Addr().AsSlice()) ||
		!bytes.Equal(option(r, layers.DHCPOptServerID), server.AsSlice()) {
		h.t.Fatalf("REQUEST in SELECTING: %v", r)
	}
	h.armed()
	h.ack(r.Xid, 100)
	h.waitLease()
	if got := h.host.has(); len(got) != 1 || got[0] != leased {
		h.t.Fatalf("addresses %v after the ACK, want %v", got, leased)
	}
}

// waitLease waits until the client has a lease (the ACK is handled).
func (h *harness) waitLease() {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); h.current() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			h.t.Fatal("no lease after the ACK")
		}
	}
}

// RFC 4390's message form, then renewal at T1 unicast to the server, rebinding at T2
// broadcast, and the lease text.
func TestDHCPRenewRebind(t *testing.T) {
	h := start(t)
	defer h.c.Close()
	h.fire()
	d := h.next(layers.DHCPMsgTypeDiscover, bcast)
	if d.HardwareType != htypeInfiniBand || d.HardwareLen != 0 || d.Flags != flagBroadcast ||
		!bytes.Equal(option(d, layers.DHCPOptClientID), clientID) || !d.ClientIP.Equal(net.IPv4zero) {
		t.Fatalf("DISCOVER is not RFC 4390's: %v", d)
	}
	if b := d.Contents[28:44]; !bytes.Equal(b, make([]byte, 16)) {
		t.Fatalf("chaddr %x, want zero", b)
	}
	// No OFFER: the DISCOVER goes again, with the same xid.
	h.fire()
	if d2 := h.next(layers.DHCPMsgTypeDiscover, bcast); d2.Xid != d.Xid {
		t.Errorf("retransmitted DISCOVER xid %#x, want %#x", d2.Xid, d.Xid)
	}
	h.armed()
	h.reply(layers.DHCPMsgTypeOffer, d.Xid)
	r := h.next(layers.DHCPMsgTypeRequest, bcast)
	h.armed()
	start := h.clk.Now() // the REQUEST went: the lease counts from here
	h.ack(r.Xid, 100)
	h.waitLease()
	l := h.current()
	at := func(d time.Duration) string { return start.Add(d).Format(time.RFC3339) }
	want := "address 10.68.0.10/24\nserver 10.68.0.1\nrouter 10.68.0.1\nlease_time 100\n" +
		"renew_at " + at(50*time.Second) + "\nrebind_at " + at(87500*time.Millisecond) + "\nexpires_at " + at(100*time.Second) + "\n"
	if got := l.String(); got != want {
		t.Fatalf("lease text\n%s\nwant\n%s", got, want)
	}

	// T1: a REQUEST unicast to the server, with ciaddr and without options 50 and 54.
	h.fireAt(start.Add(50 * time.Second))
	r = h.next(layers.DHCPMsgTypeRequest, server)
	if !r.ClientIP.Equal(leased.Addr().AsSlice()) || option(r, layers.DHCPOptRequestIP) != nil || option(r, layers.DHCPOptServerID) != nil {
		t.Fatalf("REQUEST in RENEWING: %v", r)
	}
	renewed := h.clk.Now()
	// The retransmission would be a minute later, past T2: it is T2.
	if got := h.armed(); !got.Equal(start.Add(87500 * time.Millisecond)) {
		t.Errorf("renewal retransmission at %v, want T2", got)
	}
	h.ack(r.Xid, 100)
	h.fireAt(renewed.Add(50 * time.Second)) // the renewed lease's T1
	if l := h.current(); !l.Expiry.Equal(renewed.Add(100 * time.Second)) {
		t.Errorf("renewed lease expires %v, want %v", l.Expiry, renewed.Add(100*time.Second))
	}
	h.next(layers.DHCPMsgTypeRequest, server) // unanswered

	// T2: the REQUEST is broadcast, for any server.
	h.fireAt(renewed.Add(87500 * time.Millisecond))
	r = h.next(layers.DHCPMsgTypeRequest, bcast)
	if !r.ClientIP.Equal(leased.Addr().AsSlice()) || option(r, layers.DHCPOptServerID) != nil {
		t.Fatalf("REQUEST in REBINDING: %v", r)
	}
	if got := h.armed(); !got.Equal(renewed.Add(100 * time.Second)) {
		t.Errorf("rebinding retransmission at %v, want the expiry", got)
	}
	h.ack(r.Xid, 100)
	h.fireAt(h.clk.Now().Add(50 * time.Second))
	if h.current() == nil || len(h.host.has()) != 1 {
		t.Fatal("rebinding's ACK lost the lease")
	}
	h.next(layers.DHCPMsgTypeRequest, server)
}

// Nobody answers: at expiry the address goes and discovery starts again.
func TestDHCPExpiry(t *testing.T) {
	h := start(t)
	defer h.c.Close()
	h.bind()
	h.fireAt(t0.Add(50 * time.Second))
	h.next(layers.DHCPMsgTypeRequest, server)
	h.fireAt(t0.Add(87500 * time.Millisecond))
	h.next(layers.DHCPMsgTypeRequest, bcast)
	h.fireAt(t0.Add(100 * time.Second))
	// Expired: the DISCOVER goes at once.
	h.fireAt(t0.Add(100 * time.Second))
	h.next(layers.DHCPMsgTypeDiscover, bcast)
	if got := h.host.has(); len(got) != 0 || h.current() != nil {
		t.Fatalf("after expiry: addresses %v, lease %v", got, h.current())
	}
}

// A NAK to the selecting REQUEST restarts discovery at once, the next NAK in a row
// after a pause; a NAK to a renewal also takes the address away.
func TestDHCPNak(t *testing.T) {
	h := start(t)
	defer h.c.Close()
	var xid uint32
	for n := range 2 {
		h.fire()
		d := h.next(layers.DHCPMsgTypeDiscover, bcast)
		if n > 0 && d.Xid == xid {
			t.Error("the new discovery kept the old xid")
		}
		h.armed()
		h.reply(layers.DHCPMsgTypeOffer, d.Xid)
		r := h.next(layers.DHCPMsgTypeRequest, bcast)
		h.armed()
		h.reply(layers.DHCPMsgTypeNak, r.Xid, layers.NewDHCPOption(layers.DHCPOptMessage, []byte("wrong network")))
		now, at := h.clk.Now(), h.armed()
		if n == 0 && !at.Equal(now) || n == 1 && !at.After(now) {
			t.Errorf("NAK %d at %v: discovery again at %v", n+1, now, at)
		}
		h.clk.armed <- at // for the next fire
		xid = r.Xid
	}
	h.bind()
	h.fireAt(h.current().Renew)
	r := h.next(layers.DHCPMsgTypeRequest, server)
	h.armed()
	h.reply(layers.DHCPMsgTypeNak, r.Xid)
	if at := h.armed(); !at.Equal(h.clk.Now()) {
		t.Errorf("NAK to the renewal: discovery again at %v, want now", at)
	}
	if got := h.host.has(); len(got) != 0 || h.current() != nil {
		t.Fatalf("after a NAK to the renewal: addresses %v, lease %v", got, h.current())
	}
}

// Replies for another transaction or another client identifier are not ours.
func TestDHCPIgnoresOthers(t *testing.T) {
	h := start(t)
	defer h.c.Close()
	h.fire()
	d := h.next(layers.DHCPMsgTypeDiscover, bcast)
	h.armed()
	h.reply(layers.DHCPMsgTypeOffer, d.Xid+1)
	h.armed()
	h.reply(layers.DHCPMsgTypeOffer, d.Xid, layers.NewDHCPOption(layers.DHCPOptClientID, []byte{0xff, 1}))
	h.armed()
	select {
	case s := <-h.tr.sent:
		t.Fatalf("answered someone else's OFFER with %v", s.msg)
	default:
	}
}

// Close sends a RELEASE to the lease's server and takes the address away.
func TestDHCPRelease(t *testing.T) {
	h := start(t)
	h.bind()
	h.c.Close()
	r := h.next(layers.DHCPMsgTypeRelease, server)
	if !r.ClientIP.Equal(leased.Addr().AsSlice()) || !bytes.Equal(option(r, layers.DHCPOptServerID), server.AsSlice()) ||
		!bytes.Equal(option(r, layers.DHCPOptClientID), clientID) {
		t.Fatalf("RELEASE: %v", r)
	}
	if got := h.host.has(); len(got) != 0 || h.current() != nil {
		t.Fatalf("after the release: addresses %v, lease %v", got, h.current())
	}
}

func TestParseReplyMalformed(t *testing.T) {
	b := make([]byte, 240)
	b[0], b[2] = 2, 255 // hlen past chaddr: gopacket alone would slice past the end
	if _, err := parseReply(b); err == nil {
		t.Error("hlen 255 accepted")
	}
	if _, err := parseReply(b[:100]); err == nil {
		t.Error("a short message accepted")
	}
}

// Replies come from the network.
func FuzzParseReply(f *testing.F) {
	f.Add(encodeReply(f, layers.DHCPMsgTypeAck, 7, layers.NewDHCPOption(layers.DHCPOptLeaseTime, []byte{0, 0, 0, 100}),
		layers.NewDHCPOption(layers.DHCPOptT1, []byte{0, 0, 0, 50})))
	f.Add(encodeReply(f, layers.DHCPMsgTypeNak, 7, layers.NewDHCPOption(layers.DHCPOptMessage, []byte("no"))))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseReply(b)
		if err != nil {
			return
		}
		if r.typ == 0 || r.lease < 0 || r.yiaddr.IsValid() && !r.yiaddr.Is4() {
			t.Fatalf("accepted %x as %+v", b, r)
		}
		if s := (&Lease{Addr: netip.PrefixFrom(r.yiaddr, 24), Server: r.server}).String(); !strings.HasPrefix(s, "address ") {
			t.Fatal(s)
		}
	})
}

// The infinite lease (0xffffffff seconds, RFC 2131) and any long one put renewal far
// ahead: T1 and T2 do not overflow into the past, where the client would renew as fast
// as the server answers.
func TestDHCPInfiniteLease(t *testing.T) {
	h := start(t)
	defer h.c.Close()
	h.fire()
	d := h.next(layers.DHCPMsgTypeDiscover, bcast)
	h.armed()
	h.reply(layers.DHCPMsgTypeOffer, d.Xid)
	r := h.next(layers.DHCPMsgTypeRequest, bcast)
	h.armed()
	start := h.clk.Now()
	h.reply(layers.DHCPMsgTypeAck, r.Xid,
		layers.NewDHCPOption(layers.DHCPOptLeaseTime, []byte{0xff, 0xff, 0xff, 0xff}),
		layers.NewDHCPOption(layers.DHCPOptSubnetMask, []byte{255, 255, 255, 0}))
	h.waitLease()
	l := h.current()
	const years = 365 * 24 * time.Hour
	if !l.Renew.After(start.Add(60*years)) || !l.Rebind.After(l.Renew) || !l.Expiry.After(l.Rebind) {
		t.Fatalf("infinite lease: renew %v, rebind %v, expiry %v (start %v)", l.Renew, l.Rebind, l.Expiry, start)
	}
	if got := h.armed(); !got.Equal(l.Renew) {
		t.Errorf("next timer at %v, want the renewal at %v", got, l.Renew)
	}
}
