package tests

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/internal/testenv"
	"ipoibfs/verbs"
)

// TestChildren4000LeaveNothing: 4000 children created and deleted through the tree
// leave no TUN device, goroutine, file descriptor or fabric registration behind.
//
// The subnet manager's partitions.conf holds as many partitions as the port's P_Key
// table has room for (verbs.PKeyTableCapacity: the default partition and 63 more), one
// every 64 P_Keys, so 63 of the 4000 children are real members of their partition: they
// are brought up (through the tree's flags file) and join their broadcast group on the
// SM, and as many non-member children are brought up too (up, no carrier). Every 40th
// child's device, and every member's, is checked present when its create_child write
// returns and gone when its delete_child write returns, and all 4001 devices at the
// peak. After the deletes the TUN devices, the tree's listings, the SM's groups (with
// their members) and nodes, the fabric's groups, ib0's multicast and path lists, the
// daemon's goroutines (counted by a build with -tags pprof, function by function) and
// its open file descriptors are back to what they were before. No timing is asserted
// (the waits have deadlines); the times are logged.
func TestChildren4000LeaveNothing(t *testing.T) {
	const (
		n     = 4000
		every = 64 // one member partition per 64 P_Keys
	)
	treeRequire(t)
	testenv.Tool(t, "go")
	testenv.Short(t, "creates and deletes 4000 children (about three minutes)")

	// P_Key bases 1, 65, ..., 3969: the default partition and these fill the table.
	var members []int
	for k := 1; k <= n && len(members) < verbs.PKeyTableCapacity-1; k += every {
		members = append(members, k)
	}
	isMember := map[int]bool{}
	conf := "Default=0x7fff, ipoib : ALL=full;\n"
	for _, k := range members {
		isMember[k] = true
		conf += fmt.Sprintf("P%d=0x%04x, ipoib : ALL=full;\n", k, k)
	}
	// The neighbour of each member is up without being a member: no carrier, no join.
	var upNonMembers []int
	for _, k := range members {
		upNonMembers = append(upNonMembers, k+1)
	}
	confPath := filepath.Join(t.TempDir(), "partitions.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	bin := buildPprofDaemon(t)
	td, pp := treeStartPprof(t, bin, "s4k", "-partitions", confPath)
	waitLink(t, td.ns, "ib0")
	pid := td.daemon.cmd.Process.Pid
	name := func(k int) string { return fmt.Sprintf("ib0.%04x", 0x8000+k) }
	write := func(file string, k int) time.Duration {
		t0 := time.Now()
		if err := os.WriteFile(td.path("class/net/ib0/"+file), []byte(fmt.Sprintf("%#x\n", 0x8000+k)), 0); err != nil {
			t.Fatalf("%s %#x: %v", file, 0x8000+k, err)
		}
		return time.Since(t0)
	}
	// bringUp brings children up through the tree's flags file, one write at a time,
	// as the kernel's sysfs flags file does (dev_change_flags): the engine opens the
	// interface and joins its broadcast group, and the device follows.
	bringUp := func(ks []int) {
		for _, k := range ks {
			p := td.path("class/net/" + name(k) + "/flags")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
			if err != nil {
				t.Fatalf("%s: %q: %v", p, b, err)
			}
			if err := os.WriteFile(p, []byte(fmt.Sprintf("%#x\n", f|syscall.IFF_UP)), 0); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
		}
	}
	// waitJoined waits until every child in ks has carrier and is a full member of its
	// partition's broadcast group on the SM, as ib0 is of the default partition's, and
	// checks that the non-members are up without carrier.
	waitJoined := func(ks []int, nonMembers []int) {
		t.Helper()
		var missing []string
		var late []int
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			groups := smGroupMembers(t, td.path("sm/groups"))
			want := groups["ff12:401b:ffff:0:0:0:ffff:ffff"]
			flags := linkFlags(t, td.ns)
			missing, late = nil, nil
			for _, k := range ks {
				mgid := fmt.Sprintf("ff12:401b:%x:0:0:0:ffff:ffff", 0x8000+k)
				if got := groups[mgid]; len(want) != 1 || !slices.Equal(got, want) {
					missing = append(missing, fmt.Sprintf("%s on the SM: %q (ib0's membership %q)", mgid, got, want))
					late = append(late, k)
				}
				if f := flags[name(k)]; !slices.Contains(f, "LOWER_UP") {
					missing = append(missing, fmt.Sprintf("%s: device flags %v", name(k), f))
					late = append(late, k)
				}
			}
			if len(missing) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(missing) > 0 {
			var b strings.Builder
			late = slices.Compact(late)
			for _, k := range late[:min(3, len(late))] {
				b.WriteString(childState(td, name(k)))
			}
			t.Fatalf("members not joined after 3 minutes:\n%s\nthe first of them:\n%s", strings.Join(missing, "\n"), b.String())
		}
		flags := linkFlags(t, td.ns)
		for _, k := range nonMembers {
			if f := flags[name(k)]; !slices.Contains(f, "UP") || !slices.Contains(f, "NO-CARRIER") {
				t.Errorf("%s, not a member of its partition: flags %v, want UP and NO-CARRIER", name(k), f)
			}
		}
	}

	// Warm up once (a member and a non-member, up, joined, deleted): what the daemon
	// makes once for the first child is no leak. Then record the baseline.
	write("create_child", members[0])
	write("create_child", upNonMembers[0])
	bringUp([]int{members[0], upNonMembers[0]})
	waitJoined(members[:1], upNonMembers[:1])
	write("delete_child", members[0])
	write("delete_child", upNonMembers[0])
	base := regsSettled(t, td)
	baseG := pp.settled(t)
	baseFD := fdKinds(t, pid)
	if got := strings.Split(base["class/net/"], " "); !slices.Equal(got, []string{"ib0"}) {
		t.Fatalf("class/net before: %v", got)
	}
	t.Logf("baseline: %d goroutines, %d file descriptors, %d MiB resident", baseG.total, sumCounts(baseFD), rssKiB(t, pid)>>10)

	// writeAll writes children 1..n to file, looks at every 40th child and every
	// member with look when its write has returned, and logs the time the writes took.
	writeAll := func(file, order string, look func(k int)) {
		var total, longest time.Duration
		chunks := make([]time.Duration, n/1000)
		for k := 1; k <= n; k++ {
			d := write(file, k)
			total += d
			longest = max(longest, d)
			chunks[(k-1)/1000] += d
			if k%40 == 0 || isMember[k] {
				look(k)
			}
		}
		t.Logf("%d %s writes: %v, %v each on average, %v the longest", n, file, total.Round(time.Millisecond),
			(total / n).Round(time.Microsecond), longest.Round(time.Microsecond))
		t.Logf("%s per write by thousand (%s): %v", file, order, perWrite(chunks, 1000))
	}

	// Create: each device exists when its write returns (every 40th and the members are
	// looked at; all of them are counted at the end).
	writeAll("create_child", "children 1-1000 first", func(k int) {
		if out, err := run(t, 5*time.Second, "ip", "-n", td.ns, "link", "show", "dev", name(k)); err != nil {
			t.Fatalf("%s: no device when create_child returned: %v %s", name(k), err, out)
		}
	})
	if links := treeLinks(t, td.ns); len(links) != n+1 {
		t.Fatalf("%d TUN devices after %d create_child writes returned, want %d", len(links), n, n+1)
	}
	if ents, err := os.ReadDir(td.path("class/net")); err != nil || len(ents) != n+1 {
		t.Fatalf("class/net after %d creates: %d entries, %v; want %d", n, len(ents), err, n+1)
	}

	t0 := time.Now()
	bringUp(append(slices.Clone(members), upNonMembers...))
	waitJoined(members, upNonMembers)
	t.Logf("%d member children up and joined on the SM, %d non-members up without carrier: %v",
		len(members), len(upNonMembers), time.Since(t0).Round(time.Millisecond))
	peakG := pp.profile(t)
	t.Logf("with %d children: %d goroutines, %d file descriptors, %d MiB resident", n, peakG.total, sumCounts(fdKinds(t, pid)), rssKiB(t, pid)>>10)
	// Only children brought up run goroutines (receive loop, task, connected mode's
	// two loops, the device's reader; joins and watch events come and go): a child
	// never brought up runs none, where each ran six before.
	// One file descriptor per child, its TUN (the namespace's file and netlink socket
	// are shared by its devices; each child held its own of both before). A child's
	// TUN has one queue whatever -queues says (the daemon's default here: one per
	// CPU, for ib0).
	if fds := sumCounts(fdKinds(t, pid)); fds-sumCounts(baseFD) > n+64 {
		t.Errorf("with %d children: %d file descriptors, %d before; want one per child", n, fds, sumCounts(baseFD))
	}
	if up := len(members) + len(upNonMembers); peakG.total-baseG.total > 8*up+64 {
		t.Errorf("with %d children, %d of them up: %d goroutines, %d before; want at most 8 per child up (by function: %s)",
			n, up, peakG.total, baseG.total, peakG.diff(baseG))
	}

	// Delete: each device is gone when its write returns (every 40th and the members are
	// looked at; what is left is listed at the end).
	writeAll("delete_child", "the first thousand deleted first", func(k int) {
		if out, err := run(t, 5*time.Second, "ip", "-n", td.ns, "link", "show", "dev", name(k)); err == nil {
			t.Fatalf("%s: device still there when delete_child returned: %s", name(k), out)
		}
	})
	if links := treeLinks(t, td.ns); !slices.Equal(links, []string{"ib0"}) {
		t.Errorf("TUN devices left after the deletes returned: %d: %v", len(links), firstN(links, 20))
	}
	if f := linkFlags(t, td.ns)["ib0"]; !slices.Contains(f, "LOWER_UP") {
		t.Errorf("ib0 after the deletes: flags %v", f)
	}

	// The registrations: the tree's listings, the SM's groups (memberships) and nodes,
	// the fabric's groups as an SA query shows them, ib0's multicast and path lists.
	// Leaves may complete after the write returns: wait for them, with a deadline.
	var after map[string]string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after = treeRegs(t, td)
		if cmp.Equal(after, base) || time.Now().After(deadline) {
			break
		}
	}
	if d := cmp.Diff(base, after); d != "" {
		t.Errorf("registrations left 30 s after deleting %d children (-before +after):\n%s", n, d)
	}

	// Goroutines: back to the baseline, function by function (a goroutine's function is
	// the bottom frame of its stack). One tolerance: go-fuse's request readers
	// ((*Server).loop) are a pool that grows with concurrent requests up to
	// GOMAXPROCS+1 (at most 17, go-fuse's maxMaxReaders+1) and shrinks only when too
	// many are reading, so their number follows how the kernel queued requests, not how
	// many children there were; they are allowed up to 17.
	var excess []string
	var afterG goroutines
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		afterG = pp.profile(t)
		excess = afterG.excessOver(baseG)
		if len(excess) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if d := afterG.diff(baseG); d != "" {
		t.Logf("goroutines by function where the count changed, before -> after: %s", d)
	}
	if len(excess) > 0 {
		var b strings.Builder
		for _, fn := range excess {
			fmt.Fprintf(&b, "%s: %d goroutines, %d before\n", fn, afterG.byRoot[fn], baseG.byRoot[fn])
			for _, blk := range afterG.blocks[fn] {
				b.WriteString(blk)
				b.WriteString("\n")
			}
		}
		t.Errorf("goroutines left 60 s after deleting %d children: %d (before %d, with the children %d); by function:\n%s",
			n, afterG.total, baseG.total, peakG.total, b.String())
	}

	// File descriptors (TUN queues, netlink sockets, ...): none more of any kind.
	var afterFD map[string]int
	var moreFD []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		afterFD, moreFD = fdKinds(t, pid), nil
		for kind, c := range afterFD {
			if c > baseFD[kind] {
				moreFD = append(moreFD, fmt.Sprintf("%s: %d, %d before", kind, c, baseFD[kind]))
			}
		}
		if len(moreFD) == 0 || time.Now().After(deadline) {
			break
		}
	}
	sort.Strings(moreFD)
	if len(moreFD) > 0 {
		t.Errorf("file descriptors left after deleting %d children:\n%s", n, strings.Join(moreFD, "\n"))
	}
	t.Logf("after deleting them: %d goroutines, %d file descriptors, %d MiB resident", afterG.total, sumCounts(afterFD), rssKiB(t, pid)>>10)
}

