package cm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/cm"
	"ipoibfs/verbs/soft"
)

// rcEnd is an RC QP on a soft HCA with its CQs and posted receive buffers.
type rcEnd struct {
	h        *soft.HCA
	qp       verbs.QP
	scq, rcq verbs.CQ
	bufs     [][]byte
}

func newRCEnd(t *testing.T, h *soft.HCA) (*rcEnd, error) {
	scq, err := h.CreateCQ(verbs.CQAttr{Entries: 64})
	if err != nil {
		return nil, err
	}
	rcq, err := h.CreateCQ(verbs.CQAttr{Entries: 64})
	if err != nil {
		return nil, err
	}
	qp, err := h.CreateQP(verbs.QPAttr{Type: verbs.QPTypeRC, Port: 1, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 32, MaxRecvWR: 32})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { qp.Close() })
	// Receives may be posted from INIT on; the manager takes it from there.
	if err := qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState | verbs.QPMaskPKeyIndex, State: verbs.QPInit}); err != nil {
		return nil, err
	}
	return &rcEnd{h: h, qp: qp, scq: scq, rcq: rcq}, nil
}

func (e *rcEnd) postRecvs(t *testing.T, n int) {
	t.Helper()
	var wrs []verbs.RecvWR
	for range n {
		e.bufs = append(e.bufs, make([]byte, 4096))
		wrs = append(wrs, verbs.RecvWR{ID: uint64(len(e.bufs) - 1), Buf: e.bufs[len(e.bufs)-1]})
	}
	if _, err := e.qp.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
}

func poll(t *testing.T, cq verbs.CQ, what string) verbs.WC {
	t.Helper()
	wc := make([]verbs.WC, 1)
	deadline := time.Now().Add(5 * time.Second)
	for cq.Poll(wc) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no completion for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return wc[0]
}

func (e *rcEnd) send(t *testing.T, id uint64, msg []byte) {
	t.Helper()
	if _, err := e.qp.PostSend([]verbs.SendWR{{ID: id, Data: [][]byte{msg}, Signaled: true}}); err != nil {
		t.Fatal(err)
	}
	if wc := poll(t, e.scq, "send"); wc.Status != verbs.WCSuccess || wc.WRID != id {
		t.Fatalf("send completion %+v", wc)
	}
}

func (e *rcEnd) expect(t *testing.T, msg []byte) {
	t.Helper()
	wc := poll(t, e.rcq, "receive")
	if wc.Status != verbs.WCSuccess {
		t.Fatalf("receive completion %+v", wc)
	}
	buf := e.bufs[wc.WRID][:wc.ByteLen]
	if wc.GRH {
		buf = buf[40:]
	}
	if !bytes.Equal(buf, msg) {
		t.Fatalf("received %q, want %q", buf, msg)
	}
}

// TestSoftFabricRC connects two RC QPs of the in-process soft fabric through the CM
// (MADs on the fabric's QP1 agents) and sends data both ways. It skips while verbs/soft
// refuses RC queue pairs.
func TestSoftFabricRC(t *testing.T) {
	n := soft.NewMemNetwork()
	smh, err := soft.New(soft.Config{Name: "sm", Network: n, HostSM: true, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	node, err := soft.New(soft.Config{Name: "a", Network: n, SM: smh.Endpoint(1), Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()

	active, err := newRCEnd(t, node)
	if err != nil {
		t.Fatal(err)
	}
	passive, err := newRCEnd(t, smh)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, h := range []*soft.HCA{smh, node} {
		for h.SoftPort(1).Attr().State != verbs.PortActive {
			if time.Now().After(deadline) {
				t.Fatalf("%s port not active", h.Name())
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	ma, err := cm.New(node, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ma.Close()
	mb, err := cm.New(smh, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()

	passive.postRecvs(t, 4)
	active.postRecvs(t, 4)
	est := make(chan *cm.Conn, 1)
	if _, err := mb.Listen(svc, func(r *cm.Request) cm.Decision {
		return cm.Accept{QP: passive.qp, PrivateData: ipoibPD(uint32(r.RemoteQPN)),
			Established: func(c *cm.Conn) { est <- c },
			Failed:      func(err error) { t.Errorf("passive side: %v", err) }}
	}); err != nil {
		t.Fatal(err)
	}

	dst := smh.SoftPort(1)
	dgid, _ := dst.GID(0)
	p := cm.ConnectParams{ServiceID: svc, QP: active.qp, DLID: dst.Attr().LID, DGID: dgid, PKey: 0xffff,
		PrivateData: ipoibPD(0x48), RetryCount: 7, RNRRetry: 7, AckTimeout: 14, Timeout: 14, MaxCMRetries: 15}
	var conn *cm.Conn
	for {
		// Until the SM has handed out routes the first REQ cannot be sent.
		conn, err = ma.Connect(context.Background(), p)
		if !errors.Is(err, verbs.ErrPortDown) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	bc := recv(t, est, "passive connection")
	if conn.RemoteQPN != passive.qp.Num() || bc.RemoteQPN != active.qp.Num() {
		t.Fatalf("QPNs %#x/%#x", conn.RemoteQPN, bc.RemoteQPN)
	}
	if active.qp.State() != verbs.QPRTS || passive.qp.State() != verbs.QPRTS {
		t.Fatalf("QP states %v/%v", active.qp.State(), passive.qp.State())
	}
	for i := range 3 {
		ping := []byte(fmt.Sprintf("ping %d from the active side", i))
		active.send(t, uint64(100+i), ping)
		passive.expect(t, ping)
		pong := bytes.Repeat([]byte{byte(i)}, 3000) // more than one 2048-byte packet
		passive.send(t, uint64(200+i), pong)
		active.expect(t, pong)
	}
	if err := conn.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, bc, "passive Done")
}
