package fs

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

// Every test of the package must leave no goroutine behind (go.uber.org/goleak, as
// wireguard-go checks its own).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The inode registry forgets the paths of interfaces gone: children created and
// deleted under ever new names (and listed, which numbers their files) do not grow it
// without bound, while a live interface's files keep their numbers.
func TestInodesOfDeletedChildrenAreForgotten(t *testing.T) {
	old := minPruneAt
	minPruneAt = 64
	t.Cleanup(func() { minPruneAt = old })
	v := newEnv(t)
	walk := func(path string) {
		t.Helper()
		n, err := v.tree.Lookup(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Children(); err != nil {
			t.Fatal(err)
		}
	}
	mtu, err := v.tree.Lookup("class/net/ib0/mtu")
	if err != nil {
		t.Fatal(err)
	}
	for k := range 60 {
		pkey := int64(0x8001 + k)
		if _, err := v.ib0.CreateChild(pkey); err != nil {
			t.Fatal(err)
		}
		walk("class/net")
		walk(fmt.Sprintf("class/net/ib0.%04x", pkey))
		walk("kernel/debug/ipoib")
		if err := v.ib0.DeleteChild(pkey); err != nil {
			t.Fatal(err)
		}
	}
	v.tree.idMu.Lock()
	n := len(v.tree.ids)
	v.tree.idMu.Unlock()
	if n > 4*64 {
		t.Errorf("%d inode numbers kept after 60 children came and went", n)
	}
	again, err := v.tree.Lookup("class/net/ib0/mtu")
	if err != nil {
		t.Fatal(err)
	}
	if again.Ino() != mtu.Ino() {
		t.Errorf("ib0/mtu's inode changed from %d to %d", mtu.Ino(), again.Ino())
	}
}
