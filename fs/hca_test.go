package fs

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/verbs"
)

// sys_image_guid has node_guid's format and, for the soft HCA (alone in its system),
// its value.
func TestSysImageGUID(t *testing.T) {
	v := newEnv(t)
	node, _ := read(v.tree, "class/infiniband/n1/node_guid")
	sys, errno := read(v.tree, "class/infiniband/n1/sys_image_guid")
	if errno != 0 || sys != node || sys != guidString(v.hca.NodeGUID())+"\n" {
		t.Errorf("sys_image_guid %q (%v), node_guid %q", sys, errno, node)
	}
}

// ports/<n>/counters has the kernel's names, and the traffic counters follow the port:
// packets as counted, data in 4-octet words.
func TestPortCounters(t *testing.T) {
	v := newEnv(t)
	want := []string{"VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
		"local_link_integrity_errors", "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors",
		"port_rcv_packets", "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
		"port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
		"port_xmit_wait", "symbol_error"}
	if diff := cmp.Diff(want, names(t, v.tree, "class/infiniband/n1/ports/1/counters")); diff != "" {
		t.Errorf("ls counters (-want +got):\n%s", diff)
	}
	num := func(name string) uint64 {
		t.Helper()
		s, errno := read(v.tree, "class/infiniband/n1/ports/1/counters/"+name)
		if errno != 0 || !strings.HasSuffix(s, "\n") {
			t.Fatalf("cat %s = %q, %v", name, s, errno)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("cat %s = %q: %v", name, s, err)
		}
		return n
	}
	// The broadcast join's SA traffic has moved the counters already, and joins of
	// other groups may still be under way: the files must say what the port says when
	// the port's counters did not move while they were read.
	p := v.hca.SoftPort(1)
	var c verbs.PortCounters
	for try := 0; ; try++ {
		c = p.Counters()
		got := map[string]uint64{}
		for _, name := range []string{"port_xmit_packets", "port_rcv_packets", "port_xmit_data", "port_rcv_data"} {
			got[name] = num(name)
		}
		if p.Counters() != c {
			if try == 100 {
				t.Fatalf("the port's counters never stood still for 4 reads")
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for name, want := range map[string]uint64{
			"port_xmit_packets": c.XmitPackets,
			"port_rcv_packets":  c.RcvPackets,
			"port_xmit_data":    c.XmitBytes / 4,
			"port_rcv_data":     c.RcvBytes / 4,
		} {
			if got[name] != want {
				t.Errorf("%s = %d, port says %d", name, got[name], want)
			}
		}
		break
	}
	if c.XmitPackets == 0 {
		t.Errorf("no packets counted after the broadcast join: %+v", c)
	}
	before := num("port_xmit_packets")
	// A broadcast datagram from ib0 goes out on the broadcast group.
	v.ib0.SetHostAddrs([]netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")})
	pkt := make([]byte, 28)
	pkt[0], pkt[8], pkt[9] = 0x45, 64, 17 // IPv4, TTL, UDP
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	copy(pkt[12:], []byte{10, 9, 0, 1})
	copy(pkt[16:], []byte{255, 255, 255, 255})
	binary.BigEndian.PutUint16(pkt[24:], 8) // UDP length
	waitFor(t, "port_xmit_packets to move after a broadcast", func() bool {
		v.ib0.Transmit([][]byte{pkt})
		return num("port_xmit_packets") > before
	})
}
