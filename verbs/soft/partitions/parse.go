package partitions

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"ipoibfs/verbs"
)

// Parse reads an OpenSM partitions.conf. name is used in error messages. Errors in the
// file are returned as *Error ("name:line: reason"); a read error is returned wrapped.
func Parse(name string, r io.Reader) (*Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &parser{
		file:   name,
		byKey:  map[uint16]int{uint16(DefaultPKey): builtinDefault},
		byName: map[string]int{DefaultName: builtinDefault},
	}
	if len(data) > MaxFileBytes {
		return nil, p.errf(1+bytes.Count(data[:MaxFileBytes], []byte{'\n'}), "file larger than %d bytes", MaxFileBytes)
	}
	if err := p.parse(data); err != nil {
		return nil, err
	}
	return &p.cfg, nil
}

// builtinDefault stands for OpenSM's default partition before the file mentions it.
const builtinDefault = -1

type parser struct {
	file      string
	cfg       Config
	keys      []uint16 // effective key of cfg.Partitions[i]
	ipoibLine []int    // line of the definition that made cfg.Partitions[i] IPoIB
	byKey     map[uint16]int
	byName    map[string]int
	counter   uint16 // OpenSM's global_pkey_counter
	members   int
	mgids     int
	cur       *definition // the definition whose ';' has not been seen yet
}

// definition is OpenSM's struct part_conf: the state of one "definition : … ;".
type definition struct {
	part      int
	line      int
	flags     rawFlags
	defMember Membership
}

func (p *parser) errf(line int, format string, args ...any) error {
	return &Error{File: p.file, Line: line, Reason: fmt.Sprintf(format, args...)}
}

func (p *parser) parse(data []byte) error {
	n := 0
	for len(data) > 0 {
		n++
		if n > MaxLines {
			return p.errf(n, "more than %d lines", MaxLines)
		}
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		if len(line) > MaxLineBytes {
			return p.errf(n, "line longer than %d bytes", MaxLineBytes)
		}
		if err := p.line(n, string(line)); err != nil {
			return err
		}
	}
	if p.cur != nil {
		return p.errf(p.cur.line, "partition definition not terminated by ';' before end of file")
	}
	return nil
}

// line handles one line the way osm_prtn_config_parse_file does: cut the comment, then
// split at ';' into segments; a segment outside a definition must hold the header up to
// ':'.
func (p *parser) line(n int, s string) error {
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s = s[:i]
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; (b < 0x20 && b != '\t' && b != '\r') || b == 0x7f {
			return p.errf(n, "invalid control character 0x%02x", b)
		}
	}
	for {
		s = strings.TrimLeft(s, spaces)
		if s == "" {
			return nil
		}
		seg, rest, semi := strings.Cut(s, ";")
		if p.cur == nil {
			if trim(seg) == "" {
				return p.errf(n, "unexpected ';' outside a partition definition")
			}
			hdr, props, ok := strings.Cut(seg, ":")
			if !ok {
				return p.errf(n, "missing ':' after partition definition %s", quote(trim(seg)))
			}
			if err := p.header(n, hdr); err != nil {
				return err
			}
			seg = props
		}
		if err := p.props(n, seg); err != nil {
			return err
		}
		if !semi {
			return nil
		}
		p.cur = nil
		s = rest
	}
}

