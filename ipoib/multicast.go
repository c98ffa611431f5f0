package ipoib

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// mcastGroup is one multicast group of an interface (struct ipoib_mcast).
type mcastGroup struct {
	mgid     verbs.GID
	created  time.Time
	sendOnly bool
	queue    [][]byte // IPoIB frames (header included) waiting for the join
	rec      mad.MCMemberRecord
	ah       verbs.AH // non-nil once joined ("complete")
	attached bool
	joining  bool
	backoff  time.Duration
	retryAt  time.Time
	tries    int // send-only joins are tried twice, then the queue is dropped
	lastUse  time.Time
}

// mcastGroup's fields, as the table, are under dmu.

// bcastGroupLocked returns the broadcast group's entry. Called with dmu held.
func (i *Interface) bcastGroupLocked() *mcastGroup { return i.mcast[i.data().bcast.GID()] }

// wantedGroupsLocked lists the groups the interface joins as a full member: the
// all-hosts groups and the solicited-node groups of its IPv6 addresses, mapped to MGIDs
// (what the kernel's netdev multicast list holds for an interface with those addresses).
// Called with mu held.
func (i *Interface) wantedGroupsLocked() []verbs.GID {
	bcast := i.data().bcast
	var out []verbs.GID
	if i.hostGroupsSet {
		for _, a := range i.hostGroups {
			if a.IsMulticast() {
				out = append(out, mgidForIP(a, bcast))
			}
		}
		// The kernel device is a TUN, which is IFF_NOARP, and the kernel joins no
		// solicited-node groups on such devices; an IPoIB netdev has them in its list.
		for _, a := range i.ownAddrs() {
			if a.Is6() {
				if g := mgidForIP(solicitedNode(a), bcast); !slices.Contains(out, g) {
					out = append(out, g)
				}
			}
		}
		return out
	}
	hasV4 := false
	for _, a := range i.ownAddrs() {
		if a.Is4() {
			hasV4 = true
			continue
		}
		out = append(out, mgidForIP(solicitedNode(a), bcast))
	}
	out = append(out, mgidForIP(netip.MustParseAddr("ff02::1"), bcast))
	if hasV4 {
		out = append(out, mgidForIP(netip.MustParseAddr("224.0.0.1"), bcast))
	}
	return out
}

// mcastRound starts the joins that are due and returns when to look again.
func (i *Interface) mcastRound() time.Duration {
	p, _ := i.e.dev.Port(i.port)
	active := p.Attr().State == verbs.PortActive
	now := i.e.clk.Now()
	i.mu.Lock() // the host's groups
	defer i.mu.Unlock()
	i.dmu.Lock()
	var gone []*mcastGroup
	next := i.mcastRoundLocked(active, now, &gone)
	i.dmu.Unlock()
	// Groups dropped from the table are detached and left with mu alone held: a
	// Transmit (dmu) does not wait for the HCA.
	for _, g := range gone {
		i.forget(g)
	}
	return next
}

// mcastRoundLocked is mcastRound's work on the table, with mu and dmu held; the groups
// it drops are appended to gone.
func (i *Interface) mcastRoundLocked(active bool, now time.Time, gone *[]*mcastGroup) time.Duration {
	next := time.Hour
	d := i.data()
	if !d.up || !d.qpReady || !active {
		return next
	}
	due := func(g *mcastGroup) bool {
		if g.joining || g.ah != nil || (g.sendOnly && g.tries >= 2) || i.leavePending(g.mgid) {
			return false // (the leave's end wakes the task)
		}
		if now.Before(g.retryAt) {
			next = min(next, g.retryAt.Sub(now))
			return false
		}
		return true
	}
	bg := i.bcastGroupLocked()
	if bg == nil {
		bg = &mcastGroup{mgid: d.bcast.GID(), created: now}
		i.mcast[bg.mgid] = bg
	}
	if bg.ah == nil {
		// Every other join waits for the broadcast group (it supplies their parameters).
		if due(bg) {
			i.startJoinLocked(bg)
		}
		return next
	}
	wanted := i.wantedGroupsLocked()
	isWanted := make(map[verbs.GID]bool, len(wanted)) // a round is O(groups), not O(groups^2)
	for _, g := range wanted {
		isWanted[g] = true
		if old, ok := i.mcast[g]; !ok || old.sendOnly && !old.joining {
			// A send-only membership becomes a full one, as the driver's restart
			// task does when the group enters the netdev's list.
			ng := &mcastGroup{mgid: g, created: now}
			if ok {
				ng.queue, old.queue = old.queue, nil
				i.dropGroupLocked(old, gone)
			}
			i.mcast[g] = ng
		}
	}
	// Full memberships the kernel no longer lists are left (ipoib_mcast_restart_task).
	for mgid, g := range i.mcast {
		if g.sendOnly || g.joining || mgid == d.bcast.GID() || isWanted[mgid] {
			continue
		}
		i.e.mtracef(1, "%s: deleting multicast group %s", i.Name(), mgid.KernelString())
		i.dropGroupLocked(g, gone)
	}
	// Send-only groups nobody sent to for a while are left: the kernel reaps them with
	// their neighbour, idle for two ARP gc_intervals (__ipoib_reap_neigh,
	// ipoib_check_and_add_mcast_sendonly).
	idle := i.e.tm.Load().sendOnlyIdle
	for _, g := range i.mcast {
		if !g.sendOnly || g.joining {
			continue
		}
		if left := idle - now.Sub(g.lastUse); left > 0 {
			next = min(next, left)
			continue
		}
		i.e.mtracef(1, "%s: reaping idle send-only group %s", i.Name(), g.mgid.KernelString())
		i.dropGroupLocked(g, gone)
	}
	for _, g := range i.mcast {
		if due(g) {
			i.startJoinLocked(g)
		}
	}
	return next
}

