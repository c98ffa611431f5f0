package partitions

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"ipoibfs/verbs"
)

// ibsimPartitions is /work/shared/tools/ibsim-sa/partitions.conf.
const ibsimPartitions = `Default=0xffff, ipoib, mtu=5 : ALL=full;
P1=0x8001, ipoib : ALL=full;
`

// gf returns OpenSM's default IPoIB group flags changed by mods.
func gf(mods ...func(*GroupFlags)) GroupFlags {
	g := GroupFlags{MTU: 4, Rate: 3, SL: 0, Scopes: []uint8{2}, QKey: 0x0b1b}
	for _, m := range mods {
		m(&g)
	}
	return g
}

func mtu(m verbs.MTU) func(*GroupFlags)                { return func(g *GroupFlags) { g.MTU = m } }
func rate(r verbs.Rate) func(*GroupFlags)              { return func(g *GroupFlags) { g.Rate = r } }
func sl(s uint8) func(*GroupFlags)                     { return func(g *GroupFlags) { g.SL = s } }
func scopes(s ...uint8) func(*GroupFlags)              { return func(g *GroupFlags) { g.Scopes = s } }
func qkey(q uint32) func(*GroupFlags)                  { return func(g *GroupFlags) { g.QKey = q } }
func tclass(c uint8) func(*GroupFlags)                 { return func(g *GroupFlags) { g.TClass = c } }
func flowLabel(f uint32) func(*GroupFlags)             { return func(g *GroupFlags) { g.FlowLabel = f } }
func guid(g verbs.GUID, m Membership, line int) Member { return Member{SelGUID, g, m, line} }
func kw(s Selector, m Membership, line int) Member     { return Member{s, 0, m, line} }

