// Package clock is the injectable clock of the fabric, the subnet manager, the CM and
// the engine's timers (gVisor's tcpip.Clock is the model): code that reads the time or
// starts timers takes a Clock, production passes Real, and tests pass a Mock, on which
// time stands still until the test advances it. Timeout, retry, reaping and heartbeat
// tests then run on virtual time: exact (a retransmission is due at exactly its
// timeout, not "within 30 ms") and fast (an hour of timeouts takes microseconds).
//
// The Mock is github.com/coder/quartz's mock clock behind this package's interface:
// quartz keeps the timers in deadline order, advances to one deadline at a time and
// waits for the functions it runs there. This package adds what the callers here need
// on top: Timer.Stop that guarantees the function does not run afterwards (as
// time.Timer's does; quartz's may still run a function whose deadline was reached),
// a count of the armed timers to wait for (BlockUntil), and Advance over any span,
// through every deadline in it, while the code under test arms timers concurrently.
package clock

import (
	"context"
	"sync"
	"time"

	"github.com/coder/quartz"
)

// Clock tells the time and starts timers, as the time package does.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	// AfterFunc calls f on a goroutine of its own once d has passed (time.AfterFunc).
	// The Timer's C is nil.
	AfterFunc(d time.Duration, f func()) Timer
	// NewTimer sends the time on the Timer's C once d has passed (time.NewTimer).
	NewTimer(d time.Duration) Timer
	// NewTicker sends the time on the Ticker's C every d, dropping ticks a slow reader
	// misses (time.NewTicker). d must be positive.
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer: Stop reports whether it stopped the timer before it fired
// (then the function of an AfterFunc timer does not run); Reset re-arms it, reporting
// whether it had been armed. After Stop or Reset no stale time is received from C.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real is the time package.
type Real struct{}

var _ Clock = Real{}

func (Real) Now() time.Time                            { return time.Now() }
func (Real) Since(t time.Time) time.Duration           { return time.Since(t) }
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }
func (Real) NewTimer(d time.Duration) Timer            { return realTimer{time.NewTimer(d)} }
func (Real) NewTicker(d time.Duration) Ticker          { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }

// Epoch is where a Mock's time starts: 2024-01-01 00:00 UTC.
var Epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// TB is what a Mock needs of a test (testing.TB has it).
type TB = quartz.TestingT

// stuck bounds every wait of a Mock for the code under test (the functions of due
// timers, BlockUntil): a test that waits that long is wedged, and fails. It is not a
// timing threshold: nothing waits for it in a passing test.
const stuck = time.Minute

// Mock is a Clock on virtual time for tests. Time starts at Epoch and moves only when
// the test calls Advance or AdvanceNext.
//
// When time reaches a deadline, the timers due then fire: each AfterFunc function runs
// on a goroutine of its own (as with the time package; timers due at the same instant
// run concurrently), and Advance waits until they have all returned before going on to
// the next deadline or returning. So when Advance returns, everything the timers it
// fired did is done, including timers they armed that fell due within the span. A
// channel timer's or ticker's time is sent without blocking (a ticker drops ticks
// nobody reads, as time.Ticker does). A timer armed with d <= 0 fires at once, on a
// goroutine of its own, without waiting for Advance.
//
// Advance, AdvanceNext and BlockUntil must be called from the test's goroutine (they
// fail the test if the code under test wedges), and not from a timer's function.
type Mock struct {
	q  *quartz.Mock
	tb TB
	// adv keeps timers from being armed between Advance's look at the next deadline
	// and its step there (quartz fails a step past an event).
	adv sync.Mutex

	mu      sync.Mutex
	armed   int
	changed chan struct{} // closed and replaced when armed changes
}

var _ Clock = (*Mock)(nil)

// NewMock returns a Mock at Epoch.
func NewMock(tb TB) *Mock {
	q := quartz.NewMock(tb).WithLogger(quartz.NoOpLogger)
	q.Set(Epoch)
	return &Mock{q: q, tb: tb, changed: make(chan struct{})}
}

func (m *Mock) Now() time.Time                  { return m.q.Now() }
func (m *Mock) Since(t time.Time) time.Duration { return m.q.Now().Sub(t) }

func (m *Mock) AfterFunc(d time.Duration, f func()) Timer {
	t := &mockTimer{m: m, f: f}
	t.arm(d)
	return t
}