// buildPprofDaemon builds the daemon with -tags pprof (net/http/pprof on
// $IPOIBFS_PPROF_ADDR, cmd/ipoibfs/pprof.go), as TestMain builds binPath.
func buildPprofDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ipoibfs-pprof")
	if out, err := exec.Command("go", "build", "-tags", "pprof", "-o", bin, "../cmd/ipoibfs").CombinedOutput(); err != nil {
		t.Fatalf("building ipoibfs -tags pprof: %v\n%s", err, out)
	}
	return bin
}

// pprofClient reads a daemon's goroutine profile over loopback. Keep-alives are off so
// that no connection of an earlier read holds a goroutine in the daemon.
type pprofClient struct {
	addr string
	c    *http.Client
}

// treeStartPprof is treeStart for a binary built with -tags pprof: the tree mounted on
// a new directory, the interfaces in a new namespace, pprof on a free loopback port
// (no 9P). It waits until the tree and pprof answer.
func treeStartPprof(t *testing.T, bin, tag string, extra ...string) (*treeDaemon, *pprofClient) {
	t.Helper()
	treeRequire(t)
	mnt := treeMountDir(t)
	td := &treeDaemon{mnt: mnt, ns: treeNetns(t, tag)}
	treeNoMountAt(t, mnt) // registered first, so it runs after the daemon's SIGTERM cleanup
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	pp := &pprofClient{addr: fmt.Sprintf("127.0.0.1:%d", treeFreePort(t)), c: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
	// The cleanup waits longer for the exit (a test that failed half way leaves
	// thousands of devices to remove) and shows the end of the log without the lines
	// every child makes.
	td.daemon = startDaemonWith(t, daemonOpts{bin: bin, env: []string{"IPOIBFS_PPROF_ADDR=" + pp.addr}, exitWait: 3 * time.Minute,
		logShown: func(s string) string { return logTail(unroutine(s), 200) }}, "tree-"+tag,
		append([]string{"-mount", mnt, "-netns", td.ns}, extra...)...)
	treeWait(t, mnt, td.log)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := pp.get("/debug/pprof/goroutine?debug=1"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("pprof on %s: %v", pp.addr, err)
		}
	}
	return td, pp
}

