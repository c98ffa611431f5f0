package fs

import (
	"fmt"
	"sort"
	"syscall"

	"ipoibfs/ipoib"
)

// The bonding driver's files (drivers/net/bonding/bond_sysfs.c), for the tree's bonds
// (Options.Bonds): class/net/bonding_masters, and per bond class/net/<bond>/ with the
// net-sysfs files a bond has and bonding/. Writes parse as the driver parses them
// (ipoib.Bond.SetOption) and give its errnos. The driver checks no capability beyond
// the files' root ownership; here, as for every file that changes the network, writes
// also need CAP_NET_ADMIN.

// bondNodes are class/net's bonding entries: bonding_masters and a directory per bond.
func (t *Tree) bondNodes(dir string) []*Node {
	if t.bonds == nil || !t.bonds.Loaded() {
		return nil // no bonding module: no bonding_masters
	}
	bs := t.bonds
	m := t.file(dir, "bonding_masters", 0644, func() (string, error) { return bs.MastersText(), nil }, bs.WriteMasters)
	m.netAdmin = true
	out := []*Node{m}
	for _, b := range bs.List() {
		out = append(out, t.bondDir(dir, b))
	}
	return out
}

// bondOf is the bond called name, if there is one.
func (t *Tree) bondOf(name string) (*ipoib.Bond, bool) {
	if t.bonds == nil {
		return nil, false
	}
	return t.bonds.Bond(name)
}

// liveBond is b while it exists: a bond's files hold the bond, as an interface's hold
// the interface (live), and answer ENODEV once it is deleted.
func liveBond(b *ipoib.Bond) (*ipoib.Bond, error) {
	if !b.Listed() {
		return nil, errorf(syscall.ENODEV, "bond %s no longer exists", b.Name())
	}
	return b, nil
}

// bondAttr is one file of class/net/<bond>/.
type bondAttr struct {
	name  string
	perm  uint32
	read  func(b *ipoib.Bond) (string, error)
	write func(b *ipoib.Bond, p []byte) error
	slow  bool // a read asks the kernel (Node.Quick)
	// anyWriter: the write is refused before CAP_NET_ADMIN is asked (carrier);
	// every other writable file needs it.
	anyWriter bool
}

var bondAttrs = []bondAttr{
	{name: "addr_len", perm: 0444, read: func(b *ipoib.Bond) (string, error) { return fmt.Sprintf("%d\n", b.AddrLen()), nil }},
	{name: "address", perm: 0444, read: func(b *ipoib.Bond) (string, error) { return b.HWAddrText() + "\n", nil }},
	{name: "broadcast", perm: 0444, read: func(b *ipoib.Bond) (string, error) { return b.BroadcastText() + "\n", nil }},
	{name: "carrier", perm: 0644, anyWriter: true, read: func(b *ipoib.Bond) (string, error) {
		if !b.IsUp() {
			return "", errorf(syscall.EINVAL, "%s is down", b.Name())
		}
		return yes01(b.Carrier()), nil
	}, write: func(b *ipoib.Bond, p []byte) error {
		// As an interface's: carrier_store's first check, the bond has no
		// ndo_change_carrier (nor does it need CAP_NET_ADMIN to hear so).
		return errorf(syscall.EOPNOTSUPP, "%s: the carrier follows the slaves' links; it cannot be set", b.Name())
	}},
	// The carrier's changes, counted as the bond's device counts them (off at setup).
	{name: "carrier_changes", perm: 0444, read: carrierCount[*ipoib.Bond](func(up, down uint64) uint64 { return up + down })},
	{name: "carrier_down_count", perm: 0444, read: carrierCount[*ipoib.Bond](func(_, down uint64) uint64 { return down })},
	{name: "carrier_up_count", perm: 0444, read: carrierCount[*ipoib.Bond](func(up, _ uint64) uint64 { return up })},
	{name: "dormant", perm: 0444, read: dormant[*ipoib.Bond]},
	// duplex and speed: bond_ethtool_get_link_ksettings in active-backup, the active
	// slave's while it has a link (EINVAL while the bond is down, unknown otherwise).
	{name: "duplex", perm: 0444, read: func(b *ipoib.Bond) (string, error) {
		if !b.IsUp() {
			return "", errorf(syscall.EINVAL, "%s is down", b.Name())
		}
		if b.Carrier() && b.SpeedMbps() > 0 {
			return "full\n", nil
		}
		return "unknown\n", nil
	}},
	{name: "flags", perm: 0644, read: func(b *ipoib.Bond) (string, error) { return fmt.Sprintf("%#x\n", b.Flags()), nil },
		write: func(b *ipoib.Bond, p []byte) error {
			v, err := kstrtoul(p)
			if err != nil {
				return err
			}
			// change_flags passes (unsigned int)new_flags: the bits above 32 are dropped.
			b.SetFlags(uint32(v))
			return nil
		}},
	// As an interface's: follows the device's alias both ways.
	{name: "ifalias", perm: 0644, read: aliasRead[*ipoib.Bond], write: aliasWrite[*ipoib.Bond], slow: true},
	{name: "ifindex", perm: 0444, read: func(b *ipoib.Bond) (string, error) {
		if b.IfIndex() == 0 {
			return "", errorf(syscall.ENODEV, "%s has no kernel device", b.Name())
		}
		return fmt.Sprintf("%d\n", b.IfIndex()), nil
	}},
	{name: "link_mode", perm: 0444, read: func(*ipoib.Bond) (string, error) { return "0\n", nil }},
	{name: "mtu", perm: 0644, read: func(b *ipoib.Bond) (string, error) { return fmt.Sprintf("%d\n", b.MTU()), nil },
		write: func(b *ipoib.Bond, p []byte) error {
			v, err := parseMTU(p)
			if err != nil {
				return err
			}
			return b.SetMTU(v)
		}},
	{name: "operstate", perm: 0444, read: func(b *ipoib.Bond) (string, error) { return b.OperState() + "\n", nil }},
	{name: "speed", perm: 0444, read: func(b *ipoib.Bond) (string, error) {
		if !b.IsUp() {
			return "", errorf(syscall.EINVAL, "%s is down", b.Name())
		}
		if !b.Carrier() {
			return "-1\n", nil
		}
		return fmt.Sprintf("%d\n", b.SpeedMbps()), nil
	}},
	{name: "type", perm: 0444, read: func(b *ipoib.Bond) (string, error) { return fmt.Sprintf("%d\n", b.Type()), nil }},
}

