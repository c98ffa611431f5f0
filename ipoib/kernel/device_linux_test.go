//go:build linux

package kernel

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"go.uber.org/goleak"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"ipoibfs/internal/testenv"
)

// Test namespaces and devices are named ipt<pid><letter><n>: unique per run, and a
// later run can tell leftovers of a killed run (dead pid) from a concurrent one.
var (
	nameSeq   atomic.Int32
	staleName = regexp.MustCompile(`^ipt([0-9]+)[a-z][0-9]*$`)
)

// childEnv, when set, makes TestCurrentNamespace act as the child process started inside
// a namespace by the parent test.
const childEnv = "IPOIB_KERNEL_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" && os.Geteuid() == 0 {
		removeStaleNamespaces()
	}
	goleak.VerifyTestMain(m)
}

// removeStaleNamespaces deletes test namespaces left by runs that were killed.
func removeStaleNamespaces() {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		m := staleName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
			continue
		}
		_ = netns.DeleteNamed(e.Name())
	}
}

func prereqs(t *testing.T) {
	t.Helper()
	testenv.Root(t)
	testenv.File(t, "/dev/net/tun")
	testenv.Tool(t, "ip")
}

// uniq returns a fresh name for a namespace or device (at most 15 bytes).
func uniq(letter string) string {
	return fmt.Sprintf("ipt%d%s%d", os.Getpid(), letter, nameSeq.Add(1))
}

// testNS registers the removal of namespace name (which Open will create) and returns
// its name. Cleanups run last-in first-out, so devices opened afterwards close first.
func testNS(t *testing.T, letter string) string {
	t.Helper()
	name := uniq(letter)
	t.Cleanup(func() {
		if _, err := os.Stat("/run/netns/" + name); err == nil {
			if err := netns.DeleteNamed(name); err != nil {
				t.Errorf("delete netns %s: %v", name, err)
			}
		}
	})
	return name
}

// open opens a device with its carrier on, as the engine sets it once its port is
// active (a device comes out of Open without one).
func open(t *testing.T, cfg Config) *Device {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	if err := d.SetCarrier(true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close %s: %v", d.Name(), err)
		}
	})
	return d
}

// nlHandle returns a netlink handle in the named namespace.
func nlHandle(t *testing.T, ns string) *netlink.Handle {
	t.Helper()
	nsh, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func addAddr(t *testing.T, ns, dev, prefix string) {
	t.Helper()
	h := nlHandle(t, ns)
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(prefix)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags |= unix.IFA_F_NODAD
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s in %s: %v", prefix, dev, ns, err)
	}
}

func ipCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	return string(out), err
}

func linkShow(t *testing.T, ns, dev string) string {
	t.Helper()
	out, err := ipCmd(t, "-n", ns, "link", "show", "dev", dev)
	if err != nil {
		t.Fatalf("ip -n %s link show %s: %v: %s", ns, dev, err, out)
	}
	return out
}

// dirStats counts what one relay direction saw.
type dirStats struct {
	reads    atomic.Int64 // Read calls that returned packets
	multi    atomic.Int64 // of those, calls that returned >1 packets (a split super-packet or a burst)
	pkts     atomic.Int64 // packets returned by Read (= handed to Write)
	maxSize  atomic.Int64 // largest packet returned by Read
	readErr  atomic.Int64
	writeErr atomic.Int64
	lastErr  atomic.Value
}

func (s *dirStats) reset() {
	s.reads.Store(0)
	s.multi.Store(0)
	s.pkts.Store(0)
	s.maxSize.Store(0)
}

func (s *dirStats) String() string {
	return fmt.Sprintf("reads=%d multi=%d packets=%d max=%d readErr=%d writeErr=%d last=%v",
		s.reads.Load(), s.multi.Load(), s.pkts.Load(), s.maxSize.Load(), s.readErr.Load(), s.writeErr.Load(), s.lastErr.Load())
}

// relay copies every packet from one device to the other until from is closed: the
// "engine - fabric - engine" path with a zero-cost fabric. It reads into nbufs buffers
// of maxPacket bytes with Read and writes with Write, or, with rd.size set, reads into
// buffers of rd.size bytes with ReadOffset at rd.offset (the daemon's way) and writes
// them in place with WriteOffset.
func relay(from, to *Device, st *dirStats, nbufs int, rd readShape) {
	size := rd.size
	if size == 0 {
		size = maxPacket
	}
	bufs := make([][]byte, nbufs)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	sizes := make([]int, len(bufs))
	out := make([][]byte, len(bufs))
	for {
		var n int
		var err error
		if rd.size == 0 {
			n, err = from.Read(bufs, sizes)
		} else {
			n, err = from.ReadOffset(bufs, sizes, rd.offset)
		}
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			st.readErr.Add(1)
			st.lastErr.Store(err.Error())
			if n == 0 {
				continue
			}
		}
		if n == 0 {
			continue
		}
		st.reads.Add(1)
		if n > 1 {
			st.multi.Add(1)
		}
		st.pkts.Add(int64(n))
		for i := range n {
			if int64(sizes[i]) > st.maxSize.Load() {
				st.maxSize.Store(int64(sizes[i]))
			}
			out[i] = bufs[i][rd.offset : rd.offset+sizes[i]]
			if rd.size != 0 {
				out[i] = bufs[i][:rd.offset+sizes[i]] // written in place (WriteOffset)
			}
		}
		write := to.Write
		if rd.size != 0 {
			write = func(frames [][]byte) (int, error) { return to.WriteOffset(frames, rd.offset) }
		}
		if _, err := write(out[:n]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			st.writeErr.Add(1)
			st.lastErr.Store(err.Error())
		}
	}
}

type pair struct {
	nsA, nsB string
	a, b     *Device
	ab, ba   dirStats
	mtu      int
}

// newPair opens two devices in two fresh namespaces, addresses them 10.77.0.1/24 and
// 10.77.0.2/24 (and fd77::1/64, fd77::2/64), brings them up and relays between them.
func newPair(t *testing.T, mtu int, o Offloads) *pair {
	t.Helper()
	return newPairBufs(t, mtu, o, 0)
}

// readShape is how a relay reads: buffers of size bytes at offset (0: Read into
// maxPacket-byte buffers).
type readShape struct{ size, offset int }

// newPairBufs is newPair with relays reading into nbufs buffers (0: BatchSize).
func newPairBufs(t *testing.T, mtu int, o Offloads, nbufs int) *pair {
	t.Helper()
	return newPairRead(t, mtu, o, nbufs, readShape{})
}

