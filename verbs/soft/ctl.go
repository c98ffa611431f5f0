package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"ipoibfs/verbs"
)

// The fabric's own management traffic. A real subnet manager configures ports with
// SMPs on QP0 and programs switch forwarding tables; on this fabric the "switch" is the
// table of endpoint addresses every port keeps so that unicast goes straight to the
// destination host, and multicast is replicated by the sender. Those messages travel on
// QP0 as vendor-specific MADs (management class ctlClass), with the 24-byte common MAD
// header followed by a body laid out below. They are larger than 256 bytes when the
// fabric is large: this class is private to the fabric, so no RMPP is used.

const (
	ctlClass        = 0x09 // vendor-specific range 0x09-0x0f
	ctlClassVersion = 1
	ctlAttrHello    = 0xff01 // port -> SM: "I am here" and heartbeat
	ctlAttrConfig   = 0xff02 // SM -> port: LID, SM LID, state, P_Key table
	ctlAttrRoutes   = 0xff03 // SM -> port: unicast and multicast forwarding, faults
	ctlAttrDelta    = 0xff04 // SM -> port: the changes from one routes version to the next
	ctlMethodSend   = 0x03
	ctlHeaderLen    = 24
	maxCtlEntries   = 1 << 14
	// maxRoutesParts bounds what a port keeps of tables in several parts until the
	// last arrives (a part is at most maxRoutesPart bytes): every unicast LID takes
	// about 33 parts, so this leaves room for the multicast groups, and a sender that
	// never sends the last part holds at most this many.
	maxRoutesParts = 1024
)

var errCtlShort = errors.New("control message truncated")

type ctlHello struct {
	NodeGUID, PortGUID verbs.GUID
	PortNum, NumPorts  uint8
	MaxMTU             verbs.MTU
	Width              uint8
	LaneMbps           uint32
	Epoch              uint64 // SM epoch the port last saw
	RoutesVersion      uint64
	NodeDesc           string
}

type ctlConfig struct {
	LID, SMLID verbs.LID
	State      verbs.PortState
	ActiveMTU  verbs.MTU
	Rate       verbs.Rate
	Reregister bool
	SMEpoch    uint64
	SMGID      verbs.GID
	GIDPrefix  uint64
	PKeys      []verbs.PKey
}

type ctlRoute struct {
	LID  verbs.LID
	GID  verbs.GID
	Addr netip.AddrPort
}

type ctlMRoute struct {
	MLID    verbs.LID
	MGID    verbs.GID
	Members []verbs.LID // ports that receive (full and non-members)
}

type ctlRoutes struct {
	Version     uint64
	Part, Parts uint16 // this message is part Part (0-based) of Parts of Version's tables
	Faults      Faults
	Uni         []ctlRoute
	Multi       []ctlMRoute
}

// maxRoutesPart bounds the encoded size of one routes message, well inside a UDP
// datagram (65507 bytes) with room for the header and a fabric-key MAC: larger tables
// go out in several parts (a fabric of thousands of ports or groups).
const maxRoutesPart = 48 << 10

// split cuts the tables into parts of at most maxRoutesPart bytes each, every part
// carrying the version, the faults and its place among the parts.
func (m *ctlRoutes) split() []ctlRoutes {
	const fixed = 8 + 4 + 12 + 8 + 4
	var parts []ctlRoutes
	cur := ctlRoutes{Version: m.Version, Faults: m.Faults}
	size := fixed
	flush := func() {
		parts = append(parts, cur)
		cur = ctlRoutes{Version: m.Version, Faults: m.Faults}
		size = fixed
	}
	for _, r := range m.Uni {
		n := 2 + 16 + 1 + len(r.Addr.Addr().Unmap().AsSlice()) + 2
		if size+n > maxRoutesPart {
			flush()
		}
		cur.Uni, size = append(cur.Uni, r), size+n
	}
	for _, r := range m.Multi {
		n := 2 + 16 + 2 + 2*len(r.Members)
		if size+n > maxRoutesPart && (len(cur.Uni) > 0 || len(cur.Multi) > 0) {
			flush()
		}
		cur.Multi, size = append(cur.Multi, r), size+n
	}
	flush()
	for k := range parts {
		parts[k].Part, parts[k].Parts = uint16(k), uint16(len(parts))
	}
	return parts
}

func putCtlHeader(b []byte, attr uint16, tid uint64) []byte {
	var h [ctlHeaderLen]byte
	h[0] = 1 // base version
	h[1] = ctlClass
	h[2] = ctlClassVersion
	h[3] = ctlMethodSend
	binary.BigEndian.PutUint64(h[8:], tid)
	binary.BigEndian.PutUint16(h[16:], attr)
	return append(b, h[:]...)
}

// parseCtl returns the attribute ID and body of a control message.
func parseCtl(b []byte) (uint16, []byte, error) {
	if len(b) < ctlHeaderLen {
		return 0, nil, errCtlShort
	}
	if b[0] != 1 || b[1] != ctlClass || b[2] != ctlClassVersion {
		return 0, nil, fmt.Errorf("control message: unexpected class %#x version %d", b[1], b[2])
	}
	return binary.BigEndian.Uint16(b[16:]), b[ctlHeaderLen:], nil
}