func mustGID(t testing.TB, s string) verbs.GID {
	t.Helper()
	g, err := verbs.ParseGID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var ignoreLines = cmp.Options{
	cmpopts.IgnoreFields(Partition{}, "Line"),
	cmpopts.IgnoreFields(Member{}, "Line"),
	cmpopts.IgnoreFields(MGIDGroup{}, "Line"),
}

type validCase struct {
	name string
	in   string
	want func(t testing.TB) *Config
	keys []verbs.PKey
}

var validCases = []validCase{
	{
		name: "default rule",
		in:   "Default=0x7fff, ipoib : ALL=full;",
		want: func(testing.TB) *Config { return Default() },
		keys: []verbs.PKey{0x7fff},
	},
	{
		name: "ibsim-sa partitions.conf",
		in:   ibsimPartitions,
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{
				{Name: "Default", PKey: 0x7fff, IPoIB: true, IPoIBFlags: gf(mtu(5)),
					Members: []Member{kw(SelALL, MemberFull, 1)}, Line: 1},
				{Name: "P1", PKey: 0x0001, IPoIB: true, IPoIBFlags: gf(),
					Members: []Member{kw(SelALL, MemberFull, 2)}, Line: 2},
			}}
		},
		keys: []verbs.PKey{0x7fff, 0x0001},
	},
	{
		name: "Default 0xffff with 4K MTU",
		in:   "Default=0xffff, ipoib, mtu=5 : ALL=full;",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "Default", PKey: 0x7fff, IPoIB: true,
				IPoIBFlags: gf(mtu(5)), Members: []Member{kw(SelALL, MemberFull, 1)}, Line: 1}}}
		},
		keys: []verbs.PKey{0x7fff},
	},
	{
		name: "multi-line definition with comments",
		in: `# Storage partition
Storage = 0x0a , ipoib , rate=7 :   # trailing comment
    0x0002c90300000001 = full,   # first port
    0x0002c90300000002,
    # a comment line in the middle
    SELF=both
    ;
`,
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "Storage", PKey: 0x0a, IPoIB: true,
				IPoIBFlags: gf(rate(7)),
				Members: []Member{
					guid(0x0002c90300000001, MemberFull, 3),
					guid(0x0002c90300000002, MemberLimited, 4),
					kw(SelSELF, MemberBoth, 6),
				}, Line: 2}}}
		},
		keys: []verbs.PKey{0x000a},
	},
	{
		name: "RHEL example: mgid lines and a merged Default",
		in: `Default=0x7fff, rate=3, mtu=4, scope=2, defmember=full:
        ALL, ALL_SWITCHES=full;
Default=0x7fff, ipoib, rate=3, mtu=4, scope=2:
        mgid=ff12:401b::ffff:ffff       # IPv4 Broadcast address
        mgid=ff12:401b::1               # IPv4 All Hosts group
        mgid=ff12:601b::16              # IPv6 MLDv2-capable Routers
        mgid=ff12:a01b::fb, Q_Key=0x1234, sl=2, TClass=4
        ;
`,
		want: func(t testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "Default", PKey: 0x7fff, IPoIB: true,
				IPoIBFlags: gf(), DefMember: MemberFull,
				Members: []Member{kw(SelALL, MemberFull, 2), kw(SelALLSwitches, MemberFull, 2)},
				MGIDs: []MGIDGroup{
					{mustGID(t, "ff12:401b:ffff::ffff:ffff"), gf(), 4},
					{mustGID(t, "ff12:401b:ffff::1"), gf(), 5},
					{mustGID(t, "ff12:601b:ffff::16"), gf(), 6},
					{mustGID(t, "ff12:a01b::fb"), gf(qkey(0x1234), sl(2), tclass(4)), 7},
				},
				Line: 1}}}
		},
		keys: []verbs.PKey{0x7fff},
	},
	{
		name: "defmember and repeated definitions (partition-config.txt ShareIO)",
		in: `ShareIO = 0x80 , defmember=full : 0x123451, 0x123452;
ShareIO = 0x80 : 0x123453, 0x123454, 0x123455=full;
ShareIO = 0x80 , defmember=full : 0x123459, 0x12345a;
ShareIO = 0x80 , defmember=full : 0x12345b, 0x12345c=limited, 0x12345d;
`,
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "ShareIO", PKey: 0x80, IPoIBFlags: gf(),
				DefMember: MemberFull,
				Members: []Member{
					guid(0x123451, MemberFull, 1), guid(0x123452, MemberFull, 1),
					guid(0x123453, MemberLimited, 2), guid(0x123454, MemberLimited, 2), guid(0x123455, MemberFull, 2),
					guid(0x123459, MemberFull, 3), guid(0x12345a, MemberFull, 3),
					guid(0x12345b, MemberFull, 4), guid(0x12345c, MemberLimited, 4), guid(0x12345d, MemberFull, 4),
				}, Line: 1}}}
		},
		keys: []verbs.PKey{0x0080},
	},
	{
		name: "partition-config.txt examples",
		in: `Default=0x7fff : ALL, SELF=full ;
Default=0x7fff : ALL, ALL_SWITCHES=full, SELF=full ;

NewPartition , ipoib : 0x123456=full, 0x3456789034=limi, 0x2134af2306 ;

YetAnotherOne = 0x300 : SELF=full ;
YetAnotherOne = 0x300 : ALL=limited ;
`,
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{
				{Name: "Default", PKey: 0x7fff, IPoIBFlags: gf(), Members: []Member{
					kw(SelALL, MemberLimited, 1), kw(SelSELF, MemberFull, 1),
					kw(SelALL, MemberLimited, 2), kw(SelALLSwitches, MemberFull, 2), kw(SelSELF, MemberFull, 2),
				}, Line: 1},
				{Name: "NewPartition", IPoIB: true, IPoIBFlags: gf(), Members: []Member{
					guid(0x123456, MemberFull, 4), guid(0x3456789034, MemberLimited, 4), guid(0x2134af2306, MemberLimited, 4),
				}, Line: 4},
				{Name: "YetAnotherOne", PKey: 0x300, IPoIBFlags: gf(), Members: []Member{
					kw(SelSELF, MemberFull, 6), kw(SelALL, MemberLimited, 7),
				}, Line: 6},
			}}
		},
		keys: []verbs.PKey{0x7fff, 0x0001, 0x0300},
	},
	{
		name: "automatic keys, names, SELF, indx0, both",
		in: `A : ALL;
B=0x0002 : SELF=full;
C, ipoib : ALL=full;
A : 0x10=full;
: ALL ;
Default : 0x20=both;
0x0005, indx0 : 0x30;
`,
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{
				{Name: "A", IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberLimited, 1), guid(0x10, MemberFull, 4)}, Line: 1},
				{Name: "B", PKey: 2, IPoIBFlags: gf(), Members: []Member{kw(SelSELF, MemberFull, 2)}, Line: 2},
				{Name: "C", IPoIB: true, IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberFull, 3)}, Line: 3},
				{IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberLimited, 5)}, Line: 5},
				{Name: "Default", PKey: 0x7fff, IPoIBFlags: gf(), Members: []Member{guid(0x20, MemberBoth, 6)}, Line: 6},
				{PKey: 5, Index0: true, IPoIBFlags: gf(), Members: []Member{guid(0x30, MemberLimited, 7)}, Line: 7},
			}}
		},
		keys: []verbs.PKey{0x0001, 0x0002, 0x0003, 0x0004, 0x7fff, 0x0005},
	},
	{
		name: "several definitions per line, CRLF",
		in:   "A=0x1 : ALL=full ; B=0x2, ipoib : SELF ;\r\nC=0x3 :\r\n ALL=both\r\n;\r\n",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{
				{Name: "A", PKey: 1, IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberFull, 1)}, Line: 1},
				{Name: "B", PKey: 2, IPoIB: true, IPoIBFlags: gf(), Members: []Member{kw(SelSELF, MemberLimited, 1)}, Line: 1},
				{Name: "C", PKey: 3, IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberBoth, 3)}, Line: 2},
			}}
		},
		keys: []verbs.PKey{1, 2, 3},
	},
	{
		name: "scopes and mgid flag inheritance (TClass is not inherited)",
		in: `P=0x5, ipoib, scope=5, scope=2, sl=3, Q_Key=0x22, TClass=7, FlowLabel=0x12345 :
  mgid=ff12:a01b::1
  mgid=ff12:a01b::2, scope=8, TClass=1, Q_Key=0
  mgid=ff15:401b:5::3
  ;
`,
		want: func(t testing.TB) *Config {
			inherited := gf(sl(3), scopes(2, 5), qkey(0x22), flowLabel(0x12345))
			return &Config{Partitions: []Partition{{Name: "P", PKey: 5, IPoIB: true,
				IPoIBFlags: gf(sl(3), scopes(2, 5), qkey(0x22), tclass(7), flowLabel(0x12345)),
				MGIDs: []MGIDGroup{
					{mustGID(t, "ff12:a01b::1"), inherited, 2},
					{mustGID(t, "ff12:a01b::2"), gf(sl(3), scopes(2, 5, 8), qkey(0), tclass(1), flowLabel(0x12345)), 3},
					{mustGID(t, "ff15:401b:8005::3"), inherited, 4},
				},
				Line: 1}}}
		},
		keys: []verbs.PKey{5},
	},
	{
		name: "non-IP group without Q_Key has Q_Key 0; IP group gets 0x0b1b",
		in:   "P=0x6 : mgid=ff12:1234::1 ;\nP=0x6 : mgid=ff12:401b::7 ;",
		want: func(t testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "P", PKey: 6, IPoIBFlags: gf(),
				MGIDs: []MGIDGroup{
					{mustGID(t, "ff12:1234::1"), gf(qkey(0)), 1},
					{mustGID(t, "ff12:401b:8006::7"), gf(), 2},
				}, Line: 1}}}
		},
		keys: []verbs.PKey{6},
	},
	{
		name: "abbreviations as OpenSM accepts them",
		in:   "P=0x6, i, in, m=5, r=6, s=5, d=b : A=f, AL=l, ALL_=b, ALL_S, ALL_R, S, N, NONE=full ;",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "P", PKey: 6, Index0: true, IPoIB: true,
				IPoIBFlags: gf(mtu(5), rate(6), scopes(5)), DefMember: MemberBoth,
				Members: []Member{
					kw(SelALL, MemberFull, 1), kw(SelALL, MemberLimited, 1), kw(SelALLCAs, MemberBoth, 1),
					kw(SelALLSwitches, MemberBoth, 1), kw(SelALLRouters, MemberBoth, 1), kw(SelSELF, MemberBoth, 1),
				}, Line: 1}}}
		},
		keys: []verbs.PKey{6},
	},
	{
		name: "another name for 0x7fff is the Default partition",
		in:   "Everyone=0x7fff, ipoib : ALL=full ;",
		want: func(testing.TB) *Config { return Default() },
		keys: []verbs.PKey{0x7fff},
	},
	{
		name: "decimal and octal numbers, empty port list, unnamed key",
		in:   "P=10 : 100=full, 010 ;\nQ=0x7 : ;\n0x10 :,, ALL=full, ;",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{
				{Name: "P", PKey: 10, IPoIBFlags: gf(), Members: []Member{guid(100, MemberFull, 1), guid(8, MemberLimited, 1)}, Line: 1},
				{Name: "Q", PKey: 7, IPoIBFlags: gf(), Line: 2},
				{PKey: 0x10, IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberFull, 3)}, Line: 3},
			}}
		},
		keys: []verbs.PKey{10, 7, 0x10},
	},
	{
		name: "indx0 on a later definition counts",
		in:   "P=0x5 : ALL ;\nP=0x5, indx0 : SELF=full ;\nP=0x5 : 0x7 ;",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "P", PKey: 5, Index0: true, IPoIBFlags: gf(),
				Members: []Member{kw(SelALL, MemberLimited, 1), kw(SelSELF, MemberFull, 2), guid(7, MemberLimited, 3)}, Line: 1}}}
		},
		keys: []verbs.PKey{5},
	},
	{
		name: "line of exactly MaxLineBytes",
		in:   "P=0x1 :\n" + strings.Repeat(" ", MaxLineBytes-4) + "ALL;\n",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "P", PKey: 1, IPoIBFlags: gf(), Members: []Member{kw(SelALL, MemberLimited, 2)}, Line: 1}}}
		},
		keys: []verbs.PKey{1},
	},
	{
		name: "upper-case hex",
		in:   "P=0X1F : 0XABCDEF=full ;",
		want: func(testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "P", PKey: 0x1f, IPoIBFlags: gf(), Members: []Member{guid(0xabcdef, MemberFull, 1)}, Line: 1}}}
		},
		keys: []verbs.PKey{0x1f},
	},
	{
		name: "ipoib added by a later definition; equal ipoib flags may repeat",
		in: `P=0x9, mtu=3 : ALL ;
P=0x9, ipoib, mtu=5 : SELF=full ;
P=0x9, ipoib, mtu=5, Q_Key=0x0b1b, scope=2 :
  mgid=ff12:401b:8009::7, mtu=5 ;
`,
		want: func(t testing.TB) *Config {
			return &Config{Partitions: []Partition{{Name: "P", PKey: 9, IPoIB: true, IPoIBFlags: gf(mtu(5)),
				Members: []Member{kw(SelALL, MemberLimited, 1), kw(SelSELF, MemberFull, 2)},
				MGIDs:   []MGIDGroup{{mustGID(t, "ff12:401b:8009::7"), gf(mtu(5)), 4}},
				Line:    1}}}
		},
		keys: []verbs.PKey{9},
	},
	{
		name: "empty file",
		in:   "",
		want: func(testing.TB) *Config { return &Config{} },
	},
	{
		name: "only comments and blank lines",
		in:   "# nothing here\n\n   \t# still nothing ; : =\n",
		want: func(testing.TB) *Config { return &Config{} },
	},
}

