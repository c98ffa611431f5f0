package soft

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"ipoibfs/verbs"
)

var addrCmp = cmpopts.EquateComparable(netip.AddrPort{})

func TestCtlRoundTrip(t *testing.T) {
	h := ctlHello{NodeGUID: 1, PortGUID: 2, PortNum: 3, NumPorts: 4, MaxMTU: verbs.MTU4096, Width: 4,
		LaneMbps: 10000, Epoch: 7, RoutesVersion: 9, NodeDesc: "node x"}
	var h2 ctlHello
	_, body, err := parseCtl(h.append(putCtlHeader(nil, ctlAttrHello, 0)))
	if err != nil || h2.parse(body) != nil || !cmp.Equal(h, h2) {
		t.Fatalf("hello: %v %v", err, cmp.Diff(h, h2))
	}
	c := ctlConfig{LID: 5, SMLID: 1, State: verbs.PortActive, ActiveMTU: verbs.MTU2048, Rate: 7,
		Reregister: true, SMEpoch: 99, SMGID: verbs.MakeGID(verbs.DefaultGIDPrefix, 0x1234),
		GIDPrefix: verbs.DefaultGIDPrefix, PKeys: []verbs.PKey{0xffff, 0x8001, 0x0002}}
	var c2 ctlConfig
	_, body, _ = parseCtl(c.append(putCtlHeader(nil, ctlAttrConfig, 0)))
	if err := c2.parse(body); err != nil || !cmp.Equal(c, c2) {
		t.Fatalf("config: %v %v", err, cmp.Diff(c, c2))
	}
	r := ctlRoutes{Version: 3, Part: 1, Parts: 2, Faults: Faults{Loss: 0.25, Dup: 0.5, Reorder: 0.125, Delay: time.Millisecond},
		Uni:   []ctlRoute{{LID: 1, GID: verbs.MakeGID(verbs.DefaultGIDPrefix, 1), Addr: netip.MustParseAddrPort("127.0.0.1:4791")}},
		Multi: []ctlMRoute{{MLID: 0xc000, MGID: verbs.GID{0xff, 0x12}, Members: []verbs.LID{1, 2}}}}
	var r2 ctlRoutes
	_, body, _ = parseCtl(r.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	if err := r2.parse(body); err != nil || !cmp.Equal(r, r2, addrCmp) {
		t.Fatalf("routes: %v %v", err, cmp.Diff(r, r2, addrCmp))
	}
	// A table in more parts than any fabric needs is refused: a port keeps the parts
	// until the last comes, and a sender that never sends it must not fill memory.
	r.Part, r.Parts = 5, maxRoutesParts+1
	_, body, _ = parseCtl(r.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	if err := r2.parse(body); err == nil {
		t.Fatalf("routes in %d parts accepted", r.Parts)
	}
}

// FuzzCtl feeds arbitrary control messages to all four parsers: no panic, and what
// parses re-encodes to something that parses to the same value.
func FuzzCtl(f *testing.F) {
	h := ctlHello{PortNum: 1, MaxMTU: 4, NodeDesc: "x"}
	f.Add(h.append(putCtlHeader(nil, ctlAttrHello, 0)))
	c := ctlConfig{LID: 2, State: 4, ActiveMTU: 4, PKeys: []verbs.PKey{0xffff}}
	f.Add(c.append(putCtlHeader(nil, ctlAttrConfig, 0)))
	r := ctlRoutes{Parts: 1, Uni: []ctlRoute{{LID: 1, Addr: netip.MustParseAddrPort("127.0.0.1:1")}}, Multi: []ctlMRoute{{MLID: 0xc000, Members: []verbs.LID{1}}}}
	f.Add(r.append(putCtlHeader(nil, ctlAttrRoutes, 0)))
	d := ctlRoutesDelta{From: 1, DelUni: []verbs.LID{2}, DelMulti: []verbs.LID{0xc001}, Routes: r}
	f.Add(d.append(putCtlHeader(nil, ctlAttrDelta, 0)))
	f.Fuzz(func(t *testing.T, b []byte) {
		attr, body, err := parseCtl(b)
		if err != nil {
			return
		}
		switch attr {
		case ctlAttrHello:
			var m, m2 ctlHello
			if m.parse(body) == nil {
				if err := m2.parse(m.append(nil)); err != nil || !cmp.Equal(m, m2) {
					t.Fatalf("hello unstable: %v", err)
				}
			}
		case ctlAttrConfig:
			var m, m2 ctlConfig
			if m.parse(body) == nil {
				if err := m2.parse(m.append(nil)); err != nil || !cmp.Equal(m, m2) {
					t.Fatalf("config unstable: %v", err)
				}
			}
		case ctlAttrDelta:
			var m, m2 ctlRoutesDelta
			if m.parse(body) == nil {
				if err := m2.parse(m.append(nil)); err != nil || m.From != m2.From || !cmp.Equal(m.DelUni, m2.DelUni) ||
					!cmp.Equal(m.DelMulti, m2.DelMulti) || !cmp.Equal(m.Routes.Uni, m2.Routes.Uni, addrCmp) || !cmp.Equal(m.Routes.Multi, m2.Routes.Multi) {
					t.Fatalf("delta unstable: %v", err)
				}
			}
		case ctlAttrRoutes:
			var m, m2 ctlRoutes
			if m.parse(body) == nil {
				if err := m2.parse(m.append(nil)); err != nil || !cmp.Equal(m.Uni, m2.Uni, addrCmp) || !cmp.Equal(m.Multi, m2.Multi) {
					t.Fatalf("routes unstable: %v", err)
				}
			}
		}
	})
}

// Tables larger than a datagram go in parts, each small enough, which join up to the
// whole; a port applies them when every part of one version is there, whatever the
// order, and a newer version's part drops an unfinished older one.
func TestRoutesInParts(t *testing.T) {
	r := ctlRoutes{Version: 7, Faults: Faults{Loss: 0.5}}
	for k := range 300 {
		r.Uni = append(r.Uni, ctlRoute{LID: verbs.LID(k + 1), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, byte(k >> 8), byte(k)}), 4791)})
	}
	for k := range 4000 {
		r.Multi = append(r.Multi, ctlMRoute{MLID: verbs.LID(0xc000 + k), MGID: verbs.GID{0xff, 0x12, byte(k >> 8), byte(k)}, Members: []verbs.LID{1, 2, 3}})
	}
	parts := r.split()
	if len(parts) < 3 {
		t.Fatalf("%d parts", len(parts))
	}
	var whole ctlRoutes
	for k, part := range parts {
		b := part.append(putCtlHeader(nil, ctlAttrRoutes, 0))
		if len(b) > maxRoutesPart+ctlHeaderLen {
			t.Errorf("part %d: %d bytes", k, len(b))
		}
		var back ctlRoutes
		_, body, _ := parseCtl(b)
		if err := back.parse(body); err != nil || back.Part != uint16(k) || back.Parts != uint16(len(parts)) || back.Version != 7 || back.Faults != r.Faults {
			t.Fatalf("part %d: %v %+v", k, err, back.Faults)
		}
		whole.Uni = append(whole.Uni, back.Uni...)
		whole.Multi = append(whole.Multi, back.Multi...)
	}
	if !cmp.Equal(r.Uni, whole.Uni, addrCmp) || !cmp.Equal(r.Multi, whole.Multi) {
		t.Fatal("the parts do not join up to the tables")
	}

	p := newPort(&HCA{}, 1, nil)
	older := ctlRoutes{Version: 6, Part: 0, Parts: 2, Uni: []ctlRoute{{LID: 99}}}
	p.applyRoutes(&older)
	for k := len(parts) - 1; k >= 0; k-- { // backwards, and the older version left unfinished
		if p.routesV == 7 {
			t.Fatalf("applied before part %d arrived", k)
		}
		p.applyRoutes(&parts[k])
	}
	if p.routesV != 7 || len(p.uni) != 300 || len(p.multi) != 4000 || p.uni[99].LID != 99 || p.partial != nil {
		t.Fatalf("after all parts: version %d, %d unicast, %d multicast routes", p.routesV, len(p.uni), len(p.multi))
	}
}

func TestParseFaults(t *testing.T) {
	f, err := ParseFaults(Faults{Dup: 0.5}, "loss 2%\nreorder 0.02 delay 1ms")
	if err != nil || f != (Faults{Loss: 0.02, Dup: 0.5, Reorder: 0.02, Delay: time.Millisecond}) {
		t.Fatalf("%+v %v", f, err)
	}
	back, err := ParseFaults(Faults{}, f.String())
	if err != nil || back != f {
		t.Fatalf("round trip %+v %v", back, err)
	}
	for _, bad := range []string{"", "loss", "loss x", "loss 1.5", "jitter 1", "delay soon", "loss -1%", "delay 11s"} {
		if _, err := ParseFaults(Faults{}, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
