package soft

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// TestTsharkDecodesLiveFabric captures the UDP fabric on loopback with tshark and checks
// that a real SA join and a UD message carrying IPv4 decode as RoCEv2 / MAD / IPv4.
func TestTsharkDecodesLiveFabric(t *testing.T) {
	testenv.Root(t)
	tshark := testenv.Tool(t, "tshark")
	dir := t.TempDir()
	pcap := filepath.Join(dir, "fabric.pcap")
	smAddr := netip.MustParseAddrPort("127.0.0.61:4791")
	nodeAddr := netip.MustParseAddrPort("127.0.0.62:4791")

	capture := exec.Command(tshark, "-n", "-i", "lo", "-f", "udp port 4791 and host 127.0.0.61", "-w", pcap)
	var stderr testenv.Buffer
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = capture.Process.Signal(os.Interrupt)
			_ = capture.Wait()
		}
	}
	defer stop()
	waitFor(t, "tshark to start capturing", func() bool { return strings.Contains(stderr.String(), "Capturing on") })

	smh, err := New(Config{Name: "sm", Network: UDPNetwork{}, Listen: smAddr, HostSM: true, Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	node, err := New(Config{Name: "a", Network: UDPNetwork{}, Listen: nodeAddr, SM: smAddr, Heartbeat: testHB})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	waitFor(t, "node active", func() bool { return node.SoftPort(1).Attr().State == verbs.PortActive })
	waitFor(t, "routes", func() bool {
		_, _, ok := node.SoftPort(1).resolve(1, nil)
		return ok
	})

	p := node.SoftPort(1)
	g, _ := p.GID(0)
	bcast := mustGID(t, "ff12:401b:ffff::ffff:ffff")
	dst := newUD(t, smh, 0, 0x0b1b)
	src := newUD(t, node, 0, 0x0b1b)
	// scan reads what the capture has written so far: whether it holds the SA join (an
	// SA Set(MCMemberRecord) to QP1 with the GSI Q_Key) and the UD message with IPv4.
	scan := func() (sawJoin, sawIPv4 bool, out []byte) {
		out, err := exec.Command(tshark, "-n", "-r", pcap, "-T", "fields", "-E", "separator=|",
			"-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.deth.q_key",
			"-e", "infiniband.mad.mgmtclass", "-e", "infiniband.mcmemberrecord.mgid",
			"-e", "infiniband.mcmemberrecord.portgid", "-e", "infiniband.mcmemberrecord.joinstate",
			"-e", "ip.dst", "-e", "icmp.type").CombinedOutput()
		if err != nil && len(out) == 0 {
			return false, false, []byte(err.Error())
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Split(l, "|")
			if len(f) < 9 {
				continue
			}
			if f[1] == "0x000001" && f[2] == "0x0000000080010000" && f[3] == "0x03" &&
				f[4] == "ff12:401b:ffff::ffff:ffff" && f[5] == g.String() && f[6] == "0x01" {
				sawJoin = true
			}
			// ip.dst holds the outer and the inner IPv4 destination.
			if f[0] == "100" && f[2] == "0x0000000000000b1b" && strings.Contains(f[7], "10.0.0.2") && f[8] == "8" {
				sawIPv4 = true
			}
		}
		return sawJoin, sawIPv4, out
	}
	// tshark says "Capturing on" slightly before it really captures, and writes the
	// file in its own time: repeat the exchange (joins are idempotent) until the file
	// holds a round of it.
	var sawJoin, sawIPv4 bool
	var out []byte
	for round := 0; round < 40 && !(sawJoin && sawIPv4); round++ {
		if _, err := (&sa.Client{Port: p}).Join(context.Background(),
			mad.MCMemberRecord{MGID: bcast, PortGID: g, PKey: 0xffff, JoinState: mad.JoinFull}, mad.IPoIBBroadcastJoinMask); err != nil {
			t.Fatal(err)
		}
		src.send(t, 1, dst.qp.Num(), 0x0b1b, ipoibICMP())
		if _, ok := dst.recv(t, 2*time.Second); !ok {
			t.Fatal("UD message not delivered")
		}
		time.Sleep(100 * time.Millisecond) // a poll interval for the file, not a synchronisation
		sawJoin, sawIPv4, out = scan()
	}
	stop()
	if os.Getenv("IPOIBFS_KEEP_PCAP") != "" {
		exec.Command("cp", pcap, "/tmp/fabric.pcap").Run()
	}
	if !sawJoin || !sawIPv4 {
		t.Fatalf("tshark did not decode the join (%v) or the IPv4 payload (%v):\n%s", sawJoin, sawIPv4, out)
	}
}

// ipoibICMP returns an IPoIB-encapsulated IPv4 ICMP echo request 10.0.0.1 -> 10.0.0.2.
func ipoibICMP() []byte {
	ip := []byte{0x45, 0, 0, 28, 0, 1, 0, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
		8, 0, 0, 0, 0x12, 0x34, 0, 1}
	binary.BigEndian.PutUint16(ip[10:], csum(ip[:20]))
	binary.BigEndian.PutUint16(ip[22:], csum(ip[20:]))
	return append([]byte{0x08, 0x00, 0, 0}, ip...)
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
