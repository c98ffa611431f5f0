// Command udbench measures UD messages/s and bandwidth between two processes over the
// soft fabric's UDP transport on loopback, beside two UDP socket pairs measured in the
// same run: the best the kernel offers (GSO sends of a run of datagrams per system
// call, recvmmsg with UDP_GRO; the ratio is against this one) and one datagram per
// system call each way. The receiving side runs in a child process (this same binary),
// so every measurement crosses a real process boundary.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

const qkey = 0x0b1b

func main() {
	switch os.Getenv("UDBENCH_CHILD") {
	case "ud":
		childUD(os.Getenv("UDBENCH_SM"))
		return
	case "udp":
		childUDP()
		return
	case "gro":
		childGRO()
		return
	}
	dur := flag.Duration("d", 3*time.Second, "duration of each measurement")
	flag.Parse()
	fmt.Printf("UD messages between two processes over loopback, %v each; reference: UDP with GSO/GRO, same run\n", *dur)
	fmt.Printf("%-6s %14s %10s %16s %10s %8s %16s %8s\n", "size", "fabric msg/s", "MB/s", "gso/gro msg/s", "MB/s", "ratio", "1/syscall msg/s", "ratio")
	for _, size := range []int{2048, 4096} {
		fm, err := runUD(size, *dur)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udbench: fabric:", err)
			os.Exit(1)
		}
		gm, err := runGSO(size, *dur)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udbench: udp gso/gro:", err)
			os.Exit(1)
		}
		um, err := runUDP(size, *dur)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udbench: udp:", err)
			os.Exit(1)
		}
		fmt.Printf("%-6d %14.0f %10.1f %16.0f %10.1f %8.2f %16.0f %8.2f\n", size, fm, fm*float64(size)/1e6,
			gm, gm*float64(size)/1e6, fm/gm, um, fm/um)
	}
}

type child struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Scanner
}

func startChild(mode string, env ...string) (*child, string, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), "UDBENCH_CHILD="+mode), env...)
	r, w, _ := os.Pipe()
	cmd.Stdin = r
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	c := &child{cmd: cmd, in: w, out: bufio.NewScanner(out)}
	if !c.out.Scan() || !strings.HasPrefix(c.out.Text(), "READY ") {
		return nil, "", fmt.Errorf("child did not start: %q", c.out.Text())
	}
	return c, strings.TrimPrefix(c.out.Text(), "READY "), nil
}

// stop asks the child for its receive count and waits for it.
func (c *child) stop() (uint64, error) {
	fmt.Fprintln(c.in, "STOP")
	c.in.Close()
	var n uint64
	if !c.out.Scan() {
		return 0, fmt.Errorf("child ended without a count")
	}
	_, err := fmt.Sscanf(c.out.Text(), "COUNT %d", &n)
	_ = c.cmd.Wait()
	return n, err
}

func runUD(size int, dur time.Duration) (float64, error) {
	h, err := soft.New(soft.Config{Name: "bench-a", Network: soft.UDPNetwork{}, Listen: netip.MustParseAddrPort("127.0.0.1:0"), HostSM: true})
	if err != nil {
		return 0, err
	}
	defer h.Close()
	c, ready, err := startChild("ud", "UDBENCH_SM="+h.Endpoint(1).String())
	if err != nil {
		return 0, err
	}
	var lid, qpn uint32
	fmt.Sscanf(ready, "%d %d", &lid, &qpn)
	qp, _, err := openQP(h)
	if err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := h.CreateAH(verbs.AHAttr{Port: 1, DLID: verbs.LID(lid)}); err == nil && h.SoftPort(1).Attr().State == verbs.PortActive {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("port never became active")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // routes to the child
	ah, _ := h.CreateAH(verbs.AHAttr{Port: 1, DLID: verbs.LID(lid)})
	msg := make([]byte, size)
	wrs := make([]verbs.SendWR, 32)
	for i := range wrs {
		wrs[i] = verbs.SendWR{AH: ah, RemoteQPN: verbs.QPN(qpn), RemoteQKey: qkey, Data: [][]byte{msg}}
	}
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		if _, err := qp.PostSend(wrs); err != nil {
			return 0, err
		}
	}
	time.Sleep(100 * time.Millisecond)
	n, err := c.stop()
	return float64(n) / dur.Seconds(), err
}

