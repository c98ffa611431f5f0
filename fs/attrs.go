package fs

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"ipoibfs/ipoib"
)

type scope uint8

const (
	allIfs scope = iota
	parentOnly
	childOnly
)

// ifAttr is one file of class/net/<if>/ (or of its ethtool/ and statistics/
// directories): the kernel's mode, format and write parser.
type ifAttr struct {
	name  string
	perm  uint32
	scope scope
	read  func(i *ipoib.Interface) (string, error)
	write func(i *ipoib.Interface, b []byte) error
	// netAdmin: a write needs CAP_NET_ADMIN (EPERM), as net-sysfs's netdev_store
	// checks before anything else; parseFirst runs before that check, as
	// create_child/delete_child parse their argument first (EINVAL before EPERM).
	netAdmin   bool
	parseFirst func(b []byte) error
	slow       bool // a read asks the kernel (Node.Quick)
}

// checkCreateArg and checkDeleteArg are create_child's and delete_child's parse and
// range check alone (ipoib_main.c's create_child_store, delete_child_store).
func checkCreateArg(b []byte) error {
	v, err := parsePKeyArg(b)
	if err == nil {
		if _, ok := ipoib.NormalizePKey(v); !ok {
			err = errorf(syscall.EINVAL, "P_Key %#x is invalid (0, 0x8000 and values above 0xffff are)", v)
		}
	}
	return err
}

func checkDeleteArg(b []byte) error {
	v, err := parsePKeyArg(b)
	if err == nil && (v < 0 || v > 0xffff) {
		err = errorf(syscall.EINVAL, "P_Key %#x is out of range", v)
	}
	return err
}

// ifIndexText is an interface index as net-sysfs prints it; without a kernel device
// (the kernel bridge is off) there is none.
func ifIndexText(n int, i *ipoib.Interface) (string, error) {
	if n == 0 {
		return "", errorf(syscall.ENODEV, "%s has no kernel device", i.Name())
	}
	return fmt.Sprintf("%d\n", n), nil
}

func devPort(i *ipoib.Interface) int {
	if i.Parent() != nil {
		return 0
	}
	return i.Port() - 1
}

func yes01(v bool) string {
	if v {
		return "1\n"
	}
	return "0\n"
}

// netdev is what the link files interfaces and bonds share read and write.
type netdev interface {
	Name() string
	IsUp() bool
	CarrierCounts() (up, down uint64)
	Alias() string
	SetAlias(s string) error
}

// carrierCount reads carrier_changes, carrier_up_count or carrier_down_count: what
// pick takes of the counts.
func carrierCount[T netdev](pick func(up, down uint64) uint64) func(T) (string, error) {
	return func(d T) (string, error) { return fmt.Sprintf("%d\n", pick(d.CarrierCounts())), nil }
}

// dormant is never dormant; as carrier, EINVAL for a device not running (net-sysfs).
func dormant[T netdev](d T) (string, error) {
	if !d.IsUp() {
		return "", errorf(syscall.EINVAL, "%s is down", d.Name())
	}
	return "0\n", nil
}

// aliasRead and aliasWrite are ifalias: shown with a newline, nothing without one;
// one trailing newline of a write ignored (ifalias_show, ifalias_store).
func aliasRead[T netdev](d T) (string, error) {
	if a := d.Alias(); a != "" {
		return a + "\n", nil
	}
	return "", nil
}

func aliasWrite[T netdev](d T, b []byte) error {
	return d.SetAlias(string(bytes.TrimSuffix(b, []byte("\n"))))
}

// linkSpeed is the speed ethtool's link settings give (speed_show, duplex_show): -1
// without carrier, EINVAL while down or when the port's rate is unknown.
func linkSpeed(i *ipoib.Interface) (int, error) {
	if !i.IsUp() {
		return 0, errorf(syscall.EINVAL, "%s is down", i.Name())
	}
	if !i.Carrier() {
		return -1, nil
	}
	mbps := i.SpeedMbps()
	if mbps <= 0 {
		return 0, errorf(syscall.EINVAL, "%s: the port's rate is unknown", i.Name())
	}
	return mbps, nil
}

