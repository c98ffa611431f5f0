package main

import (
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"ipoibfs/ipoib"
	"ipoibfs/ipoib/kernel"
)

// ---- the bonds' kernel devices ----

// bondBridge connects a bond to its TUN device, as bridge does an interface: the device
// is the bond's Host and what the kernel sends out of it goes to Bond.Transmit.
type bondBridge struct {
	b    *ipoib.Bond
	dev  *kernel.Device
	bb   *bondBridges
	done chan struct{}
	adopter
}

// bondBridges keeps one bondBridge per bond, made and removed with the bond.
type bondBridges struct {
	bonds *ipoib.Bonds
	netns string
	brs   *bridges // the interfaces' devices: bonds have devices when they do
	mu    sync.Mutex
	m     map[*ipoib.Bond]*bondBridge
	off   bool // closed
}

// startBonds starts the engine's bonding layer with a TUN device per bond while the
// engine's interfaces have theirs.
func startBonds(e *ipoib.Engine, netns string, brs *bridges) *bondBridges {
	bb := &bondBridges{bonds: ipoib.NewBonds(e), netns: netns, brs: brs, m: map[*ipoib.Bond]*bondBridge{}}
	bb.bonds.SetDevices(bb)
	return bb
}

// CreateBond makes the bond's device, down, as a new bond is registered.
func (bb *bondBridges) CreateBond(b *ipoib.Bond) error {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if bb.off || bb.brs.isOff() {
		return nil
	}
	dev, err := openDevice(kernel.Config{Name: b.Name(), MTU: b.MTU(), NetNS: bb.netns, Offloads: offloads(b.Features())})
	if err != nil {
		_, err = openErr(b.Name(), "", err, false)
		return err
	}
	bb.brs.markMade()
	br := &bondBridge{b: b, dev: dev, bb: bb, done: make(chan struct{})}
	if ll := b.LinkLocal(); ll.IsValid() {
		br.logErr(dev.SetLinkLocal(ll))
	}
	b.AttachHost(br)
	b.SetIfIndex(dev.Index())
	if err := dev.SetUp(false); err != nil {
		b.AttachHost(nil)
		dev.Close()
		return err
	}
	dev.Watch(kernel.Events{Link: br.onLink, Addrs: br.onAddrs, Groups: b.SetHostGroups, Gone: br.onGone,
		Moved: func(err error) { logMoved(b.Name(), err) }})
	go br.txLoop()
	bb.m[b] = br
	return nil
}

// OtherDevice describes the bonds' namespace's device of that name (ipoib.OtherDevices:
// the driver's errnos for lo, eth0 and the like, and alternative names).
func (bb *bondBridges) OtherDevice(name string) (ipoib.OtherDevice, bool) {
	l, ok := kernel.LookupLink(bb.netns, name)
	return ipoib.OtherDevice{Name: l.Name, Up: l.Up, Master: l.Master, Busy: l.Busy}, ok
}

// DeleteBond removes the bond's device.
func (bb *bondBridges) DeleteBond(b *ipoib.Bond) {
	bb.mu.Lock()
	br := bb.m[b]
	delete(bb.m, b)
	bb.mu.Unlock()
	if br != nil {
		br.close()
	}
}

// device is the bond's kernel device, nil without one.
func (bb *bondBridges) device(b *ipoib.Bond) *kernel.Device {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if br := bb.m[b]; br != nil {
		return br.dev
	}
	return nil
}

// close deletes every bond (releasing the slaves) and its device.
func (bb *bondBridges) close() {
	bb.bonds.Close()
	bb.mu.Lock()
	bb.off = true
	bb.mu.Unlock()
}

func (br *bondBridge) logErr(err error) {
	if err != nil && !errors.Is(err, os.ErrClosed) {
		log.Printf("%s: %v", br.b.Name(), err)
	}
}

