package soft

import (
	"bytes"
	"fmt"
	"strings"

	"ipoibfs/verbs/mad"
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
func (sm *SM) FaultsText() string { return sm.Faults().String() + sm.linksText() }

// SetFaultsText changes the fault injection with ParseFaults's syntax, and takes
// links down and up with `link NODE PORT down|up` lines (linkfault.go).
func (sm *SM) SetFaultsText(spec string) error { return sm.setFaultsText(spec) }

// GroupsText is sm/groups: every multicast group and its members.
func (sm *SM) GroupsText() string { return groupsText(sm.DB().Groups()) }

// NodesText is sm/nodes: every port the subnet manager knows.
func (sm *SM) NodesText() string { return nodesText(sm.Nodes()) }

// nodesText is sm/nodes: one line per port the subnet manager knows, by LID.
func nodesText(ns []NodeInfo) string {
	var b strings.Builder
	for _, n := range ns {
		b.WriteString(mad.NodeLine(n.Name, n.NodeGUID, n.PortGUID, n.Port, n.LID, n.State, n.PKeys))
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

// groupsText is sm/groups: one block per multicast group in MGID order.
func groupsText(gs []sadb.Group) string {
	var b strings.Builder
	for _, g := range gs {
		b.WriteString(mad.GroupText(&mad.MCMemberRecord{MGID: g.MGID, MLID: g.MLID, PKey: g.PKey, QKey: g.QKey,
			MTU: g.MTU, Rate: g.Rate, SL: g.SL, Scope: g.Scope}))
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
