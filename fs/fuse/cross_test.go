package fuse

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	ipfs "ipoibfs/fs"
	"ipoibfs/fs/ninep"
)

// ninepClient serves root over net.Pipe and returns a 9P client.
func ninepClient(t *testing.T, root *ipfs.Node) *ninep.Client {
	t.Helper()
	cc, sc := net.Pipe()
	done := make(chan struct{})
	go func() { ninep.ServeConn(sc, root, ninep.Options{Unidentified: &ipfs.Internal}); close(done) }()
	c, err := ninep.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); <-done })
	return c
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// frontEnd reads, writes and lists by path.
type frontEnd interface {
	read(path string) (string, syscall.Errno)
	write(path, data string) syscall.Errno
	list(path string) ([]string, error)
	mode(path string) (os.FileMode, error)
}

type fuseFE struct{ dir string }

func (f fuseFE) read(path string) (string, syscall.Errno) {
	b, err := os.ReadFile(filepath.Join(f.dir, path))
	return string(b), errnoOf(err)
}

// write is `echo -n data > path` without O_CREAT: open, one write, close.
func (f fuseFE) write(path, data string) syscall.Errno {
	fh, err := os.OpenFile(filepath.Join(f.dir, path), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return errnoOf(err)
	}
	_, werr := fh.Write([]byte(data))
	cerr := fh.Close()
	if werr != nil {
		return errnoOf(werr)
	}
	return errnoOf(cerr)
}

func (f fuseFE) list(path string) ([]string, error) {
	es, err := os.ReadDir(filepath.Join(f.dir, path))
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out, err
}

func (f fuseFE) mode(path string) (os.FileMode, error) {
	st, err := os.Stat(filepath.Join(f.dir, path))
	if err != nil {
		return 0, err
	}
	return st.Mode(), nil
}

type ninepFE struct{ c *ninep.Client }

func (n ninepFE) read(path string) (string, syscall.Errno) {
	b, err := n.c.ReadFile(path)
	return string(b), errnoOf(err)
}

func (n ninepFE) write(path, data string) syscall.Errno {
	return errnoOf(n.c.WriteFile(path, []byte(data)))
}

func (n ninepFE) list(path string) ([]string, error) {
	ns, err := n.c.ReadDir(path)
	sort.Strings(ns)
	return ns, err
}

func (n ninepFE) mode(path string) (os.FileMode, error) { return n.c.Stat(path) }

// walkAll returns every path under the root with its mode.
func walkAll(t *testing.T, fe frontEnd) map[string]os.FileMode {
	t.Helper()
	out := map[string]os.FileMode{}
	var walk func(dir string)
	walk = func(dir string) {
		names, err := fe.list(dir)
		if err != nil {
			t.Fatalf("list %q: %v", dir, err)
		}
		for _, n := range names {
			p := strings.TrimPrefix(dir+"/"+n, "/")
			m, err := fe.mode(p)
			if err != nil {
				t.Fatalf("stat %s: %v", p, err)
			}
			out[p] = m & (fs.ModeDir | fs.ModePerm)
			if m.IsDir() {
				walk(p)
			}
		}
	}
	walk("")
	return out
}

// jiffies in <if>_mcg depend on when a group was joined.
var created = regexp.MustCompile(`created: +\d+`)

// TestSameBytesBothFrontEnds walks the whole tree over FUSE and over 9P: same names,
// same modes, and every file the same bytes or the same errno.
func TestSameBytesBothFrontEnds(t *testing.T) {
	v := newEnv(t)
	if _, err := v.ib0.CreateChild(0x8001); err != nil {
		t.Fatal(err)
	}
	c, _ := v.e.Interface("ib0.8001")
	c.SetUp(false) // so that its carrier file answers EINVAL
	fu := fuseFE{mount(t, v.tree.Root())}
	np := ninepFE{ninepClient(t, v.tree.Root())}
	a, b := walkAll(t, fu), walkAll(t, np)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("trees differ (-fuse +9p):\n%s", diff)
	}
	if len(a) < 150 {
		t.Fatalf("only %d paths", len(a))
	}
	errnos := map[syscall.Errno]int{}
	for _, p := range slices.Sorted(maps.Keys(a)) {
		if a[p].IsDir() || strings.HasSuffix(p, "/capture") { // a stream: reads wait for packets
			continue
		}
		x, ex := fu.read(p)
		y, ey := np.read(p)
		if ex != ey || x != y {
			t.Errorf("%s: fuse %q %v, 9p %q %v", p, x, ex, y, ey)
		}
		errnos[ex]++
	}
	// Both kinds of failure were exercised: 0200 files and a down interface's carrier,
	// dormant, duplex and speed.
	if errnos[syscall.EACCES] != 2 || errnos[syscall.EINVAL] != 4 {
		t.Errorf("errno counts %v, want 2 EACCES (ib0's create_child and delete_child) and 4 EINVAL", errnos)
	}
}

