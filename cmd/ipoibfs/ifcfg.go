package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"ipoibfs/ipoib"
	"ipoibfs/ipoib/dhcp"
	"ipoibfs/ipoib/kernel"
	"ipoibfs/verbs"
)

// ifcfg is one network-scripts interface file (ifcfg-ib0, ifcfg-ib0.8003), as the
// vendor guide configures IPoIB: what the daemon applies from it.
type ifcfg struct {
	file      string
	device    string
	onboot    bool
	addr      netip.Prefix // IPADDR with NETMASK/PREFIX; invalid: none
	dhcp      bool         // BOOTPROTO=dhcp
	clientID  []byte       // DHCP_CLIENT_ID; nil: the interface's dhcp/client_id
	broadcast netip.Addr
	mtu       int
	mode      *ipoib.Mode // CONNECTED_MODE; nil: unchanged
	pkey      int64       // PKEY=yes: the child's P_Key (PKEY_ID), full-member bit set
	physdev   string
	unknown   []string // "file:line: KEY" of keys ignored
	bond      *bondCfg // a bond's file (bond.go)
	master    string   // a slave's MASTER
}

// ifcfgError is "file:line: reason".
type ifcfgError struct {
	file string
	line int
	msg  string
}

func (e *ifcfgError) Error() string { return fmt.Sprintf("%s:%d: %s", e.file, e.line, e.msg) }

