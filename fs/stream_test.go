package fs

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// A stream reader that falls behind loses the oldest lines and is told how many; a
// byte-bounded one loses the newest; reads wait for data, end on close (EBADF), on
// the context (EINTR) or after idle (0 bytes).
func TestStreamQueueBounds(t *testing.T) {
	l := NewEventLog()
	l.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	q := l.subscribe()
	for k := 0; k < MaxPendingEvents+3; k++ {
		l.Emit("x")
	}
	buf := make([]byte, 64)
	n, err := q.read(context.Background(), buf, 0)
	if err != nil || string(buf[:n]) != "(3 lines lost: the reader fell behind)\n2026-01-02T03:04:05.000Z x\n"[:n] {
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := 0
	for {
		n, err := q.read(ctx, make([]byte, 1<<20), 10*time.Millisecond)
		if err != nil || n == 0 {
			break
		}
		drained += n
	}
	if want := (MaxPendingEvents)*len("2026-01-02T03:04:05.000Z x\n") - (n - len("(3 lines lost: the reader fell behind)\n")); drained != want {
		t.Errorf("drained %d bytes after the first read, want %d", drained, want)
	}
	cancel()
	if _, err := q.read(ctx, buf, 0); err != syscall.EINTR {
		t.Errorf("read with a cancelled context: %v, want EINTR", err)
	}
	q.close()
	if _, err := q.read(context.Background(), buf, 0); err != syscall.EBADF {
		t.Errorf("read after close: %v, want EBADF", err)
	}
	l.Emit("after close") // the closed reader is no longer fed
	if len(l.subs) != 0 {
		t.Errorf("%d subscribers after close", len(l.subs))
	}

	b := (&streamQueue{maxBytes: 10}).init()
	b.push([]byte("header"))
	b.push([]byte("12345")) // would exceed 10: dropped, the header kept
	b.push([]byte("1234"))
	n, _ = b.read(context.Background(), buf, 0)
	if string(buf[:n]) != "header1234" {
		t.Errorf("byte-bounded queue read %q, want header1234", buf[:n])
	}
}
