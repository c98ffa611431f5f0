package ipoib

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
	"ipoibfs/verbs/soft"
)

// roceFabric makes soft HCAs look like RoCE ports for GID mode: their ports say
// "Ethernet", and the address handles GID mode makes (GRH, DLID 0) are recorded and
// routed by their DGID, the way a RoCE device routes them, onto the soft fabric's LIDs:
// a unicast GID to its port's LID, a multicast GID to the MLID of a group the test
// joined at the soft SA beforehand (the soft fabric delivers multicast only to an SA
// group's members; on Ethernet the device's multicast attach does it).
type roceFabric struct {
	mu    sync.Mutex
	lids  map[verbs.GID]verbs.LID // port GID or MGID -> LID
	ahs   []verbs.AHAttr          // as the engine asked for them
	noLID verbs.LID               // for MGIDs the test did not join: not delivered
}

type roceDev struct {
	verbs.Device
	f *roceFabric
}

type rocePort struct{ verbs.Port }

func (p rocePort) Attr() verbs.PortAttr {
	a := p.Port.Attr()
	a.LinkLayer = LinkLayerEthernet
	a.LID, a.SMLID = 0, 0
	return a
}

func (d roceDev) Port(n int) (verbs.Port, error) {
	p, err := d.Device.Port(n)
	if err != nil {
		return nil, err
	}
	return rocePort{p}, nil
}

func (f *roceFabric) lid(gid verbs.GID) verbs.LID {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.lids[gid]; ok {
		return l
	}
	return f.noLID
}

func (d roceDev) CreateAH(attr verbs.AHAttr) (verbs.AH, error) {
	d.f.mu.Lock()
	d.f.ahs = append(d.f.ahs, attr)
	d.f.mu.Unlock()
	if attr.GRH && attr.DLID == 0 {
		attr.DLID = d.f.lid(attr.DGID)
	}
	return d.Device.CreateAH(attr)
}

func (d roceDev) CreateQP(attr verbs.QPAttr) (verbs.QP, error) {
	q, err := d.Device.CreateQP(attr)
	if err != nil {
		return nil, err
	}
	return roceQP{q, d.f}, nil
}

type roceQP struct {
	verbs.QP
	f *roceFabric
}

func (q roceQP) AttachMcast(gid verbs.GID, lid verbs.LID) error {
	if lid == 0 {
		lid = q.f.lid(gid)
	}
	return q.QP.AttachMcast(gid, lid)
}

func (q roceQP) DetachMcast(gid verbs.GID, lid verbs.LID) error {
	if lid == 0 {
		lid = q.f.lid(gid)
	}
	return q.QP.DetachMcast(gid, lid)
}