// parseIfcfg reads one file: KEY=VALUE lines, values optionally in single or double
// quotes (no expansion), # comments. Every value is checked; the first bad one is the
// file's error, and nothing of a bad file is applied.
func parseIfcfg(file string, b []byte) (*ifcfg, error) {
	c := &ifcfg{file: file, onboot: true}
	base := filepath.Base(file)
	c.device = strings.TrimPrefix(base, "ifcfg-")
	lines := map[string]int{}
	vals := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, &ifcfgError{base, n, fmt.Sprintf("%q is not KEY=VALUE", clipLine(l))}
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		} else if strings.ContainsAny(v, "\"'` $") {
			return nil, &ifcfgError{base, n, fmt.Sprintf("%s: unbalanced quotes or shell syntax in %q", k, clipLine(v))}
		}
		vals[k], lines[k] = v, n
	}
	if err := sc.Err(); err != nil {
		return nil, &ifcfgError{base, 0, err.Error()}
	}
	bad := func(k, format string, a ...any) error {
		return &ifcfgError{base, lines[k], k + ": " + fmt.Sprintf(format, a...)}
	}
	yesNo := func(k string) (bool, error) {
		switch strings.ToLower(vals[k]) {
		case "yes", "y", "1", "true":
			return true, nil
		case "no", "n", "0", "false":
			return false, nil
		}
		return false, bad(k, "%q is neither yes nor no", vals[k])
	}
	for k := range vals {
		switch k {
		case "DEVICE", "TYPE", "ONBOOT", "BOOTPROTO", "IPADDR", "NETMASK", "PREFIX", "BROADCAST", "NETWORK",
			"MTU", "CONNECTED_MODE", "PKEY", "PKEY_ID", "PHYSDEV", "NAME", "USERCTL", "NM_CONTROLLED", "DHCP_CLIENT_ID":
		case "MASTER", "SLAVE", "BONDING_OPTS", "BONDING_MASTER": // parseIfcfgBonding (bond.go)
		default:
			c.unknown = append(c.unknown, fmt.Sprintf("%s:%d: %s", base, lines[k], k))
		}
	}
	sort.Strings(c.unknown)
	if d, ok := vals["DEVICE"]; ok {
		if d != c.device {
			return nil, bad("DEVICE", "%q is not the file's interface %q", d, c.device)
		}
	}
	if t, ok := vals["TYPE"]; ok && !strings.EqualFold(t, "InfiniBand") && !(strings.EqualFold(t, "Bond") && isBondMaster(vals)) {
		return nil, bad("TYPE", "%q: only InfiniBand interfaces are ipoibfs's", t)
	}
	if _, ok := vals["ONBOOT"]; ok {
		on, err := yesNo("ONBOOT")
		if err != nil {
			return nil, err
		}
		c.onboot = on
	}
	switch p := strings.ToLower(vals["BOOTPROTO"]); p {
	case "", "none", "static":
	case "dhcp":
		c.dhcp = true
	case "bootp":
		return nil, bad("BOOTPROTO", "bootp is not supported (dhcp is)")
	default:
		return nil, bad("BOOTPROTO", "%q: static, none or dhcp", vals["BOOTPROTO"])
	}
	if id, ok := vals["DHCP_CLIENT_ID"]; ok && id != "" {
		// NetworkManager's key, as colon-separated hex like dhcp/client_id shows it.
		b, err := hex.DecodeString(strings.ReplaceAll(id, ":", ""))
		if err != nil || len(b) < 2 || len(b) > 255 {
			return nil, bad("DHCP_CLIENT_ID", "%q is not 2 to 255 bytes of colon-separated hex", clipLine(id))
		}
		c.clientID = b
	}
	// With dhcp, initscripts ignore IPADDR and friends: the server gives the address.
	if a, ok := vals["IPADDR"]; ok && a != "" && !c.dhcp {
		ip, err := netip.ParseAddr(a)
		if err != nil || !ip.Is4() {
			return nil, bad("IPADDR", "%q is not an IPv4 address", a)
		}
		bits := -1
		if m, ok := vals["NETMASK"]; ok && m != "" {
			mask, err := netip.ParseAddr(m)
			if err != nil || !mask.Is4() {
				return nil, bad("NETMASK", "%q is not an IPv4 netmask", m)
			}
			if bits = maskBits(mask.As4()); bits < 0 {
				return nil, bad("NETMASK", "%q is not contiguous", m)
			}
		}
		if p, ok := vals["PREFIX"]; ok && p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || n > 32 {
				return nil, bad("PREFIX", "%q is not 0..32", p)
			}
			if bits >= 0 && bits != n {
				return nil, bad("PREFIX", "%d contradicts NETMASK (/%d)", n, bits)
			}
			bits = n
		}
		if bits < 0 { // ifup's ipcalc default: the address's class
			switch first := ip.As4()[0]; {
			case first < 128:
				bits = 8
			case first < 192:
				bits = 16
			default:
				bits = 24
			}
		}
		c.addr = netip.PrefixFrom(ip, bits)
		if b, ok := vals["BROADCAST"]; ok && b != "" {
			bc, err := netip.ParseAddr(b)
			if err != nil || !bc.Is4() {
				return nil, bad("BROADCAST", "%q is not an IPv4 address", b)
			}
			c.broadcast = bc
		}
	}
	if m, ok := vals["MTU"]; ok && m != "" {
		n, err := strconv.Atoi(m)
		if err != nil || n < 68 || n > 65520 {
			return nil, bad("MTU", "%q is not 68..65520", m)
		}
		c.mtu = n
	}
	if _, ok := vals["CONNECTED_MODE"]; ok {
		on, err := yesNo("CONNECTED_MODE")
		if err != nil {
			return nil, err
		}
		m := ipoib.Datagram
		if on {
			m = ipoib.Connected
		}
		c.mode = &m
	}
	if _, ok := vals["PKEY"]; ok {
		on, err := yesNo("PKEY")
		if err != nil {
			return nil, err
		}
		if on {
			if t := vals["TYPE"]; !strings.EqualFold(t, "InfiniBand") {
				return nil, bad("PKEY", "a partition interface needs TYPE=InfiniBand")
			}
			id, err := strconv.ParseInt(vals["PKEY_ID"], 0, 64)
			if err != nil || id <= 0 || id > 0xffff || id&0x7fff == 0 {
				return nil, bad("PKEY_ID", "%q is not a P_Key", vals["PKEY_ID"])
			}
			c.pkey = id | 0x8000
			c.physdev = vals["PHYSDEV"]
			if c.physdev == "" {
				return nil, bad("PKEY", "PHYSDEV (the parent interface) is missing")
			}
			if want := ipoib.ChildName(c.physdev, verbs.PKey(c.pkey)); c.device != want {
				return nil, bad("PKEY_ID", "the child of %s with P_Key 0x%04x is %s, not %s", c.physdev, c.pkey, want, c.device)
			}
		}
	}
	if err := parseIfcfgBonding(c, vals, lines, bad); err != nil {
		return nil, err
	}
	return c, nil
}

