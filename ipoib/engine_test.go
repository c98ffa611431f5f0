package ipoib

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"ipoibfs/internal/testenv"
	"log"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
	"ipoibfs/verbs/soft/partitions"
)

// fakeHost stands in for the kernel: it records what the engine delivers.
type fakeHost struct {
	mu      sync.Mutex
	pkts    [][]byte
	mtu     int
	carrier bool
	feat    Features
	up      bool
	noMcast bool
}

func (h *fakeHost) Deliver(pkts [][]byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range pkts {
		h.pkts = append(h.pkts, append([]byte(nil), p...))
	}
}
func (h *fakeHost) SetMTU(m int)           { h.mu.Lock(); h.mtu = m; h.mu.Unlock() }
func (h *fakeHost) SetCarrier(on bool)     { h.mu.Lock(); h.carrier = on; h.mu.Unlock() }
func (h *fakeHost) SetOffloads(f Features) { h.mu.Lock(); h.feat = f; h.mu.Unlock() }
func (h *fakeHost) SetAdminUp(up bool)     { h.mu.Lock(); h.up = up; h.mu.Unlock() }
func (h *fakeHost) SetMulticast(on bool)   { h.mu.Lock(); h.noMcast = !on; h.mu.Unlock() }

// hostState is what the engine last told a fakeHost.
type hostState struct {
	mtu     int
	carrier bool
	feat    Features
	up      bool
	noMcast bool
}

// state reads what the engine told the host, under the host's lock: the engine calls
// the host after releasing its own lock, so these are not the engine's fields.
func (h *fakeHost) state() hostState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return hostState{h.mtu, h.carrier, h.feat, h.up, h.noMcast}
}

// take returns and forgets the packets matching f.
func (h *fakeHost) take(f func([]byte) bool) [][]byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out, keep [][]byte
	for _, p := range h.pkts {
		if f(p) {
			out = append(out, p)
		} else {
			keep = append(keep, p)
		}
	}
	h.pkts = keep
	return out
}

type node struct {
	hca  *soft.HCA
	e    *Engine
	ib0  *Interface
	host *fakeHost
}

const hb = 20 * time.Millisecond

// testFabric starts an SM node and engines on named nodes, each with ib0 up.
func testFabric(t *testing.T, conf string, names ...string) (*soft.HCA, []*node) {
	t.Helper()
	return testFabricWith(t, conf, nil, names...)
}

// testFabricWith is testFabric with each node's HCA configuration and engine options
// adjusted by tweak.
func testFabricWith(t *testing.T, conf string, tweak func(*soft.Config, *Options), names ...string) (*soft.HCA, []*node) {
	t.Helper()
	net := soft.NewMemNetwork()
	var parts *partitions.Config
	if conf != "" {
		var err error
		if parts, err = partitions.Parse("t.conf", strings.NewReader(conf)); err != nil {
			t.Fatal(err)
		}
	}
	smh, err := soft.New(soft.Config{Name: "sm", Network: net, HostSM: true, Partitions: parts, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	var nodes []*node
	for _, name := range names {
		cfg := soft.Config{Name: name, Network: net, SM: smh.Endpoint(1), Heartbeat: hb}
		var opts Options
		if tweak != nil {
			tweak(&cfg, &opts)
		}
		h, err := soft.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		waitFor(t, name+" port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
		e, err := New(h, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		ib0, _ := e.Interface("ib0")
		host := &fakeHost{}
		ib0.AttachHost(host)
		if err := ib0.SetUp(true); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, &node{h, e, ib0, host})
	}
	for _, n := range nodes {
		waitFor(t, n.ib0.Name()+" carrier", func() bool { return n.ib0.Carrier() && n.host.state().carrier })
	}
	return smh, nodes
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// icmp4 builds an ICMP echo request or reply.
func icmp4(src, dst string, typ byte, seq uint16, size int) []byte {
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	p := make([]byte, 28+size)
	p[0], p[8], p[9] = 0x45, 64, 1
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], csum(p[:20]))
	p[20] = typ
	binary.BigEndian.PutUint16(p[26:], seq)
	binary.BigEndian.PutUint16(p[22:], csum(p[20:]))
	return p
}

// udp4 builds a UDP datagram (checksum 0: none, as IPv4 allows).
func udp4(src, dst string, port uint16, payload []byte) []byte {
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	p := make([]byte, 28+len(payload))
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], csum(p[:20]))
	binary.BigEndian.PutUint16(p[20:], port)
	binary.BigEndian.PutUint16(p[22:], port)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// icmp6Echo builds an ICMPv6 echo request.
func icmp6Echo(src, dst netip.Addr, seq uint16) []byte {
	p := make([]byte, 40+8)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], 8)
	p[6], p[7] = 58, 64
	s, d := src.As16(), dst.As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	p[40] = 128
	binary.BigEndian.PutUint16(p[46:], seq)
	binary.BigEndian.PutUint16(p[42:], icmpv6Checksum(p))
	return p
}

func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func isICMP4(seq uint16) func([]byte) bool {
	return func(p []byte) bool { return len(p) >= 28 && p[9] == 1 && binary.BigEndian.Uint16(p[26:]) == seq }
}

// ping sends one echo from a to b until b's host sees it (ARP may take a round).
func ping(t *testing.T, a, b *Interface, hb *fakeHost, src, dst string, seq uint16) {
	t.Helper()
	pkt := icmp4(src, dst, 8, seq, 56)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		a.Transmit([][]byte{pkt})
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if got := hb.take(isICMP4(seq)); len(got) > 0 {
				if !bytes.Equal(got[0], pkt) {
					t.Fatalf("packet changed in flight")
				}
				return
			}
		}
	}
	t.Fatalf("%s -> %s: echo %d never arrived", src, dst, seq)
}

func TestCarrierMTUAndBroadcastGroup(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	i := nodes[0].ib0
	if i.MTU() != 2044 || nodes[0].host.state().mtu != 2044 || !nodes[0].host.state().carrier {
		t.Fatalf("MTU %d, host MTU %d, carrier %v; want 2044 on a 2K broadcast group", i.MTU(), nodes[0].host.state().mtu, nodes[0].host.state().carrier)
	}
	if got := i.PKey(); got != 0xffff {
		t.Fatalf("pkey %v", got)
	}
	bc := i.Broadcast().String()
	if bc != "00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff" {
		t.Fatalf("broadcast %s", bc)
	}
	hw := i.HWAddr()
	if hw[0] != FlagRC || hw.QPN() == 0 { // the soft HCA has RC: connected mode is offered
		t.Fatalf("hw addr %s", hw)
	}
	mcg := i.MCGText()
	want := "GID: ff12:401b:ffff:0:0:0:ffff:ffff\n  created: "
	if !strings.HasPrefix(mcg, want) || !strings.Contains(mcg, "  complete:       yes\n  send_only:       no\n\n") {
		t.Fatalf("mcg text:\n%s", mcg)
	}
	if i.OperState() != "up" {
		t.Fatalf("operstate %s", i.OperState())
	}
}

