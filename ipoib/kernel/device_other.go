//go:build !linux

package kernel

import (
	"fmt"
	"net/netip"
	"runtime"
)

// Device is one TUN device. On this system none can be opened.
type Device struct{ name string }

// OnNamespaceGone does nothing: there are no network namespaces here.
func OnNamespaceGone(fn func(name string)) (stop func()) { return func() {} }

// Open always fails with ErrUnavailable outside Linux.
func Open(cfg Config) (*Device, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: %s: TUN bridge is Linux-only (GOOS=%s)", ErrUnavailable, cfg.Name, runtime.GOOS)
}

func (d *Device) unsupported() error {
	return fmt.Errorf("%w: %s: not supported on %s", ErrUnavailable, d.name, runtime.GOOS)
}

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// BatchSize returns 1.
func (d *Device) BatchSize() int { return 1 }

// Read is not supported.
func (d *Device) Read(bufs [][]byte, sizes []int) (int, error) { return 0, d.unsupported() }

// ReadHeadroom is the offset ReadOffset reads at without a copy.
const ReadHeadroom = 10

// ReadBufferLen is the length of a read buffer for packets of up to mtu bytes.
func ReadBufferLen(mtu int) int { return ReadHeadroom + mtu }

// WriteHeadroom is what WriteOffset needs before each packet.
const WriteHeadroom = 10

// WriteOffset is not supported.
func (d *Device) WriteOffset(frames [][]byte, offset int) (int, error) { return 0, d.unsupported() }

// ReadOffset is not supported.
func (d *Device) ReadOffset(bufs [][]byte, sizes []int, offset int) (int, error) {
	return 0, d.unsupported()
}

// CloseAll does nothing: no Device can be opened here.
func CloseAll(devs []*Device) error { return nil }

// ShortBuffer reports no error as a short buffer: no Read succeeds here.
func ShortBuffer(err error) (need int, ok bool) { return 0, false }

// WaitReadable is not supported.
func (d *Device) WaitReadable() error { return d.unsupported() }

// Write is not supported.
func (d *Device) Write(pkts [][]byte) (int, error) { return 0, d.unsupported() }

// SetMTU is not supported.
func (d *Device) SetMTU(mtu int) error { return d.unsupported() }

// SetMTUIfChanged sets the MTU unless the device holds it.
func (d *Device) SetMTUIfChanged(mtu int) error { return d.unsupported() }

// SetOffloads is not supported.
func (d *Device) SetOffloads(o Offloads) error { return d.unsupported() }

// SetOffloadsIfChanged is not supported.
func (d *Device) SetOffloadsIfChanged(o Offloads) error { return d.unsupported() }

// Offloads returns no offloads.
func (d *Device) Offloads() Offloads { return Offloads{} }

// SetUp is not supported.
func (d *Device) SetUp(up bool) error { return d.unsupported() }

// SetUpIfChanged sets IFF_UP unless the device holds it.
func (d *Device) SetUpIfChanged(up bool) error { return d.unsupported() }

// SetMulticast is not supported.
func (d *Device) SetMulticast(on bool) error { return d.unsupported() }

// SetMulticastIfChanged is not supported.
func (d *Device) SetMulticastIfChanged(on bool) error { return d.unsupported() }

// SetUserFlags is not supported.
func (d *Device) SetUserFlags(f uint32) error { return d.unsupported() }

// SetUserFlagsIfChanged is not supported.
func (d *Device) SetUserFlagsIfChanged(f uint32) error { return d.unsupported() }

// SetCarrier is not supported.
func (d *Device) SetCarrier(on bool) error { return d.unsupported() }

// Addrs is not supported.
func (d *Device) Addrs() ([]netip.Prefix, error) { return nil, d.unsupported() }

// WatchAddrs does nothing.
func (d *Device) WatchAddrs(fn func([]netip.Prefix)) {}

// Close does nothing.
func (d *Device) Close() error { return nil }

// Delete does nothing.
func (d *Device) Delete() error { return nil }

// WaitReleased does nothing.
func WaitReleased() {}

// SetLinkLocal is not supported.
func (d *Device) SetLinkLocal(addr netip.Addr) error { return d.unsupported() }

// Watch does nothing.
func (d *Device) Watch(ev Events) {}

// RefreshGroups does nothing.
func (d *Device) RefreshGroups() {}

// Groups is not supported.
func (d *Device) Groups() ([]netip.Addr, error) { return nil, d.unsupported() }

// EnsureLinkLocal is not supported.
func (d *Device) EnsureLinkLocal(addr netip.Addr) error { return d.unsupported() }

// Alias is not supported.
func (d *Device) Alias() (string, error) { return "", d.unsupported() }

// SetAlias is not supported.
func (d *Device) SetAlias(s string) error { return d.unsupported() }

// SetAliasIfChanged is not supported.
func (d *Device) SetAliasIfChanged(s string) error { return d.unsupported() }

// SetTxQueueLen is not supported.
func (d *Device) SetTxQueueLen(n int) error { return d.unsupported() }

// SetTxQueueLenIfChanged sets txqueuelen unless the device holds it.
func (d *Device) SetTxQueueLenIfChanged(n int) error { return d.unsupported() }

// SetName is not supported.
func (d *Device) SetName(name string) error { return d.unsupported() }

// DevFeatures are the device's offload features.
type DevFeatures struct {
	RxChecksum, TxChecksum, TSO, GRO bool
}

// DeviceFeatures is not supported.
func (d *Device) DeviceFeatures() (DevFeatures, error) { return DevFeatures{}, d.unsupported() }

// SetSpeed is not supported.
func (d *Device) SetSpeed(mbps int) error { return d.unsupported() }

// Index returns 0.
func (d *Device) Index() int { return 0 }

// MTU is the device's MTU.
func (d *Device) MTU() int { return 0 }

// AddAddr is not supported.
func (d *Device) AddAddr(p netip.Prefix, broadcast netip.Addr) error { return d.unsupported() }

// DelAddr is not supported.
func (d *Device) DelAddr(p netip.Prefix) error { return d.unsupported() }

// LinkAddrs is not supported.
func LinkAddrs(netnsName, name string) ([]netip.Prefix, error) {
	return nil, fmt.Errorf("%w: not supported on %s", ErrUnavailable, runtime.GOOS)
}

// LinkExists reports false.
func LinkExists(netnsName, name string) bool { return false }

// LinkInfo describes a device (netns_linux.go).
type LinkInfo struct {
	Name             string
	Up, Master, Busy bool
}

// LookupLink reports no interface.
func LookupLink(netnsName, name string) (LinkInfo, bool) { return LinkInfo{}, false }

// Queue is one of a device's TUN queues; none exist here.
type Queue struct{ d *Device }

// Queues is 1.
func (d *Device) Queues() int { return 1 }

// Queue returns the device's only queue.
func (d *Device) Queue(k int) *Queue { return &Queue{d} }

// ReadOffset is not supported.
func (q *Queue) ReadOffset(bufs [][]byte, sizes []int, offset int) (int, error) {
	return 0, q.d.unsupported()
}

// WaitReadable is not supported.
func (q *Queue) WaitReadable() error { return q.d.unsupported() }

// Write is not supported.
func (q *Queue) Write(pkts [][]byte) (int, error) { return 0, q.d.unsupported() }

// WriteOffset is not supported.
func (q *Queue) WriteOffset(frames [][]byte, offset int) (int, error) {
	return 0, q.d.unsupported()
}
