package soft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Datagram is one fabric packet on its way to or from a port endpoint.
type Datagram struct {
	Addr netip.AddrPort // destination on send, source on receive
	Data []byte
}

// Network creates port endpoints. MemNetwork connects endpoints inside one process;
// UDPNetwork gives each endpoint a UDP socket.
type Network interface {
	Listen(addr netip.AddrPort) (Endpoint, error)
}

// Endpoint is a port's attachment to the fabric: it sends batches of datagrams directly
// to other endpoints and hands received batches to a handler.
type Endpoint interface {
	Addr() netip.AddrPort
	// Send transmits a batch. The caller may reuse the Data buffers after it returns.
	Send(batch []Datagram) error
	// Start runs h on a goroutine of the endpoint for each received batch; Data is valid
	// only during the call.
	Start(h func(batch []Datagram))
	Close() error
}

// ---- in-process network ----

// MemNetwork is an in-process datagram network. Addresses are arbitrary AddrPorts; port
// 0 picks a free one.
type MemNetwork struct {
	mu   sync.RWMutex
	eps  map[netip.AddrPort]*memEndpoint
	next uint16
}

// NewMemNetwork returns an empty in-process network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{eps: make(map[netip.AddrPort]*memEndpoint), next: 1}
}

const memQueueLen = 8192

type memEndpoint struct {
	net    *MemNetwork
	addr   netip.AddrPort
	ch     chan memPacket
	closed atomic.Bool
	done   chan struct{}
	once   sync.Once
}

// Listen creates an endpoint. An unspecified address or port 0 gets a fresh address.
func (n *MemNetwork) Listen(addr netip.AddrPort) (Endpoint, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !addr.IsValid() || addr.Port() == 0 {
		ip := addr.Addr()
		if !ip.IsValid() {
			ip = netip.MustParseAddr("127.0.0.1")
		}
		for {
			a := netip.AddrPortFrom(ip, 10000+n.next)
			n.next++
			if _, ok := n.eps[a]; !ok {
				addr = a
				break
			}
		}
	}
	if _, ok := n.eps[addr]; ok {
		return nil, fmt.Errorf("listen mem %s: address in use", addr)
	}
	ep := &memEndpoint{net: n, addr: addr, ch: make(chan memPacket, memQueueLen), done: make(chan struct{})}
	n.eps[addr] = ep
	return ep, nil
}

func (e *memEndpoint) Addr() netip.AddrPort { return e.addr }

type memPacket struct {
	src  netip.AddrPort
	data []byte
}

func (e *memEndpoint) Send(batch []Datagram) error {
	if e.closed.Load() {
		return net.ErrClosed
	}
	e.net.mu.RLock()
	defer e.net.mu.RUnlock()
	for _, d := range batch {
		dst := e.net.eps[d.Addr]
		if dst == nil || dst.closed.Load() {
			continue // like UDP: nobody listening, the packet is lost
		}
		select {
		case dst.ch <- memPacket{e.addr, append([]byte(nil), d.Data...)}:
		default: // receive queue full: dropped like an overrun link
		}
	}
	return nil
}

func (e *memEndpoint) Start(h func(batch []Datagram)) {
	ch := e.ch
	go func() {
		batch := make([]Datagram, 0, 64)
		for {
			select {
			case <-e.done:
				return
			case p := <-ch:
				batch = append(batch[:0], Datagram{p.src, p.data})
			more:
				for len(batch) < cap(batch) {
					select {
					case p := <-ch:
						batch = append(batch, Datagram{p.src, p.data})
					default:
						break more
					}
				}
				h(batch)
			}
		}
	}()
}

func (e *memEndpoint) Close() error {
	e.once.Do(func() {
		e.closed.Store(true)
		e.net.mu.Lock()
		delete(e.net.eps, e.addr)
		e.net.mu.Unlock()
		close(e.done)
	})
	return nil
}

// ---- UDP network ----

// UDPNetwork gives each endpoint its own UDP socket. Sends and receives are batched
// with sendmmsg/recvmmsg (golang.org/x/net/ipv4), so a burst of fabric packets costs one
// system call each way.
type UDPNetwork struct{}

const udpBatch = 64

type udpEndpoint struct {
	conn *net.UDPConn
	pc   *ipv4.PacketConn
	addr netip.AddrPort
	mu   sync.Mutex // guards msgs (one sender at a time per socket)
	msgs []ipv4.Message
	uas  []net.UDPAddr
}

// Listen binds a UDP socket on addr (port 0 picks a free port). Only IPv4 endpoints
// are supported; the fabric runs on loopback or a LAN.
func (UDPNetwork) Listen(addr netip.AddrPort) (Endpoint, error) {
	if addr.Addr().IsValid() && !addr.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("listen udp %s: only IPv4 fabric endpoints are supported", addr)
	}
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	setSockBufs(c, 8<<20)
	la := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return &udpEndpoint{conn: c, pc: ipv4.NewPacketConn(c), addr: netip.AddrPortFrom(la.Addr().Unmap(), la.Port())}, nil
}

