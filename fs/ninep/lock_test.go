package ninep

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

type lockFile interface {
	p9.File
	GetLock(p9.LockDesc) (p9.LockDesc, error)
}

// lockClient opens class/net/ib0/pkey over its own connection.
func lockClient(t *testing.T, v *env) (lockFile, func()) {
	t.Helper()
	f, _, end := lockClientRoot(t, v)
	return f, end
}

// openPkey opens another fid of class/net/ib0/pkey from root.
func openPkey(t *testing.T, root p9.File) lockFile {
	t.Helper()
	_, f, err := root.Walk([]string{"class", "net", "ib0", "pkey"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	return f.(lockFile)
}

// lockClientRoot is lockClient that also returns the connection's root.
func lockClientRoot(t *testing.T, v *env) (lockFile, p9.File, func()) {
	t.Helper()
	root, end := rawAttach(t, v.tree.Root(), Options{Unidentified: &fs.Internal})
	return openPkey(t, root), root, end
}

// POSIX record locks over 9P hold between connections, as v9fs clients on two
// machines need them to: conflicts are Blocked, Tgetlock names the holder, read locks
// share, an unlock splits a range, and a connection's locks end with it.
func TestLocksBetweenConnections(t *testing.T) {
	v := newEnv(t)
	a, endA := lockClient(t, v)
	b, _ := lockClient(t, v)
	lock := func(f lockFile, pid int, typ p9.LockType, start, length uint64) p9.LockStatus {
		t.Helper()
		st, err := f.Lock(pid, typ, 0, start, length, "host")
		if err != nil {
			t.Fatalf("Tlock %v [%d,+%d): %v", typ, start, length, err)
		}
		return st
	}
	if st := lock(a, 1, p9.WriteLock, 0, 0); st != p9.LockStatusOK {
		t.Fatalf("first write lock: %v", st)
	}
	for _, typ := range []p9.LockType{p9.WriteLock, p9.ReadLock} {
		if st := lock(b, 2, typ, 100, 1); st != p9.LockStatusBlocked {
			t.Errorf("%v over another connection's write lock: %v, want Blocked", typ, st)
		}
	}
	got, err := b.GetLock(p9.LockDesc{Type: p9.WriteLock, Start: 5, Length: 1, PID: 2, Client: "host"})
	if err != nil || got != (p9.LockDesc{Type: p9.WriteLock, Start: 0, Length: 0, PID: 1, Client: "host"}) {
		t.Errorf("Tgetlock under a's lock: %+v, %v", got, err)
	}
	// The same pid and client on the other connection is another owner still.
	if st := lock(b, 1, p9.WriteLock, 0, 1); st != p9.LockStatusBlocked {
		t.Errorf("pid 1 of the other connection: %v, want Blocked", st)
	}
	// Unlocking [10,20) leaves a with [0,10) and [20,end).
	lock(a, 1, p9.Unlock, 10, 10)
	if st := lock(b, 2, p9.WriteLock, 10, 10); st != p9.LockStatusOK {
		t.Errorf("the hole a unlocked: %v", st)
	}
	for _, r := range [][2]uint64{{5, 10}, {19, 2}, {30, 0}} {
		if st := lock(b, 2, p9.WriteLock, r[0], r[1]); st != p9.LockStatusBlocked {
			t.Errorf("[%d,+%d) across a's remaining locks: %v", r[0], r[1], st)
		}
	}
	if got, _ := b.GetLock(p9.LockDesc{Type: p9.WriteLock, Start: 25, Length: 0}); got.Start != 20 || got.Length != 0 {
		t.Errorf("Tgetlock names a's upper piece as %+v, want start 20 to the end", got)
	}
	// Read locks share; a write lock waits for them.
	lock(a, 1, p9.Unlock, 0, 0)
	lock(b, 2, p9.Unlock, 0, 0)
	if lock(a, 1, p9.ReadLock, 0, 0) != p9.LockStatusOK || lock(b, 2, p9.ReadLock, 0, 0) != p9.LockStatusOK {
		t.Error("two read locks do not share")
	}
	if st := lock(b, 2, p9.WriteLock, 0, 0); st != p9.LockStatusBlocked {
		t.Errorf("upgrading past another's read lock: %v", st)
	}
	if got, _ := a.GetLock(p9.LockDesc{Type: p9.ReadLock}); got.Type != p9.Unlock {
		t.Errorf("Tgetlock for a read lock among read locks: %+v, want unlocked", got)
	}
	// a's connection ends: its locks go, and nothing of them stays in the table.
	endA()
	if st := lock(b, 2, p9.WriteLock, 0, 0); st != p9.LockStatusOK {
		t.Errorf("after a's connection ended: %v", st)
	}
	lock(b, 2, p9.Unlock, 0, 0)
	locks.mu.Lock()
	n, m := len(locks.files), len(locks.held)
	locks.mu.Unlock()
	if n != 0 || m != 0 {
		t.Errorf("the lock table keeps %d files and %d connections with every lock released", n, m)
	}
}

// One connection holds at most maxLocksPerConn locks (ENOLCK beyond), and a range that
// does not fit in 64 bits is EINVAL.
func TestLocksBounded(t *testing.T) {
	v := newEnv(t)
	a, _ := lockClient(t, v)
	for k := range uint64(maxLocksPerConn) {
		if st, err := a.Lock(1, p9.ReadLock, 0, 2*k, 1, "host"); err != nil || st != p9.LockStatusOK {
			t.Fatalf("lock %d: %v %v", k, st, err)
		}
	}
	if _, err := a.Lock(1, p9.ReadLock, 0, 1<<40, 1, "host"); !errors.Is(err, linux.ENOLCK) {
		t.Errorf("lock %d: %v, want ENOLCK", maxLocksPerConn+1, err)
	}
	if _, err := a.Lock(1, p9.Unlock, 0, 0, 0, "host"); err != nil {
		t.Errorf("unlocking all: %v", err)
	}
	if _, err := a.Lock(1, p9.WriteLock, 0, 1<<63, 1<<63, "host"); !errors.Is(err, linux.EINVAL) {
		t.Errorf("a range past 2^64: %v, want EINVAL", err)
	}
}

// FuzzLockTable checks the lock table against a model that keeps each owner's lock
// type byte by byte (the last cell standing for every byte from size on): the same
// answers (OK, Blocked, EINVAL), and after each request the same lock on every byte,
// no two ranges of one owner overlapping or adjacent with one type, and each
// connection's count equal to its locks. Owners 0 and 1 are one process through two
// fids, 2 another process of that connection, 3 a process of another connection; an
// op of type 4 is a clunk of the owner's fid.
func FuzzLockTable(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 1, 1, 5, 3, 0, 2, 2, 0})
	f.Add([]byte{0, 0, 0, 0, 1, 0, 3, 4, 0, 2, 1, 2, 1, 1, 0, 0})
	f.Add([]byte{0, 1, 0, 1, 0, 1, 1, 1, 1, 2, 0, 0, 3, 1, 0, 0, 0, 4, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const size = 24
		ops = ops[:min(len(ops), 4*64)] // 64 requests: each checks every byte of the model
		tab := &lockTable{files: map[lockKey][]heldLock{}, held: map[*attacher]int{}}
		conns := []*attacher{{}, {}}
		k := lockKey{ino: 1}
		shared := &file{a: conns[0]}
		owners := []lockOwner{{conn: conns[0], fid: shared, pid: 1}, {conn: conns[0], fid: &file{a: conns[0]}, pid: 1},
			{conn: conns[0], fid: shared, pid: 2}, {conn: conns[1], fid: &file{a: conns[1]}, pid: 1}}
		var model [4][size + 1]int // owner, byte: 0 none, 1 read, 2 write
		kind := map[p9.LockType]int{p9.ReadLock: 1, p9.WriteLock: 2, p9.Unlock: 0}
		for len(ops) >= 4 {
			o, op, start := int(ops[0])%len(owners), ops[1]%5, uint64(ops[2]%size)
			length := uint64(ops[3]) % (size - start + 1) // 0: to the end, tail included
			ops = ops[4:]
			if op == 4 { // clunk: what came through the fid goes
				tab.dropFid(k, owners[o].fid)
				for w := range owners {
					if owners[w].fid == owners[o].fid {
						model[w] = [size + 1]int{}
					}
				}
				continue
			}
			typ := p9.LockType(op)
			end := uint64(size + 1)
			if length != 0 {
				end = start + length
			}
			st, err := tab.lock(k, owners[o], typ, start, length)
			if typ > p9.Unlock {
				if !errors.Is(err, linux.EINVAL) {
					t.Fatalf("lock type %d: %v %v", typ, st, err)
				}
				continue
			}
			want := p9.LockStatusOK
			for b := start; b < end && typ != p9.Unlock; b++ {
				for other := range owners {
					// Only another connection's locks conflict.
					if owners[other].conn != owners[o].conn && model[other][b] != 0 && (typ == p9.WriteLock || model[other][b] == 2) {
						want = p9.LockStatusBlocked
					}
				}
			}
			if err != nil || st != want {
				t.Fatalf("owner %d %v [%d,+%d): %v %v, model %v", o, typ, start, length, st, err, want)
			}
			if want == p9.LockStatusOK {
				// The request acts on the locks of its process (same connection and
				// pid, any fid), and the new one is its fid's.
				for w := range owners {
					if owners[w].conn == owners[o].conn && owners[w].pid == owners[o].pid {
						for b := start; b < end; b++ {
							model[w][b] = 0
						}
					}
				}
				for b := start; b < end; b++ {
					model[o][b] = kind[typ]
				}
			}
			count := map[*attacher]int{}
			for w := range owners {
				var got [size + 1]int
				for _, l := range tab.files[k] {
					if l.owner != owners[w] {
						continue
					}
					hi := uint64(size + 1)
					if l.end != 0 {
						hi = l.end
					}
					for b := l.start; b < hi; b++ {
						if got[b] != 0 {
							t.Fatalf("owner %d holds byte %d twice: %+v", w, b, tab.files[k])
						}
						got[b] = kind[l.typ]
					}
					for _, m := range tab.files[k] {
						if m.owner == l.owner && m.typ == l.typ && l.end != 0 && m.start == l.end {
							t.Fatalf("owner %d's adjacent ranges not merged: %+v", w, tab.files[k])
						}
					}
				}
				if got != model[w] {
					t.Fatalf("owner %d: table %v, model %v", w, got, model[w])
				}
			}
			for _, l := range tab.files[k] {
				count[l.owner.conn]++
			}
			for _, c := range conns {
				if tab.held[c] != count[c] {
					t.Fatalf("held %d for a connection with %d locks", tab.held[c], count[c])
				}
			}
		}
		tab.dropConn(conns[0])
		tab.dropConn(conns[1])
		if len(tab.files) != 0 || len(tab.held) != 0 {
			t.Fatalf("left after both connections: %+v %+v", tab.files, tab.held)
		}
	})
}

