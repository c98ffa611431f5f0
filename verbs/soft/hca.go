package soft

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft/partitions"
)

// Config describes a soft HCA.
type Config struct {
	Name     string // node name; GUIDs derive from it, so a restart keeps addresses
	Ports    int    // number of ports (default 1)
	Network  Network
	Listen   netip.AddrPort // endpoint of port 1; port n listens on Listen.Port()+n-1 (0 = any)
	SM       netip.AddrPort // endpoint of the subnet manager's port to join
	MaxMTU   verbs.MTU      // default 4096
	Width    int            // lanes (default 4)
	LaneMbps int            // per-lane speed (default QDR 10000)
	// Heartbeat is the interval of the port's hello to the SM (default 250ms).
	Heartbeat time.Duration
	// HostSM runs the subnet manager on port 1 (SM is then ignored), configured with
	// Partitions (nil = the OpenSM default).
	HostSM     bool
	Partitions *partitions.Config
	// FabricKey, when set (MinFabricKeyLen bytes or more), authenticates every QP0
	// control message and QP1 MAD (see fabrickey.go); the whole fabric must share it.
	FabricKey []byte
	// Logger receives the ports' lines about reaching the subnet manager (nil: none).
	Logger *log.Logger
	// Clock runs the ports' heartbeats and the subnet manager's sweep (nil: the real
	// clock); tests pass a clock.Mock to run them on virtual time.
	Clock clock.Clock
	// NoSRQ makes the HCA one without shared receive queues (CreateSRQ fails), as
	// some are: connected mode then gives every connection its own receive queue.
	NoSRQ bool
}

// HCA is a software host channel adapter implementing verbs.Device.
type HCA struct {
	cfg   Config
	guid  verbs.GUID
	ports []*Port

	mu      sync.RWMutex // read-locked per received packet (QP lookup)
	qps     map[verbs.QPN]*QP
	nextQPN verbs.QPN
	subs    map[chan verbs.Event]struct{}
	closed  bool
	evDrops atomic.Uint64
	// oooBytes is what the RC responders keep beyond gaps (bounded by rcOOOBudget).
	oooBytes atomic.Int64

	sm   *SM
	stop chan struct{}
	wg   sync.WaitGroup
}

// GUIDFromName derives a stable EUI-64 from a node name (locally administered OUI
// 0x02c903-like prefix is avoided: bit 1 of the first byte marks it local).
func GUIDFromName(name string, index int) verbs.GUID {
	h := sha256.Sum256([]byte(fmt.Sprintf("ipoibfs/%s/%d", name, index)))
	g := binary.BigEndian.Uint64(h[:8])
	g = (g &^ (0xff << 56)) | (0x02 << 56) // local, unicast
	return verbs.GUID(g)
}

// New creates a soft HCA and attaches its ports to the fabric.
func New(cfg Config) (*HCA, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("soft hca: empty node name")
	}
	if cfg.Ports == 0 {
		cfg.Ports = 1
	}
	if cfg.Ports < 0 || cfg.Ports > 254 {
		return nil, fmt.Errorf("soft hca %s: %d ports out of range 1..254", cfg.Name, cfg.Ports)
	}
	if cfg.Network == nil {
		return nil, fmt.Errorf("soft hca %s: no network", cfg.Name)
	}
	if cfg.FabricKey != nil && len(cfg.FabricKey) < MinFabricKeyLen {
		return nil, fmt.Errorf("soft hca %s: fabric key of %d bytes, want at least %d", cfg.Name, len(cfg.FabricKey), MinFabricKeyLen)
	}
	if cfg.MaxMTU == 0 {
		cfg.MaxMTU = verbs.MTU4096
	}
	if cfg.MaxMTU.Bytes() == 0 {
		return nil, fmt.Errorf("soft hca %s: invalid MTU enum %d", cfg.Name, cfg.MaxMTU)
	}
	if cfg.Width == 0 {
		cfg.Width = 4
	}
	if cfg.LaneMbps == 0 {
		cfg.LaneMbps = 10000
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 250 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	h := &HCA{cfg: cfg, guid: GUIDFromName(cfg.Name, 0), qps: make(map[verbs.QPN]*QP),
		nextQPN: 0x48, subs: make(map[chan verbs.Event]struct{}), stop: make(chan struct{})}
	for i := 1; i <= cfg.Ports; i++ {
		addr := cfg.Listen
		if addr.Port() != 0 {
			addr = netip.AddrPortFrom(addr.Addr(), addr.Port()+uint16(i-1))
		}
		ep, err := cfg.Network.Listen(addr)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("soft hca %s port %d: %w", cfg.Name, i, err)
		}
		p := newPort(h, i, ep)
		h.ports = append(h.ports, p)
	}
	if cfg.HostSM {
		h.cfg.SM = h.ports[0].ep.Addr()
		sm, err := NewSM(h.ports[0], cfg.Partitions)
		if err != nil {
			h.Close()
			return nil, err
		}
		h.sm = sm
	} else if !cfg.SM.IsValid() {
		h.Close()
		return nil, fmt.Errorf("soft hca %s: no subnet manager address to join", cfg.Name)
	}
	for _, p := range h.ports {
		p.start()
	}
	return h, nil
}

