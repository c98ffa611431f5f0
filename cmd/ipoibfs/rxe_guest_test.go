//go:build rdma && linux

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
	"ipoibfs/internal/vm"
	"ipoibfs/verbs"
)

// The daemon on rdma_rxe: TestHCARxeGuestPing boots the QEMU guest of internal/vm
// with the modules and rdma-core files of verbs/rdma's TestRxe plus tun, makes rxe
// devices over veth pairs (all in the guest's first network namespace) and runs one
// daemon built with -tags rdma per device, each placing its ib0 in a namespace of its
// own. RoCE has no subnet manager: the engine runs in GID mode (ipoib/gidmode.go),
// chosen by the ports' Ethernet link layer. ARP and neighbour discovery go over the
// IPoIB groups (RoCE v2 IPv6 multicast on the veths), the packets over GID-mode paths
// (address handles with the GRH and no LID).
//
//   - rxe0 on veth0 and rxe1 on veth1, MTU 1500 (rxe's active MTU 1024, so ib0's MTU
//     is 1020): ib0 10.9.1.1/24 in nsA pings 10.9.1.2/24 in nsB. IPv6 cannot run
//     there: the kernel disables it on a device whose MTU is below 1280.
//   - rxe2 on veth2 and rxe3 on veth3, MTU 9000 (active MTU 4096, ib0 4092): nsC
//     (10.9.2.1, fd09::1) pings nsD (10.9.2.2, fd09::2) with IPv4 datagrams of 4000
//     bytes and with IPv6.
//
// The 6.1 kernel's rxe does not join the IPv6 group of a multicast attach (see
// verbs/rdma's TestRxe), so the guest also runs this package's test binary in helper
// mode (rxeMcastEnv): it joins the groups ARP and neighbour discovery need on every
// veth from a socket and holds the joins until killed.
//
// The guest script prints "RXEPING PASS name" or "RXEPING FAIL name: why" for each
// step in rxePingSteps; the host wants a PASS for each.

const rxeMcastEnv = "IPOIBFS_RXE_MCAST_JOIN"

// rxeMcastGroups are the MGIDs the helper joins on the veths: the IPoIB broadcast group
// of P_Key 0xffff (rxe's only P_Key), for ARP, and the solicited-node groups of
// fd09::1 and fd09::2, for IPv6 neighbour discovery.
var rxeMcastGroups = []string{"ff12:401b:ffff::ffff:ffff", "ff12:601b:ffff::1:ff00:1", "ff12:601b:ffff::1:ff00:2"}

var rxePingSteps = []string{"rxe", "join", "daemons", "ib0", "carrier", "mtu", "ping", "ping-restart", "ping-4092", "ping6", "connected", "ping-connected"}