// header parses "[Name][=PKey][,flag[=value]]…" and finds or creates the partition.
func (p *parser) header(n int, hdr string) error {
	toks := strings.Split(hdr, ",")
	name, id, hasID := cutEq(toks[0])
	if !hasID && name != "" && isDigit(name[0]) {
		name, id, hasID = "", name, true
	}
	if len(name) > MaxNameBytes {
		return p.errf(n, "partition name longer than %d bytes", MaxNameBytes)
	}
	d := &definition{line: n, flags: defaultRawFlags(), defMember: MemberLimited}
	var ipoib, indx0 bool
	for _, t := range toks[1:] {
		fname, val, hasVal := cutEq(t)
		if fname == "" {
			if hasVal {
				return p.errf(n, "empty flag name before %s", quote("="+val))
			}
			continue // ", ," is harmless
		}
		k, ok := lookupFlag(fname, true)
		if !ok {
			return p.errf(n, "unknown partition flag %s", quote(fname))
		}
		switch k {
		case flagIPoIB, flagIndx0:
			if hasVal {
				return p.errf(n, "flag %s takes no value", quote(flagNames[k]))
			}
			if k == flagIPoIB {
				ipoib = true
			} else {
				indx0 = true
			}
		case flagDefMember:
			if !hasVal || val == "" {
				return p.errf(n, "flag %s needs a value", quote(flagNames[k]))
			}
			m, ok := parseMembership(val)
			if !ok {
				return p.errf(n, "invalid membership %s (want full, limited or both)", quote(val))
			}
			d.defMember = m
		default:
			if err := p.groupFlag(n, &d.flags, k, val, hasVal); err != nil {
				return err
			}
		}
	}

	var key uint16 // 0: automatic
	if hasID {
		if id == "" {
			return p.errf(n, "missing P_Key value after '='")
		}
		v, ok, big := parseNum(id)
		if !ok {
			return p.errf(n, "invalid P_Key %s", quote(id))
		}
		if big || v > 0xffff {
			return p.errf(n, "P_Key %s out of range (16 bits)", clip(id))
		}
		key = uint16(v) & uint16(DefaultPKey)
		if key == 0 {
			return p.errf(n, "invalid P_Key %s (low 15 bits are zero)", id)
		}
	}
	idx, created, err := p.partitionFor(n, name, key)
	if err != nil {
		return err
	}
	part := &p.cfg.Partitions[idx]
	if created {
		part.Index0 = indx0
		part.IPoIB = ipoib
		part.IPoIBFlags = d.flags.broadcast()
		part.DefMember = d.defMember
		if ipoib {
			p.ipoibLine[idx] = n
		}
	} else {
		part.Index0 = part.Index0 || indx0
		if ipoib {
			g := d.flags.broadcast()
			switch {
			case !part.IPoIB:
				part.IPoIB, part.IPoIBFlags, p.ipoibLine[idx] = true, g, n
			case !g.equal(part.IPoIBFlags):
				return p.errf(n, "ipoib group flags differ from those of the ipoib definition at line %d", p.ipoibLine[idx])
			}
		}
	}
	d.part = idx
	p.cur = d
	return nil
}

// partitionFor returns the partition a definition with this name and key (0: automatic)
// belongs to, creating it if needed (OpenSM's osm_prtn_make_new).
func (p *parser) partitionFor(n int, name string, key uint16) (idx int, created bool, err error) {
	if key != 0 {
		if name != "" {
			if j, ok := p.byName[name]; ok && p.keyOf(j) != key {
				switch {
				case j == builtinDefault:
					return 0, false, p.errf(n, "partition name %s is reserved for the default partition 0x7fff", quote(name))
				case p.cfg.Partitions[j].PKey == 0:
					return 0, false, p.errf(n, "partition %s already has an auto-assigned P_Key (line %d)", quote(name), p.cfg.Partitions[j].Line)
				default:
					return 0, false, p.errf(n, "partition %s already has P_Key 0x%04x (line %d)", quote(name), p.keys[j], p.cfg.Partitions[j].Line)
				}
			}
		}
		if j, ok := p.byKey[key]; ok {
			if j == builtinDefault {
				idx, err := p.create(n, DefaultName, DefaultPKey, key)
				return idx, err == nil, err
			}
			if q := &p.cfg.Partitions[j]; q.PKey == 0 {
				return 0, false, p.errf(n, "P_Key 0x%04x is already auto-assigned to %s", key, describe(q))
			}
			return j, false, nil
		}
		idx, err := p.create(n, name, verbs.PKey(key), key)
		return idx, err == nil, err
	}
	if name != "" {
		if j, ok := p.byName[name]; ok {
			if j == builtinDefault {
				idx, err := p.create(n, DefaultName, DefaultPKey, uint16(DefaultPKey))
				return idx, err == nil, err
			}
			return j, false, nil
		}
	}
	k := nextAutoKey(&p.counter, func(k uint16) bool { _, ok := p.byKey[k]; return ok })
	if k == 0 {
		return 0, false, p.errf(n, "no free P_Key left for automatic assignment")
	}
	idx, err = p.create(n, name, 0, k)
	return idx, err == nil, err
}

func (p *parser) keyOf(j int) uint16 {
	if j == builtinDefault {
		return uint16(DefaultPKey)
	}
	return p.keys[j]
}

func describe(q *Partition) string {
	if q.Name == "" {
		return fmt.Sprintf("the unnamed partition at line %d", q.Line)
	}
	return fmt.Sprintf("partition %s (line %d)", quote(q.Name), q.Line)
}

func (p *parser) create(n int, name string, pkey verbs.PKey, key uint16) (int, error) {
	if len(p.cfg.Partitions) >= MaxPartitions {
		return 0, p.errf(n, "more than %d partitions", MaxPartitions)
	}
	if key == uint16(DefaultPKey) {
		name = DefaultName
	}
	idx := len(p.cfg.Partitions)
	p.cfg.Partitions = append(p.cfg.Partitions, Partition{Name: name, PKey: pkey, Line: n})
	p.keys = append(p.keys, key)
	p.ipoibLine = append(p.ipoibLine, 0)
	p.byKey[key] = idx
	if name != "" {
		if j, ok := p.byName[name]; !ok || j == builtinDefault {
			p.byName[name] = idx
		}
	}
	return idx, nil
}