// Locks conflict only between connections (a client's kernel settles its own
// processes' first); within one, an unlock through the fid a lock came through
// releases it whatever process sends it (flock's lock is the open file's: `flock -u`
// or the shell's close come from another pid), a clunk of that fid releases it, and
// v9fs's Tgetlock, which asks with type Unlock, is answered as for a write lock.
func TestLocksOwnership(t *testing.T) {
	v := newEnv(t)
	a1, rootA, _ := lockClientRoot(t, v)
	a2 := openPkey(t, rootA)
	b, _ := lockClient(t, v)
	lock := func(f lockFile, pid int, typ p9.LockType) p9.LockStatus {
		t.Helper()
		st, err := f.Lock(pid, typ, 0, 0, 0, "host")
		if err != nil {
			t.Fatalf("Tlock %v: %v", typ, err)
		}
		return st
	}
	if lock(a1, 100, p9.WriteLock) != p9.LockStatusOK || lock(a2, 101, p9.WriteLock) != p9.LockStatusOK {
		t.Error("two write locks of one connection conflict: its client's kernel settles those")
	}
	if lock(b, 7, p9.ReadLock) != p9.LockStatusBlocked {
		t.Fatal("another connection's read lock under a write lock")
	}
	got, err := b.GetLock(p9.LockDesc{Type: p9.Unlock, PID: 7, Client: "host"})
	if err != nil || got.Type != p9.WriteLock || got.PID != 100 && got.PID != 101 {
		t.Errorf("Tgetlock of type Unlock (as v9fs sends it) under a write lock: %+v, %v", got, err)
	}
	// Another process's unlock through the same fid (a forked child's exit) leaves
	// pid 100's lock; pid 100's own releases it; a2's stays until its fid is clunked.
	lock(a1, 200, p9.Unlock)
	lock(a2, 101, p9.Unlock) // (a2's own, so that only a1's is left to test)
	if lock(b, 7, p9.ReadLock) != p9.LockStatusBlocked {
		t.Error("pid 100's lock went with another process's unlock through its fid")
	}
	lock(a1, 100, p9.Unlock)
	if st := lock(b, 7, p9.ReadLock); st != p9.LockStatusOK {
		t.Errorf("after pid 100's own unlock: %v", st)
	}
	lock(b, 7, p9.Unlock)
	if lock(a2, 101, p9.WriteLock) != p9.LockStatusOK {
		t.Fatal("a2 relock")
	}
	if err := a2.Close(); err != nil {
		t.Fatal(err)
	}
	if st := lock(b, 7, p9.WriteLock); st != p9.LockStatusOK {
		t.Errorf("after a2's clunk: %v", st)
	}
	// v9fs's Unlock-typed question is a write lock's: another's read lock is in the way.
	lock(b, 7, p9.ReadLock)
	if got, _ := a1.GetLock(p9.LockDesc{Type: p9.Unlock, PID: 100, Client: "host"}); got.Type != p9.ReadLock || got.PID != 7 {
		t.Errorf("Tgetlock of type Unlock over another connection's read lock: %+v", got)
	}
	lock(b, 7, p9.Unlock)
	// Adjacent ranges of one owner merge: a connection may lock byte by byte.
	for k := range uint64(maxLocksPerConn + 10) {
		if st, err := a1.Lock(100, p9.ReadLock, 0, k, 1, "host"); err != nil || st != p9.LockStatusOK {
			t.Fatalf("byte %d: %v %v", k, st, err)
		}
	}
	locks.mu.Lock()
	n := len(locks.files[lockKey{v.tree.Root(), mustIno(t, v, "class/net/ib0/pkey")}])
	locks.mu.Unlock()
	if n != 1 {
		t.Errorf("%d adjacent one-byte read locks of one owner are %d locks, want 1", maxLocksPerConn+10, n)
	}
}