// onLink follows ip link on the bond: up and down, an MTU (through the bond's rules: a
// refused one is put back), and a rename, which is refused and put back.
func (br *bondBridge) onLink(l kernel.Link) {
	name := br.b.Name()
	if l.Name != name {
		log.Printf("%s: renamed to %s outside ipoibfs; bonds keep their names here, put back", name, l.Name)
		br.logErr(br.dev.SetName(name))
	}
	if l.MTUChanged {
		var err error
		br.adopt(attrMTU, l.MTU, func() { err = br.b.SetMTU(l.MTU) })
		if err != nil {
			log.Printf("%s: MTU %d set on the device refused, put back to %d: %v", name, l.MTU, br.b.MTU(), err)
			br.b.PushMTU()
		}
	}
	if l.UpChanged {
		br.adopt(attrUp, l.Up, func() { br.b.SetUp(l.Up) })
	}
	// As an interface's bridge: taken only while the bond still has the value the
	// device had before (a change in the tree since is newer).
	if l.MulticastChanged {
		br.adopt(attrMulticast, l.Multicast, func() {
			if br.outOfSync(attrMulticast) {
				br.b.SetMulticast(l.Multicast) // the newest: see adopter.failed
			} else if !br.b.AdoptMulticast(l.PrevMulticast, l.Multicast) {
				logNotAdopted(name, "multicast", l.Multicast)
			}
		})
	}
	if l.UserFlagsChanged {
		br.adopt(attrUserFlags, l.UserFlags, func() {
			if br.outOfSync(attrUserFlags) {
				br.b.SetUserFlags(l.UserFlags)
			} else if !br.b.AdoptUserFlags(l.PrevUserFlags, l.UserFlags) {
				logNotAdopted(name, "promisc/allmulti flags", fmt.Sprintf("%#x", l.UserFlags))
			}
		})
	}
	if l.AliasChanged {
		br.adopt(attrAlias, l.Alias, func() {
			took, err := true, error(nil)
			if br.outOfSync(attrAlias) {
				err = br.b.SetAlias(l.Alias)
			} else {
				took, err = br.b.AdoptAlias(l.PrevAlias, l.Alias)
			}
			br.logErr(err)
			if err == nil && !took {
				logNotAdopted(name, "alias", fmt.Sprintf("%q", l.Alias))
			}
		})
	}
	br.b.SetCounted(l.Counted)
	if l.FeaturesChanged {
		log.Printf("%s: offloads changed outside ipoibfs (ethtool -K); a bond's follow its slaves here, put back to %+v", name, br.b.Features())
		br.b.PushOffloads()
	}
	if l.Up && (l.UpChanged || l.MTUChanged) {
		br.ensureLinkLocal()
	}
}

func (br *bondBridge) onAddrs(p []netip.Prefix) {
	br.b.SetHostAddrs(p)
	if ll := br.b.LinkLocal(); ll.IsValid() && !slices.ContainsFunc(p, func(p netip.Prefix) bool { return p.Addr() == ll }) {
		br.ensureLinkLocal()
	}
}

func (br *bondBridge) ensureLinkLocal() {
	if ll := br.b.LinkLocal(); ll.IsValid() {
		if err := br.dev.EnsureLinkLocal(ll); err != nil && !errors.Is(err, syscall.ENODEV) {
			br.logErr(err)
		}
	}
}

// onGone: ip link del bond0 deletes the bond, as it unregisters a bond netdev.
func (br *bondBridge) onGone() {
	go func() {
		log.Printf("%s: device deleted with ip link; deleting the bond", br.b.Name())
		if err := br.bb.bonds.DeleteBond(br.b); err != nil {
			log.Printf("%s: %v", br.b.Name(), err)
		}
	}()
}

func (br *bondBridge) txLoop() {
	defer close(br.done)
	readLoop(br.dev, br.dev.Queue(0), br.b.Name, br.b.MTU, br.b.Transmit)
}

func (br *bondBridge) close() {
	br.b.AttachHost(nil)
	br.b.SetIfIndex(0)
	br.b.SetCounted(0)
	br.dev.Close()
	<-br.done
}

// Host methods.

func (br *bondBridge) Deliver(pkts [][]byte) {
	if _, err := br.dev.Write(pkts); err != nil && !errors.Is(err, os.ErrClosed) {
		log.Printf("%s: write to the kernel: %v", br.b.Name(), err)
	}
}

