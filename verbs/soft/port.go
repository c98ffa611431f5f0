package soft

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

// Port is one port of a soft HCA. Lock order: QP.mu before Port.mu (read) before CQ.mu; SA database before SM.
type Port struct {
	hca  *HCA
	num  int
	guid verbs.GUID
	ep   *impaired
	tap  *tap // the raw endpoint under ep, for captures

	mu       sync.RWMutex
	attr     verbs.PortAttr
	pkeys    []verbs.PKey
	smGID    verbs.GID
	routesV  uint64
	uni      map[verbs.LID]ctlRoute
	byAddr   map[netip.AddrPort]ctlRoute
	multi    map[verbs.LID]ctlMRoute
	mgidLID  map[verbs.GID]verbs.LID
	attached map[verbs.GID][]*QP // multicast attachments of this port's QPs
	lastCfg  time.Time
	partial  []*ctlRoutes // the parts of routes version partialV received so far (applyRoutes)
	partialV uint64
	// What the port last said about reaching its subnet manager (see watchSM).
	smLost   bool
	smWarned time.Time
	started  time.Time

	// sm is set when this port hosts the subnet manager: QP0 and SA traffic go to it.
	sm atomic.Pointer[SM]

	gsi gsiAgent

	// auth signs and checks management messages when the fabric has a key (nil: none).
	auth *fabricAuth

	// The receive loop's progress, for the subnet manager's sweep (caughtUp): busy
	// from taking a batch until the endpoint had nothing more queued, drainedAt when
	// it last had nothing.
	rxBusy    atomic.Bool
	drainedAt atomic.Pointer[time.Time] // a time.Time keeps its monotonic reading
	rxHook    atomic.Pointer[func()]    // tests: runs as each batch is taken (a stalled loop)

	cnt struct {
		xmitPkts, rcvPkts, xmitBytes, rcvBytes                        atomic.Uint64
		badPKey, badQKey, malformed, badICRC, noQP, rcvDrop, xmitDisc atomic.Uint64
		authFail                                                      atomic.Uint64
	}
}

func newPort(h *HCA, num int, ep Endpoint) *Port {
	tp := newTap(ep)
	p := &Port{hca: h, num: num, guid: GUIDFromName(h.cfg.Name, num), ep: newImpaired(tp), tap: tp,
		uni: map[verbs.LID]ctlRoute{}, byAddr: map[netip.AddrPort]ctlRoute{},
		multi: map[verbs.LID]ctlMRoute{}, mgidLID: map[verbs.GID]verbs.LID{},
		attached: map[verbs.GID][]*QP{}}
	p.attr = verbs.PortAttr{State: verbs.PortDown, PhysState: verbs.PhysPolling,
		MaxMTU: h.cfg.MaxMTU, ActiveMTU: h.cfg.MaxMTU, Width: h.cfg.Width, LaneMbps: h.cfg.LaneMbps,
		GUID: p.guid, GIDPrefix: verbs.DefaultGIDPrefix, PKeyTabLen: verbs.PKeyTableCapacity,
		LinkLayer: "InfiniBand", Rate: rateFor(h.cfg.Width, h.cfg.LaneMbps)}
	p.gsi.port = p
	p.gsi.pending = map[uint32]pendingCall{}
	if h.cfg.FabricKey != nil {
		p.auth = newFabricAuth(h.cfg.FabricKey, p.guid, nil)
	}
	return p
}

// rateFor maps width x lane speed onto the IBTA rate enum.
func rateFor(width, lane int) verbs.Rate {
	total := width * lane
	best, bestMbps := verbs.Rate(3), 0
	for r := verbs.Rate(2); r <= 24; r++ {
		if m := r.Mbps(); m <= total && m > bestMbps {
			best, bestMbps = r, m
		}
	}
	return best
}

func (p *Port) start() {
	p.ep.Start(p.receive)
	p.hca.wg.Add(1)
	go p.heartbeat()
}

func (p *Port) close() { p.ep.Close() }

func (p *Port) Num() int { return p.num }

