//go:build linux

package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// udpTransport is a UDP socket on port 68 bound to the interface's device, made in the
// daemon's network namespace (sockets stay in the namespace they were made in).
type udpTransport struct {
	conn *net.UDPConn
	dev  func() string
}

// Open makes the transport of the device called dev() in the named network namespace
// ("": this process's). The name is asked again before every send: the device may have
// been renamed, or deleted and made again with a new index.
func Open(netnsName string, dev func() string) (Transport, error) {
	fd, err := inNetNS(netnsName, func() (int, error) {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		for _, o := range []int{unix.SO_REUSEADDR, unix.SO_BROADCAST} {
			if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, o, 1); err != nil {
				break
			}
		}
		if err == nil {
			// Bound to the device before the port: clients of several interfaces
			// share port 68, each on its own device.
			err = unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev())
		}
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Port: 68})
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	})
	if err != nil {
		return nil, fmt.Errorf("dhcp socket on %s: %w", dev(), err)
	}
	f := os.NewFile(uintptr(fd), "dhcp")
	defer f.Close()
	c, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	return &udpTransport{conn: c.(*net.UDPConn), dev: dev}, nil
}

func (t *udpTransport) Send(b []byte, to netip.Addr) error {
	rc, err := t.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, t.dev())
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("bind to %s: %w", t.dev(), serr)
	}
	if !to.IsValid() {
		to = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	_, err = t.conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(to, 67))
	return err
}

func (t *udpTransport) Recv(b []byte) (int, error) {
	n, _, err := t.conn.ReadFromUDPAddrPort(b)
	return n, err
}

func (t *udpTransport) Close() error { return t.conn.Close() }

// inNetNS runs fn on a thread in the named namespace; the thread is locked and never
// unlocked, so it ends with its goroutine instead of serving others in that namespace.
func inNetNS(name string, fn func() (int, error)) (int, error) {
	if name == "" {
		return fn()
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		return -1, fmt.Errorf("network namespace %q: %w", name, err)
	}
	defer h.Close()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(h); err != nil {
			ch <- result{-1, err}
			return
		}
		fd, err := fn()
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}
