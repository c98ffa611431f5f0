//go:build !(rdma && linux)

package main

import (
	"errors"
	"io"
)

// errNoRDMA is what -hca says in a build without rdma-core support.
var errNoRDMA = errors.New("-hca: built without rdma-core support (build with -tags rdma)")

// hcaCommand serves -hca in a build without the rdma tag: there is no device to list
// or run on.
func hcaCommand(name string, stdout io.Writer) error { return errNoRDMA }