// Attr returns a snapshot of the port attributes.
func (p *Port) Attr() verbs.PortAttr {
	p.mu.RLock()
	a := p.attr
	p.mu.RUnlock()
	a.QKeyViolCnt = p.cnt.badQKey.Load()
	a.PKeyViolCnt = p.cnt.badPKey.Load()
	return a
}

// GID returns GID table entry index; the soft HCA has one entry.
func (p *Port) GID(index int) (verbs.GID, error) {
	if index != 0 {
		return verbs.GID{}, &verbs.Error{Op: "query_gid", Obj: p.String(), Err: fmt.Errorf("%w: index %d", verbs.ErrInvalid, index)}
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return verbs.MakeGID(p.attr.GIDPrefix, p.guid), nil
}

func (p *Port) gid0() verbs.GID { return verbs.MakeGID(p.attr.GIDPrefix, p.guid) }

func (p *Port) String() string { return fmt.Sprintf("%s port %d", p.hca.cfg.Name, p.num) }

// pkeyTable returns the P_Key table, not to be changed (Configure replaces it).
func (p *Port) pkeyTable() []verbs.PKey {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.pkeys
}

// PKeyTable returns a copy of the P_Key table.
func (p *Port) PKeyTable() []verbs.PKey {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return slices.Clone(p.pkeys)
}

// FindPKey finds key's index, preferring the same membership.
func (p *Port) FindPKey(key verbs.PKey) (int, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return findPKey(p.pkeys, key)
}

func findPKey(tab []verbs.PKey, key verbs.PKey) (int, bool) {
	partial := -1
	for i, k := range tab {
		if k == key && k.Valid() {
			return i, true
		}
		if k.Valid() && k.Base() == key.Base() && partial < 0 {
			partial = i
		}
	}
	return partial, partial >= 0
}

// Counters returns the port counters.
func (p *Port) Counters() verbs.PortCounters {
	c := &p.cnt
	return verbs.PortCounters{XmitPackets: c.xmitPkts.Load(), RcvPackets: c.rcvPkts.Load(),
		XmitBytes: c.xmitBytes.Load(), RcvBytes: c.rcvBytes.Load(), BadPKey: c.badPKey.Load(),
		BadQKey: c.badQKey.Load(), Malformed: c.malformed.Load(), BadICRC: c.badICRC.Load(),
		NoQP: c.noQP.Load(), RcvDropped: c.rcvDrop.Load(), XmitDiscards: c.xmitDisc.Load(),
		AuthFailures: c.authFail.Load()}
}

// MAD returns the port's QP1 agent.
func (p *Port) MAD() verbs.MADAgent { return &p.gsi }

// ---- control plane (port side) ----

func (p *Port) heartbeat() {
	defer p.hca.wg.Done()
	t := p.hca.cfg.Clock.NewTicker(p.hca.cfg.Heartbeat)
	defer t.Stop()
	p.mu.Lock()
	p.started = p.hca.cfg.Clock.Now()
	p.mu.Unlock()
	for {
		p.sendHello()
		select {
		case <-p.hca.stop:
			return
		case now := <-t.C():
			p.watchSM(now)
		}
	}
}

// The SM answers every hello with the port's configuration. A port that hears nothing
// for smSilenceBeats says so, and again every smWarnBeats while it lasts, as a lost SM
// deserves; the first configuration after that is logged too. The port's
// state stays what the SM last set (an IB port stays ACTIVE when its SM dies), and is
// DOWN until an SM has configured it at all. Both are counted in heartbeats: 2 s and
// 5 s at the default 250 ms.
const (
	smSilenceBeats = 8
	smWarnBeats    = 20
)

// watchSM logs the start of a silence of the subnet manager and, while it lasts, a
// reminder every smWarnBeats.
func (p *Port) watchSM(now time.Time) {
	if p.sm.Load() != nil || p.hca.cfg.Logger == nil {
		return
	}
	p.mu.Lock()
	since := p.lastCfg
	if since.IsZero() {
		since = p.started
	}
	silent := now.Sub(since)
	hb := p.hca.cfg.Heartbeat
	if silent < smSilenceBeats*hb || now.Sub(p.smWarned) < smWarnBeats*hb {
		p.mu.Unlock()
		return
	}
	p.smLost, p.smWarned = true, now
	state, never := p.attr.State, p.lastCfg.IsZero()
	p.mu.Unlock()
	what := "since it started"
	if !never {
		what = "for " + silent.Truncate(time.Second).String()
	}
	p.hca.cfg.Logger.Printf("%s: no answer from the subnet manager at %s %s; port state %s", p, p.hca.cfg.SM, what, state)
}

func (p *Port) sendHello() {
	p.mu.RLock()
	m := ctlHello{NodeGUID: p.hca.guid, PortGUID: p.guid, PortNum: uint8(p.num),
		NumPorts: uint8(len(p.hca.ports)), MaxMTU: p.attr.MaxMTU, Width: uint8(p.attr.Width),
		LaneMbps: uint32(p.attr.LaneMbps), Epoch: p.attr.SMEpoch, RoutesVersion: p.routesV,
		NodeDesc: p.hca.NodeDesc()}
	p.mu.RUnlock()
	body := m.append(putCtlHeader(nil, ctlAttrHello, 0))
	if p.sm.Load() != nil {
		// The SM is on this very port: its hello takes the way of every other
		// (encoded and parsed: the node description cut as on the wire).
		p.handleCtl(p.ep.Addr(), body, p.guid)
		return
	}
	p.sendCtl(p.hca.cfg.SM, 0, body) // 0: whichever port hosts the SM
}

// sendCtl sends a QP0 control message to the port dstGUID at an endpoint, signed when
// the fabric has a key.
func (p *Port) sendCtl(dst netip.AddrPort, dstGUID verbs.GUID, body []byte) {
	if p.auth != nil {
		body = p.auth.seal(body, 0, dstGUID)
	}
	pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(verbs.DefaultPKey), DestQP: 0},
		DETH: wire.DETH{QKey: 0, SrcQP: 0}, Payload: body}
	b := pkt.AppendTo(nil, verbs.GID{}, verbs.GID{})
	_ = p.ep.Send([]Datagram{{dst, b}})
}

