package ninep

import (
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// The server answers quick requests in the goroutine that receives them (p9.QuickFile):
// only reads that come from memory, and clunks that apply nothing, may be quick.
func TestQuickFiles(t *testing.T) {
	v := newEnv(t)
	tree := fs.New(v.e, fs.Options{SM: v.hca.SM(), Events: fs.NewEventLog()})
	a := &attacher{root: tree.Root(), o: &Options{MaxFids: 100}, fids: new(atomic.Int64)}
	for _, c := range []struct {
		path  string
		flags int // -1: not opened
		quick bool
	}{
		{"class/net/ib0/pkey", syscall.O_RDONLY, true},
		{"class/net/ib0/pkey", -1, true},
		{"module/ib_ipoib/parameters/send_queue_size", syscall.O_RDONLY, true},
		{"class/net/ib0", syscall.O_RDONLY, true},
		{"class/net/ib0/mode", syscall.O_WRONLY, false}, // its clunk applies a write
		{"class/net/ib0/mode", syscall.O_RDWR, false},
		{"events", syscall.O_RDONLY, false},       // a read waits for the next event
		{"fabric/nodes", syscall.O_RDONLY, false}, // a read asks the SA over the fabric
		{"kernel/debug/ipoib/ib0_mcg", -1, false}, // tables of any size
		{"sm/partitions", syscall.O_RDONLY, false},
	} {
		n, err := tree.Lookup(c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		f, err := newFile(a, n, fs.Internal)
		if err != nil {
			t.Fatal(err)
		}
		if c.flags >= 0 {
			if f.h, err = n.Open(fs.Internal, c.flags); err != nil {
				t.Fatalf("open %s: %v", c.path, err)
			}
		}
		if got := f.Quick(); got != c.quick {
			t.Errorf("%s (flags %#x): quick %v, want %v", c.path, c.flags, got, c.quick)
		}
		f.Close()
	}
}

// A stream read that waits is not quick: the connection's other requests, quick ones
// included, are still read and answered meanwhile, and the read still ends at its
// Tflush.
func TestQuickRequestsPassAWaitingRead(t *testing.T) {
	v := newEnv(t)
	l := fs.NewEventLog()
	tree := fs.New(v.e, fs.Options{Events: l})
	cc, sc := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeConn(sc, tree.Root(), Options{Unidentified: &fs.Internal}) }()
	c, err := NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the server did not end with its client")
		}
	}()
	ev, err := c.walk("events")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ev.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		n, _ := ev.ReadAt(buf, 0)
		got <- string(buf[:n])
	}()
	time.Sleep(50 * time.Millisecond) // the read is waiting in the server
	answered := make(chan error, 1)
	go func() {
		for range 20 {
			f, err := c.walk("class/net/ib0/pkey")
			if err != nil {
				answered <- err
				return
			}
			if _, _, err := f.Open(p9.ReadOnly); err != nil {
				answered <- err
				return
			}
			buf := make([]byte, 64)
			n, err := f.ReadAt(buf, 0)
			f.Close()
			if err != nil || string(buf[:n]) != "0xffff\n" {
				answered <- err
				return
			}
		}
		answered <- nil
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("walk, open, read and clunk of pkey not answered while a stream read waits")
	}
	l.Emit("ib0: after")
	select {
	case s := <-got:
		if !strings.HasSuffix(s, " ib0: after\n") {
			t.Errorf("stream read %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting stream read never ended")
	}
}
