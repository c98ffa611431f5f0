package clock_test

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"ipoibfs/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// within bounds a wait for something that happens in a passing test; it only keeps a
// broken test from hanging.
const within = 10 * time.Second

func TestRealClock(t *testing.T) {
	var c clock.Clock = clock.Real{}
	start := c.Now()
	fired := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(fired) })
	select {
	case <-fired:
	case <-time.After(within):
		t.Fatal("AfterFunc never ran")
	}
	if c.Since(start) <= 0 {
		t.Error("Since is not positive after a timer ran")
	}
	tm := c.NewTimer(time.Millisecond)
	select {
	case <-tm.C():
	case <-time.After(within):
		t.Fatal("timer never fired")
	}
	if tm.Stop() {
		t.Error("Stop of a fired timer returned true")
	}
	ran := atomic.Bool{}
	long := c.AfterFunc(time.Hour, func() { ran.Store(true) })
	if !long.Stop() || long.Stop() {
		t.Error("Stop of an armed timer: want true, then false")
	}
	tk := c.NewTicker(time.Millisecond)
	for range 2 {
		select {
		case <-tk.C():
		case <-time.After(within):
			t.Fatal("ticker never ticked")
		}
	}
	tk.Stop()
}

func TestMockStartsAtEpoch(t *testing.T) {
	m := clock.NewMock(t)
	if !m.Now().Equal(clock.Epoch) {
		t.Errorf("Now %v, want %v", m.Now(), clock.Epoch)
	}
	if _, ok := m.Peek(); ok {
		t.Error("a timer is armed on a new Mock")
	}
	m.Advance(90 * time.Minute)
	if got := m.Since(clock.Epoch); got != 90*time.Minute {
		t.Errorf("Since(Epoch) %v after Advance(90m)", got)
	}
}

// Advance fires timers in deadline order, each seeing Now at its deadline, including
// timers armed by a timer's function that fall due within the span, and returns only
// once their functions have returned.
func TestMockAdvanceOrder(t *testing.T) {
	m := clock.NewMock(t)
	var mu sync.Mutex
	var got []string
	rec := func(name string) func() {
		return func() {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, name+"@"+m.Since(clock.Epoch).String())
		}
	}
	m.AfterFunc(30*time.Millisecond, rec("c"))
	m.AfterFunc(10*time.Millisecond, func() {
		rec("a")()
		m.AfterFunc(5*time.Millisecond, rec("a+5")) // due at 15 ms: inside the span
		m.AfterFunc(50*time.Millisecond, rec("late"))
	})
	m.AfterFunc(20*time.Millisecond, rec("b"))
	if n := m.Armed(); n != 3 {
		t.Errorf("Armed %d, want 3", n)
	}
	if d, ok := m.Peek(); !ok || d != 10*time.Millisecond {
		t.Errorf("Peek %v %v, want 10ms", d, ok)
	}

	m.Advance(10*time.Millisecond - 1)
	mu.Lock()
	if len(got) != 0 {
		t.Errorf("fired before their deadline: %v", got)
	}
	mu.Unlock()

	m.Advance(40*time.Millisecond + 1) // to 50 ms
	want := []string{"a@10ms", "a+5@15ms", "b@20ms", "c@30ms"}
	mu.Lock()
	if !slices.Equal(got, want) {
		t.Errorf("fired %v, want %v", got, want)
	}
	mu.Unlock()
	if m.Since(clock.Epoch) != 50*time.Millisecond {
		t.Errorf("Now at %v, want 50ms", m.Since(clock.Epoch))
	}
	if d, ok := m.Peek(); !ok || d != 10*time.Millisecond || m.Armed() != 1 {
		t.Errorf("Peek %v %v, Armed %d: want the 60 ms timer alone", d, ok, m.Armed())
	}
	if d := m.AdvanceNext(); d != 10*time.Millisecond {
		t.Errorf("AdvanceNext moved %v", d)
	}
	mu.Lock()
	if got[len(got)-1] != "late@60ms" {
		t.Errorf("last fired %q", got[len(got)-1])
	}
	mu.Unlock()
	if m.Armed() != 0 {
		t.Errorf("Armed %d after all fired", m.Armed())
	}
}

func TestMockStopReset(t *testing.T) {
	m := clock.NewMock(t)
	var n atomic.Int32
	tm := m.AfterFunc(time.Second, func() { n.Add(1) })
	if !tm.Stop() {
		t.Error("Stop of an armed timer returned false")
	}
	if tm.Stop() {
		t.Error("second Stop returned true")
	}
	if m.Armed() != 0 {
		t.Errorf("Armed %d after Stop", m.Armed())
	}
	m.Advance(time.Hour)
	if n.Load() != 0 {
		t.Error("a stopped timer fired")
	}
	// Reset re-arms from now; it reports whether the timer was armed.
	if tm.Reset(time.Second) {
		t.Error("Reset of a stopped timer returned true")
	}
	m.Advance(500 * time.Millisecond)
	if !tm.Reset(time.Second) {
		t.Error("Reset of an armed timer returned false")
	}
	m.Advance(time.Second - 1)
	if n.Load() != 0 {
		t.Error("fired at the deadline before the Reset")
	}
	m.Advance(1)
	if n.Load() != 1 {
		t.Errorf("fired %d times, want once", n.Load())
	}
	if tm.Stop() {
		t.Error("Stop of a fired timer returned true")
	}
	m.Advance(time.Hour)
	if n.Load() != 1 {
		t.Errorf("fired %d times, want once", n.Load())
	}
}