// openQP returns a UD QP in RTS and its receive CQ.
func openQP(h *soft.HCA) (verbs.QP, verbs.CQ, error) {
	scq, _ := h.CreateCQ(verbs.CQAttr{Entries: 4096})
	rcq, _ := h.CreateCQ(verbs.CQAttr{Entries: 4096})
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: 1, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 1024, MaxRecvWR: 1024})
	if err != nil {
		return nil, nil, err
	}
	if err := verbs.UDToRTS(qp, 0, qkey); err != nil {
		return nil, nil, err
	}
	return qp, rcq, nil
}

func childUD(sm string) {
	h, err := soft.New(soft.Config{Name: "bench-b", Network: soft.UDPNetwork{}, Listen: netip.MustParseAddrPort("127.0.0.1:0"), SM: netip.MustParseAddrPort(sm)})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer h.Close()
	for h.SoftPort(1).Attr().State != verbs.PortActive {
		time.Sleep(5 * time.Millisecond)
	}
	qp, rcq, err := openQP(h)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	bufs := make([]verbs.RecvWR, 1024)
	for i := range bufs {
		bufs[i] = verbs.RecvWR{ID: uint64(i), Buf: make([]byte, 4096+40)}
	}
	qp.PostRecv(bufs)
	var count atomic.Uint64
	go func() {
		wcs := make([]verbs.WC, 256)
		re := make([]verbs.RecvWR, 0, 256)
		for range rcq.Notify() {
			for n := rcq.Poll(wcs); n > 0; n = rcq.Poll(wcs) {
				re = re[:0]
				for _, wc := range wcs[:n] {
					re = append(re, bufs[wc.WRID])
				}
				count.Add(uint64(n))
				qp.PostRecv(re)
			}
		}
	}()
	fmt.Printf("READY %d %d\n", h.SoftPort(1).Attr().LID, qp.Num())
	bufio.NewScanner(os.Stdin).Scan()
	fmt.Printf("COUNT %d\n", count.Load())
}

func runUDP(size int, dur time.Duration) (float64, error) {
	return runPair("udp", dur, func(conn *net.UDPConn, stop *atomic.Bool) error {
		msg := make([]byte, size)
		for !stop.Load() {
			for range 32 {
				conn.Write(msg)
			}
		}
		return nil
	})
}

// runPair measures a UDP socket pair: the child (mode) counts what send, writing to it
// until stop is set after dur, got through; it returns datagrams per second.
func runPair(mode string, dur time.Duration, send func(conn *net.UDPConn, stop *atomic.Bool) error) (float64, error) {
	c, addr, err := startChild(mode)
	if err != nil {
		return 0, err
	}
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		c.stop()
		return 0, err
	}
	conn, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		c.stop()
		return 0, err
	}
	defer conn.Close()
	var stop atomic.Bool
	time.AfterFunc(dur, func() { stop.Store(true) })
	if err := send(conn, &stop); err != nil {
		c.stop()
		return 0, err
	}
	time.Sleep(100 * time.Millisecond)
	n, err := c.stop()
	return float64(n) / dur.Seconds(), err
}

func childUDP() {
	childCount(func(conn *net.UDPConn, count *atomic.Uint64) error {
		go func() {
			buf := make([]byte, 65536)
			for {
				if _, err := conn.Read(buf); err != nil {
					return
				}
				count.Add(1)
			}
		}()
		return nil
	})
}

// childCount is a receiving child: a UDP socket on loopback whose datagrams receive
// counts, READY with its address, and the count once the parent says STOP.
func childCount(receive func(conn *net.UDPConn, count *atomic.Uint64) error) {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	conn.SetReadBuffer(4 << 20)
	var count atomic.Uint64
	if err := receive(conn, &count); err != nil {
		fmt.Println("ERR", err)
		return
	}
	fmt.Printf("READY %s\n", conn.LocalAddr())
	bufio.NewScanner(os.Stdin).Scan()
	fmt.Printf("COUNT %d\n", count.Load())
}

// runGSO measures the GSO/GRO socket pair.
func runGSO(size int, dur time.Duration) (float64, error) {
	return runPair("gro", dur, func(conn *net.UDPConn, stop *atomic.Bool) error {
		_, err := sendGSO(conn, size, stop)
		return err
	})
}

func childGRO() { childCount(receiveGRO) }