// Two ports that say their link layer is Ethernet run in GID mode: no SA query, the
// broadcast group "joined" from the port's attributes (Q_Key 0x0b1b, MTU the active
// MTU, so the interface MTU is that minus 4), and an IPv4 packet from one to the other
// goes through ARP on the broadcast group and a GID-mode path, on address handles with
// the GRH and DLID 0.
func TestGIDModeOnEthernetPorts(t *testing.T) {
	r := newRig(t)
	f := &roceFabric{lids: map[verbs.GID]verbs.LID{}, noLID: 0xc0ff}
	type end struct {
		hca  *soft.HCA
		e    *Engine
		i    *Interface
		host *fakeHost
		gid  verbs.GID
	}
	var ends [2]*end
	saSeen := 0
	for k, name := range []string{"ra", "rb"} {
		h, err := soft.New(soft.Config{Name: name, Network: r.net, SM: r.smh.Endpoint(1), Heartbeat: hb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		waitFor(t, name+" port active", func() bool { return h.SoftPort(1).Attr().State == verbs.PortActive })
		p, _ := h.Port(1)
		gid, _ := p.GID(0)
		// The soft fabric delivers the broadcast group only to the SA's members: the
		// test joins it at the SA for the port (the engine, in GID mode, does not).
		bc := broadcastAddr(p.PKeyTable()[0] | verbs.PKeyFullMember).GID()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rec, err := (&sa.Client{Port: p}).Join(ctx, mad.MCMemberRecord{MGID: bc, PortGID: gid,
			PKey: p.PKeyTable()[0] | verbs.PKeyFullMember, JoinState: mad.JoinFull}, mad.IPoIBBroadcastJoinMask)
		cancel()
		if err != nil {
			t.Fatalf("%s: SA join of the broadcast group (for the soft fabric's delivery): %v", name, err)
		}
		f.mu.Lock()
		f.lids[gid] = p.Attr().LID
		f.lids[bc] = rec.MLID
		f.mu.Unlock()
		e, err := New(roceDev{h, f}, Options{wrapSA: func(c saClient) saClient {
			if _, ok := c.(gidSA); !ok {
				t.Errorf("%s: SA client %T on an Ethernet port, want gidSA", name, c)
			}
			saSeen++
			return c
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		ends[k] = &end{hca: h, e: e, i: iface(t, e, "ib0"), gid: gid}
	}
	if saSeen != 2 {
		t.Fatalf("%d SA clients made, want 2", saSeen)
	}
	ends[0].host = bringUp(t, ends[0].i, "10.66.0.1/24")
	ends[1].host = bringUp(t, ends[1].i, "10.66.0.2/24")

	for _, x := range ends {
		i := x.i
		if !i.GIDMode() {
			t.Errorf("%s: GIDMode() false on an Ethernet port", i.Name())
		}
		p, _ := x.hca.Port(1)
		want := p.Attr().ActiveMTU.Bytes() - encapLen
		if m := i.MTU(); m != want {
			t.Errorf("%s: MTU %d, want %d (active MTU - 4)", i.Name(), m, want)
		}
		i.dmu.Lock()
		qkey, bg := i.data().qkey, i.bcastGroupLocked()
		var rec mad.MCMemberRecord
		if bg != nil {
			rec = bg.rec
		}
		i.dmu.Unlock()
		if qkey != verbs.IPoIBQKey || rec.MLID != 0 || rec.QKey != verbs.IPoIBQKey || rec.SL != 0 || rec.MTU != p.Attr().ActiveMTU {
			t.Errorf("%s: Q_Key %#x, broadcast group %+v", i.Name(), qkey, rec)
		}
	}

	a, b := ends[0], ends[1]
	ping := icmp4("10.66.0.1", "10.66.0.2", 8, 1, 56)
	a.i.Transmit([][]byte{ping})
	waitFor(t, "the echo request at rb", func() bool {
		return len(b.host.take(func(p []byte) bool { return bytes.Equal(p, ping) })) == 1
	})
	// And back: rb knows ra from its ARP request.
	pong := icmp4("10.66.0.2", "10.66.0.1", 0, 1, 56)
	b.i.Transmit([][]byte{pong})
	waitFor(t, "the echo reply at ra", func() bool {
		return len(a.host.take(func(p []byte) bool { return bytes.Equal(p, pong) })) == 1
	})
	pa, ok := pathOf(a.i, b.gid)
	if !ok || pa.ah == nil || pa.rec.DLID != 0 || pa.rec.DGID != b.gid || pa.rec.MTU.Bytes() != a.i.MTU()+encapLen {
		t.Errorf("ra's path to rb: %v %+v", ok, pa.rec)
	}

	f.mu.Lock()
	ahs := append([]verbs.AHAttr(nil), f.ahs...)
	f.mu.Unlock()
	var uni, multi int
	for _, ah := range ahs {
		if !ah.GRH || ah.DLID != 0 || ah.HopLimit != gidHopLimit || ah.SGIDIndex != 0 {
			t.Errorf("GID-mode address handle %+v: want the GRH, DLID 0, hop limit %d", ah, gidHopLimit)
		}
		switch {
		case ah.DGID == a.i.Broadcast().GID():
			multi++
		case ah.DGID == a.gid || ah.DGID == b.gid:
			uni++
		}
	}
	if uni < 2 || multi < 2 {
		t.Errorf("address handles: %d unicast, %d to the broadcast group; want 2 of each at least: %+v", uni, multi, ahs)
	}
}

// Options.GIDMode puts every port in GID mode, whatever its link layer; without it an
// InfiniBand port keeps the SA.
func TestGIDModeOption(t *testing.T) {
	r := newRig(t)
	for _, on := range []bool{false, true} {
		var kind string
		e := r.engine(map[bool]string{false: "g0", true: "g1"}[on], 1, Options{GIDMode: on, wrapSA: func(c saClient) saClient {
			if _, ok := c.(gidSA); ok {
				kind = "gid"
			} else {
				kind = "sa"
			}
			return c
		}})
		i := iface(t, e, "ib0")
		if want := map[bool]string{false: "sa", true: "gid"}[on]; kind != want || i.GIDMode() != on {
			t.Errorf("GIDMode %v: SA client %q, GIDMode() %v", on, kind, i.GIDMode())
		}
		e.Close()
	}
}

// A datagram with our QPN from LID 0 is our own only if its source GID is ours: on
// RoCE every port's LID is 0 and another device's QP can have our QPN.
func TestGIDModeFromSelf(t *testing.T) {
	own, _ := verbs.ParseGID("fe80::1:2ff:fe03:405")
	other, _ := verbs.ParseGID("fe80::1:2ff:fe03:406")
	v4own, _ := verbs.ParseGID("::ffff:10.9.0.1")
	dgram := func(sgid verbs.GID, v4 bool) []byte {
		b := make([]byte, grhLen+8)
		if v4 {
			copy(b[32:36], sgid[12:])
		} else {
			copy(b[8:24], sgid[:])
		}
		return b
	}
	for _, c := range []struct {
		what    string
		wc      verbs.WC
		buf     []byte
		lid     verbs.LID
		gid     verbs.GID
		want    bool
		comment string
	}{
		{"IB own", verbs.WC{SLID: 5, SrcQP: 0x11, GRH: true}, dgram(other, false), 5, own, true, "LID and QPN decide on InfiniBand"},
		{"IB other LID", verbs.WC{SLID: 6, SrcQP: 0x11, GRH: true}, dgram(own, false), 5, own, false, ""},
		{"RoCE own", verbs.WC{SrcQP: 0x11, GRH: true}, dgram(own, false), 0, own, true, ""},
		{"RoCE same QPN, other GID", verbs.WC{SrcQP: 0x11, GRH: true}, dgram(other, false), 0, own, false, "another rxe device's QP 0x11"},
		{"RoCE other QPN", verbs.WC{SrcQP: 0x12, GRH: true}, dgram(own, false), 0, own, false, ""},
		{"RoCE v2 IPv4 own", verbs.WC{SrcQP: 0x11, GRH: true}, dgram(v4own, true), 0, v4own, true, ""},
		{"RoCE v2 IPv4 other", verbs.WC{SrcQP: 0x11, GRH: true}, dgram(own, true), 0, v4own, false, ""},
	} {
		if got := fromSelf(c.wc, c.buf, c.lid, 0x11, c.gid); got != c.want {
			t.Errorf("%s: fromSelf %v, want %v %s", c.what, got, c.want, c.comment)
		}
	}
}
