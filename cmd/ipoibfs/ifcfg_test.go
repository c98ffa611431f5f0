package main

import (
	"net/netip"
	"strings"
	"testing"

	"ipoibfs/ipoib"
)

func TestParseIfcfg(t *testing.T) {
	c, err := parseIfcfg("/etc/x/ifcfg-ib0.8003", []byte(`# a partition interface
DEVICE=ib0.8003
TYPE=InfiniBand
ONBOOT=yes
BOOTPROTO=static
IPADDR='10.93.0.1'
NETMASK="255.255.255.0"
BROADCAST=10.93.0.255
MTU=2044
CONNECTED_MODE=no
PKEY=yes
PKEY_ID=3
PHYSDEV=ib0
HWADDR=whatever
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.device != "ib0.8003" || c.addr != netip.MustParsePrefix("10.93.0.1/24") || c.broadcast != netip.MustParseAddr("10.93.0.255") ||
		c.mtu != 2044 || c.mode == nil || *c.mode != ipoib.Datagram || c.pkey != 0x8003 || c.physdev != "ib0" {
		t.Errorf("parsed %+v", c)
	}
	if len(c.unknown) != 1 || c.unknown[0] != "ifcfg-ib0.8003:14: HWADDR" {
		t.Errorf("unknown keys %v", c.unknown)
	}
	if c, err := parseIfcfg("ifcfg-ib0", []byte("IPADDR=172.16.1.1\n")); err != nil || c.addr.Bits() != 16 {
		t.Errorf("classful default: %+v %v", c, err)
	}
	// DHCP: the server gives the address, as initscripts ignore IPADDR with dhcp.
	c, err = parseIfcfg("ifcfg-ib0", []byte("BOOTPROTO=dhcp\nIPADDR=10.0.0.1\nDHCP_CLIENT_ID=20:00:55:04:01\n"))
	if err != nil || !c.dhcp || c.addr.IsValid() || string(c.clientID) != "\x20\x00\x55\x04\x01" {
		t.Errorf("BOOTPROTO=dhcp: %+v %v", c, err)
	}
	for _, tc := range []struct{ text, want string }{
		{"DEVICE=ib0\nIPADDR=10.0.0.300\n", "ifcfg-ib0:2: IPADDR: "},
		{"NETMASK=255.0.255.0\nIPADDR=10.0.0.1\n", "ifcfg-ib0:1: NETMASK: "},
		{"MTU=9\n", "ifcfg-ib0:1: MTU: "},
		{"BOOTPROTO=bootp\n", "ifcfg-ib0:1: BOOTPROTO: bootp is not supported"},
		{"BOOTPROTO=dhcp\nDHCP_CLIENT_ID=ff:zz\n", "ifcfg-ib0:2: DHCP_CLIENT_ID: "},
		{"BOOTPROTO=dhcp\nDHCP_CLIENT_ID=ff\n", "ifcfg-ib0:2: DHCP_CLIENT_ID: "},
		{"MASTER=bond0\n", "ifcfg-ib0:1: MASTER: MASTER=bond0 needs SLAVE=yes"},
		{"DEVICE=ib1\n", "ifcfg-ib0:1: DEVICE: "},
		{"garbage line\n", "ifcfg-ib0:1: "},
		{"IPADDR=10.0.0.1 $(reboot)\n", "ifcfg-ib0:1: IPADDR: unbalanced quotes or shell syntax"},
		{"PKEY=yes\nPKEY_ID=3\nPHYSDEV=ib0\n", "ifcfg-ib0:1: PKEY: a partition interface needs TYPE=InfiniBand"},
		{"TYPE=InfiniBand\nPKEY=yes\nPKEY_ID=5\nPHYSDEV=ib0\n", "ifcfg-ib0:3: PKEY_ID: the child of ib0 with P_Key 0x8005 is ib0.8005, not ib0"},
	} {
		_, err := parseIfcfg("ifcfg-ib0", []byte(tc.text))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s...", tc.text, err, tc.want)
		}
	}
}

func FuzzParseIfcfg(f *testing.F) {
	for _, s := range []string{"DEVICE=ib0\nIPADDR=10.0.0.1\nPREFIX=24\n", "TYPE=InfiniBand\nPKEY=yes\nPKEY_ID=0x8003\nPHYSDEV=ib0\n", "MTU=65520\nCONNECTED_MODE=yes\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseIfcfg("ifcfg-ib0.8003", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "ifcfg-ib0.8003:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		if c.addr.IsValid() && !c.addr.Addr().Is4() || c.mtu != 0 && (c.mtu < 68 || c.mtu > 65520) || c.pkey != 0 && c.pkey&0x8000 == 0 {
			t.Fatalf("accepted %q as %+v", b, c)
		}
	})
}

func TestParseInstallerFile(t *testing.T) {
	lan := func(name string) (netip.Addr, error) {
		if name != "eth0" {
			t.Errorf("LAN interface %q, want eth0", name)
		}
		return netip.MustParseAddr("192.168.3.7"), nil
	}
	cfgs, err := parseInstallerFile("/etc/infiniband/openib.conf", []byte(`# installer
IPADDR_ib0=10.4.'*'.'*'
NETMASK_ib0=255.255.0.0
NETWORK_ib0=10.4.0.0
BROADCAST_ib0=10.4.255.255
ONBOOT_ib0=1
LAN_INTERFACE_ib0=eth0
IPADDR_ib1="10.5.0.1"
`), lan)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfgs) != 2 || cfgs[0].device != "ib0" || cfgs[0].addr != netip.MustParsePrefix("10.4.3.7/16") ||
		cfgs[0].broadcast != netip.MustParseAddr("10.4.255.255") || cfgs[1].addr != netip.MustParsePrefix("10.5.0.1/8") {
		t.Errorf("parsed %+v", cfgs)
	}
	if _, err := parseInstallerFile("f", []byte("IPADDR_ib0=10.4.$(x)\n"), lan); err == nil || !strings.HasPrefix(err.Error(), "f:1: IPADDR_ib0: ") {
		t.Errorf("shell syntax: %v", err)
	}
}

func FuzzParseInstallerFile(f *testing.F) {
	f.Add([]byte("IPADDR_ib0=10.4.'*'.'*'\nNETMASK_ib0=255.255.0.0\nLAN_INTERFACE_ib0=\n"))
	f.Add([]byte("IPADDR_ib1=\"10.5.0.1\"\nONBOOT_ib1=1\n"))
	lan := func(string) (netip.Addr, error) { return netip.MustParseAddr("192.168.3.7"), nil }
	f.Fuzz(func(t *testing.T, b []byte) {
		cfgs, err := parseInstallerFile("f", b, lan)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f:") {
				t.Fatalf("error without file:line: %v", err)
			}
			return
		}
		for _, c := range cfgs {
			if c.addr.IsValid() && !c.addr.Addr().Is4() || strings.Contains(c.addr.String(), "*") {
				t.Fatalf("accepted %q as %+v", b, c)
			}
		}
	})
}
