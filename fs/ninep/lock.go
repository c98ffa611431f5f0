package ninep

import (
	"sync"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// POSIX record locks over 9P (Tlock, Tgetlock). The Linux v9fs client takes a lock
// (fcntl, and flock, which it turns into a lock of the whole file) in its own kernel
// first and then asks the server, so that clients on other machines see it; without
// an answer flock(1) on a v9fs mount of the tree failed (ENOSYS) where it works on
// sysfs and on the FUSE mount. The tree's files hold no data a lock protects: the locks
// matter between the scripts that take them to serialise their changes, so the server
// keeps them for every connection of the tree and a connection's locks go with it.
//
// The server keeps clients from each other: a client's kernel settles its own
// processes' locks before it asks, so locks conflict only between connections.
// Within one a lock belongs to the process that took it (proc_id, client_id): its
// unlocks release it, another process's do not (a forked child's exit, which makes
// the client send an unlock through the same fid, must not drop its parent's lock).
// A lock is also released when the fid it came through is clunked, at the last close
// of the open file: v9fs turns flock into a lock owned by the open file, which the
// process that took it may not be the one to unlock (`flock -u 9` from another
// process, the shell's close of fd 9). 9P cannot tell flock(1)'s own exit from an
// unlock, so `flock 9` holds on a v9fs mount only while flock(1) runs.
//
// A conflicting request is answered LockStatusBlocked; a blocking one
// (LockFlagsBlock: fcntl F_SETLKW, flock without -n) first waits in the server until
// the lock is free, the client flushes the request (its process interrupted), the
// connection ends or maxLockWait passes. (Answered at once, v9fs would sleep its lock
// timeout, 30 s, before it asked again.)

// maxLockWait bounds one blocking request's wait in the server; then it is answered
// Blocked and the client asks again after its lock timeout. The Linux client waits for
// the reply uninterruptibly but for a fatal signal (p9_client_rpc), so a process that
// times its wait with a signal (flock -w, alarm) overruns by up to this much: short.
var maxLockWait = 10 * time.Second

// maxLocksPerConn bounds the locks one connection holds (ENOLCK beyond; adjacent
// ranges of one owner and type are merged, as the kernel merges them).
const maxLocksPerConn = 1024

// lockKey is a file of one tree.
type lockKey struct {
	root *fs.Node
	ino  uint64
}

// lockOwner is who holds a lock: a process of a client, through a fid of a connection.
type lockOwner struct {
	conn   *attacher
	fid    *file
	pid    int32
	client string
}

// owns reports whether a request of o acts on a lock of l's: the same process of the
// same connection, through whichever fid (see above).
func (o lockOwner) owns(l lockOwner) bool {
	return o.conn == l.conn && o.pid == l.pid && o.client == l.client
}

// heldLock is one range [start, end) locked by one owner; end 0 is the end of the
// file (a length of 0).
type heldLock struct {
	owner      lockOwner
	typ        p9.LockType
	start, end uint64
}

func (l heldLock) overlaps(start, end uint64) bool {
	return (l.end == 0 || start < l.end) && (end == 0 || l.start < end)
}

type lockTable struct {
	mu    sync.Mutex
	files map[lockKey][]heldLock
	held  map[*attacher]int
	freed chan struct{} // closed (and made again) whenever locks are released
}

var locks = lockTable{files: map[lockKey][]heldLock{}, held: map[*attacher]int{}}

// releasedLocked wakes the requests waiting for a lock: some may be free now.
func (t *lockTable) releasedLocked() {
	if t.freed != nil {
		close(t.freed)
		t.freed = nil
	}
}

// waitFreed is a channel closed at the next release.
func (t *lockTable) waitFreed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freed == nil {
		t.freed = make(chan struct{})
	}
	return t.freed
}

// rangeOf turns a 9P start and length into [start, end); false when start+length
// does not fit.
func rangeOf(start, length uint64) (uint64, uint64, bool) {
	if length == 0 {
		return start, 0, true
	}
	end := start + length
	return start, end, end > start
}

// conflict is the first lock of another connection in [start, end) that a lock of
// type typ cannot coexist with.
func (t *lockTable) conflict(k lockKey, o lockOwner, typ p9.LockType, start, end uint64) (heldLock, bool) {
	for _, l := range t.files[k] {
		if l.owner.conn != o.conn && l.overlaps(start, end) && (typ == p9.WriteLock || l.typ == p9.WriteLock) {
			return l, true
		}
	}
	return heldLock{}, false
}

