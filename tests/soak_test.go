package tests

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"ipoibfs/fs/ninep"
	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

// soakRSSCap is the most resident memory the daemon under attack may use.
const soakRSSCap = 256 << 20

// 9P message framing for hand-made requests.
func p9frame(typ byte, tag uint16, body ...byte) []byte {
	b := make([]byte, 7, 7+len(body))
	binary.LittleEndian.PutUint32(b, uint32(7+len(body)))
	b[4] = typ
	binary.LittleEndian.PutUint16(b[5:], tag)
	return append(b, body...)
}

func p9str(s string) []byte {
	b := binary.LittleEndian.AppendUint16(nil, uint16(len(s)))
	return append(b, s...)
}

const (
	p9Tversion = 100
	p9Tattach  = 104
	p9Twalk    = 110
	p9Tread    = 116
	p9Tclunk   = 120
	p9Tlopen   = 12
)

func p9version(msize uint32) []byte {
	return p9frame(p9Tversion, 0xffff, append(binary.LittleEndian.AppendUint32(nil, msize), p9str("9P2000.L")...)...)
}

func p9attach(tag uint16, fid uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, fid)
	b = binary.LittleEndian.AppendUint32(b, ^uint32(0)) // no afid
	b = append(b, p9str("")...)
	b = append(b, p9str("")...)
	b = binary.LittleEndian.AppendUint32(b, ^uint32(0)) // n_uname: none
	return p9frame(p9Tattach, tag, b...)
}

func p9walk(tag uint16, fid, newfid uint32, names ...string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, fid)
	b = binary.LittleEndian.AppendUint32(b, newfid)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(names)))
	for _, n := range names {
		b = append(b, p9str(n)...)
	}
	return p9frame(p9Twalk, tag, b...)
}

// hostile9P runs one kind of abuse against the 9P server at addr; it returns when the
// abuse is done or the server has closed the connection.
func hostile9P(addr, kind string) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	send := func(bs ...[]byte) {
		for _, b := range bs {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}
	drain := func() {
		go func() {
			buf := make([]byte, 64<<10)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
	}
	switch kind {
	case "tiny size":
		send([]byte{3, 0, 0, 0, 100, 0, 0})
	case "size beyond the message":
		send(binary.LittleEndian.AppendUint32(nil, 1<<20), []byte{100, 0, 0, 1, 2})
	case "huge size":
		send([]byte{0xff, 0xff, 0xff, 0xff, 100, 0, 0})
	case "garbage":
		b := make([]byte, 4096)
		for k := range b {
			b[k] = byte(k * 7)
		}
		send(b)
	case "huge msize":
		drain()
		send(p9version(0xffffffff), p9attach(1, 1), p9walk(2, 1, 2, "class", "net"))
	case "deep walk":
		drain()
		names := make([]string, 100)
		for k := range names {
			names[k] = "class"
		}
		send(p9version(65536), p9attach(1, 1), p9walk(2, 1, 2, names...), p9walk(3, 1, 3, ".."), p9walk(4, 1, 4, "class", "..", "net"))
	case "fid games":
		drain()
		send(p9version(65536), p9attach(1, 1), p9walk(2, 1, 2, "class"), p9walk(3, 1, 2, "class"),
			p9frame(p9Tclunk, 4, binary.LittleEndian.AppendUint32(nil, 2)...),
			p9frame(p9Tclunk, 5, binary.LittleEndian.AppendUint32(nil, 2)...),
			p9frame(p9Tclunk, 6, binary.LittleEndian.AppendUint32(nil, 99)...))
	case "huge read":
		drain()
		b := binary.LittleEndian.AppendUint32(nil, 2)
		b = binary.LittleEndian.AppendUint64(b, 0)
		b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
		send(p9version(65536), p9attach(1, 1), p9walk(2, 1, 2, "class", "net", "ib0", "mtu"),
			p9frame(p9Tlopen, 3, 2, 0, 0, 0, 0), p9frame(p9Tread, 4, b...))
	case "thousands of fids":
		drain()
		send(p9version(65536), p9attach(1, 1))
		for k := range 6000 {
			send(p9walk(uint16(k%60000+2), 1, uint32(k+2), "class"))
		}
	case "no reader": // pipelines requests and never reads a reply
		send(p9version(65536), p9attach(1, 1))
		for k := range 10000 {
			send(p9walk(uint16(k%60000+2), 1, uint32(k+100000), "class"))
		}
	case "slow sender":
		m := p9version(65536)
		for _, b := range m {
			send([]byte{b})
			time.Sleep(50 * time.Millisecond)
		}
	case "idle":
		time.Sleep(3 * time.Second)
	}
	time.Sleep(200 * time.Millisecond)
}

// udpDrops is the kernel's count of datagrams dropped for full receive buffers.
func udpDrops(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	var head []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "Udp: ") {
			continue
		}
		f := strings.Fields(l)
		if head == nil {
			head = f
			continue
		}
		for k, h := range head {
			if h == "RcvbufErrors" && k < len(f) {
				n, _ := strconv.ParseUint(f[k], 10, 64)
				return n
			}
		}
	}
	return 0
}