// unroutine drops the log lines every child makes, so that a failure shows the rest.
func unroutine(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, "_child: ok;") && !strings.Contains(l, "/flags: ok;") &&
			!strings.Contains(l, `msg="interface statistics"`) && !strings.Contains(l, "is not found") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// logTail is the last n lines of s.
func logTail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = append([]string{fmt.Sprintf("[%d lines before]", len(l)-n)}, l[len(l)-n:]...)
	}
	return strings.Join(l, "\n")
}

func (p *pprofClient) get(path string) (string, error) {
	resp, err := p.c.Get("http://" + p.addr + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", path, resp.Status)
	}
	return string(b), nil
}

// goroutines is a goroutine profile (debug=1) grouped by each goroutine's function:
// the bottom frame of its stack.
type goroutines struct {
	total  int
	byRoot map[string]int
	blocks map[string][]string // the profile's stacks, with their counts, by function
}

// fuseReaders is go-fuse's request reader loop; see the tolerance in the test.
const fuseReaders = "github.com/hanwen/go-fuse/v2/fuse.(*Server).loop"

func (p *pprofClient) profile(t *testing.T) goroutines {
	t.Helper()
	s, err := p.get("/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	return parseGoroutines(t, s)
}

func parseGoroutines(t *testing.T, s string) goroutines {
	t.Helper()
	g := goroutines{byRoot: map[string]int{}, blocks: map[string][]string{}}
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	if !sc.Scan() {
		t.Fatalf("empty goroutine profile")
	}
	if _, err := fmt.Sscanf(sc.Text(), "goroutine profile: total %d", &g.total); err != nil {
		t.Fatalf("goroutine profile starts with %q: %v", sc.Text(), err)
	}
	var count int
	var root string
	var blk []string
	flush := func() {
		if count > 0 {
			if root == "" {
				root = "(no frames)"
			}
			g.byRoot[root] += count
			g.blocks[root] = append(g.blocks[root], strings.Join(blk, "\n"))
		}
		count, root, blk = 0, "", nil
	}
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.TrimSpace(l) == "":
			flush()
		case strings.HasPrefix(l, "#"):
			blk = append(blk, l)
			if f := strings.Fields(l); len(f) >= 3 {
				fn, _, _ := strings.Cut(f[2], "+0x")
				root = fn
			}
		default:
			flush()
			blk = []string{l}
			c, _, _ := strings.Cut(l, " ")
			n, err := strconv.Atoi(c)
			if err != nil {
				t.Fatalf("goroutine profile line %q", l)
			}
			count = n
		}
	}
	flush()
	return g
}

