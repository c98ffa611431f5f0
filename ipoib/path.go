package ipoib

import (
	"net/netip"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// path is a unicast path record and its address handle (struct ipoib_path).
type path struct {
	dgid     verbs.GID
	rec      mad.PathRecord
	ah       verbs.AH
	querying bool
	queue    []queuedFrame
	retryAt  time.Time
}

type queuedFrame struct {
	frame []byte
	qpn   verbs.QPN
}

// neigh maps an IP address to a hardware address (the kernel's neighbour table does
// this for ib_ipoib; a TUN device has none, so the engine keeps it).
type neigh struct {
	hw      HWAddr
	valid   bool
	queue   [][]byte // frames waiting for resolution
	tries   int
	solicit time.Time // next ARP/NS due
	updated time.Time
	used    bool  // sent to since the last GC round
	idle    uint8 // GC rounds in a row it was not used in
}

// sendUnicastLocked resolves dst and returns where to send the frame, or queues it
// (copying it) while the neighbour, path or connection is being resolved.
func (i *Interface) sendUnicastLocked(dst netip.Addr, frame [][]byte, size int) (outFrame, bool) {
	n := i.neigh[dst]
	if n == nil {
		if !i.neighRoomLocked(true) {
			i.stats.txDropped.Add(1)
			return outFrame{}, false
		}
		n = &neigh{}
		i.neigh[dst] = n
		i.pending[dst] = n
		i.wake()
	}
	n.used = true
	if !n.valid {
		if len(n.queue) >= maxPathQ {
			i.stats.txDropped.Add(1)
			return outFrame{}, false
		}
		n.queue = append(n.queue, joinFrame(frame))
		return outFrame{}, false
	}
	return i.sendToPeerLocked(n.hw, frame, size)
}

// sendToPeerLocked picks the transport for a unicast frame of size bytes (IPoIB header
// included): the RC connection in connected mode when the peer accepts it, else UD,
// where a frame above the broadcast group's MTU is dropped and answered with ICMP.
func (i *Interface) sendToPeerLocked(hw HWAddr, frame [][]byte, size int) (outFrame, bool) {
	if t, queued, ok := i.cmRouteLocked(hw, frame); ok {
		if queued {
			return outFrame{}, false
		}
		if size > t.mtu {
			i.tooLongLocked(frame)
			return outFrame{}, false
		}
		return outFrame{tx: t, frame: frame, size: size}, true
	}
	if size-encapLen > i.data().mcastMTU {
		i.tooLongLocked(frame)
		return outFrame{}, false
	}
	ah, qpn, ok := i.sendToHWLocked(hw, frame)
	return outFrame{ah: ah, qpn: qpn, frame: frame, size: size}, ok
}

// tooLongLocked drops a frame too long for its path and queues the ICMP error for the
// local sender (ipoib_cm_skb_too_long: the MTU reported is always the group's).
func (i *Interface) tooLongLocked(frame [][]byte) {
	i.stats.txDropped.Add(1)
	i.stats.txErrors.Add(1)
	if m := tooBig(joinFrame(frame)[encapLen:], i.data().mcastMTU); m != nil {
		i.icmpOut = append(i.icmpOut, m)
	}
}

// deliverICMP hands ICMP errors taken from icmpOut to the host. Called with no lock.
func (i *Interface) deliverICMP(m [][]byte) {
	if len(m) == 0 {
		return
	}
	if h := i.upperHost(); h != nil {
		h.Deliver(m)
	}
}

// sendToHWLocked returns the path's AH for hw, or queues the frame and starts a path
// record query.
func (i *Interface) sendToHWLocked(hw HWAddr, frame [][]byte) (verbs.AH, verbs.QPN, bool) {
	p := i.paths[hw.GID()]
	if p == nil {
		if len(i.paths) >= maxPaths && (!i.forceGCLocked() || len(i.paths) >= maxPaths) {
			i.stats.txDropped.Add(1)
			return nil, 0, false
		}
		p = &path{dgid: hw.GID()}
		i.paths[p.dgid] = p
		i.wake() // the GC round runs while there are paths
	}
	if p.ah != nil {
		return p.ah, hw.QPN(), true
	}
	// Frames wait only behind a query under way, as in the driver: until a failed
	// query's retry time, nothing would send or drop them.
	if len(p.queue) >= maxPathQ || !p.querying && i.e.clk.Now().Before(p.retryAt) {
		i.stats.txDropped.Add(1)
		return nil, 0, false
	}
	p.queue = append(p.queue, queuedFrame{joinFrame(frame), hw.QPN()})
	if !p.querying {
		i.startPathQueryLocked(p)
	}
	return nil, 0, false
}

// startPathQueryLocked asks the SA for a path record (ipoib_path_lookup): DGID, SGID,
// NumbPath 1, the broadcast group's TClass and our P_Key, 1 s timeout.
func (i *Interface) startPathQueryLocked(p *path) {
	p.querying = true
	sgid := i.hw.GID()
	pkey := i.data().pkey
	var tclass uint8
	if bg := i.bcastGroupLocked(); bg != nil {
		tclass = bg.rec.TClass
	}
	i.wg.Add(1)
	go func() {
		defer i.wg.Done()
		ctx := i.ctx
		rec, err := i.sa.PathRecord(ctx, sgid, p.dgid, pkey, tclass)
		i.pathDone(p, rec, err)
	}()
}

func (i *Interface) pathDone(p *path, rec mad.PathRecord, err error) {
	var ah verbs.AH
	if err == nil {
		ah, err = i.e.dev.CreateAH(i.pathAHAttr(p.dgid, rec))
	}
	i.dmu.Lock()
	p.querying = false
	if i.paths[p.dgid] != p {
		i.dmu.Unlock()
		return // flushed meanwhile
	}
	q := p.queue
	p.queue = nil
	if err != nil {
		i.e.tracef(1, "%s: path record query for %s failed: %v", i.Name(), p.dgid.KernelString(), err)
		p.retryAt = i.e.clk.Now().Add(i.e.tm.Load().pathRetry)
		i.stats.txDropped.Add(uint64(len(q)))
		// Its neighbours are given up (ipoib_del_neighs_by_gid): the next packet
		// resolves the address again.
		for ip, n := range i.neigh {
			if n.hw.GID() == p.dgid {
				i.stats.txDropped.Add(uint64(len(n.queue)))
				i.dropNeighLocked(ip)
			}
		}
		i.dmu.Unlock()
		return
	}
	p.rec, p.ah = rec, ah
	i.dmu.Unlock()
	i.e.event("%s: path to %s resolved (LID %#x)", i.Name(), p.dgid.KernelString(), rec.DLID)
	for _, f := range q {
		i.sendFrames([][]byte{f.frame}, ah, f.qpn)
	}
}

// flushPathsLocked forgets every path (ipoib_flush_paths); neighbours keep their
// hardware addresses and re-resolve the path on the next packet.
func (i *Interface) flushPathsLocked() {
	if len(i.paths) > 0 {
		i.e.event("%s: %d paths flushed", i.Name(), len(i.paths))
	}
	for _, p := range i.paths {
		i.stats.txDropped.Add(uint64(len(p.queue)))
	}
	i.paths = map[verbs.GID]*path{}
}

// learnLocked records ip -> hw and flushes frames waiting for it.
func (i *Interface) learnLocked(ip netip.Addr, hw HWAddr) (flush [][]byte) {
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || hw.IsMulticast() {
		return nil
	}
	n := i.neigh[ip]
	if n == nil {
		if !i.neighRoomLocked(false) {
			return nil
		}
		n = &neigh{}
		i.neigh[ip] = n
		i.wake() // the GC round runs while there are neighbours
	}
	if n.valid && n.hw != hw {
		// The peer changed its address (restart, new QPN): its old path is stale too,
		// and so is a connection to the old address (the GC round ends it).
		delete(i.paths, n.hw.GID())
	}
	delete(i.pending, ip)
	n.hw, n.valid, n.tries, n.updated, n.idle = hw, true, 0, i.e.clk.Now(), 0
	flush, n.queue = n.queue, nil
	return flush
}

// dropNeighLocked forgets a neighbour.
func (i *Interface) dropNeighLocked(ip netip.Addr) {
	delete(i.neigh, ip)
	delete(i.pending, ip)
}

// neighRoomLocked reports whether the table takes one more neighbour (unresolved:
// one being resolved), after a forced GC round if it is full.
func (i *Interface) neighRoomLocked(unresolved bool) bool {
	if unresolved && len(i.pending) >= maxUnresolved {
		return false
	}
	return len(i.neigh) < maxNeigh || i.forceGCLocked() && len(i.neigh) < maxNeigh
}

// forceGCLocked runs a GC round early because a table is full, at most once a second
// (the kernel's forced neigh_forced_gc is rate-limited the same way), and reports
// whether it ran.
func (i *Interface) forceGCLocked() bool {
	now := i.e.clk.Now()
	if now.Sub(i.forcedAt) < time.Second {
		return false
	}
	i.forcedAt = now
	i.e.event("%s: neighbour table full (%d neighbours, %d paths): collecting idle ones", i.Name(), len(i.neigh), len(i.paths))
	// The connections end in the task's next round: ending one takes dmu, which the
	// caller holds.
	i.txGone = append(i.txGone, i.gcLocked(true)...)
	if len(i.txGone) > 0 {
		i.wake()
	}
	return true
}

// gcLocked is a round of the neighbour GC (__ipoib_reap_neigh): a resolved neighbour
// not sent to in two rounds in a row (forced: in the last round) is forgotten, and
// with the last neighbour that uses them, a path and a connected-mode connection
// (ipoib_neigh_dtor's ipoib_cm_destroy_tx); a path still being queried or holding
// frames stays. It returns the connections to end, after unlocking.
func (i *Interface) gcLocked(forced bool) []*cmTx {
	for ip, n := range i.neigh {
		if !n.valid {
			continue // the resolution's retries give it up
		}
		if n.used {
			n.used, n.idle = false, 0
			continue
		}
		if n.idle++; n.idle >= 2 || forced {
			i.stats.txDropped.Add(uint64(len(n.queue)))
			i.dropNeighLocked(ip)
		}
	}
	hws := make(map[HWAddr]bool, len(i.neigh))
	gids := make(map[verbs.GID]bool, len(i.neigh))
	for _, n := range i.neigh {
		if n.valid {
			hws[n.hw], gids[n.hw.GID()] = true, true
		}
	}
	for g, p := range i.paths {
		if !gids[g] && !p.querying && len(p.queue) == 0 {
			delete(i.paths, g)
		}
	}
	var txs []*cmTx
	for hw, t := range i.tx {
		if !hws[hw] {
			delete(i.tx, hw)
			i.dropTxQueueLocked(t)
			txs = append(txs, t)
		}
	}
	return txs
}

// flushNeighLocked forgets every neighbour, dropping the frames that wait for one.
func (i *Interface) flushNeighLocked() {
	for _, n := range i.pending {
		i.stats.txDropped.Add(uint64(len(n.queue)))
	}
	clear(i.neigh)
	clear(i.pending)
}

// resend sends frames that waited for a neighbour now resolved to hw.
func (i *Interface) resend(hw HWAddr, frames [][]byte) { i.resendVia(hw, frames, false) }

// resendVia is resend, over UD alone when ud is set (the frames of a connection that
// failed: through the connected route they would start another, and fail again).
func (i *Interface) resendVia(hw HWAddr, frames [][]byte, ud bool) {
	if len(frames) == 0 {
		return
	}
	out := make([]outFrame, 0, len(frames))
	i.dmu.Lock()
	for _, f := range frames {
		if ud {
			if ah, qpn, ok := i.sendToHWLocked(hw, [][]byte{f}); ok {
				out = append(out, outFrame{ah: ah, qpn: qpn, frame: [][]byte{f}, size: len(f)})
			}
		} else if o, ok := i.sendToPeerLocked(hw, [][]byte{f}, len(f)); ok {
			out = append(out, o)
		}
	}
	icmp := i.icmpOut
	i.icmpOut = nil
	i.dmu.Unlock()
	i.tx0.mu.Lock()
	i.post(&i.tx0, out)
	i.tx0.mu.Unlock()
	i.deliverICMP(icmp)
}

// neighRound sends due ARP requests / neighbour solicitations and gives up on
// neighbours that never answered.
func (i *Interface) neighRound() time.Duration {
	now := i.e.clk.Now()
	next := time.Hour
	type sol struct {
		ip netip.Addr
	}
	var due []sol
	tm := i.e.tm.Load()
	i.dmu.Lock()
	txs := i.txGone
	i.txGone = nil
	switch {
	case len(i.neigh) == 0 && len(i.paths) == 0 && len(i.tx) == 0:
		i.gcAt = time.Time{}
	case i.gcAt.IsZero():
		i.gcAt = now.Add(tm.neighGC)
	case !now.Before(i.gcAt):
		txs = append(txs, i.gcLocked(false)...)
		i.gcAt = now.Add(tm.neighGC)
	}
	if !i.gcAt.IsZero() {
		next = min(next, i.gcAt.Sub(now))
	}
	active := i.data().up && i.data().carrier
	for ip, n := range i.pending {
		if !active {
			break
		}
		if len(n.queue) == 0 && n.tries == 0 {
			continue
		}
		if now.Before(n.solicit) {
			next = min(next, n.solicit.Sub(now))
			continue
		}
		if n.tries >= arpRetries {
			i.stats.txDropped.Add(uint64(len(n.queue)))
			i.dropNeighLocked(ip)
			continue
		}
		n.tries++
		n.solicit = now.Add(tm.arpInterval)
		next = min(next, tm.arpInterval)
		due = append(due, sol{ip})
	}
	i.dmu.Unlock()
	for _, t := range txs {
		i.cmTxDestroy(t)
	}
	for _, s := range due {
		if s.ip.Is4() {
			i.sendARPRequest(s.ip)
		} else {
			i.sendNS(s.ip)
		}
	}
	return next
}
