//go:build rdma && linux

package rdma

import (
	"os"
	"path/filepath"
	"testing"

	"ipoibfs/verbs"
)

// The PMA's counters/ win over hw_counters; data counters are 4-byte words; a device
// with only hw_counters (rxe) still reports its packets.
func TestReadCounters(t *testing.T) {
	root := t.TempDir()
	write := func(ca, sub, name, v string) {
		d := filepath.Join(root, ca, "ports", "1", sub)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("mlx5_0", "counters", "port_xmit_packets", "10")
	write("mlx5_0", "counters", "port_rcv_packets", "20")
	write("mlx5_0", "counters", "port_xmit_data", "300")
	write("mlx5_0", "counters", "port_rcv_data", "400")
	write("mlx5_0", "counters", "port_rcv_errors", "5")
	write("mlx5_0", "counters", "port_xmit_discards", "6")
	write("mlx5_0", "counters", "port_rcv_constraint_errors", "7")
	write("mlx5_0", "hw_counters", "sent_pkts", "999")
	write("rxe0", "hw_counters", "sent_pkts", "11")
	write("rxe0", "hw_counters", "rcvd_pkts", "12")
	write("rxe0", "hw_counters", "send_err", "bogus")
	old := sysfsIB
	sysfsIB = root
	defer func() { sysfsIB = old }()
	want := verbs.PortCounters{XmitPackets: 10, RcvPackets: 20, XmitBytes: 1200, RcvBytes: 1600, Malformed: 5, XmitDiscards: 6, BadPKey: 7}
	if got := readCounters("mlx5_0", 1); got != want {
		t.Errorf("mlx5_0: %+v, want %+v", got, want)
	}
	if got := readCounters("rxe0", 1); got != (verbs.PortCounters{XmitPackets: 11, RcvPackets: 12}) {
		t.Errorf("rxe0: %+v", got)
	}
	if got := readCounters("none", 1); got != (verbs.PortCounters{}) {
		t.Errorf("no device: %+v", got)
	}
}
