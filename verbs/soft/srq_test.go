package soft

import (
	"errors"
	"testing"

	"ipoibfs/verbs"
)

// The soft SRQ holds exactly what was asked for (a hardware SRQ may round up, so the
// conformance suite does not check this), refuses what it does not support, and keeps
// its buffers when a QP drawing from it fails.
func TestSRQBoundsAndErrors(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	h := nodes[0]
	srq, err := h.CreateSRQ(verbs.SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	wrs := make([]verbs.RecvWR, 6)
	for k := range wrs {
		wrs[k] = verbs.RecvWR{ID: uint64(k), Buf: make([]byte, 64)}
	}
	if n, err := srq.PostRecv(wrs); n != 4 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Errorf("posting 6 to an SRQ of 4: %d accepted, %v; want 4 and ErrQueueFull", n, err)
	}
	cq, _ := h.CreateCQ(verbs.CQAttr{Entries: 16})
	if _, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, SRQ: srq}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("UD QP with an SRQ: %v, want ErrInvalid (not supported)", err)
	}
	other, _ := nodes[1].CreateSRQ(verbs.SRQAttr{MaxWR: 4})
	if _, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, SRQ: other}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("QP with another HCA's SRQ: %v, want ErrInvalid", err)
	}
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	// A QP moved to ERR flushes nothing of the SRQ's: the buffers wait for other QPs.
	if err := qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr}); err != nil {
		t.Fatal(err)
	}
	if wc := make([]verbs.WC, 8); cq.Poll(wc) != 0 {
		t.Errorf("QP error completed SRQ buffers: %+v", wc[0])
	}
	for k := 0; k < 4; k++ {
		if wr, ok, last := srq.(*SRQ).take(); !ok || wr.ID != uint64(k) || last != (k == 3) {
			t.Errorf("SRQ buffer %d after the QP failed: %v %v (the last: %v)", k, wr.ID, ok, last)
		}
	}
	if err := srq.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("Close with a QP: %v", err)
	}
	qp.Close()
	qp.Close() // a second Close must not release the SRQ twice
	if err := srq.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := srq.PostRecv(wrs[:1]); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("PostRecv on a closed SRQ: %v", err)
	}
	if _, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, SRQ: srq}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("QP on a closed SRQ: %v", err)
	}
	other.Close()
	cq.Close()
}