func TestARPAndICMPBetweenEngines(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	addressNodes(nodes)
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	ping(t, b.ib0, a.ib0, a.host, "10.0.0.2", "10.0.0.1", 2)
	// Both learned each other: the path file shows a complete path to the peer's GID.
	pt := a.ib0.PathText()
	if !strings.Contains(pt, "GID: "+b.ib0.HWAddr().GID().KernelString()+"\n  complete:    yes\n  DLID:     0x") ||
		!strings.Contains(pt, "  rate:       40.0 Gb/sec\n") {
		t.Fatalf("path text:\n%s", pt)
	}
	s := b.ib0.Stats()
	if s.RxPackets == 0 || s.RxBytes == 0 {
		t.Fatalf("b stats %+v", s)
	}
	// A large burst stays under the 3-packet queue while resolving nothing new: all arrive.
	for k := range 50 {
		a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, uint16(100+k), 1000)})
	}
	waitFor(t, "50 echoes", func() bool {
		b.host.mu.Lock()
		defer b.host.mu.Unlock()
		return len(b.host.pkts) >= 50
	})
}

func TestIPv6NeighbourDiscovery(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	a.ib0.SetHostAddrs(nil)
	b.ib0.SetHostAddrs(nil)
	src, dst := a.ib0.LinkLocal(), b.ib0.LinkLocal()
	if dst.As16()[8]&0x02 == 0 {
		t.Fatalf("link-local %v lacks the universal/local bit", dst)
	}
	// Let b join its solicited-node group before a solicits.
	sn := mgidForIP(solicitedNode(dst), b.ib0.Broadcast())
	waitFor(t, "solicited-node join", func() bool { return strings.Contains(b.ib0.MCGText(), sn.KernelString()) })
	waitFor(t, "solicited-node join complete", func() bool {
		b.ib0.dmu.Lock()
		defer b.ib0.dmu.Unlock()
		g := b.ib0.mcast[sn]
		return g != nil && g.ah != nil
	})
	pkt := icmp6Echo(src, dst, 9)
	is := func(p []byte) bool { return len(p) == len(pkt) && p[40] == 128 }
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.ib0.Transmit([][]byte{pkt})
		time.Sleep(100 * time.Millisecond)
		if got := b.host.take(is); len(got) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ICMPv6 echo never arrived")
		}
	}
	// ND itself is not handed to the kernel: a learned b through the NA.
	a.ib0.dmu.Lock()
	n := a.ib0.neigh[dst]
	a.ib0.dmu.Unlock()
	if n == nil || !n.valid || n.hw != b.ib0.HWAddr() {
		t.Fatalf("neighbour entry %+v", n)
	}
}

