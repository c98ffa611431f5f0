package ninep

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

// logSink collects the tree's log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) add(s string) { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }

func (l *logSink) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

type env struct {
	hca  *soft.HCA
	e    *ipoib.Engine
	ib0  *ipoib.Interface
	tree *fs.Tree
	log  *logSink
}

// newEnv starts a one-node soft fabric that hosts its own subnet manager, an engine on
// it with ib0 up and carrier on, and the tree with sm/.
func newEnv(t testing.TB) *env {
	t.Helper()
	h, err := soft.New(soft.Config{Name: "n1", Network: soft.NewMemNetwork(), HostSM: true, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	waitFor(t, "port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
	e, err := ipoib.New(h, ipoib.Options{Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ib0, _ := e.Interface("ib0")
	if err := ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ib0 carrier", ib0.Carrier)
	ls := &logSink{}
	return &env{hca: h, e: e, ib0: ib0, tree: fs.New(e, fs.Options{Log: ls.add, SM: h.SM()}), log: ls}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
