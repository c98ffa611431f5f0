package fs

import (
	"math"
	"strings"
	"syscall"

	"ipoibfs/ipoib"
)

// This file holds the write parsers of the tree. Each one mirrors the kernel function
// that parses the same sysfs file, so scripts get the kernel's answers.

func isCSpace(c byte) bool {
	// The kernel's isspace (lib/ctype.c) also counts Latin-1's no-break space, 0xa0.
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == 0xa0
}

func digitVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'Z':
		return int(c-'A') + 10
	}
	return 99
}

// radixPrefix applies C's base-0 rule to s: "0x"/"0X" followed by a hex digit is
// hexadecimal (prefix skipped), another leading 0 is octal, anything else decimal.
func radixPrefix(s []byte) (base int, rest []byte) {
	if len(s) >= 3 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && digitVal(s[2]) < 16 {
		return 16, s[2:]
	}
	if len(s) >= 1 && s[0] == '0' {
		return 8, s
	}
	return 10, s
}

// scanInt parses b as the kernel's sscanf(b, "%i", &int) does (lib/vsprintf.c):
// optional leading white space, an optional '-' (a '+' is no number), then 0x
// hexadecimal, leading-0 octal or decimal; text after the number is ignored. Like
// simple_strntoull the digits wrap modulo 2^64, and the result is stored into a C int,
// so only its low 32 bits count (4294967297 is 1). ok is false when there is no number.
func scanInt(b []byte) (v int32, ok bool) {
	i := 0
	for i < len(b) && isCSpace(b[i]) {
		i++
	}
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	base, s := radixPrefix(b[i:])
	var u uint64
	n := 0
	for ; n < len(s); n++ {
		d := digitVal(s[n])
		if d >= base {
			break
		}
		u = u*uint64(base) + uint64(d)
	}
	if n == 0 {
		return 0, false
	}
	if neg {
		u = -u
	}
	return int32(uint32(u)), true
}

// simpleStrtoul is the kernel's simple_strtoul(b, NULL, 0): no white space or sign,
// radix from the prefix, it stops at the first non-digit and wraps on overflow; garbage
// gives 0.
func simpleStrtoul(b []byte) uint64 {
	base, s := radixPrefix(b)
	var u uint64
	for _, c := range s {
		d := digitVal(c)
		if d >= base {
			break
		}
		u = u*uint64(base) + uint64(d)
	}
	return u
}

// parseUmcast is umcast_store: simple_strtoul, passed on as a C int, "> 0" sets the
// flag. It never fails.
func parseUmcast(b []byte) bool {
	return int32(uint32(simpleStrtoul(b))) > 0
}

// parseMTU accepts a decimal integer with at most one trailing newline.
// kstrtoul parses b as the kernel's kstrtoul(buf, 0, &v) does for net-sysfs stores:
// an optional '+', then 0x hexadecimal, leading-0 octal or decimal digits, and at most
// one trailing newline; anything else is EINVAL, a value beyond 64 bits ERANGE.
func kstrtoul(b []byte) (uint64, error) {
	s := b
	if n := len(s); n > 0 && s[n-1] == '\n' {
		s = s[:n-1]
	}
	if len(s) > 0 && s[0] == '+' {
		s = s[1:]
	}
	base, digits := radixPrefix(s)
	if len(digits) == 0 {
		return 0, errorf(syscall.EINVAL, "%q is not a number", clip(b))
	}
	var v uint64
	for _, c := range digits {
		d := digitVal(c)
		if d >= base {
			return 0, errorf(syscall.EINVAL, "%q is not a number", clip(b))
		}
		if v > (1<<64-1-uint64(d))/uint64(base) {
			return 0, errorf(syscall.ERANGE, "%q is out of range", clip(b))
		}
		v = v*uint64(base) + uint64(d)
	}
	return v, nil
}

func parseMTU(b []byte) (int, error) {
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" || len(s) > 9 {
		return 0, errorf(syscall.EINVAL, "%q is not a decimal MTU", clip(b))
	}
	v := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errorf(syscall.EINVAL, "%q is not a decimal MTU", clip(b))
		}
		v = v*10 + int(s[i]-'0')
	}
	return v, nil
}

