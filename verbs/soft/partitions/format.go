package partitions

import (
	"fmt"
	"slices"
	"strings"

	"ipoibfs/verbs"
)

// String writes the configuration as a partitions.conf in canonical form: one
// definition per partition with its key, flags that differ from the defaults and one
// member per line with explicit membership; every mgid line carries all its flags. An
// mgid group that its partition's header flags would change on re-reading (another
// scope inherited, or an IP group whose rate/mtu differ from the header's, which can
// happen after merging definitions) is written in an extra definition of the same
// partition. For a configuration returned by Parse, Parse(String()) returns an equal
// configuration apart from line numbers.
func (c *Config) String() string {
	if c == nil {
		return ""
	}
	var b strings.Builder
	for i := range c.Partitions {
		writePartition(&b, &c.Partitions[i])
	}
	return b.String()
}

func writePartition(b *strings.Builder, p *Partition) {
	id := ident(p)
	hdr := []string{id}
	if p.Index0 {
		hdr = append(hdr, "indx0")
	}
	if p.IPoIB {
		hdr = append(hdr, "ipoib")
	}
	f := p.IPoIBFlags
	rate, mtu := orRate(f.Rate), orMTU(f.MTU)
	if rate != DefaultRate {
		hdr = append(hdr, fmt.Sprintf("rate=%d", rate))
	}
	if mtu != DefaultMTU {
		hdr = append(hdr, fmt.Sprintf("mtu=%d", mtu))
	}
	if f.SL != DefaultSL {
		hdr = append(hdr, fmt.Sprintf("sl=%d", f.SL))
	}
	var hdrScopes []uint8 // the scopes the header makes every mgid line inherit
	if s := normScopes(f.Scopes); !(len(s) == 0 || len(s) == 1 && s[0] == DefaultScope) {
		hdrScopes = s
		for _, sc := range s {
			hdr = append(hdr, fmt.Sprintf("scope=%d", sc))
		}
	}
	if f.QKey != 0 && f.QKey != verbs.IPoIBQKey {
		hdr = append(hdr, fmt.Sprintf("Q_Key=0x%08x", f.QKey))
	}
	if f.TClass != 0 {
		hdr = append(hdr, fmt.Sprintf("TClass=%d", f.TClass))
	}
	if f.FlowLabel != 0 {
		hdr = append(hdr, fmt.Sprintf("FlowLabel=0x%05x", f.FlowLabel))
	}
	if p.DefMember != MemberLimited {
		hdr = append(hdr, "defmember="+p.DefMember.String())
	}
	b.WriteString(strings.Join(hdr, ", "))
	b.WriteString(" :")

	type item struct {
		text   string
		member bool
	}
	items := make([]item, 0, len(p.Members)+len(p.MGIDs))
	for i := range p.Members {
		items = append(items, item{memberString(&p.Members[i]), true})
	}
	var extra []*MGIDGroup
	for i := range p.MGIDs {
		g := &p.MGIDs[i]
		if inheritsCleanly(g, rate, mtu, hdrScopes) {
			items = append(items, item{mgidString(g), false})
		} else {
			extra = append(extra, g)
		}
	}
	for i, it := range items {
		b.WriteString("\n\t")
		b.WriteString(it.text)
		if it.member && i < len(items)-1 {
			b.WriteByte(',') // an mgid entry ends at the end of its line instead
		}
	}
	b.WriteString(" ;\n")
	for _, g := range extra {
		fmt.Fprintf(b, "%s, rate=%d, mtu=%d :\n\t%s ;\n", id, orRate(g.Flags.Rate), orMTU(g.Flags.MTU), mgidString(g))
	}
}

// inheritsCleanly reports whether g, written under a header with these flags, reads
// back unchanged: scopes are added to the inherited ones, and IP groups must match the
// header's rate and mtu.
func inheritsCleanly(g *MGIDGroup, rate verbs.Rate, mtu verbs.MTU, hdrScopes []uint8) bool {
	if isIPMGID(g.MGID) && (orRate(g.Flags.Rate) != rate || orMTU(g.Flags.MTU) != mtu) {
		return false
	}
	for _, s := range hdrScopes {
		if !slices.Contains(g.Flags.Scopes, s) {
			return false
		}
	}
	return true
}

// ident is the "[Name][=PKey]" part of a definition header.
func ident(p *Partition) string {
	k := p.PKey.Base()
	switch {
	case k != 0 && p.Name != "":
		return fmt.Sprintf("%s=0x%04x", p.Name, k)
	case k != 0:
		return fmt.Sprintf("0x%04x", k)
	}
	return p.Name
}

func memberString(m *Member) string {
	port := m.Sel.String()
	if m.Sel == SelGUID {
		port = fmt.Sprintf("0x%016x", uint64(m.GUID))
	}
	return port + "=" + m.Membership.String()
}

func mgidString(g *MGIDGroup) string {
	f := g.Flags
	var b strings.Builder
	fmt.Fprintf(&b, "mgid=%s, rate=%d, mtu=%d, sl=%d", g.MGID, orRate(f.Rate), orMTU(f.MTU), f.SL)
	for _, s := range normScopes(f.Scopes) {
		fmt.Fprintf(&b, ", scope=%d", s)
	}
	fmt.Fprintf(&b, ", Q_Key=0x%08x, TClass=%d, FlowLabel=0x%05x", f.QKey, f.TClass, f.FlowLabel)
	return b.String()
}

func normScopes(s []uint8) []uint8 {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func orRate(r verbs.Rate) verbs.Rate {
	if r == 0 {
		return DefaultRate
	}
	return r
}

func orMTU(m verbs.MTU) verbs.MTU {
	if m == 0 {
		return DefaultMTU
	}
	return m
}
