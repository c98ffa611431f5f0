// Package sa is an SA client: multicast joins and leaves, path record and ClassPortInfo
// queries sent as real SA MADs through a port's QP1 agent, as the kernel's ib_sa does.
package sa

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/mad"
)

// Client sends SA requests from one port to the subnet manager.
type Client struct {
	Port    verbs.Port
	Timeout time.Duration // per try (default 1 s, the kernel's path query timeout)
	Retries int           // resends after a timeout (default 2)
}

var tidSeq atomic.Uint64

// StatusError is an SA answer with a non-zero MAD status.
type StatusError struct {
	Op     string
	Status mad.Status
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("sa %s: status %#04x (%v)", e.Op, uint16(e.Status), e.Status)
}

// ErrBadResponse is returned for an answer that is not a valid SA response.
var ErrBadResponse = errors.New("malformed SA response")

func (c *Client) call(ctx context.Context, op string, req *mad.SAMAD) (*mad.SAMAD, error) {
	resp, _, err := c.callRaw(ctx, op, req)
	return resp, err
}

// callRaw is call that also returns the answer as received: one MAD, or the joined-up
// RMPP transfer of a long GetTable answer.
func (c *Client) callRaw(ctx context.Context, op string, req *mad.SAMAD) (*mad.SAMAD, []byte, error) {
	attr := c.Port.Attr()
	if attr.State != verbs.PortActive || attr.SMLID == 0 {
		return nil, nil, fmt.Errorf("sa %s: %w", op, verbs.ErrPortDown)
	}
	timeout, retries := c.Timeout, c.Retries
	if timeout == 0 {
		timeout = time.Second
	}
	if retries == 0 {
		retries = 2
	}
	req.TID = tidSeq.Add(1) << 32
	raw, err := c.Port.MAD().Call(ctx, attr.SMLID, req.Bytes(), timeout, retries)
	if err != nil {
		return nil, nil, fmt.Errorf("sa %s: %w", op, err)
	}
	var resp mad.SAMAD
	if err := mad.ParseSA(raw, &resp); err != nil || !resp.IsResponse() || resp.AttrID != req.AttrID {
		return nil, nil, fmt.Errorf("sa %s: %w", op, ErrBadResponse)
	}
	if resp.Status != mad.StatusOK {
		return &resp, raw, &StatusError{Op: op, Status: resp.Status}
	}
	return &resp, raw, nil
}

// GetTable asks for every record of attr matching rec (marshalled, up to 200 bytes)
// under mask, as saquery does, and returns them: each the attribute's stride long,
// from one MAD or a multi-segment RMPP answer. No records is an empty result, not an
// error (the SA answers GetTable with status 0 and none).
func (c *Client) GetTable(ctx context.Context, attr uint16, rec []byte, mask uint64) ([][]byte, error) {
	req := mad.NewSARequest(mad.MethodGetTable, attr, 0, mask)
	copy(req.Data[:], rec)
	op := fmt.Sprintf("get table %#04x", attr)
	_, raw, err := c.callRaw(ctx, op, &req)
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) && se.Status == mad.StatusSANoRecords {
			return nil, nil
		}
		return nil, err
	}
	recs, err := mad.TableOf(raw)
	if err != nil {
		return nil, fmt.Errorf("sa %s: %w", op, ErrBadResponse)
	}
	return recs, nil
}

// Nodes is NodeRecord GetTable: every node port the SA lets this port see.
func (c *Client) Nodes(ctx context.Context) ([]mad.NodeRecord, error) {
	return table[mad.NodeRecord](ctx, c, mad.AttrNodeRecord, mad.NodeRecordSize)
}

// PortInfos is PortInfoRecord GetTable.
func (c *Client) PortInfos(ctx context.Context) ([]mad.PortInfoRecord, error) {
	return table[mad.PortInfoRecord](ctx, c, mad.AttrPortInfoRecord, mad.PortInfoRecordSize)
}

// PKeyTables is P_KeyTableRecord GetTable.
func (c *Client) PKeyTables(ctx context.Context) ([]mad.PKeyTableRecord, error) {
	return table[mad.PKeyTableRecord](ctx, c, mad.AttrPKeyTableRecord, mad.PKeyTableRecordSize)
}