// parseMode accepts "datagram" or "connected" with or without one trailing newline.
// parseMode is ipoib_set_mode's strcmp against "datagram\n" and "connected\n": the
// newline is part of the word, so `echo -n connected` is EINVAL as on the kernel.
func parseMode(b []byte) (ipoib.Mode, error) {
	switch string(b) {
	case "datagram\n":
		return ipoib.Datagram, nil
	case "connected\n":
		return ipoib.Connected, nil
	}
	return 0, errorf(syscall.EINVAL, "%q: write \"datagram\" or \"connected\" followed by a newline, as echo does", clip(b))
}

// parsePKeyArg is create_child/delete_child's sscanf("%i").
func parsePKeyArg(b []byte) (int64, error) {
	v, ok := scanInt(b)
	if !ok {
		return 0, errorf(syscall.EINVAL, "%q is not a number (P_Keys are read like C %%i: 0x8001, 32769)", clip(b))
	}
	return int64(v), nil
}

// parseUintToken reads a whole token like ethtool's get_uint_range: C strtoull base 0
// (0x hexadecimal, leading-0 octal, decimal) and nothing else.
func parseUintToken(tok string) (uint64, bool) {
	b := []byte(tok)
	if len(b) > 0 && b[0] == '+' {
		b = b[1:]
	}
	base, s := radixPrefix(b)
	if len(s) == 0 {
		return 0, false
	}
	var u uint64
	for _, c := range s {
		d := digitVal(c)
		if d >= base {
			return 0, false
		}
		if u > (math.MaxUint64-uint64(d))/uint64(base) {
			return 0, false
		}
		u = u*uint64(base) + uint64(d)
	}
	return u, true
}

// Coalescing parameters ethtool knows but ib_ipoib does not support: the ethtool core
// answers EOPNOTSUPP for them.
var unsupportedCoalesce = map[string]bool{
	"adaptive-rx": true, "adaptive-tx": true, "rx-usecs-irq": true, "rx-frames-irq": true,
	"tx-usecs": true, "tx-frames": true, "tx-usecs-irq": true, "tx-frames-irq": true,
	"stats-block-usecs": true, "pkt-rate-low": true, "rx-usecs-low": true,
	"rx-frames-low": true, "tx-usecs-low": true, "tx-frames-low": true,
	"pkt-rate-high": true, "rx-usecs-high": true, "rx-frames-high": true,
	"tx-usecs-high": true, "tx-frames-high": true, "sample-interval": true,
	"cqe-mode-rx": true, "cqe-mode-tx": true, "tx-aggr-max-bytes": true,
	"tx-aggr-max-frames": true, "tx-aggr-time-usecs": true,
}

// parseCoalesce reads "name value" pairs (like `ethtool -C ib0 rx-usecs 8 rx-frames 16`;
// a colon after the name and any white space including newlines are allowed, so the
// file's own content can be written back). Only rx-usecs and rx-frames exist, each
// 0..65535.
func parseCoalesce(cur ipoib.Coalesce, b []byte) (ipoib.Coalesce, error) {
	toks := strings.Fields(string(b))
	if len(toks) == 0 {
		return cur, errorf(syscall.EINVAL, "nothing to set: write \"rx-usecs N\" and/or \"rx-frames N\"")
	}
	for k := 0; k < len(toks); k += 2 {
		name := strings.TrimSuffix(toks[k], ":")
		if k+1 >= len(toks) {
			return cur, errorf(syscall.EINVAL, "%q has no value", clip([]byte(name)))
		}
		var dst *int
		switch name {
		case "rx-usecs":
			dst = &cur.RxUsecs
		case "rx-frames":
			dst = &cur.RxFrames
		default:
			if unsupportedCoalesce[name] {
				return cur, errorf(syscall.EOPNOTSUPP, "%s is not supported by ib_ipoib (only rx-usecs and rx-frames)", name)
			}
			return cur, errorf(syscall.EINVAL, "unknown coalescing parameter %q (rx-usecs, rx-frames)", clip([]byte(name)))
		}
		v, ok := parseUintToken(toks[k+1])
		if !ok {
			return cur, errorf(syscall.EINVAL, "%s: %q is not a number", name, clip([]byte(toks[k+1])))
		}
		if v > 0xffff {
			return cur, errorf(syscall.EINVAL, "%s: %d is above 65535", name, v)
		}
		*dst = int(v)
	}
	return cur, nil
}

