package soft

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// FuzzGSIReceive feeds MADs to QP1 of the subnet manager's port (its SA answering),
// as from the ports of the fabric or a stranger, one fabric for the whole run: no
// panic, the RMPP transfers the agent sends stay within maxRMPPSending, and an RMPP
// ACK, STOP or ABORT never reaches the class handler as a request. The transfers
// under way and the fresh TIDs carry over between inputs (one fabric per run), so a
// saved failing input may need the run before it to fail again.
func FuzzGSIReceive(f *testing.F) {
	_, smh, nodes := fabric(f, "", "a", "b", "c")
	p := smh.SoftPort(1)
	g := &p.gsi
	// Where a MAD comes from: the fabric's ports, as the SM port knows their routes,
	// and a LID it has no route to.
	var from []ctlRoute
	p.mu.RLock()
	for _, h := range append([]*HCA{smh}, nodes...) {
		from = append(from, p.uni[h.SoftPort(1).Attr().LID])
	}
	p.mu.RUnlock()
	from = append(from, ctlRoute{LID: 0x7777, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 0xdead), Addr: netip.MustParseAddrPort("127.0.0.1:9")})
	a := from[1]

	// The SA handler, wrapped to see what reaches it.
	g.hmu.RLock()
	sa := g.handler[mad.ClassSA]
	g.hmu.RUnlock()
	if sa == nil {
		f.Fatal("no SA handler on the SM's port")
	}
	var rmppCtl atomic.Int64 // ACK, STOP and ABORT handed to the handler
	g.Register(mad.ClassSA, func(src verbs.MADSource, m []byte) []byte {
		if t := mad.RMPPType(m); t != 0 && t != mad.RMPPTypeData {
			rmppCtl.Add(1)
		}
		return sa(src, m)
	})
	f.Cleanup(func() { g.Register(mad.ClassSA, sa) })

	// A GetTable of every path: more than one MAD, so answered through RMPP.
	const tid = 0x1234
	req := mad.NewSARequest(mad.MethodGetTable, mad.AttrPathRecord, tid, 0)
	reqb := req.Bytes()
	// The ACK, STOP and ABORT a requester sends back for that answer.
	resp := req.Response(0)
	resp.Method = mad.MethodGetTableResp
	long := append(resp.Bytes(), make([]byte, 2*mad.RMPPSegData)...)
	segs, err := mad.SplitRMPP(long)
	if err != nil {
		f.Fatal(err)
	}
	ack := mad.RMPPAck(segs[0], 1, mad.RMPPWindow)
	stop, abort := slices.Clone(ack), slices.Clone(ack)
	stop[mad.HeaderSize+1], abort[mad.HeaderSize+1] = mad.RMPPTypeStop, mad.RMPPTypeAbort
	unknown := mad.NewSARequest(mad.MethodGetResp, mad.AttrPathRecord, 0xdead, 0)
	for _, s := range []struct {
		m    []byte
		from uint8
	}{
		{reqb, 1}, {ack, 1}, {stop, 1}, {reqb, 2}, {abort, 2},
		{unknown.Bytes(), 1}, {reqb[:23], 1}, {reqb[:100], 3}, {reqb, 4}, {segs[1], 1},
	} {
		f.Add(s.m, s.from, uint32(verbs.GSIQPN), false)
	}
	f.Add(reqb, uint8(2), uint32(verbs.GSIQPN), true)

	// The harness reaches the RMPP sender: the GetTable from a starts a transfer.
	g.receive(a, verbs.GSIQPN, reqb)
	waitFor(f, "the RMPP answer under way", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.sending[rmppKey{a.LID, tid}] != nil
	})

	// fresh stamps a TID never used before, as a flood of requests has: the fuzzer
	// would seldom change one on its own, and a resent TID is no new transfer.
	var tids uint64 = 1 << 40
	f.Fuzz(func(t *testing.T, m []byte, src uint8, srcQP uint32, fresh bool) {
		if fresh && len(m) >= mad.HeaderSize {
			m = slices.Clone(m)
			tids++
			binary.BigEndian.PutUint64(m[8:], tids)
		}
		g.receive(from[int(src)%len(from)], verbs.QPN(srcQP&0xffffff), m)
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.sending) > maxRMPPSending {
			t.Fatalf("%d RMPP transfers under way, at most %d", len(g.sending), maxRMPPSending)
		}
		if n := rmppCtl.Load(); n != 0 {
			t.Fatalf("%d RMPP ACK/STOP/ABORT reached the class handler", n)
		}
	})
}
