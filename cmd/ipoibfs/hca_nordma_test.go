//go:build !(rdma && linux)

package main

import (
	"bytes"
	"errors"
	"testing"
)

// Without the rdma build tag, -hca says how to get it, for a device name and for list.
func TestHCAFlagWithoutRDMA(t *testing.T) {
	for _, arg := range []string{"list", "mlx5_0"} {
		var out, errb bytes.Buffer
		err := run([]string{"-hca", arg}, &out, &errb)
		if !errors.Is(err, errNoRDMA) || err.Error() != "-hca: built without rdma-core support (build with -tags rdma)" {
			t.Errorf("-hca %s: %v", arg, err)
		}
	}
}
