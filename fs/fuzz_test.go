package fs

import (
	"bytes"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"ipoibfs/ipoib"
	"ipoibfs/verbs/soft/partitions"
)

// volatile files change by themselves (traffic, joins, timers, SM sweeps) and are left
// out of state snapshots.
func volatile(path string) bool {
	base := path[strings.LastIndex(path, "/")+1:]
	switch {
	case strings.Contains(path, "/statistics"), strings.HasPrefix(path, "kernel/debug/"),
		strings.HasPrefix(path, "class/infiniband/"), path == "sm/groups", path == "sm/nodes",
		path == "link": // a summary of every interface's pkey, mode and umcast

		return true
	}
	// A child's MTU follows its broadcast join, which completes asynchronously.
	if base == "mtu" && strings.HasPrefix(path, "class/net/ib0.") {
		return true
	}
	return base == "carrier" || base == "operstate" || base == "flags"
}

// snapshot reads every stable readable file and lists every directory.
func snapshot(t testing.TB, tr *Tree) map[string]string {
	out := map[string]string{}
	var walk func(n *Node)
	walk = func(n *Node) {
		if n.IsDir() {
			cs, err := n.Children()
			if err != nil {
				t.Fatalf("list %s: %v", n.Path(), err)
			}
			var ns []string
			for _, c := range cs {
				ns = append(ns, c.Name())
				walk(c)
			}
			out["ls:"+n.Path()] = strings.Join(ns, " ")
			return
		}
		if volatile(n.Path()) || n.Perm()&0444 == 0 || n.IsStream() {
			return
		}
		s, errno := read(tr, n.Path())
		out[n.Path()] = fmt.Sprintf("%q %v", s, errno)
	}
	walk(tr.Root())
	return out
}

// formats says what a changed file may contain.
var formats = map[string]*regexp.Regexp{
	"mtu":                 regexp.MustCompile(`^"(\d+)\\n" errno 0$`),
	"umcast":              regexp.MustCompile(`^"[01]\\n" errno 0$`),
	"mode":                regexp.MustCompile(`^"(datagram|connected)\\n" errno 0$`),
	"coalesce":            regexp.MustCompile(`^"rx-usecs: \d+\\nrx-frames: \d+\\n" errno 0$`),
	"features":            regexp.MustCompile(`^"(rx-checksumming: (on|off|off \[requested on\])\\n)(tx-checksumming: (on|off|off \[requested on\])\\n)(tcp-segmentation-offload: (on|off|off \[requested on\])\\n)(generic-receive-offload: (on|off|off \[requested on\])\\n)" errno 0$`),
	"debug_level":         regexp.MustCompile(`^"-?\d+\\n" errno 0$`),
	"mcast_debug_level":   regexp.MustCompile(`^"-?\d+\\n" errno 0$`),
	"data_debug_level":    regexp.MustCompile(`^"-?\d+\\n" errno 0$`),
	"cm_data_debug_level": regexp.MustCompile(`^"-?\d+\\n" errno 0$`),
	"tx_queue_len":        regexp.MustCompile(`^"\d+\\n" errno 0$`),
}

var (
	fuzzOnce sync.Once
	fuzzEnv  *env
)

// v2up writes 0x1003 (up) to a flags file.
func v2up(tr *Tree, flags string) syscall.Errno { return write(tr, flags, "0x1003\n") }

