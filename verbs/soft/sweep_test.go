package soft

import (
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
