package kernel

import (
	"net"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string // substring of the error; "" = valid
	}{
		{Config{Name: "ib0"}, ""},
		{Config{Name: "ib0.8001", MTU: 2044, NetNS: "fabric"}, ""},
		{Config{Name: "abcdefghijklmno"}, ""},
		{Config{Name: ""}, "empty interface name"},
		{Config{Name: "abcdefghijklmnop"}, "16 bytes"},
		{Config{Name: "ib/0"}, "may not contain"},
		{Config{Name: "ib 0"}, "may not contain"},
		{Config{Name: "ib%d"}, "may not contain"},
		{Config{Name: ".."}, `may not be "."`},
		{Config{Name: "ib0", MTU: -1}, "MTU -1 out of range"},
		{Config{Name: "ib0", MTU: 70000}, "MTU 70000 out of range"},
		{Config{Name: "ib0", NetNS: "a/b"}, "invalid network namespace"},
		{Config{Name: "ib0", NetNS: ".."}, "invalid network namespace"},
	} {
		err := tc.cfg.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: unexpected error %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestOffloadsEffective(t *testing.T) {
	for _, tc := range []struct{ in, want Offloads }{
		{Offloads{}, Offloads{}},
		{Offloads{TxChecksum: true, TSO: true, GRO: true}, Offloads{TxChecksum: true, TSO: true, GRO: true}},
		{Offloads{TSO: true}, Offloads{}},
		{Offloads{TSO: true, GRO: true}, Offloads{GRO: true}},
		{Offloads{TxChecksum: true}, Offloads{TxChecksum: true}},
	} {
		if diff := cmp.Diff(tc.want, tc.in.effective()); diff != "" {
			t.Errorf("%+v.effective() (-want +got):\n%s", tc.in, diff)
		}
	}
	if got, want := (Offloads{TxChecksum: true}).String(), "tx-checksumming: on, tcp-segmentation-offload: off, generic-receive-offload: off"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestPrefixOf(t *testing.T) {
	mk := func(s string) *net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	v4in16 := &net.IPNet{IP: net.ParseIP("10.1.2.3"), Mask: net.CIDRMask(120, 128)}
	for _, tc := range []struct {
		in   *net.IPNet
		want string
	}{
		{mk("10.77.0.1/24"), "10.77.0.1/24"},
		{mk("fe80::1/64"), "fe80::1/64"},
		{mk("fd00::1/128"), "fd00::1/128"},
		{v4in16, "10.1.2.3/24"},
		{nil, "invalid Prefix"},
	} {
		p, ok := prefixOf(tc.in)
		if got := p.String(); got != tc.want || ok != (tc.want != "invalid Prefix") {
			t.Errorf("prefixOf(%v) = %v, %v; want %v", tc.in, got, ok, tc.want)
		}
	}
}
