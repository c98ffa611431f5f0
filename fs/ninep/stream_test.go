package ninep

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"ipoibfs/fs"
)

// A stream read over 9P waits for the next line, and one still waiting when the
// client goes away ends with the connection instead of holding the server.
func TestStreamOver9P(t *testing.T) {
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
