package mad

import (
	"fmt"
	"strconv"
	"strings"

	"ipoibfs/verbs"
)

// The text forms the tree shows for SA records, shared by the subnet manager's own
// view (sm/) and every node's view built from SA queries (fabric/), so the two read
// alike and can be compared line by line.

// GroupText is a multicast group's block header: MGID, MLID, P_Key, Q_Key, MTU, rate,
// SL and scope, one per line (sm/groups adds the members after it).
func GroupText(r *MCMemberRecord) string {
	return fmt.Sprintf("MGID: %s\n  MLID: 0x%04x\n  P_Key: 0x%04x\n  Q_Key: 0x%08x\n  MTU: %d (%d)\n  rate: %d (%s)\n  SL: %d\n  scope: %d\n",
		r.MGID.KernelString(), uint16(r.MLID), uint16(r.PKey), r.QKey, r.MTU, r.MTU.Bytes(), r.Rate, rateText(r.Rate), r.SL, r.Scope)
}

func rateText(r verbs.Rate) string {
	m := r.Mbps()
	if m == 0 {
		return "unknown"
	}
	return strconv.FormatFloat(float64(m)/1000, 'f', -1, 64) + " Gb/sec"
}

// NodeLine is one port of the fabric, as sm/nodes and fabric/nodes list them: its
// node description quoted, GUIDs, port number, LID, state and P_Key table.
func NodeLine(desc string, nodeGUID, portGUID verbs.GUID, port int, lid verbs.LID, state verbs.PortState, pkeys []verbs.PKey) string {
	keys := make([]string, len(pkeys))
	for k, p := range pkeys {
		keys[k] = fmt.Sprintf("0x%04x", uint16(p))
	}
	return fmt.Sprintf("%s node_guid 0x%016x port_guid 0x%016x port %d lid 0x%04x state %s pkeys %s\n",
		strconv.Quote(desc), uint64(nodeGUID), uint64(portGUID), port, uint16(lid), state, strings.Join(keys, ","))
}