// Groups is MCMemberRecord GetTable without an SM_Key: one record per multicast group
// in the port's partitions, PortGID and JoinState zero (IBA p923).
func (c *Client) Groups(ctx context.Context) ([]mad.MCMemberRecord, error) {
	return table[mad.MCMemberRecord](ctx, c, mad.AttrMCMemberRecord, mad.MCMemberRecordSize)
}

// record is a pointer to a record type that decodes itself.
type record[T any] interface {
	*T
	Unmarshal([]byte) error
}

func table[T any, P record[T]](ctx context.Context, c *Client, attr uint16, size int) ([]T, error) {
	raw, err := c.GetTable(ctx, attr, nil, 0)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(raw))
	for i, b := range raw {
		if len(b) < size {
			return nil, fmt.Errorf("sa get table %#04x: %w: record of %d bytes", attr, ErrBadResponse, len(b))
		}
		if err := P(&out[i]).Unmarshal(b); err != nil {
			return nil, fmt.Errorf("sa get table %#04x: %w", attr, ErrBadResponse)
		}
	}
	return out, nil
}

// Join sends an MCMemberRecord Set with the given component mask and returns the
// group record the SA answered.
func (c *Client) Join(ctx context.Context, rec mad.MCMemberRecord, mask uint64) (mad.MCMemberRecord, error) {
	return c.mcmember(ctx, "join", mad.MethodSet, rec, mask)
}

// Leave sends an MCMemberRecord Delete for the join states in rec.
func (c *Client) Leave(ctx context.Context, rec mad.MCMemberRecord, mask uint64) error {
	_, err := c.mcmember(ctx, "leave", mad.MethodDelete, rec, mask)
	return err
}

func (c *Client) mcmember(ctx context.Context, op string, method uint8, rec mad.MCMemberRecord, mask uint64) (mad.MCMemberRecord, error) {
	req := mad.NewSARequest(method, mad.AttrMCMemberRecord, 0, mask)
	rec.Marshal(req.Data[:])
	resp, err := c.call(ctx, op, &req)
	if err != nil {
		return mad.MCMemberRecord{}, err
	}
	var out mad.MCMemberRecord
	if err := out.Unmarshal(resp.Data[:]); err != nil {
		return out, fmt.Errorf("sa %s: %w", op, ErrBadResponse)
	}
	return out, nil
}

// PathRecord queries one path from sgid to dgid in partition pkey (0 = any shared).
func (c *Client) PathRecord(ctx context.Context, sgid, dgid verbs.GID, pkey verbs.PKey, tclass uint8) (mad.PathRecord, error) {
	mask := mad.CompPRDGID | mad.CompPRSGID | mad.CompPRNumbPath | mad.CompPRTClass
	rec := mad.PathRecord{SGID: sgid, DGID: dgid, NumbPath: 1, TClass: tclass}
	if pkey != 0 {
		mask |= mad.CompPRPKey
		rec.PKey = pkey
	}
	req := mad.NewSARequest(mad.MethodGet, mad.AttrPathRecord, 0, mask)
	rec.Marshal(req.Data[:])
	resp, err := c.call(ctx, "path record", &req)
	if err != nil {
		return mad.PathRecord{}, err
	}
	var out mad.PathRecord
	if err := out.Unmarshal(resp.Data[:]); err != nil {
		return out, fmt.Errorf("sa path record: %w", ErrBadResponse)
	}
	return out, nil
}

// ClassPortInfo asks the SA for its ClassPortInfo.
func (c *Client) ClassPortInfo(ctx context.Context) (mad.ClassPortInfo, error) {
	req := mad.NewSARequest(mad.MethodGet, mad.AttrClassPortInfo, 0, 0)
	resp, err := c.call(ctx, "class port info", &req)
	if err != nil {
		return mad.ClassPortInfo{}, err
	}
	var out mad.ClassPortInfo
	if err := out.Unmarshal(resp.Data[:]); err != nil {
		return out, fmt.Errorf("sa class port info: %w", ErrBadResponse)
	}
	return out, nil
}
