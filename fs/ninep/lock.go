package ninep

import (
	"sync"

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
// A conflicting request is answered LockStatusBlocked at once; the client retries a
// blocking one itself (v9fs waits its lock timeout, 30 s, between tries).

// maxLocksPerConn bounds the locks one connection holds (ENOLCK beyond).
const maxLocksPerConn = 1024

// lockKey is a file of one tree.
type lockKey struct {
	root *fs.Node
	ino  uint64
}

// lockOwner is who holds a lock: a process of a client on one connection.
type lockOwner struct {
	conn   *attacher
	pid    int32
	client string
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
}

var locks = lockTable{files: map[lockKey][]heldLock{}, held: map[*attacher]int{}}

// rangeOf turns a 9P start and length into [start, end); false when start+length
// does not fit.
func rangeOf(start, length uint64) (uint64, uint64, bool) {
	if length == 0 {
		return start, 0, true
	}
	end := start + length
	return start, end, end > start
}

// conflict is the first lock of another owner in [start, end) that a lock of type
// typ cannot coexist with.
func (t *lockTable) conflict(k lockKey, o lockOwner, typ p9.LockType, start, end uint64) (heldLock, bool) {
	for _, l := range t.files[k] {
		if l.owner != o && l.overlaps(start, end) && (typ == p9.WriteLock || l.typ == p9.WriteLock) {
			return l, true
		}
	}
	return heldLock{}, false
}

// lock applies a Tlock: an unlock removes o's locks from the range (splitting them);
// a read or write lock replaces o's own in the range when no other owner's conflicts.
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
	var out []heldLock
	for _, l := range t.files[k] {
		if l.owner != o || !l.overlaps(start, end) {
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
		out = append(out, heldLock{o, typ, start, end})
	}
	n := t.held[o.conn] - len(t.files[k]) + len(out)
	if n > maxLocksPerConn && typ != p9.Unlock {
		return p9.LockStatusError, linux.ENOLCK
	}
	t.held[o.conn] = n
	if t.held[o.conn] <= 0 {
		delete(t.held, o.conn)
	}
	if len(out) == 0 {
		delete(t.files, k)
	} else {
		t.files[k] = out
	}
	return p9.LockStatusOK, nil
}

// test answers a Tgetlock: the first lock in the way of want, or want unlocked.
func (t *lockTable) test(k lockKey, o lockOwner, want p9.LockDesc) (p9.LockDesc, error) {
	start, end, ok := rangeOf(want.Start, want.Length)
	if !ok || want.Type > p9.Unlock {
		return p9.LockDesc{}, linux.EINVAL
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, busy := t.conflict(k, o, want.Type, start, end); busy && want.Type != p9.Unlock {
		length := uint64(0)
		if l.end != 0 {
			length = l.end - l.start
		}
		return p9.LockDesc{Type: l.typ, Start: l.start, Length: length, PID: l.owner.pid, Client: l.owner.client}, nil
	}
	want.Type = p9.Unlock
	return want, nil
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
}

func (f *file) lockKey() lockKey { return lockKey{f.a.root, f.n.Ino()} }

// Lock is Tlock (see above).
func (f *file) Lock(pid int, typ p9.LockType, _ p9.LockFlags, start, length uint64, client string) (p9.LockStatus, error) {
	return locks.lock(f.lockKey(), lockOwner{f.a, int32(pid), client}, typ, start, length)
}

// GetLock is Tgetlock (see above).
func (f *file) GetLock(want p9.LockDesc) (p9.LockDesc, error) {
	return locks.test(f.lockKey(), lockOwner{f.a, want.PID, want.Client}, want)
}

var _ p9.LockTester = (*file)(nil)