func (br *bondBridge) SetMTU(mtu int) {
	br.logErr(push(&br.adopter, attrMTU, mtu, br.dev.SetMTU, br.dev.SetMTUIfChanged))
}

// SetCarrier follows the bond's carrier, and the link settings ethtool and sysfs show
// with it (the active slave's rate, unknown without carrier or active slave); the bond
// pushes its carrier again when the active slave changes. Pushes are serialised.
func (br *bondBridge) SetCarrier(on bool) {
	br.logErr(br.dev.SetCarrier(on))
	speed := -1 // unknown
	if on {
		speed = br.b.SpeedMbps()
	}
	br.logErr(br.dev.SetSpeed(speed))
}

// ReadAlias reads the bond device's alias from the kernel (see ipoib.AliasReader).
func (br *bondBridge) ReadAlias() (string, error) { return br.dev.Alias() }

// SetAlias follows the bond's alias (an ifalias write).
func (br *bondBridge) SetAlias(s string) {
	br.logErr(push(&br.adopter, attrAlias, s, br.dev.SetAlias, br.dev.SetAliasIfChanged))
}

// SetMulticast follows the bond's IFF_MULTICAST (a flags write).
func (br *bondBridge) SetMulticast(on bool) {
	br.logErr(push(&br.adopter, attrMulticast, on, br.dev.SetMulticast, br.dev.SetMulticastIfChanged))
}

// SetUserFlags follows the bond's IFF_PROMISC and IFF_ALLMULTI (a flags write).
func (br *bondBridge) SetUserFlags(f uint32) {
	br.logErr(push(&br.adopter, attrUserFlags, f, br.dev.SetUserFlags, br.dev.SetUserFlagsIfChanged))
}

// SetAdminUp follows the bond's up/down (a write of flags).
func (br *bondBridge) SetAdminUp(up bool) {
	br.logErr(push(&br.adopter, attrUp, up, br.dev.SetUp, br.dev.SetUpIfChanged))
}

var (
	_ ipoib.MulticastHost = (*bondBridge)(nil)
	_ ipoib.UserFlagsHost = (*bondBridge)(nil)
	_ ipoib.AdminHost     = (*bondBridge)(nil)
	_ ipoib.AliasHost     = (*bondBridge)(nil)
	_ ipoib.OtherDevices  = (*bondBridges)(nil)
	_ ipoib.AliasReader   = (*bondBridge)(nil)
)

func (br *bondBridge) SetOffloads(f ipoib.Features) { br.logErr(br.dev.SetOffloads(offloads(f))) }

// SetLinkLocal puts the bond's link-local address (its first slave's GUID) on the
// device, in place of the one the kernel made up for a device without an address.
func (br *bondBridge) SetLinkLocal(ll netip.Addr) { br.logErr(br.dev.EnsureLinkLocal(ll)) }

// ---- ifcfg files: ifcfg-bond<n> and the slaves' MASTER=/SLAVE=yes ----

// bondCfg is what a bond master's file says about the bond.
type bondCfg struct {
	opts [][2]string // BONDING_OPTS name=value, in order
}

// bondingKeys are the ifcfg keys of bonding.
var bondingKeys = []string{"MASTER", "SLAVE", "BONDING_OPTS", "BONDING_MASTER"}

// ignoredBondOpts are driver options the bonds here do not have (their defaults are
// what they do): logged and ignored, as unknown keys are.
var ignoredBondOpts = []string{"updelay", "downdelay", "use_carrier", "num_grat_arp",
	"num_unsol_na", "resend_igmp", "all_slaves_active", "peer_notif_delay", "max_bonds", "lp_interval"}

// isBondMaster says whether a file describes a bond: TYPE=Bond, BONDING_MASTER=yes or
// BONDING_OPTS.
func isBondMaster(vals map[string]string) bool {
	_, opts := vals["BONDING_OPTS"]
	return strings.EqualFold(vals["TYPE"], "Bond") || strings.EqualFold(vals["BONDING_MASTER"], "yes") || opts
}

