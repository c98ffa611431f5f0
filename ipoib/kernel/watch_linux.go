//go:build linux

package kernel

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What changed on a device, as the namespace monitor saw it.
const (
	dirtyLink = 1 << iota
	dirtyAddrs
	dirtyGroups
	dirtyGone
	dirtyMoved  // to another network namespace
	dirtyResync // marked after a (re)subscription: a message may have been lost
)

// watcher is one Watch call: its events, what is pending, and what it last reported.
// No goroutine waits for a watcher's changes: mark starts one when there are some,
// and it ends when none are left (a goroutine per device was most of what thousands
// of idle children cost). running is held by the one goroutine that may run its
// events, so they stay sequential; the fields below it are that goroutine's.
type watcher struct {
	ev      Events
	dirty   atomic.Uint32
	running atomic.Bool

	link   Link
	addrs  []netip.Prefix
	groups []netip.Addr
	seen   uint32 // which of the three have been reported once
	held   uint32 // address and group reads put off while the device is down
}

// mark records changes for every watcher of d and wakes them.
func (d *Device) mark(bits uint32) {
	d.wmuW.Lock()
	ws := d.watches
	d.wmuW.Unlock()
	for _, w := range ws {
		w.dirty.Or(bits)
		d.kickWatch(w)
	}
}

// kickWatch starts w's goroutine unless it runs, or the device is closing.
func (d *Device) kickWatch(w *watcher) {
	if !w.running.CompareAndSwap(false, true) {
		return
	}
	d.wmuW.Lock()
	if d.watchOff {
		d.wmuW.Unlock()
		return // running stays set: nothing runs for w again
	}
	d.watchers.Add(1) // before Close's Wait, which comes after watchOff
	d.wmuW.Unlock()
	go d.runWatch(w)
}

// Alias reads the device's alias from the kernel now. `ip link set alias` on a device
// that is down announces nothing (the kernel tells of a state change only for an up
// device), so no watch sees it: a reader of ifalias asks here, and an alias someone
// else set is then reported to the watches as the announcement would have been.
func (d *Device) Alias() (string, error) {
	var s string
	err := d.control(func() error {
		nl, err := d.h.LinkByIndex(d.index)
		if err != nil {
			return d.errorf("read link: %w", err)
		}
		s = nl.Attrs().Alias
		return nil
	})
	if err != nil {
		return "", err
	}
	d.setMu.Lock()
	changed := s != d.alias
	d.setMu.Unlock()
	if changed {
		d.mark(dirtyLink)
	}
	return s, nil
}

// RefreshGroups re-reads the device's multicast list soon. The kernel gives no netlink
// event for every join and leave, but it sends an IGMP or MLD report for each, so the
// caller calls this when it sees one go out of the device.
func (d *Device) RefreshGroups() { d.mark(dirtyGroups) }

// Watch reports the device's changes to ev's functions, first its current state and
// then each change, until Close. Calls of one Watch are sequential and only report
// values that differ from the last ones reported. The functions must not call Close or
// Delete.
//
// A watch that follows the link (ev.Link) reads addresses and groups only while the
// device is up, and reads them when it comes up: both are read from lists of the
// whole namespace (an address dump, /proc/net/igmp6), so reading them for every new
// device made creating the thousandth child cost a thousand times the first, and an
// interface that is down uses neither.
func (d *Device) Watch(ev Events) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return
	}
	w := &watcher{ev: ev}
	d.wmuW.Lock()
	d.watches = append(slices.Clone(d.watches), w)
	d.wmuW.Unlock()
	// Or, not Store: a mark since w joined the list (a deletion: dirtyGone) must stay.
	w.dirty.Or(dirtyLink | dirtyAddrs | dirtyGroups)
	d.kickWatch(w)
}

