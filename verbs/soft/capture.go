package soft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/internal/inet"
	"ipoibfs/verbs"
)

// tap is a port's endpoint as a capture sees it: every datagram sent and received,
// wrapped into IP and UDP to port 4791 so tshark decodes it as RoCEv2 (on the
// in-process fabric no packet crosses a socket, so there is nothing else to capture).
type tap struct {
	Endpoint
	n    atomic.Int32 // subscribers; 0 = no capture work at all
	mu   sync.Mutex
	subs map[int]func([]byte)
	next int
}

func newTap(ep Endpoint) *tap { return &tap{Endpoint: ep, subs: map[int]func([]byte){}} }

func (t *tap) Send(batch []Datagram) error {
	if t.n.Load() > 0 {
		src := t.Addr()
		for _, d := range batch {
			t.record(src, d.Addr, d.Data)
		}
	}
	return t.Endpoint.Send(batch)
}

func (t *tap) Start(h func(batch []Datagram, drained bool)) {
	t.Endpoint.Start(func(batch []Datagram, drained bool) {
		if t.n.Load() > 0 {
			dst := t.Addr()
			for _, d := range batch {
				t.record(d.Addr, dst, d.Data)
			}
		}
		h(batch, drained)
	})
}

func (t *tap) subscribe(fn func([]byte)) (stop func()) {
	t.mu.Lock()
	id := t.next
	t.next++
	t.subs[id] = fn
	t.n.Add(1)
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			delete(t.subs, id)
			t.n.Add(-1)
			t.mu.Unlock()
		})
	}
}

// record builds one pcap record (LINKTYPE_RAW) and hands it to every subscriber.
func (t *tap) record(src, dst netip.AddrPort, payload []byte) {
	var ip []byte
	udpLen := 8 + len(payload)
	if src.Addr().Is4() && dst.Addr().Is4() {
		ip = make([]byte, 20, 20+udpLen)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
		ip[8], ip[9] = 64, 17
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], inet.Checksum(ip))
	} else {
		ip = make([]byte, 40, 40+udpLen)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		ip[6], ip[7] = 17, 64
		s, d := src.Addr().As16(), dst.Addr().As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
	}
	var udp [8]byte
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], 4791) // RoCEv2, whatever port the endpoint has
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	pkt := append(append(ip, udp[:]...), payload...)
	now := time.Now()
	rec := make([]byte, 16, 16+len(pkt))
	binary.LittleEndian.PutUint32(rec[0:], uint32(now.Unix()))
	binary.LittleEndian.PutUint32(rec[4:], uint32(now.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(rec[8:], uint32(len(pkt)))
	binary.LittleEndian.PutUint32(rec[12:], uint32(len(pkt)))
	rec = append(rec, pkt...)
	t.mu.Lock()
	for _, fn := range t.subs {
		fn(rec)
	}
	t.mu.Unlock()
}

// Capture implements verbs.Capturer.
func (h *HCA) Capture(port int, fn func(record []byte)) (func(), error) {
	if port < 1 || port > len(h.ports) {
		return nil, &verbs.Error{Op: "capture", Obj: h.cfg.Name, Err: fmt.Errorf("%w: port %d", verbs.ErrNoPort, port)}
	}
	return h.ports[port-1].tap.subscribe(fn), nil
}