// FuzzWrite writes random bytes to every writable file and checks that the tree's state
// is unchanged after a failed write and changed only where (and how) it may after a
// successful one.
func FuzzWrite(f *testing.F) {
	for k, s := range []string{"0x8001", "1", "datagram", "connected\n", "2044", "rx-usecs 8", "gro off", "0x10", "\x00\xff",
		"Default=0x7fff, ipoib : ALL=full;\nP1=0x8001 : ALL=full;\n", "-1", "0x8001\n",
		"add link ib0 name st0 type ipoib pkey 0x8005 mode connected umcast 1\n", "del st0\n"} {
		for idx := range 12 {
			f.Add(uint8(idx+k), []byte(s))
		}
	}
	f.Cleanup(func() {
		for k := len(fuzzCleanups) - 1; k >= 0; k-- {
			fuzzCleanups[k]()
		}
		fuzzCleanups, fuzzEnv, fuzzOnce = nil, nil, sync.Once{}
	})
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		fuzzOnce.Do(func() { fuzzEnv = newEnv(&onceTB{TB: t}) })
		v := fuzzEnv
		tr := v.tree
		// Keep the interface count small.
		if kids := v.ib0.Children(); len(kids) > 8 {
			for _, c := range kids {
				if err := v.ib0.DeleteChild(int64(c.PKey())); err != nil {
					t.Fatal(err)
				}
			}
		}
		var writable []string
		var collect func(n *Node)
		collect = func(n *Node) {
			if n.IsDir() {
				cs, _ := n.Children()
				for _, c := range cs {
					collect(c)
				}
				return
			}
			if n.Perm()&0222 != 0 {
				writable = append(writable, n.Path())
			}
		}
		collect(tr.Root())
		slices.Sort(writable)
		target := writable[int(which)%len(writable)]
		base := target[strings.LastIndex(target, "/")+1:]

		before := snapshot(t, tr)
		partsBefore := v.hca.SM().Partitions().String()
		errno := write(tr, target, string(data))
		after := snapshot(t, tr)

		var changed []string
		for _, p := range slices.Sorted(maps.Keys(mergeKeys(before, after))) {
			if before[p] != after[p] {
				changed = append(changed, p)
			}
		}
		if len(data) == 0 { // a zero-length write is no write at all
			if errno != 0 || len(changed) > 0 {
				t.Fatalf("empty write to %s: %v, changed %q", target, errno, changed)
			}
			return
		}
		if errno != 0 {
			if len(changed) > 0 {
				t.Fatalf("failed write (%v) of %q to %s changed %q", errno, data, target, changed)
			}
			if target == "sm/partitions" && v.hca.SM().Partitions().String() != partsBefore {
				t.Fatalf("rejected config changed the SM's")
			}
			return
		}
		switch base {
		case "create_child", "delete_child":
			// Exactly one child directory appeared or vanished, and nothing else changed.
			var dirs []string
			for _, p := range changed {
				if p == "ls:class/net" || p == "ls:kernel/debug/ipoib" {
					continue
				}
				name := strings.TrimPrefix(strings.TrimPrefix(p, "ls:"), "class/net/")
				dirs = append(dirs, strings.SplitN(name, "/", 2)[0])
			}
			dirs = slices.Compact(slices.Sorted(slices.Values(dirs)))
			if len(dirs) != 1 || !slices.Contains(changed, "ls:class/net") {
				t.Fatalf("%s %q changed %q", base, data, changed)
			}
			_, inBefore := before["class/net/"+dirs[0]+"/pkey"]
			if (base == "create_child") == inBefore {
				t.Fatalf("%s %q: %s existed before: %v", base, data, dirs[0], inBefore)
			}
			if base == "create_child" {
				pk := after["class/net/"+dirs[0]+"/pkey"]
				if want := fmt.Sprintf("%q errno 0", "0x"+strings.TrimPrefix(dirs[0], "ib0.")+"\n"); pk != want {
					t.Fatalf("new child %s has pkey %s", dirs[0], pk)
				}
			}
		case "link":
			// A named child appeared or vanished; its directory says what it is.
			c, err := parseLinkCmd(data)
			if err != nil {
				t.Fatalf("link accepted %q that parseLinkCmd refuses: %v", data, err)
			}
			_, exists := after["class/net/"+c.name+"/pkey"]
			if c.add != exists {
				t.Fatalf("link %q: class/net/%s exists %v", data, c.name, exists)
			}
		case "flags":
			// Up or down as bit 0 says, multicast as bit 12, promisc and allmulti
			// (0x300) and the bits a netdev only keeps (DEBUG 0x4, NOTRAILERS 0x20,
			// NOARP 0x80, PORTSEL 0x2000, AUTOMEDIA 0x4000, DYNAMIC 0x8000) as written
			// (dev_change_flags); that moves the interface, its children and their
			// groups, so only the outcome is checked.
			v, _ := kstrtoul(data)
			want := uint64(0x2) | v&0xf3a5
			if got, rerr := read(tr, target); rerr != 0 || got != fmt.Sprintf("%#x\n", want) {
				t.Fatalf("flags after %q: %q %v, want %#x", data, got, rerr, want)
			}
			if want != 0x1003 { // back to up with multicast for the next inputs
				if err := v2up(tr, target); err != 0 {
					t.Fatalf("flags 0x1003 after %q: %v", data, err)
				}
			}
		case "ifalias":
			// Stored as written up to a NUL, one trailing newline dropped; shown with
			// one, or nothing when empty (net-sysfs's ifalias_store, dev_get_alias
			// and ifalias_show).
			want, _, _ := strings.Cut(strings.TrimSuffix(string(data), "\n"), "\x00")
			if want != "" {
				want += "\n"
			}
			if got, rerr := read(tr, target); rerr != 0 || got != want {
				t.Fatalf("ifalias after %q: %q %v, want %q", data, got, rerr, want)
			}
			if len(changed) > 1 || len(changed) == 1 && changed[0] != target {
				t.Fatalf("write %q to %s changed %q", data, target, changed)
			}
		case "partitions":
			if len(changed) > 1 || (len(changed) == 1 && changed[0] != "sm/partitions") {
				t.Fatalf("partitions write changed %q", changed)
			}
			c, err := partitions.Parse("x", bytes.NewReader(data))
			if err != nil {
				t.Fatalf("accepted a config Parse rejects: %v", err)
			}
			if got := v.hca.SM().Partitions().String(); got != c.String() {
				t.Fatalf("active config %q, written %q", got, c.String())
			}
		default:
			allowed := []string{target}
			if base == "mode" { // switching modes resets the MTU and the offloads
				dir := strings.TrimSuffix(target, "mode")
				allowed = append(allowed, dir+"mtu", dir+"ethtool/features")
			}
			for _, p := range changed {
				if !slices.Contains(allowed, p) {
					t.Fatalf("write %q to %s changed %q", data, target, changed)
				}
			}
			re := formats[base]
			if re == nil {
				t.Fatalf("no format for %s", base)
			}
			got, rerr := read(tr, target)
			now := fmt.Sprintf("%q %v", got, rerr)
			if m := re.FindStringSubmatch(now); m == nil {
				t.Fatalf("%s after %q: %s", target, data, now)
			} else if base == "mtu" {
				if mtu, _ := strconv.Atoi(m[1]); mtu < 72 || mtu > 65520 {
					t.Fatalf("mtu %d accepted", mtu)
				}
			}
			if base == "umcast" && now != fmt.Sprintf("%q errno 0", yes01(parseUmcast(data))) {
				t.Fatalf("umcast %q gave %s", data, now)
			}
		}
	})
}

