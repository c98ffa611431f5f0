package sadb

import (
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// ipoibPath is the Linux ipoib PathRecord query plus Reversible, as in the ibsim-sa
// capture: DGID|SGID|TClass|Reversible|NumbPath|P_Key.
const ipoibPath = mad.IPoIBPathMask | mad.CompPRReversible

func pathBC() mad.PathRecord {
	return mad.PathRecord{DGID: portC.GID, SGID: portB.GID, PKey: 0xffff, Reversible: true, NumbPath: 1}
}

// wantBC is the answer for B→C: MTU min(2048, 4096), rate min(10, 40) Gb/s.
func wantBC(pkey verbs.PKey) mad.PathRecord {
	return mad.PathRecord{DGID: portC.GID, SGID: portB.GID, DLID: 4, SLID: 3, Reversible: true, PKey: pkey,
		MTUSelector: 2, MTU: verbs.MTU2048, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, PacketLifeTime: 18}
}

type prCase struct {
	name   string
	fabric Fabric
	setup  []step
	src    Port
	req    mad.SAMAD
	status mad.Status
	want   []mad.PathRecord
}

func TestPathRecord(t *testing.T) {
	mod := func(f func(*mad.PathRecord)) mad.PathRecord { r := pathBC(); f(&r); return r }
	w := func(pk verbs.PKey, f func(*mad.PathRecord)) []mad.PathRecord {
		r := wantBC(pk)
		if f != nil {
			f(&r)
		}
		return []mad.PathRecord{r}
	}
	get := func(mask uint64, r mad.PathRecord) mad.SAMAD { return prReq(mad.MethodGet, mask, r) }
	table := func(mask uint64, r mad.PathRecord) mad.SAMAD { return prReq(mad.MethodGetTable, mask, r) }
	mtu := mad.CompPRMTU | mad.CompPRMTUSelector
	rate := mad.CompPRRate | mad.CompPRRateSelector
	life := mad.CompPRPacketLifeTime | mad.CompPRPacketLifeTimeSelector
	listing := listingFabric{&fakeFabric{ports: allPorts}}
	cases := []prCase{
		{name: "IPoIB query", src: portB, req: get(ipoibPath, pathBC()), want: w(0xffff, nil)},
		{name: "TClass, FlowLabel and HopLimit are not echoed", src: portB,
			req:  get(ipoibPath|mad.CompPRFlowLabel|mad.CompPRHopLimit, mod(func(r *mad.PathRecord) { r.TClass, r.FlowLabel, r.HopLimit = 5, 0x12345, 3 })),
			want: w(0xffff, nil)},
		{name: "by LIDs", src: portB, req: get(mad.CompPRDLID|mad.CompPRSLID, mad.PathRecord{DLID: 4, SLID: 3}), want: w(0x8001, nil)},
		// first shared partition in OpenSM's map order: 0x0001 before 0x0002, 0x0003, 0x7fff
		{name: "no P_Key: first shared", src: portB, req: get(ipoibPath&^mad.CompPRPKey, pathBC()), want: w(0x8001, nil)},
		{name: "P_Key nobody has", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.PKey = 0x8005 })), status: mad.StatusSANoRecords},
		{name: "both limited", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.PKey = 0x0003 })), status: mad.StatusSANoRecords},
		{name: "full and limited, requested key echoed", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.PKey = 0x0002 })), want: w(0x0002, func(r *mad.PathRecord) { r.SL = 3 })},
		{name: "limited key of a full partition echoed", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.PKey = 0x7fff })), want: w(0x7fff, nil)},
		{name: "P_Key 0", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.PKey = 0 })), status: mad.StatusSANoRecords},
		{name: "GetTable with nothing shared", src: portD, req: table(mad.CompPRDGID|mad.CompPRSGID, mad.PathRecord{DGID: portE.GID, SGID: portD.GID}), want: []mad.PathRecord{}},
		{name: "GetTable gives one path per pair", src: portB, req: table(mad.CompPRDGID|mad.CompPRSGID, pathBC()), want: w(0x8001, nil)},
		{name: "requester sharing no P_Key with the ends", src: Port{GUID: 0x10000b, GID: gid("fe80::10:b"), LID: 7, PKeys: []verbs.PKey{0x8006}}, req: get(ipoibPath, pathBC()), status: mad.StatusSANoRecords},
		{name: "third-party query", src: portA, req: get(ipoibPath, pathBC()), want: w(0xffff, nil)},
		{name: "unknown DGID", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.DGID = gid("fe80::10:99") })), status: mad.StatusSANoRecords},
		{name: "unknown DGID GetTable", src: portB, req: table(ipoibPath, mod(func(r *mad.PathRecord) { r.DGID = gid("fe80::10:99") })), want: []mad.PathRecord{}},
		{name: "unknown DLID", src: portB, req: get(mad.CompPRDLID, mad.PathRecord{DLID: 9}), status: mad.StatusSANoRecords},
		{name: "off-subnet DGID", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.DGID = gid("2001::10:5") })), status: mad.StatusSANoRecords},
		{name: "off-subnet SGID", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.SGID = gid("2001::10:3") })), status: mad.StatusSANoRecords},
		// link-local GIDs are looked up by GUID; a given SGID is echoed as is
		{name: "other link-local prefix", src: portB,
			req:  get(ipoibPath, mod(func(r *mad.PathRecord) { r.DGID, r.SGID = gid("fe81::10:5"), gid("fe81::10:3") })),
			want: w(0xffff, func(r *mad.PathRecord) { r.SGID = gid("fe81::10:3") })},
		{name: "DGID and DLID disagree", src: portB, req: get(mad.CompPRDGID|mad.CompPRDLID, mad.PathRecord{DGID: portC.GID, DLID: 1}), status: mad.StatusSAReqInvalid},
		{name: "SGID and SLID disagree", src: portB, req: get(mad.CompPRDGID|mad.CompPRSGID|mad.CompPRSLID, mad.PathRecord{DGID: portC.GID, SGID: portB.GID, SLID: 4}), status: mad.StatusSAReqInvalid},
		{name: "half a ServiceID", src: portB, req: get(ipoibPath|mad.CompPRServiceID8MSB, pathBC()), status: mad.StatusSAInsufficientComponents},
		{name: "ServiceID ignored", src: portB, req: get(ipoibPath|mad.CompPRServiceID, mod(func(r *mad.PathRecord) { r.ServiceID = 0x1234 })), want: w(0xffff, nil)},
		{name: "only DGID: source is the requester", src: portB, req: get(mad.CompPRDGID, mad.PathRecord{DGID: portC.GID}), want: w(0x8001, nil)},
		{name: "only DLID with a PortLister: every source", fabric: listing, src: portB, req: table(mad.CompPRDLID, mad.PathRecord{DLID: 4}),
			want: []mad.PathRecord{
				{DGID: portC.GID, SGID: portA.GID, DLID: 4, SLID: 1, Reversible: true, PKey: 0x8001, MTUSelector: 2, MTU: 4, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, PacketLifeTime: 18},
				wantBC(0x8001),
				{DGID: portC.GID, SGID: portC.GID, DLID: 4, SLID: 4, Reversible: true, PKey: 0x8001, MTUSelector: 2, MTU: 5, RateSelector: 2, Rate: 7, PacketLifeTimeSelector: 2},
				// Beyond one MAD: the long answer (RMPP) carries the rest.
				{DGID: portC.GID, SGID: portD.GID, DLID: 4, SLID: 5, Reversible: true, PKey: 0x7fff, MTUSelector: 2, MTU: 5, RateSelector: 2, Rate: 5, PacketLifeTimeSelector: 2, PacketLifeTime: 18},
				{DGID: portC.GID, SGID: portE.GID, DLID: 4, SLID: 6, Reversible: true, PKey: 0x7fff, MTUSelector: 2, MTU: 4, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, PacketLifeTime: 18},
			}},
		{name: "only DLID Get with a PortLister: first source", fabric: listing, src: portB, req: get(mad.CompPRDLID, mad.PathRecord{DLID: 4}),
			want: []mad.PathRecord{{DGID: portC.GID, SGID: portA.GID, DLID: 4, SLID: 1, Reversible: true, PKey: 0x8001, MTUSelector: 2, MTU: 4, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, PacketLifeTime: 18}}},
		{name: "loopback has PacketLifeTime 0", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.DGID = portB.GID })),
			want: []mad.PathRecord{{DGID: portB.GID, SGID: portB.GID, DLID: 3, SLID: 3, Reversible: true, PKey: 0xffff, MTUSelector: 2, MTU: 4, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2}}},
		{name: "SL requested", src: portB, req: get(ipoibPath|mad.CompPRSL, mod(func(r *mad.PathRecord) { r.SL = 2 })), want: w(0xffff, func(r *mad.PathRecord) { r.SL = 2 })},
		{name: "partition SL", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.PKey = 0x8002 })), want: w(0x8002, func(r *mad.PathRecord) { r.SL = 3 })},
		{name: "raw traffic has no P_Key", src: portB, req: get(ipoibPath|mad.CompPRRawTraffic, mod(func(r *mad.PathRecord) { r.RawTraffic = true })), want: w(0, nil)},
		{name: "NumbPath 0 in GetTable", src: portB, req: table(mad.CompPRDGID|mad.CompPRSGID|mad.CompPRNumbPath, mad.PathRecord{DGID: portC.GID, SGID: portB.GID}), want: []mad.PathRecord{}},
		{name: "NumbPath 0 in Get", src: portB, req: get(ipoibPath, mod(func(r *mad.PathRecord) { r.NumbPath = 0 })), want: w(0xffff, nil)},
		{name: "MTU exactly 4096", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 2, 5 })), status: mad.StatusSANoRecords},
		{name: "MTU exactly 1024", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 2, 3 })), want: w(0xffff, func(r *mad.PathRecord) { r.MTU = 3 })},
		{name: "MTU less than 2048", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 1, 4 })), want: w(0xffff, func(r *mad.PathRecord) { r.MTU = 3 })},
		{name: "MTU less than 4096", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 1, 5 })), want: w(0xffff, nil)},
		{name: "MTU less than 256", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 1, 1 })), status: mad.StatusSANoRecords},
		{name: "MTU greater than 1024", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 0, 3 })), want: w(0xffff, nil)},
		{name: "MTU greater than 2048", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 0, 4 })), status: mad.StatusSANoRecords},
		{name: "MTU largest", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 3, 1 })), want: w(0xffff, nil)},
		{name: "MTU selector alone ignored", src: portB, req: get(ipoibPath|mad.CompPRMTUSelector, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 2, 5 })), want: w(0xffff, nil)},
		{name: "invalid MTU", src: portB, req: get(ipoibPath|mtu, mod(func(r *mad.PathRecord) { r.MTUSelector, r.MTU = 2, 7 })), status: mad.StatusSAReqInvalid},
		{name: "rate exactly 10", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 2, 3 })), want: w(0xffff, nil)},
		{name: "rate exactly 5", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 2, 5 })), status: mad.StatusSANoRecords},
		{name: "rate exactly 40", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 2, 7 })), status: mad.StatusSANoRecords},
		{name: "rate less than 10", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 1, 3 })), want: w(0xffff, func(r *mad.PathRecord) { r.Rate = 5 })},
		{name: "rate less than 5", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 1, 5 })), want: w(0xffff, func(r *mad.PathRecord) { r.Rate = 2 })},
		{name: "rate less than 2.5", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 1, 2 })), status: mad.StatusSANoRecords},
		{name: "rate less than 40", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 1, 7 })), want: w(0xffff, nil)},
		{name: "rate greater than 5 (by bandwidth)", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 0, 5 })), want: w(0xffff, nil)},
		{name: "rate greater than 10", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 0, 3 })), status: mad.StatusSANoRecords},
		{name: "invalid rate", src: portB, req: get(ipoibPath|rate, mod(func(r *mad.PathRecord) { r.RateSelector, r.Rate = 2, 23 })), status: mad.StatusSAReqInvalid},
		{name: "5G end port", src: portD, req: get(mad.CompPRDGID|mad.CompPRSGID, mad.PathRecord{DGID: portC.GID, SGID: portD.GID}),
			want: []mad.PathRecord{{DGID: portC.GID, SGID: portD.GID, DLID: 4, SLID: 5, Reversible: true, PKey: 0x7fff, MTUSelector: 2, MTU: 5, RateSelector: 2, Rate: 5, PacketLifeTimeSelector: 2, PacketLifeTime: 18}}},
		{name: "PacketLifeTime exactly 5", src: portB, req: get(ipoibPath|life, mod(func(r *mad.PathRecord) { r.PacketLifeTimeSelector, r.PacketLifeTime = 2, 5 })), want: w(0xffff, func(r *mad.PathRecord) { r.PacketLifeTime = 5 })},
		{name: "PacketLifeTime less than 18", src: portB, req: get(ipoibPath|life, mod(func(r *mad.PathRecord) { r.PacketLifeTimeSelector, r.PacketLifeTime = 1, 18 })), want: w(0xffff, func(r *mad.PathRecord) { r.PacketLifeTime = 17 })},
		{name: "PacketLifeTime greater than 18", src: portB, req: get(ipoibPath|life, mod(func(r *mad.PathRecord) { r.PacketLifeTimeSelector, r.PacketLifeTime = 0, 18 })), status: mad.StatusSANoRecords},
		{name: "PacketLifeTime greater than 17", src: portB, req: get(ipoibPath|life, mod(func(r *mad.PathRecord) { r.PacketLifeTimeSelector, r.PacketLifeTime = 0, 17 })), want: w(0xffff, nil)},
		{name: "Set is not supported", src: portB, req: prReq(mad.MethodSet, ipoibPath, pathBC()), status: mad.StatusBadMethodAttr},
		{name: "Delete is not supported", src: portB, req: prReq(mad.MethodDelete, ipoibPath, pathBC()), status: mad.StatusBadMethodAttr},
		{name: "multicast path", setup: []step{{portC, joinReq(mgidBcast, portC.GID, 0xffff, 1)}}, src: portB,
			req: get(mad.CompPRDGID|mad.CompPRSGID, mad.PathRecord{DGID: mgidBcast, SGID: portC.GID, Preference: 1}),
			want: []mad.PathRecord{{DGID: mgidBcast, SGID: portC.GID, DLID: 0xc000, NumbPath: 1, PKey: 0xffff, Preference: 1,
				MTUSelector: 2, MTU: 4, RateSelector: 2, Rate: 3, PacketLifeTimeSelector: 2, PacketLifeTime: 18}}},
		{name: "multicast path from a non-member", src: portB, req: get(mad.CompPRDGID|mad.CompPRSGID, mad.PathRecord{DGID: mgidBcast, SGID: portC.GID}), status: mad.StatusSANoRecords},
		{name: "multicast path of an unknown group", src: portB, req: get(mad.CompPRDGID, mad.PathRecord{DGID: gid("ff12::77")}), status: mad.StatusSANoRecords},
		{name: "multicast path with the wrong P_Key", src: portB, req: get(mad.CompPRDGID|mad.CompPRPKey, mad.PathRecord{DGID: mgidBcast, PKey: 0x7fff}), status: mad.StatusSANoRecords},
		{name: "multicast path NumbPath 0", src: portB, req: table(mad.CompPRDGID|mad.CompPRNumbPath, mad.PathRecord{DGID: mgidBcast}), want: []mad.PathRecord{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.fabric
			if f == nil {
				f = &fakeFabric{ports: allPorts}
			}
			db := New(f)
			db.SetConfiguredGroups(testGroups())
			for _, s := range c.setup {
				mustOK(t, db, s.src, s.req)
			}
			m := send(t, db, c.src, c.req)
			if m.Status != c.status {
				t.Fatalf("status %v, want %v", m.Status, c.status)
			}
			if c.want != nil {
				got := prRecs(t, m)
				if got == nil {
					got = []mad.PathRecord{}
				}
				diff(t, "records", c.want, got)
			}
		})
	}
}

