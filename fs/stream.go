package fs

import (
	"context"
	"sync"
	"syscall"
	"time"
)

// streamSource is what a stream file (events, capture) opens; streamSub is one open.
type streamSource interface {
	open() (streamSub, error)
}

type streamSub interface {
	// read waits for data and copies what fits into p; 0 bytes when ctx ends or after
	// idle (0: no limit) without data, EBADF once closed.
	read(ctx context.Context, p []byte, idle time.Duration) (int, error)
	close()
}

// streamQueue is one reader's queue of a stream: pushing never waits; beyond its
// bound it drops, the oldest chunks (events: the newest state matters) or the newest
// (capture: a pcap cannot lose its header), and lostNote, if set, tells the reader how
// many were lost before the next chunk it reads.
type streamQueue struct {
	maxChunks, maxBytes int // 0: no such bound
	dropOldest          bool
	lostNote            func(n int) []byte
	onClose             func()

	mu     sync.Mutex
	chunks [][]byte
	bytes  int
	lost   int
	closed bool
	wake   chan struct{}
}

func (q *streamQueue) init() *streamQueue {
	q.wake = make(chan struct{}, 1)
	return q
}

func (q *streamQueue) push(b []byte) {
	q.mu.Lock()
	full := func() bool {
		return (q.maxChunks > 0 && len(q.chunks) >= q.maxChunks) || (q.maxBytes > 0 && q.bytes+len(b) > q.maxBytes)
	}
	for full() && q.dropOldest && len(q.chunks) > 0 {
		q.bytes -= len(q.chunks[0])
		q.chunks = q.chunks[1:]
		q.lost++
	}
	if full() {
		q.lost++
		q.mu.Unlock()
		return
	}
	q.chunks = append(q.chunks, b)
	q.bytes += len(b)
	q.mu.Unlock()
	q.signal()
}

func (q *streamQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *streamQueue) read(ctx context.Context, p []byte, idle time.Duration) (int, error) {
	var timeout <-chan time.Time
	if idle > 0 {
		t := time.NewTimer(idle)
		defer t.Stop()
		timeout = t.C
	}
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return 0, syscall.EBADF
		}
		if q.lost > 0 && q.lostNote != nil {
			note := q.lostNote(q.lost)
			q.chunks = append([][]byte{note}, q.chunks...)
			q.bytes += len(note)
			q.lost = 0
		}
		n := 0
		for len(q.chunks) > 0 && n < len(p) {
			k := copy(p[n:], q.chunks[0])
			n += k
			q.bytes -= k
			if k < len(q.chunks[0]) {
				q.chunks[0] = q.chunks[0][k:]
				break
			}
			q.chunks = q.chunks[1:]
		}
		q.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		select {
		case <-q.wake:
		case <-ctx.Done():
			return 0, syscall.EINTR
		case <-timeout:
			return 0, nil
		}
	}
}

func (q *streamQueue) close() {
	if q.onClose != nil {
		q.onClose()
	}
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}
