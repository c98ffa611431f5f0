//go:build !linux

package dhcp

import (
	"fmt"
	"runtime"
)

// Open is not supported: the client needs a socket bound to a device.
func Open(netnsName string, dev func() string) (Transport, error) {
	return nil, fmt.Errorf("dhcp: not supported on %s", runtime.GOOS)
}
