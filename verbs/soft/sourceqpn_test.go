package soft

import (
	"errors"
	"testing"

	"ipoibfs/verbs"
)

// TestSourceQPNOwnerClosed: once the QP whose number a send-only QP carries is
// destroyed, the send-only QP sends nothing and cannot be brought up again (the number
// may go to another QP).
func TestSourceQPNOwnerClosed(t *testing.T) {
	_, _, nodes := fabric(t, "", "a")
	h := nodes[0]
	cq, err := h.CreateCQ(verbs.CQAttr{Entries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	mk := func(src verbs.QPN) verbs.QP {
		t.Helper()
		q, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8, SourceQPN: src})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	up := []verbs.QPModify{
		{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex | verbs.QPMaskQKey, State: verbs.QPInit, QKey: verbs.IPoIBQKey},
		{Mask: verbs.QPMaskState, State: verbs.QPRTR},
		{Mask: verbs.QPMaskState, State: verbs.QPRTS},
	}
	owner := mk(0)
	so := mk(owner.Num())
	defer so.Close()
	for _, m := range up {
		if err := so.Modify(m); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := h.CreateAH(verbs.AHAttr{Port: 1, DLID: h.SoftPort(1).Attr().LID})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Close()
	wr := []verbs.SendWR{{AH: ah, RemoteQPN: owner.Num(), RemoteQKey: verbs.IPoIBQKey, Data: [][]byte{[]byte("x")}}}
	if n, err := so.PostSend(wr); n != 1 || err != nil {
		t.Fatalf("send while the owner lives: %d, %v", n, err)
	}
	owner.Close()
	if n, err := so.PostSend(wr); n != 0 || !errors.Is(err, verbs.ErrInvalidState) {
		t.Errorf("send after the owner closed: %d, %v; want ErrInvalidState", n, err)
	}
	if err := so.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPReset}); err != nil {
		t.Fatal(err)
	}
	if err := so.Modify(up[0]); err == nil {
		t.Errorf("a send-only QP came back to INIT after its owner was destroyed")
	}
	// The owner's list went with it; a new QP is a fine owner again.
	o2 := mk(0)
	defer o2.Close()
	s2 := mk(o2.Num())
	s2.Close()
	if l := len(o2.(*QP).shadows); l != 0 {
		t.Errorf("closed send-only QP still listed by its owner (%d)", l)
	}
}
