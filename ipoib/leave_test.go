package ipoib

import (
	"context"
	"sync/atomic"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// A join answered after the interface went down is left again in the background; a
// join of the same group after the interface came back up waits for that leave. The
// SA keeps one membership per port, and a leave arriving after the new join deleted
// it: the port then missed the broadcasts (ARP) of its peers (a flaky
// TestFlushesKeepSAMembership). Deterministic here: the first join and the leave are
// held by the test.
func TestRejoinWaitsForTheLeaveOfASupersededJoin(t *testing.T) {
	r := newRig(t)
	joinStarted, releaseJoin := make(chan struct{}, 1), make(chan struct{})
	leaveStarted, releaseLeave := make(chan struct{}, 1), make(chan struct{})
	var bcast verbs.GID // set before the interface comes up
	h := &hookSA{
		join: func(ctx context.Context, n int, rec mad.MCMemberRecord) error {
			if n == 1 && rec.MGID == bcast { // the first broadcast join
				return holdUntil(ctx, joinStarted, releaseJoin)
			}
			return nil
		},
		leave: holdFirstLeave(&bcast, leaveStarted, releaseLeave), // the superseded join's leave
	}
	e := r.engine("a", 1, Options{wrapSA: h.wrap})
	a := iface(t, e, "ib0")
	bcast = a.Broadcast().GID()
	_ = a.SetUp(true)
	<-joinStarted // the broadcast join is at the SA
	_ = a.SetUp(false)
	// The leave is on its way by the time joinDone lets go of mu: a round of the task in
	// between saw none and joined again, and the leave then undid that join.
	hooked := make(chan bool, 1)
	testHookSuperseded = func(i *Interface, mgid verbs.GID) { hooked <- i.leavePending(mgid) }
	t.Cleanup(func() { testHookSuperseded = nil })
	close(releaseJoin) // answered after the interface went down: superseded, left
	if !<-hooked {
		t.Fatal("joinDone let go of a superseded join before its leave was pending")
	}
	<-leaveStarted
	_ = a.SetUp(true)
	waitFor(t, "the QP ready again", func() bool { return a.data().qpReady })
	a.mcastRound() // a round of the join task while the leave is on its way
	if g, ok := groupOf(a, bcast); ok && g.joining || h.joinCalls(bcast) != 1 {
		t.Fatalf("the broadcast group joined again while its leave was on its way (joining %v, %d joins)", g.joining, h.joinCalls(bcast))
	}
	close(releaseLeave) // the leave is answered: the task is woken and joins
	waitFor(t, "carrier after the leave", a.Carrier)
	if st := r.joinState(bcast, a.HWAddr().GID()); st&mad.JoinFull == 0 {
		t.Fatalf("a is not a full member of the broadcast group at the SA (join state %#x)", st)
	}
}

// A flush leaves the groups and waits for the leaves; a round of the join task while
// they are on their way must not join the groups again: the leave reaching the SA after
// that join deleted the membership it made, and the interface had carrier without
// being a member (a flaky TestFlushesKeepSAMembership).
func TestFlushRejoinsAfterItsLeaves(t *testing.T) {
	r, a, bcast := whileLeaving(t, "the flush's leave was on its way", func(a *Interface) { a.flush(flushNormal) })
	waitFor(t, "carrier after the flush", a.Carrier)
	if st := r.joinState(bcast, a.HWAddr().GID()); st&mad.JoinFull == 0 {
		t.Fatalf("a is not a full member of the broadcast group at the SA (join state %#x)", st)
	}
}

// Closing an interface (delete_child) leaves its groups with no join started while
// the leaves are on their way: the task ran a round then, joined again, and the
// membership outlived the interface at the SA (TestChildren4000LeaveNothing, once).
func TestCloseJoinsNothingWhileLeaving(t *testing.T) {
	r, a, bcast := whileLeaving(t, "the interface closed", func(a *Interface) { a.close() })
	if st := r.joinState(bcast, a.HWAddr().GID()); st != 0 {
		t.Fatalf("a closed interface is still a member of the broadcast group at the SA (join state %#x)", st)
	}
}

// holdFirstLeave is a hookSA leave that holds the first leave of the group *mgid (read
// at each leave: the caller sets it once the interface exists) until release.
func holdFirstLeave(mgid *verbs.GID, started chan<- struct{}, release <-chan struct{}) func(context.Context, mad.MCMemberRecord) error {
	var leaves atomic.Int32
	return func(ctx context.Context, rec mad.MCMemberRecord) error {
		if rec.MGID == *mgid && leaves.Add(1) == 1 {
			return holdUntil(ctx, started, release)
		}
		return nil
	}
}

// whileLeaving brings ib0 up with carrier, runs act with the first leave of the
// broadcast group held at the SA, and runs a round of the join task while it is held,
// which must not join the group again (during names act in the failure). It returns
// once act has returned after the leave was answered.
func whileLeaving(t *testing.T, during string, act func(a *Interface)) (*rig, *Interface, verbs.GID) {
	t.Helper()
	r := newRig(t)
	leaveStarted, releaseLeave := make(chan struct{}, 1), make(chan struct{})
	var bcast verbs.GID // set before the interface comes up
	h := &hookSA{leave: holdFirstLeave(&bcast, leaveStarted, releaseLeave)}
	e := r.engine("a", 1, Options{wrapSA: h.wrap})
	a := iface(t, e, "ib0")
	bcast = a.Broadcast().GID()
	_ = a.SetUp(true)
	waitFor(t, "carrier", a.Carrier)
	done := make(chan struct{})
	go func() { defer close(done); act(a) }()
	<-leaveStarted
	a.mcastRound() // a round of the join task while the leave is on its way
	if g, ok := groupOf(a, bcast); ok && g.joining || h.joinCalls(bcast) != 1 {
		t.Fatalf("the broadcast group joined again while %s (joining %v, %d joins)", during, g.joining, h.joinCalls(bcast))
	}
	close(releaseLeave)
	<-done
	return r, a, bcast
}