func mustIno(t *testing.T, v *env, p string) uint64 {
	t.Helper()
	n, err := v.tree.Lookup(p)
	if err != nil {
		t.Fatal(err)
	}
	return n.Ino()
}

// A blocking request (fcntl F_SETLKW, flock without -n) waits in the server until the
// lock is free, instead of being answered Blocked for v9fs to sleep its 30 s lock
// timeout; a connection that ends ends its wait.
func TestBlockingLockWaits(t *testing.T) {
	saved := maxLockWait
	maxLockWait = time.Hour // only a release or the connection's end may end a wait here
	defer func() { maxLockWait = saved }()
	v := newEnv(t)
	a, _ := lockClient(t, v)
	b, endB := lockClient(t, v)
	if st, err := a.Lock(1, p9.WriteLock, 0, 0, 0, "host"); err != nil || st != p9.LockStatusOK {
		t.Fatalf("a's lock: %v %v", st, err)
	}
	got := make(chan p9.LockStatus, 1)
	go func() {
		st, err := b.Lock(2, p9.WriteLock, p9.LockFlagsBlock, 0, 0, "host")
		if err != nil {
			t.Error(err)
		}
		got <- st
	}()
	select {
	case st := <-got:
		t.Fatalf("a blocking request under another connection's lock was answered at once: %v", st)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := a.Lock(1, p9.Unlock, 0, 0, 0, "host"); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-got:
		if st != p9.LockStatusOK {
			t.Errorf("the blocking request after the release: %v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking request was not answered after the release")
	}
	// b now holds it: a request on a third connection waits, and that connection's
	// end ends the wait (the server's connection is done, not held for maxLockWait).
	a2, end2 := lockClient(t, v)
	go func() { _, _ = a2.Lock(3, p9.WriteLock, p9.LockFlagsBlock, 0, 0, "host") }()
	time.Sleep(100 * time.Millisecond)
	done := make(chan struct{})
	go func() { end2(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a connection with a waiting lock request did not end")
	}
	endB()
}

func tlock(tag uint16, fid uint32, typ p9.LockType, flags p9.LockFlags, pid uint32) []byte {
	b := append(u32(fid), byte(typ))
	b = append(b, u32(uint32(flags))...)
	b = binary.LittleEndian.AppendUint64(b, 0) // start
	b = binary.LittleEndian.AppendUint64(b, 0) // length: to the end
	b = append(append(b, u32(pid)...), str9("raw")...)
	return frame(52, tag, b...)
}

// rawFrames is a 9P connection to a server that the test writes raw frames to.
type rawFrames struct {
	t      *testing.T
	cc     net.Conn
	frames chan []byte
}

// serveRaw serves root over a pipe and reads its replies in the background.
func serveRaw(t *testing.T, root *fs.Node, o Options) *rawFrames {
	cc, sc := net.Pipe()
	t.Cleanup(func() { cc.Close() })
	go ServeConn(sc, root, o)
	r := &rawFrames{t: t, cc: cc, frames: make(chan []byte, 16)}
	go func() {
		for {
			f, err := readFrame(cc)
			if err != nil {
				close(r.frames)
				return
			}
			r.frames <- f
		}
	}()
	return r
}

// send writes frame f as built.
func (r *rawFrames) send(f []byte) {
	r.t.Helper()
	if _, err := r.cc.Write(f); err != nil {
		r.t.Fatal(err)
	}
}

// sendTag writes frame f with its tag set to tag.
func (r *rawFrames) sendTag(f []byte, tag uint16) {
	r.t.Helper()
	binary.LittleEndian.PutUint16(f[5:], tag)
	r.send(f)
}

// next returns the next reply, failing the test after 10 s without one.
func (r *rawFrames) next(what string) []byte {
	r.t.Helper()
	select {
	case f := <-r.frames:
		return f
	case <-time.After(10 * time.Second):
		r.t.Fatalf("no reply: %s", what)
		return nil
	}
}

// open negotiates the version, attaches fid 0 and opens the file at path as fid 1
// with the open(2) flags.
func (r *rawFrames) open(flags uint32, path ...string) {
	r.t.Helper()
	for _, f := range [][]byte{tversion(), tattach(0), twalk(0, 1, path...), tlopen(1, flags)} {
		r.send(f)
		if rep := r.next("set-up"); rerrno(rep) != 0 {
			r.t.Fatalf("set-up: errno %d", rerrno(rep))
		}
	}
}

func tflush(tag, oldtag uint16) []byte {
	return frame(108, tag, binary.LittleEndian.AppendUint16(nil, oldtag)...)
}

// Raw Tlocks of a connection allowed 4 requests in flight, under another connection's
// write lock: one blocking request waits, a second is answered Blocked at once (the
// waiters may not take the slots the connection's other requests need), a walk is
// still answered, and a Tflush of the waiting one is answered after it (Rlock, then
// Rflush, as the Linux client needs them).
func TestWaitingLocksLeaveTheConnection(t *testing.T) {
	saved := maxLockWait
	maxLockWait = time.Hour
	// Registered first, so run last: after the servers, which read it, are gone.
	t.Cleanup(func() { maxLockWait = saved })
	v := newEnv(t)
	a, _ := lockClient(t, v)
	if st, err := a.Lock(1, p9.WriteLock, 0, 0, 0, "host"); err != nil || st != p9.LockStatusOK {
		t.Fatalf("a's lock: %v %v", st, err)
	}
	raw := serveRaw(t, v.tree.Root(), Options{Unidentified: &fs.Internal, MaxOutstanding: 4})
	raw.open(0, "class", "net", "ib0", "pkey")
	send, next := raw.send, raw.next
	send(tlock(5, 1, p9.WriteLock, p9.LockFlagsBlock, 9))
	send(tlock(7, 1, p9.WriteLock, p9.LockFlagsBlock, 9))
	// The two are handled concurrently: whichever comes second is answered at once.
	r := next("the second blocking Tlock")
	answered := binary.LittleEndian.Uint16(r[5:])
	if r[4] != 53 || answered != 5 && answered != 7 || r[7] != byte(p9.LockStatusBlocked) {
		t.Fatalf("first reply % x, want Rlock Blocked for tag 5 or 7", r)
	}
	waiting := 5 + 7 - answered
	send(twalk(0, 2, "class"))
	if r := next("a walk while a Tlock waits"); r[4] != 111 {
		t.Fatalf("walk while a Tlock waits: % x", r)
	}
	send(tflush(6, waiting))
	r1, r2 := next("the flushed Tlock"), next("Rflush")
	if r1[4] != 53 || binary.LittleEndian.Uint16(r1[5:]) != waiting || r2[4] != 109 || binary.LittleEndian.Uint16(r2[5:]) != 6 {
		t.Fatalf("after Tflush: % x then % x; want Rlock for tag %d, then Rflush for tag 6", r1, r2, waiting)
	}
	if r1[7] != byte(p9.LockStatusBlocked) {
		t.Errorf("the flushed Tlock was answered %d, want Blocked", r1[7])
	}
}
