// Package tests holds end-to-end tests that drive the real ipoibfs binary with real
// tools: daemons in network namespaces on a UDP fabric over loopback, ping, iperf3 and
// tshark.
package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"ipoibfs/internal/testenv"
)

var binPath string

func TestMain(m *testing.M) {
	if role := os.Getenv("IPOIBFS_E2E_ROLE"); role != "" {
		os.Exit(helperRole(role, os.Getenv("IPOIBFS_E2E_ADDR")))
	}
	dir, err := os.MkdirTemp("", "ipoibfs-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "ipoibfs")
	out, err := exec.Command("go", "build", "-o", binPath, "../cmd/ipoibfs").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building ipoibfs: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	// No goroutine may outlive the tests (go.uber.org/goleak, as in every package).
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// daemon is a running ipoibfs process.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  *testenv.Buffer
	done chan error
}

// startDaemon runs ipoibfs with args; on cleanup it sends SIGTERM and requires exit 0.
func startDaemon(t *testing.T, name string, args ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, daemonOpts{}, name, args...)
}

// daemonOpts are what startDaemonWith changes from startDaemon's defaults.
type daemonOpts struct {
	bin      string              // the binary (default: binPath)
	env      []string            // added to the environment
	exitWait time.Duration       // how long the cleanup waits after SIGTERM (default 10 s)
	logShown func(string) string // what of the log a failure shows (default all)
}

// startDaemonWith is startDaemon with o.
func startDaemonWith(t *testing.T, o daemonOpts, name string, args ...string) *daemon {
	t.Helper()
	if o.bin == "" {
		o.bin = binPath
	}
	if o.exitWait == 0 {
		o.exitWait = 10 * time.Second
	}
	if o.logShown == nil {
		o.logShown = func(s string) string { return s }
	}
	d := &daemon{name: name, log: &testenv.Buffer{}, done: make(chan error, 1)}
	// No mount and no 9P unless the test asks: several daemons share this host.
	base := []string{"-name", name, "-mount", "", "-9p", ""}
	d.cmd = exec.Command(o.bin, append(base, args...)...)
	if o.env != nil {
		d.cmd.Env = append(os.Environ(), o.env...)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-d.done:
			if err != nil {
				t.Errorf("%s exited with %v after SIGTERM; log:\n%s", name, err, o.logShown(d.log.String()))
			}
			// A device reader that took a lasting error for a passing one logs it in a
			// loop (it did, thousands of times, while the devices were deleted at exit).
			if n := strings.Count(d.log.String(), ": read from the kernel: "); n > 20 {
				t.Errorf("%s logged %d failed reads from the kernel: a reader spun", name, n)
			}
		case <-time.After(o.exitWait):
			_ = d.cmd.Process.Kill()
			<-d.done
			t.Errorf("%s did not exit within %v of SIGTERM; log:\n%s", name, o.exitWait, o.logShown(d.log.String()))
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, o.logShown(d.log.String()))
		}
	})
	return d
}

// netns returns a fresh namespace name, deleted at cleanup.
func netns(t *testing.T, tag string) string {
	t.Helper()
	n := fmt.Sprintf("ipo%d%s", os.Getpid()%100000, tag)
	_ = exec.Command("ip", "netns", "del", n).Run()
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	return n
}

