package soft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv4"
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
	// only during the call. drained says that nothing more was queued when the batch was
	// taken: once h returns, everything that arrived before then has been handled (the
	// subnet manager's sweep tells a silent port from its own backlog by it).
	Start(h func(batch []Datagram, drained bool))
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

func (e *memEndpoint) Start(h func(batch []Datagram, drained bool)) {
	ch := e.ch
	go func() {
		batch := make([]Datagram, 0, 64)
		for {
			select {
			case <-e.done:
				return
			case p := <-ch:
				batch = append(batch[:0], Datagram{p.src, p.data})
				drained := false
			more:
				for len(batch) < cap(batch) {
					select {
					case p := <-ch:
						batch = append(batch, Datagram{p.src, p.data})
					default:
						drained = true
						break more
					}
				}
				h(batch, drained)
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
//
// On Linux the endpoint also uses UDP segmentation offload. A run of equal-size
// datagrams to one destination (the last may be shorter) leaves as one message
// carrying a UDP_SEGMENT control message (GSO, Linux 4.18), so the kernel builds one
// socket buffer and traverses the stack once for the whole run; the socket asks for
// UDP_GRO (Linux 5.0), so such a run arrives as one message with its segment size,
// which the endpoint cuts up again before the handler sees it. A kernel that refuses
// GSO, or a socket without GRO, gets plain datagrams as before.
type UDPNetwork struct{}

const (
	udpBatch = 64 // messages per sendmmsg/recvmmsg
	// Bounds of one GSO message: the kernel's UDP_MAX_SEGMENTS (64 before Linux 6.9)
	// and, with room to spare, the largest IPv4 UDP payload (65507 bytes).
	udpGSOMaxSegs  = 64
	udpGSOMaxBytes = 65000
	// udpRecvBuf holds the largest datagram or a GRO message of up to 64 KB.
	udpRecvBuf = 64<<10 + 4096
	// udpOOBLen is the control buffer of one received message (a UDP_GRO message
	// takes 24 bytes on 64-bit Linux).
	udpOOBLen = 64
)

type udpEndpoint struct {
	conn *net.UDPConn
	pc   *ipv4.PacketConn
	addr netip.AddrPort
	gro  bool // UDP_GRO is on: a received message may carry a run of datagrams

	gso atomic.Bool // merge runs into UDP_SEGMENT messages; cleared for good when refused
	// sends holds *udpSend: senders (a QP each, the send queues of one interface among
	// them) go to the socket in parallel, each with its own message vectors.
	sends sync.Pool

	// Offload statistics.
	gsoSends    atomic.Uint64 // messages sent with UDP_SEGMENT
	gsoSegs     atomic.Uint64 // datagrams in them
	gsoRefusals atomic.Uint64 // GSO sends the kernel refused (GSO is then off)
	groSplits   atomic.Uint64 // received messages that carried several datagrams
	groSegs     atomic.Uint64 // datagrams in them
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
	e := &udpEndpoint{conn: c, pc: ipv4.NewPacketConn(c), addr: netip.AddrPortFrom(la.Addr().Unmap(), la.Port())}
	e.gso.Store(udpGSOSupported(c))
	e.gro = setUDPGRO(c, true) == nil
	return e, nil
}

// setSockBufs asks for large socket buffers, beyond rmem_max/wmem_max when privileged
// (SO_RCVBUFFORCE), so bursts of a 64 KB send split into 2 KB packets are not lost.
func setSockBufs(c *net.UDPConn, n int) {
	_ = c.SetReadBuffer(n)
	_ = c.SetWriteBuffer(n)
	forceSockBufs(c, n)
}

func (e *udpEndpoint) Addr() netip.AddrPort { return e.addr }

// udpSend is one sender's message vectors.
type udpSend struct {
	msgs  []ipv4.Message
	uas   []net.UDPAddr
	ip4s  [][4]byte // uas[k].IP is ip4s[k][:]
	first []int     // msgs[k] starts with datagram first[k] of the batch being sent
	oob   []byte    // UDP_SEGMENT control messages, udpGSOCmsgSpace bytes per message
}

func newUDPSend() *udpSend {
	s := &udpSend{msgs: make([]ipv4.Message, udpBatch), uas: make([]net.UDPAddr, udpBatch),
		ip4s: make([][4]byte, udpBatch), first: make([]int, udpBatch), oob: make([]byte, udpBatch*udpGSOCmsgSpace)}
	for k := range s.uas {
		s.uas[k].IP = s.ip4s[k][:]
	}
	return s
}

func (e *udpEndpoint) Send(batch []Datagram) error {
	s, _ := e.sends.Get().(*udpSend)
	if s == nil {
		s = newUDPSend()
	}
	defer func() {
		for k := range s.msgs { // the batch's buffers are the caller's, a re-pack's too
			b := s.msgs[k].Buffers
			clear(b[:cap(b)])
			s.msgs[k].Buffers = b[:0]
		}
		e.sends.Put(s)
	}()
	for len(batch) > 0 {
		n, used := s.pack(batch, e.gso.Load())
		msgs := s.msgs[:n]
		for k := 0; k < n; {
			sent, err := e.pc.WriteBatch(msgs[k:], 0)
			sent = max(0, min(sent, n-k))
			for _, m := range msgs[k : k+sent] {
				if len(m.OOB) > 0 {
					e.gsoSends.Add(1)
					e.gsoSegs.Add(uint64(len(m.Buffers)))
				}
			}
			k += sent
			if err == nil {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			if k < n && len(msgs[k].OOB) > 0 && udpGSORefused(err) {
				// The kernel will not segment for us (EIO: a device without tx
				// checksumming; EINVAL, ENOPROTOOPT): send plain datagrams from now
				// on, beginning with the ones of the refused message.
				e.gso.Store(false)
				e.gsoRefusals.Add(1)
				used = s.first[k]
				break
			}
			// An error (ECONNREFUSED left by an ICMP from an earlier send, an
			// unreachable address) concerns the first unsent message: skip it, go on.
			k++
		}
		batch = batch[used:]
	}
	return nil
}

// pack fills s.msgs from the head of batch and returns the number of messages and of
// datagrams they hold. With gso, consecutive datagrams to the same destination of
// the same length, the last possibly shorter, share one message with a UDP_SEGMENT
// control message; their Data become the message's iovecs, without copying.
func (s *udpSend) pack(batch []Datagram, gso bool) (n, used int) {
	for used < len(batch) && n < udpBatch {
		d := batch[used]
		s.first[n] = used
		s.ip4s[n] = d.Addr.Addr().Unmap().As4()
		s.uas[n].Port = int(d.Addr.Port())
		m := &s.msgs[n]
		m.Addr = &s.uas[n]
		m.Buffers = append(m.Buffers[:0], d.Data)
		m.OOB = nil
		used++
		// Port 0 is refused with EINVAL, which must not be taken for a GSO refusal.
		if size := len(d.Data); gso && size > 0 && d.Addr.Port() != 0 {
			total := size
			for used < len(batch) && len(m.Buffers) < udpGSOMaxSegs {
				next := batch[used]
				l := len(next.Data)
				if next.Addr != d.Addr || l == 0 || l > size || total+l > udpGSOMaxBytes {
					break
				}
				m.Buffers = append(m.Buffers, next.Data)
				total += l
				used++
				if l < size {
					break // a shorter datagram ends the run
				}
			}
			if len(m.Buffers) > 1 {
				o := n * udpGSOCmsgSpace
				m.OOB = putUDPGSOSize(s.oob[o:o:o+udpGSOCmsgSpace], size)
			}
		}
		n++
	}
	return n, used
}

func (e *udpEndpoint) Start(h func(batch []Datagram, drained bool)) {
	gro := e.gro
	go func() {
		msgs := make([]ipv4.Message, udpBatch)
		var oob []byte
		if gro {
			oob = make([]byte, udpBatch*udpOOBLen)
		}
		for k := range msgs {
			msgs[k].Buffers = [][]byte{make([]byte, udpRecvBuf)}
			if gro {
				msgs[k].OOB = oob[k*udpOOBLen : (k+1)*udpOOBLen]
			}
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
			var splits, segs uint64
			for _, m := range msgs[:n] {
				ua, ok := m.Addr.(*net.UDPAddr)
				if !ok {
					continue
				}
				src := ua.AddrPort()
				src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
				data := m.Buffers[0][:m.N]
				if m.NN > 0 {
					// A GRO message: a run of datagrams of seg bytes, the last maybe shorter.
					if seg := udpGROSize(m.OOB[:m.NN]); seg > 0 && seg < len(data) {
						splits++
						for len(data) > seg {
							batch = append(batch, Datagram{src, data[:seg:seg]})
							data = data[seg:]
							segs++
						}
						segs++
					}
				}
				batch = append(batch, Datagram{src, data})
			}
			if splits > 0 {
				e.groSplits.Add(splits)
				e.groSegs.Add(segs)
			}
			h(batch, n < len(msgs)) // a read that did not fill the batch took all there was
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
	// What the faults did, for tests that must know they bit.
	lost, duplicated atomic.Uint64
	mu               sync.Mutex
	held             *Datagram // one datagram held back for reordering
	out              []Datagram
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
			e.lost.Add(1)
			continue
		}
		copies := 1
		if f.Dup > 0 && rand.Float64() < f.Dup {
			copies = 2
			e.duplicated.Add(1)
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

// String formats the faults as the sm/faults file shows them.
func (f Faults) String() string {
	return fmt.Sprintf("loss %g\ndup %g\nreorder %g\ndelay %v\n", f.Loss, f.Dup, f.Reorder, f.Delay)
}

// ParseFaults applies "name value" pairs (loss, dup, reorder as a probability 0..1 or
// a percentage like 2%; delay as a duration like 5ms) to cur. Names not given keep
// their value; the file's own content can be written back.
func ParseFaults(cur Faults, s string) (Faults, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 || len(fields)%2 != 0 {
		return cur, fmt.Errorf("want name value pairs (loss, dup, reorder, delay), got %q", s)
	}
	for k := 0; k < len(fields); k += 2 {
		name, val := strings.TrimSuffix(fields[k], ":"), fields[k+1]
		if name == "delay" {
			d, err := time.ParseDuration(val)
			if err != nil {
				return cur, fmt.Errorf("delay %q: %v", val, err)
			}
			cur.Delay = d
			continue
		}
		scale := 1.0
		if v, ok := strings.CutSuffix(val, "%"); ok {
			val, scale = v, 0.01
		}
		p, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return cur, fmt.Errorf("%s %q is not a number", name, fields[k+1])
		}
		switch name {
		case "loss":
			cur.Loss = p * scale
		case "dup":
			cur.Dup = p * scale
		case "reorder":
			cur.Reorder = p * scale
		default:
			return cur, fmt.Errorf("unknown fault %q (want loss, dup, reorder or delay)", name)
		}
	}
	return cur, cur.Validate()
}
