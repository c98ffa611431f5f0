package soft

import (
	"context"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
	"ipoibfs/verbs/verbstest"
)

// TestConformance runs the provider conformance suite (verbs/verbstest) on two soft
// HCAs of an in-process fabric; verbs/rdma runs the same suite on rdma_rxe in the
// QEMU guest (TestRxe/conformance).
func TestConformance(t *testing.T) {
	_, _, nodes := fabric(t, "", "a", "b")
	verbstest.Run(t, verbstest.Fixture{
		Dev:       [2]verbs.Device{nodes[0], nodes[1]},
		Port:      1,
		LinkLayer: "InfiniBand",
		PKeyIndex: 0,
		QKey:      verbs.IPoIBQKey,
		// InfiniBand ports are addressed by LID; no GRH needed.
		Dest: func(t *testing.T, to int) verbs.AHAttr {
			return verbs.AHAttr{Port: 1, DLID: nodes[to].SoftPort(1).Attr().LID}
		},
		// A group is reachable once the SA has it with the receiver as a member and the
		// SM has told the sender's port its members.
		Multicast: func(t *testing.T, to int, mgid verbs.GID) (verbs.LID, verbs.AHAttr) {
			p := nodes[to].SoftPort(1)
			g, _ := p.GID(0)
			cl := &sa.Client{Port: p}
			rec, err := cl.Join(context.Background(), mad.MCMemberRecord{MGID: mgid, PortGID: g, PKey: 0xffff, JoinState: mad.JoinFull}, mad.IPoIBBroadcastJoinMask)
			if err != nil {
				t.Fatalf("SA join of %v: %v", mgid, err)
			}
			t.Cleanup(func() {
				cl.Leave(context.Background(), mad.MCMemberRecord{MGID: mgid, PortGID: g, JoinState: mad.JoinFull}, mad.LeaveMask)
			})
			waitFor(t, "the group's route at the sender", func() bool {
				sp := nodes[1-to].SoftPort(1)
				sp.mu.RLock()
				defer sp.mu.RUnlock()
				return len(sp.multi[rec.MLID].Members) == 1
			})
			return rec.MLID, verbs.AHAttr{Port: 1, DLID: rec.MLID, GRH: true, DGID: mgid}
		},
		ModerationErr: nil, // the soft CQ moderates
		// A local length error, as IBTA has it; the QP stays in RTS.
		RecvTooSmallStatus: verbs.WCLocLenErr,
		RecvTooSmallQPErr:  false,
		// Refused at the sender with a local length error.
		OversizeSendStatus: verbs.WCLocLenErr,
	})
}
