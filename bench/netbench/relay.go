package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The latency reference for the daemon's own design: the smallest Go program that moves
// IP packets between a TUN device and a UDP socket on loopback, one goroutine and one
// packet per system call each way, nothing else. A ping over two of them crosses the
// same kernel paths and process wakeups as one over two daemons (TUN read, UDP send,
// UDP receive, TUN write, each side), none of the engine: the difference between its
// RTT and veth's is what the TUN-and-UDP design costs before any IPoIB work is done.
var relayArgs = flag.String("relay", "", "internal: run the TUN<->UDP relay reference: DEV,LOCAL,REMOTE")

// serveRelay creates the TUN device and relays until killed.
func serveRelay(spec string) {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		die("-relay wants DEV,LOCAL,REMOTE, not %q", spec)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		die("relay: /dev/net/tun: %v", err)
	}
	ifr, err := unix.NewIfreq(f[0])
	if err != nil {
		die("relay: %v", err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		die("relay: TUNSETIFF %s: %v", f[0], err)
	}
	if err := unix.SetNonblock(fd, true); err != nil { // the runtime's poller, as the daemon's TUN
		die("relay: %v", err)
	}
	tun := os.NewFile(uintptr(fd), f[0])
	la, err := net.ResolveUDPAddr("udp", f[1])
	if err != nil {
		die("relay: %v", err)
	}
	ra, err := net.ResolveUDPAddr("udp", f[2])
	if err != nil {
		die("relay: %v", err)
	}
	c, err := net.ListenUDP("udp", la)
	if err != nil {
		die("relay: %v", err)
	}
	go func() {
		b := make([]byte, 65536)
		for {
			n, _, err := c.ReadFromUDP(b)
			if err != nil {
				die("relay: %v", err)
			}
			tun.Write(b[:n]) // a write the kernel refuses is a lost packet, as on a wire
		}
	}()
	fmt.Println("ready")
	b := make([]byte, 65536)
	for {
		n, err := tun.Read(b)
		if err != nil {
			die("relay: %v", err)
		}
		c.WriteToUDP(b[:n], ra)
	}
}

// measureRelay pings across two relays in two namespaces and returns the mean RTT in
// ms, 10 ms apart and back to back (floodRTT).
func measureRelay(mtu int) (rtt, flood float64, err error) {
	nss, devs := [2]string{"nbrla", "nbrlb"}, [2]string{"nbrl0", "nbrl1"}
	addrs := [2]string{"127.0.3.11:4792", "127.0.3.12:4792"}
	_, stop, err := startRelays(nss, devs, func(k int) []string {
		return []string{"-relay", devs[k] + "," + addrs[k] + "," + addrs[1-k]}
	})
	defer stop()
	if err != nil {
		return 0, 0, err
	}
	for k, ns := range nss {
		addr := fmt.Sprintf("10.99.0.%d/24", k+1)
		if _, err := sh("ip", "-n", ns, "addr", "add", addr, "dev", devs[k]); err != nil {
			return 0, 0, err
		}
		if _, err := sh("ip", "-n", ns, "link", "set", devs[k], "mtu", strconv.Itoa(mtu), "up"); err != nil {
			return 0, 0, err
		}
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := sh("ip", "netns", "exec", nss[0], "ping", "-c", "1", "-w", "15", "10.99.0.2"); err != nil {
		return 0, 0, err
	}
	if rtt, err = pingRTT(nss[0]); err != nil {
		return 0, 0, err
	}
	flood, err = floodRTT(nss[0])
	return rtt, flood, err
}

// startRelays makes the two namespaces, runs this program with args(k) for each side
// (a relay that creates device devs[k] and says "ready") and moves the device into
// its namespace; stop kills the relays and deletes the namespaces, whatever failed.
func startRelays(nss, devs [2]string, args func(k int) []string) (cmds []*exec.Cmd, stop func(), err error) {
	stop = func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		for _, ns := range nss {
			sh("ip", "netns", "del", ns)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, stop, err
	}
	for k, ns := range nss {
		sh("ip", "netns", "del", ns)
		if _, err := sh("ip", "netns", "add", ns); err != nil {
			return cmds, stop, err
		}
		cmd, err := startHelper(self, args(k)...)
		if err != nil {
			return cmds, stop, fmt.Errorf("relay %s: %v", devs[k], err)
		}
		cmds = append(cmds, cmd)
		// The device moves into the namespace; the relay's descriptor stays attached.
		if _, err := sh("ip", "link", "set", devs[k], "netns", ns); err != nil {
			return cmds, stop, err
		}
	}
	return cmds, stop, nil
}

// startHelper runs this program with args and waits for its "ready".
func startHelper(self string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with netbench, interrupted too
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make([]byte, 6)
	if _, err := io.ReadFull(out, ready); err != nil || string(ready) != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("did not start: %v", err)
	}
	return cmd, nil
}