// newPairRead is newPairBufs with relays reading as rd says.
func newPairRead(t *testing.T, mtu int, o Offloads, nbufs int, rd readShape) *pair {
	t.Helper()
	p := &pair{nsA: testNS(t, "a"), nsB: testNS(t, "b"), mtu: mtu}
	p.a = open(t, Config{Name: uniq("a"), MTU: mtu, NetNS: p.nsA, Offloads: o})
	p.b = open(t, Config{Name: uniq("b"), MTU: mtu, NetNS: p.nsB, Offloads: o})
	addAddr(t, p.nsA, p.a.Name(), "10.77.0.1/24")
	addAddr(t, p.nsB, p.b.Name(), "10.77.0.2/24")
	addAddr(t, p.nsA, p.a.Name(), "fd77::1/64")
	addAddr(t, p.nsB, p.b.Name(), "fd77::2/64")
	for _, d := range []*Device{p.a, p.b} {
		if err := d.SetUp(true); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	if nbufs == 0 {
		nbufs = p.a.BatchSize()
	}
	go func() { defer wg.Done(); relay(p.a, p.b, &p.ab, nbufs, rd) }()
	go func() { defer wg.Done(); relay(p.b, p.a, &p.ba, nbufs, rd) }()
	t.Cleanup(func() {
		p.a.Close()
		p.b.Close()
		wg.Wait()
		t.Logf("relay A->B: %v", &p.ab)
		t.Logf("relay B->A: %v", &p.ba)
	})
	return p
}

// rxPackets is the kernel's receive counter of a device: one per skb written into the
// TUN, so GRO super-packets count once.
func rxPackets(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	l, err := nlHandle(t, ns).LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Statistics.RxPackets
}

// txPackets is the kernel's transmit counter of a device: one per skb read from the
// TUN, so a super-packet counts once.
func txPackets(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	l, err := nlHandle(t, ns).LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Statistics.TxPackets
}

// transfer sends size pseudo-random bytes over TCP from a dialer in nsA to a listener
// on dst in nsB and checks they arrive intact. It returns the elapsed time.
func transfer(t *testing.T, nsA, nsB, dst string, size int) time.Duration {
	t.Helper()
	hA, err := netns.GetFromName(nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer hA.Close()
	hB, err := netns.GetFromName(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer hB.Close()

	var ln net.Listener
	if err := inNetNS(hB, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(dst, "0"))
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", nsB, err)
	}
	defer ln.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(60 * time.Second))

	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		h := sha256.New()
		n, err := io.Copy(h, c)
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.err = n, err
		got <- r
	}()

	data := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	rng.Read(data)
	want := sha256.Sum256(data)

	var c net.Conn
	if err := inNetNS(hA, func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", ln.Addr(), nsA, err)
	}
	start := time.Now()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		c.Close()
		t.Fatalf("send: %v", err)
	}
	c.Close()
	r := <-got
	elapsed := time.Since(start)
	if r.err != nil {
		t.Fatalf("receive: %v", r.err)
	}
	if r.n != int64(size) || r.sum != want {
		t.Fatalf("received %d bytes (sha256 %x), sent %d (sha256 %x)", r.n, r.sum[:8], size, want[:8])
	}
	return elapsed
}

func mbps(size int, d time.Duration) string {
	return fmt.Sprintf("%.2f Gbit/s", float64(size)*8/d.Seconds()/1e9)
}

func TestRelay(t *testing.T) {
	prereqs(t)
	const mtu = 4092 // IPoIB datagram mode on a 4K IB MTU
	all := Offloads{TxChecksum: true, TSO: true, GRO: true}
	p := newPair(t, mtu, all)
	size := 32 << 20
	if raceEnabled {
		size = 8 << 20
	}

	addrs, err := p.a.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s addresses: %v", p.a.Name(), addrs)
	for _, want := range []string{"10.77.0.1/24", "fd77::1/64"} {
		if !slices.Contains(addrs, netip.MustParsePrefix(want)) {
			t.Errorf("Addrs() = %v, want %s in it", addrs, want)
		}
	}

	t.Run("ping", func(t *testing.T) {
		testenv.Tool(t, "ping")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", p.nsA, "ping", "-c", "3", "-W", "2", "10.77.0.2").CombinedOutput()
		if err != nil {
			t.Fatalf("ping: %v\n%s", err, out)
		}
		t.Logf("%s", lastLine(string(out)))
	})

	// checkTSO transfers data A->B and checks what the kernel handed to A's Read.
	checkTSO := func(t *testing.T, dst string, wantSuper bool) {
		t.Helper()
		p.ab.reset()
		rx0 := rxPackets(t, p.nsB, p.b.Name())
		tx0 := txPackets(t, p.nsA, p.a.Name())
		el := transfer(t, p.nsA, p.nsB, dst, size)
		rx := rxPackets(t, p.nsB, p.b.Name()) - rx0
		tx := int64(txPackets(t, p.nsA, p.a.Name()) - tx0)
		reads, multi, pkts, maxSize := p.ab.reads.Load(), p.ab.multi.Load(), p.ab.pkts.Load(), p.ab.maxSize.Load()
		t.Logf("%d MB to %s in %v (%s); offloads %v; A kernel tx %d skbs; A Read: %d calls (%d of several packets) -> %d packets, largest %d; B kernel rx %d skbs",
			size>>20, dst, el.Round(time.Millisecond), mbps(size, el), p.a.Offloads(), tx, reads, multi, pkts, maxSize, rx)
		if maxSize > mtu {
			t.Errorf("Read returned a %d-byte packet, MTU %d", maxSize, mtu)
		}
		// Split super-packets make more packets than the kernel sent skbs. (A packet
		// still queued when the transfer ends may count on one side only.)
		if wantSuper && pkts < tx*3/2 {
			t.Errorf("TSO on but the kernel handed over no super-packets (%d skbs, %d packets)", tx, pkts)
		}
		if !wantSuper && pkts > tx+tx/100+10 {
			t.Errorf("TSO off but %d skbs became %d packets", tx, pkts)
		}
		// GRO coalesces within one Write batch; the relay writes what one Read returned,
		// so only split super-packets give it something to coalesce.
		if wantSuper && p.b.Offloads().GRO && rx*3/2 > uint64(pkts) {
			t.Errorf("GRO on: %d packets written into B became %d skbs, want coalescing", pkts, rx)
		}
	}

	t.Run("tcp4", func(t *testing.T) { checkTSO(t, "10.77.0.2", true) })
	t.Run("tcp6", func(t *testing.T) { checkTSO(t, "fd77::2", true) })

	t.Run("offloads", func(t *testing.T) {
		off := Offloads{TxChecksum: true, GRO: true}
		if err := p.a.SetOffloads(off); err != nil {
			t.Fatal(err)
		}
		if got := p.a.Offloads(); got != off {
			t.Errorf("Offloads() = %+v, want %+v", got, off)
		}
		checkTSO(t, "10.77.0.2", false)

		// No checksum offload implies no TSO (ethtool's rule).
		if err := p.a.SetOffloads(Offloads{TSO: true}); err != nil {
			t.Fatal(err)
		}
		if got := p.a.Offloads(); got != (Offloads{}) {
			t.Errorf("Offloads() after TSO without checksum = %+v, want all off", got)
		}
		checkTSO(t, "10.77.0.2", false)

		// GRO off on the writing side: every packet is its own skb.
		if err := p.b.SetOffloads(Offloads{TxChecksum: true, TSO: true}); err != nil {
			t.Fatal(err)
		}
		p.ab.reset()
		rx0 := rxPackets(t, p.nsB, p.b.Name())
		el := transfer(t, p.nsA, p.nsB, "10.77.0.2", size/4)
		rx := rxPackets(t, p.nsB, p.b.Name()) - rx0
		t.Logf("GRO off: %d MB in %v (%s), %d packets written, B kernel rx %d", size>>22, el.Round(time.Millisecond), mbps(size/4, el), p.ab.pkts.Load(), rx)
		// Coalescing would turn ~16 segments into one skb; allow for the odd packet the
		// kernel drops or counts late under load.
		if w := uint64(p.ab.pkts.Load()); rx < w*9/10 {
			t.Errorf("GRO off: %d packets written into B but only %d skbs", w, rx)
		}

		for _, d := range []*Device{p.a, p.b} {
			if err := d.SetOffloads(all); err != nil {
				t.Fatal(err)
			}
		}
		checkTSO(t, "10.77.0.2", true)
	})
}

