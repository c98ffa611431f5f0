// Command scalebench measures how the daemon grows with what it holds, and prints the
// growth per item:
//
//  1. Children: N = 10, 100, 1000 (-n; 4000 is a flag away) created with create_child
//     and deleted with delete_child through the mounted tree, one write at a time as a
//     shell loop does: time per write, and the daemon's RSS, goroutines and TUN devices
//     before, at N and 3 s after deleting them (the daemon returns freed memory to the
//     system 2 s after deletions pause).
//  2. `cat kernel/debug/ipoib/ib0_mcg` with 10k multicast groups joined by an
//     application in the daemon's namespace (IP_ADD_MEMBERSHIP; the engine follows the
//     kernel's list), beside the same read with only the default groups.
//  3. 100 nodes on one in-process fabric (soft HCAs, one engine each, no devices): time
//     until every ib0 has carrier, Go heap and goroutines per node, and one broadcast ARP
//     from node 0 reaching all of them (every port's received-packet counter moves).
//
// Run as root from inside the repository: `go run ./bench/scalebench`. The daemon is
// built with -tags pprof for its goroutine count (net/http/pprof on loopback). It
// prints numbers only; no test asserts them (tests/scale_test.go bounds memory).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"ipoibfs/ipoib"
	"ipoibfs/verbs/soft"
)

var (
	sizes  = flag.String("n", "10,100,1000", "numbers of children to create and delete, comma separated")
	groups = flag.Int("groups", 10000, "multicast groups joined for the ib0_mcg read")
	nodes  = flag.Int("nodes", 100, "nodes on the in-process fabric")
	join   = flag.Int("join-groups", 0, "internal: join this many groups on ib0 and wait (run inside the namespace)")
)

var cleanups []func()

// quiet drops the in-process engines' log lines (a hundred nodes joining).
var quiet = log.New(io.Discard, "", 0)

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "scalebench: "+format+"\n", a...)
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	os.Exit(1)
}

func main() {
	flag.Parse()
	if *join > 0 {
		joinGroups(*join)
		return
	}
	if os.Geteuid() != 0 {
		die("needs root (FUSE mount, network namespace, TUN devices)")
	}
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	d := startDaemon()
	fmt.Printf("scalebench: one daemon (embedded fabric, tree at %s, netns %s)\n", d.mnt, d.ns)
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load: %s (shared machine: numbers move with it)\n", strings.Join(strings.Fields(string(la))[:3], " "))
	}
	fmt.Println()
	children(d)
	mcg(d)
	fabric()
}

// ---- the daemon ----

type daemon struct {
	mnt, ns, pprof string
	cmd            *exec.Cmd
}

func startDaemon() *daemon {
	tmp, err := os.MkdirTemp("", "scalebench")
	if err != nil {
		die("%v", err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(tmp) })
	bin := filepath.Join(tmp, "ipoibfs")
	if out, err := exec.Command("go", "build", "-tags", "pprof", "-o", bin, "./cmd/ipoibfs").CombinedOutput(); err != nil {
		die("go build: %v\n%s (run it from the repository)", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		die("%v", err)
	}
	addr := l.Addr().String()
	l.Close()
	d := &daemon{mnt: filepath.Join(tmp, "mnt"), ns: fmt.Sprintf("scale%d", os.Getpid()), pprof: addr}
	exec.Command("ip", "netns", "del", d.ns).Run()
	cleanups = append(cleanups, func() { exec.Command("ip", "netns", "del", d.ns).Run() })
	d.cmd = exec.Command(bin, "-name", "scale", "-mount", d.mnt, "-9p", "", "-netns", d.ns)
	d.cmd.Env = append(os.Environ(), "IPOIBFS_PPROF_ADDR="+addr)
	logf, err := os.Create(filepath.Join(tmp, "daemon.log"))
	if err != nil {
		die("%v", err)
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		die("start daemon: %v", err)
	}
	cleanups = append(cleanups, func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			d.cmd.Process.Kill()
			unix.Unmount(d.mnt, unix.MNT_DETACH)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.ReadFile(filepath.Join(d.mnt, "class/net/ib0/pkey")); err == nil && d.goroutines() > 0 {
			return d
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			die("daemon not ready after 20 s\n%s", b)
		}
	}
}

func (d *daemon) rssKiB() int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

func (d *daemon) goroutines() int {
	resp, err := http.Get("http://" + d.pprof + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "goroutine profile: total ")))
	return n
}

func (d *daemon) devices() int {
	out, _ := exec.Command("ip", "-n", d.ns, "-o", "link", "show").Output()
	return strings.Count(string(out), "\n") - 1 // lo
}

