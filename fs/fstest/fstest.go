// Package fstest starts what the front-end tests of the tree need: a one-node soft
// fabric hosting its own subnet manager, an engine with ib0 up, and the tree.
package fstest

import (
	"io"
	"log"
	"sync"
	"testing"
	"time"

	"ipoibfs/fs"
	"ipoibfs/ipoib"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// LogSink collects the tree's log lines.
type LogSink struct {
	mu    sync.Mutex
	lines []string
}

// Add records a line (the tree's Options.Log).
func (l *LogSink) Add(s string) { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }

// Take returns and forgets the lines so far.
func (l *LogSink) Take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// Env is a running engine and its tree.
type Env struct {
	HCA    *soft.HCA
	Engine *ipoib.Engine
	IB0    *ipoib.Interface
	Tree   *fs.Tree
	Log    *LogSink
}

// NewEnv starts a node named name (GUIDs derive from it) with ib0 up and carrier on,
// and the tree with sm/. Everything stops when the test ends.
func NewEnv(t testing.TB, name string) *Env {
	t.Helper()
	h, err := soft.New(soft.Config{Name: name, Network: soft.NewMemNetwork(), HostSM: true, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	WaitFor(t, "port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
	e, err := ipoib.New(h, ipoib.Options{Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ib0, _ := e.Interface("ib0")
	if err := ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, "ib0 carrier", ib0.Carrier)
	ls := &LogSink{}
	o := fs.Options{Log: ls.Add}
	if sm := h.SM(); sm != nil {
		o.SM = sm
	}
	return &Env{HCA: h, Engine: e, IB0: ib0, Tree: fs.New(e, o), Log: ls}
}

// WaitFor polls cond for up to 10 s.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