const rxePingScript = `echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
pass() { echo "RXEPING PASS $1"; }
fail() { echo "RXEPING FAIL $1: $2"; }
IP=/usr/bin/ip
ok=1
for p in 0:1:1500 2:3:9000; do
	a=${p%%:*}; r=${p#*:}; b=${r%%:*}; mtu=${r#*:}
	$IP link add veth$a mtu $mtu type veth peer name veth$b mtu $mtu || ok=0
	$IP link set veth$a up; $IP link set veth$b up
	rdma link add rxe$a type rxe netdev veth$a || ok=0
	rdma link add rxe$b type rxe netdev veth$b || ok=0
done
if [ $ok = 1 ]; then pass rxe; else fail rxe "veth or rdma link add"; fi
rdma link show
# The daemon (vishvananda/netns) and iproute2 name namespaces under /var/run/netns.
mkdir -p /run/netns /var
ln -s /run /var/run
@@TEST@@ -test.run '^TestHCARxeGuestPing$' -test.timeout 10m > /tmp/join.log 2>&1 &
jpid=$!
for k in $(seq 50); do grep -q '^joined' /tmp/join.log && break; sleep 0.2; done
if grep -q '^joined' /tmp/join.log; then pass join; else fail join "$(cat /tmp/join.log)"; fi
pids=
for d in 0:A 1:B 2:C 3:D; do
	@@BIN@@ -hca rxe${d%:*} -ifname ib0=ib0 -mount "" -9p unix:/tmp/${d#*:}.9p -netns ns${d#*:} -param debug_level=1 -param mcast_debug_level=1 > /tmp/${d#*:}.log 2>&1 &
	pids="$pids $!"
done
ok=0
for k in $(seq 150); do
	n=0
	for ns in A B C D; do $IP -n ns$ns link show ib0 >/dev/null 2>&1 && n=$((n+1)); done
	if [ $n = 4 ]; then ok=1; break; fi
	sleep 0.2
done
if [ $ok = 1 ]; then pass daemons; else fail daemons "no ib0 in each of nsA to nsD within 30 s"; fi
$IP -n nsA addr add 10.9.1.1/24 dev ib0 && $IP -n nsA link set ib0 up &&
$IP -n nsB addr add 10.9.1.2/24 dev ib0 && $IP -n nsB link set ib0 up &&
$IP -n nsC addr add 10.9.2.1/24 dev ib0 && $IP -n nsC -6 addr add fd09::1/64 dev ib0 nodad && $IP -n nsC link set ib0 up &&
$IP -n nsD addr add 10.9.2.2/24 dev ib0 && $IP -n nsD -6 addr add fd09::2/64 dev ib0 nodad && $IP -n nsD link set ib0 up &&
pass ib0 || fail ib0 "ip addr/link"
ok=0
for k in $(seq 100); do
	n=0
	for ns in A B C D; do $IP -n ns$ns link show ib0 | grep -q LOWER_UP && n=$((n+1)); done
	if [ $n = 4 ]; then ok=1; break; fi
	sleep 0.2
done
for ns in A B C D; do $IP -n ns$ns addr show ib0; done
if [ $ok = 1 ]; then pass carrier; else fail carrier "no LOWER_UP on every ib0 within 20 s"; fi
mtus=$(for ns in A B C D; do $IP -n ns$ns link show ib0 | grep -o 'mtu [0-9]*'; done | tr '\n' ' ')
if [ "$mtus" = "mtu 1020 mtu 1020 mtu 4092 mtu 4092 " ]; then pass mtu; else fail mtu "ib0 MTUs $mtus, want 1020 (active MTU 1024 - 4) on veth0/1 and 4092 (4096 - 4) on veth2/3"; fi
nsenter --net=/run/netns/nsA ping -c 3 -W 5 10.9.1.2
rc=$?
if [ $rc = 0 ]; then pass ping; else fail ping "ping exit $rc"; fi
# Down and up: the QP is reset and its receive ring posted afresh (the provider's
# receive slots must all come back).
$IP -n nsB link set ib0 down && $IP -n nsB link set ib0 up
for k in $(seq 100); do $IP -n nsB link show ib0 | grep -q LOWER_UP && break; sleep 0.2; done
nsenter --net=/run/netns/nsA ping -c 3 -W 5 10.9.1.2
rc=$?
if [ $rc = 0 ]; then pass ping-restart; else fail ping-restart "ping after ib0 down/up exit $rc: $(grep -i 'receive buffers\|restart' /tmp/B.log | tail -3)"; fi
nsenter --net=/run/netns/nsC ping -c 3 -W 5 -s 4000 10.9.2.2
rc=$?
if [ $rc = 0 ]; then pass ping-4092; else fail ping-4092 "ping -s 4000 exit $rc"; fi
nsenter --net=/run/netns/nsC ping6 -c 3 -W 5 fd09::2
rc=$?
if [ $rc = 0 ]; then pass ping6; else fail ping6 "ping6 exit $rc"; fi
# Connected mode over RoCE: the CM by GID on QP1 (ib_cm is not loaded here, so the
# daemon's MAD agent owns the CM class), RC queue pairs, the shared receive queue.
ok=1
for ns in C D; do
	echo connected | @@BIN@@ 9p unix:/tmp/$ns.9p write class/net/ib0/mode || ok=0
	m=$(@@BIN@@ 9p unix:/tmp/$ns.9p read class/net/ib0/mode)
	[ "$m" = connected ] || { ok=0; echo "ns$ns mode: $m"; }
done
mtus=$(for ns in C D; do $IP -n ns$ns link show ib0 | grep -o 'mtu [0-9]*'; done | tr '\n' ' ')
if [ $ok = 1 ] && [ "$mtus" = "mtu 65520 mtu 65520 " ]; then pass connected; else fail connected "mode writes ok=$ok, ib0 MTUs $mtus (want 65520)"; fi
nsenter --net=/run/netns/nsC ping -c 3 -W 5 -s 30000 10.9.2.2
rc=$?
if [ $rc = 0 ]; then pass ping-connected; else fail ping-connected "ping -s 30000 in connected mode exit $rc"; fi
kill $pids
sleep 1
kill $jpid
for ns in A B C D; do echo "== daemon on rxe for ns$ns"; cat /tmp/$ns.log; done
echo "== join helper"; cat /tmp/join.log
dmesg | grep -iE 'rxe|rdma|infiniband|tun' | tail -n 20
exit 0
`

