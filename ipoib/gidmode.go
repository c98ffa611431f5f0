package ipoib

import (
	"context"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// GID mode: IPoIB without a subnet administrator, for RoCE ports (rdma_rxe, RoCE
// adapters), whose Ethernet link layer has no subnet manager, no LIDs and no SA to join
// groups or resolve paths. An interface in GID mode answers its own SA queries
// (gidSA) from the port's attributes and the GIDs asked about:
//
//   - Join returns the group as the request describes it: Q_Key 0x0b1b, the
//     request's P_Key, MTU the port's active MTU (so the interface's MTU is the active
//     MTU minus the 4-byte IPoIB header: 1020 on rxe over a 1500-byte Ethernet), rate
//     the port's, SL 0, TClass and FlowLabel 0, hop limit 64, MLID 0. Nothing is
//     registered anywhere: membership is the QP's multicast attach, which the device
//     maps to its Ethernet multicast address.
//   - Leave does nothing.
//   - PathRecord returns DGID and SGID as asked, DLID and SLID 0, the port's active
//     MTU and rate, SL 0, hop limit 64.
//
// Address handles then route by the GRH alone: DLID 0 with the DGID (pathAHAttr, and
// the multicast join's AH, which always has the GRH). The path MTU and the group MTU
// are both the local port's: a peer with a smaller active MTU is not known about, as
// it would be from the SA; on one Ethernet segment all ports normally agree.
//
// An interface is in GID mode when its port's link layer is Ethernet, or for every
// port when Options.GIDMode is set. Connected mode works there too: the path's DLID
// is 0, so the CM sends its MADs by GID (verbs.GIDMADSender) and the RC QPs' address
// handles carry the GRH. Where
// the device does not join the group's Ethernet multicast (the 6.1 kernel's rxe adds
// the MAC but not the IPv6 group), the host must hold the IPv6 membership of each MGID
// on the netdev for multicast to arrive; the rxe test does so from a socket.

// gidHopLimit is the GRH hop limit of GID-mode address handles (unicast and
// multicast): RoCE v2 carries it as the IPv6 hop limit.
const gidHopLimit = 64

// LinkLayerEthernet is PortAttr.LinkLayer of a RoCE port.
const LinkLayerEthernet = "Ethernet"

// gidModePort reports whether an interface on a port with these attributes runs in GID
// mode.
func (e *Engine) gidModePort(attr verbs.PortAttr) bool {
	return e.gidMode || attr.LinkLayer == LinkLayerEthernet
}

// newSAClient is an interface's SA client: the SA's on an InfiniBand port, gidSA in
// GID mode.
func (e *Engine) newSAClient(p verbs.Port, attr verbs.PortAttr) saClient {
	if e.gidModePort(attr) {
		return gidSA{port: p}
	}
	return &sa.Client{Port: p}
}

// gidSA is the SA client of GID mode: it answers from the port, without a MAD.
type gidSA struct{ port verbs.Port }

// GIDMode reports whether the interface runs in GID mode (no SA; see gidmode.go).
func (i *Interface) GIDMode() bool {
	p, err := i.e.dev.Port(i.port)
	return err == nil && i.e.gidModePort(p.Attr())
}

func (s gidSA) Join(ctx context.Context, rec mad.MCMemberRecord, mask uint64) (mad.MCMemberRecord, error) {
	if err := ctx.Err(); err != nil {
		return mad.MCMemberRecord{}, err
	}
	a := s.port.Attr()
	return mad.MCMemberRecord{
		MGID: rec.MGID, PortGID: rec.PortGID, QKey: verbs.IPoIBQKey, MLID: 0,
		MTUSelector: mad.SelExactly, MTU: a.ActiveMTU, TClass: 0, PKey: rec.PKey,
		RateSelector: mad.SelExactly, Rate: a.Rate, SL: 0, FlowLabel: 0, HopLimit: gidHopLimit,
		Scope: rec.MGID[1] & 0x0f, JoinState: rec.JoinState,
	}, nil
}

func (s gidSA) Leave(ctx context.Context, rec mad.MCMemberRecord, mask uint64) error { return nil }

func (s gidSA) PathRecord(ctx context.Context, sgid, dgid verbs.GID, pkey verbs.PKey, tclass uint8) (mad.PathRecord, error) {
	if err := ctx.Err(); err != nil {
		return mad.PathRecord{}, err
	}
	a := s.port.Attr()
	return mad.PathRecord{
		DGID: dgid, SGID: sgid, DLID: 0, SLID: 0, HopLimit: gidHopLimit, TClass: tclass,
		Reversible: true, NumbPath: 1, PKey: pkey, SL: 0,
		MTUSelector: mad.SelExactly, MTU: a.ActiveMTU, RateSelector: mad.SelExactly, Rate: a.Rate,
	}, nil
}

// pathAHAttr is the address handle of a resolved path: by LID on InfiniBand; with
// DLID 0 (GID mode, which an SA never answers, 0 being a reserved LID) by the GRH
// alone, to the path's DGID from GID index 0.
func (i *Interface) pathAHAttr(dgid verbs.GID, rec mad.PathRecord) verbs.AHAttr {
	a := verbs.AHAttr{Port: i.port, DLID: rec.DLID, SL: rec.SL, StaticRate: rec.Rate}
	if rec.DLID == 0 {
		a.GRH, a.DGID, a.SGIDIndex = true, dgid, 0
		a.HopLimit, a.TClass, a.FlowLabel = rec.HopLimit, rec.TClass, rec.FlowLabel
	}
	return a
}

// fromSelf reports whether a received datagram is our own multicast looped back by the
// HCA: our QPN from our LID. Without LIDs (GID mode: every RoCE port's LID is 0, and
// QPNs repeat from one device to the next, rxe starting each at 0x11) the source GID
// must be ours too: the GRH's, or on RoCE v2 the IPv6 header's, in the same place (an
// IPv4-mapped GID's datagram carries the IPv4 header in the slot's last 20 bytes).
func fromSelf(wc verbs.WC, buf []byte, ownLID verbs.LID, ownQPN verbs.QPN, ownGID verbs.GID) bool {
	if wc.SLID != ownLID || wc.SrcQP != ownQPN {
		return false
	}
	if ownLID != 0 || !wc.GRH || len(buf) < grhLen {
		return true
	}
	if v4 := [12]byte{10: 0xff, 11: 0xff}; [12]byte(ownGID[:12]) == v4 {
		return [4]byte(buf[32:36]) == [4]byte(ownGID[12:])
	}
	return verbs.GID(buf[8:24]) == ownGID
}