// startJoinLocked sends the MCMemberRecord join in the background. Called with dmu
// held.
func (i *Interface) startJoinLocked(g *mcastGroup) {
	g.joining = true
	gid := i.hw.GID()
	d := i.data()
	rec := mad.MCMemberRecord{MGID: g.mgid, PortGID: gid, PKey: d.pkey, JoinState: mad.JoinFull}
	mask := mad.IPoIBBroadcastJoinMask
	if g.mgid != d.bcast.GID() {
		// Copy the broadcast group's parameters (RFC 4391 §5).
		b := i.bcastGroupLocked().rec
		rec.QKey, rec.MTUSelector, rec.MTU, rec.TClass = b.QKey, mad.SelExactly, b.MTU, b.TClass
		rec.RateSelector, rec.Rate, rec.SL, rec.FlowLabel, rec.HopLimit = mad.SelExactly, b.Rate, b.SL, b.FlowLabel, b.HopLimit
		mask = mad.IPoIBCreateJoinMask
		if g.sendOnly {
			rec.JoinState = mad.JoinSendOnlyFull
		}
	}
	i.e.mtracef(1, "%s: joining MGID %s (send-only %v)", i.Name(), g.mgid.KernelString(), g.sendOnly)
	i.wg.Add(1)
	go func() {
		defer i.wg.Done()
		ctx := i.ctx
		res, err := i.sa.Join(ctx, rec, mask)
		i.joinDone(g, res, err)
	}()
}

