package sadb

import (
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

func nodeLIDs(t *testing.T, m answer) []verbs.LID {
	t.Helper()
	var out []verbs.LID
	for _, b := range dataRecs(t, m, mad.NodeRecordSize) {
		var r mad.NodeRecord
		if err := r.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		out = append(out, r.LID)
	}
	return out
}

// osm_sa_node_record.c: an untrusted requester sees the nodes it shares a partition
// with (two limited members of one partition do not share it); with the SM_Key it
// sees all of them.
func TestNodeRecordVisibility(t *testing.T) {
	db := New(listingFabric{&fakeFabric{ports: allPorts}})
	table := mad.NewSARequest(mad.MethodGetTable, mad.AttrNodeRecord, 1, 0)
	for _, c := range []struct {
		src  Port
		req  mad.SAMAD
		want []verbs.LID
	}{
		{portD, table, []verbs.LID{1, 3, 4, 5}},
		{portE, table, []verbs.LID{1, 3, 4, 6}},
		{portB, table, []verbs.LID{1, 3, 4, 5, 6}},
		{portD, withSMKey(table, DefaultSMKey), []verbs.LID{1, 3, 4, 5, 6}},
	} {
		m := send(t, db, c.src, c.req)
		if m.Status != mad.StatusOK {
			t.Fatalf("from LID %d: %v", c.src.LID, m.Status)
		}
		diff(t, "visible LIDs", c.want, nodeLIDs(t, m))
	}
}

func TestNodeRecordsPortInfoAndPKeys(t *testing.T) {
	a := portA
	a.NodeGUID, a.PortNum, a.NumPorts, a.Desc, a.MaxMTU, a.Width, a.Speed = 0x200001, 1, 2, "sm node", verbs.MTU4096, 2, 4
	ports := append([]Port{a}, allPorts[1:]...)
	db := New(listingFabric{&fakeFabric{ports: ports}})

	get := mad.NewSARequest(mad.MethodGet, mad.AttrNodeRecord, 2, compNodeLID)
	(&mad.NodeRecord{LID: 1}).Marshal(get.Data[:])
	m := send(t, db, portB, get)
	var n mad.NodeRecord
	if err := n.Unmarshal(m.Data[:]); err != nil || m.Status != mad.StatusOK {
		t.Fatalf("NodeRecord Get of LID 1: %v %v", m.Status, err)
	}
	want := mad.NodeRecord{LID: 1, NodeType: mad.NodeTypeCA, NumPorts: 2, SysImageGUID: 0x200001, NodeGUID: 0x200001,
		PortGUID: 0x100001, PartitionCap: verbs.PKeyTableCapacity, LocalPort: 1, Desc: "sm node"}
	diff(t, "NodeRecord", want, n)

	// A Get that matches nothing is 0x0300, one that matches several 0x0400.
	(&mad.NodeRecord{LID: 99}).Marshal(get.Data[:])
	if st := send(t, db, portB, get).Status; st != mad.StatusSANoRecords {
		t.Errorf("Get of LID 99: %v, want no records", st)
	}
	if st := send(t, db, portB, mad.NewSARequest(mad.MethodGet, mad.AttrNodeRecord, 3, 0)).Status; st != mad.StatusSATooManyRecords {
		t.Errorf("Get of every node: %v, want too many records", st)
	}

	pir := mad.NewSARequest(mad.MethodGet, mad.AttrPortInfoRecord, 4, compPIRLID)
	(&mad.PortInfoRecord{LID: 1}).Marshal(pir.Data[:])
	m = send(t, db, portB, pir)
	var p mad.PortInfoRecord
	if err := p.Unmarshal(m.Data[:]); err != nil || m.Status != mad.StatusOK {
		t.Fatalf("PortInfoRecord Get: %v %v", m.Status, err)
	}
	if p.PortLID != 1 || p.MasterSMLID != 1 || p.State != verbs.PortActive || p.MTUCap != verbs.MTU4096 ||
		p.NeighborMTU != verbs.MTU2048 || p.LinkWidthAct != 2 || p.LinkSpeedAct != 4 || p.CapMask&capMaskIsSM == 0 ||
		p.GIDPrefix != portA.GID.Prefix() {
		t.Errorf("PortInfoRecord of the SM's port: %+v", p)
	}

	pk := mad.NewSARequest(mad.MethodGetTable, mad.AttrPKeyTableRecord, 5, compPKeyLID)
	(&mad.PKeyTableRecord{LID: 3}).Marshal(pk.Data[:])
	m = send(t, db, portB, pk)
	recs := dataRecs(t, m, mad.PKeyTableRecordSize)
	if len(recs) != 1 {
		t.Fatalf("%d P_Key blocks for LID 3, want 1", len(recs))
	}
	var k mad.PKeyTableRecord
	_ = k.Unmarshal(recs[0])
	diff(t, "P_Keys of LID 3", portB.PKeys, k.PKeys[:len(portB.PKeys)])
	if k.PKeys[len(portB.PKeys)] != 0 {
		t.Errorf("P_Key block not zero after the table: %v", k.PKeys)
	}
	if st := send(t, db, portB, mad.NewSARequest(mad.MethodDelete, mad.AttrPKeyTableRecord, 6, 0)).Status; st != mad.StatusBadMethodAttr {
		t.Errorf("P_KeyTableRecord Delete: %v", st)
	}
}
