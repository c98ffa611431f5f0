//go:build linux

package kernel

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// DevFeatures are the device's offload features as `ethtool -k` shows them.
type DevFeatures struct {
	RxChecksum, TxChecksum, TSO, GRO bool
}

// ethtoolIfreq is struct ifreq with ifr_data set: the name, the pointer, padding to
// the 40 bytes of the kernel's union.
type ethtoolIfreq struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd, data uint32
}

// ethtoolCmd is the legacy struct ethtool_cmd (ETHTOOL_GSET/SSET), which the kernel
// converts to link_ksettings for drivers that only have those (the TUN driver does).
type ethtoolCmd struct {
	cmd           uint32
	supported     uint32
	advertising   uint32
	speed         uint16
	duplex        uint8
	port          uint8
	phyAddress    uint8
	transceiver   uint8
	autoneg       uint8
	mdioSupport   uint8
	maxtxpkt      uint32
	maxrxpkt      uint32
	speedHi       uint16
	ethTpMdix     uint8
	ethTpMdixCtrl uint8
	lpAdvertising uint32
	reserved      [2]uint32
}

// ethtool runs SIOCETHTOOL requests for the device, from a socket in its namespace.
// name is the device's current kernel name ("": look it up; it may have been renamed).
func (d *Device) ethtool(name string, fn func(ioctl func(data unsafe.Pointer) error) error) error {
	if name == "" {
		l, err := d.h.LinkByIndex(d.index)
		if err != nil {
			return err
		}
		name = l.Attrs().Name
	}
	return d.inNS(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return fn(func(data unsafe.Pointer) error {
			var ifr ethtoolIfreq
			copy(ifr.name[:unix.IFNAMSIZ-1], name)
			ifr.data = data
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
				return e
			}
			return nil
		})
	})
}

// DeviceFeatures reads the device's offload features (ethtool -k): what `ethtool -K`
// last set on it, which may differ from what this package asked for.
func (d *Device) DeviceFeatures() (DevFeatures, error) {
	var f DevFeatures
	err := d.control(func() (err error) {
		f, err = d.deviceFeatures("")
		return err
	})
	return f, err
}

func (d *Device) deviceFeatures(name string) (DevFeatures, error) {
	var f DevFeatures
	err := d.ethtool(name, func(ioctl func(unsafe.Pointer) error) error {
		for _, q := range []struct {
			cmd uint32
			to  *bool
		}{{unix.ETHTOOL_GRXCSUM, &f.RxChecksum}, {unix.ETHTOOL_GTXCSUM, &f.TxChecksum},
			{unix.ETHTOOL_GTSO, &f.TSO}, {unix.ETHTOOL_GGRO, &f.GRO}} {
			v := ethtoolValue{cmd: q.cmd}
			if err := ioctl(unsafe.Pointer(&v)); err != nil {
				return d.errorf("ethtool get features: %w", err)
			}
			*q.to = v.data != 0
		}
		return nil
	})
	return f, err
}

// SetSpeed sets the link speed `ethtool` and sysfs report (Mb/s, full duplex): the TUN
// driver keeps whatever it is given, so the device can show the port's rate. mbps <= 0
// sets speed and duplex unknown, as IPoIB reports them without carrier. The speed the
// device already has from the last call is not set again.
func (d *Device) SetSpeed(mbps int) error {
	mbps = max(mbps, -1)
	if mbps == 0 {
		mbps = -1
	}
	return d.control(func() error {
		d.setMu.Lock()
		defer d.setMu.Unlock()
		if d.speed == mbps {
			return nil
		}
		return d.ethtool("", func(ioctl func(unsafe.Pointer) error) error {
			c := ethtoolCmd{cmd: unix.ETHTOOL_GSET}
			if err := ioctl(unsafe.Pointer(&c)); err != nil {
				return d.errorf("ethtool get settings: %w", err)
			}
			c.cmd = unix.ETHTOOL_SSET
			c.speed, c.speedHi = uint16(mbps), uint16(mbps>>16)
			c.duplex = 1 // DUPLEX_FULL
			if mbps <= 0 {
				c.speed, c.speedHi, c.duplex = 0xffff, 0xffff, 0xff // SPEED_UNKNOWN, DUPLEX_UNKNOWN
			}
			c.maxtxpkt, c.maxrxpkt = 0, 0
			if err := ioctl(unsafe.Pointer(&c)); err != nil {
				return d.errorf("ethtool set speed %d: %w", mbps, err)
			}
			d.speed = mbps
			return nil
		})
	})
}

// setFeatures switches transmit checksumming, TCP segmentation and GRO on the device, as
// ethtool -K tx/tso does (tso after tx: the kernel refuses TSO without checksums).
func (d *Device) setFeatures(txCsum, tso, gro bool) error {
	b := func(v bool) uint32 {
		if v {
			return 1
		}
		return 0
	}
	return d.ethtool("", func(ioctl func(unsafe.Pointer) error) error {
		// GRO too, so that ethtool -k on the device says what Write does.
		for _, q := range []ethtoolValue{{unix.ETHTOOL_STXCSUM, b(txCsum)}, {unix.ETHTOOL_STSO, b(tso && txCsum)}, {unix.ETHTOOL_SGRO, b(gro)}} {
			if err := ioctl(unsafe.Pointer(&q)); err != nil {
				return err
			}
		}
		return nil
	})
}