// excessOver lists the functions with more goroutines than in base (go-fuse's reader
// pool: more than 17), sorted.
func (g goroutines) excessOver(base goroutines) []string {
	var out []string
	for fn, c := range g.byRoot {
		allowed := base.byRoot[fn]
		if fn == fuseReaders {
			allowed = max(allowed, 17)
		}
		if c > allowed {
			out = append(out, fn)
		}
	}
	sort.Strings(out)
	return out
}

// settled returns the goroutine profile once the total has stayed the same for three
// reads in a row (the warm-up's leaves and the memory release have run).
func (p *pprofClient) settled(t *testing.T) goroutines {
	t.Helper()
	last, same := p.profile(t), 0
	for deadline := time.Now().Add(30 * time.Second); same < 3; {
		time.Sleep(300 * time.Millisecond)
		g := p.profile(t)
		if g.total == last.total {
			same++
		} else {
			same = 0
		}
		last = g
		if time.Now().After(deadline) {
			t.Fatalf("goroutines did not settle before the test: %d", g.total)
		}
	}
	return last
}

// treeRegs reads what the tree shows of per-child registrations: the listings of
// class/net and the debug directory, the SM's groups (members included) and nodes,
// the fabric's groups (an SA query from this node) and ib0's multicast groups and
// paths.
func treeRegs(t *testing.T, td *treeDaemon) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, dir := range []string{"class/net/", "kernel/debug/ipoib/"} {
		ents, err := os.ReadDir(td.path(dir))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		m[dir] = strings.Join(names, " ")
	}
	for _, f := range []string{"sm/groups", "sm/nodes", "fabric/groups", "kernel/debug/ipoib/ib0_mcg", "kernel/debug/ipoib/ib0_path"} {
		b, err := os.ReadFile(td.path(f))
		if err != nil {
			t.Fatal(err)
		}
		m[f] = string(b)
	}
	return m
}

