//go:build linux

package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// udpTransport sends from a UDP socket on port 68 bound to the interface's device and
// receives from a packet socket on the device, both made in the daemon's network
// namespace (sockets stay in the namespace they were made in). Replies are taken
// before the IP layer, as dhclient and systemd-networkd take them until bound:
// reverse-path filtering (rp_filter 1, RHEL's default, or 2 with no route to the
// server) drops an OFFER from a server the device has no route to yet, before any UDP
// socket sees it. The UDP socket still holds the port, so that a reply that does get
// through is not answered with a port unreachable; a filter keeps its queue empty.
type udpTransport struct {
	conn *net.UDPConn
	dev  func() string

	pkt *os.File // the packet socket
	prc syscall.RawConn
	mu  sync.Mutex // serialises the packet socket's binds
	buf []byte     // Recv's packet, with room for the headers
	oob []byte     // Recv's auxiliary data (the checksum status)
}

// Open makes the transport of the device called dev() in the named network namespace
// ("": this process's). The name is asked again before every send: the device may have
// been renamed, or deleted and made again with a new index.
func Open(netnsName string, dev func() string) (Transport, error) {
	type fds struct{ udp, pkt int }
	r, err := inNetNS(netnsName, func() (fds, error) {
		udp, index, err := udpSocket(dev())
		if err != nil {
			return fds{}, err
		}
		pkt, err := packetSocket(index)
		if err != nil {
			unix.Close(udp)
			return fds{}, err
		}
		return fds{udp, pkt}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("dhcp socket on %s: %w", dev(), err)
	}
	f := os.NewFile(uintptr(r.udp), "dhcp")
	defer f.Close()
	c, err := net.FilePacketConn(f)
	if err != nil {
		unix.Close(r.pkt)
		return nil, err
	}
	t := &udpTransport{conn: c.(*net.UDPConn), dev: dev, pkt: os.NewFile(uintptr(r.pkt), "dhcp-packet")}
	if t.prc, err = t.pkt.SyscallConn(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// udpSocket makes the sending socket, bound to port 68 on dev, and returns it with
// dev's index.
func udpSocket(dev string) (fd, index int, err error) {
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	for _, o := range []int{unix.SO_REUSEADDR, unix.SO_BROADCAST} {
		if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, o, 1); err != nil {
			break
		}
	}
	if err == nil {
		// Bound to the device before the port: clients of several interfaces share
		// port 68, each on its own device.
		err = unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)
	}
	if err == nil {
		index, err = ifIndex(fd, dev)
	}
	if err == nil {
		// Nothing is read from it (replies come from the packet socket).
		err = attachFilter(fd, []bpf.Instruction{bpf.RetConstant{Val: 0}})
	}
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrInet4{Port: clientPort})
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, index, nil
}

// packetSocket makes the receiving socket: IPv4 on the device with that index, the
// filter attached before it is bound so that nothing else is queued meanwhile, and
// the kernel's checksum status with each packet.
func packetSocket(index int) (int, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	err = attachFilter(fd, replyFilter)
	if err == nil {
		err = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1)
	}
	if err == nil {
		err = bindPacket(fd, index)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// ifIndex is the index of the device called dev in the namespace of the socket fd
// (SIOCGIFINDEX answers for the socket's namespace, whatever the thread's).
func ifIndex(fd int, dev string) (int, error) {
	ifr, err := unix.NewIfreq(dev)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}

func bindPacket(fd, index int) error {
	return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: index})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func attachFilter(fd int, prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	f := make([]unix.SockFilter, len(raw))
	for k, r := range raw {
		f[k] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]})
}

func (t *udpTransport) Send(b []byte, to netip.Addr) error {
	rc, err := t.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	index := 0
	dev := t.dev()
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev); serr == nil {
			index, serr = ifIndex(int(fd), dev)
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("bind to %s: %w", dev, serr)
	}
	// The packet socket is bound again before every send: a device deleted and made
	// again has a new index, and one moved to another namespace and put back (at its
	// index) has unbound every packet socket on it (NETDEV_UNREGISTER). A send comes
	// before every reply the client waits for.
	t.mu.Lock()
	var berr error
	if err := t.prc.Control(func(fd uintptr) { berr = bindPacket(int(fd), index) }); err != nil {
		berr = err
	}
	t.mu.Unlock()
	if berr != nil {
		return fmt.Errorf("receive on %s: %w", dev, berr)
	}
	if !to.IsValid() {
		to = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	_, err = t.conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(to, 67))
	return err
}

// Recv returns the payload of the next reply to port 68 received on the device;
// packets the IP layer would not have delivered (bad checksums, fragments) and this
// host's own outgoing ones are passed over.
func (t *udpTransport) Recv(b []byte) (int, error) {
	if need := len(b) + 60 + 8; len(t.buf) < need { // the largest IPv4 and the UDP header
		t.buf = make([]byte, need)
	}
	if t.oob == nil {
		t.oob = make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.TpacketAuxdata{}))))
	}
	oob := t.oob
	for {
		var n, oobn int
		var from unix.Sockaddr
		var rerr error
		if err := t.prc.Read(func(fd uintptr) bool {
			n, oobn, _, from, rerr = unix.Recvmsg(int(fd), t.buf, oob, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return 0, err
		}
		if rerr == unix.ENETDOWN || rerr == unix.EINTR {
			continue // the device went down (reported once), or a signal
		}
		if rerr != nil {
			return 0, rerr
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		p, err := udpPayload(t.buf[:n], checksumVouched(oob[:oobn]))
		if err != nil {
			continue
		}
		return copy(b, p), nil
	}
}

// checksumVouched reports whether the packet's auxiliary data says its checksum was
// verified (TP_STATUS_CSUM_VALID) or is still to be completed (TP_STATUS_CSUMNOTREADY:
// a partial checksum, as with checksum offload, which the IP layer accepts as well).
func checksumVouched(oob []byte) bool {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= int(unsafe.Sizeof(unix.TpacketAuxdata{})) {
			aux := (*unix.TpacketAuxdata)(unsafe.Pointer(&m.Data[0]))
			return aux.Status&(unix.TP_STATUS_CSUM_VALID|unix.TP_STATUS_CSUMNOTREADY) != 0
		}
	}
	return false
}

func (t *udpTransport) Close() error {
	err := t.conn.Close()
	if perr := t.pkt.Close(); err == nil {
		err = perr
	}
	return err
}

// inNetNS runs fn on a thread in the named namespace; the thread is locked and never
// unlocked, so it ends with its goroutine instead of serving others in that namespace.
func inNetNS[T any](name string, fn func() (T, error)) (T, error) {
	if name == "" {
		return fn()
	}
	var zero T
	h, err := netns.GetFromName(name)
	if err != nil {
		return zero, fmt.Errorf("network namespace %q: %w", name, err)
	}
	defer h.Close()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(h); err != nil {
			ch <- result{zero, err}
			return
		}
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}
