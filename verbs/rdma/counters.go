//go:build rdma && linux

package rdma

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"ipoibfs/verbs"
)

// sysfsIB is where the kernel shows RDMA devices; a variable so a test can point it at
// a directory of its own.
var sysfsIB = "/sys/class/infiniband"

// readCounters reads a port's counters from sysfs, as `ibstat`/`perfquery` users
// know them: the PMA's counters/ (InfiniBand HCAs; the data counters count 4-byte
// words) and, where a device has no PMA (rxe), its hw_counters. A counter that is
// not there reads zero.
func readCounters(ca string, port int) verbs.PortCounters {
	dir := filepath.Join(sysfsIB, ca, "ports", strconv.Itoa(port))
	get := func(sub, name string) (uint64, bool) {
		b, err := os.ReadFile(filepath.Join(dir, sub, name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	// first returns the first of the named counters that exists.
	first := func(names ...[2]string) uint64 {
		for _, n := range names {
			if v, ok := get(n[0], n[1]); ok {
				return v
			}
		}
		return 0
	}
	var c verbs.PortCounters
	c.XmitPackets = first([2]string{"counters", "port_xmit_packets"}, [2]string{"hw_counters", "sent_pkts"})
	c.RcvPackets = first([2]string{"counters", "port_rcv_packets"}, [2]string{"hw_counters", "rcvd_pkts"})
	c.XmitBytes = 4 * first([2]string{"counters", "port_xmit_data"})
	c.RcvBytes = 4 * first([2]string{"counters", "port_rcv_data"})
	c.Malformed = first([2]string{"counters", "port_rcv_errors"})
	c.XmitDiscards = first([2]string{"counters", "port_xmit_discards"}, [2]string{"hw_counters", "send_err"})
	c.BadPKey = first([2]string{"counters", "port_rcv_constraint_errors"})
	return c
}