func TestChildrenRulesAndPartitions(t *testing.T) {
	ga, gb, gc := soft.GUIDFromName("a", 1), soft.GUIDFromName("b", 1), soft.GUIDFromName("c", 1)
	conf := fmt.Sprintf("Default=0x7fff, ipoib : ALL=full;\nP1=0x8001, ipoib : %#x=full, %#x=full;\nP3=0x0003, ipoib : %#x=limited, %#x=limited, %#x=full;\n",
		uint64(ga), uint64(gb), uint64(ga), uint64(gb), uint64(gc))
	smh, nodes := testFabric(t, conf, "a", "b", "c")
	a, b, c := nodes[0], nodes[1], nodes[2]

	// Errno table for create_child / delete_child.
	for _, tc := range []struct {
		v    int64
		want syscall.Errno
	}{{0, syscall.EINVAL}, {0x8000, syscall.EINVAL}, {0x10000, syscall.EINVAL}, {-1, syscall.EINVAL}, {0xffff, syscall.ENOTUNIQ}, {0x7fff, syscall.ENOTUNIQ}} {
		if _, err := a.ib0.CreateChild(tc.v); !errors.Is(err, tc.want) {
			t.Errorf("create_child %#x: %v, want %v", tc.v, err, tc.want)
		}
	}
	kids := map[*node]*Interface{}
	for _, n := range nodes {
		k, err := n.ib0.CreateChild(1) // normalised to 0x8001
		if err != nil {
			t.Fatal(err)
		}
		if k.Name() != "ib0.8001" || k.PKey() != 0x8001 || k.Parent() != n.ib0 || k.IsUp() {
			t.Fatalf("child %s pkey %v parent %s up %v; want ib0.8001 0x8001 ib0, created down", k.Name(), k.PKey(), k.Parent().Name(), k.IsUp())
		}
		if err := k.SetUp(true); err != nil {
			t.Fatal(err)
		}
		kids[n] = k
	}
	if _, err := a.ib0.CreateChild(0x8001); !errors.Is(err, syscall.ENOTUNIQ) {
		t.Fatalf("duplicate child: %v", err)
	}
	if err := a.ib0.DeleteChild(0x0001); !errors.Is(err, syscall.ENODEV) {
		t.Fatalf("delete without the full bit: %v", err)
	}
	if _, ok := a.e.Interface("ib0.8001"); !ok {
		t.Fatal("child not listed")
	}
	// a and b are members of 0x8001: carrier; c is not: up, no carrier.
	waitFor(t, "a child carrier", kids[a].Carrier)
	waitFor(t, "b child carrier", kids[b].Carrier)
	time.Sleep(100 * time.Millisecond)
	if kids[c].Carrier() || kids[c].OperState() != "down" {
		t.Fatalf("child on a port without the P_Key has carrier")
	}
	ha, hbst := &fakeHost{}, &fakeHost{}
	kids[a].AttachHost(ha)
	kids[b].AttachHost(hbst)
	kids[a].SetHostAddrs([]netip.Prefix{pfx("10.8.1.1/24")})
	kids[b].SetHostAddrs([]netip.Prefix{pfx("10.8.1.2/24")})
	ping(t, kids[a], kids[b], hbst, "10.8.1.1", "10.8.1.2", 11)

	// The subnet manager adds c to 0x8001: its child comes up by itself.
	conf2 := strings.Replace(conf, fmt.Sprintf("%#x=full;\nP3", uint64(gb)), fmt.Sprintf("%#x=full, %#x=full;\nP3", uint64(gb), uint64(gc)), 1)
	p2, err := partitions.Parse("t2.conf", strings.NewReader(conf2))
	if err != nil {
		t.Fatal(err)
	}
	smh.SM().SetPartitions(p2)
	waitFor(t, "c child carrier after the P_Key appeared", kids[c].Carrier)

	// Limited members of 0x0003 (a and b) cannot reach each other.
	la, _ := a.ib0.CreateChild(3)
	lb, _ := b.ib0.CreateChild(3)
	_, _ = la.SetUp(true), lb.SetUp(true)
	waitFor(t, "limited children carrier", func() bool { return la.Carrier() && lb.Carrier() })
	hl := &fakeHost{}
	lb.AttachHost(hl)
	la.SetHostAddrs([]netip.Prefix{pfx("10.3.0.1/24")})
	lb.SetHostAddrs([]netip.Prefix{pfx("10.3.0.2/24")})
	for k := range 5 {
		la.Transmit([][]byte{icmp4("10.3.0.1", "10.3.0.2", 8, uint16(300+k), 56)})
		time.Sleep(50 * time.Millisecond)
	}
	if got := hl.take(func([]byte) bool { return true }); len(got) != 0 {
		t.Fatalf("limited member reached a limited member: %d packets", len(got))
	}

	if err := a.ib0.DeleteChild(0x8001); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.e.Interface("ib0.8001"); ok {
		t.Fatal("child still listed after delete")
	}
	if err := a.ib0.DeleteChild(0x8001); !errors.Is(err, syscall.ENODEV) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestMTURulesAndMode(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	i := nodes[0].ib0
	for _, bad := range []int{0, 71, 4093, 65520} {
		if err := i.SetMTU(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("SetMTU(%d): %v", bad, err)
		}
	}
	if err := i.SetMTU(4092); err != nil || i.MTU() != 2044 {
		t.Fatalf("SetMTU(4092): %v, effective %d (want 2044: admin above the group MTU)", err, i.MTU())
	}
	if err := i.SetMTU(1500); err != nil || i.MTU() != 1500 || nodes[0].host.state().mtu != 1500 {
		t.Fatalf("SetMTU(1500): %v, %d, host %d", err, i.MTU(), nodes[0].host.state().mtu)
	}
	// Connected mode: MTU 65520 overwrites the admin MTU, tx checksum and large send
	// off, receive side untouched (ipoib_fix_features).
	if err := i.SetMode(Connected); err != nil {
		t.Fatalf("connected: %v", err)
	}
	if i.MTU() != 65520 || nodes[0].host.state().mtu != 65520 || i.Mode() != Connected {
		t.Fatalf("connected: MTU %d host %d mode %v", i.MTU(), nodes[0].host.state().mtu, i.Mode())
	}
	if f := nodes[0].host.state().feat; f.TxChecksum || f.TSO || !f.RxChecksum || !f.GRO || !i.RequestedFeatures().TSO {
		t.Fatalf("connected-mode features %+v (requested %+v)", f, i.RequestedFeatures())
	}
	for _, bad := range []int{65521, 67} {
		if err := i.SetMTU(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("connected SetMTU(%d): %v", bad, err)
		}
	}
	if err := i.SetMTU(60000); err != nil || i.MTU() != 60000 {
		t.Fatalf("connected SetMTU(60000): %v, %d (above the group MTU is allowed)", err, i.MTU())
	}
	// Back to datagram: MTU = min(group MTU - 4, current), offloads allowed again.
	if err := i.SetMode(Datagram); err != nil {
		t.Fatalf("datagram: %v", err)
	}
	if i.MTU() != 2044 || !nodes[0].host.state().feat.TSO {
		t.Fatalf("datagram again: MTU %d features %+v", i.MTU(), nodes[0].host.state().feat)
	}
	if err := i.SetCoalesce(Coalesce{RxUsecs: 0x10000}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("coalesce: %v", err)
	}
	if err := i.SetCoalesce(Coalesce{RxUsecs: 10, RxFrames: 16}); err != nil || i.Coalesce().RxFrames != 16 {
		t.Fatalf("coalesce: %v", err)
	}
	i.SetFeatures(Features{RxChecksum: true, TxChecksum: false, TSO: true, GRO: true})
	if f := nodes[0].host.state().feat; f.TSO || f.TxChecksum || !f.GRO || !f.RxChecksum {
		t.Fatalf("host features %+v (TSO needs tx checksum, nothing else changes)", f)
	}
	// Receive coalescing hands the kernel checksum-trusted super-packets: without rx
	// checksumming it is off, as netdev_fix_features drops hardware GRO without RXCSUM.
	i.SetFeatures(Features{RxChecksum: false, TxChecksum: true, TSO: true, GRO: true})
	if f, req := nodes[0].host.state().feat, i.RequestedFeatures(); f.GRO || f.RxChecksum || !f.TSO || !f.TxChecksum || !req.GRO {
		t.Fatalf("rx checksum off: host features %+v, requested %+v", f, req)
	}
}

func TestBroadcastLoopbackDroppedAndGarbageCounted(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	a.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.1/24")})
	b.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24")})
	bc := icmp4("10.0.0.1", "10.0.0.255", 8, 77, 20)
	deadline := time.Now().Add(5 * time.Second)
	for len(b.host.take(isICMP4(77))) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("broadcast not received")
		}
		a.ib0.Transmit([][]byte{bc})
		time.Sleep(50 * time.Millisecond)
	}
	if got := a.host.take(isICMP4(77)); len(got) != 0 {
		t.Fatal("own broadcast looped back to the sender's kernel")
	}
	// Garbage from the kernel side: counted as tx_dropped.
	before := a.ib0.Stats().TxDropped
	a.ib0.Transmit([][]byte{{}, {0x45, 1, 2}, {0x11, 0x22}})
	if got := a.ib0.Stats().TxDropped - before; got != 3 {
		t.Fatalf("tx_dropped +%d for 3 garbage packets", got)
	}
	// Oversized packet: dropped, tx_errors, and the sender gets "fragmentation needed"
	// with the group MTU, quoting the original header.
	big := icmp4("10.0.0.1", "10.0.0.2", 8, 1, 3000)
	a.ib0.Transmit([][]byte{big})
	if a.ib0.Stats().TxErrors == 0 {
		t.Fatal("oversized packet not counted as tx error")
	}
	fn := a.host.take(func(p []byte) bool { return len(p) >= 28 && p[9] == 1 && p[20] == 3 && p[21] == 4 })
	if len(fn) != 1 || binary.BigEndian.Uint16(fn[0][26:]) != 2044 || csum(fn[0][:20]) != 0 || csum(fn[0][20:]) != 0 ||
		!bytes.Equal(fn[0][28:48], big[:20]) || !bytes.Equal(fn[0][16:20], big[12:16]) {
		t.Fatalf("frag-needed: %x", fn)
	}
	// IPv6: packet too big.
	big6 := icmp6Echo(a.ib0.LinkLocal(), b.ib0.LinkLocal(), 5)
	big6 = append(big6, make([]byte, 3000)...)
	binary.BigEndian.PutUint16(big6[4:], uint16(len(big6)-40))
	a.ib0.Transmit([][]byte{big6})
	ptb := a.host.take(func(p []byte) bool { return len(p) > 48 && p[0]>>4 == 6 && p[40] == 2 })
	if len(ptb) != 1 || binary.BigEndian.Uint32(ptb[0][44:]) != 2044 || icmpv6Checksum(ptb[0]) != 0 || len(ptb[0]) != 1280 {
		t.Fatalf("packet too big: %d packets, %x", len(ptb), ptb)
	}
}

