package fs

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"ipoibfs/ipoib"
	"ipoibfs/verbs"
)

// Options configure a Tree.
type Options struct {
	// Log receives one line per write, without a trailing newline: the file, the
	// result, what was written (64 bytes at most) and who wrote it, e.g.
	// `class/net/ib0/mtu: MTU 5 outside 72..4092 in datagram mode (EINVAL); wrote "5\n"
	// as uid=0 via=fuse peer="pid 4242 (bash)"`, and one per open for writing that was refused.
	// nil discards.
	Log func(string)
	// SM, if set, adds sm/ with the subnet manager's partitions, nodes and groups.
	SM SubnetManager
	// Events, if set, adds the root file `events` (root's only, as debugfs): every
	// open follows the lines emitted from then on. Every write's log line goes there too.
	Events *EventLog
	// Bonds, if set, adds the bonding driver's files: class/net/bonding_masters and the
	// bonds' directories (bonding.go).
	Bonds *ipoib.Bonds
	// Reload, if set, adds the root file `reload`: writing 1 runs it (what SIGHUP does)
	// and the write returns when it is done, failing with EINVAL and its error.
	Reload func() error
}

// Tree is the control tree of one engine.
type Tree struct {
	e      *ipoib.Engine
	sm     SubnetManager
	log    func(string)
	events *EventLog
	bonds  *ipoib.Bonds
	reload func() error

	start time.Time // every node's mtime/ctime/atime

	idMu    sync.Mutex
	ids     map[idKey]uint64
	nextID  uint64
	pruneAt int // len(ids) at which the names of interfaces gone are forgotten

	root *Node
}

// SubnetManager is what sm/ shows and changes, as text: the subnet manager running on
// this node (the soft HCA's implements it; a node without one has no sm/).
type SubnetManager interface {
	PartitionsText() string
	// SetPartitionsText applies a whole partitions.conf; a bad one changes nothing and
	// its error says where (LineReason, see describe).
	SetPartitionsText(name string, conf []byte) error
	FaultsText() string
	SetFaultsText(spec string) error
	GroupsText() string
	NodesText() string
	AuthFailures() uint64
}

// New builds the tree of engine e.
func New(e *ipoib.Engine, o Options) *Tree {
	t := &Tree{e: e, sm: o.SM, log: o.Log, events: o.Events, bonds: o.Bonds, reload: o.Reload, start: time.Now(), ids: map[idKey]uint64{{}: 1}, nextID: 2, pruneAt: minPruneAt}
	if o.Events != nil {
		log := t.log
		t.log = func(l string) {
			if log != nil {
				log(l)
			}
			o.Events.Emit(l)
		}
	}
	t.root = t.dir("", "", t.listRoot)
	t.root.lookup = t.lookupRoot
	return t
}

// Root returns the root directory.
func (t *Tree) Root() *Node { return t.root }

// Lookup walks a slash-separated path from the root ("" is the root).
func (t *Tree) Lookup(path string) (*Node, error) {
	n := t.root
	for _, name := range strings.Split(path, "/") {
		if name == "" {
			continue
		}
		c, err := n.Lookup(name)
		if err != nil {
			return nil, err
		}
		n = c
	}
	return n, nil
}

// idKey names an inode: its path and, for the files of an interface or bond, that
// object's Serial (0 for the rest), with the object's own name left out of the path
// (class/net/*/mtu). A child deleted and made again under its name gets new numbers,
// as a new kobject's kernfs files are new inodes, so a kernel cache or a 9P client
// that still holds the old ones never reaches the new child through them; a renamed
// interface keeps its numbers, as kernfs keeps them across a rename.
type idKey struct {
	path   string
	serial uint64
}

// ino returns the inode number of a key, allocating one on first use.
func (t *Tree) ino(k idKey) uint64 {
	t.idMu.Lock()
	defer t.idMu.Unlock()
	id, ok := t.ids[k]
	if !ok {
		if len(t.ids) >= t.pruneAt {
			t.pruneLocked()
		}
		id = t.nextID
		t.nextID++
		t.ids[k] = id
	}
	return id
}

