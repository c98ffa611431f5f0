package soft

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"ipoibfs/verbs"
)

// Link faults: sm/faults also takes lines `link NODE PORT down|up`, which take one
// port's link down or bring it back while everything runs, as pulling and putting back
// a cable does. A port whose link is down is, for the rest of the fabric, gone: the
// subnet manager tells it its state is DOWN (the port raises PORT_ERR, its physical
// state reads Polling), leaves it out of the routes every port gets (nothing reaches it
// and nothing from it is accepted), drops its multicast memberships and answers no SA
// request about it or from it, as OpenSM does with a port that left the subnet. Its
// control traffic (QP0) goes on, so that when the link is back the next configuration
// makes it ACTIVE again (PORT_ACTIVE) and the ports' tables include it once more.
//
// NODE names a node as sm/nodes shows it: the quoted description ("ipoibfs a"), the
// description's last word when it is unquoted (the -name of an ipoibfs node), or the
// node GUID (0x...).

// linkKey is one port of one node.
type linkKey struct {
	node verbs.GUID
	port int
}

// linkFault is one parsed `link NODE PORT down|up` line.
type linkFault struct {
	node string
	port int
	down bool
}

// splitFaultLines separates the link lines of a sm/faults write from the rest (the
// name value pairs of ParseFaults).
func splitFaultLines(spec string) (links []linkFault, rest string, err error) {
	var other []string
	for _, l := range strings.Split(spec, "\n") {
		f, err := fields(l)
		if err != nil {
			return nil, "", err
		}
		if len(f) == 0 || f[0] != "link" {
			other = append(other, l)
			continue
		}
		if len(f) != 4 {
			return nil, "", fmt.Errorf("want link NODE PORT down|up, got %q", strings.TrimSpace(l))
		}
		port, err := strconv.Atoi(f[2])
		if err != nil || port < 1 || port > 254 {
			return nil, "", fmt.Errorf("link %s: port %q is not 1..254", f[1], f[2])
		}
		var down bool
		switch f[3] {
		case "down":
			down = true
		case "up":
		default:
			return nil, "", fmt.Errorf("link %s %d: %q is neither down nor up", f[1], port, f[3])
		}
		if f[1] == "" {
			return nil, "", fmt.Errorf("link: empty node name")
		}
		links = append(links, linkFault{node: f[1], port: port, down: down})
	}
	return links, strings.Join(other, "\n"), nil
}

// fields splits a line at white space, keeping a double-quoted word (Go syntax, as
// sm/nodes quotes descriptions) whole.
func fields(l string) ([]string, error) {
	var out []string
	for {
		l = strings.TrimLeft(l, " \t\r")
		if l == "" {
			return out, nil
		}
		if l[0] != '"' {
			end := strings.IndexAny(l, " \t\r")
			if end < 0 {
				end = len(l)
			}
			out = append(out, l[:end])
			l = l[end:]
			continue
		}
		q, err := strconv.QuotedPrefix(l)
		if err != nil {
			return nil, fmt.Errorf("unbalanced quotes in %q", l)
		}
		s, _ := strconv.Unquote(q)
		out = append(out, s)
		l = l[len(q):]
	}
}

// resolveNodeLocked finds the node a link line names among the ports the subnet
// manager knows. Called with sm.mu held.
func (sm *SM) resolveNodeLocked(name string) (verbs.GUID, string, bool) {
	if v, err := strconv.ParseUint(name, 0, 64); err == nil && strings.HasPrefix(name, "0x") {
		for _, sp := range sm.ports {
			if uint64(sp.nodeGUID) == v {
				return sp.nodeGUID, sp.desc, true
			}
		}
	}
	for _, sp := range sm.ports {
		if sp.desc == name {
			return sp.nodeGUID, sp.desc, true
		}
	}
	for _, sp := range sm.ports {
		if f := strings.Fields(sp.desc); len(f) > 0 && f[len(f)-1] == name {
			return sp.nodeGUID, sp.desc, true
		}
	}
	return 0, "", false
}