func TestDebugLevelsTrace(t *testing.T) {
	var buf testenv.Buffer
	e := newRig(t).smEngine(Options{Logger: log.New(&buf, "", 0)})
	ib0, _ := e.Interface("ib0")
	_ = ib0.SetUp(true)
	waitFor(t, "carrier", ib0.Carrier)
	if strings.Contains(buf.String(), "ipoib") {
		t.Fatalf("trace lines with debug levels 0:\n%s", buf.String())
	}
	if err := e.Params().SetParam("mcast_debug_level", "1\n"); err != nil {
		t.Fatal(err)
	}
	_ = ib0.SetUp(false)
	_ = ib0.SetUp(true)
	waitFor(t, "carrier again", ib0.Carrier)
	if !strings.Contains(buf.String(), "ipoib mcast: ib0: joining MGID ff12:401b:ffff:0:0:0:ffff:ffff") {
		t.Fatalf("no mcast trace:\n%s", buf.String())
	}
	if err := e.Params().SetParam("send_queue_size", "4"); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("send_queue_size write: %v", err)
	}
	if err := e.Params().SetParam("debug_level", "x"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("debug_level garbage: %v", err)
	}
}

func TestParamsRounding(t *testing.T) {
	for _, tc := range []struct{ s, r, c, ws, wr, wc int }{
		{128, 256, 128, 128, 256, 128},
		{1, 1, -5, 128, 2, 0},
		{200, 300, 5000, 256, 512, 4096},
		{100000, 100000, 7, 8192, 8192, 7},
	} {
		p := NewParams(tc.s, tc.r, tc.c)
		if p.SendQueueSize != tc.ws || p.RecvQueueSize != tc.wr || p.MaxNonSRQConnQP != tc.wc {
			t.Errorf("NewParams(%d,%d,%d) = %d,%d,%d", tc.s, tc.r, tc.c, p.SendQueueSize, p.RecvQueueSize, p.MaxNonSRQConnQP)
		}
	}
}

func TestAddressMappings(t *testing.T) {
	bc := broadcastAddr(0x8001)
	for _, tc := range []struct{ ip, mgid string }{
		{"224.0.0.1", "ff12:401b:8001::1"},
		{"239.255.1.2", "ff12:401b:8001::fff:102"},
		{"255.255.255.255", "ff12:401b:8001::ffff:ffff"},
		{"ff02::1", "ff12:601b:8001::1"},
		{"ff02::1:ffab:cdef", "ff12:601b:8001::1:ffab:cdef"},
	} {
		if got := mgidForIP(netip.MustParseAddr(tc.ip), bc).String(); got != tc.mgid {
			t.Errorf("%s -> %s, want %s", tc.ip, got, tc.mgid)
		}
	}
	if got := ChildName("averyveryverylongname", 0x8001); got != "averyveryv.8001" {
		t.Errorf("child name %s", got)
	}
	if got := linkLocal(0x0002c90300001234).String(); got != "fe80::202:c903:0:1234" {
		t.Errorf("link-local %s", got)
	}
}

