package tests

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
)

// helperRole runs this test binary as a TCP sink or source inside a namespace (started
// with `ip netns exec`): the sink prints the SHA-256 of everything it received, the
// source sends IPOIBFS_E2E_BYTES deterministic bytes and prints their SHA-256.
func helperRole(role, addr string) int {
	switch role {
	case "perm":
		return permRole(addr)
	case "sink":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		fmt.Println("READY")
		c, err := ln.Accept()
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		fmt.Printf("%d %x\n", n, h.Sum(nil))
		return 0
	case "source":
		total, _ := strconv.Atoi(os.Getenv("IPOIBFS_E2E_BYTES"))
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		h := sha256.New()
		r := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, 1<<16)
		for sent := 0; sent < total; {
			n := min(len(buf), total-sent)
			for k := 0; k+8 <= n; k += 8 {
				v := r.Uint64()
				for j := 0; j < 8; j++ {
					buf[k+j] = byte(v >> (8 * j))
				}
			}
			if _, err := c.Write(buf[:n]); err != nil {
				fmt.Println("ERR", err)
				return 1
			}
			h.Write(buf[:n])
			sent += n
		}
		c.Close()
		fmt.Printf("%d %x\n", total, h.Sum(nil))
		return 0
	}
	return 2
}

// transfer sends n bytes from nsA to addr (in nsB) and checks they arrive identical.
func transfer(t *testing.T, nsA, nsB, addr string, n int) {
	t.Helper()
	self, _ := os.Executable()
	sink := exec.Command("ip", "netns", "exec", nsB, self)
	sink.Env = append(os.Environ(), "IPOIBFS_E2E_ROLE=sink", "IPOIBFS_E2E_ADDR="+addr)
	out, _ := sink.StdoutPipe()
	if err := sink.Start(); err != nil {
		t.Fatal(err)
	}
	defer sink.Process.Kill()
	buf := make([]byte, 256)
	k, _ := out.Read(buf)
	if !strings.HasPrefix(string(buf[:k]), "READY") {
		t.Fatalf("sink: %q", buf[:k])
	}
	src := exec.Command("ip", "netns", "exec", nsA, self)
	src.Env = append(os.Environ(), "IPOIBFS_E2E_ROLE=source", "IPOIBFS_E2E_ADDR="+addr, "IPOIBFS_E2E_BYTES="+strconv.Itoa(n))
	sent, err := src.Output()
	if err != nil {
		t.Fatalf("source: %v %s", err, sent)
	}
	got, _ := io.ReadAll(out)
	_ = sink.Wait()
	if strings.TrimSpace(string(sent)) != strings.TrimSpace(string(got)) || !strings.HasPrefix(string(got), strconv.Itoa(n)+" ") {
		t.Fatalf("transfer differs: sent %q, received %q", sent, got)
	}
}