// joinDone completes a join (ipoib_mcast_join_finish): the QP's Q_Key becomes the
// group's, the QP is attached, an AH is created and queued packets are sent. It holds
// mu throughout (the Q_Key, the group MTU and carrier are the control path's), so the
// group cannot be flushed meanwhile; the group's fields are changed under dmu.
func (i *Interface) joinDone(g *mcastGroup, rec mad.MCMemberRecord, err error) {
	var act func()
	var ah verbs.AH
	i.mu.Lock()
	i.dmu.Lock()
	g.joining = false
	cur := i.mcast[g.mgid]
	i.dmu.Unlock()
	if up := i.data().up; cur != g || !up {
		// Superseded by a flush. Leave only if nobody wants the group any more: the SA
		// keeps one membership per port, and a leave arriving after the new join for
		// the same group would delete the membership that join just made.
		// The leave is registered before mu is released: a round that runs in between
		// would otherwise see no leave pending and send a join the leave then undoes.
		// A join the interface's close cancelled may have reached the SA all the same:
		// it is left too (a leave of no membership is refused, harmlessly).
		if (err == nil || errors.Is(err, context.Canceled)) && !(cur != nil && up) {
			i.leaveGroup(g.mgid, g.leaveState())
		}
		if testHookSuperseded != nil {
			testHookSuperseded(i, g.mgid)
		}
		i.mu.Unlock()
		return
	}
	if err == nil {
		ah, err = i.e.dev.CreateAH(verbs.AHAttr{Port: i.port, DLID: rec.MLID, SL: rec.SL, StaticRate: rec.Rate,
			GRH: true, DGID: g.mgid, FlowLabel: rec.FlowLabel, HopLimit: rec.HopLimit, TClass: rec.TClass})
	}
	isBcast := g.mgid == i.data().bcast.GID()
	if err == nil && isBcast {
		i.setLocked(func(d *dataState) { d.qkey = rec.QKey })
		err = i.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskQKey, QKey: rec.QKey})
		i.lanesQKeyLocked(rec.QKey)
	}
	attached := false
	if err == nil && !g.sendOnly {
		if err = i.qp.AttachMcast(g.mgid, rec.MLID); err == nil {
			attached = true
		}
	}
	i.dmu.Lock()
	if attached {
		g.attached = true
	}
	if err != nil {
		g.tries++
		if tm := i.e.tm.Load(); g.backoff == 0 {
			g.backoff = tm.joinBackoff
		} else {
			g.backoff = min(2*g.backoff, tm.maxBackoff)
		}
		g.retryAt = i.e.clk.Now().Add(g.backoff)
		if g.sendOnly && g.tries >= 2 {
			i.stats.txDropped.Add(uint64(len(g.queue)))
			g.queue = nil
		}
		i.dmu.Unlock()
		i.mu.Unlock()
		i.e.mtracef(1, "%s: multicast join failed for %s: %v", i.Name(), g.mgid.KernelString(), err)
		i.wake() // the task plans the retry (ipoib_mcast_join_complete reschedules)
		return
	}
	g.rec, g.ah, g.backoff, g.tries = rec, ah, 0, 0
	flushQ := g.queue
	g.queue = nil
	i.dmu.Unlock()
	i.e.mtracef(1, "%s: join completed for %s (MLID %#x)", i.Name(), g.mgid.KernelString(), rec.MLID)
	kind := "joined"
	if g.sendOnly {
		kind = "joined send-only"
	}
	i.e.event("%s: %s %s (MLID %#x)", i.Name(), kind, g.mgid.KernelString(), rec.MLID)
	if isBcast {
		old := i.data().mcastMTU
		mcastMTU := rec.MTU.Bytes() - encapLen
		i.setLocked(func(d *dataState) { d.mcastMTU = mcastMTU })
		if i.adminMTU == old {
			i.adminMTU = mcastMTU
		}
		if d := i.data(); d.carrier && d.mode == Datagram {
			// Rejoined after a light flush, carrier still on: the MTU is settled
			// again all the same, as carrier_on_task does at every join.
			act = i.setMTULocked(min(d.mcastMTU, i.adminMTU))
		} else {
			act = i.setCarrierLocked(true)
		}
	}
	i.mu.Unlock()
	if act != nil {
		act()
	}
	i.sendFrames(flushQ, ah, verbs.MulticastQPN)
	i.wake() // the other groups can be joined now
}

// testHookSuperseded, when set by a test, runs just before joinDone releases mu for a
// superseded join (it may take leaveMu, which comes after mu).
var testHookSuperseded func(i *Interface, mgid verbs.GID)

// leaveAll leaves and detaches every group (ipoib_mcast_dev_flush), with carrierOff
// taking the carrier down in the same step (under mu, so that a join completing
// meanwhile cannot turn it on again for a group that is about to go).
func (i *Interface) leaveAll(carrierOff bool) {
	i.mu.Lock()
	i.dmu.Lock()
	groups := i.mcast
	i.mcast, i.sendOnlyN = map[verbs.GID]*mcastGroup{}, 0
	for _, g := range groups {
		i.stats.txDropped.Add(uint64(len(g.queue))) // ipoib_mcast_free's count
	}
	i.dmu.Unlock()
	// The leaves are pending before mu is released: a round of the join task while
	// they are on their way (a flush does not stop the QP) would otherwise join again,
	// and a leave reaching the SA after that join deletes the membership it made.
	var leaving []*mcastGroup
	i.leaveMu.Lock()
	for _, g := range groups {
		if g.ah != nil {
			i.leaveBeginsLocked(g.mgid)
			leaving = append(leaving, g)
		}
	}
	i.leaveMu.Unlock()
	act := func() {}
	if carrierOff {
		act = i.setCarrierLocked(false)
	}
	i.mu.Unlock()
	act()
	// Leaves are waited for (all at once, 3 s at most), so that a rejoin started right
	// after (a flush) cannot reach the SA before a leave and be undone by it. The
	// groups are out of the table: nothing changes them any more.
	for _, g := range groups {
		if g.attached {
			_ = i.qp.DetachMcast(g.mgid, g.rec.MLID)
		}
	}
	var wg sync.WaitGroup
	for _, g := range leaving {
		wg.Add(1)
		go func() { defer wg.Done(); i.leaveMarked(g.mgid, g.leaveState()) }()
	}
	wg.Wait()
}

// dropGroupLocked removes a group from the table, for forget. Called with dmu held.
func (i *Interface) dropGroupLocked(g *mcastGroup, gone *[]*mcastGroup) {
	if g.sendOnly {
		i.sendOnlyN--
	}
	i.stats.txDropped.Add(uint64(len(g.queue))) // frames that waited for its join
	delete(i.mcast, g.mgid)
	*gone = append(*gone, g)
}

