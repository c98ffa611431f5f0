package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// The soft HCA's flags are refused with -hca, in every build (before the device is
// looked for), as a usage error naming them; -hca with the other flags gets as far as
// the device.
func TestHCASoftOnlyFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-hca", "mlx5_0", "-sm", "127.0.0.1:4791"}, "-hca mlx5_0: -sm configures only the soft HCA and its fabric"},
		{[]string{"-hca", "mlx5_0", "-fabric", "127.0.0.1:4791"}, "-hca mlx5_0: -fabric configures only the soft HCA"},
		{[]string{"-hca", "mlx5_0", "-listen", "127.0.0.2:4791"}, "-hca mlx5_0: -listen configures"},
		{[]string{"-hca", "mlx5_0", "-partitions", "/etc/p.conf"}, "-hca mlx5_0: -partitions configures"},
		{[]string{"-hca", "mlx5_0", "-fabric-key", "/etc/k"}, "-hca mlx5_0: -fabric-key configures"},
		{[]string{"-hca", "mlx5_0", "-ports", "2"}, "-hca mlx5_0: -ports configures"},
		{[]string{"-hca", "mlx5_0", "-name", "a"}, "-hca mlx5_0: -name configures"},
		{[]string{"-fabric-key", "/etc/k", "-hca", "mlx5_0", "-sm", "127.0.0.1:1"}, "-hca mlx5_0: -fabric-key, -sm configure only the soft HCA"},
		{[]string{"-hca", "list", "-sm", "127.0.0.1:1"}, "-hca list: -sm configures"},
		// Explicit defaults count as given: they would still be ignored.
		{[]string{"-hca", "mlx5_0", "-listen", "127.0.0.1:0"}, "-listen configures"},
	} {
		var out, errb bytes.Buffer
		code := cli(append(tc.args, "-mount", "", "-9p", ""), strings.NewReader(""), &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), tc.want) || !strings.Contains(errb.String(), "OpenSM") {
			t.Errorf("ipoibfs %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, errb.String(), exitUsage, tc.want)
		}
	}
}

// -ifname ibN=NAME, repeatable or comma-separated; the flag package refuses a bad
// value naming the flag.
func TestIfnameFlag(t *testing.T) {
	var f ifnameFlags
	for _, v := range []string{"ib0=uib0", "ib2=uib2, ib1=uib1", "ib0=uib0"} {
		if err := f.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	names, err := f.names(4)
	if err != nil || !slices.Equal(names, []string{"uib0", "uib1", "uib2", "ib3"}) {
		t.Fatalf("names(4) = %v, %v", names, err)
	}
	if f.String() != "ib0=uib0,ib2=uib2,ib1=uib1,ib0=uib0" {
		t.Errorf("String() = %q", f.String())
	}
	for _, tc := range []struct{ set, want string }{
		{"ib0", `"ib0": want ibN=NAME`},
		{"uib0", `want ibN=NAME`},
		{"eth0=x", `"eth0" is not a port's interface`},
		{"ib=x", `"ib" is not a port's interface`},
		{"ib00=x", `"ib00" is not a port's interface`},
		{"ib-1=x", `"ib-1" is not a port's interface`},
		{"ib254=x", `"ib254" is not a port's interface`},
		{"ib0=", `"" is not a valid interface name`},
		{"ib0=a/b", `"a/b" is not a valid interface name`},
		{"ib0=a:b", `is not a valid interface name`},
		{"ib0=a b", `is not a valid interface name`},
		{"ib0=sixteen-bytes-xx", `is not a valid interface name`},
		{"ib0=..", `is not a valid interface name`},
		{"ib0=x,ib0=y", `ib0 is already named x`},
		{"ib0=x,ib1=x", `ib0 is already named x`},
	} {
		var f ifnameFlags
		if err := f.Set(tc.set); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-ifname %s: %v, want an error saying %s", tc.set, err, tc.want)
		}
	}
}

// -ifname on the command line: bad values are usage errors naming the flag, checked
// against the HCA's ports before anything starts.
func TestIfnameCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-ifname", "ib0"}, `invalid value "ib0" for flag -ifname: "ib0": want ibN=NAME`},
		{[]string{"-ifname", "ib0=a/b"}, `invalid value "ib0=a/b" for flag -ifname`},
		{[]string{"-ifname", "ib0=x", "-ifname", "ib0=y"}, `invalid value "ib0=y" for flag -ifname: "ib0=y": ib0 is already named x`},
		{[]string{"-ifname", "ib1=uib1"}, "-ifname ib1=uib1: the HCA has 1 port(s), ib0..ib0"},
		{[]string{"-ports", "2", "-ifname", "ib3=x"}, "-ifname ib3=x: the HCA has 2 port(s), ib0..ib1"},
		{[]string{"-ports", "2", "-ifname", "ib0=ib1"}, "-ifname: ib0 and ib1 would both be ib1"},
	} {
		var out, errb bytes.Buffer
		code := cli(append(tc.args, "-mount", "", "-9p", "", "-name", "ifnametest"), strings.NewReader(""), &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("ipoibfs %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, errb.String(), exitUsage, tc.want)
		}
	}
}
