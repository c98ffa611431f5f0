// Command netbench measures IPoIB over the engine between two network namespaces beside
// a veth pair with the same MTU, measured in the same run: iperf3 single-stream TCP
// throughput and ping RTT, at MTU 2044 (2K broadcast group) and 4092 (4K group) with
// the kernel's large-send offload on and off, and in connected mode at MTU 65520. It
// prints the numbers and the ratios.
//
// Needs root, iperf3, ping, ethtool and ip; run it as `go run ./bench/netbench`.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var (
	dur     = flag.Duration("t", 5*time.Second, "iperf3 duration per measurement")
	binPath string
)

func main() {
	flag.Parse()
	for _, tool := range []string{"iperf3", "ping", "ethtool", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			die("netbench needs %s: %v", tool, err)
		}
	}
	dir, err := os.MkdirTemp("", "netbench")
	if err != nil {
		die("%v", err)
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "ipoibfs")
	if out, err := exec.Command("go", "build", "-o", binPath, "./cmd/ipoibfs").CombinedOutput(); err != nil {
		die("build: %v\n%s", err, out)
	}
	fmt.Printf("single-stream TCP (iperf3 %v) and ping RTT, two namespaces; reference: veth pair, same MTU, same run\n", *dur)
	fmt.Printf("%-6s %-9s %12s %12s %7s %10s %10s %7s\n", "MTU", "offloads", "ipoib Gb/s", "veth Gb/s", "ratio", "ipoib RTT", "veth RTT", "ratio")
	for _, mtu := range []int{2044, 4092, 65520} {
		for _, off := range []bool{true, false} {
			if mtu == 65520 && !off {
				continue // connected mode has no stateless offloads to switch
			}
			ib, err := measureIPoIB(dir, mtu, off)
			if err != nil {
				die("ipoib MTU %d: %v", mtu, err)
			}
			ve, err := measureVeth(mtu, off)
			if err != nil {
				die("veth MTU %d: %v", mtu, err)
			}
			mode := "on"
			if !off {
				mode = "off"
			}
			if mtu == 65520 {
				mode = "connected"
			}
			fmt.Printf("%-6d %-9s %12.2f %12.2f %7.2f %9.3fms %9.3fms %7.2f\n", mtu, mode,
				ib.gbps, ve.gbps, ib.gbps/ve.gbps, ib.rtt, ve.rtt, ib.rtt/ve.rtt)
		}
	}
}

type result struct {
	gbps float64
	rtt  float64 // ms
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "netbench: "+format+"\n", a...)
	os.Exit(1)
}

func sh(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func measureIPoIB(dir string, mtu int, offloads bool) (result, error) {
	nsA, nsB := "nbipa", "nbipb"
	for _, n := range []string{nsA, nsB} {
		sh("ip", "netns", "del", n)
		defer sh("ip", "netns", "del", n)
	}
	conf := filepath.Join(dir, "partitions.conf")
	enc := 4
	if mtu > 2044 {
		enc = 5
	}
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("Default=0x7fff, ipoib, mtu=%d : ALL=full;\n", enc)), 0o644); err != nil {
		return result{}, err
	}
	mA, mB := filepath.Join(dir, "mnt-a"), filepath.Join(dir, "mnt-b")
	a := exec.Command(binPath, "-name", "bench-a", "-sm", "127.0.3.1:4791", "-netns", nsA, "-partitions", conf, "-mount", mA, "-9p", "")
	b := exec.Command(binPath, "-name", "bench-b", "-fabric", "127.0.3.1:4791", "-listen", "127.0.3.2:4791", "-netns", nsB, "-mount", mB, "-9p", "")
	for _, c := range []*exec.Cmd{a, b} {
		if err := c.Start(); err != nil {
			return result{}, err
		}
		defer func(c *exec.Cmd) { c.Process.Signal(os.Interrupt); c.Wait() }(c)
	}
	for _, ns := range []string{nsA, nsB} {
		if err := waitCarrier(ns, "ib0"); err != nil {
			return result{}, err
		}
	}
	if mtu > 4092 {
		// Connected mode through the control tree, as a user would switch it.
		for _, m := range []string{mA, mB} {
			if err := waitFile(filepath.Join(m, "class/net/ib0/mode")); err != nil {
				return result{}, err
			}
			if err := os.WriteFile(filepath.Join(m, "class/net/ib0/mode"), []byte("connected\n"), 0); err != nil {
				return result{}, err
			}
		}
		for _, ns := range []string{nsA, nsB} {
			if err := waitCarrier(ns, "ib0"); err != nil {
				return result{}, err
			}
		}
	}
	return measurePair(nsA, nsB, "ib0", "ib0", mtu, offloads)
}