// TestEngineBeforePortActive starts the engine while the port still waits for the
// subnet manager: the interface comes up without carrier and gets it once the SM has
// programmed the port (PKEY_CHANGE), without any action.
func TestEngineBeforePortActive(t *testing.T) {
	net := soft.NewMemNetwork()
	smAddr := netip.MustParseAddrPort("127.0.0.1:4791")
	node, err := soft.New(soft.Config{Name: "early", Network: net, SM: smAddr, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	e, err := New(node, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ib0, _ := e.Interface("ib0")
	if err := ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if ib0.Carrier() || ib0.OperState() != "down" {
		t.Fatal("carrier without a subnet manager")
	}
	// default_operstate: a child without carrier under a parent without carrier is
	// lowerlayerdown (its iflink is the parent); the parent itself is down.
	kid, err := ib0.CreateChild(0x8001)
	if err != nil {
		t.Fatal(err)
	}
	if err := kid.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if got := kid.OperState(); got != "lowerlayerdown" {
		t.Errorf("child of a parent without carrier: operstate %s, want lowerlayerdown", got)
	}
	smh, err := soft.New(soft.Config{Name: "sm", Network: net, Listen: smAddr, HostSM: true, Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	waitFor(t, "carrier once the SM is there", ib0.Carrier)
}

func TestDataDebugParamOnlyWithBuildTag(t *testing.T) {
	p := DefaultParams()
	_, rerr := p.Param("data_debug_level")
	werr := p.SetParam("data_debug_level", "1")
	has := false
	for _, n := range ParamNames {
		has = has || n == "data_debug_level"
	}
	if dataDebug != has || dataDebug != (rerr == nil) || dataDebug != (werr == nil) {
		t.Fatalf("dataDebug=%v but listed=%v read=%v write=%v", dataDebug, has, rerr, werr)
	}
}

// TestGarbageFromFabricCounted sends runt frames and unknown EtherTypes straight to the
// interface's QP: they are dropped and counted in rx_dropped, nothing reaches the host.
func TestGarbageFromFabricCounted(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	h := a.hca
	scq, _ := h.CreateCQ(verbs.CQAttr{Entries: 16})
	rcq, _ := h.CreateCQ(verbs.CQAttr{Entries: 16})
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: 1, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []verbs.QPModify{
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex | verbs.QPMaskQKey, State: verbs.QPInit, QKey: 0x0b1b},
		{Mask: verbs.QPMaskState, State: verbs.QPRTR}, {Mask: verbs.QPMaskState, State: verbs.QPRTS},
	} {
		if err := qp.Modify(m); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := h.CreateAH(verbs.AHAttr{Port: 1, DLID: b.hca.SoftPort(1).Attr().LID})
	if err != nil {
		t.Fatal(err)
	}
	junk := [][]byte{{0x08}, {0x08, 0x00, 0x00}, {0x12, 0x34, 0, 0, 1, 2, 3}, {0x08, 0x00, 0, 0, 0x45}, {0x08, 0x06, 0, 0, 1}}
	before := b.ib0.Stats().RxDropped
	for _, j := range junk {
		if _, err := qp.PostSend([]verbs.SendWR{{AH: ah, RemoteQPN: b.ib0.HWAddr().QPN(), RemoteQKey: 0x0b1b, Data: [][]byte{j}}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "rx_dropped", func() bool { return b.ib0.Stats().RxDropped-before == uint64(len(junk)) })
	if got := b.host.take(func([]byte) bool { return true }); len(got) != 0 {
		t.Fatalf("garbage reached the host: %d packets", len(got))
	}
}

// TestConnectedModeLargePackets: both ends connected, a 60000-byte packet crosses the
// RC connection intact; the passive side holds one connection.
func TestConnectedModeLargePackets(t *testing.T) {
	a, b := connectedPair(t)
	big := icmp4("10.0.0.1", "10.0.0.2", 8, 2, 60000)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.ib0.Transmit([][]byte{big})
		time.Sleep(50 * time.Millisecond)
		if got := b.host.take(isICMP4(2)); len(got) > 0 {
			if !bytes.Equal(got[0], big) {
				t.Fatal("large packet changed in flight")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("60000-byte packet never arrived; a stats %+v", a.ib0.Stats())
		}
	}
	b.ib0.dmu.Lock()
	nrx := len(b.ib0.rx)
	b.ib0.dmu.Unlock()
	a.ib0.dmu.Lock()
	tx := a.ib0.tx[b.ib0.HWAddr()]
	a.ib0.dmu.Unlock()
	if nrx != 1 || tx == nil || !tx.up || tx.mtu != 65524 {
		t.Fatalf("connections: passive %d, active %+v", nrx, tx)
	}
	// Multicast stays on UD: a large broadcast gets fragmentation-needed.
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.255", 8, 3, 5000)})
	fn := a.host.take(func(p []byte) bool { return len(p) >= 28 && p[9] == 1 && p[20] == 3 && p[21] == 4 })
	if len(fn) != 1 || binary.BigEndian.Uint16(fn[0][26:]) != 2044 {
		t.Fatalf("large multicast in connected mode: %d ICMP errors", len(fn))
	}
}

// TestConnectedToDatagramPeerFallsBack: the datagram side refuses the connection, so
// large packets from the connected side get fragmentation-needed with the UD MTU and
// packets of that size flow.
func TestConnectedToDatagramPeerFallsBack(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	a.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.1/24")})
	b.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24")})
	if err := a.ib0.SetMode(Connected); err != nil {
		t.Fatal(err)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 2, 30000)})
		time.Sleep(50 * time.Millisecond)
		fn := a.host.take(func(p []byte) bool { return len(p) >= 28 && p[9] == 1 && p[20] == 3 && p[21] == 4 })
		if len(fn) > 0 {
			if mtu := binary.BigEndian.Uint16(fn[0][26:]); mtu != 2044 {
				t.Fatalf("frag-needed MTU %d", mtu)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no fragmentation-needed from the connected side")
		}
	}
	if got := b.host.take(isICMP4(2)); len(got) != 0 {
		t.Fatal("a 30000-byte packet reached a datagram-mode peer")
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 4) // small packets still flow over UD
	a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, 5, 2044-28)})
	waitFor(t, "a 2044-byte packet", func() bool { return len(b.host.take(isICMP4(5))) == 1 })
}

// TestMaxNonSRQConnQPAndChildMode: on an HCA without shared receive queues,
// max_nonsrq_conn_qp caps passive connections (REJ beyond it, and the refused peer
// reaches us over UD), and a child has its own mode.
func TestMaxNonSRQConnQPAndChildMode(t *testing.T) {
	_, nodes := testFabricWith(t, "", func(c *soft.Config, _ *Options) { c.NoSRQ = true }, "a", "b", "c")
	a, b, c := nodes[0], nodes[1], nodes[2]
	a.e.params.MaxNonSRQConnQP = 1
	connectedNodes(t, nodes)
	ping(t, b.ib0, a.ib0, a.host, "10.0.0.2", "10.0.0.1", 1)
	waitFor(t, "b's connection to a", func() bool {
		b.ib0.dmu.Lock()
		defer b.ib0.dmu.Unlock()
		tx := b.ib0.tx[a.ib0.HWAddr()]
		return tx != nil && tx.up
	})
	ping(t, c.ib0, a.ib0, a.host, "10.0.0.3", "10.0.0.1", 2) // arrives, over UD
	waitFor(t, "c refused by a", func() bool {
		c.ib0.dmu.Lock()
		defer c.ib0.dmu.Unlock()
		tx := c.ib0.tx[a.ib0.HWAddr()]
		return tx != nil && !tx.rejected.IsZero()
	})
	a.ib0.dmu.Lock()
	nrx := len(a.ib0.rx)
	a.ib0.dmu.Unlock()
	if nrx != 1 {
		t.Fatalf("a holds %d passive connections with max_nonsrq_conn_qp 1", nrx)
	}
	// Children start in datagram mode whatever the parent's mode is.
	kid, err := a.ib0.CreateChild(0x8001)
	if err != nil {
		t.Fatal(err)
	}
	if kid.Mode() != Datagram || a.ib0.Mode() != Connected {
		t.Fatalf("child mode %v, parent %v", kid.Mode(), a.ib0.Mode())
	}
}

// TestConnectedSRQSharesOnePool: with a shared receive queue, passive connections
// hold no receive ring of their own; the interface has one pool of recv_queue_size
// buffers, made at the first connection; max_nonsrq_conn_qp does not limit them; the
// pool's buffers go back to it, so more messages than it holds get through after a
// connection went away.
func TestConnectedSRQSharesOnePool(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b", "c")
	a := nodes[0]
	a.e.params.MaxNonSRQConnQP = 1 // not a limit with SRQ
	connectedNodes(t, nodes)
	a.ib0.dmu.Lock()
	srq, pool := a.ib0.cmSRQ, a.ib0.cmSRQBufs
	a.ib0.dmu.Unlock()
	if !a.ib0.cmHasSRQ || srq != nil || pool != nil {
		t.Fatalf("before any connection: SRQ supported %v, made %v, pool of %d buffers; want supported, not made, no pool",
			a.ib0.cmHasSRQ, srq, len(pool))
	}
	for k, n := range nodes[1:] {
		src := fmt.Sprintf("10.0.0.%d", k+2)
		ping(t, n.ib0, a.ib0, a.host, src, "10.0.0.1", uint16(100*k+50))
		// Larger than any UD MTU: arrives only over the connection.
		for seq := uint16(1); ; seq++ {
			n.ib0.Transmit([][]byte{icmp4(src, "10.0.0.1", 8, uint16(100*k)+seq, 30000)})
			if got := a.host.take(func(p []byte) bool { return len(p) == 30028 }); len(got) > 0 {
				break
			}
			if seq == 200 {
				t.Fatalf("no 30000-byte packet from %s over a connection", src)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	a.ib0.dmu.Lock()
	nrx, pool := len(a.ib0.rx), a.ib0.cmSRQBufs
	own := 0
	for _, r := range a.ib0.rx {
		own += len(r.bufs)
	}
	a.ib0.dmu.Unlock()
	if nrx != 2 || own != 0 || len(pool) != a.e.params.RecvQueueSize {
		t.Fatalf("a: %d passive connections holding %d buffers of their own, pool of %d; want 2, 0 and %d",
			nrx, own, len(pool), a.e.params.RecvQueueSize)
	}
	// c goes away; b then gets more messages through than the pool holds.
	nodes[2].e.Close()
	waitFor(t, "c's connection gone from a", func() bool {
		a.ib0.dmu.Lock()
		defer a.ib0.dmu.Unlock()
		return len(a.ib0.rx) == 1
	})
	b := nodes[1]
	const burst = 600 // more than recv_queue_size (256): buffers must come back
	got := 0
	for round := 0; got < burst && round < 100; round++ {
		var pkts [][]byte
		for k := got; k < burst; k++ {
			pkts = append(pkts, icmp4("10.0.0.2", "10.0.0.1", 8, uint16(1000+k), 20000))
		}
		b.ib0.Transmit(pkts[:min(len(pkts), 64)])
		time.Sleep(10 * time.Millisecond)
		got += len(a.host.take(func(p []byte) bool { return len(p) == 20028 }))
	}
	if got < burst {
		t.Fatalf("%d of %d messages over the remaining connection", got, burst)
	}
}

// TestConnectedPeerRestart: the peer's engine restarts (same node name, so the same
// GUID); the old connection fails, is torn down, and the next packets rebuild it.
func TestConnectedPeerRestart(t *testing.T) {
	smh, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	connectedNodes(t, nodes)
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	b.e.Close()
	b.hca.Close()
	h, err := soft.New(soft.Config{Name: "b", Network: b.hca.Network(), SM: smh.Endpoint(1), Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	waitFor(t, "restarted port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
	e, err := New(h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ib0, _ := e.Interface("ib0")
	host := &fakeHost{}
	ib0.AttachHost(host)
	ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24")})
	_ = ib0.SetUp(true)
	_ = ib0.SetMode(Connected)
	waitFor(t, "carrier", ib0.Carrier)
	big := icmp4("10.0.0.1", "10.0.0.2", 8, 9, 20000)
	deadline := time.Now().Add(15 * time.Second)
	for len(host.take(isICMP4(9))) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no traffic to the restarted peer; a stats %+v", a.ib0.Stats())
		}
		a.ib0.Transmit([][]byte{big})
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFlushesKeepSAMembership: back-to-back flushes (PORT_ACTIVE then PKEY_CHANGE, as a
// port coming up produces) must leave the port a member of the broadcast group at the
// SA; a late leave from the first round used to delete the second round's join, and
// the peer's broadcasts (ARP) never reached the port again.
func TestFlushesKeepSAMembership(t *testing.T) {
	smh, nodes := testFabric(t, "", "a", "b")
	b := nodes[1]
	bcast := b.ib0.Broadcast().GID()
	gid := b.ib0.HWAddr().GID()
	member := func() bool {
		g, ok := smh.SM().DB().Group(bcast)
		if !ok {
			return false
		}
		for _, m := range g.Members {
			if m.GID == gid && m.JoinState&1 != 0 {
				return true
			}
		}
		return false
	}
	for range 5 {
		b.ib0.flush(flushNormal)
		b.ib0.flush(flushHeavy)
		waitFor(t, "carrier after the flushes", b.ib0.Carrier)
		time.Sleep(50 * time.Millisecond) // room for a stray leave to arrive
		if !member() {
			t.Fatal("b is no longer a member of the broadcast group at the SA")
		}
	}
}

// Switching the mode while connections are being set up: the connect goroutine and the
// mode switch both handle the connection's QP (a data race before; -race reports it),
// and afterwards traffic still flows.
func TestModeSwitchDuringConnect(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	a.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.1/24")})
	b.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24")})
	if err := b.ib0.SetMode(Connected); err != nil {
		t.Fatal(err)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1) // neighbours resolved over UD
	for round := range 60 {
		if err := a.ib0.SetMode(Connected); err != nil {
			t.Fatal(err)
		}
		a.ib0.Transmit([][]byte{icmp4("10.0.0.1", "10.0.0.2", 8, uint16(1000+round), 100)}) // starts a connect
		// Spread the switch over the connect's phases (path query, QP, REQ/REP/RTU);
		// this sleep only varies the interleaving, nothing waits on it.
		time.Sleep(time.Duration(round%30) * 40 * time.Microsecond)
		if err := a.ib0.SetMode(Datagram); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ib0.SetMode(Connected); err != nil {
		t.Fatal(err)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 2)
}

// The kernel's multicast list is the source of the groups: a group in it is joined as a
// full member (traffic to it arrives), and leaving the list leaves the group at the SA.
func TestHostGroupsJoinedAndLeft(t *testing.T) {
	smh, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	g := netip.MustParseAddr("239.1.2.3")
	mgid := mgidForIP(g, b.ib0.Broadcast())
	member := func() bool {
		grp, ok := smh.SM().DB().Group(mgid)
		if !ok {
			return false
		}
		for _, m := range grp.Members {
			if m.GID == b.ib0.HWAddr().GID() && m.JoinState&1 != 0 {
				return true
			}
		}
		return false
	}
	b.ib0.SetHostGroups([]netip.Addr{netip.MustParseAddr("224.0.0.1"), g})
	waitFor(t, "b a full member of "+g.String(), member)
	if !strings.Contains(b.ib0.MCGText(), mgid.KernelString()) {
		t.Fatalf("ib0_mcg does not list %s:\n%s", mgid.KernelString(), b.ib0.MCGText())
	}
	// a sends a datagram to the group; b's host receives it.
	a.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.1/24")})
	pkt := udp4("10.0.0.1", g.String(), 5000, []byte("hello group"))
	isIt := func(p []byte) bool { return bytes.Equal(p, pkt) }
	waitFor(t, "the datagram at b", func() bool {
		a.ib0.Transmit([][]byte{pkt})
		time.Sleep(10 * time.Millisecond)
		return len(b.host.take(isIt)) > 0
	})
	// The kernel left the group: so does the engine.
	b.ib0.SetHostGroups([]netip.Addr{netip.MustParseAddr("224.0.0.1")})
	waitFor(t, "b no longer a member of "+g.String(), func() bool { return !member() })
	if strings.Contains(b.ib0.MCGText(), mgid.KernelString()) {
		t.Errorf("ib0_mcg still lists %s after the leave", mgid.KernelString())
	}
}

// A child follows its parent down and up, and the host device is told.
func TestChildFollowsParentUpDown(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	a := nodes[0]
	c, err := a.ib0.CreateChild(0x8001)
	if err != nil {
		t.Fatal(err)
	}
	ch := &fakeHost{}
	c.AttachHost(ch)
	if err := a.ib0.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if c.IsUp() || ch.state().up {
		t.Errorf("after the parent went down: child up %v, its device up %v", c.IsUp(), ch.state().up)
	}
	if err := a.ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if !c.IsUp() || !ch.state().up {
		t.Errorf("after the parent came up: child up %v, its device up %v", c.IsUp(), ch.state().up)
	}
}

// Rename: the interface is found under its new name only; a taken or invalid name is
// refused and nothing changes.
func TestRename(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	a := nodes[0]
	c, err := a.ib0.CreateChild(0x8001)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.e.Rename(c, "ib0"); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("rename to a taken name: %v, want EEXIST", err)
	}
	if err := a.e.Rename(c, "bad/name"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("rename to an invalid name: %v, want EINVAL", err)
	}
	if err := a.e.Rename(c, "storage0"); err != nil {
		t.Fatal(err)
	}
	if got, ok := a.e.Interface("storage0"); !ok || got != c || c.Name() != "storage0" {
		t.Errorf("after the rename: %v %v %s", got, ok, c.Name())
	}
	if _, ok := a.e.Interface("ib0.8001"); ok {
		t.Error("the old name still resolves")
	}
	if err := a.ib0.DeleteChild(0x8001); err != nil {
		t.Errorf("delete the renamed child: %v", err)
	}
}

// A parent's children follow its transitions only, as the driver's ipoib_open and
// ipoib_stop do: setting an up parent up again (a flags write, a reload's ONBOOT)
// leaves a child someone took down, down.
func TestParentSetUpAgainLeavesChildren(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	i := nodes[0].ib0
	if err := i.SetUp(true); err != nil {
		t.Fatal(err)
	}
	c, err := i.CreateChild(0x8001)
	if err != nil {
		t.Fatal(err)
	}
	if c.IsUp() {
		t.Fatal("a new child is up")
	}
	if err := i.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if c.IsUp() {
		t.Fatal("setting the up parent up again brought its down child up")
	}
	for _, up := range []bool{false, true} { // a real transition takes the child with it
		if err := i.SetUp(up); err != nil {
			t.Fatal(err)
		}
		if c.IsUp() != up {
			t.Fatalf("parent set up %v: child up %v", up, c.IsUp())
		}
	}
}

// A child cannot have children: EINVAL, as ipoib_new_child_link answers ("child
// creation disallowed for child devices").
func TestChildOfChildIsEINVAL(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	c, err := nodes[0].ib0.CreateChild(0x8001)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateChild(0x8002); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("a child's child: %v, want EINVAL", err)
	}
}

// stubCQ is a CQ holding given completions.
type stubCQ struct {
	verbs.CQ
	wcs []verbs.WC
}

func (c *stubCQ) Poll(wc []verbs.WC) int {
	n := copy(wc, c.wcs)
	c.wcs = c.wcs[n:]
	return n
}

// A failed send completion counts as the driver counts it: in tx_packets (counted at
// the post here) and not in tx_errors, which are for posts the HCA refused; a failed
// connected-mode send tears its connection down.
func TestFailedSendCompletionsCountAsTheDriver(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	a, b := nodes[0], nodes[1]
	connectedNodes(t, nodes)
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	before := a.ib0.Stats()
	a.ib0.reapCQ(&stubCQ{wcs: []verbs.WC{{Status: verbs.WCSuccess}, {Status: verbs.WCWRFlushErr}, {Status: verbs.WCLocLenErr, WRID: 7}}})
	a.ib0.dmu.Lock()
	var qpn verbs.QPN
	for _, tx := range a.ib0.tx {
		if tx.qp != nil {
			qpn = tx.qp.Num()
		}
	}
	a.ib0.dmu.Unlock()
	if qpn == 0 {
		t.Fatal("no connection to b after a ping in connected mode")
	}
	a.ib0.cmTxCompleted(verbs.WC{Status: verbs.WCRetryExcErr, QPN: qpn})
	if after := a.ib0.Stats(); after.TxErrors != before.TxErrors || after.TxDropped != before.TxDropped {
		t.Errorf("failed completions counted as errors or drops: %+v, then %+v", before, after)
	}
	a.ib0.dmu.Lock()
	defer a.ib0.dmu.Unlock()
	for _, tx := range a.ib0.tx {
		if tx.qp != nil && tx.qp.Num() == qpn {
			t.Error("the connection whose send failed is still in use")
		}
	}
}

// Failed send completions are logged at most 100 in 10 s, as ipoib_warn limits
// them (a port MTU lowered under the interface fails every full-size send); another
// warning has its own limit, as each ipoib_warn call site has.
func TestFailedSendWarningsLimited(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	a := nodes[0]
	var buf strings.Builder
	var mu sync.Mutex
	a.e.log.SetOutput(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }))
	wcs := make([]verbs.WC, 10000)
	for k := range wcs {
		wcs[k] = verbs.WC{Status: verbs.WCLocLenErr, WRID: uint64(k)}
	}
	a.ib0.reapCQ(&stubCQ{wcs: wcs})
	a.ib0.sendWarnf(warnPost, "post_send failed: test")
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Count(buf.String(), "failed send event"); got != 100 {
		t.Errorf("%d of 10000 failed completions logged, want the 100 of a window", got)
	}
	if !strings.Contains(buf.String(), "post_send failed: test") {
		t.Errorf("another warning held back by the failed completions' limit")
	}
}

// The limit is the kernel's ratelimit: burst lines in a window that opens at the
// first line after the last window ended; the count held back is said when the next
// window opens.
func TestRatelimitWindows(t *testing.T) {
	r := &ratelimit{what: "x", interval: 10 * time.Second, burst: 3}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at        time.Duration
		ok        bool
		suppressd int
	}{
		{0, true, 0}, {time.Second, true, 0}, {2 * time.Second, true, 0},
		{3 * time.Second, false, 0}, {9 * time.Second, false, 0},
		{10 * time.Second, false, 0},  // the window's last instant
		{10*time.Second + 1, true, 3}, // a new window from here
		{11 * time.Second, true, 0}, {12 * time.Second, true, 0}, {19 * time.Second, false, 0},
		{40 * time.Second, true, 1}, {40 * time.Second, true, 0},
	}
	for k, s := range steps {
		ok, n := r.allow(t0.Add(s.at))
		if ok != s.ok || n != s.suppressd {
			t.Errorf("step %d at %v: allow %v, %d held back; want %v, %d", k, s.at, ok, n, s.ok, s.suppressd)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// An alias taken from the device is taken only while the interface's is still the one
// the device had before: an ifalias write since (on its way to the device) is newer.
func TestAdoptAliasKeepsANewerWrite(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	i := nodes[0].ib0
	if err := i.SetAlias("before"); err != nil {
		t.Fatal(err)
	}
	if err := i.SetAlias("newer"); err != nil { // written after the device had "before"
		t.Fatal(err)
	}
	if took, err := i.AdoptAlias("before", "set by ip"); took || err != nil {
		t.Errorf("adopting over a newer write: took %v, %v", took, err)
	}
	i.mu.Lock()
	got := i.alias
	i.mu.Unlock()
	if got != "newer" {
		t.Errorf("alias %q after a stale adoption, want the newer write", got)
	}
	if took, err := i.AdoptAlias("newer", "set by ip"); !took || err != nil {
		t.Errorf("adopting with nothing newer: took %v, %v", took, err)
	}
	i.mu.Lock()
	got = i.alias
	i.mu.Unlock()
	if got != "set by ip" {
		t.Errorf("alias %q, want the device's", got)
	}
	if _, err := i.AdoptAlias("set by ip", strings.Repeat("x", 300)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("adopting a 300-byte alias: %v, want EINVAL", err)
	}
	// The same for the transmit queue length, IFF_MULTICAST and the user's flags.
	i.SetTxQueueLen(2000)
	if i.AdoptTxQueueLen(1000, 3000) || i.TxQueueLen() != 2000 {
		t.Errorf("txqueuelen adopted over a newer write: %d", i.TxQueueLen())
	}
	if !i.AdoptTxQueueLen(2000, 3000) || i.TxQueueLen() != 3000 {
		t.Errorf("txqueuelen not adopted: %d", i.TxQueueLen())
	}
	i.SetMulticast(false)
	if i.AdoptMulticast(true, true) || i.Multicast() {
		t.Error("multicast adopted over a newer write")
	}
	if !i.AdoptMulticast(false, true) || !i.Multicast() {
		t.Error("multicast not adopted")
	}
	i.SetUserFlags(iffPromisc)
	if i.AdoptUserFlags(0, iffAllMulti) {
		t.Error("user flags adopted over a newer write")
	}
	if !i.AdoptUserFlags(iffPromisc, iffAllMulti) {
		t.Error("user flags not adopted")
	}
	i.mu.Lock()
	user := i.flags.user()
	i.mu.Unlock()
	if user != iffAllMulti {
		t.Errorf("user flags %#x, want the adopted allmulti", user)
	}
}

// pushHost records the attribute pushes a device would get, in order.
type pushHost struct {
	*fakeHost
	mu     sync.Mutex
	pushes []string
}

func (h *pushHost) record(s string)   { h.mu.Lock(); h.pushes = append(h.pushes, s); h.mu.Unlock() }
func (h *pushHost) SetAlias(s string) { h.record("alias " + s) }
func (h *pushHost) SetTxQueueLen(n uint32) error {
	h.record(fmt.Sprintf("txqueuelen %d", n))
	return nil
}
func (h *pushHost) SetMulticast(on bool)  { h.record("multicast " + onOff(on)) }
func (h *pushHost) SetUserFlags(f uint32) { h.record(fmt.Sprintf("flags %#x", f)) }

// take returns and forgets the pushes so far.
func (h *pushHost) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pushes
	h.pushes = nil
	return p
}

// TestRefusedAdoptionPutsTheEngineValueBack: a value someone set on the device that
// the engine does not take (its own changed since the device had the one before) is
// replaced on the device by the engine's, so the two never stay apart — also when the
// engine's never reached the device (a push that failed), where no other push would
// come.
func TestRefusedAdoptionPutsTheEngineValueBack(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	i := nodes[0].ib0
	h := &pushHost{fakeHost: &fakeHost{}}
	i.AttachHost(h)
	t.Cleanup(func() { i.AttachHost(nodes[0].host) })
	if err := i.SetAlias("engine's"); err != nil {
		t.Fatal(err)
	}
	i.SetTxQueueLen(2000)
	i.SetMulticast(false)
	i.SetUserFlags(iffPromisc)
	h.take() // as if each of these pushes had failed: the device kept the values before
	if took, err := i.AdoptAlias("", "set by ip"); took || err != nil {
		t.Errorf("adopting over the engine's alias: took %v, %v", took, err)
	}
	if i.AdoptTxQueueLen(1000, 3000) {
		t.Error("txqueuelen adopted over the engine's")
	}
	if i.AdoptMulticast(true, true) {
		t.Error("multicast adopted over the engine's")
	}
	if i.AdoptUserFlags(0, iffAllMulti) {
		t.Error("flags adopted over the engine's")
	}
	want := []string{"alias engine's", "txqueuelen 2000", "multicast off", fmt.Sprintf("flags %#x", iffPromisc)}
	if got := h.take(); !slices.Equal(got, want) {
		t.Errorf("pushes after refused adoptions %q, want the engine's values %q", got, want)
	}
	// A value taken reaches the device as any change does.
	if took, _ := i.AdoptAlias("engine's", "set by ip"); !took {
		t.Error("alias not adopted")
	}
	if got := h.take(); !slices.Equal(got, []string{"alias set by ip"}) {
		t.Errorf("pushes after an adoption %q", got)
	}

	// A bond's the same.
	bonds := NewBonds(nodes[0].e)
	t.Cleanup(bonds.Close)
	b, err := bonds.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	bh := &pushHost{fakeHost: &fakeHost{}}
	b.AttachHost(bh)
	if err := b.SetAlias("bond's"); err != nil {
		t.Fatal(err)
	}
	b.SetMulticast(false)
	b.SetUserFlags(iffAllMulti)
	bh.take()
	if took, err := b.AdoptAlias("", "set by ip"); took || err != nil {
		t.Errorf("adopting over the bond's alias: took %v, %v", took, err)
	}
	if b.AdoptMulticast(true, true) {
		t.Error("multicast adopted over the bond's")
	}
	if b.AdoptUserFlags(0, iffPromisc) {
		t.Error("flags adopted over the bond's")
	}
	want = []string{"alias bond's", "multicast off", fmt.Sprintf("flags %#x", iffAllMulti)}
	if got := bh.take(); !slices.Equal(got, want) {
		t.Errorf("bond pushes after refused adoptions %q, want the bond's values %q", got, want)
	}
}

// A transmit queue length's change is an event as every other attribute's, whether
// written in the tree or taken from the device (ip link set txqueuelen); an unchanged
// one is none.
func TestTxQueueLenChangeIsAnEvent(t *testing.T) {
	var mu sync.Mutex
	var evs []string
	_, nodes := testFabricWith(t, "", func(_ *soft.Config, o *Options) {
		o.Event = func(s string) { mu.Lock(); evs = append(evs, s); mu.Unlock() }
	}, "a")
	i := nodes[0].ib0
	if err := i.SetTxQueueLen(2000); err != nil {
		t.Fatal(err)
	}
	if err := i.SetTxQueueLen(2000); err != nil {
		t.Fatal(err)
	}
	if !i.AdoptTxQueueLen(2000, 3000) {
		t.Fatal("3000 set on the device not taken")
	}
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, e := range evs {
		if strings.Contains(e, "txqueuelen") {
			got = append(got, e)
		}
	}
	if want := []string{"ib0: txqueuelen 2000", "ib0: txqueuelen 3000"}; !slices.Equal(got, want) {
		t.Errorf("txqueuelen events %q, want %q", got, want)
	}
}