// featureNames are the ethtool -k names the features file shows, in order, with the
// ethtool -K short names also accepted on write.
var featureNames = []struct {
	long, short string
	get         func(ipoib.Features) bool
	set         func(*ipoib.Features, bool)
}{
	{"rx-checksumming", "rx", func(f ipoib.Features) bool { return f.RxChecksum }, func(f *ipoib.Features, v bool) { f.RxChecksum = v }},
	{"tx-checksumming", "tx", func(f ipoib.Features) bool { return f.TxChecksum }, func(f *ipoib.Features, v bool) { f.TxChecksum = v }},
	{"tcp-segmentation-offload", "tso", func(f ipoib.Features) bool { return f.TSO }, func(f *ipoib.Features, v bool) { f.TSO = v }},
	{"generic-receive-offload", "gro", func(f ipoib.Features) bool { return f.GRO }, func(f *ipoib.Features, v bool) { f.GRO = v }},
}

// parseFeatures reads "name on|off" pairs (ethtool -K style; long or short names, an
// optional colon after the name) and applies them in order to the requested features.
func parseFeatures(req ipoib.Features, b []byte) (ipoib.Features, error) {
	toks := strings.Fields(string(b))
	if len(toks) == 0 {
		return req, errorf(syscall.EINVAL, "nothing to set: write \"<feature> on|off\"")
	}
	for k := 0; k < len(toks); k += 2 {
		name := strings.TrimSuffix(toks[k], ":")
		if k+1 >= len(toks) {
			return req, errorf(syscall.EINVAL, "%q has no value (on or off)", clip([]byte(name)))
		}
		idx := -1
		for j, f := range featureNames {
			if name == f.long || name == f.short {
				idx = j
			}
		}
		if idx < 0 {
			return req, errorf(syscall.EINVAL, "unknown feature %q (rx-checksumming, tx-checksumming, tcp-segmentation-offload, generic-receive-offload)", clip([]byte(name)))
		}
		var on bool
		switch toks[k+1] {
		case "on":
			on = true
		case "off":
		default:
			return req, errorf(syscall.EINVAL, "%s: %q is neither on nor off", name, clip([]byte(toks[k+1])))
		}
		featureNames[idx].set(&req, on)
	}
	return req, nil
}

// clip shortens written bytes for a log line.
func clip(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}

// linkCmd is a write to the root file `link`, in iproute2's words:
// "add link PARENT name NAME type ipoib [pkey P] [mode datagram|connected] [umcast 0|1]"
// or "del NAME".
type linkCmd struct {
	add          bool
	parent, name string
	pkey         int64 // 0: the parent's
	mode         ipoib.Mode
	umcast       bool
}

func parseLinkCmd(b []byte) (linkCmd, error) {
	var c linkCmd
	bad := func(format string, a ...any) (linkCmd, error) {
		return linkCmd{}, errorf(syscall.EINVAL, format, a...)
	}
	toks := strings.Fields(string(b))
	if len(toks) == 0 {
		return bad("write \"add link PARENT name NAME type ipoib [pkey P] [mode M] [umcast 0|1]\" or \"del NAME\"")
	}
	switch toks[0] {
	case "del", "delete":
		if len(toks) != 2 {
			return bad("del takes one interface name")
		}
		return linkCmd{name: toks[1]}, nil
	case "add":
	default:
		return bad("unknown command %q (add, del)", clip([]byte(toks[0])))
	}
	c.add = true
	typ := ""
	for k := 1; k < len(toks); k += 2 {
		if k+1 >= len(toks) {
			return bad("%q has no value", clip([]byte(toks[k])))
		}
		v := toks[k+1]
		switch toks[k] {
		case "link":
			c.parent = v
		case "name":
			c.name = v
		case "type":
			typ = v
		case "pkey":
			// iproute2 reads it with get_u16: strtoul base 0, the whole word.
			p, ok := parseUintToken(v)
			if !ok || p > 0xffff || p&0x7fff == 0 {
				return bad("pkey %q is invalid", clip([]byte(v)))
			}
			c.pkey = int64(p)
		case "mode":
			switch v {
			case "datagram":
				c.mode = ipoib.Datagram
			case "connected":
				c.mode = ipoib.Connected
			default:
				return bad("mode %q: datagram or connected", clip([]byte(v)))
			}
		case "umcast":
			switch v {
			case "0":
			case "1":
				c.umcast = true
			default:
				return bad("umcast %q: 0 or 1", clip([]byte(v)))
			}
		default:
			return bad("unknown option %q", clip([]byte(toks[k])))
		}
	}
	switch {
	case typ != "ipoib":
		return bad("type %q: only ipoib", clip([]byte(typ)))
	case c.parent == "":
		return bad("no parent (link PARENT)")
	case c.name == "":
		return bad("no name (name NAME)")
	}
	return c, nil
}