// A Read takes the packets queued behind the first without waiting; a super-packet
// that the buffers left over cannot hold waits for the next Read, whole: with 64
// buffers at MTU 1500 (a 64 KB super-packet is 45 packets) the stream arrives intact
// with no read errors, and reads return bursts.
func TestReadBatchesQueuedPackets(t *testing.T) {
	prereqs(t)
	size := 16 << 20
	if raceEnabled {
		size = 4 << 20
	}
	for _, o := range []Offloads{{TxChecksum: true, TSO: true, GRO: true}, {TxChecksum: true, GRO: true}} {
		t.Run(fmt.Sprintf("tso%v", o.TSO), func(t *testing.T) {
			p := newPairBufs(t, 1500, o, 64)
			tx0 := txPackets(t, p.nsA, p.a.Name())
			transfer(t, p.nsA, p.nsB, "10.77.0.2", size)
			tx := int64(txPackets(t, p.nsA, p.a.Name()) - tx0)
			t.Logf("A kernel tx %d skbs; A relay: %v", tx, &p.ab)
			if n := p.ab.readErr.Load(); n != 0 {
				t.Errorf("%d read errors (last %v)", n, p.ab.lastErr.Load())
			}
			if p.ab.multi.Load() == 0 {
				t.Errorf("no Read returned more than one packet (%d skbs, %d reads)", tx, p.ab.reads.Load())
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Every MTU and offload combination the engine uses carries a TCP stream intact (the
// transfer checks a SHA-256 of what arrived). Rates belong to bench/netbench, which
// measures them against veth in the same run.
func TestTransferConfigurations(t *testing.T) {
	prereqs(t)
	size := 8 << 20
	for _, tc := range []struct {
		mtu int
		o   Offloads
	}{
		{1500, Offloads{TxChecksum: true, TSO: true, GRO: true}},
		{2044, Offloads{TxChecksum: true, TSO: true, GRO: true}},
		{4092, Offloads{TxChecksum: true, TSO: true, GRO: true}},
		{4092, Offloads{TxChecksum: true, TSO: true}},
		{4092, Offloads{}},
		{65520, Offloads{}},
		{65520, Offloads{TxChecksum: true}}, // partial checksums completed in place
	} {
		name := fmt.Sprintf("mtu%d_csum%v_tso%v_gro%v", tc.mtu, tc.o.TxChecksum, tc.o.TSO, tc.o.GRO)
		t.Run(name, func(t *testing.T) {
			p := newPair(t, tc.mtu, tc.o)
			transfer(t, p.nsA, p.nsB, "10.77.0.2", size)
		})
		// As the daemon reads (ReadBufferLen at ReadHeadroom: in place for a large
		// MTU), and into buffers that fit any read at the headroom: a super-packet
		// read in place is split from the read buffer, a plain packet stays.
		for _, rd := range []readShape{{ReadBufferLen(tc.mtu), ReadHeadroom}, {ReadHeadroom + maxPacket, ReadHeadroom}} {
			t.Run(fmt.Sprintf("%s_read%d@%d", name, rd.size, rd.offset), func(t *testing.T) {
				p := newPairRead(t, tc.mtu, tc.o, 0, rd)
				transfer(t, p.nsA, p.nsB, "10.77.0.2", size)
			})
		}
	}
}

func TestControl(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "c")
	// A device comes out of Open without a carrier (the engine's to give: its first
	// carrier is then a transition, which takes the kernel's operstate to "up").
	fresh, err := Open(Config{Name: uniq("c"), MTU: 2044, NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, fresh.Name()); !strings.Contains(out, "NO-CARRIER") {
		t.Errorf("a device fresh from Open, up: %s, want NO-CARRIER", out)
	}
	fresh.Close()
	d := open(t, Config{Name: uniq("c"), MTU: 2044, NetNS: ns})
	name := d.Name()

	if out := linkShow(t, ns, name); !strings.Contains(out, "mtu 2044") {
		t.Errorf("after Open with MTU 2044: %s", out)
	}
	if err := d.SetMTU(4092); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); !strings.Contains(out, "mtu 4092") {
		t.Errorf("after SetMTU(4092): %s", out)
	}
	if err := d.SetMTU(10); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("SetMTU(10) = %v, want an error naming %s", err, name)
	}

	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); !strings.Contains(out, ",UP,") && !strings.Contains(out, "<UP") {
		t.Errorf("after SetUp(true): %s", out)
	}
	if err := d.SetCarrier(false); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); !strings.Contains(out, "NO-CARRIER") {
		t.Errorf("after SetCarrier(false): %s", out)
	}
	if err := d.SetCarrier(true); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); strings.Contains(out, "NO-CARRIER") || !strings.Contains(out, "LOWER_UP") {
		t.Errorf("after SetCarrier(true): %s", out)
	}
	if err := d.SetUp(false); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); strings.Contains(out, ",UP") || strings.Contains(out, "<UP") {
		t.Errorf("after SetUp(false): %s", out)
	}

	// Addresses: Addrs and WatchAddrs see what `ip addr add` does.
	updates := make(chan []netip.Prefix, 16)
	d.WatchAddrs(func(l []netip.Prefix) { updates <- l })
	waitFor := func(what string, ok func([]netip.Prefix) bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case l := <-updates:
				if ok(l) {
					return
				}
			case <-timeout:
				t.Fatalf("WatchAddrs: no update with %s", what)
			}
		}
	}
	waitFor("the initial (empty) list", func(l []netip.Prefix) bool { return len(l) == 0 })
	v4 := netip.MustParsePrefix("10.78.0.1/24")
	v6 := netip.MustParsePrefix("fd78::1/64")
	if out, err := ipCmd(t, "-n", ns, "addr", "add", v4.String(), "dev", name); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	waitFor(v4.String(), func(l []netip.Prefix) bool { return slices.Contains(l, v4) })
	if out, err := ipCmd(t, "-n", ns, "addr", "add", v6.String(), "dev", name); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	waitFor(v6.String(), func(l []netip.Prefix) bool { return slices.Contains(l, v4) && slices.Contains(l, v6) })
	got, err := d.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, v4) || !slices.Contains(got, v6) {
		t.Errorf("Addrs() = %v, want %v and %v", got, v4, v6)
	}
	if out, err := ipCmd(t, "-n", ns, "addr", "del", v4.String(), "dev", name); err != nil {
		t.Fatalf("ip addr del: %v: %s", err, out)
	}
	waitFor("no "+v4.String(), func(l []netip.Prefix) bool { return !slices.Contains(l, v4) && slices.Contains(l, v6) })

	// Close removes the device and stops the watch.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := ipCmd(t, "-n", ns, "link", "show", "dev", name); err == nil {
		t.Errorf("device still exists after Close: %s", out)
	}
	for range len(updates) {
		<-updates
	}
	select {
	case l := <-updates:
		t.Errorf("WatchAddrs called after Close with %v", l)
	case <-time.After(200 * time.Millisecond):
	}
	if err := d.SetMTU(1500); !errors.Is(err, os.ErrClosed) {
		t.Errorf("SetMTU after Close = %v, want os.ErrClosed", err)
	}
	bufs, sizes := [][]byte{make([]byte, 65535)}, []int{0}
	if _, err := d.Read(bufs, sizes); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Read after Close = %v, want os.ErrClosed", err)
	}
	if _, err := d.Write([][]byte{{0x45}}); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close = %v, want os.ErrClosed", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "r")
	d := open(t, Config{Name: uniq("r"), NetNS: ns})
	errc := make(chan error, 1)
	go func() {
		bufs := make([][]byte, d.BatchSize())
		for i := range bufs {
			bufs[i] = make([]byte, 1500)
		}
		_, err := d.Read(bufs, make([]int, len(bufs)))
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	d.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("Read during Close = %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
}

func TestReadWriteArguments(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "w")
	d := open(t, Config{Name: uniq("w"), MTU: 2044, NetNS: ns})
	t.Logf("kernel accepts UDP segmentation offload (TUN_F_USO4|USO6): %v", d.uso)
	if got := d.BatchSize(); got < 64 {
		t.Errorf("BatchSize() = %d, want a batched device", got)
	}
	if _, err := d.Read([][]byte{make([]byte, 1500)}, []int{0}); err == nil || !strings.Contains(err.Error(), "MTU is 2044") {
		t.Errorf("Read with a 1500-byte buffer at MTU 2044 = %v", err)
	}
	if _, err := d.Read([][]byte{make([]byte, 2044), make([]byte, 2044)}, []int{0}); err == nil {
		t.Error("Read with too few sizes succeeded")
	}
	if n, err := d.Write([][]byte{{}}); n != 0 || err == nil {
		t.Errorf("Write of an empty packet = %d, %v", n, err)
	}
	if n, err := d.Write([][]byte{make([]byte, 65536)}); n != 0 || err == nil {
		t.Errorf("Write of a 65536-byte packet = %d, %v", n, err)
	}
	// A packet the kernel refuses is dropped and reported; the device is down, so the
	// kernel refuses everything (EIO), with and without GRO.
	for _, gro := range []bool{true, false} {
		if err := d.SetOffloads(Offloads{TxChecksum: true, TSO: true, GRO: gro}); err != nil {
			t.Fatal(err)
		}
		if n, err := d.Write([][]byte{{0x45, 0, 0, 20}}); n != 1 || err == nil || !strings.Contains(err.Error(), d.Name()) {
			t.Errorf("GRO %v: Write on a down device = %d, %v; want 1 and an error naming the device", gro, n, err)
		}
	}
	// No gso_max_segs above one Read's worth of buffers.
	l, err := nlHandle(t, ns).LinkByName(d.Name())
	if err != nil {
		t.Fatal(err)
	}
	if segs := l.Attrs().GSOMaxSegs; segs == 0 || int(segs) > d.BatchSize() {
		t.Errorf("gso_max_segs = %d, want <= %d", segs, d.BatchSize())
	}
}