// ctlForUs accepts QP0 messages addressed to this port, and to "the SM" (GUID 0) when
// this port hosts it.
func (p *Port) ctlForUs(g verbs.GUID) bool {
	return g == p.guid || (g == 0 && p.sm.Load() != nil)
}

// ctlSigner says whether a control message from src may have been signed by g, checked
// before its sequence is recorded: a hello only by the port it registers, anything
// else (Config, Routes, Delta) only when it comes from the subnet manager this port
// joined. Otherwise a key holder signing as that port or as the subnet manager could
// move their replay windows here (up to authMaxSkew ahead), and their real messages
// would be refused as replays until the clock caught up.
func (p *Port) ctlSigner(src netip.AddrPort) func(verbs.GUID, []byte) bool {
	return func(g verbs.GUID, mad []byte) bool {
		attr, body, err := parseCtl(mad)
		if err != nil {
			return false
		}
		if attr == ctlAttrHello {
			var h ctlHello
			return h.parse(body) == nil && h.PortGUID == g
		}
		return p.sm.Load() == nil && src == p.hca.cfg.SM
	}
}

// AuthFailures counts the management messages this port dropped for want of a valid
// fabric-key MAC (always 0 without a key).
func (p *Port) AuthFailures() uint64 { return p.cnt.authFail.Load() }

// handleCtl takes a control message from the fabric, signed by the port signer when
// the fabric has a key (0 without one); the subnet manager on this port hands its
// own through applyCtl.
func (p *Port) handleCtl(src netip.AddrPort, mad []byte, signer verbs.GUID) {
	attr, body, err := parseCtl(mad)
	if err != nil {
		p.cnt.malformed.Add(1)
		return
	}
	sm := p.sm.Load()
	if attr == ctlAttrHello {
		var h ctlHello
		if err := h.parse(body); err != nil {
			p.cnt.malformed.Add(1)
			return
		}
		if p.auth != nil && h.PortGUID != signer {
			p.cnt.authFail.Add(1) // a key holder does not register as another port
			return
		}
		if sm == nil {
			p.cnt.malformed.Add(1) // hellos are for the subnet manager's port
			return
		}
		sm.handleHello(src, &h)
		return
	}
	// Only the subnet manager we joined may configure us; a port that hosts one
	// takes its configuration from it alone, never from the network (anyone could
	// send it a Config or Routes: its P_Keys, its routes, its faults).
	if sm != nil || src != p.hca.cfg.SM {
		p.cnt.malformed.Add(1)
		return
	}
	p.applyCtlBody(attr, body)
}

