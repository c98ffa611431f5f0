// Package kernel is the kernel bridge of ipoibfs: every IPoIB interface of the engine
// (ib0, ib0.8001, ...) appears in the Linux kernel as a TUN device of the same name, so
// ping, iperf3 and the rest of the host stack run over the userspace engine.
//
// The package knows nothing about InfiniBand. A Device moves IP packets (IPv4/IPv6, no
// link header) between the kernel and its caller:
//
//   - Read returns packets the kernel routed out of the device (the engine encapsulates
//     them and sends them on the fabric);
//   - Write injects packets received from the fabric into the kernel.
//
// Devices are opened with IFF_VNET_HDR and driven through golang.zx2c4.com/wireguard/tun,
// so 64 KB units cross the kernel boundary: with TSO on, the kernel hands over TCP (and,
// where the kernel supports it, UDP) super-packets that Read splits in memory into
// MTU-sized packets with correct IP/TCP/UDP headers and checksums; with GRO on, Write
// coalesces TCP/UDP segments of one flow into super-packets before handing them to the
// kernel. Offloads follow ethtool's rules: large send (TSO) needs transmit checksum
// offload and is reported off while checksum offload is off.
//
// A device may live in another network namespace (Config.NetNS): it is created inside
// that namespace by a short-lived OS thread, so the calling process never leaves its own
// namespace, and all later netlink calls for the device go through a netlink handle bound
// to that namespace.
//
// The kernel device type of a TUN is ARPHRD_NONE with IFF_POINTOPOINT|IFF_NOARP; the
// engine answers ARP/ND itself. Carrier is on after Open (the TUN default); use
// SetCarrier(false) to show NO-CARRIER until the port is ready.
//
// The package is Linux-only; on other systems Open returns ErrUnavailable.
package kernel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Config describes one TUN device.
type Config struct {
	// Name is the interface name, e.g. "ib0" or "ib0.8001" (at most 15 bytes, no '/',
	// ':', '%' or white space).
	Name string
	// MTU of the kernel device; 0 keeps the kernel default (1500). The kernel accepts
	// 68..65535 for a TUN.
	MTU int
	// NetNS is the named network namespace (/run/netns/NAME) the device lives in; ""
	// is the namespace of the calling process. A missing namespace is created (and is
	// not removed by Close: other devices may share it).
	NetNS string
	// Offloads to start with; the zero value is none (one kernel packet per Read and
	// per write, as with a plain TUN).
	Offloads Offloads
	// Queues is the number of TUN queues, 1..MaxQueues (0 is 1): above 1 the device is a
	// multi-queue TUN (see Queue).
	Queues int
}

// MaxQueues is the most queues a TUN device can have (the kernel's MAX_TAP_QUEUES).
const MaxQueues = 256

// Offloads are the offloads of a Device.
type Offloads struct {
	// TxChecksum: the kernel hands over packets with partial TCP/UDP checksums that Read
	// completes (TUN_F_CSUM).
	TxChecksum bool
	// TSO (large send): the kernel hands over super-packets of up to 64 KB that Read
	// splits into MTU-sized packets (TUN_F_TSO4|TSO6, plus USO4|USO6 where the kernel
	// supports UDP segmentation offload). Needs TxChecksum.
	TSO bool
	// GRO: Write coalesces TCP/UDP segments of one flow into super-packets, which the
	// kernel takes as checksum-verified (partial checksums, as after a NIC's GRO).
	GRO bool
}

// String formats the offloads in ethtool's words.
func (o Offloads) String() string {
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	return fmt.Sprintf("tx-checksumming: %s, tcp-segmentation-offload: %s, generic-receive-offload: %s",
		onOff(o.TxChecksum), onOff(o.TSO), onOff(o.GRO))
}

// effective returns o with TSO cleared when checksum offload is off (ethtool's rule;
// the kernel ignores TSO flags without TUN_F_CSUM).
func (o Offloads) effective() Offloads {
	o.TSO = o.TSO && o.TxChecksum
	return o
}

var (
	// ErrUnavailable is returned (wrapped, see errors.Is) by Open when the kernel bridge
	// cannot work at all on this machine or for this process: /dev/net/tun is missing
	// or not accessible, the process lacks CAP_NET_ADMIN, or the system is not Linux.
	ErrUnavailable = errors.New("kernel bridge unavailable")
	// ErrExists is returned (wrapped) by Open when a device of that name already exists
	// in the target namespace.
	ErrExists = errors.New("a network device of this name already exists")
)

// maxPacket is the largest IP packet a TUN moves (and the largest super-packet).
const maxPacket = 65535

