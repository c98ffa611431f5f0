package vm

import (
	"errors"
	"path/filepath"
	"testing"

	"ipoibfs/internal/testenv"
)

// Rxe is what a guest needs to make rdma_rxe devices and run rdma-core programs on
// them: the image, the kernel modules to load (in order) and the host files to copy in.
type Rxe struct {
	Image   *Image
	Modules []string
	// Files are rdma-core's rxe provider and its driver file, and iproute2's rdma and
	// ip; add the program to run.
	Files []string
}

// PrepareRxe prepares the guest for rdma_rxe (veth, crc32_generic - rxe asks the crypto
// API for "crc32" and the guest has no modprobe to load it on demand -, ib_uverbs,
// rdma_rxe, and the extra modules), failing the test under CI when something is
// missing, as testenv does.
func PrepareRxe(t testing.TB, extra ...string) *Rxe {
	t.Helper()
	im, err := Prepare()
	if errors.Is(err, ErrMissing) {
		testenv.Missing(t, err.Error())
	}
	if err != nil {
		t.Fatalf("vm.Prepare: %v", err)
	}
	mods, err := im.ExtraModules(append([]string{"veth", "crc32_generic", "ib_uverbs", "rdma_rxe"}, extra...)...)
	if errors.Is(err, ErrMissing) {
		testenv.Missing(t, err.Error())
	}
	if err != nil {
		t.Fatalf("ExtraModules: %v", err)
	}
	const driver = "/etc/libibverbs.d/rxe.driver"
	testenv.File(t, driver)
	provs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so")
	if len(provs) == 0 {
		testenv.Missing(t, "rdma-core's rxe provider librxe-rdmav*.so (Debian package ibverbs-providers)")
	}
	rdmaTool := testenv.Tool(t, "rdma")
	ipTool, err := filepath.EvalSymlinks(testenv.Tool(t, "ip"))
	if err != nil {
		t.Fatal(err)
	}
	if ipTool != "/usr/bin/ip" {
		testenv.Missing(t, "iproute2's ip at /usr/bin/ip (found "+ipTool+")")
	}
	return &Rxe{Image: im, Modules: mods, Files: append([]string{rdmaTool, ipTool, driver}, provs...)}
}
