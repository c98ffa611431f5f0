package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// The throughput reference for the daemon's own design: wireguard-go's data path
// without its cryptography. A TUN device with the kernel's large-send offload, whose
// large packets are split in memory into MTU-sized ones (gsoSplit), sent as UDP
// datagrams on loopback with UDP GSO and received with UDP GRO, then coalesced again
// for the receiving TUN (tcpGRO): the engine's TUN code (the forked wireguard-go tun,
// read in bursts as the engine reads), wireguard-go's own batched UDP (conn), and
// nothing of IPoIB (no headers, ICRC, queues, completions or neighbour lookups). iperf3 over two of these is the most the
// TUN-and-UDP design moves on this machine; the engine's ratio to it is what IPoIB
// costs on top.
var ceilingArgs = flag.String("ceiling-relay", "", "internal: run the batched TUN<->UDP relay reference: DEV,LOCALPORT,REMOTE")

// relayHeadroom is the room before each packet the TUN needs for its virtio-net header.
const relayHeadroom = 16

// serveCeiling creates the TUN device and relays until killed.
func serveCeiling(spec string) {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		die("-ceiling-relay wants DEV,LOCALPORT,REMOTE, not %q", spec)
	}
	port, err := strconv.ParseUint(f[1], 10, 16)
	if err != nil {
		die("-ceiling-relay: port %q: %v", f[1], err)
	}
	dev, err := tun.CreateTUN(f[0], 1500) // the MTU is set with ip later
	if err != nil {
		die("ceiling relay: %v", err)
	}
	go func() { // the device's up/down and MTU events, which nothing here needs: drained so its monitor never blocks
		for range dev.Events() {
		}
	}()
	bind := conn.NewStdNetBind()
	recvs, _, err := bind.Open(uint16(port))
	if err != nil {
		die("ceiling relay: listen on port %d: %v", port, err)
	}
	ep, err := bind.ParseEndpoint(f[2])
	if err != nil {
		die("ceiling relay: %v", err)
	}
	for _, recv := range recvs {
		go fromUDP(recv, bind.BatchSize(), dev)
	}
	fmt.Println("ready")
	// TUN to UDP: a read takes a batch (a large packet split into MTU-sized ones).
	n := dev.BatchSize()
	bufs, sizes, out := make([][]byte, n), make([]int, n), make([][]byte, n)
	for k := range bufs {
		bufs[k] = make([]byte, relayHeadroom+65535)
	}
	for {
		got, err := dev.Read(bufs, sizes, relayHeadroom)
		if err != nil && !errors.Is(err, tun.ErrTooManySegments) {
			die("ceiling relay: tun read: %v", err)
		}
		// The packets queued behind the first, without waiting, as the engine's read
		// takes them (the fork's TryRead): with offloads off a read is one packet.
		if tr, ok := dev.(interface {
			TryRead([][]byte, []int, int) (int, error)
		}); ok {
			for got < n {
				m, err := tr.TryRead(bufs[got:], sizes[got:], relayHeadroom)
				if err != nil || m == 0 {
					break
				}
				got += m
			}
		}
		for k := range got {
			out[k] = bufs[k][relayHeadroom : relayHeadroom+sizes[k]]
		}
		if got > 0 {
			_ = bind.Send(out[:got], ep) // a send the kernel refuses is a lost packet, as on a wire
		}
	}
}

// fromUDP moves what one receive function returns to the TUN device, a batch per write.
func fromUDP(recv conn.ReceiveFunc, batch int, dev tun.Device) {
	bufs, sizes := make([][]byte, batch), make([]int, batch)
	eps := make([]conn.Endpoint, batch)
	full, out := make([][]byte, batch), make([][]byte, batch)
	for k := range bufs {
		full[k] = make([]byte, relayHeadroom+65535)
		bufs[k] = full[k][relayHeadroom:]
	}
	for {
		n, err := recv(bufs, sizes, eps)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		for k := range n {
			out[k] = full[k][:relayHeadroom+sizes[k]]
		}
		if n > 0 {
			_, _ = dev.Write(out[:n], relayHeadroom)
		}
	}
}

// measureCeiling runs iperf3 and ping across two ceiling relays in two namespaces, the
// TUN devices' offloads as given.
func measureCeiling(mtu int, offloads bool) (result, error) {
	nss, devs := [2]string{"nbcla", "nbclb"}, [2]string{"nbcl0", "nbcl1"}
	ports := [2]uint16{4795, 4796}
	cmds, stop, err := startRelays(nss, devs, func(k int) []string {
		remote := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ports[1-k])
		return []string{"-ceiling-relay", fmt.Sprintf("%s,%d,%s", devs[k], ports[k], remote)}
	})
	defer stop()
	if err != nil {
		return result{}, err
	}
	for k, ns := range nss {
		if _, err := sh("ip", "-n", ns, "link", "set", devs[k], "up"); err != nil {
			return result{}, err
		}
	}
	return measurePair(nss[0], nss[1], devs[0], devs[1], mtu, offloads, cmds, nil)
}
