package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// The bonding files as the vendor guide writes them: ifcfg-bond0 with BONDING_OPTS
// (each option checked as a write of its bonding/ file), the slaves' MASTER and
// SLAVE=yes.
func TestParseIfcfgBonding(t *testing.T) {
	c, err := parseIfcfg("/etc/x/ifcfg-bond0", []byte(`DEVICE=bond0
TYPE=Bond
BONDING_MASTER=yes
BONDING_OPTS="mode=active-backup miimon=100 primary=ib0 primary_reselect=failure updelay=0"
IPADDR=10.87.0.1
PREFIX=24
MTU=65520
ONBOOT=yes
BOOTPROTO=static
`))
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"mode", "active-backup"}, {"miimon", "100"}, {"primary", "ib0"}, {"primary_reselect", "failure"}}
	if c.bond == nil || !slices.Equal(c.bond.opts, want) || c.addr != netip.MustParsePrefix("10.87.0.1/24") || c.mtu != 65520 || c.master != "" {
		t.Fatalf("parsed %+v (bond %+v)", c, c.bond)
	}
	if len(c.unknown) != 1 || c.unknown[0] != "ifcfg-bond0:4: BONDING_OPTS updelay" {
		t.Errorf("ignored %v", c.unknown)
	}
	// A numbered mode and no TYPE: BONDING_OPTS alone makes a bond file.
	if c, err := parseIfcfg("ifcfg-bond1", []byte("BONDING_OPTS='mode=1'\n")); err != nil || c.bond == nil {
		t.Errorf("BONDING_OPTS=mode=1: %+v %v", c, err)
	}
	s, err := parseIfcfg("ifcfg-ib0.8003", []byte("TYPE=InfiniBand\nPKEY=yes\nPKEY_ID=3\nPHYSDEV=ib0\nMASTER=bond0\nSLAVE=yes\nCONNECTED_MODE=yes\n"))
	if err != nil || s.master != "bond0" || s.pkey != 0x8003 || s.mode == nil || s.bond != nil {
		t.Fatalf("slave child: %+v %v", s, err)
	}
	for _, tc := range []struct{ file, text, want string }{
		{"ifcfg-bond0", "BONDING_OPTS=\"mode=balance-rr\"\n", "ifcfg-bond0:1: BONDING_OPTS: mode: balance-rr: only active-backup is supported for infiniband slaves"},
		{"ifcfg-bond0", "BONDING_OPTS=\"mode=4\"\n", "ifcfg-bond0:1: BONDING_OPTS: mode: 802.3ad: only active-backup"},
		{"ifcfg-bond0", "BONDING_OPTS=\"miimon=-1\"\n", "ifcfg-bond0:1: BONDING_OPTS: miimon: invalid value (-1)"},
		{"ifcfg-bond0", "BONDING_OPTS=\"primary_reselect=sometimes\"\n", "ifcfg-bond0:1: BONDING_OPTS: primary_reselect: invalid value (sometimes)"},
		{"ifcfg-bond0", "BONDING_OPTS=\"fail_over_mac=sometimes\"\n", "ifcfg-bond0:1: BONDING_OPTS: fail_over_mac: invalid value"},
		{"ifcfg-bond0", "BONDING_OPTS=\"xmit_hash_policy=layer2\"\n", "ifcfg-bond0:1: BONDING_OPTS: xmit_hash_policy: no bonding option"},
		{"ifcfg-bond0", "BONDING_OPTS=\"mode\"\n", "ifcfg-bond0:1: BONDING_OPTS: \"mode\" is not name=value"},
		{"ifcfg-bond0", "TYPE=Bond\nBOOTPROTO=dhcp\n", "ifcfg-bond0:2: BOOTPROTO: dhcp on a bond is not supported"},
		{"ifcfg-bond0", "TYPE=Bond\nCONNECTED_MODE=yes\n", "ifcfg-bond0:2: CONNECTED_MODE: "},
		{"ifcfg-bond0", "TYPE=Bond\nMASTER=bond1\nSLAVE=yes\n", "ifcfg-bond0:2: MASTER: a bond cannot be a slave"},
		{"ifcfg-bond0", "TYPE=Ethernet\n", "ifcfg-bond0:1: TYPE: "},
		{"ifcfg-ib0", "MASTER=bond0\n", "ifcfg-ib0:1: MASTER: MASTER=bond0 needs SLAVE=yes"},
		{"ifcfg-ib0", "SLAVE=yes\n", "ifcfg-ib0:1: SLAVE: SLAVE=yes needs MASTER"},
		{"ifcfg-ib0", "SLAVE=maybe\nMASTER=bond0\n", "ifcfg-ib0:1: SLAVE: "},
		{"ifcfg-ib0", "MASTER=bond0\nSLAVE=yes\nIPADDR=10.0.0.1\n", "ifcfg-ib0:1: MASTER: a slave has no address of its own"},
	} {
		_, err := parseIfcfg(tc.file, []byte(tc.text))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s %q: %v, want %s...", tc.file, tc.text, err, tc.want)
		}
	}
}

// FuzzParseIfcfgBonding: whatever a bonding file parses to has only the options bonds
// have here, with the only mode, and a slave names its bond.
func FuzzParseIfcfgBonding(f *testing.F) {
	for _, s := range []string{"BONDING_OPTS=\"mode=active-backup miimon=100 primary=ib0\"\nIPADDR=10.0.0.1\n",
		"TYPE=Bond\nBONDING_MASTER=yes\n", "MASTER=bond0\nSLAVE=yes\n", "BONDING_OPTS='mode=1 fail_over_mac=none updelay=0'\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseIfcfg("ifcfg-bond0", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "ifcfg-bond0:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		if c.bond != nil {
			if c.master != "" || c.dhcp || c.mode != nil || c.pkey != 0 {
				t.Fatalf("bond %q parsed as %+v", b, c)
			}
			for _, o := range c.bond.opts {
				if !slices.Contains([]string{"mode", "miimon", "fail_over_mac", "primary", "active_slave"}, o[0]) {
					t.Fatalf("option %q accepted", o[0])
				}
			}
		}
		if c.master != "" && (c.addr.IsValid() || c.dhcp) {
			t.Fatalf("slave %q with an address: %+v", b, c)
		}
	})
}
