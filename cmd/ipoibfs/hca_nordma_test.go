//go:build !(rdma && linux)

package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// Without the rdma build tag, -hca says how to get it, for a device name and for list,
// before anything starts (no mount, no 9P listener), and -ifname does not change that.
func TestHCAFlagWithoutRDMA(t *testing.T) {
	for _, arg := range []string{"list", "mlx5_0"} {
		var out, errb bytes.Buffer
		err := run([]string{"-hca", arg}, &out, &errb)
		if !errors.Is(err, errNoRDMA) || err.Error() != "-hca: built without rdma-core support (build with -tags rdma)" {
			t.Errorf("-hca %s: %v", arg, err)
		}
	}
	var out, errb bytes.Buffer
	code := cli([]string{"-hca", "mlx5_0", "-ifname", "ib0=uib0", "-netns", "x"}, strings.NewReader(""), &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "ipoibfs: -hca: built without rdma-core support (build with -tags rdma)") {
		t.Errorf("-hca mlx5_0 -ifname ib0=uib0: exit %d, stderr %q", code, errb.String())
	}
}