// ifAttrs is the table of class/net/<if>/ files, sorted by name. Formats follow
// net-sysfs and ipoib_main.c / ipoib_cm.c (see reference/kernel-ipoib.md §1-§3).
var ifAttrs = []ifAttr{
	// NET_ADDR_PERM: the address is the port's GID and the QP's number, not random or set.
	{name: "addr_assign_type", perm: 0444, read: func(*ipoib.Interface) (string, error) { return "0\n", nil }},
	{name: "addr_len", perm: 0444, read: func(*ipoib.Interface) (string, error) { return "20\n", nil }},
	{name: "address", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return i.HWAddr().String() + "\n", nil }},
	{name: "broadcast", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return i.Broadcast().String() + "\n", nil }},
	// carrier_store answers EOPNOTSUPP for a device without ndo_change_carrier before
	// anything else (netdev_store's CAP_NET_ADMIN check and parsing included).
	{name: "carrier", perm: 0644, read: func(i *ipoib.Interface) (string, error) {
		if !i.IsUp() { // net-sysfs: carrier of a device that is not running is EINVAL
			return "", errorf(syscall.EINVAL, "%s is down", i.Name())
		}
		return yes01(i.Carrier()), nil
	}, write: func(i *ipoib.Interface, b []byte) error {
		return errorf(syscall.EOPNOTSUPP, "%s: the carrier follows the port and the broadcast group; it cannot be set", i.Name())
	}},
	// The carrier's changes since the interface was made (the netdev's counts of
	// netif_carrier_on and netif_carrier_off), as its device counts them: off once at
	// setup, then every change the engine makes (a device made again after `ip link
	// del` starts its own count again).
	{name: "carrier_changes", perm: 0444, read: carrierCount[*ipoib.Interface](func(up, down uint64) uint64 { return up + down })},
	{name: "carrier_down_count", perm: 0444, read: carrierCount[*ipoib.Interface](func(_, down uint64) uint64 { return down })},
	{name: "carrier_up_count", perm: 0444, read: carrierCount[*ipoib.Interface](func(up, _ uint64) uint64 { return up })},
	{name: "create_child", netAdmin: true, parseFirst: checkCreateArg, perm: 0200, scope: parentOnly, write: func(i *ipoib.Interface, b []byte) error {
		v, err := parsePKeyArg(b)
		if err != nil {
			return err
		}
		_, err = i.CreateChild(v)
		return err
	}},
	{name: "delete_child", netAdmin: true, parseFirst: checkDeleteArg, perm: 0200, scope: parentOnly, write: func(i *ipoib.Interface, b []byte) error {
		v, err := parsePKeyArg(b)
		if err != nil {
			return err
		}
		return i.DeleteChild(v)
	}},
	// ipoib_add_port sets dev_id and dev_port of a port's interface to port-1; children
	// (__ipoib_vlan_add) keep the defaults, 0.
	{name: "dev_id", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return fmt.Sprintf("%#x\n", devPort(i)), nil }},
	{name: "dev_port", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return fmt.Sprintf("%d\n", devPort(i)), nil }},
	{name: "dormant", perm: 0444, read: dormant[*ipoib.Interface]},
	// duplex and speed are ethtool's link settings (ipoib_get_link_ksettings): EINVAL
	// while the device is down, unknown (-1) without carrier, else full and the port's
	// per-lane speed times its width in Mb/s (EINVAL when the port cannot say).
	{name: "duplex", perm: 0444, read: func(i *ipoib.Interface) (string, error) {
		mbps, err := linkSpeed(i)
		switch {
		case err != nil:
			return "", err
		case mbps < 0:
			return "unknown\n", nil
		}
		return "full\n", nil
	}},
	// flags is dev->flags (net-sysfs's format_flags), not the ioctl view with RUNNING
	// and LOWER_UP; a write goes through dev_change_flags: IFF_UP (up/down as ip link
	// set), IFF_MULTICAST, PROMISC and ALLMULTI, and the bits a netdev only stores.
	{name: "flags", netAdmin: true, perm: 0644, read: func(i *ipoib.Interface) (string, error) { return fmt.Sprintf("%#x\n", i.Flags()), nil },
		write: func(i *ipoib.Interface, b []byte) error {
			v, err := kstrtoul(b)
			if err != nil {
				return err
			}
			// change_flags passes (unsigned int)new_flags: the bits above 32 are dropped.
			return i.SetFlags(uint32(v))
		}},
	// ifalias follows the device's (ip link set alias) both ways; net-sysfs ignores one
	// trailing newline of a write and shows nothing without an alias.
	{name: "ifalias", netAdmin: true, perm: 0644, read: aliasRead[*ipoib.Interface], write: aliasWrite[*ipoib.Interface], slow: true},
	{name: "ifindex", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return ifIndexText(i.IfIndex(), i) }},
	{name: "iflink", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return ifIndexText(i.IfLink(), i) }},
	{name: "link_mode", perm: 0444, read: func(*ipoib.Interface) (string, error) { return "0\n", nil }},
	{name: "mode", perm: 0644, read: func(i *ipoib.Interface) (string, error) { return i.Mode().String() + "\n", nil },
		write: func(i *ipoib.Interface, b []byte) error {
			m, err := parseMode(b)
			if err != nil {
				return err
			}
			return i.SetMode(m)
		}},
	{name: "mtu", netAdmin: true, perm: 0644, read: func(i *ipoib.Interface) (string, error) { return fmt.Sprintf("%d\n", i.MTU()), nil },
		write: func(i *ipoib.Interface, b []byte) error {
			v, err := parseMTU(b)
			if err != nil {
				return err
			}
			return i.SetMTU(v)
		}},
	{name: "operstate", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return i.OperState() + "\n", nil }},
	{name: "parent", perm: 0444, scope: childOnly, read: func(i *ipoib.Interface) (string, error) {
		p := i.Parent()
		if p == nil {
			return "", errorf(syscall.ENOENT, "%s has no parent", i.Name())
		}
		return p.Name() + "\n", nil
	}},
	{name: "pkey", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return fmt.Sprintf("0x%04x\n", uint16(i.PKey())), nil }},
	{name: "speed", perm: 0444, read: func(i *ipoib.Interface) (string, error) {
		mbps, err := linkSpeed(i)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%d\n", mbps), nil
	}},
	{name: "tx_queue_len", netAdmin: true, perm: 0644, read: func(i *ipoib.Interface) (string, error) { return fmt.Sprintf("%d\n", i.TxQueueLen()), nil },
		write: func(i *ipoib.Interface, b []byte) error {
			v, err := kstrtoul(b)
			if err != nil {
				return err
			}
			if v > 1<<32-1 { // net-sysfs: a length must fit unsigned int
				return errorf(syscall.ERANGE, "%q does not fit an unsigned int", clip(b))
			}
			return i.SetTxQueueLen(uint32(v))
		}},
	{name: "type", perm: 0444, read: func(*ipoib.Interface) (string, error) { return "32\n", nil }},
	{name: "umcast", perm: 0644, read: func(i *ipoib.Interface) (string, error) { return yes01(i.Umcast()), nil },
		write: func(i *ipoib.Interface, b []byte) error {
			i.SetUmcast(parseUmcast(b))
			return nil
		}},
}

