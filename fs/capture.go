package fs

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync"
	"syscall"
	"time"

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
// (a pcap has no way to say so; the count is in the daemon's log at close).
const maxCaptureBytes = 8 << 20

func (c captureSource) open() (streamSub, error) {
	s := &captureSub{wake: make(chan struct{}, 1)}
	// The pcap file header: magic, version 2.4, no zone, no sigfigs, snaplen 65535,
	// LINKTYPE_RAW (101).
	h := make([]byte, 24)
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], 65535)
	binary.LittleEndian.PutUint32(h[20:], 101)
	s.chunks = [][]byte{h}
	stop, err := c.dev.Capture(c.port, s.push)
	if err != nil {
		return nil, errorf(syscall.ENODEV, "port %d: %v", c.port, err)
	}
	s.stop = stop
	return s, nil
}

type captureSub struct {
	mu      sync.Mutex
	chunks  [][]byte
	bytes   int
	dropped int
	closed  bool
	wake    chan struct{}
	stop    func()
}

func (s *captureSub) push(rec []byte) {
	s.mu.Lock()
	if s.bytes+len(rec) > maxCaptureBytes {
		s.dropped++
		s.mu.Unlock()
		return
	}
	s.chunks = append(s.chunks, append([]byte(nil), rec...))
	s.bytes += len(rec)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *captureSub) read(ctx context.Context, p []byte, idle time.Duration) (int, error) {
	var timeout <-chan time.Time
	if idle > 0 {
		t := time.NewTimer(idle)
		defer t.Stop()
		timeout = t.C
	}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, syscall.EBADF
		}
		n := 0
		for len(s.chunks) > 0 && n < len(p) {
			k := copy(p[n:], s.chunks[0])
			n += k
			s.bytes -= k
			if k < len(s.chunks[0]) {
				s.chunks[0] = s.chunks[0][k:]
				break
			}
			s.chunks = s.chunks[1:]
		}
		s.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return 0, syscall.EINTR
		case <-timeout:
			return 0, nil
		}
	}
}

func (s *captureSub) close() {
	s.stop()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// String is for the log: how many packets a slow reader lost.
func (s *captureSub) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.Itoa(s.dropped) + " packets dropped"
}