type snapshot struct{ rss, gor, dev int }

func (d *daemon) snap() snapshot { return snapshot{d.rssKiB(), d.goroutines(), d.devices()} }

// ---- 1. children ----

func children(d *daemon) {
	write := func(file string, k int) {
		p := filepath.Join(d.mnt, "class/net/ib0", file)
		if err := os.WriteFile(p, []byte(fmt.Sprintf("%#x\n", 0x8000+k)), 0); err != nil {
			die("%s %#x: %v", file, 0x8000+k, err)
		}
	}
	fmt.Println("children through the tree (one write each), daemon RSS / goroutines / TUN devices:")
	fmt.Printf("%6s %12s %12s   %-24s %-24s %-24s %s\n", "N", "create/op", "delete/op", "before", "at N", "3 s after deleting", "growth per child")
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 0x7ffe {
			die("-n: bad size %q", f)
		}
		before := d.snap()
		t0 := time.Now()
		for k := 1; k <= n; k++ {
			write("create_child", k)
		}
		create := time.Since(t0) / time.Duration(n)
		at := d.snap()
		t0 = time.Now()
		for k := 1; k <= n; k++ {
			write("delete_child", k)
		}
		del := time.Since(t0) / time.Duration(n)
		// The daemon hands freed memory back 2 s after deletions pause.
		time.Sleep(3 * time.Second)
		after := d.snap()
		fmt.Printf("%6d %12v %12v   %-24s %-24s %-24s %.0f KiB, %.1f goroutines\n", n, create.Round(time.Microsecond), del.Round(time.Microsecond),
			before, at, after, float64(at.rss-before.rss)/float64(n), float64(at.gor-before.gor)/float64(n))
		if n >= 1000 {
			fmt.Printf("%6s per 1000: create %v, delete %v (aim <= 2 s each); RSS %+.1f MiB (aim <= +20), after deleting %+.1f MiB from before (aim within 5)\n", "",
				(create * 1000).Round(time.Millisecond), (del * 1000).Round(time.Millisecond),
				float64(at.rss-before.rss)/1024*1000/float64(n), float64(after.rss-before.rss)/1024)
		}
	}
	fmt.Println()
}

func (s snapshot) String() string { return fmt.Sprintf("%d MiB/%d/%d", s.rss>>10, s.gor, s.dev) }

// ---- 2. ib0_mcg with many groups ----

func mcg(d *daemon) {
	path := filepath.Join(d.mnt, "kernel/debug/ipoib/ib0_mcg")
	timeRead := func() (time.Duration, int) {
		const reps = 10
		var size int
		t0 := time.Now()
		for range reps {
			b, err := os.ReadFile(path)
			if err != nil {
				die("read ib0_mcg: %v", err)
			}
			size = len(b)
		}
		return time.Since(t0) / reps, size
	}
	base, baseSize := timeRead()
	// Raise the namespace's per-socket limit, then let the joiner join them all.
	if out, err := exec.Command("ip", "netns", "exec", d.ns, "sysctl", "-q", "-w",
		fmt.Sprintf("net.ipv4.igmp_max_memberships=%d", *groups+10)).CombinedOutput(); err != nil {
		die("sysctl: %v %s", err, out)
	}
	self, _ := os.Executable()
	j := exec.Command("ip", "netns", "exec", d.ns, self, "-join-groups", strconv.Itoa(*groups))
	j.Stderr = os.Stderr
	stdin, _ := j.StdinPipe()
	if err := j.Start(); err != nil {
		die("joiner: %v", err)
	}
	defer func() { stdin.Close(); j.Wait() }()
	t0 := time.Now()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if strings.Count(string(b), "complete:       yes") >= *groups {
			break
		}
		if time.Now().After(deadline) {
			die("%d groups not all joined after 5 minutes", *groups)
		}
	}
	joined := time.Since(t0)
	full, size := timeRead()
	fmt.Printf("cat kernel/debug/ipoib/ib0_mcg: %v with the default groups (%d bytes); %v with %d more groups (%d bytes; all joined on the fabric %v after the application's joins); aim: < 50 ms with 10k groups\n\n",
		base.Round(time.Microsecond), baseSize, full.Round(time.Microsecond), *groups, size, joined.Round(time.Millisecond))
}