// Stop racing with the deadline: either Stop wins (true, the function never runs) or
// the timer does (false, it runs exactly once). Never both, never neither.
func TestMockStopRace(t *testing.T) {
	m := clock.NewMock(t)
	for range 200 {
		var n atomic.Int32
		tm := m.AfterFunc(time.Millisecond, func() { n.Add(1) })
		stopped := make(chan bool)
		go func() { stopped <- tm.Stop() }()
		m.Advance(time.Millisecond)
		s := <-stopped
		m.Advance(time.Hour) // a stale firing would show now at the latest
		if s && n.Load() != 0 || !s && n.Load() != 1 {
			t.Fatalf("Stop returned %v and the function ran %d times", s, n.Load())
		}
	}
}

func TestMockTimerChannel(t *testing.T) {
	m := clock.NewMock(t)
	tm := m.NewTimer(time.Second)
	select {
	case <-tm.C():
		t.Fatal("fired before Advance")
	default:
	}
	m.Advance(3 * time.Second)
	select {
	case at := <-tm.C():
		if !at.Equal(clock.Epoch.Add(time.Second)) {
			t.Errorf("fired with time %v, want its deadline", at)
		}
	default:
		t.Fatal("no time on C after the deadline")
	}
	// A fired, unread timer: Reset leaves no stale time on C.
	tm.Reset(time.Second)
	m.Advance(time.Second)
	tm.Reset(time.Second)
	select {
	case <-tm.C():
		t.Error("stale time on C after Reset")
	default:
	}
	m.Advance(time.Second)
	if tm.Stop() {
		t.Error("Stop of a fired timer returned true")
	}
	select {
	case <-tm.C():
		t.Error("stale time on C after Stop")
	default:
	}
}

func TestMockTicker(t *testing.T) {
	m := clock.NewMock(t)
	tk := m.NewTicker(10 * time.Millisecond)
	for i := 1; i <= 3; i++ {
		m.Advance(10 * time.Millisecond)
		select {
		case at := <-tk.C():
			if want := clock.Epoch.Add(time.Duration(i) * 10 * time.Millisecond); !at.Equal(want) {
				t.Errorf("tick %d at %v, want %v", i, at, want)
			}
		default:
			t.Fatalf("no tick %d", i)
		}
	}
	// Ticks nobody reads are dropped: one waits, the rest are lost.
	m.Advance(50 * time.Millisecond)
	if at := <-tk.C(); !at.Equal(clock.Epoch.Add(40 * time.Millisecond)) {
		t.Errorf("kept tick at %v, want the first unread (40ms)", at)
	}
	select {
	case <-tk.C():
		t.Error("more than one unread tick kept")
	default:
	}
	tk.Reset(time.Second)
	if d, ok := m.Peek(); !ok || d != time.Second {
		t.Errorf("next tick in %v after Reset(1s)", d)
	}
	tk.Stop()
	if m.Armed() != 0 {
		t.Errorf("Armed %d after the ticker stopped", m.Armed())
	}
	m.Advance(time.Hour)
	select {
	case <-tk.C():
		t.Error("tick after Stop")
	default:
	}
}

// BlockUntil lets a test wait for code on another goroutine to arm its timers.
func TestMockBlockUntil(t *testing.T) {
	m := clock.NewMock(t)
	start := make(chan struct{})
	fired := make(chan struct{}, 3)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			m.AfterFunc(time.Second, func() { fired <- struct{}{} })
		}()
	}
	close(start)
	m.BlockUntil(3)
	wg.Wait()
	m.Advance(time.Second)
	if len(fired) != 3 {
		t.Errorf("%d of 3 fired", len(fired))
	}
	m.BlockUntil(0)
}

// Timers armed while Advance runs (by the code under test, on its own goroutines) are
// fired at their deadlines, never skipped.
func TestMockAdvanceWhileArming(t *testing.T) {
	m := clock.NewMock(t)
	const n = 200
	var fired atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			m.AfterFunc(time.Millisecond, func() { fired.Add(1) })
		}
	}()
	m.BlockUntil(1)
	for range 100 {
		m.Advance(time.Millisecond)
	}
	<-done
	m.Advance(time.Millisecond)
	if fired.Load() != n || m.Armed() != 0 {
		t.Errorf("%d of %d fired, %d still armed", fired.Load(), n, m.Armed())
	}
}

// A timer armed with d <= 0 fires at once, without Advance.
func TestMockZeroDuration(t *testing.T) {
	m := clock.NewMock(t)
	ran := make(chan struct{})
	m.AfterFunc(0, func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(within):
		t.Fatal("AfterFunc(0) never ran")
	}
}