// applyCtl applies a Config, Routes or Delta message from the subnet manager.
func (p *Port) applyCtl(mad []byte) {
	attr, body, err := parseCtl(mad)
	if err != nil {
		p.cnt.malformed.Add(1)
		return
	}
	p.applyCtlBody(attr, body)
}

// applyCtlBody applies the body of a control message with attribute attr.
func (p *Port) applyCtlBody(attr uint16, body []byte) {
	switch attr {
	case ctlAttrConfig:
		var c ctlConfig
		if err := c.parse(body); err != nil {
			p.cnt.malformed.Add(1)
			return
		}
		p.applyConfig(&c)
	case ctlAttrRoutes:
		var r ctlRoutes
		if err := r.parse(body); err != nil {
			p.cnt.malformed.Add(1)
			return
		}
		p.applyRoutes(&r)
	case ctlAttrDelta:
		var d ctlRoutesDelta
		if err := d.parse(body); err != nil {
			p.cnt.malformed.Add(1)
			return
		}
		p.applyDelta(&d)
	default:
		p.cnt.malformed.Add(1)
	}
}

func (p *Port) applyConfig(c *ctlConfig) {
	var evs []verbs.EventType
	p.mu.Lock()
	a := &p.attr
	now := p.hca.cfg.Clock.Now()
	silent, wasLost := now.Sub(p.lastCfg), p.smLost
	if p.lastCfg.IsZero() {
		silent = now.Sub(p.started)
	}
	p.lastCfg, p.smLost, p.smWarned = now, false, time.Time{}
	wasActive := a.State == verbs.PortActive
	if a.LID != c.LID && a.LID != 0 {
		evs = append(evs, verbs.EventLIDChange)
	}
	if a.SMLID != c.SMLID && a.SMLID != 0 || (a.SMEpoch != c.SMEpoch && a.SMEpoch != 0) {
		evs = append(evs, verbs.EventSMChange)
	}
	if !slices.Equal(p.pkeys, c.PKeys) {
		// The first programming is a change too: the table was empty before.
		evs = append(evs, verbs.EventPKeyChange)
	}
	if c.Reregister && a.SMEpoch != c.SMEpoch && a.SMEpoch != 0 {
		evs = append(evs, verbs.EventClientReregister)
	}
	if a.GIDPrefix != c.GIDPrefix {
		evs = append(evs, verbs.EventGIDChange)
	}
	a.LID, a.SMLID, a.SMEpoch, a.GIDPrefix = c.LID, c.SMLID, c.SMEpoch, c.GIDPrefix
	a.ActiveMTU = min(c.ActiveMTU, a.MaxMTU)
	if c.Rate.Valid() {
		a.Rate = c.Rate
	}
	p.smGID = c.SMGID
	p.pkeys = slices.Clone(c.PKeys)
	a.State = c.State
	if a.State == verbs.PortActive {
		a.PhysState = verbs.PhysLinkUp
	} else if a.State == verbs.PortDown {
		a.PhysState = verbs.PhysPolling // a link fault: no link, as with the cable out
	}
	nowActive := a.State == verbs.PortActive
	p.mu.Unlock()
	if wasLost && p.hca.cfg.Logger != nil {
		p.hca.cfg.Logger.Printf("%s: the subnet manager at %s answers after %s: LID %#x, SM LID %#x, state %s",
			p, p.hca.cfg.SM, silent.Truncate(time.Millisecond), c.LID, c.SMLID, c.State)
	}
	if nowActive && !wasActive {
		evs = append([]verbs.EventType{verbs.EventPortActive}, evs...)
	}
	if !nowActive && wasActive {
		evs = append([]verbs.EventType{verbs.EventPortErr}, evs...)
	}
	for _, e := range evs {
		p.hca.event(e, p.num)
	}
}