func TestOpenErrors(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "e")
	d := open(t, Config{Name: uniq("e"), NetNS: ns})

	_, err := Open(Config{Name: d.Name(), NetNS: ns})
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), d.Name()) || !strings.Contains(err.Error(), ns) {
		t.Errorf("Open of an existing name = %v, want ErrExists naming device and namespace", err)
	}
	// The kernel side of the same check (IFF_TUN_EXCL), for a name that appears between
	// the lookup and the creation.
	nsh, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	err = inNetNS(nsh, func() error {
		fd, err := createTUN(d.Name(), false)
		if err == nil {
			unix.Close(fd)
		}
		return err
	})
	if !errors.Is(err, ErrExists) {
		t.Errorf("createTUN of an existing name = %v, want ErrExists", err)
	}
	// The same name in another namespace is fine.
	other := testNS(t, "f")
	open(t, Config{Name: d.Name(), NetNS: other})

	if _, err := Open(Config{Name: "bad/name"}); err == nil || !strings.Contains(err.Error(), "bad/name") {
		t.Errorf("Open with an invalid name = %v", err)
	}
	if _, err := Open(Config{Name: uniq("e"), NetNS: ns, MTU: 40}); err == nil || !strings.Contains(err.Error(), "MTU 40") {
		t.Errorf("Open with MTU 40 = %v", err)
	}
	if out, err := ipCmd(t, "-n", ns, "-o", "link", "show"); err != nil || strings.Count(out, "\n") != 2 {
		t.Errorf("after failed Opens, want lo and %s only in %s: %v\n%s", d.Name(), ns, err, out)
	}
}