// joinGroups runs inside the namespace: UDP sockets join n groups on ib0 (a thousand
// each) and hold them until stdin closes.
func joinGroups(n int) {
	ifi, err := net.InterfaceByName("ib0")
	if err != nil {
		die("%v", err)
	}
	fd := -1
	for k := range n {
		if k%1000 == 0 { // a socket's memberships are bounded by its option memory (optmem_max)
			if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0); err != nil {
				die("%v", err)
			}
		}
		mr := &unix.IPMreqn{Multiaddr: [4]byte{239, 2, byte(k >> 8), byte(k)}, Ifindex: int32(ifi.Index)}
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mr); err != nil {
			die("join group %d: %v", k, err)
		}
	}
	io.Copy(io.Discard, os.Stdin)
}

// ---- 3. many nodes on one fabric ----

type countingHost struct{ got chan struct{} }

func (h *countingHost) Deliver(pkts [][]byte) {
	select {
	case h.got <- struct{}{}:
	default:
	}
}
func (h *countingHost) SetMTU(int)                 {}
func (h *countingHost) SetCarrier(bool)            {}
func (h *countingHost) SetOffloads(ipoib.Features) {}

func fabric() {
	n := *nodes
	var ms0 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	g0 := runtime.NumGoroutine()
	t0 := time.Now()
	net := soft.NewMemNetwork()
	smh, err := soft.New(soft.Config{Name: "sm", Network: net, HostSM: true})
	if err != nil {
		die("%v", err)
	}
	defer smh.Close()
	type nd struct {
		h    *soft.HCA
		e    *ipoib.Engine
		ib0  *ipoib.Interface
		host *countingHost
	}
	var ns []nd
	for k := range n {
		h, err := soft.New(soft.Config{Name: fmt.Sprintf("node%d", k), Network: net, SM: smh.Endpoint(1)})
		if err != nil {
			die("%v", err)
		}
		defer h.Close()
		e, err := ipoib.New(h, ipoib.Options{Logger: quiet})
		if err != nil {
			die("%v", err)
		}
		defer e.Close()
		ib0, _ := e.Interface("ib0")
		host := &countingHost{got: make(chan struct{}, 1)}
		ib0.AttachHost(host)
		if err := ib0.SetUp(true); err != nil {
			die("%v", err)
		}
		ns = append(ns, nd{h, e, ib0, host})
	}
	for _, x := range ns {
		for deadline := time.Now().Add(2 * time.Minute); !x.ib0.Carrier(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				die("%s: no carrier after 2 minutes", x.h.Name())
			}
		}
	}
	up := time.Since(t0)
	var ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	g1 := runtime.NumGoroutine()

	// One broadcast ARP: node 0 sends to node n-1's address; the request goes to the
	// IPoIB broadcast group and every port receives it.
	for k, x := range ns {
		x.ib0.SetHostAddrs([]netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, byte(k >> 8), byte(k + 1)}), 16)})
	}
	rcv := make([]uint64, n)
	for k, x := range ns {
		rcv[k] = x.h.SoftPort(1).Counters().RcvPackets
	}
	last := ns[n-1]
	dst := netip.AddrFrom4([4]byte{10, 9, byte((n - 1) >> 8), byte(n)})
	t0 = time.Now()
	ns[0].ib0.Transmit([][]byte{udp4(netip.AddrFrom4([4]byte{10, 9, 0, 1}), dst)})
	select {
	case <-last.host.got:
	case <-time.After(10 * time.Second):
		die("node %d never got the packet", n-1)
	}
	resolved := time.Since(t0)
	reached := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		reached = 0
		for k, x := range ns {
			if x.h.SoftPort(1).Counters().RcvPackets > rcv[k] {
				reached++
			}
		}
		if reached == n {
			break
		}
	}
	fmt.Printf("%d nodes on one in-process fabric: all ib0 with carrier after %v; Go heap +%.0f KiB and +%.1f goroutines per node\n",
		n, up.Round(time.Millisecond), float64(ms1.HeapInuse-ms0.HeapInuse)/1024/float64(n), float64(g1-g0)/float64(n))
	fmt.Printf("one broadcast ARP from node 0: answered and the packet delivered to node %d after %v; %d of %d ports received it\n",
		n-1, resolved.Round(time.Microsecond), reached, n)
}

// udp4 is a minimal IPv4/UDP packet from src to dst (checksum 0: none).
func udp4(src, dst netip.Addr) []byte {
	p := make([]byte, 28+8)
	p[0], p[8], p[9] = 0x45, 64, 17
	p[2], p[3] = 0, byte(len(p))
	s, d := src.As4(), dst.As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(p[i])<<8 | uint32(p[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	cs := ^uint16(sum)
	p[10], p[11] = byte(cs>>8), byte(cs)
	p[20], p[21], p[22], p[23] = 0x30, 0x39, 0x30, 0x39
	p[24], p[25] = 0, 16
	return p
}