func maskBits(m [4]byte) int {
	v := uint32(m[0])<<24 | uint32(m[1])<<16 | uint32(m[2])<<8 | uint32(m[3])
	n := 0
	for v&0x80000000 != 0 {
		n++
		v <<= 1
	}
	if v != 0 {
		return -1
	}
	return n
}

func clipLine(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// loadIfcfgDir parses every ifcfg-* file of dir. Bad files are returned as errors and
// left out; the good ones come back parents first.
func loadIfcfgDir(dir string) ([]*ifcfg, []error) {
	names, err := filepath.Glob(filepath.Join(dir, "ifcfg-*"))
	if err != nil {
		return nil, []error{err}
	}
	var out []*ifcfg
	var errs []error
	for _, n := range names {
		if strings.HasSuffix(n, "~") || strings.HasSuffix(n, ".bak") || strings.HasSuffix(n, ".orig") {
			continue // editor leftovers, as network-scripts skips them
		}
		b, err := os.ReadFile(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c, err := parseIfcfg(n, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].pkey == 0 && out[b].pkey != 0 })
	return out, errs
}

// ifcfgApplier applies ifcfg files to the engine and the kernel devices, remembering
// the address it set on each interface so that an edited file replaces it, and the DHCP
// client it runs for each BOOTPROTO=dhcp interface.
type ifcfgApplier struct {
	dir   string // a directory of ifcfg-* files, or one installer-style file
	netns string // where the LAN interface of an installer file is
	eng   *ipoib.Engine
	brs   *bridges
	addrs map[string]netip.Prefix
	dhcp  map[string]*dhcpClient
	bonds *bondBridges // ifcfg-bond<n> and slaves (bond.go); nil: no bonding

	mu      sync.Mutex // apply and the deletion watcher (dhcp, addrs)
	unwatch func()     // stops the deletion watcher; nil until a DHCP client runs
}

// dhcpClient is the DHCP client of one interface and what it was started with.
type dhcpClient struct {
	i  *ipoib.Interface
	id []byte
	c  *dhcp.Client
}

// apply loads the directory and applies every good file; each problem is logged as
// "file:line: reason" and the other files still apply. It returns how many problems
// were logged (unknown keys, which are ignored, are not problems).
func (a *ifcfgApplier) apply(logf func(string, ...any)) (problems int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	warn := logf
	logf = func(format string, args ...any) { problems++; warn(format, args...) }
	var cfgs []*ifcfg
	var errs []error
	if st, err := os.Stat(a.dir); err == nil && !st.IsDir() {
		b, err := os.ReadFile(a.dir)
		if err == nil {
			cfgs, err = parseInstallerFile(a.dir, b, a.lanAddr)
		}
		if err != nil {
			errs = append(errs, err)
		}
	} else {
		cfgs, errs = loadIfcfgDir(a.dir)
	}
	// DHCP clients run on for files that still ask for them, and for bad files, of
	// which nothing changes; the others stop and release their leases.
	keep := map[string]bool{}
	for _, err := range errs {
		logf("%v; the file is not applied", err)
		if fe := (*ifcfgError)(nil); errors.As(err, &fe) {
			keep[strings.TrimPrefix(fe.file, "ifcfg-")] = true
		}
	}
	for _, c := range cfgs {
		for _, u := range c.unknown {
			warn("%s: unknown key ignored", u)
		}
		keep[c.device] = keep[c.device] || c.dhcp && c.onboot
		if err := a.applyOne(c); err != nil {
			logf("%s: %v", filepath.Base(c.file), err)
		}
	}
	a.applyBonds(cfgs, logf)
	for dev := range a.dhcp {
		if !keep[dev] {
			a.stopDHCP(dev)
		}
	}
	return problems
}

// iface is the file's interface, made when the file describes a P_Key child
// (PKEY_ID, PHYSDEV) that does not exist yet.
func (a *ifcfgApplier) iface(c *ifcfg) (*ipoib.Interface, error) {
	if i, ok := a.eng.Interface(c.device); ok {
		return i, nil
	}
	if c.pkey == 0 {
		return nil, fmt.Errorf("no interface %s", c.device)
	}
	p, ok := a.eng.Interface(c.physdev)
	if !ok {
		return nil, fmt.Errorf("PHYSDEV %s: no such interface", c.physdev)
	}
	return p.CreateChild(c.pkey)
}

func (a *ifcfgApplier) applyOne(c *ifcfg) error {
	if !c.onboot {
		return nil // ONBOOT=no: left to the administrator
	}
	if c.bond != nil || c.master != "" {
		return nil // bonds and their slaves: applyBonds, after the others
	}
	i, err := a.iface(c)
	if err != nil {
		return err
	}
	if err := i.SetUp(true); err != nil {
		return err
	}
	if c.mode != nil {
		if err := i.SetMode(*c.mode); err != nil {
			return err
		}
	}
	if c.mtu != 0 {
		if err := i.SetMTU(c.mtu); err != nil {
			return err
		}
	}
	prev, had := a.addrs[c.device]
	if c.dhcp {
		if had { // the static address an earlier version of the file set
			if dev := a.brs.device(i); dev != nil {
				if err := dev.DelAddr(prev); err != nil {
					return err
				}
			}
			delete(a.addrs, c.device)
		}
		return a.startDHCP(c, i)
	}
	a.stopDHCP(c.device)
	return a.setAddr(c, a.brs.device(i))
}

// setAddr puts the file's address on dev (an interface's or a bond's device),
// replacing the one an earlier version of the file set; nil dev: the device is not
// there (no TUN permission), an error only when there is an address to put.
func (a *ifcfgApplier) setAddr(c *ifcfg, dev *kernel.Device) error {
	prev, had := a.addrs[c.device]
	if !c.addr.IsValid() && !had {
		return nil
	}
	if dev == nil {
		return fmt.Errorf("%s has no kernel device to put %s on", c.device, c.addr)
	}
	if had && prev != c.addr {
		if err := dev.DelAddr(prev); err != nil {
			return err
		}
		delete(a.addrs, c.device)
	}
	if c.addr.IsValid() {
		if err := dev.AddAddr(c.addr, c.broadcast); err != nil {
			return err
		}
		a.addrs[c.device] = c.addr
	}
	return nil
}

// startDHCP runs the interface's DHCP client unless it runs already (with the same
// identifier, on the same interface: a child deleted and made again is another).
func (a *ifcfgApplier) startDHCP(c *ifcfg, i *ipoib.Interface) error {
	id := c.clientID
	if id == nil {
		id = i.DHCPClientID()
	}
	if r := a.dhcp[c.device]; r != nil {
		if r.i == i && bytes.Equal(r.id, id) {
			return nil
		}
		a.stopDHCP(c.device)
	}
	if a.brs.device(i) == nil {
		return fmt.Errorf("%s has no kernel device to run DHCP on", c.device)
	}
	tr, err := dhcp.Open(a.netns, i.Name)
	if err != nil {
		return err
	}
	if a.dhcp == nil {
		a.dhcp = map[string]*dhcpClient{}
	}
	if a.unwatch == nil {
		a.watchDeleted()
	}
	a.dhcp[c.device] = &dhcpClient{i: i, id: id, c: dhcp.Start(dhcp.Config{
		ClientID: id, Transport: tr, Host: dhcpHost{a.brs, i},
		OnLease: func(l *dhcp.Lease) {
			if l == nil {
				i.SetDHCPLease("")
			} else {
				i.SetDHCPLease(l.String())
			}
		},
		Logf: func(format string, args ...any) { log.Printf("%s: %s", i.Name(), fmt.Sprintf(format, args...)) },
	})}
	return nil
}

// stopDHCP stops an interface's client, which releases its lease.
func (a *ifcfgApplier) stopDHCP(device string) {
	if r := a.dhcp[device]; r != nil {
		r.c.Close()
		delete(a.dhcp, device)
	}
}

// close stops every DHCP client (daemon exit), releasing the leases while the devices
// still exist.
// watchDeleted stops the DHCP client of an interface that goes (delete_child, ip link
// del of a child, a rename away from the file's DEVICE): its socket and goroutines go
// with it, as a netdev's unregistration takes its DHCP client's socket down.
func (a *ifcfgApplier) watchDeleted() {
	ch, cancel := a.eng.Watch()
	stop, done := make(chan struct{}), make(chan struct{})
	a.unwatch = func() { close(stop); cancel(); <-done }
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-ch:
			}
			a.mu.Lock()
			for dev, r := range a.dhcp {
				if i, ok := a.eng.Interface(dev); !ok || i != r.i {
					log.Printf("%s: gone; its DHCP client stops", dev)
					a.stopDHCP(dev)
				}
			}
			a.mu.Unlock()
		}
	}()
}

