package sa

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePort answers Attr and MAD; the rest of verbs.Port is never called here.
type fakePort struct {
	verbs.Port
	attr  verbs.PortAttr
	agent *fakeAgent
}

func (p *fakePort) Attr() verbs.PortAttr              { return p.attr }
func (p *fakePort) MAD() verbs.MADAgent               { return p.agent }
func (a *fakeAgent) Register(uint8, verbs.MADHandler) {}
func (a *fakeAgent) Send(verbs.LID, verbs.QPN, []byte) error {
	return errors.New("not used")
}

// fakeAgent answers each Call with answer(request); it records what it was asked.
type fakeAgent struct {
	answer  func(req *mad.SAMAD) ([]byte, error)
	dlid    verbs.LID
	timeout time.Duration
	retries int
	calls   int
}

func (a *fakeAgent) Call(ctx context.Context, dlid verbs.LID, req []byte, timeout time.Duration, retries int) ([]byte, error) {
	a.calls++
	a.dlid, a.timeout, a.retries = dlid, timeout, retries
	var m mad.SAMAD
	if err := mad.ParseSA(req, &m); err != nil {
		return nil, err
	}
	return a.answer(&m)
}

func client(answer func(req *mad.SAMAD) ([]byte, error)) (*Client, *fakeAgent) {
	a := &fakeAgent{answer: answer}
	return &Client{Port: &fakePort{attr: verbs.PortAttr{State: verbs.PortActive, SMLID: 7}, agent: a}}, a
}

func ok(req *mad.SAMAD, fill func(r *mad.SAMAD)) ([]byte, error) {
	r := req.Response(mad.StatusOK)
	if fill != nil {
		fill(&r)
	}
	return r.Bytes(), nil
}

func TestCallGoesToTheSMWithTheKernelsTimeouts(t *testing.T) {
	c, a := client(func(req *mad.SAMAD) ([]byte, error) { return ok(req, nil) })
	if _, err := c.ClassPortInfo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a.dlid != 7 || a.timeout != time.Second || a.retries != 2 {
		t.Errorf("asked LID %d with timeout %v and %d retries, want 7, 1s, 2", a.dlid, a.timeout, a.retries)
	}
	c.Timeout, c.Retries = 50*time.Millisecond, 5
	_, _ = c.ClassPortInfo(context.Background())
	if a.timeout != 50*time.Millisecond || a.retries != 5 {
		t.Errorf("configured timeout/retries not passed: %v %d", a.timeout, a.retries)
	}
}

func TestErrorPaths(t *testing.T) {
	ctx := context.Background()
	rec := mad.MCMemberRecord{MGID: verbs.GID{0xff, 0x12}}

	// A port that is not active (or has no SM) sends nothing.
	c, a := client(func(req *mad.SAMAD) ([]byte, error) { return ok(req, nil) })
	c.Port.(*fakePort).attr.State = verbs.PortInit
	if _, err := c.Join(ctx, rec, mad.IPoIBBroadcastJoinMask); !errors.Is(err, verbs.ErrPortDown) || a.calls != 0 {
		t.Errorf("join on a port in INIT: %v after %d calls, want ErrPortDown and none", err, a.calls)
	}
	c.Port.(*fakePort).attr = verbs.PortAttr{State: verbs.PortActive}
	if _, err := c.PathRecord(ctx, verbs.GID{}, verbs.GID{}, 0, 0); !errors.Is(err, verbs.ErrPortDown) {
		t.Errorf("path query without an SM LID: %v", err)
	}

	// The MAD layer's timeout is the caller's error, wrapped with the operation.
	c, _ = client(func(*mad.SAMAD) ([]byte, error) { return nil, verbs.ErrTimeout })
	if _, err := c.PathRecord(ctx, verbs.GID{}, verbs.GID{}, 0, 0); !errors.Is(err, verbs.ErrTimeout) || err.Error() != "sa path record: MAD timed out" {
		t.Errorf("timeout: %v", err)
	}

	// Answers that are not the answer: a request, another attribute, a short MAD.
	for name, bad := range map[string]func(req *mad.SAMAD) ([]byte, error){
		"not a response": func(req *mad.SAMAD) ([]byte, error) { return req.Bytes(), nil },
		"another attribute": func(req *mad.SAMAD) ([]byte, error) {
			return ok(req, func(r *mad.SAMAD) { r.AttrID = mad.AttrPathRecord })
		},
		"short": func(req *mad.SAMAD) ([]byte, error) { b, _ := ok(req, nil); return b[:100], nil },
	} {
		c, _ := client(bad)
		if _, err := c.Join(ctx, rec, mad.IPoIBBroadcastJoinMask); !errors.Is(err, ErrBadResponse) {
			t.Errorf("%s: %v, want ErrBadResponse", name, err)
		}
	}

	// A status is a *StatusError naming the operation and the status.
	c, _ = client(func(req *mad.SAMAD) ([]byte, error) {
		r := req.ErrorResponse(mad.StatusSAReqInvalid)
		return r.Bytes(), nil
	})
	var se *StatusError
	err := c.Leave(ctx, rec, mad.LeaveMask)
	if !errors.As(err, &se) || se.Status != mad.StatusSAReqInvalid || se.Op != "leave" {
		t.Errorf("leave refused: %v", err)
	}

	// GetTable: no records is an empty table, other statuses are errors.
	c, _ = client(func(req *mad.SAMAD) ([]byte, error) {
		r := req.ErrorResponse(mad.StatusSANoRecords)
		return r.Bytes(), nil
	})
	if ns, err := c.Nodes(ctx); err != nil || len(ns) != 0 {
		t.Errorf("no records: %v %v, want an empty table", ns, err)
	}
	c, _ = client(func(req *mad.SAMAD) ([]byte, error) {
		r := req.ErrorResponse(mad.StatusBadMethodAttr)
		return r.Bytes(), nil
	})
	if _, err := c.Groups(ctx); !errors.As(err, &se) || se.Status != mad.StatusBadMethodAttr {
		t.Errorf("refused table: %v", err)
	}
	// A table whose stride is shorter than the record is malformed, not misread.
	c, _ = client(func(req *mad.SAMAD) ([]byte, error) {
		return ok(req, func(r *mad.SAMAD) { r.SA.AttrOffset = 2 })
	})
	if _, err := c.Nodes(ctx); !errors.Is(err, ErrBadResponse) {
		t.Errorf("16-byte NodeRecords: %v, want ErrBadResponse", err)
	}
	// The context ends a call.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	c, _ = client(func(*mad.SAMAD) ([]byte, error) { return nil, cctx.Err() })
	if _, err := c.ClassPortInfo(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestGetTableReadsLongAnswers(t *testing.T) {
	want := []mad.NodeRecord{{LID: 1, NodeGUID: 1, PortGUID: 2, Desc: "a"}, {LID: 2, NodeGUID: 3, PortGUID: 4, Desc: "b"},
		{LID: 3, NodeGUID: 5, PortGUID: 6, Desc: "c"}}
	c, _ := client(func(req *mad.SAMAD) ([]byte, error) {
		if req.Method != mad.MethodGetTable || req.AttrID != mad.AttrNodeRecord {
			t.Errorf("asked method %#x attribute %#x", req.Method, req.AttrID)
		}
		hdr := req.Response(mad.StatusOK)
		var recs [][]byte
		for _, n := range want {
			b := make([]byte, mad.NodeRecordSize)
			n.Marshal(b)
			recs = append(recs, b)
		}
		return mad.LongTable(&hdr, mad.NodeRecordSize, recs), nil
	})
	got, err := c.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