// regsSettled is treeRegs once two reads a second apart agree.
func regsSettled(t *testing.T, td *treeDaemon) map[string]string {
	t.Helper()
	last := treeRegs(t, td)
	for deadline := time.Now().Add(30 * time.Second); ; {
		time.Sleep(time.Second)
		r := treeRegs(t, td)
		if cmp.Equal(r, last) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tree's registrations did not settle before the test:\n%s", cmp.Diff(last, r))
		}
		last = r
	}
}

// smGroupMembers parses sm/groups: each MGID's member lines.
func smGroupMembers(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]string{}
	var mgid string
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "MGID: "):
			mgid = strings.TrimPrefix(l, "MGID: ")
			m[mgid] = nil
		case strings.HasPrefix(l, "    ") && mgid != "":
			m[mgid] = append(m[mgid], strings.TrimSpace(l))
		}
	}
	return m
}

// linkFlags is `ip -o link show` in ns: each device's flags (<...>).
func linkFlags(t *testing.T, ns string) map[string][]string {
	t.Helper()
	out := mustRun(t, "ip", "-n", ns, "-o", "link", "show")
	m := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		m[n] = strings.Split(strings.Trim(f[2], "<>"), ",")
	}
	return m
}

// fdKinds counts a process's open file descriptors by what they are: a path
// (/dev/net/tun, /dev/fuse), or the kind of a socket, pipe or anonymous inode.
func fdKinds(t *testing.T, pid int) map[string]int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if k, _, ok := strings.Cut(l, ":["); ok { // socket:[123], pipe:[45]
			l = k
		}
		m[l]++
	}
	return m
}

func sumCounts(m map[string]int) int {
	s := 0
	for _, c := range m {
		s += c
	}
	return s
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(slices.Clone(s[:n]), "...")
	}
	return s
}

// perWrite is each chunk's time divided by the writes in it.
func perWrite(chunks []time.Duration, per int) []time.Duration {
	out := make([]time.Duration, len(chunks))
	for i, c := range chunks {
		out[i] = (c / time.Duration(per)).Round(time.Microsecond)
	}
	return out
}

// diff names the functions whose goroutine count differs from base, with both counts.
func (g goroutines) diff(base goroutines) string {
	var out []string
	for fn, c := range g.byRoot {
		if c != base.byRoot[fn] {
			out = append(out, fmt.Sprintf("%s %d -> %d", fn, base.byRoot[fn], c))
		}
	}
	for fn, c := range base.byRoot {
		if _, ok := g.byRoot[fn]; !ok {
			out = append(out, fmt.Sprintf("%s %d -> 0", fn, c))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// childState is what the tree and the daemon's log say of an interface, for a failure.
func childState(td *treeDaemon, name string) string {
	var b strings.Builder
	for _, f := range []string{"flags", "carrier", "operstate"} {
		v, err := os.ReadFile(td.path("class/net/" + name + "/" + f))
		fmt.Fprintf(&b, "%s %q %v; ", f, v, err)
	}
	v, err := os.ReadFile(td.path("kernel/debug/ipoib/" + name + "_mcg"))
	fmt.Fprintf(&b, "%s_mcg %v:\n%s", name, err, v)
	var lines []string
	for _, l := range strings.Split(td.log.String(), "\n") {
		if strings.Contains(l, name) {
			lines = append(lines, l)
		}
	}
	fmt.Fprintf(&b, "log lines naming %s:\n%s", name, logTail(strings.Join(lines, "\n"), 50))
	return b.String()
}
