//go:build !(rdma && linux)

package main

import (
	"errors"
	"io"
)

// errNoRDMA is what -hca says in a build without rdma-core support.
var errNoRDMA = errors.New("-hca: built without rdma-core support (build with -tags rdma)")

// hcaCommand serves -hca list in a build without the rdma tag: there is no device to
// list.
func hcaCommand(name string, stdout io.Writer) error { return errNoRDMA }

// planRDMA: there is no device to run on.
func planRDMA(name string) (*hcaPlan, error) { return nil, errNoRDMA }
