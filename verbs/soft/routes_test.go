package soft

import (
	"encoding/binary"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft/sadb"
)

// The forwarding tables reach every port over UDP however large they are: 4000
// multicast groups are about 80 KB of routes, more than one datagram holds.
func TestRoutesLargerThanADatagram(t *testing.T) {
	smh, nodes := udpFabricSM(t)
	// 4000 groups as partitions.conf would configure them (no SA traffic needed).
	const groups = 4000
	var gs []sadb.GroupParams
	for k := range groups {
		var mgid verbs.GID
		mgid[0], mgid[1], mgid[2], mgid[3] = 0xff, 0x12, 0x60, 0x1b
		mgid[4], mgid[5] = 0xff, 0xff
		binary.BigEndian.PutUint32(mgid[12:], uint32(k+1))
		gs = append(gs, sadb.GroupParams{MGID: mgid, PKey: 0xffff, QKey: verbs.IPoIBQKey, Scope: 2})
	}
	smh.SM().DB().SetConfiguredGroups(gs)
	smh.SM().checkDB()
	want := len(smh.SM().DB().Groups())
	if want < groups {
		t.Fatalf("SM has %d groups", want)
	}
	waitFor(t, "b's port with every route", func() bool {
		p := nodes[1].SoftPort(1)
		p.mu.RLock()
		defer p.mu.RUnlock()
		return len(p.uni) == 3 && len(p.multi) == want
	})
}
