package ipoib

import (
	"sync"
	"time"
)

// ratelimit is the kernel's ratelimit_state as ipoib_warn uses it: at most burst
// lines in a window of interval, the window starting at the first line after the
// last one ended (lib/ratelimit.c). As there, each warning (call site) has its own,
// shared by every interface, and the count of lines held back is said once the next
// window opens, naming the warning and not an interface.
type ratelimit struct {
	what     string // the warning, for the suppressed count
	interval time.Duration
	burst    int

	mu      sync.Mutex
	begin   time.Time
	printed int
	missed  int
}

// ipoibWarnInterval and ipoibWarnBurst are ipoib_warn's limit.
const (
	ipoibWarnInterval = 10 * time.Second
	ipoibWarnBurst    = 100
)

func newWarnLimit(what string) *ratelimit {
	return &ratelimit{what: what, interval: ipoibWarnInterval, burst: ipoibWarnBurst}
}

// allow reports whether a line may be logged at now, and how many were held back
// in the window that ended before it (to be said first).
func (r *ratelimit) allow(now time.Time) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.begin.IsZero() {
		r.begin = now
	}
	if now.Sub(r.begin) > r.interval { // strictly after, as time_is_before_jiffies
		suppressed, r.missed = r.missed, 0
		r.begin, r.printed = now, 0
	}
	if r.printed < r.burst {
		r.printed++
		return true, suppressed
	}
	r.missed++
	return false, suppressed
}