func TestUnavailable(t *testing.T) {
	defer func(p string) { tunPath = p }(tunPath)
	tunPath = "/nonexistent/net/tun"
	_, err := Open(Config{Name: "iptunavail"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open without %s = %v, want ErrUnavailable", tunPath, err)
	}
	if s := err.Error(); !strings.HasPrefix(s, "kernel bridge unavailable: iptunavail: ") || !strings.Contains(s, tunPath) {
		t.Errorf("error text %q", s)
	}
}

// TestCurrentNamespace checks NetNS "" (the process's own namespace) in a child process
// started inside a fresh namespace, so the test never creates devices in the host's.
func TestCurrentNamespace(t *testing.T) {
	if dev := os.Getenv(childEnv); dev != "" {
		currentNamespaceChild(t, dev)
		return
	}
	prereqs(t)
	ns := testNS(t, "n")
	w, err := openNetNS(ns) // create it
	if err != nil {
		t.Fatal(err)
	}
	w.release()
	dev := uniq("n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, exe, "-test.run=^TestCurrentNamespace$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+dev)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestCurrentNamespace")) {
		t.Fatalf("child in %s: %v\n%s", ns, err, out)
	}
	if out, err := ipCmd(t, "-n", ns, "link", "show", "dev", dev); err == nil {
		t.Errorf("device left behind: %s", out)
	}
}

func currentNamespaceChild(t *testing.T, dev string) {
	d, err := Open(Config{Name: dev, MTU: 1400, Offloads: Offloads{TxChecksum: true, TSO: true, GRO: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	updates := make(chan []netip.Prefix, 16)
	d.WatchAddrs(func(l []netip.Prefix) { updates <- l })
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 1400 {
		t.Errorf("MTU %d", l.Attrs().MTU)
	}
	want := netip.MustParsePrefix("10.79.0.1/24")
	a, _ := netlink.ParseAddr(want.String())
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case l := <-updates:
			done = slices.Contains(l, want)
		case <-timeout:
			t.Fatal("WatchAddrs did not report the address")
		}
	}
	if got, err := d.Addrs(); err != nil || !slices.Contains(got, want) {
		t.Errorf("Addrs() = %v, %v", got, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(dev); err == nil {
		t.Error("device still exists after Close")
	}
}

// WaitReadable returns when the kernel has a packet for the device, also for one that
// was already queued when it was called (no new readiness edge comes for that), and
// with os.ErrClosed when the device closes.
func TestWaitReadable(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "w")
	d := open(t, Config{Name: uniq("w"), MTU: 1500, NetNS: ns})
	addAddr(t, ns, d.Name(), "10.78.0.1/24")
	// No IPv6 on it: bringing it up would queue solicitations and MLD reports.
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf."+d.Name()+".disable_ipv6=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v %s", err, out)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	fd := testenv.InNetns(t, ns, func() (int, error) { return unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0) })
	defer unix.Close(fd)
	send := func() {
		t.Helper()
		if err := unix.Sendto(fd, []byte("x"), 0, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{10, 78, 0, 2}}); err != nil {
			t.Fatal(err)
		}
	}
	waited := make(chan error, 1)
	go func() { waited <- d.WaitReadable() }()
	select {
	case err := <-waited:
		t.Fatalf("WaitReadable returned %v with nothing queued", err)
	case <-time.After(50 * time.Millisecond): // (a wrong early return shows here; a correct wait cannot be proven by time)
	}
	send()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	// Two queued; reading one leaves the other, for which no new edge comes.
	send()
	bufs := [][]byte{make([]byte, 1500)}
	if _, err := d.Read(bufs, make([]int, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Read(bufs, make([]int, 1)); err != nil { // the second packet of the two above
		t.Fatal(err)
	}
	send()
	send()
	if _, err := d.Read(bufs, make([]int, 1)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.WaitReadable() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReadable blocked with a packet queued")
	}
	if _, err := d.Read(bufs, make([]int, 1)); err != nil {
		t.Fatal(err)
	}
	go func() { done <- d.WaitReadable() }()
	d.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("WaitReadable during Close = %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReadable still blocked after Close")
	}
}

// A packet larger than the buffers a Read was given (the MTU raised while the read
// waited, as a switch to connected mode does) is not lost: Read says how large the
// buffers must be and keeps the packet, and the next Read with such buffers returns it.
// The MTU is raised behind the Device's back here, so that the short Read passes its
// own check of the buffers against the MTU it knows.
func TestReadKeepsAPacketLargerThanItsBuffers(t *testing.T) {
	prereqs(t)
	ns, d := ipv4Device(t, "k", "10.79.0.1/24")
	if out, err := ipCmd(t, "-n", ns, "link", "set", d.Name(), "mtu", "9000"); err != nil {
		t.Fatalf("ip link set mtu: %v %s", err, out)
	}
	fd := testenv.InNetns(t, ns, func() (int, error) { return unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0) })
	defer unix.Close(fd)
	payload := bytes.Repeat([]byte{0x5a}, 4000)
	if err := unix.Sendto(fd, payload, 0, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{10, 79, 0, 2}}); err != nil {
		t.Fatal(err)
	}
	sizes := make([]int, 4)
	small := [][]byte{make([]byte, 1500), make([]byte, 1500), make([]byte, 1500), make([]byte, 1500)}
	n, err := d.Read(small, sizes)
	need, ok := ShortBuffer(err)
	if n != 0 || !ok || need != 4028 {
		t.Fatalf("Read into 1500-byte buffers of a 4028-byte packet: %d packets, %v (short buffer %v, need %d)", n, err, ok, need)
	}
	big := [][]byte{make([]byte, need)}
	n, err = d.Read(big, sizes)
	if err != nil || n != 1 || sizes[0] != 4028 || !bytes.Equal(big[0][28:sizes[0]], payload) {
		t.Fatalf("the next Read: %d packets, %v, size %d", n, err, sizes[0])
	}
	// The kernel left the UDP checksum to the device (checksum offload): completed
	// once, on the packet as the kernel gave it.
	if l4Checksum(big[0][:sizes[0]]) != 0 {
		t.Fatalf("the kept packet's UDP checksum is wrong: %#04x", binary.BigEndian.Uint16(big[0][26:]))
	}
}