func (m *ctlHello) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(m.NodeGUID))
	b = binary.BigEndian.AppendUint64(b, uint64(m.PortGUID))
	b = append(b, m.PortNum, m.NumPorts, byte(m.MaxMTU), m.Width)
	b = binary.BigEndian.AppendUint32(b, m.LaneMbps)
	b = binary.BigEndian.AppendUint64(b, m.Epoch)
	b = binary.BigEndian.AppendUint64(b, m.RoutesVersion)
	var desc [64]byte
	copy(desc[:], m.NodeDesc)
	return append(b, desc[:]...)
}

const ctlHelloLen = 8 + 8 + 4 + 4 + 8 + 8 + 64

func (m *ctlHello) parse(b []byte) error {
	if len(b) < ctlHelloLen {
		return errCtlShort
	}
	m.NodeGUID = verbs.GUID(binary.BigEndian.Uint64(b))
	m.PortGUID = verbs.GUID(binary.BigEndian.Uint64(b[8:]))
	m.PortNum, m.NumPorts, m.MaxMTU, m.Width = b[16], b[17], verbs.MTU(b[18]), b[19]
	m.LaneMbps = binary.BigEndian.Uint32(b[20:])
	m.Epoch = binary.BigEndian.Uint64(b[24:])
	m.RoutesVersion = binary.BigEndian.Uint64(b[32:])
	desc := b[40:104]
	n := 0
	for n < len(desc) && desc[n] != 0 {
		n++
	}
	m.NodeDesc = string(desc[:n])
	if m.PortNum == 0 || m.MaxMTU.Bytes() == 0 {
		return fmt.Errorf("hello: invalid port %d or MTU %d", m.PortNum, m.MaxMTU)
	}
	return nil
}

func (m *ctlConfig) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(m.LID))
	b = binary.BigEndian.AppendUint16(b, uint16(m.SMLID))
	var flags byte
	if m.Reregister {
		flags |= 1
	}
	b = append(b, byte(m.State), byte(m.ActiveMTU), byte(m.Rate), flags)
	b = binary.BigEndian.AppendUint64(b, m.SMEpoch)
	b = append(b, m.SMGID[:]...)
	b = binary.BigEndian.AppendUint64(b, m.GIDPrefix)
	b = append(b, byte(len(m.PKeys)))
	for _, k := range m.PKeys {
		b = binary.BigEndian.AppendUint16(b, uint16(k))
	}
	return b
}

func (m *ctlConfig) parse(b []byte) error {
	const fixed = 2 + 2 + 4 + 8 + 16 + 8 + 1
	if len(b) < fixed {
		return errCtlShort
	}
	m.LID = verbs.LID(binary.BigEndian.Uint16(b))
	m.SMLID = verbs.LID(binary.BigEndian.Uint16(b[2:]))
	m.State, m.ActiveMTU, m.Rate = verbs.PortState(b[4]), verbs.MTU(b[5]), verbs.Rate(b[6])
	m.Reregister = b[7]&1 != 0
	m.SMEpoch = binary.BigEndian.Uint64(b[8:])
	copy(m.SMGID[:], b[16:32])
	m.GIDPrefix = binary.BigEndian.Uint64(b[32:])
	n := int(b[40])
	b = b[fixed:]
	if n > verbs.PKeyTableCapacity || len(b) < 2*n {
		return errCtlShort
	}
	m.PKeys = make([]verbs.PKey, n)
	for i := range m.PKeys {
		m.PKeys[i] = verbs.PKey(binary.BigEndian.Uint16(b[2*i:]))
	}
	if m.State > verbs.PortActive || m.ActiveMTU.Bytes() == 0 {
		return fmt.Errorf("config: invalid state %d or MTU %d", m.State, m.ActiveMTU)
	}
	return nil
}

func appendAddr(b []byte, a netip.AddrPort) []byte {
	ip := a.Addr().Unmap()
	raw := ip.AsSlice()
	b = append(b, byte(len(raw)))
	b = append(b, raw...)
	return binary.BigEndian.AppendUint16(b, a.Port())
}

func (m *ctlRoutes) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, m.Version)
	b = binary.BigEndian.AppendUint16(b, m.Part)
	b = binary.BigEndian.AppendUint16(b, m.Parts)
	for _, p := range []float64{m.Faults.Loss, m.Faults.Dup, m.Faults.Reorder} {
		b = binary.BigEndian.AppendUint32(b, uint32(p*1e6+0.5))
	}
	b = binary.BigEndian.AppendUint64(b, uint64(m.Faults.Delay))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Uni)))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Multi)))
	for _, r := range m.Uni {
		b = binary.BigEndian.AppendUint16(b, uint16(r.LID))
		b = append(b, r.GID[:]...)
		b = appendAddr(b, r.Addr)
	}
	for _, r := range m.Multi {
		b = binary.BigEndian.AppendUint16(b, uint16(r.MLID))
		b = append(b, r.MGID[:]...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(r.Members)))
		for _, l := range r.Members {
			b = binary.BigEndian.AppendUint16(b, uint16(l))
		}
	}
	return b
}