func (t *Tree) bondFile(dir string, bond *ipoib.Bond, name string, perm uint32, read func(b *ipoib.Bond) (string, error), write func(b *ipoib.Bond, p []byte) error) *Node {
	var w func([]byte) error
	if write != nil {
		w = func(p []byte) error {
			b, err := liveBond(bond)
			if err != nil {
				return err
			}
			return write(b, p)
		}
	}
	n := t.fileOf(bond, dir, name, perm, func() (string, error) {
		b, err := liveBond(bond)
		if err != nil {
			return "", err
		}
		return read(b)
	}, w)
	n.netAdmin = write != nil
	return n
}

func (t *Tree) bondDir(dir string, b *ipoib.Bond) *Node {
	return t.dirOf(b, dir, b.Name(), func(d string) ([]*Node, error) {
		out := make([]*Node, 0, len(bondAttrs)+1)
		for _, a := range bondAttrs {
			n := t.bondFile(d, b, a.name, a.perm, a.read, a.write)
			n.slow = a.slow
			n.netAdmin = n.netAdmin && !a.anyWriter
			out = append(out, n)
		}
		out = append(out, t.dirOf(b, d, "bonding", func(d string) ([]*Node, error) {
			var out []*Node
			for _, opt := range ipoib.OptionNames {
				out = append(out, t.bondFile(d, b, opt, 0644,
					func(b *ipoib.Bond) (string, error) { return b.Option(opt) },
					func(b *ipoib.Bond, p []byte) error { return b.SetOption(opt, string(p)) }))
			}
			out = append(out, t.bondFile(d, b, "mii_status", 0444,
				func(b *ipoib.Bond) (string, error) { return b.Option("mii_status") }, nil))
			sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
			return out, nil
		}))
		sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
		return out, nil
	})
}

// bondingSlaveDir is class/net/<if>/bonding_slave/ while the interface is a slave
// (bond_sysfs_slave.c): state, mii_status, link_failure_count, perm_hwaddr.
func (t *Tree) bondingSlaveDir(dir string, i *ipoib.Interface) []*Node {
	if t.bonds == nil || i.Master() == nil {
		return nil
	}
	info := func(f func(s ipoib.SlaveInfo) string) func() (string, error) {
		return func() (string, error) {
			i, err := live(i)
			if err != nil {
				return "", err
			}
			b := i.Master()
			if b == nil {
				return "", errorf(syscall.ENODEV, "%s is no longer a slave", i.Name())
			}
			s, ok := b.SlaveInfo(i)
			if !ok {
				return "", errorf(syscall.ENODEV, "%s is no longer a slave", i.Name())
			}
			return f(s), nil
		}
	}
	return []*Node{t.dirOf(i, dir, "bonding_slave", func(d string) ([]*Node, error) {
		return []*Node{
			t.fileOf(i, d, "link_failure_count", 0444, info(func(s ipoib.SlaveInfo) string { return fmt.Sprintf("%d\n", s.LinkFailures) }), nil),
			t.fileOf(i, d, "mii_status", 0444, info(func(s ipoib.SlaveInfo) string { return s.MIIStatus + "\n" }), nil),
			t.fileOf(i, d, "perm_hwaddr", 0444, info(func(s ipoib.SlaveInfo) string { return s.PermHWAddr.String() + "\n" }), nil),
			t.fileOf(i, d, "state", 0444, info(func(s ipoib.SlaveInfo) string { return s.State + "\n" }), nil),
		}, nil
	})}
}