func (a *ifcfgApplier) close() {
	if a.unwatch != nil { // first: the watcher takes a.mu
		a.unwatch()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range a.dhcp {
		wg.Go(r.c.Close)
	}
	wg.Wait()
	if len(a.dhcp) > 0 {
		// A RELEASE is a datagram that the engine may still be resolving the server's
		// address for; the devices and the engine go right after this.
		time.Sleep(200 * time.Millisecond)
	}
	clear(a.dhcp)
}

// dhcpHost puts a DHCP client's address on the interface's kernel device, whichever
// device it has at the time (ip link del ib0 makes it again).
type dhcpHost struct {
	brs *bridges
	i   *ipoib.Interface
}

func (h dhcpHost) AddAddr(p netip.Prefix, broadcast netip.Addr) error {
	if d := h.brs.device(h.i); d != nil {
		return d.AddAddr(p, broadcast)
	}
	return fmt.Errorf("%s has no kernel device to put %s on", h.i.Name(), p)
}

func (h dhcpHost) DelAddr(p netip.Prefix) error {
	if d := h.brs.device(h.i); d != nil {
		return d.DelAddr(p)
	}
	return nil // the address went with the device
}

// parseInstallerFile reads the installer-style static file the vendor guide shows
// (IPADDR_ib0=, NETMASK_ib0=, NETWORK_ib0=, BROADCAST_ib0=, ONBOOT_ib0=,
// LAN_INTERFACE_ib0=): one ifcfg per interface named. Values are shell words without
// expansion, so IPADDR_ib0=10.4.'*'.'*' is the pattern 10.4.*.*, each * the matching
// octet of the LAN interface's IPv4 address (lan looks it up; an empty LAN_INTERFACE
// means the first eth<n> that exists).
func parseInstallerFile(file string, b []byte, lan func(name string) (netip.Addr, error)) ([]*ifcfg, error) {
	base := filepath.Base(file)
	type entry struct {
		v    string
		line int
	}
	per := map[string]map[string]entry{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		key, dev, ok2 := strings.Cut(k, "_")
		if key == "LAN" { // LAN_INTERFACE_ib0
			key, dev, ok2 = "LAN_INTERFACE", strings.TrimPrefix(k, "LAN_INTERFACE_"), strings.HasPrefix(k, "LAN_INTERFACE_")
		}
		if !ok || !ok2 || dev == "" {
			return nil, &ifcfgError{base, n, fmt.Sprintf("%q is not KEY_<interface>=VALUE", clipLine(l))}
		}
		w, err := shellWord(v)
		if err != nil {
			return nil, &ifcfgError{base, n, fmt.Sprintf("%s: %v", k, err)}
		}
		if per[dev] == nil {
			per[dev] = map[string]entry{}
		}
		per[dev][key] = entry{w, n}
	}
	var out []*ifcfg
	devs := make([]string, 0, len(per))
	for d := range per {
		devs = append(devs, d)
	}
	sort.Strings(devs)
	for _, d := range devs {
		vals := per[d]
		var text strings.Builder
		fmt.Fprintf(&text, "DEVICE=%s\n", d)
		for _, k := range []string{"NETMASK", "BROADCAST", "ONBOOT"} {
			if e, ok := vals[k]; ok && e.v != "" {
				if k == "ONBOOT" && e.v == "1" {
					e.v = "yes"
				}
				fmt.Fprintf(&text, "%s=%s\n", k, e.v)
			}
		}
		if e, ok := vals["IPADDR"]; ok && e.v != "" {
			addr := e.v
			if strings.Contains(addr, "*") {
				name := vals["LAN_INTERFACE"].v
				ip, err := lan(name)
				if err != nil {
					return nil, &ifcfgError{base, e.line, fmt.Sprintf("IPADDR_%s: %v", d, err)}
				}
				parts, octets := strings.Split(addr, "."), ip.As4()
				if len(parts) != 4 {
					return nil, &ifcfgError{base, e.line, fmt.Sprintf("IPADDR_%s: %q is not a dotted quad", d, addr)}
				}
				for k := range parts {
					if parts[k] == "*" {
						parts[k] = strconv.Itoa(int(octets[k]))
					}
				}
				addr = strings.Join(parts, ".")
			}
			fmt.Fprintf(&text, "IPADDR=%s\n", addr)
		}
		c, err := parseIfcfg("ifcfg-"+d, []byte(text.String()))
		if err != nil {
			return nil, &ifcfgError{base, 0, fmt.Sprintf("%s: %v", d, err)}
		}
		c.file = file
		out = append(out, c)
	}
	return out, nil
}

// shellWord removes the quotes of one shell word ('a'"b"c is abc); no expansion, and
// white space or $ ` outside quotes is refused.
func shellWord(s string) (string, error) {
	var b strings.Builder
	for k := 0; k < len(s); k++ {
		switch c := s[k]; c {
		case '\'', '"':
			end := strings.IndexByte(s[k+1:], c)
			if end < 0 {
				return "", fmt.Errorf("unbalanced %c", c)
			}
			b.WriteString(s[k+1 : k+1+end])
			k += end + 1
		case ' ', '\t', '$', '`', '\\':
			return "", fmt.Errorf("shell syntax %q is not supported", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// lanAddr is the IPv4 address of the installer file's LAN_INTERFACE in the daemon's
// namespace; "" means the first eth<n> that exists.
func (a *ifcfgApplier) lanAddr(name string) (netip.Addr, error) {
	if name == "" {
		for n := 0; n < 64 && name == ""; n++ {
			if c := fmt.Sprintf("eth%d", n); kernel.LinkExists(a.netns, c) {
				name = c
			}
		}
		if name == "" {
			return netip.Addr{}, fmt.Errorf("LAN_INTERFACE is empty and no eth<n> exists")
		}
	}
	ps, err := kernel.LinkAddrs(a.netns, name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("LAN_INTERFACE %s: %w", name, err)
	}
	for _, p := range ps {
		if p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("LAN_INTERFACE %s has no IPv4 address", name)
}