// applyRoutes takes one routes message. Tables in several parts are applied once every
// part of one version is here; a part of a newer version drops an unfinished older
// one. A lost part leaves the port's routes version behind, which its next hello
// tells the SM, and the SM sends the tables again.
func (p *Port) applyRoutes(r *ctlRoutes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.Parts > 1 {
		if p.partial == nil || p.partialV != r.Version || len(p.partial) != int(r.Parts) {
			p.partial, p.partialV = make([]*ctlRoutes, r.Parts), r.Version
		}
		p.partial[r.Part] = r
		whole := ctlRoutes{Version: r.Version, Faults: r.Faults}
		for _, part := range p.partial {
			if part == nil {
				return // more to come
			}
			whole.Uni = append(whole.Uni, part.Uni...)
			whole.Multi = append(whole.Multi, part.Multi...)
		}
		p.partial, r = nil, &whole
	}
	p.routesV = r.Version
	p.uni = make(map[verbs.LID]ctlRoute, len(r.Uni))
	p.byAddr = make(map[netip.AddrPort]ctlRoute, len(r.Uni))
	for _, u := range r.Uni {
		p.uni[u.LID] = u
	}
	for _, u := range r.Uni {
		// A LID listed twice keeps its last route: the address of an earlier one
		// must not lead to it (source() would take that sender as the LID).
		if p.uni[u.LID] == u {
			p.byAddr[u.Addr] = u
		}
	}
	p.multi = make(map[verbs.LID]ctlMRoute, len(r.Multi))
	p.mgidLID = make(map[verbs.GID]verbs.LID, len(r.Multi))
	for _, m := range r.Multi {
		p.multi[m.MLID] = m
		p.mgidLID[m.MGID] = m.MLID
	}
	p.ep.set(r.Faults)
}

// applyDelta takes the changes from routes version d.From to the next, when the
// port's tables are of version d.From; otherwise it keeps them, and its next hello
// shows the SM that it needs the whole tables. Sets and removals are absolute, so
// applying them to tables that already hold some of the changes gives the same.
func (p *Port) applyDelta(d *ctlRoutesDelta) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.routesV != d.From {
		return
	}
	dropAddr := func(r ctlRoute) { // only if the address is still r's (another LID may have it now)
		if cur, ok := p.byAddr[r.Addr]; ok && cur.LID == r.LID {
			delete(p.byAddr, r.Addr)
		}
	}
	dropMGID := func(m ctlMRoute) {
		if cur, ok := p.mgidLID[m.MGID]; ok && cur == m.MLID {
			delete(p.mgidLID, m.MGID)
		}
	}
	for _, l := range d.DelUni {
		if r, ok := p.uni[l]; ok {
			dropAddr(r)
			delete(p.uni, l)
		}
	}
	for _, l := range d.DelMulti {
		if m, ok := p.multi[l]; ok {
			dropMGID(m)
			delete(p.multi, l)
		}
	}
	for _, u := range d.Routes.Uni {
		if old, ok := p.uni[u.LID]; ok {
			dropAddr(old)
		}
		p.uni[u.LID] = u
	}
	for _, u := range d.Routes.Uni { // after every old address went: a set may take another's
		if p.uni[u.LID] == u { // a LID set twice: its last route only
			p.byAddr[u.Addr] = u
		}
	}
	for _, m := range d.Routes.Multi {
		if old, ok := p.multi[m.MLID]; ok {
			dropMGID(old)
		}
		p.multi[m.MLID] = m
	}
	for _, m := range d.Routes.Multi {
		p.mgidLID[m.MGID] = m.MLID
	}
	p.routesV = d.Routes.Version
	p.ep.set(d.Routes.Faults)
}

// ---- data plane: receive ----

const grhLen = 40