// ifAttrIndex is ifAttrs by name, for lookups.
var ifAttrIndex = func() map[string]int {
	m := make(map[string]int, len(ifAttrs))
	for k := range ifAttrs {
		m[ifAttrs[k].name] = k
	}
	return m
}()

// zeroStats are net-sysfs's other statistics files (of its 24): counters of hardware
// error kinds a software link never has, always 0 here as on the kernel driver.
var zeroStats = []string{"collisions", "rx_compressed", "rx_crc_errors", "rx_errors", "rx_fifo_errors",
	"rx_frame_errors", "rx_length_errors", "rx_missed_errors", "rx_nohandler", "rx_over_errors",
	"tx_aborted_errors", "tx_carrier_errors", "tx_compressed", "tx_fifo_errors", "tx_heartbeat_errors",
	"tx_window_errors"}

func zeroStat(*ipoib.Interface) (string, error) { return "0\n", nil }

func statReader(k int) func(i *ipoib.Interface) (string, error) {
	return func(i *ipoib.Interface) (string, error) {
		return strconv.FormatUint(i.Stats().Values()[k], 10) + "\n", nil
	}
}

// ethtoolAttrs is class/net/<if>/ethtool/: what `ethtool -c/-C`, `-k/-K` and `-S` show
// and change for an IPoIB device (reference/kernel-ipoib.md §8).
var ethtoolAttrs = []ifAttr{
	// Changes need CAP_NET_ADMIN, as the ethtool ioctl's set commands do.
	{name: "coalesce", netAdmin: true, perm: 0644, read: func(i *ipoib.Interface) (string, error) {
		c := i.Coalesce()
		return fmt.Sprintf("rx-usecs: %d\nrx-frames: %d\n", c.RxUsecs, c.RxFrames), nil
	}, write: func(i *ipoib.Interface, b []byte) error {
		c, err := parseCoalesce(i.Coalesce(), b)
		if err != nil {
			return err
		}
		return i.SetCoalesce(c)
	}},
	{name: "features", netAdmin: true, perm: 0644, read: func(i *ipoib.Interface) (string, error) {
		eff, req := i.Features(), i.RequestedFeatures()
		var b strings.Builder
		for _, f := range featureNames {
			e, r := f.get(eff), f.get(req)
			switch {
			case e:
				fmt.Fprintf(&b, "%s: on\n", f.long)
			case r:
				fmt.Fprintf(&b, "%s: off [requested on]\n", f.long)
			default:
				fmt.Fprintf(&b, "%s: off\n", f.long)
			}
		}
		return b.String(), nil
	}, write: func(i *ipoib.Interface, b []byte) error {
		f, err := parseFeatures(i.RequestedFeatures(), b)
		if err != nil {
			return err
		}
		i.SetFeatures(f)
		return nil
	}},
	{name: "statistics", perm: 0444, read: func(i *ipoib.Interface) (string, error) {
		var b strings.Builder
		b.WriteString("NIC statistics:\n")
		for k, v := range i.Stats().Values() {
			fmt.Fprintf(&b, "     %s: %d\n", ipoib.StatNames[k], v)
		}
		return b.String(), nil
	}},
}