func TestParseValid(t *testing.T) {
	for _, tc := range validCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("t.conf", strings.NewReader(tc.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want(t), got); diff != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.keys, got.Keys(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Keys mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStringRoundTrip(t *testing.T) {
	for _, tc := range validCases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("t.conf", strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, c)
		})
	}
}

// roundTrip checks that c.String() parses back to c (apart from lines) and that
// formatting is stable.
func roundTrip(t testing.TB, c *Config) {
	t.Helper()
	out := c.String()
	c2, err := Parse("formatted", strings.NewReader(out))
	if err != nil {
		t.Fatalf("String() does not parse: %v\n%s", err, out)
	}
	if diff := cmp.Diff(c, c2, ignoreLines); diff != "" {
		t.Fatalf("Parse(String()) differs (-orig +reparsed):\n%s\nformatted:\n%s", diff, out)
	}
	if diff := cmp.Diff(c.Keys(), c2.Keys()); diff != "" {
		t.Fatalf("Keys differ after round trip:\n%s", diff)
	}
	if out2 := c2.String(); out2 != out {
		t.Fatalf("String() not stable:\n%s\n---\n%s", out, out2)
	}
}

func TestStringExamples(t *testing.T) {
	c, err := Parse("t.conf", strings.NewReader(ibsimPartitions))
	if err != nil {
		t.Fatal(err)
	}
	want := "Default=0x7fff, ipoib, mtu=5 :\n\tALL=full ;\nP1=0x0001, ipoib :\n\tALL=full ;\n"
	if got := c.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}

	// A merged partition whose IP group does not fit the header gets its own definition.
	c, err = Parse("t.conf", strings.NewReader("P=0x2, rate=6 : mgid=ff12:401b::1, scope=5 ;\nP=0x2, ipoib, scope=8 : 0x3=both ;"))
	if err != nil {
		t.Fatal(err)
	}
	want = "P=0x0002, ipoib, scope=8 :\n\t0x0000000000000003=both ;\n" +
		"P=0x0002, rate=6, mtu=4 :\n\tmgid=ff12:401b:8002::1, rate=6, mtu=4, sl=0, scope=5, Q_Key=0x00000b1b, TClass=0, FlowLabel=0x00000 ;\n"
	if got := c.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
	roundTrip(t, c)
}