func TestHCARxeGuestPing(t *testing.T) {
	if os.Getenv(rxeMcastEnv) != "" {
		rxeMcastJoin(t, strings.Split(os.Getenv(rxeMcastEnv), ","))
		return
	}
	testenv.Short(t, "boots a QEMU guest with rdma_rxe and four daemons (30-60 s)")
	// As verbs/rdma's TestRxe, and tun for the daemons' kernel devices.
	kit := vm.PrepareRxe(t, "tun", "ib_umad") // ib_umad: the MAD agent of connected mode's CM
	goTool := testenv.Tool(t, "go")

	dir := t.TempDir()
	bin, test := filepath.Join(dir, "ipoibfs"), filepath.Join(dir, "ipoibfs.test")
	for _, args := range [][]string{
		{"build", "-tags", "rdma", "-o", bin, "."},
		{"test", "-c", "-tags", "rdma", "-o", test, "."},
	} {
		if out, err := exec.Command(goTool, args...).CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	script := strings.NewReplacer("@@BIN@@", bin, "@@TEST@@", test).Replace(rxePingScript)
	out, code, err := kit.Image.RunGuest(ctx, vm.Guest{
		Modules:  kit.Modules,
		Copy:     append([]string{bin, test}, kit.Files...),
		Env:      []string{rxeMcastEnv + "=veth0,veth1,veth2,veth3"},
		MemoryMB: 512,
	}, script)
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	t.Logf("guest ran %v, exit %d; output:\n%s", time.Since(start).Round(time.Second), code, out)
	for _, name := range rxePingSteps {
		t.Run(name, func(t *testing.T) {
			if !regexp.MustCompile(`(?m)^RXEPING PASS ` + name + `\s*$`).MatchString(out) {
				t.Errorf("no PASS for %s in the guest (see the output above)", name)
			}
		})
	}
	if code != 0 {
		t.Errorf("guest script exit status %d", code)
	}
}

// rxeMcastJoin runs in the guest (helper mode): it joins the MGIDs of rxeMcastGroups
// as IPv6 groups on each named netdev, prints "joined" and holds the joins until
// killed.
func rxeMcastJoin(t *testing.T, ifnames []string) {
	fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	for _, g := range rxeMcastGroups {
		mgid, err := verbs.ParseGID(g)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range ifnames {
			ifi, err := net.InterfaceByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.SetsockoptIPv6Mreq(fd, syscall.IPPROTO_IPV6, syscall.IPV6_JOIN_GROUP,
				&syscall.IPv6Mreq{Multiaddr: mgid, Interface: uint32(ifi.Index)}); err != nil {
				t.Fatalf("join %v on %s: %v", mgid, name, err)
			}
		}
	}
	fmt.Printf("joined %v on %v\n", rxeMcastGroups, ifnames)
	for {
		time.Sleep(time.Hour)
	}
}