// linkDownLocked reports whether the port's link is down by a link fault. Called with
// sm.mu held.
func (sm *SM) linkDownLocked(sp *smPort) bool {
	return sp != nil && sm.down[linkKey{sp.nodeGUID, sp.num}]
}

// portStateLocked is the state the subnet manager gives the port. Called with sm.mu
// held.
func (sm *SM) portStateLocked(sp *smPort) verbs.PortState {
	if sm.linkDownLocked(sp) {
		return verbs.PortDown
	}
	return verbs.PortActive
}

// SetLink takes a port's link down or brings it back (the `link` line of sm/faults).
// node is resolved as the package describes; a node the subnet manager does not know,
// or a port it does not have, is an error.
func (sm *SM) SetLink(node string, port int, down bool) error {
	return sm.setLinks([]linkFault{{node, port, down}})
}

// setLinks applies link faults all or nothing.
func (sm *SM) setLinks(lf []linkFault) error {
	type change struct {
		key  linkKey
		down bool
	}
	sm.mu.Lock()
	var cs []change
	for _, l := range lf {
		g, desc, ok := sm.resolveNodeLocked(l.node)
		if !ok {
			sm.mu.Unlock()
			return fmt.Errorf("link %s: no such node in sm/nodes", strconv.Quote(l.node))
		}
		has := false
		for _, sp := range sm.ports {
			if sp.nodeGUID == g && sp.num == l.port {
				has = true
			}
		}
		if !has {
			sm.mu.Unlock()
			return fmt.Errorf("link %s: node has no port %d", strconv.Quote(desc), l.port)
		}
		cs = append(cs, change{linkKey{g, l.port}, l.down})
	}
	if sm.down == nil {
		sm.down = map[linkKey]bool{}
	}
	var affected []*smPort
	var gone []verbs.GID
	for _, c := range cs {
		if sm.down[c.key] == c.down {
			continue
		}
		if c.down {
			sm.down[c.key] = true
		} else {
			delete(sm.down, c.key)
		}
		for _, sp := range sm.ports {
			if sp.nodeGUID == c.key.node && sp.num == c.key.port {
				affected = append(affected, sp)
				if c.down {
					gone = append(gone, sp.gid())
				}
			}
		}
	}
	if len(affected) > 0 {
		sm.routesV++
	}
	sm.mu.Unlock()
	// As OpenSM on a port that left: its multicast memberships go, then every port
	// learns the new routes, and the port itself its new state.
	for _, g := range gone {
		sm.db.RemovePort(g)
	}
	if len(affected) == 0 {
		return nil
	}
	sm.checkDB()
	sm.publish()
	for _, sp := range affected {
		sm.sendConfig(sp, false)
	}
	return nil
}

// linksText is the link lines of sm/faults: one per port whose link is down, in a
// form that can be written back.
func (sm *SM) linksText() string {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	var lines []string
	for k := range sm.down {
		desc := fmt.Sprintf("%#x", uint64(k.node))
		for _, sp := range sm.ports {
			if sp.nodeGUID == k.node {
				desc = strconv.Quote(sp.desc)
				break
			}
		}
		lines = append(lines, fmt.Sprintf("link %s %d down\n", desc, k.port))
	}
	slices.Sort(lines)
	return strings.Join(lines, "")
}

// setFaultsText applies a sm/faults write: the link lines and the impairments, all
// checked before anything changes.
func (sm *SM) setFaultsText(spec string) error {
	links, rest, err := splitFaultLines(spec)
	if err != nil {
		return err
	}
	f := sm.Faults()
	changeFaults := strings.TrimSpace(rest) != ""
	if changeFaults {
		if f, err = ParseFaults(f, rest); err != nil {
			return err
		}
	} else if len(links) == 0 {
		_, err := ParseFaults(f, rest) // the error an empty write always had
		return err
	}
	if err := sm.setLinks(links); err != nil {
		return err
	}
	if changeFaults {
		return sm.SetFaults(f)
	}
	return nil
}
