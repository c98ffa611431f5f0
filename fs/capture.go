package fs

import (
	"encoding/binary"
	"syscall"

	"ipoibfs/verbs"
)

// captureSource is class/infiniband/<hca>/ports/<n>/capture: each open streams the
// port's fabric packets from then on as a pcap file (LINKTYPE_RAW), so
// `cat capture | tshark -r -` decodes them.
type captureSource struct {
	dev  verbs.Capturer
	port int
}

// maxCaptureBytes bounds what one slow reader keeps; beyond it packets are dropped
// (a pcap has no way to say so).
const maxCaptureBytes = 8 << 20

func (c captureSource) open() (streamSub, error) {
	q := (&streamQueue{maxBytes: maxCaptureBytes}).init()
	// The pcap file header: magic, version 2.4, no zone, no sigfigs, snaplen 65535,
	// LINKTYPE_RAW (101).
	h := make([]byte, 24)
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], 65535)
	binary.LittleEndian.PutUint32(h[20:], 101)
	q.push(h)
	stop, err := c.dev.Capture(c.port, func(rec []byte) { q.push(append([]byte(nil), rec...)) })
	if err != nil {
		return nil, errorf(syscall.ENODEV, "port %d: %v", c.port, err)
	}
	q.onClose = stop
	return q, nil
}