// Delete returns once the device is gone from its namespace (ip link does not show
// it, nor does the namespace's /sys/class/net), before the kernel's release of it has
// finished; WaitReleased then waits for the releases (the package's goroutines end:
// goleak checks after the tests), and a name can be taken again at once.
func TestDeleteReturnsWhenTheDeviceIsGone(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "d")
	const n = 20
	names := make([]string, n)
	devs := make([]*Device, n)
	for k := range devs {
		names[k] = uniq("d")
		d, err := Open(Config{Name: names[k], MTU: 2044, NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		devs[k] = d
	}
	h := nlHandle(t, ns)
	for k, d := range devs {
		if err := d.Delete(); err != nil {
			t.Fatalf("Delete %s: %v", names[k], err)
		}
		// At once (the kernel's release takes ~20 ms more), and then as a script sees it.
		if _, err := h.LinkByName(names[k]); !errors.As(err, new(netlink.LinkNotFoundError)) {
			t.Fatalf("%s: still found by name when Delete returned (%v)", names[k], err)
		}
		out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-c",
			"ip link show dev "+names[k]+" 2>&1; ls /sys/class/net").CombinedOutput()
		if err != nil {
			t.Fatalf("ip netns exec: %v %s", err, out)
		}
		if !strings.Contains(string(out), "does not exist") || slices.Contains(strings.Fields(string(out)), names[k]) {
			t.Fatalf("%s still there when Delete returned:\n%s", names[k], out)
		}
		if err := d.Delete(); err != nil { // twice: a no-op, as Close
			t.Errorf("second Delete of %s: %v", names[k], err)
		}
	}
	// A name is free again when Delete returns.
	d := open(t, Config{Name: names[0], MTU: 2044, NetNS: ns})
	if err := d.Delete(); err != nil {
		t.Fatal(err)
	}
	WaitReleased()
}

// A device someone moved to another namespace (no watch puts it back here) is gone
// from that namespace too when Delete returns: not being listed in its own namespace
// does not mean deleted.
func TestDeleteOfAMovedDevice(t *testing.T) {
	prereqs(t)
	ns, other := testNS(t, "v"), testNS(t, "w")
	ipMust(t, "netns", "add", other)
	h := nlHandle(t, other)
	// The release starts late, as on a busy machine: the device is not in its own
	// namespace from the start, so only waiting for the release finds it gone.
	beforeRelease = func() { time.Sleep(20 * time.Millisecond) }
	t.Cleanup(func() { beforeRelease = nil })
	for range 3 {
		d := open(t, Config{Name: uniq("v"), MTU: 2044, NetNS: ns})
		ipMust(t, "-n", ns, "link", "set", d.Name(), "netns", other)
		if err := d.Delete(); err != nil {
			t.Fatalf("Delete %s: %v", d.Name(), err)
		}
		if _, err := h.LinkByName(d.Name()); !errors.As(err, new(netlink.LinkNotFoundError)) {
			t.Fatalf("%s: still in the namespace it was moved to when Delete returned (%v)", d.Name(), err)
		}
	}
	WaitReleased()
}

// A Delete while another Delete closes the device returns, as the first does, once
// the kernel no longer lists it (it returned at once, before the other had started).
func TestDeleteWhileAnotherDeletes(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "x")
	d := open(t, Config{Name: uniq("x"), MTU: 2044, NetNS: ns})
	h := nlHandle(t, ns)
	beforeRelease = func() { time.Sleep(50 * time.Millisecond) } // the first's close starts late
	t.Cleanup(func() { beforeRelease = nil })
	first := make(chan error, 1)
	go func() { first <- d.Delete() }()
	time.Sleep(10 * time.Millisecond)
	if err := d.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.LinkByName(d.Name()); !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Fatalf("%s: still listed when the second Delete returned (%v)", d.Name(), err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	WaitReleased()
}

// threadsEnv, when set, makes TestDeleteLeavesNoThreads do its deletes (in a process
// of its own: a process that ran other tests has idle threads a release would reuse).
const threadsEnv = "IPOIB_KERNEL_TEST_THREADS"