// caughtUp is the time up to which every datagram that reached the port has been
// handled: now while the receive loop waits for more, else the last moment it had
// nothing queued.
func (p *Port) caughtUp(now time.Time) time.Time {
	if !p.rxBusy.Load() {
		return now
	}
	if t := p.drainedAt.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

func (p *Port) receive(batch []Datagram, drained bool) {
	p.rxBusy.Store(true)
	if h := p.rxHook.Load(); h != nil {
		(*h)()
	}
	if drained {
		// Nothing was queued behind this batch when it was taken: once it is handled,
		// so is everything that arrived before then. (Between this and the next batch
		// the loop counts as idle for a moment while the next may be queued: far
		// below the heartbeats the sweep counts in.)
		taken := p.hca.cfg.Clock.Now()
		defer func() {
			p.drainedAt.Store(&taken)
			p.rxBusy.Store(false)
		}()
	}
	var pkt wire.Packet
	var rc rcTouched      // RC QPs to flush (ACKs, transmission) after the batch
	var ic wire.ICRCCache // a batch's packets mostly come from one peer at one size
	var cb cqBatch        // CQs whose handlers run after the batch
	v := rxView{p: p}
	for _, d := range batch {
		if err := wire.Parse(d.Data, &pkt); err != nil {
			p.cnt.malformed.Add(1)
			continue
		}
		p.cnt.rcvPkts.Add(1)
		p.cnt.rcvBytes.Add(uint64(len(d.Data)))
		if wire.IsRC(pkt.BTH.Opcode) {
			p.receiveRC(d, &pkt, &v, &rc, &ic, &cb)
			continue
		}
		switch dqp := verbs.QPN(pkt.BTH.DestQP); dqp {
		case verbs.SMIQPN:
			if !wire.CheckICRC(d.Data, verbs.GID{}, verbs.GID{}) {
				p.cnt.badICRC.Add(1)
				continue
			}
			mad, signer := pkt.Payload, verbs.GUID(0)
			if p.auth != nil {
				var err error
				if mad, signer, err = p.auth.open(mad, 0, p.ctlForUs, p.ctlSigner(d.Addr)); err != nil {
					p.cnt.authFail.Add(1)
					continue
				}
			}
			p.handleCtl(d.Addr, mad, signer)
			v = rxView{p: p} // the SM may have changed the tables the view holds
		case verbs.MulticastQPN:
			p.receiveMulticast(d, &pkt, &v, &cb)
		default:
			p.receiveUnicast(d, &pkt, dqp, &v, &ic, &cb)
		}
	}
	rc.flush()
	cb.flush()
}

// rxView is what the packets of one received batch look up under the port's and the
// HCA's locks, taken at most once per batch where each packet took them (five
// read-locks a datagram, about 5% of a receiving daemon's CPU at full rate): the
// port's GID and P_Key table, the last source endpoint's route and the last
// destination QP. A table that another goroutine changes while a batch is handled
// applies from the next batch, as a packet that arrived a moment earlier would have
// seen the old one; the view starts again after a message of the SM in the batch and
// after a wait for a receive buffer (up to rqWait, time for anything to change); a QP
// closed meanwhile is looked up again.
type rxView struct {
	p *Port

	portSet bool
	dgid    verbs.GID
	pkeys   []verbs.PKey // copy-on-write: never changed in place

	srcSet  bool
	srcAddr netip.AddrPort
	src     ctlRoute
	srcOK   bool

	qpn verbs.QPN
	q   *QP // nil: none asked for yet
}

// port returns the port's GID 0 and P_Key table.
func (v *rxView) port() (verbs.GID, []verbs.PKey) {
	if !v.portSet {
		v.p.mu.RLock()
		v.dgid, v.pkeys = v.p.gid0(), v.p.pkeys
		v.p.mu.RUnlock()
		v.portSet = true
	}
	return v.dgid, v.pkeys
}

// source is Port.source, remembering the last endpoint asked for.
func (v *rxView) source(addr netip.AddrPort) (ctlRoute, bool) {
	if !v.srcSet || addr != v.srcAddr {
		v.src, v.srcOK = v.p.source(addr)
		v.srcAddr, v.srcSet = addr, true
	}
	return v.src, v.srcOK
}

// qp is HCA.qp, remembering the last QP found.
func (v *rxView) qp(n verbs.QPN) *QP {
	if v.q == nil || n != v.qpn || v.q.closed.Load() {
		v.q, v.qpn = v.p.hca.qp(n), n
	}
	return v.q
}

// source looks up the sending port by its endpoint.
func (p *Port) source(addr netip.AddrPort) (ctlRoute, bool) {
	p.mu.RLock()
	r, ok := p.byAddr[addr]
	p.mu.RUnlock()
	if !ok {
		if sm := p.sm.Load(); sm != nil {
			return sm.routeByAddr(addr)
		}
	}
	return r, ok
}

func (p *Port) receiveUnicast(d Datagram, pkt *wire.Packet, dqp verbs.QPN, v *rxView, ic *wire.ICRCCache, cb *cqBatch) {
	src, ok := v.source(d.Addr)
	if !ok {
		p.cnt.malformed.Add(1)
		return
	}
	dgid, pkeys := v.port()
	if !ic.CheckICRC(d.Data, src.GID, dgid) {
		p.cnt.badICRC.Add(1)
		return
	}
	pk := verbs.PKey(pkt.BTH.PKey)
	if dqp == verbs.GSIQPN {
		// QP1 accepts any P_Key in the table.
		idx, ok := findPKey(pkeys, pk)
		if !ok || !pkeys[idx].CanTalk(pk) {
			p.cnt.badPKey.Add(1)
			return
		}
		if pkt.DETH.QKey != verbs.GSIQKey {
			p.cnt.badQKey.Add(1)
			return
		}
		mad := pkt.Payload
		if p.auth != nil {
			// Signed by the port the source address belongs to: a key holder does
			// not act as another port (an SA delete of its memberships).
			var signer verbs.GUID
			var err error
			srcGUID := guidOf(src.GID)
			if mad, signer, err = p.auth.open(mad, 1, func(g verbs.GUID) bool { return g == p.guid },
				func(g verbs.GUID, _ []byte) bool { return g == srcGUID }); err != nil || signer != srcGUID {
				p.cnt.authFail.Add(1)
				return
			}
		}
		p.gsi.receive(src, verbs.QPN(pkt.DETH.SrcQP), mad)
		return
	}
	q := v.qp(dqp)
	if q == nil || q.port != p {
		p.cnt.noQP.Add(1)
		return
	}
	if q.deliver(pkt, src, dgid, pkeys, cb) {
		*v = rxView{p: p}
	}
}

func (p *Port) receiveMulticast(d Datagram, pkt *wire.Packet, v *rxView, cb *cqBatch) {
	src, ok := v.source(d.Addr)
	if !ok {
		p.cnt.malformed.Add(1)
		return
	}
	p.mu.RLock()
	cands := make([]verbs.GID, 0, len(p.attached))
	for g := range p.attached {
		cands = append(cands, g)
	}
	p.mu.RUnlock()
	i := wire.MatchICRC(d.Data, src.GID, cands)
	if i < 0 {
		p.cnt.badICRC.Add(1) // not for a group this port attached, or corrupted
		return
	}
	p.mu.RLock()
	qps := slices.Clone(p.attached[cands[i]])
	pkeys := p.pkeys
	p.mu.RUnlock()
	for _, q := range qps {
		q.deliver(pkt, src, cands[i], pkeys, cb)
	}
}

// ---- data plane: send helpers ----

// resolve returns the endpoints and destination GID for a DLID.
func (p *Port) resolve(dlid verbs.LID, dst []Datagram) ([]Datagram, verbs.GID, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if dlid.IsMulticast() {
		m, ok := p.multi[dlid]
		if !ok {
			return dst, verbs.GID{}, false
		}
		for _, l := range m.Members {
			if r, ok := p.uni[l]; ok {
				dst = append(dst, Datagram{Addr: r.Addr})
			}
		}
		return dst, m.MGID, true
	}
	r, ok := p.uni[dlid]
	if !ok {
		return dst, verbs.GID{}, false
	}
	return append(dst, Datagram{Addr: r.Addr}), r.GID, true
}