// forget detaches the QP from a group out of the table and tells the SA we leave, in
// the background. Called with mu held (nothing else changes a group out of the table:
// joinDone holds mu).
func (i *Interface) forget(g *mcastGroup) {
	if g.attached {
		_ = i.qp.DetachMcast(g.mgid, g.rec.MLID)
	}
	if g.ah != nil {
		i.leaveGroup(g.mgid, g.leaveState())
	}
}

// leaveState is the join state a leave of the group gives up.
func (g *mcastGroup) leaveState() uint8 {
	if g.sendOnly {
		return mad.JoinSendOnlyFull
	}
	return mad.JoinFull
}

// leaveGroup tells the SA we leave (best effort, in the background).
func (i *Interface) leaveGroup(mgid verbs.GID, state uint8) {
	// Tracked, so that closing the interface waits for leaves already on their way
	// (3 s at most each) instead of leaving them running behind it.
	i.leaveMu.Lock()
	defer i.leaveMu.Unlock()
	if i.leavesDone {
		return // closed: stopDev's leaveAll has left every group
	}
	i.leaveBeginsLocked(mgid)
	i.leaves.Add(1)
	go func() {
		defer i.leaves.Done()
		i.leaveMarked(mgid, state)
	}()
}

// leaveMarked sends the leave of a group marked pending (leaveBeginsLocked), then
// clears the mark and wakes the task: a join of the group may be waiting for it.
func (i *Interface) leaveMarked(mgid verbs.GID, state uint8) {
	i.leave(mgid, state)
	i.leaveEnds(mgid)
	i.wake()
}

// leaveBeginsLocked and leaveEnds bracket a leave of mgid on its way to the SA
// (leavePending). leaveBeginsLocked is called with leaveMu held.
func (i *Interface) leaveBeginsLocked(mgid verbs.GID) {
	if i.leaving == nil {
		i.leaving = map[verbs.GID]int{}
	}
	i.leaving[mgid]++
}

func (i *Interface) leaveEnds(mgid verbs.GID) {
	i.leaveMu.Lock()
	defer i.leaveMu.Unlock()
	if i.leaving[mgid]--; i.leaving[mgid] == 0 {
		delete(i.leaving, mgid)
	}
}

// leavePending reports whether a background leave of mgid is on its way to the SA. A
// join of the group waits for it: the SA keeps one membership per port, and a leave
// that arrived after the join would delete the membership the join made.
func (i *Interface) leavePending(mgid verbs.GID) bool {
	i.leaveMu.Lock()
	defer i.leaveMu.Unlock()
	return i.leaving[mgid] > 0
}

// waitLeaves stops new background leaves and waits for those under way.
func (i *Interface) waitLeaves() {
	i.leaveMu.Lock()
	i.leavesDone = true
	i.leaveMu.Unlock()
	i.leaves.Wait()
}

// leave sends the leave and waits for the answer (at most 3 s).
func (i *Interface) leave(mgid verbs.GID, state uint8) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	gid := i.HWAddr().GID()
	_ = i.sa.Leave(ctx, mad.MCMemberRecord{MGID: mgid, PortGID: gid, JoinState: state}, mad.LeaveMask)
	i.e.event("%s: left %s", i.Name(), mgid.KernelString())
}

// sendMulticastLocked sends a frame to a group, creating a send-only membership when
// the group is not joined (the kernel's ipoib_mcast_send). Called with dmu held.
func (i *Interface) sendMulticastLocked(mgid verbs.GID, frame []byte) (verbs.AH, bool) {
	g := i.mcast[mgid]
	if g == nil {
		if i.bcastGroupLocked() == nil || i.bcastGroupLocked().ah == nil {
			i.stats.txDropped.Add(1)
			return nil, false
		}
		if i.sendOnlyN >= maxSendOnly {
			// Each is an SA membership and a join: a flood of sends to new groups
			// (solicitations for spoofed sources, say) must not make one per packet.
			i.stats.txDropped.Add(1)
			return nil, false
		}
		g = &mcastGroup{mgid: mgid, created: i.e.clk.Now(), sendOnly: true}
		i.mcast[mgid] = g
		i.sendOnlyN++
		i.wake()
	}
	g.lastUse = i.e.clk.Now()
	if g.ah != nil {
		return g.ah, true
	}
	if len(g.queue) >= maxMcastQ {
		i.stats.txDropped.Add(1)
		return nil, false
	}
	if g.sendOnly && g.tries >= 2 && !g.joining {
		g.tries = 0 // new traffic restarts the send-only join
		g.retryAt = time.Time{}
		i.wake()
	}
	g.queue = append(g.queue, append([]byte(nil), frame...))
	return nil, false
}
