package ipoib

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
	"ipoibfs/verbs/sa"
)

// The fabric as this node's subnet administrator shows it, for the tree's fabric/:
// GetTable queries as saquery sends them (-N, -p, --pkey-table, -g), answers longer than
// one MAD joined up by the MAD layer's RMPP. Every node has this view, not only the one
// running the subnet manager; like saquery's, it holds what the SA lets the asking
// port see (ports and groups in partitions it shares).

// fabricTimeout bounds one read of fabric/: the queries of the first active port, with
// the SA client's own per-try timeout and retries inside it.
const fabricTimeout = 10 * time.Second

// fabricPort returns the SA client of the first active port.
func (e *Engine) fabricPort() (*sa.Client, error) {
	for n := 1; n <= e.dev.NumPorts(); n++ {
		p, err := e.dev.Port(n)
		if err != nil {
			continue
		}
		if a := p.Attr(); a.State == verbs.PortActive && a.SMLID != 0 {
			return &sa.Client{Port: p}, nil
		}
	}
	return nil, &Error{Op: "read", If: "fabric", Err: syscall.ENETDOWN,
		Detail: fmt.Sprintf("no active port on %s: no subnet manager has configured it", e.dev.Name())}
}

// fabricErr says which query failed and maps a silent SA to ETIMEDOUT.
func fabricErr(file string, err error) error {
	errno := syscall.EIO
	if errors.Is(err, verbs.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		errno = syscall.ETIMEDOUT
	}
	return &Error{Op: "read", If: "fabric/" + file, Err: errno, Detail: err.Error()}
}

// FabricNodesText is fabric/nodes: one line per port, in sm/nodes's format (description,
// node and port GUIDs, port number, LID, state, P_Key table), ordered by LID.
func (e *Engine) FabricNodesText(ctx context.Context) (string, error) {
	cl, err := e.fabricPort()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, fabricTimeout)
	defer cancel()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return "", fabricErr("nodes", err)
	}
	pis, err := cl.PortInfos(ctx)
	if err != nil {
		return "", fabricErr("nodes", err)
	}
	pks, err := cl.PKeyTables(ctx)
	if err != nil {
		return "", fabricErr("nodes", err)
	}
	type portKey struct {
		lid  verbs.LID
		port uint8
	}
	state := map[verbs.LID]verbs.PortState{}
	for _, p := range pis {
		state[p.LID] = p.State
	}
	keys := map[portKey][]verbs.PKey{}
	for _, k := range pks { // blocks come in order; a CA's P_KeyTableRecord names its port
		for _, pk := range k.PKeys {
			if pk != 0 {
				keys[portKey{k.LID, k.PortNum}] = append(keys[portKey{k.LID, k.PortNum}], pk)
			}
		}
	}
	var b strings.Builder
	for _, n := range nodes {
		b.WriteString(mad.NodeLine(n.Desc, n.NodeGUID, n.PortGUID, int(n.LocalPort), n.LID, state[n.LID],
			keys[portKey{n.LID, n.LocalPort}]))
	}
	return b.String(), nil
}

// FabricGroupsText is fabric/groups: one block per multicast group visible to this
// node, in sm/groups's format without the members (the SA shows members only to
// requests carrying the SM_Key).
func (e *Engine) FabricGroupsText(ctx context.Context) (string, error) {
	cl, err := e.fabricPort()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, fabricTimeout)
	defer cancel()
	gs, err := cl.Groups(ctx)
	if err != nil {
		return "", fabricErr("groups", err)
	}
	var b strings.Builder
	for i := range gs {
		b.WriteString(mad.GroupText(&gs[i]))
		b.WriteByte('\n')
	}
	return b.String(), nil
}
