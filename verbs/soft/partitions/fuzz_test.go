package partitions

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"ipoibfs/verbs"
)

func FuzzParse(f *testing.F) {
	for _, tc := range validCases {
		f.Add(tc.in)
	}
	for _, tc := range errorCases {
		if len(tc.in) < 512 {
			f.Add(tc.in)
		}
	}
	f.Add("P=0x2, rate=6 : mgid=ff12:401b::1, scope=5 ;\nP=0x2, ipoib, scope=8 : 0x3=both ;")
	f.Add("A, ipoib, s=3 : mgid=ff12:a01b::1 ;\nA, s=4 : mgid=ff12:a01b::2 ; A, i, s=3 : SELF ;")
	f.Add("X=0x7fff, ipoib, indx0, m=1, r=2 : N, S=b,\n mgid=ff12:401b::ffff:ffff, Q=0\n , ALL_R=l ;")

	ports := []Port{
		{GUID: 1}, {GUID: 0x10, IsSM: true}, {GUID: 0x3, IsSwitch: true}, {GUID: 0x123456, IsRouter: true},
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Parse("fuzz.conf", strings.NewReader(in))
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error is %T, not *Error: %v", err, err)
			}
			if pe.File != "fuzz.conf" || pe.Line < 1 || pe.Line > strings.Count(in, "\n")+1 ||
				pe.Reason == "" || strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("bad error %q (%#v)", err, pe)
			}
			return
		}
		checkInvariants(t, c)
		roundTrip(t, c)
		for _, p := range ports {
			keys := c.PKeys(p)
			if len(keys) == 0 {
				t.Fatalf("PKeys(%+v) is empty", p)
			}
			if !slices.ContainsFunc(keys, func(k verbs.PKey) bool { return k.Base() == 0x7fff }) {
				t.Fatalf("PKeys(%+v) = %v lacks the default partition", p, keys)
			}
			if p.IsSM && !slices.Contains(keys, 0xffff) {
				t.Fatalf("SM port PKeys = %v lacks 0xffff", keys)
			}
		}
	})
}

// checkInvariants checks properties every parsed configuration has.
func checkInvariants(t *testing.T, c *Config) {
	t.Helper()
	keys := c.Keys()
	seen := map[verbs.PKey]bool{}
	for i, p := range c.Partitions {
		k := keys[i]
		if k == 0 || k > 0x7fff || seen[k] {
			t.Fatalf("partition %d has key %v (keys %v)", i, k, keys)
		}
		seen[k] = true
		if p.PKey != 0 && p.PKey != k {
			t.Fatalf("partition %d: PKey %v but key %v", i, p.PKey, k)
		}
		if (k == 0x7fff) != (p.Name == DefaultName) {
			t.Fatalf("partition %d: name %q with key %v", i, p.Name, k)
		}
		checkFlags(t, p.IPoIBFlags)
		for _, g := range p.MGIDs {
			checkFlags(t, g.Flags)
			if !g.MGID.IsMulticast() {
				t.Fatalf("MGID %v not multicast", g.MGID)
			}
			if isIPMGID(g.MGID) {
				if got := verbs.PKey(g.MGID[4])<<8 | verbs.PKey(g.MGID[5]); got != k|0x8000 {
					t.Fatalf("IP MGID %v does not carry key %v", g.MGID, k|0x8000)
				}
				if g.Flags.QKey == 0 {
					t.Fatalf("IP MGID %v with Q_Key 0", g.MGID)
				}
			}
		}
		if p.IPoIBFlags.QKey == 0 {
			t.Fatalf("partition %d: IPoIB Q_Key 0", i)
		}
	}
}

func checkFlags(t *testing.T, g GroupFlags) {
	t.Helper()
	if g.MTU.Bytes() == 0 || !g.Rate.Valid() || g.SL > 15 || g.FlowLabel > 0xfffff ||
		len(g.Scopes) == 0 || !slices.IsSorted(g.Scopes) || len(slices.Compact(slices.Clone(g.Scopes))) != len(g.Scopes) ||
		g.Scopes[0] < 1 || g.Scopes[len(g.Scopes)-1] > 15 {
		t.Fatalf("bad group flags %+v", g)
	}
}