// minPruneAt is the registry's size before its first pruning (a variable for tests).
var minPruneAt = 4096

// pruneLocked forgets the inode numbers of interfaces and bonds that no longer exist,
// as sysfs's go with their kobject: a daemon creating and deleting children must not
// keep them all. It runs when the registry has doubled since the last time, so its
// cost is spread over the numbers given since.
func (t *Tree) pruneLocked() {
	live := map[uint64]bool{}
	for _, i := range t.e.Interfaces() {
		live[i.Serial()] = true
	}
	if t.bonds != nil {
		for _, b := range t.bonds.List() {
			live[b.Serial()] = true
		}
	}
	for k := range t.ids {
		if k.serial != 0 && !live[k.serial] {
			delete(t.ids, k)
		}
	}
	t.pruneAt = max(2*len(t.ids), minPruneAt)
}

// netPrefix is where interfaces and bonds have their directories.
const netPrefix = "class/net/"

// node makes the node at path p, one of o's files when o is not nil; keySuffix is
// added to the key of its inode number.
func (t *Tree) node(o owner, p, name string, keySuffix ...string) *Node {
	n := &Node{t: t, name: name, path: p}
	k := idKey{path: p + strings.Join(keySuffix, "")}
	if o != nil {
		k.serial = o.Serial()
		if rest, ok := strings.CutPrefix(p, netPrefix); ok {
			_, below, _ := strings.Cut(rest, "/")
			n.own, n.rest = o, ""
			if below != "" {
				n.rest = "/" + below
			}
			k.path = netPrefix + "*" + n.rest
		}
	}
	n.ino = t.ino(k)
	return n
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func (t *Tree) dir(parent, name string, list func(dir string) ([]*Node, error)) *Node {
	n := t.node(nil, join(parent, name), name)
	n.perm, n.dir, n.list = 0755, true, list
	return n
}

// owner is the interface or bond whose files a node is (*ipoib.Interface, *ipoib.Bond).
type owner interface {
	Name() string
	Serial() uint64
	Listed() bool
}

// dirOf is dir for a directory of o's: once o is gone it lists nothing, as a removed
// kernfs directory (a descriptor held open on it, or a cached inode).
func (t *Tree) dirOf(o owner, parent, name string, list func(dir string) ([]*Node, error)) *Node {
	n := t.node(o, join(parent, name), name)
	n.perm, n.dir = 0755, true
	n.list = func(d string) ([]*Node, error) {
		if !o.Listed() {
			return nil, nil
		}
		return list(d)
	}
	return n
}

// static returns a list function for fixed children.
func static(mk ...func(dir string) *Node) func(string) ([]*Node, error) {
	return func(dir string) ([]*Node, error) {
		out := make([]*Node, len(mk))
		for k, f := range mk {
			out[k] = f(dir)
		}
		return out, nil
	}
}

// file builds an attribute file. read may be nil (0200 files), write may be nil.
func (t *Tree) file(dir, name string, perm uint32, read func() (string, error), write func([]byte) error) *Node {
	return t.fileOf(nil, dir, name, perm, read, write)
}

// fileOf is file for a file of o's (nil: the tree's own).
func (t *Tree) fileOf(o owner, dir, name string, perm uint32, read func() (string, error), write func([]byte) error) *Node {
	return t.fileKeyed(o, "", dir, name, perm, read, write)
}

// fileKeyed is fileOf with keySuffix added to the key of its inode number.
func (t *Tree) fileKeyed(o owner, keySuffix, dir, name string, perm uint32, read func() (string, error), write func([]byte) error) *Node {
	n := t.node(o, join(dir, name), name, keySuffix)
	n.perm, n.write = perm, write
	if read != nil {
		n.read = func() ([]byte, error) {
			s, err := read()
			return []byte(s), err
		}
	}
	return n
}

func constant(s string) func() (string, error) { return func() (string, error) { return s, nil } }

// rootNames are the root's entries, sorted: listRoot makes them all, a lookup only
// the one it names (building all eight was most of a 9P walk's cost after the
// interface directories got their own lookup).
var rootNames = []string{"class", "events", "fabric", "kernel", "link", "module", "reload", "sm"}

func (t *Tree) listRoot(string) ([]*Node, error) {
	out := make([]*Node, 0, len(rootNames))
	for _, name := range rootNames {
		if n := t.rootNode(name); n != nil {
			out = append(out, n)
		}
	}
	return out, nil
}

func (t *Tree) lookupRoot(_, name string) (*Node, error) {
	if n := t.rootNode(name); n != nil {
		return n, nil
	}
	return nil, syscall.ENOENT
}

// rootNode makes the root's entry name, or returns nil if this tree has none.
func (t *Tree) rootNode(name string) *Node {
	switch name {
	case "class":
		return t.dir("", "class", static(
			func(d string) *Node { return t.dir(d, "infiniband", t.listHCAs) },
			func(d string) *Node {
				n := t.dir(d, "net", t.listNet)
				n.lookup = t.lookupNet
				return n
			},
		))
	case "kernel":
		return t.dir("", "kernel", static(func(d string) *Node {
			debug := t.dir(d, "debug", static(func(d string) *Node {
				n := t.dir(d, "ipoib", t.listDebug)
				n.lookup = t.lookupDebug
				return n
			}))
			debug.perm = 0700 // the debugfs mount point is root's alone
			return debug
		}))
	case "module":
		return t.dir("", "module", static(func(d string) *Node {
			return t.dir(d, "ib_ipoib", static(func(d string) *Node { return t.dir(d, "parameters", t.listParams) }))
		}))
	case "sm":
		if t.sm == nil {
			return nil
		}
		return t.dir("", "sm", t.listSM)
	case "fabric":
		// fabric: every node's view of the fabric, from SA queries (saquery's).
		return t.dir("", "fabric", static(
			func(d string) *Node {
				return t.file(d, "groups", 0444, func() (string, error) { return t.e.FabricGroupsText(context.Background()) }, nil)
			},
			func(d string) *Node {
				return t.file(d, "nodes", 0444, func() (string, error) { return t.e.FabricNodesText(context.Background()) }, nil)
			},
		))
	case "link":
		// link: named children, as ip link add ... type ipoib makes them (the kernel
		// refuses that for devices it does not drive); root's, with CAP_NET_ADMIN.
		lk := t.file("", "link", 0600, t.linkText, t.linkWrite)
		lk.netAdmin = true
		return lk
	case "reload":
		if t.reload == nil {
			return nil
		}
		// reload: the daemon's SIGHUP as a write, which returns once done and says
		// what failed (systemctl reload waits for it; a signal is not answered).
		rl := t.file("", "reload", 0200, nil, func(b []byte) error {
			if v := strings.TrimSuffix(string(b), "\n"); v != "1" {
				return errorf(syscall.EINVAL, "write 1 to reload, not %q", clip(b))
			}
			if err := t.reload(); err != nil {
				return &Error{Errno: syscall.EINVAL, Detail: err.Error()}
			}
			return nil
		})
		rl.netAdmin = true
		return rl
	case "events":
		if t.events == nil {
			return nil
		}
		ev := t.file("", "events", 0400, func() (string, error) { return "", nil }, nil)
		ev.stream = t.events
		return ev
	}
	return nil
}

// ---- class/net ----

func (t *Tree) listNet(dir string) ([]*Node, error) {
	ifs := t.e.Interfaces()
	out := make([]*Node, 0, len(ifs))
	for _, i := range ifs {
		out = append(out, t.ifDir(dir, i))
	}
	if t.bonds != nil {
		out = append(out, t.bondNodes(dir)...)
		sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	}
	return out, nil
}

// lookupNet finds one entry of class/net without making the nodes of every
// interface: a lookup costs the same with ten children or four thousand.
func (t *Tree) lookupNet(dir, name string) (*Node, error) {
	if i, ok := t.e.Interface(name); ok {
		return t.ifDir(dir, i), nil
	}
	for _, n := range t.bondNodes(dir) {
		if n.name == name {
			return n, nil
		}
	}
	return nil, syscall.ENOENT
}

// live is i while it exists: the tree's files hold their interface, not its name, as
// sysfs's hold their kobject. After a delete they answer ENODEV (kernfs, once the node
// is removed), and a child made again under the name is not reached through them;
// after a rename they go on working.
func live(i *ipoib.Interface) (*ipoib.Interface, error) {
	if !i.Listed() {
		return nil, errorf(syscall.ENODEV, "interface %s no longer exists", i.Name())
	}
	return i, nil
}

// ifDir is class/net/NAME for interface i.
func (t *Tree) ifDir(dir string, i *ipoib.Interface) *Node {
	child := i.Parent() != nil
	inScope := func(a *ifAttr) bool {
		return !(a.scope == parentOnly && child) && !(a.scope == childOnly && !child)
	}
	n := t.dirOf(i, dir, i.Name(), func(d string) ([]*Node, error) {
		var out []*Node
		for k := range ifAttrs {
			if a := &ifAttrs[k]; inScope(a) {
				out = append(out, t.ifFile(d, i, a))
			}
		}
		out = append(out,
			t.attrDir(d, "dhcp", i, dhcpAttrs),
			t.attrDir(d, "ethtool", i, ethtoolAttrs),
			t.statsDir(d, i),
		)
		out = append(out, t.bondingSlaveDir(d, i)...) // while a bond's slave (bonding.go)
		sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
		return out, nil
	})
	// A lookup of one attribute or table directory makes only its node (it made all
	// 40-odd, a fifth of a 9P walk+open+read+clunk of pkey); bonding_slave goes
	// through the listing.
	n.lookup = lookupFirst(i, n, func(d, name string) *Node {
		if k, ok := ifAttrIndex[name]; ok && inScope(&ifAttrs[k]) {
			return t.ifFile(d, i, &ifAttrs[k])
		}
		switch name {
		case "dhcp":
			return t.attrDir(d, "dhcp", i, dhcpAttrs)
		case "ethtool":
			return t.attrDir(d, "ethtool", i, ethtoolAttrs)
		case "statistics":
			return t.statsDir(d, i)
		}
		return nil
	})
	return n
}

// statsDir is class/net/NAME/statistics.
func (t *Tree) statsDir(dir string, i *ipoib.Interface) *Node {
	n := t.dirOf(i, dir, "statistics", func(d string) ([]*Node, error) {
		out := make([]*Node, 0, len(ipoib.StatNames)+len(zeroStats))
		for k, st := range ipoib.StatNames {
			out = append(out, t.ifFile(d, i, &ifAttr{name: st, perm: 0444, read: statReader(k)}))
		}
		for _, st := range zeroStats {
			out = append(out, t.ifFile(d, i, &ifAttr{name: st, perm: 0444, read: zeroStat}))
		}
		sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
		return out, nil
	})
	n.lookup = lookupFirst(i, n, func(d, name string) *Node {
		if k := slices.Index(ipoib.StatNames, name); k >= 0 {
			return t.ifFile(d, i, &ifAttr{name: name, perm: 0444, read: statReader(k)})
		}
		if slices.Contains(zeroStats, name) {
			return t.ifFile(d, i, &ifAttr{name: name, perm: 0444, read: zeroStat})
		}
		return nil
	})
	return n
}

// lookupFirst is a lookup for o's directory n (a dirOf) that asks fast for the named
// node and, when it has none, searches n's listing. fast must answer only names n's
// listing holds; it is not asked once o is gone (dirOf lists nothing then).
func lookupFirst(o owner, n *Node, fast func(dir, name string) *Node) func(dir, name string) (*Node, error) {
	return func(dir, name string) (*Node, error) {
		if !o.Listed() {
			return nil, syscall.ENOENT
		}
		if c := fast(dir, name); c != nil {
			return c, nil
		}
		return n.listed(dir, name)
	}
}

// attrDir is a directory of an interface's files from a table (ethtool/, dhcp/).
func (t *Tree) attrDir(dir, name string, i *ipoib.Interface, attrs []ifAttr) *Node {
	return t.dirOf(i, dir, name, func(d string) ([]*Node, error) {
		out := make([]*Node, len(attrs))
		for k := range attrs {
			out[k] = t.ifFile(d, i, &attrs[k])
		}
		return out, nil
	})
}

func (t *Tree) ifFile(dir string, i *ipoib.Interface, a *ifAttr) *Node {
	var read func() (string, error)
	var write func([]byte) error
	if a.read != nil {
		read = func() (string, error) {
			i, err := live(i)
			if err != nil {
				return "", err
			}
			return a.read(i)
		}
	}
	if a.write != nil {
		write = func(b []byte) error {
			i, err := live(i)
			if err != nil {
				return err
			}
			return a.write(i, b)
		}
	}
	n := t.fileOf(i, dir, a.name, a.perm, read, write)
	n.netAdmin, n.parseFirst, n.slow = a.netAdmin, a.parseFirst, a.slow
	return n
}

// ---- kernel/debug/ipoib ----

// debugFiles are an interface's debugfs files. The driver removes them with the
// interface and makes them again under the new name at a rename (ipoib_netdev_event),
// and a removed debugfs file answers reads with EIO: so do these, once their
// interface is gone or no longer has the name they were made for.
func (t *Tree) debugFiles(dir string, i *ipoib.Interface) []*Node {
	name := i.Name()
	gen := i.Renames() // after the name: a rename in between fails the check below
	text := func(f func(*ipoib.Interface) string) func() (string, error) {
		return func() (string, error) {
			if !i.Listed() || i.Renames() != gen || i.Name() != name {
				return "", errorf(syscall.EIO, "%s's debug file was removed (the interface is gone or renamed)", name)
			}
			return f(i), nil
		}
	}
	// Each rename makes new files, with new inode numbers (a cached inode of the
	// removed one must not stand for the new one): the count is in their key.
	g := fmt.Sprintf("@%d", gen)
	return []*Node{
		t.fileKeyed(i, g, dir, name+"_mcg", 0444, text((*ipoib.Interface).MCGText), nil),
		t.fileKeyed(i, g, dir, name+"_path", 0444, text((*ipoib.Interface).PathText), nil),
	}
}

func (t *Tree) listDebug(dir string) ([]*Node, error) {
	var out []*Node
	for _, i := range t.e.Interfaces() {
		out = append(out, t.debugFiles(dir, i)...)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	return out, nil
}

func (t *Tree) lookupDebug(dir, name string) (*Node, error) {
	for k, suffix := range []string{"_mcg", "_path"} {
		if ifname, ok := strings.CutSuffix(name, suffix); ok {
			if i, exists := t.e.Interface(ifname); exists {
				return t.debugFiles(dir, i)[k], nil
			}
		}
	}
	return nil, syscall.ENOENT
}

// ---- module/ib_ipoib/parameters ----

func (t *Tree) listParams(dir string) ([]*Node, error) {
	p := t.e.Params()
	out := make([]*Node, 0, len(ipoib.ParamNames))
	for _, name := range ipoib.ParamNames {
		read := func() (string, error) { return p.Param(name) }
		if ipoib.ParamWritable(name) {
			out = append(out, t.file(dir, name, 0644, read, func(b []byte) error { return p.SetParam(name, string(b)) }))
		} else {
			out = append(out, t.file(dir, name, 0444, read, nil))
		}
	}
	return out, nil
}

// ---- class/infiniband ----

func (t *Tree) listHCAs(dir string) ([]*Node, error) {
	dev := t.e.Device()
	return []*Node{t.dir(dir, dev.Name(), func(d string) ([]*Node, error) {
		out := []*Node{
			t.file(d, "fw_ver", 0444, func() (string, error) { return dev.FWVersion() + "\n", nil }, nil),
			t.file(d, "node_desc", 0444, func() (string, error) { return fmt.Sprintf("%.64s\n", dev.NodeDesc()), nil }, nil),
			t.file(d, "node_guid", 0444, func() (string, error) { return guidString(dev.NodeGUID()) + "\n", nil }, nil),
			t.file(d, "node_type", 0444, constant("1: CA\n"), nil),
			t.dir(d, "ports", func(d string) ([]*Node, error) {
				out := make([]*Node, 0, dev.NumPorts())
				for n := 1; n <= dev.NumPorts(); n++ {
					out = append(out, t.portDir(d, dev, n))
				}
				return out, nil
			}),
		}
		if info, ok := dev.(verbs.DeviceInfo); ok {
			// Formats as the kernel's device.c and the mlx drivers print them.
			out = append(out,
				t.file(d, "board_id", 0444, func() (string, error) { return info.BoardID() + "\n", nil }, nil),
				t.file(d, "hca_type", 0444, func() (string, error) { return info.HCAType() + "\n", nil }, nil),
				t.file(d, "hw_rev", 0444, func() (string, error) { return fmt.Sprintf("%x\n", info.HWRevision()), nil }, nil),
				t.file(d, "sys_image_guid", 0444, func() (string, error) { return guidString(info.SysImageGUID()) + "\n", nil }, nil),
			)
			sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
		}
		return out, nil
	})}, nil
}

// guidString is sysfs's node_guid format: four groups of four hex digits.
func guidString(g verbs.GUID) string {
	v := uint64(g)
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48&0xffff, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

// gidString is the kernel's %pI6: eight zero-padded groups, no compression.
func gidString(g verbs.GID) string {
	var b strings.Builder
	for k := 0; k < 16; k += 2 {
		if k > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x%02x", g[k], g[k+1])
	}
	return b.String()
}

var portStates = []string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

var physStates = []string{"<unknown>", "Sleep", "Polling", "Disabled", "PortConfigurationTraining",
	"LinkUp", "LinkErrorRecovery", "Phy Test"}

// rateString is sysfs's ports/<n>/rate: "40 Gb/sec (4X QDR)".
func rateString(a verbs.PortAttr) (string, error) {
	lane := []struct {
		min  int
		deci int
		name string
	}{{200000, 2000, " XDR"}, {100000, 1000, " NDR"}, {50000, 500, " HDR"}, {25000, 250, " EDR"},
		{14000, 140, " FDR"}, {10000, 100, " QDR"}, {5000, 50, " DDR"}}
	rate, speed := 25, " SDR"
	for _, l := range lane {
		if a.LaneMbps >= l.min {
			rate, speed = l.deci, l.name
			break
		}
	}
	if a.Width <= 0 {
		return "", errorf(syscall.EINVAL, "port width unknown")
	}
	rate *= a.Width
	half := ""
	if rate%10 != 0 {
		half = ".5"
	}
	return fmt.Sprintf("%d%s Gb/sec (%dX%s)\n", rate/10, half, a.Width, speed), nil
}

func (t *Tree) portDir(dir string, dev verbs.Device, num int) *Node {
	attr := func() (verbs.PortAttr, error) {
		p, err := dev.Port(num)
		if err != nil {
			return verbs.PortAttr{}, errorf(syscall.ENODEV, "port %d: %v", num, err)
		}
		return p.Attr(), nil
	}
	show := func(f func(a verbs.PortAttr) (string, error)) func() (string, error) {
		return func() (string, error) {
			a, err := attr()
			if err != nil {
				return "", err
			}
			return f(a)
		}
	}
	return t.dir(dir, strconv.Itoa(num), func(d string) ([]*Node, error) {
		p, err := dev.Port(num)
		if err != nil {
			return nil, errorf(syscall.ENODEV, "port %d: %v", num, err)
		}
		out := []*Node{
			t.file(d, "cap_mask", 0444, show(func(a verbs.PortAttr) (string, error) { return fmt.Sprintf("0x%08x\n", a.CapMask), nil }), nil),
			t.dir(d, "counters", func(d string) ([]*Node, error) { return t.portCounters(d, p), nil }),
			t.dir(d, "gids", func(d string) ([]*Node, error) {
				var out []*Node
				for k := 0; k < 256; k++ {
					if _, err := p.GID(k); err != nil {
						break
					}
					out = append(out, t.file(d, strconv.Itoa(k), 0444, func() (string, error) {
						g, err := p.GID(k)
						if err != nil {
							g = verbs.GID{} // the kernel shows an empty entry as zeros
						}
						return gidString(g) + "\n", nil
					}, nil))
				}
				return out, nil
			}),
			t.file(d, "lid", 0444, show(func(a verbs.PortAttr) (string, error) { return fmt.Sprintf("0x%x\n", uint16(a.LID)), nil }), nil),
			t.file(d, "lid_mask_count", 0444, show(func(a verbs.PortAttr) (string, error) { return fmt.Sprintf("%d\n", a.LMC), nil }), nil),
			t.file(d, "link_layer", 0444, show(func(a verbs.PortAttr) (string, error) {
				if a.LinkLayer == "" {
					return "InfiniBand\n", nil
				}
				return a.LinkLayer + "\n", nil
			}), nil),
			t.file(d, "phys_state", 0444, show(func(a verbs.PortAttr) (string, error) {
				s := "<unknown>"
				if int(a.PhysState) < len(physStates) {
					s = physStates[a.PhysState]
				}
				return fmt.Sprintf("%d: %s\n", a.PhysState, s), nil
			}), nil),
			t.dir(d, "pkeys", func(d string) ([]*Node, error) {
				n := p.Attr().PKeyTabLen
				if l := len(p.PKeyTable()); l > n {
					n = l
				}
				out := make([]*Node, n)
				for k := range out {
					out[k] = t.file(d, strconv.Itoa(k), 0444, func() (string, error) {
						tab := p.PKeyTable()
						var v verbs.PKey
						if k < len(tab) {
							v = tab[k]
						}
						return fmt.Sprintf("0x%04x\n", uint16(v)), nil
					}, nil)
				}
				return out, nil
			}),
			t.file(d, "rate", 0444, show(rateString), nil),
			t.file(d, "sm_lid", 0444, show(func(a verbs.PortAttr) (string, error) { return fmt.Sprintf("0x%x\n", uint16(a.SMLID)), nil }), nil),
			t.file(d, "sm_sl", 0444, show(func(a verbs.PortAttr) (string, error) { return fmt.Sprintf("%d\n", a.SMSL), nil }), nil),
			t.file(d, "state", 0444, show(func(a verbs.PortAttr) (string, error) {
				s := "UNKNOWN"
				if int(a.State) < len(portStates) {
					s = portStates[a.State]
				}
				return fmt.Sprintf("%d: %s\n", a.State, s), nil
			}), nil),
		}
		if c, ok := dev.(verbs.Capturer); ok {
			// The port's packets as a pcap stream, root's only as a packet socket is.
			n := t.file(d, "capture", 0400, func() (string, error) { return "", nil }, nil)
			n.stream = captureSource{dev: c, port: num}
			out = append(out, n)
			sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
		}
		return out, nil
	})
}

// ---- sm ----

func (t *Tree) listSM(dir string) ([]*Node, error) {
	sm := t.sm
	parts := t.file(dir, "partitions", 0644, func() (string, error) { return sm.PartitionsText(), nil }, nil)
	parts.commit = func(b []byte) error { return sm.SetPartitionsText("sm/partitions", b) }
	parts.netAdmin = true // the fabric's partitioning: an administrator's, as the SM's own files
	faults := t.file(dir, "faults", 0644, func() (string, error) { return sm.FaultsText(), nil }, func(b []byte) error {
		if err := sm.SetFaultsText(string(b)); err != nil {
			return &Error{Errno: syscall.EINVAL, Detail: err.Error()}
		}
		return nil
	})
	faults.netAdmin = true
	return []*Node{
		// Management messages the SM's port dropped for want of a valid fabric-key MAC.
		t.file(dir, "auth_failures", 0444, func() (string, error) { return fmt.Sprintf("%d\n", sm.AuthFailures()), nil }, nil),
		faults,
		// Every group's members, by GID: root's alone, as the SA shows members only to
		// requests with the SM_Key (fabric/groups shows anyone the groups without them).
		t.file(dir, "groups", 0400, func() (string, error) { return sm.GroupsText(), nil }, nil),
		t.file(dir, "nodes", 0444, func() (string, error) { return sm.NodesText(), nil }, nil),
		parts,
	}, nil
}

// portCounterNames are the kernel's ports/<n>/counters files (PortCounters and
// PortCountersExtended, drivers/infiniband/core/sysfs.c) in its order, each with its
// value from the port's counters. port_xmit_data and port_rcv_data count 4-octet words,
// as in the IBA and the kernel. A P_Key violation on receive counts as a receive
// constraint error; malformed packets, bad ICRCs and management messages without a
// valid fabric-key MAC as receive errors. The physical-
// layer counters exist and stay 0: a software link has no symbols, lanes or VLs.
var portCounterNames = []struct {
	name  string
	value func(c verbs.PortCounters) uint64
}{
	{"VL15_dropped", nil},
	{"excessive_buffer_overrun_errors", nil},
	{"link_downed", nil},
	{"link_error_recovery", nil},
	{"local_link_integrity_errors", nil},
	{"port_rcv_constraint_errors", func(c verbs.PortCounters) uint64 { return c.BadPKey }},
	{"port_rcv_data", func(c verbs.PortCounters) uint64 { return c.RcvBytes / 4 }},
	{"port_rcv_errors", func(c verbs.PortCounters) uint64 { return c.Malformed + c.BadICRC + c.AuthFailures }},
	{"port_rcv_packets", func(c verbs.PortCounters) uint64 { return c.RcvPackets }},
	{"port_rcv_remote_physical_errors", nil},
	{"port_rcv_switch_relay_errors", nil},
	{"port_xmit_constraint_errors", nil},
	{"port_xmit_data", func(c verbs.PortCounters) uint64 { return c.XmitBytes / 4 }},
	{"port_xmit_discards", func(c verbs.PortCounters) uint64 { return c.XmitDiscards }},
	{"port_xmit_packets", func(c verbs.PortCounters) uint64 { return c.XmitPackets }},
	{"port_xmit_wait", nil},
	{"symbol_error", nil},
}

func (t *Tree) portCounters(dir string, p verbs.Port) []*Node {
	out := make([]*Node, len(portCounterNames))
	for k, c := range portCounterNames {
		out[k] = t.file(dir, c.name, 0444, func() (string, error) {
			var v uint64
			if c.value != nil {
				v = c.value(p.Counters())
			}
			return strconv.FormatUint(v, 10) + "\n", nil
		}, nil)
		out[k].slow = true // a real HCA's are firmware queries (verbs/rdma)
	}
	return out
}

// linkText lists every interface with the details ip -d link prints for ipoib:
// "storage0@ib0: ipoib pkey 0x8005 mode connected umcast 1 (netlink)".
func (t *Tree) linkText() (string, error) {
	var b strings.Builder
	for _, i := range t.e.Interfaces() {
		name := i.Name()
		kind := ""
		if p := i.Parent(); p != nil {
			name += "@" + p.Name()
			kind = " (create_child)"
			if i.IsNamed() {
				kind = " (netlink)"
			}
		}
		u := 0
		if i.Umcast() {
			u = 1
		}
		fmt.Fprintf(&b, "%s: ipoib pkey 0x%04x mode %s umcast %d%s\n", name, uint16(i.PKey()), i.Mode(), u, kind)
	}
	return b.String(), nil
}

func (t *Tree) linkWrite(b []byte) error {
	c, err := parseLinkCmd(b)
	if err != nil {
		return err
	}
	if !c.add {
		i, ok := t.e.Interface(c.name)
		if !ok {
			return errorf(syscall.ENODEV, "no interface %s", c.name)
		}
		p := i.Parent()
		if p == nil {
			return errorf(syscall.EOPNOTSUPP, "%s is a port's interface and cannot be deleted", c.name)
		}
		return p.RemoveChild(i)
	}
	p, ok := t.e.Interface(c.parent)
	if !ok {
		return errorf(syscall.ENODEV, "no interface %s", c.parent)
	}
	_, err = p.AddLink(ipoib.ChildSpec{Name: c.name, PKey: verbs.PKey(c.pkey), Mode: c.mode, Umcast: c.umcast})
	return err
}