// TestConnectedModeEndToEnd: both daemons switch to connected mode through the tree;
// the MTU becomes 65520, 60000-byte pings work, iperf3 completes, and 100 MB arrive
// byte-identical with 2% loss and reordering injected on the fabric. tshark decodes
// the RC packets and the CM handshake.
func TestConnectedModeEndToEnd(t *testing.T) {
	requireE2E(t)
	testenv.Tool(t, "iperf3") // before the daemons start
	tshark := testenv.Tool(t, "tshark")
	pcap := filepath.Join(t.TempDir(), "rc.pcap")
	capture := exec.Command(tshark, "-n", "-i", "lo", "-f", "udp port 4791 and net 127.0.1.32/30", "-w", pcap, "-c", "3000")
	var stderr testenv.Buffer
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = capture.Process.Kill(); _ = capture.Wait() }()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "Capturing on"); {
		if time.Now().After(deadline) {
			t.Fatalf("tshark did not start: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)

	mA, mB := mountDir(t), mountDir(t)
	nsA, nsB := netns(t, "ca"), netns(t, "cb")
	startDaemon(t, "ca", "-sm", "127.0.1.33:4791", "-netns", nsA, "-mount", mA)
	startDaemon(t, "cb", "-fabric", "127.0.1.33:4791", "-listen", "127.0.1.34:4791", "-netns", nsB, "-mount", mB)
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	mustRun(t, "ip", "-n", nsA, "addr", "add", "10.71.0.1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.71.0.2/24", "dev", "ib0")
	// Traffic in datagram mode first: the daemons' reads from their TUN devices then
	// wait with buffers of the datagram-mode MTU when it grows to 65520 below.
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "1", "-W", "5", "10.71.0.2")
	for _, m := range []string{mA, mB} {
		waitTree(t, m)
		if hw := sh(t, "cat "+m+"/class/net/ib0/address"); !strings.HasPrefix(hw, "80:") {
			t.Fatalf("hardware address without the connected-mode flag: %s", hw)
		}
		sh(t, "echo connected > "+m+"/class/net/ib0/mode")
		if got := sh(t, "cat "+m+"/class/net/ib0/mode "+m+"/class/net/ib0/mtu"); got != "connected\n65520\n" {
			t.Fatalf("after echo connected: %q", got)
		}
	}
	if out := mustRun(t, "ip", "-n", nsA, "link", "show", "ib0"); !strings.Contains(out, "mtu 65520") {
		t.Fatalf("kernel MTU: %s", out)
	}
	// The first large packet each way is not lost.
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "1", "-W", "5", "-s", "60000", "10.71.0.2")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "3", "-s", "60000", "10.71.0.2")
	mustRun(t, "ip", "netns", "exec", nsB, "ping", "-c", "3", "-i", "0.2", "-W", "3", "-s", "60000", "10.71.0.1")

	if out := iperf3(t, nsA, nsB, "10.71.0.2", 5301, "-t", "2"); !strings.Contains(out, `"sum_received"`) {
		t.Fatalf("iperf3 in connected mode did not complete:\n%s", out)
	}

	sh(t, "echo 'loss 2% reorder 2%' > "+mA+"/sm/faults")
	if got := sh(t, "cat "+mA+"/sm/faults"); !strings.Contains(got, "loss 0.02\n") {
		t.Fatalf("sm/faults: %q", got)
	}
	size := 100 << 20
	if testing.Short() {
		size = 20 << 20
	}
	transfer(t, nsA, nsB, "10.71.0.2:5302", size)
	sh(t, "echo 'loss 0 reorder 0' > "+mA+"/sm/faults")

	_ = capture.Process.Signal(os.Interrupt)
	_ = capture.Wait()
	fields := mustRun(t, tshark, "-n", "-r", pcap, "-T", "fields", "-E", "separator=|",
		"-e", "infiniband.bth.opcode", "-e", "infiniband.mad.attributeid")
	var first, middle, last, req, rep, rtu bool
	for _, l := range strings.Split(fields, "\n") {
		f := strings.Split(l, "|")
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "0":
			first = true
		case "1":
			middle = true
		case "2":
			last = true
		}
		switch f[1] {
		case "0x0010":
			req = true
		case "0x0013":
			rep = true
		case "0x0014":
			rtu = true
		}
	}
	// MIDDLE packets are not required: the fabric sends a message's equal-sized
	// segments as one UDP GSO batch, and a capture on lo sees that batch unsegmented,
	// so tshark decodes only its first BTH (a FIRST, or a MIDDLE when a batch boundary
	// falls inside a message, which depends on timing).
	if !first || !last || !req || !rep || !rtu {
		t.Fatalf("tshark: RC first %v middle %v last %v, CM REQ %v REP %v RTU %v", first, middle, last, req, rep, rtu)
	}
}

// TestConnectedToDatagramPMTU: one side connected, the other datagram. Large pings from
// the connected side get "frag needed" with the UD MTU, and traffic then flows at that
// size (the kernel fragments to 2044).
func TestConnectedToDatagramPMTU(t *testing.T) {
	requireE2E(t)
	mA := mountDir(t)
	nsA, nsB := netns(t, "ma"), netns(t, "mb")
	startDaemon(t, "ma", "-sm", "127.0.1.41:4791", "-netns", nsA, "-mount", mA)
	startDaemon(t, "mb", "-fabric", "127.0.1.41:4791", "-listen", "127.0.1.42:4791", "-netns", nsB)
	waitTree(t, mA)
	sh(t, "echo connected > "+mA+"/class/net/ib0/mode")
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	mustRun(t, "ip", "-n", nsA, "addr", "add", "10.72.0.1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.72.0.2/24", "dev", "ib0")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "2", "-W", "2", "10.72.0.2")
	// The first large packet is dropped and answered with fragmentation-needed.
	out, _ := run(t, 20*time.Second, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.3", "-W", "2", "-M", "do", "-s", "5000", "10.72.0.2")
	if !strings.Contains(out, "mtu = 2044") && !strings.Contains(out, "mtu=2044") {
		t.Fatalf("no frag-needed with MTU 2044:\n%s", out)
	}
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-s", "5000", "10.72.0.2")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "2", "-M", "do", "-s", "2016", "10.72.0.2")
}
