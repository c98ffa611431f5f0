package fs

import (
	"strconv"
	"sync"
	"time"
)

// EventLog fans state changes out to every open of the tree's `events` file: each
// open sees the lines emitted from then on, one per change, and a read blocks until
// the next one. A reader that falls behind loses its oldest lines (and is told how
// many); emitting never waits for a reader.
type EventLog struct {
	mu   sync.Mutex
	subs map[*streamQueue]struct{}
	now  func() time.Time
}

// MaxPendingEvents bounds the lines kept for one reader.
const MaxPendingEvents = 1024

// NewEventLog returns an empty event log.
func NewEventLog() *EventLog {
	return &EventLog{subs: map[*streamQueue]struct{}{}, now: time.Now}
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
	b := []byte(line)
	for q := range l.subs {
		q.push(b) // readers copy out of it, never into it
	}
}

func (l *EventLog) open() (streamSub, error) { return l.subscribe(), nil }

func (l *EventLog) subscribe() *streamQueue {
	q := (&streamQueue{maxChunks: MaxPendingEvents, dropOldest: true, lostNote: func(n int) []byte {
		return []byte("(" + strconv.Itoa(n) + " lines lost: the reader fell behind)\n")
	}}).init()
	q.onClose = func() {
		l.mu.Lock()
		delete(l.subs, q)
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.subs[q] = struct{}{}
	l.mu.Unlock()
	return q
}
