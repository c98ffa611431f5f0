package cm

import "maps"

// Hooks for the package's tests (compiled into them only).

// MaxHalfOpen is the cap on half-open passive records.
const MaxHalfOpen = maxHalfOpen

// SetMaxHalfOpen lowers m's cap on half-open records, so that a test can reach it
// with few records (the mock clock's cost grows with the square of its timers).
func (m *Manager) SetMaxHalfOpen(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxHalfOpen = n
}

// MaxHalfOpenPerSource is the cap on one source's half-open passive records.
const MaxHalfOpenPerSource = maxHalfOpenPerSource

// SetMaxHalfOpenPerSource changes m's cap on one source's half-open records.
func (m *Manager) SetMaxHalfOpenPerSource(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxPerSource = n
}

// Records returns how many connection records m holds, how many of them are half
// open by the manager's running count and by a fresh look at each record (the two
// must agree), and how many REQs were rejected for the cap.
func (m *Manager) Records() (all, halfOpen, halfOpenNow int, overLimit uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conns {
		if c.isHalfOpen() {
			halfOpenNow++
		}
	}
	return len(m.conns), m.halfOpen, halfOpenNow, m.overLimit
}

// SourceCountsAgree reports whether m's per-source half-open counts are what a fresh
// look at each record gives (no entry for a source without records).
func (m *Manager) SourceCountsAgree() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	by := map[madAddr]int{}
	for _, c := range m.conns {
		if c.isHalfOpen() {
			by[sourceKey(c.madTo)]++
		}
	}
	return maps.Equal(by, m.halfOpenBy)
}

// TimewaitHeld returns how many records in timewait still hold a QP, a consumer
// callback, the public Conn or a message buffer other than a REJ to repeat.
func (m *Manager) TimewaitHeld() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.conns {
		if c.state == stTimewait && (c.qp != nil || c.accept.QP != nil || c.accept.Established != nil ||
			c.accept.Failed != nil || c.pub != nil || c.msg != nil) {
			n++
		}
	}
	return n
}
