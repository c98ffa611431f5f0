package ipoib

// DHCPClientID is the DHCP client identifier the vendor guide recommends for IPoIB,
// the boot firmware's form: ff:00:00:00:00:00:02:00:00:02:c9:00 and the port GUID.
func (i *Interface) DHCPClientID() []byte {
	g := i.HWAddr().GID()
	return append([]byte{0xff, 0, 0, 0, 0, 0, 0x02, 0, 0, 0x02, 0xc9, 0}, g[8:]...)
}

// SetDHCPLease sets the text of the interface's DHCP lease (class/net/<if>/dhcp/lease),
// as the daemon's DHCP client has it; "" means none.
func (i *Interface) SetDHCPLease(text string) { i.dhcpLease.Store(&text) }

// DHCPLease returns the lease text, "" without a lease.
func (i *Interface) DHCPLease() string {
	if p := i.dhcpLease.Load(); p != nil {
		return *p
	}
	return ""
}
