package ipoib

import (
	"fmt"
	"syscall"
)

// Features are the switchable stateless offloads (ethtool -k/-K). Connected mode forces
// transmit checksum and large send off and leaves the receive side alone, as the
// driver's ipoib_fix_features does.
type Features struct {
	// RxChecksum: received packets may reach the kernel as checksum-verified, as the
	// driver's CHECKSUM_UNNECESSARY after the HCA's check: the fabric's ICRC covers
	// every packet end to end. The TUN device takes that only for super-packets (it
	// ignores virtio-net's DATA_VALID on input), so GRO is what this switch governs:
	// off, every packet's checksum is checked by the kernel.
	RxChecksum bool
	TxChecksum bool // the kernel hands over packets with partial checksums we complete
	TSO        bool // large send: 64 KB units from the kernel, segmented to the MTU in memory
	// GRO: receive coalescing back to the kernel. A coalesced packet's checksum is not
	// checked again, so GRO needs RxChecksum, as the kernel's netdev_fix_features drops
	// hardware GRO without NETIF_F_RXCSUM.
	GRO bool
}

var defaultFeatures = Features{RxChecksum: true, TxChecksum: true, TSO: true, GRO: true}

// Features returns the enabled features (after the mode's constraints).
func (i *Interface) Features() Features {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.effectiveFeaturesLocked()
}

func (i *Interface) effectiveFeaturesLocked() Features {
	f := i.features
	if i.data().mode == Connected {
		f.TxChecksum, f.TSO = false, false
	}
	if !f.TxChecksum {
		f.TSO = false // TSO needs checksum offload, as netdev_fix_features enforces
	}
	if !f.RxChecksum {
		f.GRO = false
	}
	return f
}

// RequestedFeatures returns what was asked for, before the mode's constraints ("off
// [requested on]" in ethtool's words).
func (i *Interface) RequestedFeatures() Features {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.features
}

// SetFeatures changes the requested features and pushes the effective ones to the host.
func (i *Interface) SetFeatures(f Features) {
	i.mu.Lock()
	i.features = f
	i.mu.Unlock()
	i.pushOffloads()
}

// SpeedMbps is the port's rate, lane speed times width, as the driver's
// ipoib_get_link_ksettings reports it (40000 for 4X QDR); 0 when unknown.
func (i *Interface) SpeedMbps() int {
	p, err := i.e.dev.Port(i.port)
	if err != nil {
		return 0
	}
	a := p.Attr()
	return a.LaneMbps * a.Width
}

// Coalesce is receive interrupt moderation: the receive CQ signals after RxFrames
// completions or RxUsecs microseconds. Only these two parameters exist, as in the
// kernel driver.
type Coalesce struct {
	RxUsecs  int
	RxFrames int
}

// Coalesce returns the moderation settings.
func (i *Interface) Coalesce() Coalesce {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.coalesce
}

// SetCoalesce applies moderation to the receive CQ; each value must be in 0..0xffff.
func (i *Interface) SetCoalesce(c Coalesce) error {
	if c.RxUsecs < 0 || c.RxUsecs > 0xffff || c.RxFrames < 0 || c.RxFrames > 0xffff {
		return &Error{Op: "set_coalesce", If: i.Name(), Err: syscall.EINVAL,
			Detail: fmt.Sprintf("rx-usecs %d / rx-frames %d: each must be 0..65535", c.RxUsecs, c.RxFrames)}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if err := i.rcq.SetModeration(uint16(c.RxFrames), uint16(c.RxUsecs)); err != nil {
		return &Error{Op: "set_coalesce", If: i.Name(), Err: syscall.EIO, Detail: err.Error()}
	}
	i.coalesce = c
	return nil
}