func run(t *testing.T, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := run(t, 30*time.Second, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// waitLink waits until dev in ns exists and shows LOWER_UP (carrier).
func waitLink(t *testing.T, ns, dev string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := run(t, 5*time.Second, "ip", "-n", ns, "link", "show", dev)
		if strings.Contains(out, "LOWER_UP") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s never got carrier: %s", dev, ns, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitListening waits until a TCP port listens in namespace ns (ss -ltn), instead of
// guessing how long a server takes to start.
func waitListening(t *testing.T, ns string, port int) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		out, _ := run(t, 5*time.Second, "ip", "netns", "exec", ns, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port))
		if strings.TrimSpace(out) != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on port %d in %s", port, ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func requireE2E(t *testing.T) {
	testenv.Root(t)
	testenv.File(t, "/dev/net/tun")
	testenv.Tool(t, "ip")
	testenv.Tool(t, "ping")
}

// twoNodes starts node a hosting the SM on smAddr and node b joining it, each with its
// interfaces in its own namespace, and addresses ib0 in 10.N.0.0/24.
func twoNodes(t *testing.T, smAddr, bAddr, net string, extra ...string) (nsA, nsB string) {
	t.Helper()
	nsA, nsB = netns(t, "a"), netns(t, "b")
	startDaemon(t, "a", append([]string{"-sm", smAddr, "-netns", nsA}, extra...)...)
	startDaemon(t, "b", "-fabric", smAddr, "-listen", bAddr, "-netns", nsB)
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	mustRun(t, "ip", "-n", nsA, "addr", "add", net+".1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", net+".2/24", "dev", "ib0")
	return nsA, nsB
}

func TestPingBothWaysOverIB0(t *testing.T) {
	requireE2E(t)
	nsA, nsB := twoNodes(t, "127.0.1.1:4791", "127.0.1.2:4791", "10.61.0")
	out := mustRun(t, "ip", "-n", nsA, "link", "show", "ib0")
	if !strings.Contains(out, "mtu 2044") {
		t.Fatalf("ib0 MTU on a 2K broadcast group: %s", out)
	}
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.61.0.2")
	mustRun(t, "ip", "netns", "exec", nsB, "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.61.0.1")
	// IPv6 over the GUID-derived link-local addresses (neighbour discovery).
	ll := linkLocal(t, nsB, "ib0")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", ll+"%ib0")
}

func linkLocal(t *testing.T, ns, dev string) string {
	t.Helper()
	out := mustRun(t, "ip", "-n", ns, "-6", "addr", "show", "dev", dev, "scope", "link")
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "fe80::") {
			return strings.Split(f, "/")[0]
		}
	}
	t.Fatalf("no link-local address on %s: %s", dev, out)
	return ""
}

func TestIperf3TCP(t *testing.T) {
	requireE2E(t)
	nsA, nsB := twoNodes(t, "127.0.1.11:4791", "127.0.1.12:4791", "10.62.0")
	if out := iperf3(t, nsA, nsB, "10.62.0.2", 5299, "-t", "3"); !strings.Contains(out, `"sum_received"`) || strings.Contains(out, `"error"`) {
		t.Fatalf("iperf3 did not complete:\n%s", out)
	}
}

// iperf3 runs an iperf3 server for one test in namespace server on port and a client
// to dst:port in client with the extra arguments, and returns the client's JSON
// report; it fails the test if the client fails.
func iperf3(t *testing.T, client, server, dst string, port int, args ...string) string {
	t.Helper()
	iperf := testenv.Tool(t, "iperf3")
	p := strconv.Itoa(port)
	srv := exec.Command("ip", "netns", "exec", server, iperf, "-s", "-1", "-p", p)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	waitListening(t, server, port)
	out, err := run(t, 60*time.Second, "ip", append([]string{"netns", "exec", client, iperf, "-c", dst, "-p", p, "-J"}, args...)...)
	if err != nil {
		t.Fatalf("iperf3 to %s:%d: %v\n%s", dst, port, err, out)
	}
	return out
}

// TestTsharkDecodesARPAndICMP captures the fabric on loopback while the nodes ping and
// checks that tshark shows IPoIB ARP (hardware type 32, 20-byte addresses) and ICMP.
func TestTsharkDecodesARPAndICMP(t *testing.T) {
	requireE2E(t)
	tshark := testenv.Tool(t, "tshark")
	pcap := filepath.Join(t.TempDir(), "fabric.pcap")
	capture := exec.Command(tshark, "-n", "-i", "lo", "-f", "udp port 4791 and net 127.0.1.16/30", "-w", pcap)
	var stderr testenv.Buffer
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = capture.Process.Kill(); _ = capture.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "Capturing on") {
		if time.Now().After(deadline) {
			t.Fatalf("tshark did not start: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	nsA, _ := twoNodes(t, "127.0.1.17:4791", "127.0.1.18:4791", "10.63.0")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.63.0.2")
	time.Sleep(300 * time.Millisecond)
	_ = capture.Process.Signal(os.Interrupt)
	_ = capture.Wait()
	out := mustRun(t, tshark, "-n", "-r", pcap, "-T", "fields", "-E", "separator=|",
		"-e", "arp.hw.type", "-e", "arp.hw.size", "-e", "arp.dst.proto_ipv4", "-e", "icmp.type", "-e", "ip.dst")
	var arp, echo, reply bool
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, "|")
		if len(f) < 5 {
			continue
		}
		if f[0] == "32" && f[1] == "20" && f[2] == "10.63.0.2" {
			arp = true
		}
		if f[3] == "8" && strings.HasSuffix(f[4], "10.63.0.2") {
			echo = true
		}
		if f[3] == "0" && strings.HasSuffix(f[4], "10.63.0.1") {
			reply = true
		}
	}
	if !arp || !echo || !reply {
		t.Fatalf("tshark: ARP %v, echo %v, reply %v in:\n%s", arp, echo, reply, out)
	}
}