// parseIfcfgBonding reads the bonding keys of a file (parseIfcfg has checked the
// others): a master's BONDING_OPTS, each option checked as a write of its bonding file
// would be; a slave's MASTER with SLAVE=yes.
func parseIfcfgBonding(c *ifcfg, vals map[string]string, lines map[string]int, bad func(k, format string, a ...any) error) error {
	master, slave := vals["MASTER"], strings.EqualFold(vals["SLAVE"], "yes")
	if isBondMaster(vals) {
		if master != "" || slave {
			return bad("MASTER", "a bond cannot be a slave here")
		}
		if _, ok := vals["PKEY"]; ok {
			return bad("PKEY", "a bond has no P_Key of its own (its slaves have)")
		}
		if _, ok := vals["CONNECTED_MODE"]; ok {
			return bad("CONNECTED_MODE", "the mode is the slaves': set it in their files")
		}
		if c.dhcp {
			return bad("BOOTPROTO", "dhcp on a bond is not supported")
		}
		b := &bondCfg{}
		for _, o := range strings.Fields(vals["BONDING_OPTS"]) {
			k, v, ok := strings.Cut(o, "=")
			if !ok || k == "" {
				return bad("BONDING_OPTS", "%q is not name=value", clipLine(o))
			}
			if slices.Contains(ignoredBondOpts, k) {
				c.unknown = append(c.unknown, fmt.Sprintf("%s:%d: BONDING_OPTS %s", filepath.Base(c.file), lines["BONDING_OPTS"], k))
				continue
			}
			if err := ipoib.CheckBondOption(k, v); err != nil {
				var e *ipoib.Error
				if errors.As(err, &e) && e.Detail != "" {
					return bad("BONDING_OPTS", "%s: %s", k, e.Detail)
				}
				return bad("BONDING_OPTS", "%s: %v", k, err)
			}
			b.opts = append(b.opts, [2]string{k, v})
		}
		c.bond = b
		return nil
	}
	if _, ok := vals["SLAVE"]; ok && !slave && !strings.EqualFold(vals["SLAVE"], "no") {
		return bad("SLAVE", "%q is neither yes nor no", vals["SLAVE"])
	}
	switch {
	case master != "" && !slave:
		return bad("MASTER", "MASTER=%s needs SLAVE=yes", master)
	case slave && master == "":
		return bad("SLAVE", "SLAVE=yes needs MASTER (the bond)")
	case master == "":
		return nil
	}
	if c.addr.IsValid() || c.dhcp {
		return bad("MASTER", "a slave has no address of its own (the bond has)")
	}
	c.master = master
	return nil
}

// applyBonds applies the bonding files after the others, as ifup does: each bond is
// made and given its options, its slaves (their files' MASTER) brought down and
// enslaved, then the bond gets its MTU, comes up and gets its address. A problem fails
// that bond or slave only, logged with its file.
func (a *ifcfgApplier) applyBonds(cfgs []*ifcfg, logf func(string, ...any)) {
	var masters, slaves []*ifcfg
	for _, c := range cfgs {
		switch {
		case !c.onboot:
		case c.bond != nil:
			masters = append(masters, c)
		case c.master != "":
			slaves = append(slaves, c)
		}
	}
	if len(masters)+len(slaves) == 0 {
		return
	}
	if a.bonds == nil {
		logf("bonding files ignored: no bonding here")
		return
	}
	a.bonds.bonds.Load() // as ifup loads the bonding module for a bond's file
	ok := map[string]*ipoib.Bond{}
	running := map[string]bool{} // bonds that had slaves before this pass
	for _, c := range masters {
		if b, ok := a.bonds.bonds.Bond(c.device); ok {
			running[c.device] = len(b.Slaves()) > 0
		}
		b, err := a.applyBondOpts(c, false, logf)
		if err != nil {
			logf("%s: %v", filepath.Base(c.file), err)
			continue
		}
		ok[c.device] = b
	}
	for _, c := range slaves {
		if err := a.enslave(c, ok[c.master]); err != nil {
			logf("%s: %v", filepath.Base(c.file), err)
		}
	}
	for _, c := range masters {
		// active_slave, which names a slave, once the slaves are in; only for a bond
		// that had none: on a bond that runs, the active slave is the bond's own
		// choice (a reload must not force a failback, nor fail while that slave is
		// down), and the file's is said not to apply.
		b := ok[c.device]
		switch {
		case b == nil:
		case !running[c.device]:
			_, _ = a.applyBondOpts(c, true, logf)
		default:
			for _, o := range c.bond.opts {
				if o[0] != "active_slave" {
					continue
				}
				if cur, _ := b.Option("active_slave"); !sameBondValue(cur, o[1]) {
					log.Printf("%s: BONDING_OPTS active_slave=%s not applied to the running %s (its active slave stays %s)",
						filepath.Base(c.file), o[1], c.device, strings.TrimSpace(cur))
				}
			}
		}
	}
	for _, c := range masters {
		if b := ok[c.device]; b != nil {
			if err := a.bondUp(c, b); err != nil {
				logf("%s: %v", filepath.Base(c.file), err)
			}
		}
	}
}