// capture records the payloads of UDP datagrams to dst on lo for d (AF_PACKET), so
// they can be replayed.
func capture(t *testing.T, dst *net.UDPAddr, d time.Duration) [][]byte {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP)))
	if err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	defer unix.Close(fd)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo.Index}); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	var out [][]byte
	buf := make([]byte, 65536)
	for end := time.Now().Add(d); time.Now().Before(end); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil || n < 28 || buf[9] != 17 {
			continue
		}
		ihl := int(buf[0]&0xf) * 4
		if !net.IP(buf[16:20]).Equal(dst.IP) || int(binary.BigEndian.Uint16(buf[ihl+2:])) != dst.Port {
			continue
		}
		out = append(out, append([]byte(nil), buf[ihl+8:n]...))
	}
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func rss(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Hostile input keeps the daemon serving: while two keyed daemons ping each other over
// ib0 and a shell keeps reading and writing the tree, malformed 9P of every kind and a
// flood of garbage, truncated, replayed and forged fabric packets hit the daemon. Pings
// keep going, every rejected packet the kernel delivered is counted, no forged message
// changes anything, other 9P clients are served, and memory stays under a cap.
func TestSoakHostileInput(t *testing.T) {
	requireE2E(t)
	key := writeKey(t, 0o600)
	mA := mountDir(t)
	nsA, nsB := treeNetns(t, "sa"), treeNetns(t, "sb") // no router solicitations: groups stay put
	port := treeFreePort(t)
	nineP := fmt.Sprintf("127.0.0.1:%d", port)
	const sm, node = "127.0.1.51:4791", "127.0.1.52:4791"
	da := startDaemon(t, "sa", "-sm", sm, "-fabric-key", key, "-netns", nsA, "-mount", mA, "-9p", nineP)
	startDaemon(t, "sb", "-fabric", sm, "-listen", node, "-fabric-key", key, "-netns", nsB)
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	waitTree(t, mA)
	mustRun(t, "ip", "-n", nsA, "addr", "add", "10.91.0.1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.91.0.2/24", "dev", "ib0")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "2", "-W", "3", "10.91.0.2")
	pid := da.cmd.Process.Pid
	rss0 := rss(t, pid)
	nodesBefore := sh(t, "cat "+mA+"/sm/nodes")
	// The kernel's own multicast joins settle after the addresses are added.
	groupsBefore := sh(t, "cat "+mA+"/sm/groups")
	for deadline := time.Now().Add(15 * time.Second); ; {
		time.Sleep(time.Second)
		g := sh(t, "cat "+mA+"/sm/groups")
		if g == groupsBefore || time.Now().After(deadline) {
			break
		}
		groupsBefore = g
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Background: a ping every 50 ms, and a shell reading and writing the tree.
	ping := exec.CommandContext(ctx, "ip", "netns", "exec", nsA, "ping", "-i", "0.05", "-W", "1", "10.91.0.2")
	pingOut := &strings.Builder{}
	ping.Stdout = pingOut
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	shell := exec.CommandContext(ctx, "bash", "-c", `while :; do
cat "$0"/class/net/ib0/mtu "$0"/kernel/debug/ipoib/ib0_mcg "$0"/sm/nodes >/dev/null || echo READ-FAILED
echo 2044 > "$0"/class/net/ib0/mtu || echo WRITE-FAILED
echo bogus > "$0"/class/net/ib0/mode 2>/dev/null && echo BOGUS-ACCEPTED
done`, mA)
	shellOut := &strings.Builder{}
	shell.Stdout = shellOut
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}

	// Replayable material: the real, signed management traffic to the SM for a moment.
	smAddr, _ := net.ResolveUDPAddr("udp", sm)
	nodeAddr, _ := net.ResolveUDPAddr("udp", node)
	captured := capture(t, smAddr, 1500*time.Millisecond)
	if len(captured) == 0 {
		t.Fatal("captured no management traffic to the subnet manager")
	}

	var wg sync.WaitGroup
	// 9P abuse, each kind several times, plus more idle connections than the bound.
	kinds := []string{"tiny size", "size beyond the message", "huge size", "garbage", "huge msize",
		"deep walk", "fid games", "huge read", "thousands of fids", "no reader", "slow sender"}
	for round := range 3 {
		for _, k := range kinds {
			wg.Add(1)
			go func() { defer wg.Done(); hostile9P(nineP, k) }()
		}
		_ = round
	}
	for range 300 {
		wg.Add(1)
		go func() { defer wg.Done(); hostile9P(nineP, "idle") }()
	}

	// The fabric flood: from our own socket (an address the SM does not know), to the
	// SM and to node b: garbage, truncated packets, replays of captured signed
	// messages, forged unsigned control messages and SA deletes, wrong P_Key and Q_Key.
	countersA := filepath.Join(mA, "class/infiniband/sa/ports/1/counters/port_rcv_errors")
	failures := filepath.Join(mA, "sm/auth_failures")
	rcvErr0, auth0 := readUint(t, countersA), readUint(t, failures)
	drops0 := udpDrops(t)
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 59)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mad := make([]byte, 256)
	mad[0], mad[1], mad[2], mad[3] = 1, 0x09, 1, 3
	forgedCtl := (&wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: 0},
		DETH: wire.DETH{SrcQP: 0}, Payload: mad}).AppendTo(nil, verbs.GID{}, verbs.GID{})
	saDelete := append([]byte(nil), mad...)
	saDelete[1], saDelete[2], saDelete[3] = 0x03, 2, 0x15
	forgedSA := (&wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: 1},
		DETH: wire.DETH{QKey: verbs.GSIQKey, SrcQP: 1}, Payload: saDelete}).AppendTo(nil, verbs.GID{}, verbs.GID{})
	wrongPKey := (&wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0x1234, DestQP: 0x48},
		DETH: wire.DETH{QKey: 0x0b1b, SrcQP: 0x48}, Payload: mad}).AppendTo(nil, verbs.GID{}, verbs.GID{})
	wrongQKey := (&wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: 0x48},
		DETH: wire.DETH{QKey: 0xdead, SrcQP: 0x48}, Payload: mad}).AppendTo(nil, verbs.GID{}, verbs.GID{})
	garbage := make([]byte, 300)
	for k := range garbage {
		garbage[k] = byte(k * 13)
	}
	sentToSM := 0
	floodEnd := time.Now().Add(10 * time.Second)
	for k := 0; time.Now().Before(floodEnd); k++ {
		var pkts [][]byte
		pkts = append(pkts, garbage, forgedCtl[:len(forgedCtl)/2], forgedCtl, forgedSA, wrongPKey, wrongQKey)
		pkts = append(pkts, captured[k%len(captured)])
		for _, p := range pkts {
			if _, err := conn.WriteToUDP(p, smAddr); err == nil {
				sentToSM++
			}
			_, _ = conn.WriteToUDP(p, nodeAddr)
		}
		if k%50 == 49 {
			time.Sleep(5 * time.Millisecond) // a high rate, but below what drops in the kernel
		}
	}
	wg.Wait()
	// Every packet the kernel delivered to the SM's port was refused and counted as a
	// receive error: it comes from an address the fabric does not know (malformed), is
	// garbage or truncated (malformed, bad ICRC), or is an unsigned or replayed control
	// message (bad MAC). Only datagrams the kernel itself dropped for a full socket
	// buffer (counted in /proc/net/snmp) can be missing.
	var counted, dropped uint64
	for deadline := time.Now().Add(10 * time.Second); ; {
		counted, dropped = readUint(t, countersA)-rcvErr0, udpDrops(t)-drops0
		if counted+dropped >= uint64(sentToSM) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("sent %d packets to the SM; its port counted %d as receive errors (%d MAC failures); the kernel dropped %d datagrams (all sockets)",
		sentToSM, counted, readUint(t, failures)-auth0, dropped)
	if counted > uint64(sentToSM) || counted+dropped < uint64(sentToSM) {
		t.Errorf("sent %d, counted %d, kernel drops %d: rejected packets went uncounted (or legitimate ones were counted)", sentToSM, counted, dropped)
	}
	if readUint(t, failures)-auth0 < uint64(sentToSM)/7 {
		t.Errorf("MAC failures %d for about %d unsigned and replayed control messages", readUint(t, failures)-auth0, sentToSM/7)
	}

	// Nothing the attack sent changed state.
	if got := sh(t, "cat "+mA+"/sm/nodes"); got != nodesBefore {
		t.Errorf("sm/nodes changed:\n%s\nwas\n%s", got, nodesBefore)
	}
	if got := sh(t, "cat "+mA+"/sm/groups"); got != groupsBefore {
		t.Errorf("sm/groups changed:\n%s\nwas\n%s", got, groupsBefore)
	}
	// Still serving: a fresh 9P client, the mount, and pings.
	cn, err := net.Dial("tcp", nineP)
	if err != nil {
		t.Fatalf("9P after the attack: %v", err)
	}
	c, err := ninep.NewClient(cn)
	if err != nil {
		t.Fatalf("9P after the attack: %v", err)
	}
	if b, err := c.ReadFile("class/net/ib0/pkey"); err != nil || string(b) != "0xffff\n" {
		t.Errorf("9P read after the attack: %q, %v", b, err)
	}
	c.Close()
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "3", "10.91.0.2")
	cancel()
	_ = ping.Wait()
	_ = shell.Wait()
	received := 0
	sc := bufio.NewScanner(strings.NewReader(pingOut.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "bytes from 10.91.0.2") {
			received++
		}
	}
	if received < 20 {
		t.Errorf("only %d pings answered during the attack:\n%s", received, pingOut)
	}
	if s := shellOut.String(); strings.Contains(s, "FAILED") || strings.Contains(s, "BOGUS-ACCEPTED") {
		t.Errorf("the shell's tree access failed during the attack:\n%.2000s", s)
	}
	r := rss(t, pid)
	t.Logf("daemon RSS %d MiB before, %d MiB after (cap %d MiB)", rss0>>20, r>>20, soakRSSCap>>20)
	if r > soakRSSCap {
		t.Errorf("daemon RSS %d MiB after the attack, cap %d MiB", r>>20, soakRSSCap>>20)
	}
}