// TestSameErrnoBothFrontEnds writes the same inputs to every writable file of two
// identical engines, one over FUSE and one over 9P: every write must give the same
// errno, and the trees must end up with the same content.
func TestSameErrnoBothFrontEnds(t *testing.T) {
	va, vb := newEnv(t), newEnv(t)
	fu := fuseFE{mount(t, va.tree.Root())}
	np := ninepFE{ninepClient(t, vb.tree.Root())}
	inputs := []string{"", "\n", "0", "1", "-1", "0x8001", "0x0001", "1\n", "garbage", "datagram", "datagram\n",
		"connected", "connected\n", "2044", "71", "100000", "rx-usecs 5", "rx-frames: 7\nrx-usecs: 9\n", "tx-usecs 1",
		"gro off", "tso off\ntx on", "lro on", "0x8002\n", "0x8002",
		"Default=0x7fff, ipoib : ALL=full;\nP1=0x8001, ipoib : ALL=full;\n", "P1=0x8001 : ALL=nonsense;\n"}
	paths := walkAll(t, fu)
	var writable []string
	for p, m := range paths {
		if !m.IsDir() && m.Perm()&0222 != 0 {
			writable = append(writable, p)
		}
	}
	slices.Sort(writable)
	writable = append(writable, "class/net/nosuch/mtu", "class/net/ib0/pkey", "class/net/ib0/newfile", "class/net")
	steps, fails := 0, 0
	for _, p := range writable {
		for _, in := range inputs {
			ea, eb := fu.write(p, in), np.write(p, in)
			steps++
			if ea != 0 {
				fails++
			}
			if ea != eb {
				t.Errorf("echo -n %q > %s: fuse %v, 9p %v", in, p, ea, eb)
			}
		}
	}
	if fails == 0 || fails == steps {
		t.Errorf("%d of %d writes failed: the table does not exercise both outcomes", fails, steps)
	}
	// Same resulting trees (read each over its own front end).
	pa, pb := walkAll(t, fu), walkAll(t, np)
	if diff := cmp.Diff(pa, pb); diff != "" {
		t.Fatalf("trees differ after the writes (-fuse +9p):\n%s", diff)
	}
	for _, p := range slices.Sorted(maps.Keys(pa)) {
		if pa[p].IsDir() || strings.HasSuffix(p, "/capture") || strings.Contains(p, "statistics") || strings.Contains(p, "/counters/") || strings.Contains(p, "/carrier") ||
			strings.HasSuffix(p, "/operstate") || strings.HasSuffix(p, "/speed") || strings.HasSuffix(p, "/duplex") || strings.HasSuffix(p, "/flags") || p == "sm/groups" {
			continue // traffic and join timing
		}
		x, ex := fu.read(p)
		y, ey := np.read(p)
		x, y = created.ReplaceAllString(x, "created: J"), created.ReplaceAllString(y, "created: J")
		if ex != ey || x != y {
			t.Errorf("%s: fuse engine %q %v, 9p engine %q %v", p, x, ex, y, ey)
		}
	}
}

// TestConcurrentChildren: 8 goroutines, half over FUSE and half over 9P, create and
// delete children with random P_Keys. Afterwards class/net lists exactly the children
// whose last successful operation was a create, with no duplicates.
func TestConcurrentChildren(t *testing.T) {
	v := newEnv(t)
	dir := mount(t, v.tree.Root())
	const keys, ops = 6, 30
	var net [keys]atomic.Int64 // successful creates minus successful deletes
	var wg sync.WaitGroup
	for g := range 8 {
		var fe frontEnd = fuseFE{dir}
		if g%2 == 1 {
			fe = ninepFE{ninepClient(t, v.tree.Root())}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 42))
			for range ops {
				k := r.IntN(keys)
				pkey := fmt.Sprintf("%#x", 0x8001+k)
				if r.IntN(2) == 0 {
					switch e := fe.write("class/net/ib0/create_child", pkey); e {
					case 0:
						net[k].Add(1)
					case syscall.ENOTUNIQ:
					default:
						t.Errorf("create %s: %v", pkey, e)
					}
				} else {
					switch e := fe.write("class/net/ib0/delete_child", pkey); e {
					case 0:
						net[k].Add(-1)
					case syscall.ENODEV:
					default:
						t.Errorf("delete %s: %v", pkey, e)
					}
				}
			}
		}()
	}
	wg.Wait()
	want := []string{"ib0"}
	for k := range keys {
		switch n := net[k].Load(); n {
		case 1:
			want = append(want, fmt.Sprintf("ib0.%04x", 0x8001+k))
		case 0:
		default:
			t.Errorf("P_Key %#x: creates minus deletes = %d", 0x8001+k, n)
		}
	}
	for name, fe := range map[string]frontEnd{"fuse": fuseFE{dir}, "9p": ninepFE{ninepClient(t, v.tree.Root())}} {
		got, err := fe.list("class/net")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ls class/net over %s (-want +got):\n%s", name, diff)
		}
	}
	out, _, _ := sh(t, dir, "ls class/net", nil)
	if got := strings.Fields(out); !slices.Equal(got, want) {
		t.Errorf("bash ls class/net = %q, want %q", got, want)
	}
}
