package soft

import (
	"sync"
	"testing"
	"time"

	"ipoibfs/internal/clock"
	"ipoibfs/verbs"
)

// On virtual time, exactly: the subnet manager keeps a port that stopped sending
// hellos for eight heartbeats and drops it (its LID, its group memberships) at the
// sweep after that, as OpenSM's sweep drops a port that no longer answers.
func TestSMDropsPortSilentForMoreThanEightHeartbeats(t *testing.T) {
	const hb = 250 * time.Millisecond
	clk := clock.NewMock(t)
	net := NewMemNetwork()
	smh, err := New(Config{Name: "sm", Network: net, HostSM: true, Heartbeat: hb, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	a, err := New(Config{Name: "a", Network: net, SM: smh.Endpoint(1), Heartbeat: hb, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	// Its one hello so far (sent at start, at the mock's epoch) made it ACTIVE.
	waitFor(t, "a active", func() bool { return a.SoftPort(1).Attr().State == verbs.PortActive })
	sm := smh.SM()
	known := func() bool {
		for _, n := range sm.Nodes() {
			if n.Name == a.NodeDesc() {
				return true
			}
		}
		return false
	}
	if !known() {
		t.Fatalf("the SM does not list a: %+v", sm.Nodes())
	}
	a.Close() // no more hellos
	sweep := func() {
		t.Helper()
		before := sm.sweeps.Load()
		clk.Advance(hb)
		waitFor(t, "a sweep round", func() bool { return sm.sweeps.Load() > before })
	}
	for range 8 {
		sweep()
	}
	if !known() {
		t.Fatalf("a dropped after exactly 8 heartbeats of silence; the SM waits for more than 8")
	}
	sweep()
	if known() {
		t.Fatalf("a still listed after 9 heartbeats of silence: %+v", sm.Nodes())
	}
}

// stallFabric is an SM host and a port a on virtual time, with a sweep helper that
// advances one heartbeat and waits for the SM's sweep, and known telling whether the
// SM lists a.
func stallFabric(t *testing.T, hb time.Duration) (smh, a *HCA, sweep func(), known func() bool) {
	t.Helper()
	clk := clock.NewMock(t)
	net := NewMemNetwork()
	smh, err := New(Config{Name: "sm", Network: net, HostSM: true, Heartbeat: hb, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smh.Close() })
	a, err = New(Config{Name: "a", Network: net, SM: smh.Endpoint(1), Heartbeat: hb, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	waitFor(t, "a active", func() bool { return a.SoftPort(1).Attr().State == verbs.PortActive })
	sm := smh.SM()
	known = func() bool {
		for _, n := range sm.Nodes() {
			if n.Name == a.NodeDesc() {
				return true
			}
		}
		return false
	}
	sweep = func() {
		t.Helper()
		before := sm.sweeps.Load()
		clk.Advance(hb)
		waitFor(t, "a sweep round", func() bool { return sm.sweeps.Load() > before })
	}
	return smh, a, sweep, known
}

// stall stops the SM port's receive loop at its next batch until the returned
// function is called.
func stall(t *testing.T, p *Port, sweep func()) (release func()) {
	t.Helper()
	stalled, released := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(stalled)
			<-released
		})
	}
	p.rxHook.Store(&hook)
	sweep() // a's heartbeat: its hello reaches the SM and stalls the loop
	<-stalled
	return func() { close(released) }
}

// The sweep counts a port's silence only up to the moment the SM's own port has
// handled what reached it: while the SM's receive loop is stalled, hellos wait in its
// queue and no port is dropped; once the loop catches up, the port's hellos count
// again, and a port that then goes silent is dropped as before.
func TestSMKeepsPortsWhileItsOwnReceiveLoopIsStalled(t *testing.T) {
	smh, a, sweep, known := stallFabric(t, 250*time.Millisecond)
	release := stall(t, smh.SoftPort(1), sweep)
	for range 20 {
		sweep()
	}
	if !known() {
		t.Fatalf("a dropped while the SM's own receive loop was stalled for 20 heartbeats")
	}
	release()
	waitFor(t, "the SM's receive loop caught up", func() bool { return !smh.SoftPort(1).rxBusy.Load() })
	sweep()
	if !known() {
		t.Fatalf("a dropped after the SM's receive loop caught up with its hellos")
	}
	a.Close()
	// Dropped after more than 8 heartbeats of silence: 9, or 10 when a sweep came
	// while the SM's loop was handling that heartbeat's own hello (silence then counts
	// up to the batch before; a CI run saw it).
	for range 10 {
		sweep()
		if !known() {
			break
		}
	}
	if known() {
		t.Fatalf("a still listed after 10 heartbeats of silence once the SM was caught up: %+v", smh.SM().Nodes())
	}
}

// A stall is not waited out for ever: past 32 heartbeats silence counts again (a
// loop that never drains under saturating traffic must not keep dead ports), so a
// port unheard for 32 + 8 heartbeats is dropped even while the SM is stalled.
func TestSMSweepsAgainAfterALongStall(t *testing.T) {
	smh, _, sweep, known := stallFabric(t, 250*time.Millisecond)
	release := stall(t, smh.SoftPort(1), sweep)
	defer release()
	for range 39 {
		sweep()
	}
	if !known() {
		t.Fatalf("a dropped within 40 heartbeats of the SM's stall")
	}
	sweep()
	sweep()
	if known() {
		t.Fatalf("a still listed after 41 heartbeats of the SM's stall")
	}
}