// WatchAddrs calls fn with the full address list of the device, first with the current
// list and then whenever it changes, until the device is closed. Calls of one watch are
// sequential; no call happens after Close returns. fn must not call Close or Delete.
func (d *Device) WatchAddrs(fn func([]netip.Prefix)) { d.Watch(Events{Addrs: fn}) }

func (d *Device) runWatch(w *watcher) {
	defer d.watchers.Done()
	for {
		select {
		case <-d.done:
			return
		default:
		}
		bits := w.dirty.Swap(0)
		if bits == 0 {
			w.running.Store(false)
			// A mark between the Swap and the Store saw w running and started nothing:
			// take its changes, unless a goroutine it started has.
			if w.dirty.Load() == 0 || !w.running.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		if !d.report(w, bits) {
			return // gone: running stays set
		}
	}
}

// report calls w's events for what bits say changed; false once the device is gone.
func (d *Device) report(w *watcher, bits uint32) bool {
	closing := func() bool {
		select {
		case <-d.done:
			return true
		default:
			return false
		}
	}
	// Moved to another namespace (ip link set DEV netns X; or, its message lost in an
	// overrun, a link that cannot be read while the device is still registered): put
	// back. Only after a resubscription is the link looked up for that.
	if bits&dirtyMoved != 0 || bits&dirtyResync != 0 && bits&dirtyGone == 0 && !d.unregistered() && d.linkMissing() {
		if closing() {
			return false
		}
		err := d.moveBack()
		if w.ev.Moved != nil {
			w.ev.Moved(err)
		}
		if err != nil {
			bits |= dirtyGone // what cannot be put back is lost to the engine
		} else {
			// The move took the device's addresses and groups: what it has now is
			// reported even if it equals the last report (both empty when the move
			// came before the first address), so that the user puts back what is kept.
			bits |= dirtyLink | dirtyAddrs | dirtyGroups
			w.seen &^= dirtyAddrs | dirtyGroups
		}
	}
	// Gone: the monitor saw it go, or its descriptor says the kernel unregistered it
	// (a deletion whose message the monitor lost to an overrun, after which it marks
	// every device's link: the index may already name another device by then).
	if bits&dirtyGone != 0 || d.unregistered() {
		if !closing() && w.ev.Gone != nil {
			w.ev.Gone()
		}
		return false
	}
	if bits&dirtyLink != 0 && w.ev.Link != nil {
		// A change someone else made is reported even when the state equals the last
		// report: ours may have come between (promisc on, our off, theirs on again).
		if l, err := d.linkState(); err == nil && (w.seen&dirtyLink == 0 || l != w.link || l.outsideChange()) && !closing() {
			w.link, w.seen = l, w.seen|dirtyLink
			w.ev.Link(l)
		}
	}
	if w.ev.Link != nil && w.seen&dirtyLink != 0 {
		if w.link.Up {
			bits, w.held = bits|w.held, 0
		} else {
			w.held |= bits & (dirtyAddrs | dirtyGroups)
			bits &^= dirtyAddrs | dirtyGroups
		}
	}
	if bits&dirtyAddrs != 0 && w.ev.Addrs != nil {
		if l, err := d.Addrs(); err == nil && (w.seen&dirtyAddrs == 0 || !slices.Equal(l, w.addrs)) && !closing() {
			w.addrs, w.seen = l, w.seen|dirtyAddrs
			w.ev.Addrs(slices.Clone(l))
		}
	}
	if bits&dirtyGroups != 0 && w.ev.Groups != nil {
		if l, err := d.Groups(); err == nil && (w.seen&dirtyGroups == 0 || !slices.Equal(l, w.groups)) && !closing() {
			w.groups, w.seen = l, w.seen|dirtyGroups
			w.ev.Groups(slices.Clone(l))
		}
	}
	return true
}

// linkState reads the device's link attributes. MTUChanged and UpChanged compare with
// what this package last set or reported, under the same lock as SetMTU and SetUp, so
// the package's own changes are never reported as someone else's.
func (d *Device) linkState() (Link, error) {
	var l Link
	err := d.control(func() error {
		d.setMu.Lock()
		defer d.setMu.Unlock()
		nl, err := d.h.LinkByIndex(d.index)
		if err != nil {
			return d.errorf("read link: %w", err)
		}
		a := nl.Attrs()
		if a.Name != d.currentName() {
			name := a.Name
			d.now.Store(&name) // ip link set name: deleting it at the end must know it
		}
		l = Link{Name: a.Name, MTU: a.MTU, Up: a.RawFlags&unix.IFF_UP != 0, Flags: a.RawFlags, TxQLen: a.TxQLen}
		// The carrier is the engine's (an IPoIB netdev has no ndo_change_carrier, so
		// ip link set carrier is refused there; a TUN takes it): one someone changed
		// on an up device is put back at once.
		if lowerUp := a.RawFlags&unix.IFF_LOWER_UP != 0; l.Up && lowerUp != d.carrier {
			if err := d.setCarrierLocked(d.carrier); err == nil {
				l.CarrierPutBack = true
				l.Flags ^= unix.IFF_LOWER_UP
			}
		}
		l.MTUChanged = int64(a.MTU) != d.mtu.Load()
		l.UpChanged = l.Up != d.up
		d.mtu.Store(int64(a.MTU))
		d.up = l.Up
		l.Multicast = a.RawFlags&unix.IFF_MULTICAST != 0
		l.MulticastChanged = l.Multicast == d.noMcast
		l.PrevMulticast = !d.noMcast
		d.noMcast = !l.Multicast
		l.UserFlags = a.RawFlags & UserFlagMask
		// The count includes the user's own flag, which UserFlags carries.
		if own := int((a.RawFlags & unix.IFF_PROMISC) >> 8); a.Promisc > own {
			l.Counted |= unix.IFF_PROMISC
		}
		l.UserFlagsChanged = l.UserFlags != d.user
		l.PrevUserFlags = d.user
		d.user = l.UserFlags
		l.TxQLenChanged = a.TxQLen != d.txq
		l.PrevTxQLen = d.txq
		d.txq = a.TxQLen
		l.Alias, l.AliasChanged, l.PrevAlias = a.Alias, a.Alias != d.alias, d.alias
		d.alias = a.Alias
		if f, err := d.deviceFeatures(a.Name); err == nil {
			l.Features = f
			l.FeaturesChanged = d.featKnown && f != d.feat
			d.feat, d.featKnown = f, true
		}
		return nil
	})
	return l, err
}

// Groups returns the device's multicast list as the kernel's IGMP and MLD code hold it
// (/proc/net/igmp and /proc/net/igmp6 of its namespace): the groups applications and
// the stack joined on it, all-hosts and solicited-node groups included. IPv4 first.
// The lists cover every device of the namespace, so devices asking at the same time
// share one read (monitor.groupLists) made after they asked.
func (d *Device) Groups() ([]netip.Addr, error) {
	read := func() (map[int][]netip.Addr, error) {
		var all map[int][]netip.Addr
		err := d.control(func() error {
			return d.inNS(func() error {
				// thread-self: the namespace of this thread, which inNetNS entered.
				v4, err := os.ReadFile("/proc/thread-self/net/igmp")
				if err != nil && !errors.Is(err, os.ErrNotExist) {
					return d.errorf("multicast list: %w", err)
				}
				v6, err := os.ReadFile("/proc/thread-self/net/igmp6")
				if err != nil && !errors.Is(err, os.ErrNotExist) {
					return d.errorf("multicast list: %w", err)
				}
				all = parseIGMPAll(v4)
				for idx, g := range parseIGMP6All(v6) {
					all[idx] = append(all[idx], g...)
				}
				return nil
			})
		})
		return all, err
	}
	var all map[int][]netip.Addr
	var err error
	if d.mon != nil {
		all, err = d.mon.groupLists(read)
	} else {
		all, err = read()
	}
	if err != nil {
		return nil, err
	}
	return slices.Clone(all[d.index]), nil
}

// groupLists returns the namespace's multicast lists from a read that started after
// the call: a caller that arrives while a read is under way waits for it and then
// for (or makes) the next, since that one may predate the change it asks about.
func (m *monitor) groupLists(read func() (map[int][]netip.Addr, error)) (map[int][]netip.Addr, error) {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if m.gcond == nil {
		m.gcond = sync.NewCond(&m.gmu)
	}
	arrived := m.gStarted
	for {
		if m.gResFrom > arrived {
			return m.gRes, m.gErr
		}
		if !m.gReading {
			break
		}
		m.gWaiters++
		m.gcond.Wait()
		m.gWaiters--
	}
	m.gReading = true
	m.gStarted++
	mine := m.gStarted
	m.gmu.Unlock()
	res, err := read()
	m.gmu.Lock()
	m.gReading = false
	m.gRes, m.gErr, m.gResFrom = res, err, mine
	m.gcond.Broadcast()
	return res, err
}

// parseIGMP and parseIGMP6 return the groups of one interface index.
func parseIGMP(b []byte, index int) []netip.Addr  { return parseIGMPAll(b)[index] }
func parseIGMP6(b []byte, index int) []netip.Addr { return parseIGMP6All(b)[index] }

// parseIGMPAll reads /proc/net/igmp: a line per device ("Idx Device : Count Querier")
// followed by a tab-indented line per group, the group in hex as the kernel's native
// byte order shows a big-endian address. The groups by interface index.
func parseIGMPAll(b []byte) map[int][]netip.Addr {
	out := map[int][]netip.Addr{}
	cur := -1
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasPrefix(line, "\t") {
			idx, err := strconv.Atoi(f[0])
			if err != nil {
				idx = -1
			}
			cur = idx
			continue
		}
		if cur < 0 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 16, 32)
		if err != nil {
			continue
		}
		var a [4]byte
		binary.NativeEndian.PutUint32(a[:], uint32(v))
		if g := netip.AddrFrom4(a); g.IsMulticast() {
			out[cur] = append(out[cur], g)
		}
	}
	return out
}