// props parses one line's part of a port list: comma-separated ports, or an mgid entry
// that takes the rest of the segment as its flags.
func (p *parser) props(n int, seg string) error {
	d := p.cur
	toks := strings.Split(seg, ",")
	for _, t := range toks {
		if name, _, _ := cutEq(t); name == "mgid" {
			break
		}
		if strings.Contains(t, ":") {
			return p.errf(n, "unexpected ':' in port list; missing ';' after the definition at line %d", d.line)
		}
	}
	part := &p.cfg.Partitions[d.part]
	for i, t := range toks {
		name, val, hasVal := cutEq(t)
		if name == "mgid" {
			return p.mgid(n, val, hasVal, toks[i+1:])
		}
		if name == "" {
			if hasVal {
				return p.errf(n, "missing port before %s", quote("="+val))
			}
			continue // empty entry, e.g. a trailing ','
		}
		m := d.defMember
		if hasVal {
			var ok bool
			if m, ok = parseMembership(val); !ok {
				return p.errf(n, "invalid membership %s (want full, limited or both)", quote(val))
			}
		}
		sel, guid, none, err := p.port(n, name)
		if err != nil {
			return err
		}
		if none {
			continue
		}
		if p.members >= MaxMembers {
			return p.errf(n, "more than %d members", MaxMembers)
		}
		p.members++
		part.Members = append(part.Members, Member{Sel: sel, GUID: guid, Membership: m, Line: n})
	}
	return nil
}

// port parses a port specifier: a keyword (prefixes accepted, as in OpenSM) or a GUID.
func (p *parser) port(n int, s string) (sel Selector, guid verbs.GUID, none bool, err error) {
	if strings.HasPrefix("NONE", s) {
		return 0, 0, true, nil
	}
	for sel := SelALL; sel <= SelSELF; sel++ {
		if strings.HasPrefix(selectorNames[sel], s) {
			return sel, 0, false, nil
		}
	}
	if !isDigit(s[0]) {
		return 0, 0, false, p.errf(n, "unknown port keyword %s (want a port GUID, ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS or SELF)", quote(s))
	}
	v, ok, big := parseNum(s)
	if !ok || big || v == 0 {
		return 0, 0, false, p.errf(n, "invalid port GUID %s", quote(s))
	}
	return SelGUID, verbs.GUID(v), false, nil
}

// mgid parses "mgid=GID[,groupflag]…" (OpenSM's mgroup_create).
func (p *parser) mgid(n int, val string, hasVal bool, flags []string) error {
	d := p.cur
	if !hasVal || val == "" {
		return p.errf(n, "mgid needs a value")
	}
	gid, err := verbs.ParseGID(val)
	if err != nil {
		return p.errf(n, "invalid MGID %s", quote(val))
	}
	if !gid.IsMulticast() {
		return p.errf(n, "MGID %s is not multicast", gid)
	}
	f := d.flags
	f.tclass = 0 // OpenSM's mgroup_create inherits every partition flag but TClass
	for _, t := range flags {
		fname, v, hasV := cutEq(t)
		if fname == "" {
			if hasV {
				return p.errf(n, "empty flag name before %s", quote("="+v))
			}
			continue
		}
		k, ok := lookupFlag(fname, false)
		if !ok {
			return p.errf(n, "unknown mgid flag %s", quote(fname))
		}
		if err := p.groupFlag(n, &f, k, v, hasV); err != nil {
			return err
		}
	}
	g := f.group()
	if isIPMGID(gid) {
		key := p.keys[d.part]
		full := key | uint16(verbs.PKeyFullMember)
		mp := uint16(gid[4])<<8 | uint16(gid[5])
		if gid != ipoibBroadcastTemplate && mp != 0 && mp != key && mp != full {
			return p.errf(n, "IP multicast group P_Key 0x%04x does not match partition P_Key 0x%04x", mp, key)
		}
		if f.rate != d.flags.rate {
			return p.errf(n, "IP multicast group rate %d differs from the partition's rate %d", f.rate, d.flags.rate)
		}
		if f.mtu != d.flags.mtu {
			return p.errf(n, "IP multicast group mtu %d differs from the partition's mtu %d", f.mtu, d.flags.mtu)
		}
		gid[4], gid[5] = byte(full>>8), byte(full)
		g = f.broadcast()
	}
	if p.mgids >= MaxMGIDs {
		return p.errf(n, "more than %d mgid lines", MaxMGIDs)
	}
	p.mgids++
	part := &p.cfg.Partitions[d.part]
	part.MGIDs = append(part.MGIDs, MGIDGroup{MGID: gid, Flags: g, Line: n})
	return nil
}