// dhcpAttrs are class/net/<if>/dhcp/: the DHCP client identifiers the vendor guide
// describes for IPoIB (RFC 4390: the 20-byte hardware address does not fit chaddr, so
// the client identifier option names the client), for an admin to put into a DHCP
// server's host reservations.
var dhcpAttrs = []ifAttr{
	// The boot firmware's form: ff:00:00:00:00:00:02:00:00:02:c9:00: and the port GUID.
	{name: "client_id", perm: 0444, read: func(i *ipoib.Interface) (string, error) {
		return colonHex(i.DHCPClientID()), nil
	}},
	// The older form: type 0x20 (InfiniBand) and the 20-byte hardware address.
	{name: "client_id_hwaddr", perm: 0444, read: func(i *ipoib.Interface) (string, error) {
		hw := i.HWAddr()
		return colonHex(append([]byte{0x20}, hw[:]...)), nil
	}},
	// The lease of the daemon's DHCP client (BOOTPROTO=dhcp); empty without one.
	{name: "lease", perm: 0444, read: func(i *ipoib.Interface) (string, error) { return i.DHCPLease(), nil }},
}

func colonHex(b []byte) string {
	var s strings.Builder
	for k, c := range b {
		if k > 0 {
			s.WriteByte(':')
		}
		fmt.Fprintf(&s, "%02x", c)
	}
	s.WriteByte('\n')
	return s.String()
}
