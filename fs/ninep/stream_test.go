package ninep

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// A stream read over 9P waits for the next line, and one still waiting when the
// client goes away ends with the connection instead of holding the server.
func TestStreamOver9P(t *testing.T) {
	l, c, done := eventsClient(t)
	f, err := c.walk("events")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	read := func() chan string {
		got := make(chan string, 1)
		go func() {
			buf := make([]byte, 4096)
			n, _ := f.ReadAt(buf, 0)
			got <- string(buf[:n])
		}()
		return got
	}
	got := read()
	l.Emit("ib0: hello")
	select {
	case s := <-got:
		if !strings.HasSuffix(s, " ib0: hello\n") {
			t.Errorf("read %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no line read over 9P")
	}
	read() // waits: nothing more is emitted
	c.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the server still waits in a stream read after its client went away")
	}
}

// eventsClient serves a tree with an events log over a pipe; done says when the
// server's connection ended.
func eventsClient(t *testing.T) (*fs.EventLog, *Client, <-chan error) {
	t.Helper()
	v := newEnv(t)
	l := fs.NewEventLog()
	tree := fs.New(v.e, fs.Options{Events: l})
	cc, sc := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeConn(sc, tree.Root(), Options{Unidentified: &fs.Internal}) }()
	c, err := NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	return l, c, done
}

// Serve's connections end a waiting stream read too: stopping the server (the
// daemon's shutdown) while a client reads events returns, rather than waiting for an
// event that shutdown never emits.
func TestServeStopsWithAStreamReadWaiting(t *testing.T) {
	v := newEnv(t)
	l := fs.NewEventLog()
	tree := fs.New(v.e, fs.Options{Events: l})
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, tree.Root(), Options{}) }()
	conn, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.walk("events")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 4096)
		_, _ = f.ReadAt(buf, 0) // waits: nothing is emitted
	}()
	time.Sleep(100 * time.Millisecond) // the read reaches the server
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still waits for a stream read after it was stopped")
	}
}