func measureVeth(mtu int, offloads bool) (result, error) {
	nsA, nsB := "nbvea", "nbveb"
	for _, n := range []string{nsA, nsB} {
		sh("ip", "netns", "del", n)
		if _, err := sh("ip", "netns", "add", n); err != nil {
			return result{}, err
		}
		defer sh("ip", "netns", "del", n)
	}
	if _, err := sh("ip", "-n", nsA, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", nsB); err != nil {
		return result{}, err
	}
	for _, x := range [][]string{{nsA, "v0"}, {nsB, "v1"}} {
		if _, err := sh("ip", "-n", x[0], "link", "set", x[1], "mtu", strconv.Itoa(mtu), "up"); err != nil {
			return result{}, err
		}
	}
	return measurePair(nsA, nsB, "v0", "v1", mtu, offloads)
}

func waitFile(p string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s never appeared (FUSE mount)", p)
}

func waitCarrier(ns, dev string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		out, _ := sh("ip", "-n", ns, "link", "show", dev)
		if strings.Contains(out, "LOWER_UP") {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s in %s has no carrier", dev, ns)
}

func measurePair(nsA, nsB, devA, devB string, mtu int, offloads bool) (result, error) {
	for _, x := range [][]string{{nsA, devA, "10.99.0.1/24"}, {nsB, devB, "10.99.0.2/24"}} {
		if _, err := sh("ip", "-n", x[0], "addr", "add", x[2], "dev", x[1]); err != nil {
			return result{}, err
		}
		if _, err := sh("ip", "-n", x[0], "link", "set", x[1], "mtu", strconv.Itoa(mtu)); err != nil {
			return result{}, err
		}
		state := "on"
		if !offloads {
			state = "off"
		}
		// Large send on the kernel side of the device; the engine segments in memory.
		// (In connected mode the engine has switched them off itself.)
		if mtu <= 4092 {
			if _, err := sh("ip", "netns", "exec", x[0], "ethtool", "-K", x[1], "tso", state, "gso", state); err != nil {
				return result{}, err
			}
		}
	}
	if _, err := sh("ip", "netns", "exec", nsA, "ping", "-c", "3", "-W", "2", "10.99.0.2"); err != nil {
		return result{}, err
	}
	srv := exec.Command("ip", "netns", "exec", nsB, "iperf3", "-s", "-1", "-p", "5399")
	if err := srv.Start(); err != nil {
		return result{}, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	time.Sleep(300 * time.Millisecond)
	out, err := sh("ip", "netns", "exec", nsA, "iperf3", "-c", "10.99.0.2", "-p", "5399", "-J",
		"-t", strconv.Itoa(int(dur.Seconds())))
	if err != nil {
		return result{}, err
	}
	var j struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		return result{}, fmt.Errorf("iperf3 output: %v", err)
	}
	pout, err := sh("ip", "netns", "exec", nsA, "ping", "-c", "50", "-i", "0.01", "-q", "10.99.0.2")
	if err != nil {
		return result{}, err
	}
	m := regexp.MustCompile(`= [0-9.]+/([0-9.]+)/`).FindStringSubmatch(pout)
	if m == nil {
		return result{}, fmt.Errorf("ping output: %s", pout)
	}
	rtt, _ := strconv.ParseFloat(m[1], 64)
	return result{gbps: j.End.SumReceived.BitsPerSecond / 1e9, rtt: rtt}, nil
}
