package ipoib

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// MCGText renders <if>_mcg exactly as the kernel's debugfs does: one block per group in
// ascending MGID byte order, values right-aligned to column 21, "created" in jiffies.
func (i *Interface) MCGText() string {
	i.dmu.Lock()
	gs := make([]*mcastGroup, 0, len(i.mcast))
	for _, g := range i.mcast {
		gs = append(gs, g)
	}
	type row struct {
		gid                string
		key                [16]byte
		created            int64
		qlen               int
		complete, sendOnly bool
	}
	rows := make([]row, 0, len(gs))
	for _, g := range gs {
		rows = append(rows, row{g.mgid.KernelString(), g.mgid, i.e.jiffies(g.created), len(g.queue), g.ah != nil, g.sendOnly})
	}
	i.dmu.Unlock()
	sort.Slice(rows, func(a, b int) bool { return bytes.Compare(rows[a].key[:], rows[b].key[:]) < 0 })
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "GID: %s\n  created: %10d\n  queuelen: %9d\n  complete: %9s\n  send_only: %8s\n\n",
			r.gid, r.created, r.qlen, yesNo(r.complete), yesNo(r.sendOnly))
	}
	return b.String()
}

// PathText renders <if>_path as the kernel does: one block per path in DGID order;
// DLID, SL and rate only when the path is complete.
func (i *Interface) PathText() string {
	i.dmu.Lock()
	ps := make([]path, 0, len(i.paths))
	for _, p := range i.paths {
		ps = append(ps, path{dgid: p.dgid, rec: p.rec, ah: p.ah})
	}
	i.dmu.Unlock()
	sort.Slice(ps, func(a, b int) bool { return bytes.Compare(ps[a].dgid[:], ps[b].dgid[:]) < 0 })
	var b strings.Builder
	for _, p := range ps {
		complete := p.rec.DLID != 0 && p.ah != nil
		fmt.Fprintf(&b, "GID: %s\n  complete: %6s\n", p.dgid.KernelString(), yesNo(complete))
		if complete {
			mbps := p.rec.Rate.Mbps()
			fmt.Fprintf(&b, "  DLID:     0x%04x\n  SL: %12d\n  rate: %8d.%d Gb/sec\n", p.rec.DLID, p.rec.SL, mbps/1000, mbps%1000)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}