type flagKind uint8

// Flag kinds in the order OpenSM tries them (parse_group_flag, then
// partition_add_flag): with prefix matching, the order decides ("s" is scope).
const (
	flagMTU flagKind = iota
	flagRate
	flagScope
	flagQKey
	flagTClass
	flagSL
	flagFlowLabel
	flagIPoIB
	flagIndx0
	flagDefMember
)

var flagNames = [...]string{"mtu", "rate", "scope", "Q_Key", "TClass", "sl", "FlowLabel", "ipoib", "indx0", "defmember"}

func lookupFlag(s string, partition bool) (flagKind, bool) {
	last := flagFlowLabel
	if partition {
		last = flagDefMember
	}
	for k := flagMTU; k <= last; k++ {
		if strings.HasPrefix(flagNames[k], s) {
			return k, true
		}
	}
	return 0, false
}

func (p *parser) groupFlag(n int, f *rawFlags, k flagKind, val string, hasVal bool) error {
	name := flagNames[k]
	if !hasVal || val == "" {
		return p.errf(n, "flag %s needs a value", quote(name))
	}
	v, ok, big := parseNum(val)
	if !ok {
		return p.errf(n, "invalid number %s for %s", quote(val), name)
	}
	inRange := func(lo, hi uint64) bool { return !big && v >= lo && v <= hi }
	var want string
	switch k {
	case flagMTU:
		if want = "1..5"; inRange(1, 5) {
			f.mtu = verbs.MTU(v)
			return nil
		}
	case flagRate:
		if !big && v <= 0xff && verbs.Rate(v).Valid() {
			f.rate = verbs.Rate(v)
			return nil
		}
		return p.errf(n, "rate %s is not a valid IBTA rate code (2..24)", clip(val))
	case flagScope:
		if want = "1..15"; inRange(1, 15) {
			f.scopes |= 1 << v
			return nil
		}
	case flagQKey:
		if want = "0..0xffffffff"; inRange(0, math.MaxUint32) {
			f.qkey = uint32(v)
			return nil
		}
	case flagTClass:
		if want = "0..255"; inRange(0, 255) {
			f.tclass = uint8(v)
			return nil
		}
	case flagSL:
		if want = "0..15"; inRange(0, 15) {
			f.sl = uint8(v)
			return nil
		}
	case flagFlowLabel:
		if want = "0..0xfffff"; inRange(0, 0xfffff) {
			f.flow = uint32(v)
			return nil
		}
	}
	return p.errf(n, "%s %s out of range %s", name, clip(val), want)
}

// parseMembership accepts a non-empty prefix of full, both or limited (OpenSM's order).
func parseMembership(s string) (Membership, bool) {
	switch {
	case s == "":
		return 0, false
	case strings.HasPrefix("full", s):
		return MemberFull, true
	case strings.HasPrefix("both", s):
		return MemberBoth, true
	case strings.HasPrefix("limited", s):
		return MemberLimited, true
	}
	return 0, false
}

// parseNum parses s like C strtoul(s, &end, 0) but requires all of s to be used: 0x/0X
// hexadecimal, a leading 0 octal, otherwise decimal. big reports overflow of 64 bits.
func parseNum(s string) (v uint64, ok, big bool) {
	base := uint64(10)
	switch {
	case len(s) > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'):
		base, s = 16, s[2:]
	case len(s) > 1 && s[0] == '0':
		base, s = 8, s[1:]
	}
	if s == "" {
		return 0, false, false
	}
	for i := 0; i < len(s); i++ {
		d := digitVal(s[i])
		if d >= base {
			return 0, false, false
		}
		if !big {
			if v > (math.MaxUint64-d)/base {
				big = true
			} else {
				v = v*base + d
			}
		}
	}
	return v, true, big
}

func digitVal(c byte) uint64 {
	switch {
	case '0' <= c && c <= '9':
		return uint64(c - '0')
	case 'a' <= c && c <= 'f':
		return uint64(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return uint64(c-'A') + 10
	}
	return 99
}

const spaces = " \t\r"

func trim(s string) string { return strings.Trim(s, spaces) }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// cutEq splits "name = value" at the first '=' and trims both parts.
func cutEq(s string) (name, val string, hasVal bool) {
	name, val, hasVal = strings.Cut(s, "=")
	return trim(name), trim(val), hasVal
}

// quote quotes s for an error message, shortened to keep the message readable.
func quote(s string) string { return strconv.Quote(shorten(s)) }

// clip shortens a (syntactically valid) number for an error message.
func clip(s string) string { return shorten(s) }

func shorten(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}