// parseIGMP6All reads /proc/net/igmp6: "index name group(32 hex) users flags timer".
// The groups by interface index.
func parseIGMP6All(b []byte) map[int][]netip.Addr {
	out := map[int][]netip.Addr{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || len(f[2]) != 32 {
			continue
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		raw, err := hex.DecodeString(f[2])
		if err != nil {
			continue
		}
		if g := netip.AddrFrom16([16]byte(raw)); g.IsMulticast() {
			out[idx] = append(out[idx], g)
		}
	}
	return out
}

// EnsureLinkLocal keeps addr the device's IPv6 link-local address. The kernel forgets
// it when the device goes down, and when the MTU dips below 1280 it drops the device's
// whole IPv6 state, whose replacement generates a random link-local address again. When
// addr is missing, the generation mode is set to none again, link-local addresses the
// kernel made meanwhile are removed and addr is added. Nothing is done while IPv6 is off
// on the device (MTU below 1280) or addr is present.
func (d *Device) EnsureLinkLocal(addr netip.Addr) error {
	return d.control(func() error {
		if d.mtu.Load() < 1280 {
			return nil
		}
		addrs, err := d.h.AddrList(d.link, netlink.FAMILY_V6)
		if err != nil {
			return d.errorf("list addresses: %w", err)
		}
		var others []netlink.Addr
		for _, a := range addrs {
			p, ok := prefixOf(a.IPNet)
			if !ok {
				continue
			}
			if p.Addr() == addr {
				return nil
			}
			if p.Addr().IsLinkLocalUnicast() {
				others = append(others, a)
			}
		}
		return d.setLinkLocal(addr, others)
	})
}