func TestDefault(t *testing.T) {
	c, err := Parse("t.conf", strings.NewReader("Default=0x7fff, ipoib : ALL=full ;"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, Default()); diff != "" {
		t.Errorf("Default() differs from its rule (-parsed +Default):\n%s", diff)
	}
	// Default() returns a fresh value every time.
	d := Default()
	d.Partitions[0].Members[0].Membership = MemberLimited
	if Default().Partitions[0].Members[0].Membership != MemberFull {
		t.Error("Default() shares state between calls")
	}
}

type errorCase struct {
	name string
	in   string
	want string
}

var errorCases = []errorCase{
	{"unknown partition flag", "P=0x1, foo : ALL;", `t.conf:1: unknown partition flag "foo"`},
	{"long token is shortened", "P=0x1, " + strings.Repeat("x", 50) + "é : ALL;", `t.conf:1: unknown partition flag "` + strings.Repeat("x", 40) + `..."`},
	{"long number is shortened", "P=0x1, mtu=0X" + strings.Repeat("F", 50) + " : ALL;", `t.conf:1: mtu 0X` + strings.Repeat("F", 38) + `... out of range 1..5`},
	{"qkey is not OpenSM's spelling", "P=0x1, qkey=5 : ALL;", `t.conf:1: unknown partition flag "qkey"`},
	{"unknown mgid flag", "P=0x1 :\n  mgid=ff12::1, ipoib ;", `t.conf:2: unknown mgid flag "ipoib"`},
	{"bad number", "P=0x1, mtu=abc : ALL;", `t.conf:1: invalid number "abc" for mtu`},
	{"trailing garbage in number", "P=0x1, sl=3x : ALL;", `t.conf:1: invalid number "3x" for sl`},
	{"negative number", "P=0x1, TClass=-1 : ALL;", `t.conf:1: invalid number "-1" for TClass`},
	{"bad number on mgid line", "P=0x1 : ALL, mgid=ff12::1, rate=x", `t.conf:1: invalid number "x" for rate`},
	{"mtu too big", "P=0x1, mtu=6 : ALL;", `t.conf:1: mtu 6 out of range 1..5`},
	{"mtu zero", "P=0x1, mtu=0 : ALL;", `t.conf:1: mtu 0 out of range 1..5`},
	{"mtu overflows 64 bits", "P=0x1, mtu=99999999999999999999999 : ALL;", `t.conf:1: mtu 99999999999999999999999 out of range 1..5`},
	{"rate 1", "P=0x1, rate=1 : ALL;", `t.conf:1: rate 1 is not a valid IBTA rate code (2..24)`},
	{"rate 25", "P=0x1, rate=25 : ALL;", `t.conf:1: rate 25 is not a valid IBTA rate code (2..24)`},
	{"sl 16", "P=0x1, sl=16 : ALL;", `t.conf:1: sl 16 out of range 0..15`},
	{"scope 0", "P=0x1, scope=0 : ALL;", `t.conf:1: scope 0 out of range 1..15`},
	{"scope 16", "P=0x1 : mgid=ff12::1, scope=0x10", `t.conf:1: scope 0x10 out of range 1..15`},
	{"Q_Key 33 bits", "P=0x1, Q_Key=0x100000000 : ALL;", `t.conf:1: Q_Key 0x100000000 out of range 0..0xffffffff`},
	{"TClass 256", "P=0x1, TClass=256 : ALL;", `t.conf:1: TClass 256 out of range 0..255`},
	{"FlowLabel 21 bits", "P=0x1, FlowLabel=0x100000 : ALL;", `t.conf:1: FlowLabel 0x100000 out of range 0..0xfffff`},
	{"flag without value", "P=0x1, mtu : ALL;", `t.conf:1: flag "mtu" needs a value`},
	{"flag with empty value", "P=0x1, rate= : ALL;", `t.conf:1: flag "rate" needs a value`},
	{"ipoib with value", "P=0x1, ipoib=1 : ALL;", `t.conf:1: flag "ipoib" takes no value`},
	{"indx0 with value", "P=0x1, indx0=yes : ALL;", `t.conf:1: flag "indx0" takes no value`},
	{"defmember without value", "P=0x1, defmember : ALL;", `t.conf:1: flag "defmember" needs a value`},
	{"defmember invalid", "P=0x1, defmember=most : ALL;", `t.conf:1: invalid membership "most" (want full, limited or both)`},
	{"empty flag name", "P=0x1, =5 : ALL;", `t.conf:1: empty flag name before "=5"`},
	{"missing colon", "P=0x1 ALL=full;", `t.conf:1: missing ':' after partition definition "P=0x1 ALL=full"`},
	{"colon on the next line", "# c\n\nP=0x1, ipoib\n  : ALL;", `t.conf:3: missing ':' after partition definition "P=0x1, ipoib"`},
	{"missing semicolon", "A=0x1 :\n  ALL=full\nB=0x2 : SELF=full;\n", `t.conf:3: unexpected ':' in port list; missing ';' after the definition at line 1`},
	{"missing semicolon before flags", "A=0x1 : ALL\nB=0x2, ipoib : SELF;", `t.conf:2: unexpected ':' in port list; missing ';' after the definition at line 1`},
	{"partition-config.txt's broken ShareIO line", "ShareIO = 0x80 : defmember=limited : 0x123456, 0x123457, 0x123458=full;",
		`t.conf:1: unexpected ':' in port list; missing ';' after the definition at line 1`},
	{"unterminated at end of file", "A=0x1 : SELF;\nB=0x2 :\n  ALL,\n  SELF\n# end\n", `t.conf:2: partition definition not terminated by ';' before end of file`},
	{"unterminated one-liner", "A=0x1 : SELF", `t.conf:1: partition definition not terminated by ';' before end of file`},
	{"stray semicolon", "P=0x1 : ALL ; ;", `t.conf:1: unexpected ';' outside a partition definition`},
	{"name with two keys", "A=0x1 : ALL;\nA=0x2 : SELF;", `t.conf:2: partition "A" already has P_Key 0x0001 (line 1)`},
	{"auto name then explicit key", "A : ALL;\n\nA=0x2 : SELF;", `t.conf:3: partition "A" already has an auto-assigned P_Key (line 1)`},
	{"explicit key taken by auto", "A : ALL;\nB=0x1 : SELF;", `t.conf:2: P_Key 0x0001 is already auto-assigned to partition "A" (line 1)`},
	{"explicit key taken by unnamed auto", ": ALL;\nB=0x8001 : SELF;", `t.conf:2: P_Key 0x0001 is already auto-assigned to the unnamed partition at line 1`},
	{"Default with another key", "Default=0x10 : ALL;", `t.conf:1: partition name "Default" is reserved for the default partition 0x7fff`},
	{"key 0x0000", "P=0x0000 : ALL;", `t.conf:1: invalid P_Key 0x0000 (low 15 bits are zero)`},
	{"key 0x8000", "P=0x8000 : ALL;", `t.conf:1: invalid P_Key 0x8000 (low 15 bits are zero)`},
	{"unnamed key 0", "0 : ALL;", `t.conf:1: invalid P_Key 0 (low 15 bits are zero)`},
	{"key above 16 bits", "P=0x18001 : ALL;", `t.conf:1: P_Key 0x18001 out of range (16 bits)`},
	{"key not a number", "P=zz : ALL;", `t.conf:1: invalid P_Key "zz"`},
	{"key missing", "P= : ALL;", `t.conf:1: missing P_Key value after '='`},
	{"name starting with a digit", "12ab : ALL;", `t.conf:1: invalid P_Key "12ab"`},
	{"invalid membership", "P=0x1 : ALL=fool;", `t.conf:1: invalid membership "fool" (want full, limited or both)`},
	{"empty membership", "P=0x1 : ALL=;", `t.conf:1: invalid membership "" (want full, limited or both)`},
	{"invalid GUID on third line", "P=0x1 :\n  0x2=full,\n  0xzz=full ;", `t.conf:3: invalid port GUID "0xzz"`},
	{"GUID 0", "P=0x1 : 0 ;", `t.conf:1: invalid port GUID "0"`},
	{"GUID above 64 bits", "P=0x1 : 0x10000000000000000 ;", `t.conf:1: invalid port GUID "0x10000000000000000"`},
	{"lower-case keyword", "P=0x1 : all ;", `t.conf:1: unknown port keyword "all" (want a port GUID, ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS or SELF)`},
	{"membership without port", "P=0x1 : =full ;", `t.conf:1: missing port before "=full"`},
	{"mgid without value", "P=0x1 : mgid ;", `t.conf:1: mgid needs a value`},
	{"mgid not a GID", "P=0x1 : mgid=zz ;", `t.conf:1: invalid MGID "zz"`},
	{"mgid not multicast", "P=0x1 : mgid=fe80::1 ;", `t.conf:1: MGID fe80::1 is not multicast`},
	{"IP mgid with another P_Key", "P=0x1 : mgid=ff12:401b:2::1 ;", `t.conf:1: IP multicast group P_Key 0x0002 does not match partition P_Key 0x0001`},
	{"IP mgid with another rate", "P=0x1 : mgid=ff12:401b::1, rate=6 ;", `t.conf:1: IP multicast group rate 6 differs from the partition's rate 3`},
	{"IP mgid with another mtu", "P=0x1, mtu=5 :\n mgid=ff12:601b::1, mtu=4 ;", `t.conf:2: IP multicast group mtu 4 differs from the partition's mtu 5`},
	{"conflicting ipoib flags", "P=0x1, ipoib : ALL;\nP=0x1 : SELF;\nP=0x1, ipoib, mtu=5 : SELF;", `t.conf:3: ipoib group flags differ from those of the ipoib definition at line 1`},
	{"control character", "P=0x1 : ALL\x00 ;", `t.conf:1: invalid control character 0x00`},
	{"name too long", strings.Repeat("n", 65) + "=0x1 : ALL;", `t.conf:1: partition name longer than 64 bytes`},
	{"line too long", "P=0x1 :\n" + strings.Repeat(" ", MaxLineBytes-3) + "ALL;", `t.conf:2: line longer than 4094 bytes`},
	{"too many lines", strings.Repeat("\n", MaxLines) + "P=0x1 : ALL;", `t.conf:65537: more than 65536 lines`},
	{"file too large", "P=0x1 :\n" + strings.Repeat("ALL,", MaxFileBytes/4) + ";", `t.conf:2: file larger than 1048576 bytes`},
	{"too many partitions", manyPartitions(MaxPartitions + 1), `t.conf:513: more than 512 partitions`},
	{"too many members", "P=0x1 :\n" + strings.Repeat("0x1,\n", MaxMembers+1) + ";", `t.conf:16386: more than 16384 members`},
	{"too many mgid lines", "P=0x1 :\n" + strings.Repeat("mgid=ff12::1\n", MaxMGIDs+1) + ";", `t.conf:514: more than 512 mgid lines`},
}

func manyPartitions(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "P%d=0x%x : ;\n", i, i)
	}
	return b.String()
}

