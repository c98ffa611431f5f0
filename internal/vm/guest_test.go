package vm

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// What RunGuest copies for an ELF file: the paths ldd resolved, the loader included,
// and nothing for the vDSO or a library ldd could not find (that is an error earlier).
func TestLddPaths(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd2b5f2000)\n" +
		"\tlibibverbs.so.1 => /lib/x86_64-linux-gnu/libibverbs.so.1 (0x00007f0e0b2e1000)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e0b100000)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f0e0b31b000)\n"
	var got []string
	for _, m := range reLdd.FindAllStringSubmatch(out, -1) {
		got = append(got, m[1])
	}
	want := []string{"/lib/x86_64-linux-gnu/libibverbs.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The dependency list ExtraModules keeps in the cache reads back as written, and the
// load order puts dependencies first.
func TestExtraDeps(t *testing.T) {
	p := filepath.Join(t.TempDir(), extraDeps)
	if err := os.WriteFile(p, []byte("ib_core:\nib_uverbs:ib_core\nrdma_rxe:ib_core,ib_uverbs,udp_tunnel\nudp_tunnel:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deps, err := readDeps(p)
	if err != nil {
		t.Fatal(err)
	}
	order, err := loadOrder([]string{"rdma-rxe"}, deps)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ib_core", "ib_uverbs", "udp_tunnel", "rdma_rxe"}; !reflect.DeepEqual(order, want) {
		t.Errorf("order %q, want %q", order, want)
	}
	if _, err := loadOrder([]string{"veth"}, deps); err == nil {
		t.Errorf("a module missing from the list: no error")
	}
}
