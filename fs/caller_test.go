package fs

import (
	"strings"
	"syscall"
	"testing"
)

// Access is generic_permission for root-owned nodes plus kernfs's rule, for every mode
// the tree uses and every kind of user.
func TestAccess(t *testing.T) {
	tr := &Tree{}
	file := func(perm uint32, r, w bool) *Node {
		n := &Node{t: tr, perm: perm}
		if r {
			n.read = func() ([]byte, error) { return nil, nil }
		}
		if w {
			n.write = func([]byte) error { return nil }
		}
		return n
	}
	root := Caller{UID: 0, GIDs: []uint32{0}}
	user := Caller{UID: 1000, GIDs: []uint32{1000}}
	nobody := Caller{UID: Nobody, GIDs: []uint32{Nobody}}
	wheel := Caller{UID: 1001, GIDs: []uint32{1001, 0}} // member of group 0
	const ok, no = syscall.Errno(0), syscall.EACCES
	for _, c := range []struct {
		what string
		n    *Node
		mask int
		want map[*Caller]syscall.Errno
	}{
		{"read 0444", file(0444, true, false), MayRead, map[*Caller]syscall.Errno{&root: ok, &user: ok, &nobody: ok}},
		{"write 0444 (kernfs: not even root)", file(0444, true, false), MayWrite, map[*Caller]syscall.Errno{&root: no, &user: no, &nobody: no}},
		{"read 0644", file(0644, true, true), MayRead, map[*Caller]syscall.Errno{&root: ok, &user: ok, &nobody: ok}},
		{"write 0644", file(0644, true, true), MayWrite, map[*Caller]syscall.Errno{&root: ok, &user: no, &nobody: no, &wheel: no}},
		{"read 0200 (kernfs: not even root)", file(0200, false, true), MayRead, map[*Caller]syscall.Errno{&root: no, &user: no}},
		{"write 0200", file(0200, false, true), MayWrite, map[*Caller]syscall.Errno{&root: ok, &user: no, &nobody: no}},
		{"search 0755", &Node{t: tr, perm: 0755, dir: true}, MayExec, map[*Caller]syscall.Errno{&root: ok, &user: ok, &nobody: ok}},
		{"search 0700", &Node{t: tr, perm: 0700, dir: true}, MayExec, map[*Caller]syscall.Errno{&root: ok, &user: no, &nobody: no, &wheel: no}},
		{"list 0700", &Node{t: tr, perm: 0700, dir: true}, MayRead, map[*Caller]syscall.Errno{&root: ok, &user: no}},
		{"group bits 0750", &Node{t: tr, perm: 0750, dir: true}, MayExec, map[*Caller]syscall.Errno{&wheel: ok, &user: no}},
	} {
		for who, want := range c.want {
			err := c.n.Access(*who, c.mask)
			got := syscall.Errno(0)
			if err != nil {
				got = err.(syscall.Errno)
			}
			if got != want {
				t.Errorf("%s as uid %d: %v, want %v", c.what, who.UID, got, want)
			}
		}
	}
}

// Open applies Access for the caller, and a refused open for writing is logged with
// who asked.
func TestOpenAsUser(t *testing.T) {
	v := newEnv(t)
	n, err := v.tree.Lookup("class/net/ib0/mode")
	if err != nil {
		t.Fatal(err)
	}
	user := Caller{UID: 1000, GIDs: []uint32{1000}, Via: "9p", Peer: "127.0.0.1:4000"}
	if _, err := n.Open(user, syscall.O_WRONLY); err != syscall.EACCES {
		t.Errorf("uid 1000 opening mode for writing: %v, want EACCES", err)
	}
	if h, err := n.Open(user, syscall.O_RDONLY); err != nil {
		t.Errorf("uid 1000 opening mode for reading: %v", err)
	} else {
		h.Release()
	}
	lines := v.log.take()
	if len(lines) != 1 || lines[0] != `class/net/ib0/mode: permission denied; open for writing as uid=1000 via=9p peer="127.0.0.1:4000"` {
		t.Errorf("log after the refused open: %q", lines)
	}
}

// A write's log line quotes at most 64 bytes of what was written.
func TestAuditQuotesAtMost64Bytes(t *testing.T) {
	v := newEnv(t)
	long := strings.Repeat("x", 200)
	if errno := write(v.tree, "class/net/ib0/mtu", long); errno != syscall.EINVAL {
		t.Fatalf("mtu %q: %v", long, errno)
	}
	lines := v.log.take()
	if len(lines) != 1 || !strings.Contains(lines[0], `; wrote "`+strings.Repeat("x", 64)+`" as uid=0`) {
		t.Errorf("log line %q", lines)
	}
}
