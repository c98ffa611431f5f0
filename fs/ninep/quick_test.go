package ninep

import (
	"encoding/binary"
	"strings"
	"sync"
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
		{"class/net/ib0/ifalias", syscall.O_RDONLY, false}, // asks the kernel
		{"class/infiniband/n1/ports/1/counters/port_xmit_packets", syscall.O_RDONLY, false},
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
// included, are still read and answered meanwhile, and the read ends with the next
// event (TestWaitingReadHoldsNoPathLocks ends one with its Tflush).
func TestQuickRequestsPassAWaitingRead(t *testing.T) {
	l, c, done := eventsClient(t)
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

// A stream read waiting for the next event holds none of the connection's path locks:
// a setattr (which the p9 server does under the file's write lock) is answered while
// it waits, and so is the getattr after it (which a queued writer would hold, and
// with it, answered where it is received, every request behind it: the Tflush that
// ends the read among them). Raw frames, each with its own tag.
func TestWaitingReadHoldsNoPathLocks(t *testing.T) {
	v := newEnv(t)
	tree := fs.New(v.e, fs.Options{Events: fs.NewEventLog()})
	raw := serveRaw(t, tree.Root(), Options{Unidentified: &fs.Internal})
	raw.open(0, "events")
	send, next := raw.sendTag, raw.next
	read := binary.LittleEndian.AppendUint64(u32(1), 0)
	for {
		// What the log holds already (the attach's lines) is read at once: until a
		// read waits.
		send(frame(116, 0, append(read, u32(4096)...)...), 10) // Tread of events
		select {
		case r := <-raw.frames:
			if r[4] != 117 {
				t.Fatalf("read of events: % x", r)
			}
			continue
		case <-time.After(100 * time.Millisecond):
		}
		break
	}
	// Tsetattr of the size (root's truncate: accepted, and logged nowhere, so no event
	// ends the read), which the p9 server does under the file's write lock.
	setattr := append(u32(1), u32(0x8)...) // valid: size
	setattr = append(setattr, make([]byte, 4+4+4+8+4*8)...)
	send(frame(26, 0, setattr...), 11)
	getattr := binary.LittleEndian.AppendUint64(u32(1), 0x7ff)
	send(frame(24, 0, getattr...), 12) // Tgetattr
	got := map[uint16]byte{}
	for len(got) < 2 {
		r := next("the setattr and the getattr while a stream read waits")
		if tag := binary.LittleEndian.Uint16(r[5:]); tag == 10 {
			// The read had not been waiting yet (a slow machine): ask again.
			send(frame(116, 0, append(read, u32(4096)...)...), 10)
		} else {
			got[tag] = r[4]
		}
	}
	if got[11] != 27 || got[12] != 25 {
		t.Fatalf("replies while the read waits (tag: type): %v; want Rsetattr for 11, Rgetattr for 12", got)
	}
	send(tflush(0, 10), 13)
	r1, r2 := next("the flushed read"), next("Rflush")
	if binary.LittleEndian.Uint16(r1[5:]) != 10 || r2[4] != 109 || binary.LittleEndian.Uint16(r2[5:]) != 13 {
		t.Fatalf("after Tflush: % x then % x; want the read's reply (tag 10), then Rflush (13)", r1, r2)
	}
}

// While a request is in hand (a write to reload that waits), the connection's next
// requests are handed to other goroutines as the p9 server does, not answered where
// they are received: a getattr that waits behind the setattr queued after the write
// does not keep a walk after it from being read and answered.
func TestRequestsPassOneInHand(t *testing.T) {
	v := newEnv(t)
	started, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	tree := fs.New(v.e, fs.Options{Reload: func() error {
		close(started)
		<-release
		return nil
	}})
	raw := serveRaw(t, tree.Root(), Options{Unidentified: &fs.Internal})
	raw.open(syscall.O_WRONLY, "reload")
	raw.sendTag(twrite(1, "1"), 10) // waits in the reload
	<-started
	setattr := append(u32(1), u32(0x8)...) // valid: size
	setattr = append(setattr, make([]byte, 4+4+4+8+4*8)...)
	raw.sendTag(frame(26, 0, setattr...), 11) // waits for the write's read lock of the file
	getattr := binary.LittleEndian.AppendUint64(u32(1), 0x7ff)
	// The getattr waits behind the setattr once that is queued as the file's writer;
	// a getattr answered first came before (a slow machine): try again, later.
	var gtag uint16
	for try, wait := uint16(0), 50*time.Millisecond; ; try, wait = try+1, 2*wait {
		time.Sleep(wait)
		gtag = 12 + 2*try
		wtag := gtag + 1
		raw.sendTag(frame(24, 0, getattr...), gtag)
		walk := twalk(0, 2+uint32(try), "class")
		binary.LittleEndian.PutUint16(walk[5:], wtag)
		go raw.cc.Write(walk) // a pipe: the write waits until the server reads it
		var r []byte
		select {
		case r = <-raw.frames:
		case <-time.After(5 * time.Second):
			t.Fatal("a walk was not answered while a write was in hand (the getattr before it held the connection)")
		}
		tag := binary.LittleEndian.Uint16(r[5:])
		if tag == wtag && r[4] == 111 {
			break
		}
		if tag != gtag || r[4] != 25 || try == 4 {
			t.Fatalf("while the reload waits: reply % x, want Rwalk for tag %d", r, wtag)
		}
		raw.next("the walk after a getattr answered at once")
	}
	releaseOnce()
	got := map[uint16]byte{}
	for len(got) < 3 {
		r := raw.next("the write, setattr and getattr after the reload")
		got[binary.LittleEndian.Uint16(r[5:])] = r[4]
	}
	if got[10] != 119 || got[11] != 27 || got[gtag] != 25 {
		t.Errorf("replies after the reload (tag: type): %v; want Rwrite 10, Rsetattr 11, Rgetattr %d", got, gtag)
	}
}