func mergeKeys(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

// onceTB lets the fuzz target build one shared engine: cleanups run at process exit
// (never, which is fine for a fuzz worker).
// onceTB keeps the shared fuzz environment's cleanups for the end of the fuzz target
// (fuzzCleanups), instead of the end of the first input's run.
type onceTB struct{ testing.TB }

var fuzzCleanups []func()

func (o *onceTB) Cleanup(f func()) { fuzzCleanups = append(fuzzCleanups, f) }

// FuzzScanInt checks %i parsing against strconv on the inputs where C and Go agree,
// with the result stored into a C int as vsscanf stores it.
func FuzzScanInt(f *testing.F) {
	for _, s := range []string{"0x8001", "  -010", "+7", "0x", "08", "x", "99999999999999999999", "4294967297"} {
		f.Add(s)
	}
	clean := regexp.MustCompile(`^[ \t\n]*(-?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*))$`)
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := scanInt([]byte(s))
		if strings.HasPrefix(strings.TrimLeft(s, " \t\n\v\f\r"), "+") && ok {
			t.Fatalf("scanInt(%q) took a '+'", s)
		}
		m := clean.FindStringSubmatch(s)
		if m == nil {
			return
		}
		want, err := strconv.ParseInt(m[1], 0, 64)
		if err != nil {
			return // beyond 64 bits: C wraps, strconv refuses
		}
		if !ok || v != int32(want) {
			t.Fatalf("scanInt(%q) = %d, %v; strconv %d, as a C int %d", s, v, ok, want, int32(want))
		}
		// Trailing garbage is ignored.
		if v2, ok2 := scanInt([]byte(s + "zz")); !ok2 || v2 != v {
			t.Fatalf("scanInt(%q+zz) = %d", s, v2)
		}
	})
}

// FuzzParsers: the small parsers never panic and never accept out-of-range values.
func FuzzParsers(f *testing.F) {
	for _, s := range []string{"rx-usecs 1", "gro on tso off", "2044\n", "datagram\n", "rx-frames: 70000"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := parseCoalesce(ipoib.Coalesce{}, b); err == nil {
			if c.RxUsecs < 0 || c.RxUsecs > 0xffff || c.RxFrames < 0 || c.RxFrames > 0xffff {
				t.Fatalf("coalesce %q -> %+v", b, c)
			}
		} else if e := Errno(err); e != syscall.EINVAL && e != syscall.EOPNOTSUPP {
			t.Fatalf("coalesce errno %v", e)
		}
		if _, err := parseFeatures(ipoib.Features{}, b); err != nil && Errno(err) != syscall.EINVAL {
			t.Fatal(err)
		}
		if v, err := parseMTU(b); err == nil && (v < 0 || strconv.Itoa(v)+"\n" != strings.TrimSuffix(string(b), "\n")+"\n") {
			if strings.TrimLeft(strings.TrimSuffix(string(b), "\n"), "0") != strings.TrimLeft(strconv.Itoa(v), "0") {
				t.Fatalf("mtu %q -> %d", b, v)
			}
		}
		if m, err := parseMode(b); err == nil && m.String()+"\n" != strings.TrimSuffix(string(b), "\n")+"\n" {
			t.Fatalf("mode %q -> %v", b, m)
		}
		parseUmcast(b)
		scanInt(b)
	})
}

// FuzzLinkCmd: whatever parseLinkCmd accepts is well-formed.
func FuzzLinkCmd(f *testing.F) {
	for _, s := range []string{"add link ib0 name x type ipoib", "add link ib0 name x type ipoib pkey 0x8001 mode connected umcast 1",
		"del x", "add", "add link", "add type eth", "delete a b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseLinkCmd(b)
		if err != nil {
			return
		}
		if c.name == "" || (c.add && c.parent == "") || c.pkey < 0 || c.pkey > 0xffff {
			t.Fatalf("accepted %q as %+v", b, c)
		}
	})
}