// setSockBufs asks for large socket buffers, beyond rmem_max/wmem_max when privileged
// (SO_RCVBUFFORCE), so bursts of a 64 KB send split into 2 KB packets are not lost.
func setSockBufs(c *net.UDPConn, n int) {
	_ = c.SetReadBuffer(n)
	_ = c.SetWriteBuffer(n)
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n)
		})
	}
}

func (e *udpEndpoint) Addr() netip.AddrPort { return e.addr }

func (e *udpEndpoint) Send(batch []Datagram) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(batch) > 0 {
		n := min(len(batch), udpBatch)
		if cap(e.msgs) < n {
			e.msgs = make([]ipv4.Message, udpBatch)
			e.uas = make([]net.UDPAddr, udpBatch)
		}
		msgs := e.msgs[:n]
		for k, d := range batch[:n] {
			ip := d.Addr.Addr().Unmap().As4()
			e.uas[k] = net.UDPAddr{IP: ip[:], Port: int(d.Addr.Port())}
			msgs[k].Buffers = append(msgs[k].Buffers[:0], d.Data)
			msgs[k].Addr = &e.uas[k]
		}
		for len(msgs) > 0 {
			sent, err := e.pc.WriteBatch(msgs, 0)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return err
				}
				// An error (ECONNREFUSED left by an ICMP from an earlier send, an
				// unreachable address) concerns the first message: skip it, go on.
				sent = max(sent, 1)
			}
			msgs = msgs[sent:]
		}
		batch = batch[n:]
	}
	return nil
}

func (e *udpEndpoint) Start(h func(batch []Datagram)) {
	go func() {
		msgs := make([]ipv4.Message, udpBatch)
		for k := range msgs {
			msgs[k].Buffers = [][]byte{make([]byte, 70000)}
		}
		batch := make([]Datagram, 0, udpBatch)
		for {
			n, err := e.pc.ReadBatch(msgs, 0)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ICMP errors surface here on Linux; ignore them
			}
			batch = batch[:0]
			for _, m := range msgs[:n] {
				ua, ok := m.Addr.(*net.UDPAddr)
				if !ok {
					continue
				}
				batch = append(batch, Datagram{ua.AddrPort(), m.Buffers[0][:m.N]})
			}
			for k := range batch {
				batch[k].Addr = netip.AddrPortFrom(batch[k].Addr.Addr().Unmap(), batch[k].Addr.Port())
			}
			h(batch)
		}
	}()
}

func (e *udpEndpoint) Close() error { return e.conn.Close() }

// ---- fault injection ----

// Faults configures fabric impairments. Probabilities are in [0,1]. Management packets
// on QP0 (the fabric's own control traffic) are never impaired.
type Faults struct {
	Loss    float64
	Dup     float64
	Reorder float64
	Delay   time.Duration
}

func (f Faults) zero() bool { return f == Faults{} }

// Validate reports whether all values are in range.
func (f Faults) Validate() error {
	for _, p := range []float64{f.Loss, f.Dup, f.Reorder} {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("fault probability %v out of range [0,1]", p)
		}
	}
	if f.Delay < 0 || f.Delay > 10*time.Second {
		return fmt.Errorf("fault delay %v out of range [0,10s]", f.Delay)
	}
	return nil
}

// impaired wraps an endpoint's Send with fault injection.
type impaired struct {
	Endpoint
	faults atomic.Pointer[Faults]
	mu     sync.Mutex
	held   *Datagram // one datagram held back for reordering
	out    []Datagram
}

func newImpaired(ep Endpoint) *impaired { return &impaired{Endpoint: ep} }

func (e *impaired) set(f Faults) {
	if f.zero() {
		e.faults.Store(nil)
		return
	}
	e.faults.Store(&f)
}

func isControl(pkt []byte) bool {
	// BTH DestQP (bytes 5..7) == 0: the fabric's management traffic.
	return len(pkt) >= 8 && pkt[5] == 0 && pkt[6] == 0 && pkt[7] == 0
}

func (e *impaired) Send(batch []Datagram) error {
	f := e.faults.Load()
	if f == nil {
		return e.Endpoint.Send(batch)
	}
	e.mu.Lock()
	out := e.out[:0]
	for _, d := range batch {
		if isControl(d.Data) {
			out = append(out, d)
			continue
		}
		if f.Loss > 0 && rand.Float64() < f.Loss {
			continue
		}
		copies := 1
		if f.Dup > 0 && rand.Float64() < f.Dup {
			copies = 2
		}
		for range copies {
			if f.Reorder > 0 && e.held == nil && rand.Float64() < f.Reorder {
				c := Datagram{d.Addr, append([]byte(nil), d.Data...)}
				e.held = &c
				continue
			}
			out = append(out, d)
			if e.held != nil {
				out = append(out, *e.held)
				e.held = nil
			}
		}
	}
	e.out = out[:0]
	if f.Delay > 0 {
		cp := make([]Datagram, len(out))
		for i, d := range out {
			cp[i] = Datagram{d.Addr, append([]byte(nil), d.Data...)}
		}
		e.mu.Unlock()
		time.AfterFunc(f.Delay, func() { _ = e.Endpoint.Send(cp) })
		return nil
	}
	err := e.Endpoint.Send(out)
	e.mu.Unlock()
	return err
}