func (h *HCA) Name() string         { return h.cfg.Name }
func (h *HCA) NodeGUID() verbs.GUID { return h.guid }
func (h *HCA) NodeDesc() string     { return "ipoibfs " + h.cfg.Name }
func (h *HCA) FWVersion() string    { return "1.0.0" }
func (h *HCA) NumPorts() int        { return len(h.ports) }
func (h *HCA) SoftPort(n int) *Port { return h.ports[n-1] }
func (h *HCA) SM() *SM              { return h.sm }

// Network returns the network the HCA's ports are attached to.
func (h *HCA) Network() Network              { return h.cfg.Network }
func (h *HCA) EventDrops() uint64            { return h.evDrops.Load() }
func (h *HCA) Endpoint(n int) netip.AddrPort { return h.ports[n-1].ep.Addr() }

// Port returns port num (1-based).
func (h *HCA) Port(num int) (verbs.Port, error) {
	if num < 1 || num > len(h.ports) {
		return nil, &verbs.Error{Op: "query_port", Obj: fmt.Sprintf("%s port %d", h.cfg.Name, num), Err: verbs.ErrNoPort}
	}
	return h.ports[num-1], nil
}

// Subscribe returns a channel of asynchronous events.
// Subscribe's channel is closed by its cancel function or by Close, whichever comes
// first, so a subscriber ranging over it ends.
func (h *HCA) Subscribe(buf int) (<-chan verbs.Event, func()) {
	ch := make(chan verbs.Event, max(buf, 1))
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		close(ch)
		return ch, func() {}
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		// Under the write lock: event() sends under the read lock, so no send can
		// race the close.
		h.mu.Lock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
		h.mu.Unlock()
	}
}

func (h *HCA) event(t verbs.EventType, port int) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for ch := range h.subs {
		select {
		case ch <- verbs.Event{Type: t, Port: port}:
		default:
			h.evDrops.Add(1)
		}
	}
}

// CreateCQ creates a completion queue.
func (h *HCA) CreateCQ(attr verbs.CQAttr) (verbs.CQ, error) {
	if attr.Entries <= 0 || attr.Entries > 1<<20 {
		return nil, &verbs.Error{Op: "create_cq", Obj: h.cfg.Name, Err: fmt.Errorf("%w: %d entries", verbs.ErrInvalid, attr.Entries)}
	}
	c := newCQ(attr.Entries)
	c.handler = attr.Handler
	return c, nil
}

// CreateAH creates an address handle.
func (h *HCA) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	if attr.Port < 1 || attr.Port > len(h.ports) {
		return nil, &verbs.Error{Op: "create_ah", Obj: h.cfg.Name, Err: verbs.ErrNoPort}
	}
	if attr.DLID == verbs.LIDReserved || (attr.DLID.IsMulticast() && !attr.GRH) {
		return nil, &verbs.Error{Op: "create_ah", Obj: h.cfg.Name, Err: fmt.Errorf("%w: DLID %#x", verbs.ErrInvalid, attr.DLID)}
	}
	return &AH{attr: attr}, nil
}

// Close detaches every port and destroys all QPs.
func (h *HCA) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	for ch := range h.subs {
		delete(h.subs, ch)
		close(ch)
	}
	qps := make([]*QP, 0, len(h.qps))
	for _, q := range h.qps {
		qps = append(qps, q)
	}
	h.mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
	if h.sm != nil {
		h.sm.Close()
	}
	close(h.stop)
	for _, p := range h.ports {
		p.close()
	}
	h.wg.Wait()
	return nil
}

// AH is a soft address handle.
type AH struct{ attr verbs.AHAttr }

func (a *AH) Attr() verbs.AHAttr { return a.attr }
func (a *AH) Close() error       { return nil }

func durationFrom(ns uint64) time.Duration {
	if ns > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
