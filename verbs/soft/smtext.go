package soft

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft/partitions"
	"ipoibfs/verbs/soft/sadb"
)

// The subnet manager's files as text, for the tree's sm/ (fs.SubnetManager): the tree
// needs nothing of this package but these methods.

// PartitionsText is the active partitions.conf, in OpenSM syntax.
func (sm *SM) PartitionsText() string { return sm.Partitions().String() }

// SetPartitionsText parses a whole partitions.conf (name is the file named in errors)
// and applies it; a bad one is a *partitions.Error and changes nothing.
func (sm *SM) SetPartitionsText(name string, conf []byte) error {
	c, err := partitions.Parse(name, bytes.NewReader(conf))
	if err != nil {
		return err
	}
	sm.SetPartitions(c)
	return nil
}

// FaultsText is the fault injection in force ("loss 0.02 reorder 0 ...").
func (sm *SM) FaultsText() string { return sm.Faults().String() }

// SetFaultsText changes the fault injection with ParseFaults's syntax.
func (sm *SM) SetFaultsText(spec string) error {
	f, err := ParseFaults(sm.Faults(), spec)
	if err != nil {
		return err
	}
	return sm.SetFaults(f)
}

// GroupsText is sm/groups: every multicast group and its members.
func (sm *SM) GroupsText() string { return groupsText(sm.DB().Groups()) }

// NodesText is sm/nodes: every port the subnet manager knows.
func (sm *SM) NodesText() string { return nodesText(sm.Nodes()) }

// nodesText is sm/nodes: one line per port the subnet manager knows, by LID.
func nodesText(ns []NodeInfo) string {
	var b strings.Builder
	for _, n := range ns {
		keys := make([]string, len(n.PKeys))
		for k, p := range n.PKeys {
			keys[k] = fmt.Sprintf("0x%04x", uint16(p))
		}
		fmt.Fprintf(&b, "%s node_guid 0x%016x port_guid 0x%016x port %d lid 0x%04x state %s pkeys %s\n",
			strconv.Quote(n.Name), uint64(n.NodeGUID), uint64(n.PortGUID), n.Port, uint16(n.LID), n.State,
			strings.Join(keys, ","))
	}
	return b.String()
}

// joinStateString names the JoinState bits of an MCMemberRecord.
func joinStateString(s uint8) string {
	var names []string
	for k, n := range []string{"full", "non", "sendonly-non", "sendonly-full"} {
		if s&(1<<k) != 0 {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

func rateText(r verbs.Rate) string {
	m := r.Mbps()
	if m == 0 {
		return "unknown"
	}
	return strconv.FormatFloat(float64(m)/1000, 'f', -1, 64) + " Gb/sec"
}

// groupsText is sm/groups: one block per multicast group in MGID order.
func groupsText(gs []sadb.Group) string {
	var b strings.Builder
	for _, g := range gs {
		fmt.Fprintf(&b, "MGID: %s\n", g.MGID.KernelString())
		fmt.Fprintf(&b, "  MLID: 0x%04x\n  P_Key: 0x%04x\n  Q_Key: 0x%08x\n", uint16(g.MLID), uint16(g.PKey), g.QKey)
		fmt.Fprintf(&b, "  MTU: %d (%d)\n  rate: %d (%s)\n  SL: %d\n  scope: %d\n", g.MTU, g.MTU.Bytes(), g.Rate, rateText(g.Rate), g.SL, g.Scope)
		fmt.Fprintf(&b, "  members: %d\n", len(g.Members))
		for _, m := range g.Members {
			proxy := ""
			if m.ProxyJoin {
				proxy = " proxy"
			}
			fmt.Fprintf(&b, "    %s join_state 0x%x (%s)%s\n", m.GID.KernelString(), m.JoinState, joinStateString(m.JoinState), proxy)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
