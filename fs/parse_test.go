package fs

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft/partitions"
)

type partitionT = partitions.Partition

func verbsAttr(width, lane int) verbs.PortAttr { return verbs.PortAttr{Width: width, LaneMbps: lane} }

func TestScanInt(t *testing.T) {
	for _, c := range []struct {
		in string
		v  int32
		ok bool
	}{
		{"0x8001", 0x8001, true}, {"0X8001\n", 0x8001, true}, {"32769", 32769, true}, {"0100001", 0x8001, true},
		{"  \t\n0x10", 16, true}, {"-5", -5, true}, {"12abc", 12, true}, {"0x", 0, true},
		{"0xg", 0, true}, {"08", 0, true}, {"0", 0, true}, {"", 0, false}, {"x1", 0, false}, {"-", 0, false},
		{"- 1", 0, false}, {"+-1", 0, false}, {"\n", 0, false}, {"8001", 8001, true}, {"1 2", 1, true},
		// vsscanf takes a '-' only: a '+' is no number.
		{"+7", 0, false}, {"+0x8001", 0, false}, {" +1", 0, false},
		// The value lands in a C int: the low 32 bits of a sum that wraps at 2^64.
		{"4294967297", 1, true}, {"0x100008001", 0x8001, true}, {"2147483648", math.MinInt32, true},
		{"0xffffffffffffffffffff", -1, true}, {"-99999999999999999999", -1661992959, true},
		{"-0x80000001", math.MaxInt32, true},
		{"\xa032769", 32769, true}, // lib/ctype.c: 0xa0 is a space
	} {
		v, ok := scanInt([]byte(c.in))
		if v != c.v || ok != c.ok {
			t.Errorf("scanInt(%q) = %d, %v; want %d, %v", c.in, v, ok, c.v, c.ok)
		}
	}
}

func TestUmcastParse(t *testing.T) {
	for _, c := range []struct {
		in string
		on bool
	}{
		{"1", true}, {"1\n", true}, {"0", false}, {"", false}, {"garbage", false}, {" 1", false},
		{"-1", false}, {"0x10", true}, {"010", true}, {"0xffffffff", false}, {"0x100000000", false},
		{"0x100000001", true}, {"2147483648", false}, {"2147483647", true}, {"09", false},
	} {
		if got := parseUmcast([]byte(c.in)); got != c.on {
			t.Errorf("umcast %q = %v want %v", c.in, got, c.on)
		}
	}
}

func TestParseUintToken(t *testing.T) {
	for _, c := range []struct {
		in string
		v  uint64
		ok bool
	}{
		{"10", 10, true}, {"0x10", 16, true}, {"010", 8, true}, {"+5", 5, true}, {"0", 0, true},
		{"", 0, false}, {"-1", 0, false}, {"1a", 0, false}, {"0x", 0, false}, {"09", 0, false},
		{"99999999999999999999999", 0, false},
	} {
		v, ok := parseUintToken(c.in)
		if ok != c.ok || (ok && v != c.v) {
			t.Errorf("parseUintToken(%q) = %d, %v", c.in, v, ok)
		}
	}
}

// FuzzKstrtoul: what kstrtoul accepts is a number strconv reads the same way, with at
// most one trailing newline and an optional '+'.
func FuzzKstrtoul(f *testing.F) {
	for _, s := range []string{"0x1003\n", "4098", "010", "+7", "18446744073709551615", "18446744073709551616", "0x", "-1", "1\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := kstrtoul(b)
		if err != nil {
			return
		}
		s := strings.TrimPrefix(strings.TrimSuffix(string(b), "\n"), "+")
		w, perr := strconv.ParseUint(s, 0, 64)
		if perr != nil || w != v {
			t.Fatalf("kstrtoul(%q) = %d; strconv says %d, %v", b, v, w, perr)
		}
	})
}

// The link file's pkey is iproute2's get_u16: the whole word, base 0, at most 0xffff;
// the kernel then refuses 0 and 0x8000 (ipoib_new_child_link).
func TestLinkCmdPKey(t *testing.T) {
	for _, c := range []struct {
		in   string
		pkey int64
		ok   bool
	}{
		{"0x8005", 0x8005, true}, {"32773", 32773, true}, {"0100005", 0x8005, true}, {"+0x8005", 0x8005, true},
		{"0x8005x", 0, false}, {"5junk", 0, false}, {"0x10000", 0, false}, {"0x100008005", 0, false},
		{"0", 0, false}, {"0x8000", 0, false}, {"-1", 0, false}, {"0x", 0, false},
	} {
		cmd, err := parseLinkCmd([]byte("add link ib0 name x type ipoib pkey " + c.in))
		if (err == nil) != c.ok || cmd.pkey != c.pkey {
			t.Errorf("pkey %q: %+v, %v; want %#x, ok %v", c.in, cmd, err, c.pkey, c.ok)
		}
	}
}
