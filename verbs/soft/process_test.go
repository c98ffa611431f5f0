package soft

import (
	"bufio"
	"bytes"
	"fmt"
	"go.uber.org/goleak"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"ipoibfs/verbs"
)

// TestMain lets the test binary act as a second fabric node in its own process.
func TestMain(m *testing.M) {
	if addr := os.Getenv("IPOIBFS_SOFT_CHILD_SM"); addr != "" {
		os.Exit(childNode(addr))
	}
	goleak.VerifyTestMain(m)
}

// childNode joins the UDP fabric at smAddr, prints "READY <lid> <qpn>", echoes every UD
// message it receives back to its sender, and on the stdin line "STATS" prints its
// port counters. It exits when stdin closes.
func childNode(smAddr string) int {
	sm := netip.MustParseAddrPort(smAddr)
	h, err := New(Config{Name: "child", Network: UDPNetwork{}, Listen: netip.MustParseAddrPort("127.0.0.1:0"), SM: sm, Heartbeat: testHB})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer h.Close()
	p := h.SoftPort(1)
	for p.Attr().State != verbs.PortActive {
		time.Sleep(time.Millisecond)
	}
	e, err := openUD(h, 0, 0x0b1b)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Printf("READY %d %d\n", p.Attr().LID, e.qp.Num())
	go func() {
		wc := make([]verbs.WC, 16)
		for range e.rcq.Notify() {
			for n := e.rcq.Poll(wc); n > 0; n = e.rcq.Poll(wc) {
				for _, c := range wc[:n] {
					buf := e.bufs[c.WRID].Buf
					ah, _ := h.CreateAH(verbs.AHAttr{Port: 1, DLID: c.SLID})
					_, _ = e.qp.PostSend([]verbs.SendWR{{AH: ah, RemoteQPN: c.SrcQP, RemoteQKey: 0x0b1b, Data: [][]byte{buf[40:c.ByteLen]}}})
					_, _ = e.qp.PostRecv([]verbs.RecvWR{e.bufs[c.WRID]})
				}
			}
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "STATS" {
			c := p.Counters()
			fmt.Printf("STATS badqkey=%d badpkey=%d\n", c.BadQKey, c.BadPKey)
		}
	}
	return 0
}

func TestTwoProcessesOverUDP(t *testing.T) {
	smh, err := New(Config{Name: "sm", Network: UDPNetwork{}, Listen: netip.MustParseAddrPort("127.0.0.1:0"), HostSM: true, Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	me := newUD(t, smh, 0, 0x0b1b)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IPOIBFS_SOFT_CHILD_SM="+smh.Endpoint(1).String())
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	readLine := func(prefix string) string {
		t.Helper()
		ch := make(chan string, 1)
		go func() {
			for lines.Scan() {
				if strings.HasPrefix(lines.Text(), prefix) {
					ch <- lines.Text()
					return
				}
			}
			close(ch)
		}()
		select {
		case l, ok := <-ch:
			if !ok {
				t.Fatalf("child exited before %q", prefix)
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatalf("child did not print %q", prefix)
		}
		return ""
	}
	var lid, qpn int
	if _, err := fmt.Sscanf(readLine("READY"), "READY %d %d", &lid, &qpn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "route to the child", func() bool {
		_, _, ok := smh.SoftPort(1).resolve(verbs.LID(lid), nil)
		return ok
	})
	for i := range 20 {
		msg := bytes.Repeat([]byte{byte(i)}, 2000+i)
		me.send(t, verbs.LID(lid), verbs.QPN(qpn), 0x0b1b, msg)
		wc, ok := me.recv(t, 5*time.Second)
		if !ok {
			t.Fatalf("no echo of message %d", i)
		}
		if got := me.bufFor(wc)[40:wc.ByteLen]; !bytes.Equal(got, msg) || wc.SLID != verbs.LID(lid) {
			t.Fatalf("echo %d: %d bytes from LID %d", i, len(got), wc.SLID)
		}
		_, _ = me.qp.PostRecv([]verbs.RecvWR{me.bufs[wc.WRID]})
	}
	// A Q_Key violation across processes is dropped and counted by the receiver.
	me.send(t, verbs.LID(lid), verbs.QPN(qpn), 0x0b1c, []byte("bad"))
	if _, ok := me.recv(t, 100*time.Millisecond); ok {
		t.Fatal("echo of a message with the wrong Q_Key")
	}
	fmt.Fprintln(stdin, "STATS")
	if got := readLine("STATS"); got != "STATS badqkey=1 badpkey=0" {
		t.Fatalf("child counters: %q", got)
	}
}
