//go:build rdma && linux

package main

import (
	"bytes"
	"strings"
	"testing"
)

// With the rdma tag, -hca list prints what libibverbs sees (here: no devices, or
// their ports), and an unknown device name fails naming it.
func TestHCAList(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run([]string{"-hca", "list"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if out.Len() == 0 {
		t.Fatal("-hca list printed nothing")
	}
	t.Logf("%s", out.String())
	err := run([]string{"-hca", "ipoibfs-no-such-hca"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "ipoibfs-no-such-hca") || !strings.Contains(err.Error(), "no such device") {
		t.Errorf("-hca of a missing device: %v", err)
	}
}
