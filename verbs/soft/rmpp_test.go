package soft

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// The fabric view from a node: NodeRecord, PortInfoRecord and P_KeyTableRecord
// GetTable answers longer than one MAD arrive whole through RMPP, and match what the
// SM knows.
func TestFabricTablesThroughRMPP(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e", "f"}
	_, smh, nodes := fabric(t, "Default=0x7fff, ipoib : ALL=full;\nP2=0x0002, ipoib : ALL=full;", names...)
	cl := &sa.Client{Port: nodes[0].SoftPort(1)}
	ctx := context.Background()
	want := smh.SM().Nodes()
	if len(want) != len(names)+1 {
		t.Fatalf("SM knows %d ports, want %d", len(want), len(names)+1)
	}
	// 7 NodeRecords are 7*112 bytes: 4 segments, records crossing segment borders.
	ns, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != len(want) {
		t.Fatalf("%d NodeRecords, want %d", len(ns), len(want))
	}
	for i, n := range ns {
		w := want[i]
		if n.LID != w.LID || n.NodeGUID != w.NodeGUID || n.PortGUID != w.PortGUID || n.Desc != w.Name ||
			int(n.LocalPort) != w.Port || n.NodeType != mad.NodeTypeCA || n.NumPorts != 1 {
			t.Errorf("NodeRecord %d = %+v, want the SM's %+v", i, n, w)
		}
	}
	pis, err := cl.PortInfos(ctx)
	if err != nil {
		t.Fatal(err)
	}
	smLID := smh.SoftPort(1).Attr().LID
	if len(pis) != len(want) {
		t.Fatalf("%d PortInfoRecords, want %d", len(pis), len(want))
	}
	for i, p := range pis {
		if p.LID != want[i].LID || p.State != verbs.PortActive || p.MasterSMLID != smLID || p.MTUCap != verbs.MTU4096 {
			t.Errorf("PortInfoRecord %d = %+v", i, p)
		}
	}
	pks, err := cl.PKeyTables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pks) != len(want) {
		t.Fatalf("%d P_KeyTableRecords, want %d", len(pks), len(want))
	}
	for i, p := range pks {
		tab := want[i].PKeys
		if p.LID != want[i].LID || p.BlockNum != 0 || fmt.Sprint(p.PKeys[:len(tab)]) != fmt.Sprint(tab) {
			t.Errorf("P_KeyTableRecord %d = %+v, want keys %v", i, p, tab)
		}
	}
}

// A long answer survives loss, duplication and reordering of QP1 traffic: the sender
// resends the window from the first unACKed segment, the receiver drops gaps and
// re-ACKs duplicates, and the result is exact.
func TestRMPPUnderLoss(t *testing.T) {
	var conf strings.Builder
	conf.WriteString("Default=0x7fff, ipoib : ALL=full;\n")
	for k := 1; k <= 40; k++ {
		fmt.Fprintf(&conf, "P%d=0x%04x, ipoib : ALL=full;\n", k, 0x100+k)
	}
	_, smh, nodes := fabric(t, conf.String(), "a", "b")
	want := len(smh.SM().DB().Groups()) // 41 partitions, one IPoIB group each: 12 segments
	if want != 41 {
		t.Fatalf("SM has %d groups, want 41", want)
	}
	cl := &sa.Client{Port: nodes[0].SoftPort(1), Timeout: 300 * time.Millisecond, Retries: 40}
	ctx := context.Background()
	clean, err := cl.Groups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(clean) != want {
		t.Fatalf("%d groups without loss, want %d", len(clean), want)
	}
	if err := smh.SM().SetFaults(Faults{Loss: 0.2, Dup: 0.1, Reorder: 0.1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "faults reach the node", func() bool { return nodes[0].SoftPort(1).ep.faults.Load() != nil })
	for round := range 3 {
		got, err := cl.Groups(ctx)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(clean) {
			t.Fatalf("round %d: %d groups differ from the loss-free answer", round, len(got))
		}
	}
	// Every transfer ended: no sender is left waiting for ACKs.
	if err := smh.SM().SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the SM's RMPP senders finish", func() bool {
		g := &smh.SoftPort(1).gsi
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.sending) == 0
	})
}

// The transfers an agent sends at once are bounded: requests beyond the bound get no
// answer (the requester's retry asks again) and are counted as discarded.
func TestRMPPSendersBounded(t *testing.T) {
	_, smh, nodes := fabric(t, "", "a", "b", "c", "d")
	sm := smh.SoftPort(1)
	g := &sm.gsi
	long := make([]byte, mad.SADataOffset+3*mad.RMPPSegData) // three segments
	long[1], long[3] = mad.ClassSA, mad.MethodGetTableResp
	peer := nodes[0].SoftPort(1).Attr().LID
	discards := sm.Counters().XmitDiscards
	// Nobody ACKs: each transfer stays until its retries run out.
	for k := range maxRMPPSending + 5 {
		binary.BigEndian.PutUint64(long[8:], uint64(0x7000+k))
		g.sendRMPP(peer, verbs.GSIQPN, long)
	}
	g.mu.Lock()
	n := len(g.sending)
	g.mu.Unlock()
	if n != maxRMPPSending {
		t.Fatalf("%d transfers under way, want the bound %d", n, maxRMPPSending)
	}
	if got := sm.Counters().XmitDiscards - discards; got != 5 {
		t.Errorf("%d requests discarded, want 5", got)
	}
	waitFor(t, "the unanswered transfers giving up", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.sending) == 0
	})
}