// A thread blocked in close(2) for a release Delete left running exits with it: the
// runtime keeps idle threads for good, and deleting a thousand children one after
// another overlaps about twenty releases.
func TestDeleteLeavesNoThreads(t *testing.T) {
	if ns := os.Getenv(threadsEnv); ns != "" {
		devs := make([]*Device, 60)
		for k := range devs {
			devs[k] = open(t, Config{Name: uniq("t"), MTU: 2044, NetNS: ns})
		}
		before := threads(t)
		for _, d := range devs {
			if err := d.Delete(); err != nil {
				t.Fatal(err)
			}
		}
		WaitReleased()
		n := threads(t)
		t.Logf("%d threads after %d deletes, %d before", n, len(devs), before)
		// Other threads come and go (a P handed off while a thread waits in a netlink
		// call): a bound well below the one thread per delete the runtime kept before.
		if n > before+len(devs)/3 {
			t.Errorf("%d threads after %d deletes, %d before", n, len(devs), before)
		}
		return
	}
	prereqs(t)
	ns := testNS(t, "t")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestDeleteLeavesNoThreads$", "-test.v")
	cmd.Env = append(os.Environ(), threadsEnv+"="+ns)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestDeleteLeavesNoThreads")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "threads after") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// self is this process in prometheus/procfs.
func self(t *testing.T) procfs.Proc {
	t.Helper()
	p, err := procfs.Self()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// threads is the number of threads of this process.
func threads(t *testing.T) int {
	t.Helper()
	st, err := self(t).Stat()
	if err != nil {
		t.Fatal(err)
	}
	return st.NumThreads
}

// The devices of a namespace share its namespace file and netlink socket: a device
// holds one file descriptor of its own, its TUN (it held three).
func TestDeviceHoldsOneFileDescriptor(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "f")
	fds := func() int {
		n, err := self(t).FileDescriptorsLen()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The namespace's shared ones, and its monitor's (its goroutine subscribes).
	open(t, Config{Name: uniq("f"), MTU: 2044, NetNS: ns})
	before := fds()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if n := fds(); n != before {
			before = n
		} else {
			break
		}
	}
	const n = 10
	for range n {
		open(t, Config{Name: uniq("f"), MTU: 2044, NetNS: ns})
	}
	if got := fds() - before; got != n {
		t.Errorf("%d devices opened %d file descriptors, want %d (one each)", n, got, n)
	}
}

// A reader blocked on a device when it is deleted or closed (CloseAll: together with
// others, by one netlink request before the descriptors are closed), or when an
// administrator deletes it, gets os.ErrClosed, once: an unregistered TUN device polls as an error until its
// descriptor is closed, and a reader that took that for a passing error read it again
// and again (thousands of log lines at every daemon's stop).
func TestReadDuringDeleteEndsWithErrClosed(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "r")
	for _, how := range []string{"Delete", "Close", "CloseAll", "ip link del"} {
		d := open(t, Config{Name: uniq("r"), MTU: 2044, NetNS: ns})
		other := open(t, Config{Name: uniq("r"), MTU: 2044, NetNS: ns})
		if err := d.SetUp(true); err != nil {
			t.Fatal(err)
		}
		type res struct {
			other int
			err   error
		}
		done := make(chan res, 1)
		go func() {
			bufs := [][]byte{make([]byte, ReadBufferLen(2044))}
			sizes := make([]int, 1)
			var r res
			for {
				_, err := d.ReadOffset(bufs, sizes, ReadHeadroom)
				if err == nil {
					continue // a packet the kernel sent (IPv6 router solicitation)
				}
				if errors.Is(err, os.ErrClosed) || r.other > 100 {
					r.err = err
					done <- r
					return
				}
				r.other++
			}
		}()
		time.Sleep(20 * time.Millisecond) // blocked in the read
		var err error
		switch how {
		case "Delete":
			err = d.Delete()
		case "Close":
			err = d.Close()
		case "CloseAll":
			err = CloseAll([]*Device{d, other})
		case "ip link del": // by an administrator: the descriptor stays open
			err = nlHandle(t, ns).LinkDel(d.link)
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if !errors.Is(r.err, os.ErrClosed) || r.other != 0 {
				t.Errorf("%s: the reader ended with %v after %d other errors, want os.ErrClosed at once", how, r.err, r.other)
			}
			if unreg := errors.Is(r.err, ErrUnregistered); unreg != (how == "ip link del") {
				t.Errorf("%s: the reader's error %v says the kernel unregistered the device: %v", how, r.err, unreg)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the reader never returned", how)
		}
		other.Close()
		d.Close()
	}
	WaitReleased()
}

// A namespace deleted (ip netns del) while this process has devices in it is said at
// once (OnNamespaceGone), is not quietly made again for the next device, nor replaced
// by one of the same name made since: the next Open says the namespace is gone, until
// the old namespace's devices are gone too. Deleting it then says nothing.
func TestOpenAfterTheNamespaceWasDeleted(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "n")
	gone := make(chan string, 4)
	defer OnNamespaceGone(func(name string) {
		if name == ns {
			select {
			case gone <- name:
			default:
			}
		}
	})()
	d := open(t, Config{Name: uniq("n"), MTU: 2044, NetNS: ns}) // creates ns
	if err := netns.DeleteNamed(ns); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatalf("deleting namespace %s with a device in it was not said", ns)
	}
	if _, err := Open(Config{Name: uniq("n"), MTU: 2044, NetNS: ns}); !errors.Is(err, ErrNamespaceGone) {
		t.Fatalf("Open in the deleted namespace: %v, want ErrNamespaceGone", err)
	}
	if _, err := os.Stat("/run/netns/" + ns); err == nil {
		t.Fatalf("Open made a new namespace %s", ns)
	}
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	if _, err := Open(Config{Name: uniq("n"), MTU: 2044, NetNS: ns}); !errors.Is(err, ErrNamespaceGone) {
		t.Fatalf("Open in a namespace of the same name made since: %v, want ErrNamespaceGone", err)
	}
	// Once this process has no device left in the old namespace, the name is free to
	// mean the new one (a daemon run again in the same process, a test's -count=2).
	d.Close()
	WaitReleased()
	again, err := Open(Config{Name: uniq("n"), MTU: 2044, NetNS: ns})
	if err != nil {
		t.Fatalf("Open once the old namespace's devices are gone: %v", err)
	}
	again.Close()
	WaitReleased()
	// Its name is forgotten with its last device: the kernel reuses the inode number
	// that identified it.
	nsMu.Lock()
	_, remembered := nsSeen[ns]
	nsMu.Unlock()
	if remembered {
		t.Fatalf("namespace %s still remembered after its last device went", ns)
	}
	// With a device elsewhere, the watch runs on; deleting a namespace without
	// devices of ours says nothing.
	open(t, Config{Name: uniq("n"), MTU: 2044, NetNS: testNS(t, "n")})
	if err := netns.DeleteNamed(ns); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
		t.Fatalf("deleting namespace %s without devices in it was said", ns)
	case <-time.After(300 * time.Millisecond):
	}
}

