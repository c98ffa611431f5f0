package soft

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"ipoibfs/verbs"
)

// `link a 1 down` in sm/faults takes node a's port 1 off the fabric while everything
// runs: the port goes DOWN (PORT_ERR, physical state Polling), nothing it sends
// arrives and nothing reaches it, sm/nodes shows it DOWN and the SA has no path to it;
// `link a 1 up` makes it ACTIVE again (PORT_ACTIVE) and traffic flows as before. The
// faults file shows the link line while it is down, and writing the file back keeps it.
func TestLinkFaultTakesAPortDownAndBack(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b")
	sm := smh.SM()
	a, b := newUD(t, nodes[0], 0, 0x0b1b), newUD(t, nodes[1], 0, 0x0b1b)
	msg := []byte("hello over the link")
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, msg)
	if _, ok := b.recv(t, 2*time.Second); !ok {
		t.Fatal("no traffic before the fault")
	}
	ev, cancel := nodes[0].Subscribe(16)
	defer cancel()
	lidA := a.lid()

	if err := sm.SetFaultsText("link a 1 down\n"); err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, ev, verbs.EventPortErr)
	if at := nodes[0].SoftPort(1).Attr(); at.State != verbs.PortDown || at.PhysState != verbs.PhysPolling {
		t.Fatalf("a's port 1 state %v phys %v, want DOWN and Polling", at.State, at.PhysState)
	}
	waitFor(t, "a's port gone from b's routes", func() bool {
		p := nodes[1].SoftPort(1)
		p.mu.RLock()
		defer p.mu.RUnlock()
		_, ok := p.uni[lidA]
		return !ok
	})
	if !strings.Contains(sm.NodesText(), `"ipoibfs a"`) || !strings.Contains(sm.NodesText(), "state DOWN") {
		t.Fatalf("sm/nodes does not show a DOWN:\n%s", sm.NodesText())
	}
	if got := sm.FaultsText(); !strings.Contains(got, "link \"ipoibfs a\" 1 down\n") {
		t.Fatalf("sm/faults:\n%s\nwant the link line", got)
	}
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, msg)
	b.send(t, lidA, a.qp.Num(), 0x0b1b, msg)
	if _, ok := b.recv(t, 200*time.Millisecond); ok {
		t.Fatal("b received from a port whose link is down")
	}
	if _, ok := a.recv(t, 200*time.Millisecond); ok {
		t.Fatal("a port whose link is down received")
	}
	// The file written back as read keeps the link down.
	if err := sm.SetFaultsText(sm.FaultsText()); err != nil {
		t.Fatal(err)
	}
	if at := nodes[0].SoftPort(1).Attr(); at.State != verbs.PortDown {
		t.Fatalf("state %v after writing sm/faults back, want DOWN", at.State)
	}

	if err := sm.SetFaultsText("link ipoibfs\\ a 1 up"); err == nil {
		t.Fatal("a bad node name was accepted")
	}
	if err := sm.SetFaultsText(`link "ipoibfs a" 1 up`); err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, ev, verbs.EventPortActive)
	waitFor(t, "a's port back in b's routes", func() bool {
		p := nodes[1].SoftPort(1)
		p.mu.RLock()
		defer p.mu.RUnlock()
		_, ok := p.uni[lidA]
		return ok
	})
	a.send(t, b.lid(), b.qp.Num(), 0x0b1b, msg)
	wc, ok := b.recv(t, 2*time.Second)
	if !ok || !bytes.Equal(b.bufFor(wc)[40:wc.ByteLen], msg) {
		t.Fatal("no traffic after the link came back")
	}
	if strings.Contains(sm.FaultsText(), "link") {
		t.Fatalf("sm/faults still shows a link line:\n%s", sm.FaultsText())
	}
}

// Link lines are checked whole before anything changes: an unknown node, a port the
// node lacks, a bad state or port fail the write and leave the faults as they were.
func TestLinkFaultErrors(t *testing.T) {
	_, smh, _ := fabric(t, "", "a")
	sm := smh.SM()
	for _, bad := range []string{
		"link nosuch 1 down",
		"link a 2 down",
		"link a 0 down",
		"link a 1 sideways",
		"link a 1",
		`link "ipoibfs a 1 down`,
		"loss 2%\nlink nosuch 1 down",
	} {
		if err := sm.SetFaultsText(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if f := sm.Faults(); f.Loss != 0 {
		t.Fatalf("loss %v after refused writes", f.Loss)
	}
	if err := sm.SetFaultsText("loss 1%\nlink a 1 up\n"); err != nil {
		t.Fatal(err)
	}
	if f := sm.Faults(); f.Loss != 0.01 {
		t.Fatalf("loss %v, want 0.01", f.Loss)
	}
	g := nodes0GUID(t, sm)
	if err := sm.SetLink(g, 1, true); err != nil {
		t.Fatalf("node by GUID %s: %v", g, err)
	}
	if !strings.Contains(sm.FaultsText(), "link \"ipoibfs a\" 1 down") {
		t.Fatalf("sm/faults:\n%s", sm.FaultsText())
	}
}

// nodes0GUID is node a's GUID as 0x... text.
func nodes0GUID(t *testing.T, sm *SM) string {
	for _, n := range sm.Nodes() {
		if n.Name == "ipoibfs a" {
			return fmt.Sprintf("%#x", uint64(n.NodeGUID))
		}
	}
	t.Fatal("no node a")
	return ""
}

// FuzzLinkFaultLines: splitting a sm/faults write never panics, and what it accepts
// names a port 1..254 and a node.
func FuzzLinkFaultLines(f *testing.F) {
	for _, s := range []string{"link a 1 down", `link "ipoibfs a" 2 up`, "loss 2%\nlink 0x12 1 down\n", `link "x`, "link"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		links, _, err := splitFaultLines(s)
		if err != nil {
			return
		}
		for _, l := range links {
			if l.port < 1 || l.port > 254 || l.node == "" {
				t.Fatalf("%q gave %+v", s, l)
			}
		}
	})
}