func (m *Mock) NewTimer(d time.Duration) Timer {
	t := &mockTimer{m: m, c: make(chan time.Time, 1)}
	t.arm(d)
	return t
}

func (m *Mock) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &mockTicker{mockTimer{m: m, c: make(chan time.Time, 1), period: d}}
	t.arm(d)
	return t
}

// Advance moves the time forward by d, firing the timers due within it in deadline
// order (see Mock), and returns once they have all run.
func (m *Mock) Advance(d time.Duration) {
	m.tb.Helper()
	for {
		m.adv.Lock()
		next, ok := m.q.Peek()
		step := d
		if ok && next <= d {
			step = next
		}
		w := m.q.Advance(step)
		m.adv.Unlock()
		m.wait(w)
		d -= step
		if step != next || !ok {
			return
		}
	}
}

// AdvanceNext moves the time to the next deadline, fires the timers due then and
// returns, once they have run, how far it moved. It fails the test if no timer is
// armed.
func (m *Mock) AdvanceNext() time.Duration {
	m.tb.Helper()
	m.adv.Lock()
	d, w := m.q.AdvanceNext()
	m.adv.Unlock()
	m.wait(w)
	return d
}

// Peek returns how long until the next deadline, and false if no timer is armed.
func (m *Mock) Peek() (time.Duration, bool) { return m.q.Peek() }

// Armed returns how many timers are armed (tickers count while they run).
func (m *Mock) Armed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.armed
}

// BlockUntil waits until at least n timers are armed, for a test to know that the
// code under test has started its timers before it advances the time.
func (m *Mock) BlockUntil(n int) {
	m.tb.Helper()
	stop := time.NewTimer(stuck)
	defer stop.Stop()
	for {
		m.mu.Lock()
		armed, ch := m.armed, m.changed
		m.mu.Unlock()
		if armed >= n {
			return
		}
		select {
		case <-ch:
		case <-stop.C:
			m.tb.Fatalf("clock: %d timers armed after %v, waiting for %d", armed, stuck, n)
		}
	}
}

func (m *Mock) wait(w quartz.AdvanceWaiter) {
	m.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stuck)
	defer cancel()
	w.MustWait(ctx)
}

func (m *Mock) addArmed(n int) {
	m.mu.Lock()
	m.armed += n
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

// mockTimer is an AfterFunc timer (f set), a channel timer or a ticker (period set).
// Each arming is a quartz AfterFunc of its own, tagged with a generation: a firing of
// an earlier generation (one that Stop or Reset raced with) does nothing.
type mockTimer struct {
	m      *Mock
	f      func()
	c      chan time.Time
	period time.Duration

	mu    sync.Mutex // held across the quartz calls of arm and stop
	gen   uint64
	armed bool
	q     *quartz.Timer
}

func (t *mockTimer) C() <-chan time.Time { return t.c }

func (t *mockTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopLocked()
}

func (t *mockTimer) Reset(d time.Duration) bool { return t.arm(d) }

func (t *mockTimer) arm(d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.stopLocked()
	t.armLocked(d)
	return was
}

func (t *mockTimer) armLocked(d time.Duration) {
	t.gen++
	gen := t.gen
	t.armed = true
	t.m.adv.Lock()
	t.q = t.m.q.AfterFunc(d, func() { t.fire(gen) })
	t.m.adv.Unlock()
	t.m.addArmed(1)
}

func (t *mockTimer) stopLocked() bool {
	if t.c != nil {
		select {
		case <-t.c:
		default:
		}
	}
	if !t.armed {
		return false
	}
	t.armed = false
	t.q.Stop()
	t.q = nil
	t.m.addArmed(-1)
	return true
}

func (t *mockTimer) fire(gen uint64) {
	t.mu.Lock()
	if !t.armed || t.gen != gen {
		t.mu.Unlock()
		return
	}
	t.armed = false
	t.q = nil
	t.m.addArmed(-1)
	if t.c != nil {
		select {
		case t.c <- t.m.q.Now():
		default:
		}
	}
	if t.period > 0 {
		t.armLocked(t.period)
	}
	t.mu.Unlock()
	if t.f != nil {
		t.f()
	}
}

type mockTicker struct{ mockTimer }

func (t *mockTicker) Stop() { t.mockTimer.Stop() }

func (t *mockTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopLocked()
	t.period = d
	t.armLocked(d)
}