// The ...IfChanged setters push a value unless the device holds it as far as this
// package knows: a value someone set since (not yet seen) stays; a device this package
// changed meanwhile gets the value.
func TestSetIfChanged(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "i")
	d := open(t, Config{Name: uniq("i"), MTU: 2044, NetNS: ns})
	name := d.Name()
	ip := func(args ...string) {
		t.Helper()
		ipMust(t, append([]string{"-n", ns, "link", "set", name}, args...)...)
	}
	ip("mtu", "2000") // someone's, not seen by the package (no watch)
	if err := d.SetMTUIfChanged(2044); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); !strings.Contains(out, "mtu 2000") {
		t.Errorf("SetMTUIfChanged(2044) over someone's 2000: %s, want 2000 kept", out)
	}
	if err := d.SetMTU(1800); err != nil {
		t.Fatal(err)
	}
	if err := d.SetMTUIfChanged(2000); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); !strings.Contains(out, "mtu 2000") {
		t.Errorf("SetMTUIfChanged(2000) after the package's own 1800: %s, want 2000", out)
	}
	ip("up")
	if err := d.SetUpIfChanged(false); err != nil { // the package last saw it down
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); !strings.Contains(out, ",UP") && !strings.Contains(out, "<UP") {
		t.Errorf("SetUpIfChanged(false) over someone's up: %s, want up kept", out)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if err := d.SetUpIfChanged(false); err != nil {
		t.Fatal(err)
	}
	if out := linkShow(t, ns, name); strings.Contains(out, ",UP") || strings.Contains(out, "<UP") {
		t.Errorf("SetUpIfChanged(false) after the package's own up: %s, want down", out)
	}
	mcast := func() bool { return strings.Contains(linkShow(t, ns, name), "MULTICAST") }
	ip("multicast", "off")
	if err := d.SetMulticastIfChanged(true); err != nil { // the package last saw it on
		t.Fatal(err)
	}
	if mcast() {
		t.Errorf("SetMulticastIfChanged(true) over someone's off: %s, want off kept", linkShow(t, ns, name))
	}
	if err := d.SetMulticast(false); err != nil {
		t.Fatal(err)
	}
	if err := d.SetMulticastIfChanged(true); err != nil { // after the package's own off
		t.Fatal(err)
	}
	if !mcast() {
		t.Errorf("SetMulticastIfChanged(true) after the package's own off: %s, want on", linkShow(t, ns, name))
	}
}

// GRO coalesces packets written in place from buffers that hold one packet each (as the
// engine's receive buffers do): a flow's head gets a larger buffer when the next
// segment joins it (growGRO, the wireguard fork's sixth patch), and the stream arrives
// intact (transfer checks a SHA-256).
func TestWriteInPlaceCoalesces(t *testing.T) {
	prereqs(t)
	const mtu = 2044
	p := newPairRead(t, mtu, Offloads{TxChecksum: true, TSO: true, GRO: true}, 0, readShape{ReadBufferLen(mtu), ReadHeadroom})
	p.ab.reset()
	rx0 := rxPackets(t, p.nsB, p.b.Name())
	transfer(t, p.nsA, p.nsB, "10.77.0.2", 8<<20)
	rx := rxPackets(t, p.nsB, p.b.Name()) - rx0
	pkts := p.ab.pkts.Load()
	t.Logf("%d packets written in place into B from %d-byte buffers became %d skbs", pkts, ReadBufferLen(mtu), rx)
	if pkts < 1000 || rx*3/2 > uint64(pkts) {
		t.Errorf("%d packets written in place into B became %d skbs, want coalescing", pkts, rx)
	}
}

// A stream written in place from one-packet buffers is coalesced by GRO into packets
// of at most 64 KiB: a grown buffer has the room for more, and a packet past 65535
// bytes would carry a wrapped IP length (the kernel trims it to that). The packets the
// device hands up (an AF_PACKET socket on it sees them before IP trims anything) each
// say their own length.
func TestWriteInPlaceKeepsLengths(t *testing.T) {
	prereqs(t)
	ns := testNS(t, "g")
	d := open(t, Config{Name: uniq("g"), MTU: 2044, NetNS: ns, Offloads: Offloads{TxChecksum: true, TSO: true, GRO: true}})
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	if err := d.SetCarrier(true); err != nil {
		t.Fatal(err)
	}
	addAddr(t, ns, d.Name(), "10.78.0.1/24")
	const ethPAll = 0x0300 // htons(ETH_P_ALL)
	fd := testenv.InNetns(t, ns, func() (int, error) {
		return unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, ethPAll)
	})
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: ethPAll, Ifindex: d.Index()}); err != nil {
		t.Fatal(err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})

	// 40 segments of one TCP flow, 1992 bytes of payload each, valid checksums, each
	// in a buffer that holds it and the frame offset, no more.
	const off, segs, payload = 44, 40, 1992
	src, dst := [4]byte{10, 78, 0, 2}, [4]byte{10, 78, 0, 1}
	frames := make([][]byte, segs)
	for k := range frames {
		f := make([]byte, off+40+payload)
		p := f[off:]
		putIPv4(p, 6, src, dst)
		tcp := p[20:]
		binary.BigEndian.PutUint16(tcp[0:], 40000)
		binary.BigEndian.PutUint16(tcp[2:], 5201)
		binary.BigEndian.PutUint32(tcp[4:], uint32(1000+k*payload))
		binary.BigEndian.PutUint32(tcp[8:], 1)
		tcp[12], tcp[13] = 5<<4, 0x10 // 20-byte header, ACK
		binary.BigEndian.PutUint16(tcp[14:], 65535)
		for j := range payload {
			tcp[20+j] = byte(k + j)
		}
		binary.BigEndian.PutUint16(tcp[16:], l4Checksum(p))
		frames[k] = f[:len(f):len(f)]
	}
	if _, err := d.WriteOffset(frames, off); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<17)
	total, largest := 0, 0
	for total < segs*payload {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			t.Fatalf("after %d of %d payload bytes: %v", total, segs*payload, err)
		}
		p := buf[:n]
		if n < 40 || p[0]>>4 != 4 || p[9] != 6 || binary.BigEndian.Uint16(p[20:]) != 40000 {
			continue // not ours (an RST the stack sends back goes out, not up)
		}
		if l := int(binary.BigEndian.Uint16(p[2:])); l != n {
			t.Fatalf("a %d-byte packet handed up says it has %d (coalesced past 64 KiB?)", n, l)
		}
		total += n - 40
		largest = max(largest, n)
	}
	if largest <= 2*(40+payload) {
		t.Errorf("largest packet handed up %d bytes: nothing coalesced", largest)
	}
	t.Logf("%d segments handed up as packets of up to %d bytes", segs, largest)
}

// ipv4Device opens an up device with checksum offload in a namespace of its own, with
// address prefix and no IPv6 (whose own packets would mix with a test's).
func ipv4Device(t *testing.T, letter, prefix string) (string, *Device) {
	t.Helper()
	ns := testNS(t, letter)
	d := open(t, Config{Name: uniq(letter), MTU: 1500, NetNS: ns, Offloads: Offloads{TxChecksum: true}})
	addAddr(t, ns, d.Name(), prefix)
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf."+d.Name()+".disable_ipv6=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v %s", err, out)
	}
	if err := d.SetUp(true); err != nil {
		t.Fatal(err)
	}
	return ns, d
}
