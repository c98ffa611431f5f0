//go:build linux

package kernel

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// nlMsg encodes one netlink message of type typ about interface index, padded to
// the netlink alignment, with extra bytes of attributes after the 16-byte header.
func nlMsg(typ uint16, index int32, extra int) []byte {
	l := unix.NLMSG_HDRLEN + 16 + extra
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint32(b[0:], uint32(l))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint32(b[unix.NLMSG_HDRLEN+4:], uint32(index))
	return b
}

type marked struct {
	index int
	bits  uint32
}

// The monitor reads only the index and kind of each message: links changed, links
// deleted or moved to another namespace, addresses added or removed; other messages and a truncated tail are
// skipped.
func TestParseMonitorMessages(t *testing.T) {
	var b []byte
	b = append(b, nlMsg(unix.RTM_NEWLINK, 7, 33)...)
	b = append(b, nlMsg(unix.RTM_NEWADDR, 8, 20)...)
	b = append(b, nlMsg(unix.RTM_NEWROUTE, 9, 0)...)
	b = append(b, nlMsg(unix.RTM_DELADDR, 10, 0)...)
	b = append(b, nlMsg(unix.RTM_DELLINK, 11, 5)...)
	// A deletion that is a move (ip link set netns): IFLA_IFNAME, then IFLA_NEW_NETNSID.
	moved := nlMsg(unix.RTM_DELLINK, 13, 8+8)
	attrs := moved[unix.NLMSG_HDRLEN+16:]
	binary.NativeEndian.PutUint16(attrs[0:], 7)
	binary.NativeEndian.PutUint16(attrs[2:], unix.IFLA_IFNAME)
	copy(attrs[4:], "ib0")
	binary.NativeEndian.PutUint16(attrs[8:], 8)
	binary.NativeEndian.PutUint16(attrs[10:], unix.IFLA_NEW_NETNSID)
	b = append(b, moved...)
	b = append(b, nlMsg(unix.RTM_NEWLINK, 12, 0)[:20]...) // cut short
	var got []marked
	parseMonitorMessages(b, func(i int, bits uint32) { got = append(got, marked{i, bits}) })
	want := []marked{{7, dirtyLink | dirtyGroups}, {8, dirtyAddrs | dirtyGroups}, {10, dirtyAddrs | dirtyGroups}, {11, dirtyGone}, {13, dirtyMoved}}
	if !slices.Equal(got, want) {
		t.Errorf("marked %v, want %v", got, want)
	}
}

// Whatever the kernel (or a fuzzer) hands over, the parser stays inside the buffer
// and marks only indexes it read from it.
func FuzzParseMonitorMessages(f *testing.F) {
	f.Add(append(nlMsg(unix.RTM_NEWLINK, 3, 8), nlMsg(unix.RTM_DELLINK, 4, 0)...))
	f.Add(nlMsg(unix.RTM_NEWADDR, -1, 1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		n := 0
		parseMonitorMessages(b, func(int, uint32) { n++ })
		if n > len(b)/(unix.NLMSG_HDRLEN+8) {
			t.Fatalf("%d marks from %d bytes", n, len(b))
		}
	})
}