func (m *ctlRoutes) parse(b []byte) error {
	const fixed = 8 + 4 + 12 + 8 + 4
	if len(b) < fixed {
		return errCtlShort
	}
	m.Version = binary.BigEndian.Uint64(b)
	m.Part, m.Parts = binary.BigEndian.Uint16(b[8:]), binary.BigEndian.Uint16(b[10:])
	if m.Parts == 0 || m.Part >= m.Parts || m.Parts > maxRoutesParts {
		return fmt.Errorf("routes: part %d of %d", m.Part, m.Parts)
	}
	b = b[4:] // the rest as before parts existed
	m.Faults.Loss = float64(binary.BigEndian.Uint32(b[8:])) / 1e6
	m.Faults.Dup = float64(binary.BigEndian.Uint32(b[12:])) / 1e6
	m.Faults.Reorder = float64(binary.BigEndian.Uint32(b[16:])) / 1e6
	m.Faults.Delay = durationFrom(binary.BigEndian.Uint64(b[20:]))
	if err := m.Faults.Validate(); err != nil {
		return err
	}
	nu, nm := int(binary.BigEndian.Uint16(b[28:])), int(binary.BigEndian.Uint16(b[30:]))
	b = b[fixed-4:]
	if nu > maxCtlEntries || nm > maxCtlEntries {
		return errors.New("routes: too many entries")
	}
	m.Uni = make([]ctlRoute, 0, min(nu, len(b)/25))
	for range nu {
		if len(b) < 2+16+1 {
			return errCtlShort
		}
		var r ctlRoute
		r.LID = verbs.LID(binary.BigEndian.Uint16(b))
		copy(r.GID[:], b[2:18])
		al := int(b[18])
		b = b[19:]
		if (al != 4 && al != 16) || len(b) < al+2 {
			return errors.New("routes: bad endpoint address")
		}
		ip, _ := netip.AddrFromSlice(b[:al])
		r.Addr = netip.AddrPortFrom(ip, binary.BigEndian.Uint16(b[al:]))
		b = b[al+2:]
		m.Uni = append(m.Uni, r)
	}
	m.Multi = make([]ctlMRoute, 0, min(nm, len(b)/20))
	for range nm {
		if len(b) < 2+16+2 {
			return errCtlShort
		}
		var r ctlMRoute
		r.MLID = verbs.LID(binary.BigEndian.Uint16(b))
		copy(r.MGID[:], b[2:18])
		n := int(binary.BigEndian.Uint16(b[18:]))
		b = b[20:]
		if len(b) < 2*n {
			return errCtlShort
		}
		r.Members = make([]verbs.LID, n)
		for i := range r.Members {
			r.Members[i] = verbs.LID(binary.BigEndian.Uint16(b[2*i:]))
		}
		b = b[2*n:]
		m.Multi = append(m.Multi, r)
	}
	return nil
}

// ctlRoutesDelta is what changed in the forwarding tables from version From to
// Routes.Version: the unicast and multicast entries set (added or changed) in Routes,
// and the LIDs and MLIDs removed. A port applies it only to tables of version From;
// a port with others keeps them, and its next hello tells the SM, which sends it the
// whole tables. One join to a table of thousands of groups then costs the SM one
// entry per port, not the table.
type ctlRoutesDelta struct {
	From     uint64
	DelUni   []verbs.LID
	DelMulti []verbs.LID
	Routes   ctlRoutes // Part 0 of 1
}

func (m *ctlRoutesDelta) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, m.From)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.DelUni)))
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.DelMulti)))
	for _, l := range m.DelUni {
		b = binary.BigEndian.AppendUint16(b, uint16(l))
	}
	for _, l := range m.DelMulti {
		b = binary.BigEndian.AppendUint16(b, uint16(l))
	}
	return m.Routes.append(b)
}

func (m *ctlRoutesDelta) parse(b []byte) error {
	if len(b) < 12 {
		return errCtlShort
	}
	m.From = binary.BigEndian.Uint64(b)
	nu, nm := int(binary.BigEndian.Uint16(b[8:])), int(binary.BigEndian.Uint16(b[10:]))
	b = b[12:]
	if nu > maxCtlEntries || nm > maxCtlEntries {
		return errors.New("routes delta: too many entries")
	}
	if len(b) < 2*(nu+nm) {
		return errCtlShort
	}
	m.DelUni, m.DelMulti = make([]verbs.LID, nu), make([]verbs.LID, nm)
	for k := range m.DelUni {
		m.DelUni[k] = verbs.LID(binary.BigEndian.Uint16(b[2*k:]))
	}
	b = b[2*nu:]
	for k := range m.DelMulti {
		m.DelMulti[k] = verbs.LID(binary.BigEndian.Uint16(b[2*k:]))
	}
	if err := m.Routes.parse(b[2*nm:]); err != nil {
		return err
	}
	if m.Routes.Parts != 1 {
		return fmt.Errorf("routes delta: part %d of %d", m.Routes.Part, m.Routes.Parts)
	}
	return nil
}