// applyBondOpts makes the bond if it does not exist and sets the options that differ
// from what it has (a SIGHUP applies the file again to a bond that is up); with
// enslaved, only active_slave, which names a slave and so comes after them. As the
// initscripts write each option on its own, one the bond refuses is logged and the
// others still go; an option that may only change without slaves (fail_over_mac) is
// not written again to a bond that has them.
func (a *ifcfgApplier) applyBondOpts(c *ifcfg, enslaved bool, logf func(string, ...any)) (*ipoib.Bond, error) {
	b, ok := a.bonds.bonds.Bond(c.device)
	if !ok {
		if enslaved {
			return nil, nil
		}
		var err error
		if b, err = a.bonds.bonds.Create(c.device); err != nil {
			return nil, err
		}
	}
	for _, o := range c.bond.opts {
		switch {
		case o[0] == "mode":
			continue // checked at parse time: active-backup, the only mode
		case (o[0] == "active_slave") != enslaved:
			continue
		case o[0] == "fail_over_mac" && len(b.Slaves()) > 0:
			continue
		}
		if cur, _ := b.Option(o[0]); sameBondValue(cur, o[1]) {
			continue
		}
		if err := b.SetOption(o[0], o[1]+"\n"); err != nil {
			logf("%s: BONDING_OPTS %s=%s: %v", filepath.Base(c.file), o[0], o[1], err)
		}
	}
	return b, nil
}

// sameBondValue says whether a bonding file's text (miimon "100", fail_over_mac
// "active 1") already says value.
func sameBondValue(cur, value string) bool {
	for _, f := range strings.Fields(cur) {
		if f == value {
			return true
		}
	}
	return false
}

// enslave makes the slave's interface (a child is created as its file says) and
// enslaves it, down first as ifup-eth brings a slave down.
func (a *ifcfgApplier) enslave(c *ifcfg, b *ipoib.Bond) error {
	if b == nil {
		return fmt.Errorf("MASTER %s: no such bond (its ifcfg-%s is missing or bad)", c.master, c.master)
	}
	i, err := a.iface(c)
	if err != nil {
		return err
	}
	switch m := i.Master(); {
	case m == b:
		return nil // already
	case m != nil:
		return fmt.Errorf("%s is a slave of %s, not %s", c.device, m.Name(), b.Name())
	}
	if c.mode != nil {
		if err := i.SetMode(*c.mode); err != nil {
			return err
		}
	}
	if err := i.SetUp(false); err != nil {
		return err
	}
	return b.SetOption("slaves", "+"+c.device+"\n")
}

// bondUp sets the bond's MTU, brings it up and puts its address on its device.
func (a *ifcfgApplier) bondUp(c *ifcfg, b *ipoib.Bond) error {
	if c.mtu != 0 && c.mtu != b.MTU() {
		if err := b.SetMTU(c.mtu); err != nil {
			return err
		}
	}
	dev := a.bonds.device(b)
	if dev != nil {
		if err := dev.SetUp(true); err != nil {
			return err
		}
	}
	b.SetUp(true)
	return a.setAddr(c, dev)
}