func TestParseErrors(t *testing.T) {
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("t.conf", strings.NewReader(tc.in))
			if err == nil {
				t.Fatalf("Parse accepted the file:\n%s", c)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error\n got %s\nwant %s", got, tc.want)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not *Error", err)
			}
			if pe.File != "t.conf" || pe.Line < 1 || strings.ContainsAny(pe.Reason, "\r\n") {
				t.Errorf("bad *Error %#v", pe)
			}
		})
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestParseReadError(t *testing.T) {
	_, err := Parse("t.conf", failingReader{})
	if err == nil || err.Error() != "t.conf: disk on fire" {
		t.Fatalf("err = %v", err)
	}
	var pe *Error
	if errors.As(err, &pe) {
		t.Errorf("read error reported as a file error: %v", pe)
	}
}

// TestLimitsFitString builds a file that reaches every structural limit with the longest
// forms String() writes, and checks that the formatted result still parses.
func TestLimitsFitString(t *testing.T) {
	var b strings.Builder
	membersPer := MaxMembers / MaxPartitions
	memberships := []string{"full", "limited", "both"}
	allScopes := ""
	for s := 1; s <= 15; s++ {
		allScopes += fmt.Sprintf(",s=%d", s)
	}
	for i := 1; i <= MaxPartitions; i++ {
		name := fmt.Sprintf("%064d", i)
		fmt.Fprintf(&b, "%s=%d,in,i,r=24,m=5,sl=15%s,Q=0xfffffffe,T=255,F=0xfffff,d=b:", name, i, allScopes)
		for j := 0; j < membersPer; j++ {
			fmt.Fprintf(&b, "0xffffffffffff%04x=%s,", j, memberships[j%3][:1])
		}
		// A second definition whose IP group does not fit the first one's flags.
		fmt.Fprintf(&b, ";%s=%d,r=2,m=1:mgid=ffff:401b::ffff:ffff:ffff:ffff:ffff,sl=15%s,Q=0xfffffffe,T=255,F=0xfffff;\n", name, i, allScopes)
	}
	in := b.String()
	if len(in) > MaxFileBytes {
		t.Fatalf("test input is %d bytes", len(in))
	}
	c, err := Parse("t.conf", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Partitions) != MaxPartitions {
		t.Fatalf("%d partitions", len(c.Partitions))
	}
	out := c.String()
	if len(out) > MaxFileBytes || strings.Count(out, "\n") > MaxLines {
		t.Fatalf("String() is %d bytes, %d lines", len(out), strings.Count(out, "\n"))
	}
	if !strings.Contains(out, ", rate=2, mtu=1 :\n\tmgid=") {
		t.Fatal("IP group was not written in its own definition")
	}
	roundTrip(t, c)
}

func TestErrorString(t *testing.T) {
	e := &Error{File: "/etc/opensm/partitions.conf", Line: 7, Reason: "mtu 6 out of range 1..5"}
	if got, want := e.Error(), "/etc/opensm/partitions.conf:7: mtu 6 out of range 1..5"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestStringers(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{MemberLimited.String(), "limited"}, {MemberFull.String(), "full"}, {MemberBoth.String(), "both"},
		{Membership(9).String(), "Membership(9)"},
		{SelGUID.String(), "GUID"}, {SelALL.String(), "ALL"}, {SelALLCAs.String(), "ALL_CAS"},
		{SelALLSwitches.String(), "ALL_SWITCHES"}, {SelALLRouters.String(), "ALL_ROUTERS"}, {SelSELF.String(), "SELF"},
		{Selector(9).String(), "Selector(9)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if got, want := BroadcastMGID(0x7fff, 2).String(), "ff12:401b:ffff::ffff:ffff"; got != want {
		t.Errorf("BroadcastMGID = %s, want %s", got, want)
	}
	if got, want := BroadcastMGID(0x8001, 5).String(), "ff15:401b:8001::ffff:ffff"; got != want {
		t.Errorf("BroadcastMGID = %s, want %s", got, want)
	}
}