// lock applies a Tlock: an unlock removes o's locks from the range (splitting them);
// a read or write lock replaces o's own in the range when no other connection's
// conflicts.
func (t *lockTable) lock(k lockKey, o lockOwner, typ p9.LockType, start, length uint64) (p9.LockStatus, error) {
	start, end, ok := rangeOf(start, length)
	if !ok || typ > p9.Unlock {
		return p9.LockStatusError, linux.EINVAL
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if typ != p9.Unlock {
		if _, busy := t.conflict(k, o, typ, start, end); busy {
			return p9.LockStatusBlocked, nil
		}
	}
	old := t.files[k]
	var out []heldLock
	for _, l := range old {
		if !o.owns(l.owner) || !l.overlaps(start, end) {
			out = append(out, l)
			continue
		}
		if l.start < start { // the part before the range stays
			out = append(out, heldLock{l.owner, l.typ, l.start, start})
		}
		if end != 0 && (l.end == 0 || l.end > end) { // and the part after it
			out = append(out, heldLock{l.owner, l.typ, end, l.end})
		}
	}
	if typ != p9.Unlock {
		// Merged with the owner's adjacent ranges of the same type (those that
		// overlapped are gone above).
		nl := heldLock{o, typ, start, end}
		kept := out[:0]
		for _, l := range out {
			switch {
			case l.owner != o || l.typ != typ:
			case l.end != 0 && l.end == nl.start:
				nl.start = l.start
				continue
			case nl.end != 0 && l.start == nl.end:
				nl.end = l.end
				continue
			}
			kept = append(kept, l)
		}
		out = append(kept, nl)
	}
	was := t.held[o.conn]
	n := was - len(old) + len(out)
	if n > maxLocksPerConn && n > was && typ != p9.Unlock { // an unlock always goes through
		return p9.LockStatusError, linux.ENOLCK
	}
	t.set(k, o.conn, out, n)
	return p9.LockStatusOK, nil
}

// set stores a file's locks and the connection's count, and wakes the waiters.
func (t *lockTable) set(k lockKey, conn *attacher, ls []heldLock, n int) {
	t.releasedLocked()
	if n <= 0 {
		delete(t.held, conn)
	} else {
		t.held[conn] = n
	}
	if len(ls) == 0 {
		delete(t.files, k)
	} else {
		t.files[k] = ls
	}
}

// test answers a Tgetlock: the first lock of another connection in the way of want,
// or want unlocked. v9fs asks with type Unlock (the kernel has reused the field by
// then), which is taken as the question for a write lock, as other servers take it.
func (t *lockTable) test(k lockKey, o lockOwner, want p9.LockDesc) (p9.LockDesc, error) {
	start, end, ok := rangeOf(want.Start, want.Length)
	if !ok || want.Type > p9.Unlock {
		return p9.LockDesc{}, linux.EINVAL
	}
	typ := want.Type
	if typ == p9.Unlock {
		typ = p9.WriteLock
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, busy := t.conflict(k, o, typ, start, end); busy {
		length := uint64(0)
		if l.end != 0 {
			length = l.end - l.start
		}
		return p9.LockDesc{Type: l.typ, Start: l.start, Length: length, PID: l.owner.pid, Client: l.owner.client}, nil
	}
	want.Type = p9.Unlock
	return want, nil
}

// dropFid releases the locks taken through a fid that is clunked.
func (t *lockTable) dropFid(k lockKey, f *file) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ls := t.files[k]
	var out []heldLock
	for _, l := range ls {
		if l.owner.fid != f {
			out = append(out, l)
		}
	}
	if len(out) != len(ls) { // the fid's locks are its connection's
		t.set(k, f.a, out, t.held[f.a]-len(ls)+len(out))
	}
}

// dropConn releases every lock of a connection that ended.
func (t *lockTable) dropConn(a *attacher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held[a] == 0 {
		return
	}
	for k, ls := range t.files {
		out := ls[:0]
		for _, l := range ls {
			if l.owner.conn != a {
				out = append(out, l)
			}
		}
		if len(out) == 0 {
			delete(t.files, k)
		} else {
			t.files[k] = out
		}
	}
	delete(t.held, a)
	t.releasedLocked()
}

func (f *file) lockKey() lockKey { return lockKey{f.a.root, f.n.Ino()} }

// Lock is Tlock without a flush channel (see above).
func (f *file) Lock(pid int, typ p9.LockType, flags p9.LockFlags, start, length uint64, client string) (p9.LockStatus, error) {
	return f.LockFlush(pid, typ, flags, start, length, client, nil)
}

// LockFlush is Tlock: a blocking request waits for the lock (see above).
func (f *file) LockFlush(pid int, typ p9.LockType, flags p9.LockFlags, start, length uint64, client string, flushed <-chan struct{}) (p9.LockStatus, error) {
	f.locked.Store(true)
	o, k := lockOwner{f.a, f, int32(pid), client}, f.lockKey()
	var deadline <-chan time.Time
	for {
		select { // a request flushed or cut off is not granted, even with the lock free
		case <-flushed:
			return p9.LockStatusBlocked, nil
		case <-f.a.gone:
			return p9.LockStatusBlocked, nil
		default:
		}
		freed := locks.waitFreed() // before the try: a release after it is not missed
		st, err := locks.lock(k, o, typ, start, length)
		if err != nil || st != p9.LockStatusBlocked || flags&p9.LockFlagsBlock == 0 {
			return st, err
		}
		if deadline == nil {
			// A connection's waiting requests hold its request slots: a few may
			// wait, the rest are answered at once (the client's own retry), so that
			// the connection's other requests, its unlocks among them, are read.
			if f.a.lockWaits.Add(1) > int32(max(1, f.a.o.MaxOutstanding/4)) {
				f.a.lockWaits.Add(-1)
				return st, nil
			}
			defer f.a.lockWaits.Add(-1)
			deadline = time.After(maxLockWait)
		}
		select {
		case <-freed:
		case <-flushed:
			return p9.LockStatusBlocked, nil
		case <-f.a.gone:
			return p9.LockStatusBlocked, nil
		case <-deadline:
			return p9.LockStatusBlocked, nil
		}
	}
}

var _ p9.FlushableLocker = (*file)(nil)

// GetLock is Tgetlock (see above).
func (f *file) GetLock(want p9.LockDesc) (p9.LockDesc, error) {
	return locks.test(f.lockKey(), lockOwner{f.a, f, want.PID, want.Client}, want)
}

var _ p9.LockTester = (*file)(nil)