// validName checks a Linux interface name as the kernel's dev_valid_name does, and
// additionally refuses '%' (the kernel would treat it as a name template).
func validName(name string) error {
	switch {
	case name == "":
		return errors.New("empty interface name")
	case len(name) > 15:
		return fmt.Errorf("interface name is %d bytes, the kernel allows 15", len(name))
	case name == "." || name == "..":
		return errors.New(`interface name may not be "." or ".."`)
	case strings.ContainsAny(name, "/:% \t\n\r\v\f"):
		return errors.New("interface name may not contain '/', ':', '%' or white space")
	}
	return nil
}

// ValidNetNS checks a network namespace name as -netns takes it (a file name under
// /run/netns; "" is the process's own namespace).
func ValidNetNS(name string) error { return validNetNS(name) }

// validNetNS checks a named network namespace (a file name under /run/netns).
func validNetNS(name string) error {
	if name == "" {
		return nil
	}
	if name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
		return fmt.Errorf("invalid network namespace name %q", name)
	}
	return nil
}

func (c Config) validate() error {
	if err := validName(c.Name); err != nil {
		return fmt.Errorf("kernel bridge: %q: %w", c.Name, err)
	}
	if err := validNetNS(c.NetNS); err != nil {
		return fmt.Errorf("kernel bridge: %s: %w", c.Name, err)
	}
	if c.Queues < 0 || c.Queues > MaxQueues {
		return fmt.Errorf("kernel bridge: %s: %d queues out of range (0 = 1, else 1..%d)", c.Name, c.Queues, MaxQueues)
	}
	if c.MTU < 0 || c.MTU > maxPacket {
		return fmt.Errorf("kernel bridge: %s: MTU %d out of range (0 = default, else 68..65535)", c.Name, c.MTU)
	}
	return nil
}

// prefixOf converts a kernel address (as netlink returns it) to a prefix.
func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, bits := n.Mask.Size()
	if bits == 128 && a.Is4() {
		ones -= 96
	}
	p := netip.PrefixFrom(a, ones)
	return p, p.IsValid()
}

// Link is a device's link state as the kernel reports it.
type Link struct {
	Name   string
	MTU    int
	Up     bool   // IFF_UP: administratively up
	Flags  uint32 // the raw net_device flags
	TxQLen int
	// Features are the device's offloads (ethtool -k).
	Features DevFeatures
	// Multicast is IFF_MULTICAST (ip link set multicast on/off).
	Multicast bool
	// UserFlags are IFF_PROMISC and IFF_ALLMULTI as users asked for them (ip link set
	// promisc/allmulticast: the kernel's gflags, which netlink reports; a packet
	// socket's promiscuity is not among them).
	UserFlags uint32
	// MTUChanged, UpChanged, MulticastChanged and FeaturesChanged say that the value
	// differs from the one this package last set or reported: someone else (ip link,
	// ifconfig, ethtool -K) changed it.
	MTUChanged, UpChanged, MulticastChanged, FeaturesChanged bool
	// UserFlagsChanged and TxQLenChanged say the same of UserFlags and TxQLen.
	UserFlagsChanged, TxQLenChanged bool
	// Alias is the device's alias (ip link set alias; ifalias), and AliasChanged says
	// someone else changed it.
	Alias        string
	AliasChanged bool
	// PrevAlias is the alias this package held for the device before this report
	// (the one it last set or reported): an engine still at it has not changed the
	// alias since, and may take Alias (AdoptAlias). PrevTxQLen, PrevMulticast and
	// PrevUserFlags are the same for TxQLen, Multicast and UserFlags.
	PrevAlias     string
	PrevTxQLen    int
	PrevMulticast bool
	PrevUserFlags uint32
	// Counted is IFF_PROMISC while the device's promiscuity count has more than the
	// user's own flag (a packet socket's such as tcpdump's, a bond's): dev->flags has
	// it then, as sysfs shows it. (IFF_ALLMULTI's count is not read.)
	Counted uint32
	// CarrierPutBack says someone changed the carrier (ip link set carrier) and it was
	// put back to what the engine set.
	CarrierPutBack bool
}

// outsideChange reports whether l says someone else changed the device.
func (l Link) outsideChange() bool {
	return l.MTUChanged || l.UpChanged || l.MulticastChanged || l.FeaturesChanged || l.UserFlagsChanged || l.TxQLenChanged ||
		l.AliasChanged || l.CarrierPutBack
}

// Events are the functions Device.Watch calls; nil ones are not called.
type Events struct {
	Link   func(Link)           // link attributes changed
	Addrs  func([]netip.Prefix) // the address list changed
	Groups func([]netip.Addr)   // the multicast list changed
	Gone   func()               // the device was deleted by someone else; the last call
	// Moved: someone moved the device to another network namespace (ip link set
	// netns), and it was put back (err nil: the move took it down and its addresses
	// with it; it is up again if it was) or could not be (Gone follows).
	Moved func(err error)
}

// ErrUnregistered is the reason of a read or wait that failed because the kernel
// unregistered the device while its descriptor was open (and not Close or Delete);
// such an error is os.ErrClosed too.
var ErrUnregistered = errors.New("the kernel unregistered the device")
