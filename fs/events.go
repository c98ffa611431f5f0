package fs

import (
	"context"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// EventLog fans state changes out to every open of the tree's `events` file: each
// open sees the lines emitted from then on, one per change, and a read blocks until
// the next one. A reader that falls behind loses its oldest lines (and is told how
// many); emitting never waits for a reader.
type EventLog struct {
	mu   sync.Mutex
	subs map[*eventSub]struct{}
	now  func() time.Time
}

// MaxPendingEvents bounds the lines kept for one reader.
const MaxPendingEvents = 1024

// NewEventLog returns an empty event log.
func NewEventLog() *EventLog {
	return &EventLog{subs: map[*eventSub]struct{}{}, now: time.Now}
}

// Emit records one line ("ib0: carrier on") with a timestamp for every reader.
func (l *EventLog) Emit(line string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.subs) == 0 {
		return // nobody reads: nothing to format or keep
	}
	line = l.now().UTC().Format("2006-01-02T15:04:05.000Z") + " " + line + "\n"
	for s := range l.subs {
		s.push(line)
	}
}

// streamSource is what a stream file opens; streamSub is one open of it.
type streamSource interface {
	open() (streamSub, error)
}

type streamSub interface {
	// read waits for data and copies what fits into p; 0 bytes when closed, when ctx
	// ends or after idle (0: no limit) without data.
	read(ctx context.Context, p []byte, idle time.Duration) (int, error)
	close()
}

func (l *EventLog) open() (streamSub, error) { return l.subscribe(), nil }

func (l *EventLog) subscribe() *eventSub {
	s := &eventSub{wake: make(chan struct{}, 1), log: l}
	l.mu.Lock()
	l.subs[s] = struct{}{}
	l.mu.Unlock()
	return s
}

// eventSub is one open of `events`.
type eventSub struct {
	log    *EventLog
	mu     sync.Mutex
	lines  []string
	part   string // the rest of a line a short read could not take
	lost   int
	closed bool
	wake   chan struct{}
}

func (s *eventSub) push(line string) {
	s.mu.Lock()
	if len(s.lines) >= MaxPendingEvents {
		s.lines = s.lines[1:]
		s.lost++
	}
	s.lines = append(s.lines, line)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *eventSub) close() {
	s.log.mu.Lock()
	delete(s.log.subs, s)
	s.log.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// read waits for lines and copies as many as fit into p. It returns 0 when the open
// is closed, when ctx ends (an interrupted read), or after idle without a line.
func (s *eventSub) read(ctx context.Context, p []byte, idle time.Duration) (int, error) {
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
		if s.lost > 0 {
			s.lines = append([]string{"(" + strconv.Itoa(s.lost) + " lines lost: the reader fell behind)\n"}, s.lines...)
			s.lost = 0
		}
		n := 0
		if s.part != "" {
			k := copy(p, s.part)
			s.part = s.part[k:]
			n += k
		}
		for s.part == "" && len(s.lines) > 0 && n < len(p) {
			k := copy(p[n:], s.lines[0])
			if k < len(s.lines[0]) {
				s.part = s.lines[0][k:]
			}
			s.lines = s.lines[1:]
			n += k
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