// TestCommonPKeyOrder: without a P_Key in the query OpenSM takes the first shared
// partition in its map order, keyed by the base in network byte order.
func TestCommonPKeyOrder(t *testing.T) {
	a := Port{GUID: 1, GID: gid("fe80::1"), LID: 1, MTU: 4, Rate: 3, PKeys: []verbs.PKey{0x8002, 0x8100}}
	b := Port{GUID: 2, GID: gid("fe80::2"), LID: 2, MTU: 4, Rate: 3, PKeys: []verbs.PKey{0x0100, 0x0002}}
	db := New(&fakeFabric{ports: []Port{a, b}})
	got := prRecs(t, send(t, db, a, prReq(mad.MethodGet, mad.CompPRDLID, mad.PathRecord{DLID: 2})))
	if len(got) != 1 || got[0].PKey != 0x8100 {
		t.Errorf("records %+v, want P_Key 0x8100 (0x0001 in network order sorts first)", got)
	}
}

// A GetTable of every path (no component) on a large fabric is refused with "too many
// records" before the table is built, when it could not go in one RMPP transfer: it is
// quadratic in the ports, and one 256-byte request must not make gigabytes.
func TestPathTableTooLongIsRefused(t *testing.T) {
	var ports []Port
	for k := range 300 {
		g := verbs.MakeGID(0xfe80<<48, verbs.GUID(0x200000+k))
		ports = append(ports, Port{GUID: verbs.GUID(0x200000 + k), GID: g, LID: verbs.LID(k + 1), MTU: verbs.MTU2048, Rate: 3, PKeys: []verbs.PKey{0xffff}})
	}
	ports[0].IsSM = true
	db := New(listingFabric{&fakeFabric{ports: ports}})
	if got := send(t, db, ports[0], prReq(mad.MethodGetTable, 0, mad.PathRecord{})).Status; got != mad.StatusSATooManyRecords {
		t.Fatalf("GetTable of %d x %d paths: status %v, want too many records", len(ports), len(ports), got)
	}
	// One source's paths fit.
	a := send(t, db, ports[0], prReq(mad.MethodGetTable, mad.CompPRSGID, mad.PathRecord{SGID: ports[0].GID}))
	if a.Status != mad.StatusOK {
		t.Fatalf("GetTable of one source's paths: status %v", a.Status)
	}
}
