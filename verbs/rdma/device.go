//go:build rdma && linux

package rdma

/*
#cgo LDFLAGS: -libverbs
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static int ipoibfs_query_port(struct ibv_context *c, int port, struct ibv_port_attr *a) {
	memset(a, 0, sizeof *a);
	return ibv_query_port(c, (uint8_t)port, a);
}

static struct ibv_device *ipoibfs_dev_at(struct ibv_device **l, int i) { return l[i]; }

static uint64_t ipoibfs_guid(struct ibv_device *d) { return be64toh(ibv_get_device_guid(d)); }

// ipoibfs_wait (umad.go) blocks until fd (1) or wakefd (2) is readable, -1: no timeout.
int ipoibfs_wait(int fd, int wakefd, int timeout_ms);

// ipoibfs_async_event reads one asynchronous event: its type and port (0 when the
// event is not a port's), acknowledged. -errno when none could be read.
static int ipoibfs_async_event(struct ibv_context *c, int *type, int *port) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(c, &ev))
		return errno ? -errno : -EIO;
	*type = ev.event_type;
	*port = 0;
	switch (ev.event_type) {
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		*port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"ipoibfs/verbs"
)

// DeviceInfo is what libibverbs shows of one device, for `ipoibfs -hca list`.
type DeviceInfo struct {
	Name     string
	NodeGUID verbs.GUID
	FW       string
	Ports    []PortInfo
	Err      error // opening or querying it failed
}

// PortInfo is one port of a DeviceInfo.
type PortInfo struct {
	Num       int
	Attr      verbs.PortAttr
	GID0      verbs.GID
	PKeyCount int // valid entries in the P_Key table
}

// Devices lists the devices libibverbs sees, each opened briefly for its attributes.
func Devices() ([]DeviceInfo, error) {
	var n C.int
	l, err := C.ibv_get_device_list(&n)
	if l == nil {
		if errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.ENODEV) {
			return nil, nil // no RDMA support in the kernel: no devices
		}
		return nil, &verbs.Error{Op: "ibv_get_device_list", Obj: "rdma-core", Err: err}
	}
	defer C.ibv_free_device_list(l)
	var out []DeviceInfo
	for i := range int(n) {
		d := C.ipoibfs_dev_at(l, C.int(i))
		info := DeviceInfo{Name: C.GoString(C.ibv_get_device_name(d)), NodeGUID: verbs.GUID(C.ipoibfs_guid(d))}
		dev, err := Open(info.Name)
		if err != nil {
			info.Err = err
		} else {
			info.FW = dev.FWVersion()
			for p := 1; p <= dev.NumPorts(); p++ {
				port := dev.ports[p-1]
				pi := PortInfo{Num: p, Attr: port.Attr()}
				pi.GID0, _ = port.GID(0)
				for _, k := range port.PKeyTable() {
					if k.Valid() {
						pi.PKeyCount++
					}
				}
				info.Ports = append(info.Ports, pi)
			}
			dev.Close()
		}
		out = append(out, info)
	}
	return out, nil
}

// Device is an HCA opened through libibverbs (verbs.Device).
type Device struct {
	name  string
	guid  verbs.GUID
	ctx   *C.struct_ibv_context
	pd    *C.struct_ibv_pd
	attr  C.struct_ibv_device_attr
	ports []*Port

	qpMu sync.RWMutex
	qps  map[uint32]*QP // by QP number, for completions

	wake   [2]int
	evDone chan struct{}

	subMu   sync.Mutex
	subs    map[int]chan verbs.Event
	nextSub int
	Dropped atomic.Uint64 // events a subscriber did not take in time

	closeOnce sync.Once
}

var _ verbs.Device = (*Device)(nil)

// Open opens the named device ("" = the first one libibverbs lists).
func Open(name string) (*Device, error) {
	var n C.int
	l, err := C.ibv_get_device_list(&n)
	if l == nil {
		return nil, &verbs.Error{Op: "open_device", Obj: name, Err: fmt.Errorf("%w (ibv_get_device_list: %v)", syscall.ENODEV, err)}
	}
	defer C.ibv_free_device_list(l)
	var dev *C.struct_ibv_device
	var names []string
	for i := range int(n) {
		d := C.ipoibfs_dev_at(l, C.int(i))
		nm := C.GoString(C.ibv_get_device_name(d))
		names = append(names, nm)
		if dev == nil && (name == "" || nm == name) {
			dev = d
		}
	}
	if dev == nil {
		return nil, &verbs.Error{Op: "open_device", Obj: name, Err: fmt.Errorf("%w: libibverbs has %d devices %q", syscall.ENODEV, len(names), names)}
	}
	d := &Device{name: C.GoString(C.ibv_get_device_name(dev)), guid: verbs.GUID(C.ipoibfs_guid(dev)),
		qps: map[uint32]*QP{}, subs: map[int]chan verbs.Event{}, evDone: make(chan struct{})}
	d.ctx = C.ibv_open_device(dev)
	if d.ctx == nil {
		return nil, &verbs.Error{Op: "ibv_open_device", Obj: d.name, Err: syscall.EIO}
	}
	if r := C.ibv_query_device(d.ctx, &d.attr); r != 0 {
		C.ibv_close_device(d.ctx)
		return nil, &verbs.Error{Op: "ibv_query_device", Obj: d.name, Err: syscall.Errno(r)}
	}
	d.pd = C.ibv_alloc_pd(d.ctx)
	if d.pd == nil {
		C.ibv_close_device(d.ctx)
		return nil, &verbs.Error{Op: "ibv_alloc_pd", Obj: d.name, Err: syscall.ENOMEM}
	}
	for p := 1; p <= int(d.attr.phys_port_cnt); p++ {
		port := &Port{dev: d, num: p}
		port.refreshPKeys()
		d.ports = append(d.ports, port)
	}
	if err := syscall.Pipe2(d.wake[:], syscall.O_CLOEXEC); err != nil {
		C.ibv_dealloc_pd(d.pd)
		C.ibv_close_device(d.ctx)
		return nil, err
	}
	go d.events()
	return d, nil
}

func (d *Device) Name() string         { return d.name }
func (d *Device) NodeGUID() verbs.GUID { return d.guid }

// NodeDesc is the host's name, as the kernel's default node description begins.
func (d *Device) NodeDesc() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return d.name
	}
	b := make([]byte, 0, len(u.Nodename))
	for _, c := range u.Nodename {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b) + " " + d.name
}

func (d *Device) FWVersion() string { return C.GoString(&d.attr.fw_ver[0]) }
func (d *Device) NumPorts() int     { return len(d.ports) }

func (d *Device) Port(num int) (verbs.Port, error) {
	if num < 1 || num > len(d.ports) {
		return nil, &verbs.Error{Op: "port", Obj: fmt.Sprintf("%s port %d", d.name, num), Err: verbs.ErrNoPort}
	}
	return d.ports[num-1], nil
}

// SysImageGUID, HWRevision, HCAType and BoardID make the device a verbs.DeviceInfo.
func (d *Device) SysImageGUID() verbs.GUID {
	return verbs.GUID(be64(uint64(d.attr.sys_image_guid)))
}
func (d *Device) HWRevision() uint32 { return uint32(d.attr.hw_ver) }
func (d *Device) HCAType() string    { return fmt.Sprintf("%d", uint32(d.attr.vendor_part_id)) }
func (d *Device) BoardID() string    { return "" }

// be64 converts a big-endian value read as a little-endian integer.
func be64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b)) = v
	var r uint64
	for _, x := range b {
		r = r<<8 | uint64(x)
	}
	return r
}

var eventTypes = map[C.int]verbs.EventType{
	C.IBV_EVENT_PORT_ACTIVE: verbs.EventPortActive, C.IBV_EVENT_PORT_ERR: verbs.EventPortErr,
	C.IBV_EVENT_LID_CHANGE: verbs.EventLIDChange, C.IBV_EVENT_PKEY_CHANGE: verbs.EventPKeyChange,
	C.IBV_EVENT_SM_CHANGE: verbs.EventSMChange, C.IBV_EVENT_CLIENT_REREGISTER: verbs.EventClientReregister,
	C.IBV_EVENT_GID_CHANGE: verbs.EventGIDChange,
}

// events reads the device's asynchronous events until Close and hands the port events
// to the subscribers.
func (d *Device) events() {
	defer close(d.evDone)
	for {
		w := C.ipoibfs_wait(d.ctx.async_fd, C.int(d.wake[0]), -1)
		if w == 2 {
			return
		}
		if w < 0 {
			return
		}
		var typ, port C.int
		if C.ipoibfs_async_event(d.ctx, &typ, &port) < 0 {
			continue
		}
		et, ok := eventTypes[typ]
		if !ok || port < 1 || int(port) > len(d.ports) {
			continue
		}
		switch et {
		case verbs.EventPKeyChange, verbs.EventClientReregister, verbs.EventPortActive:
			d.ports[port-1].refreshPKeys()
		}
		d.subMu.Lock()
		for _, ch := range d.subs {
			select {
			case ch <- verbs.Event{Type: et, Port: int(port)}:
			default:
				d.Dropped.Add(1)
			}
		}
		d.subMu.Unlock()
	}
}

func (d *Device) Subscribe(buf int) (<-chan verbs.Event, func()) {
	ch := make(chan verbs.Event, max(buf, 1))
	d.subMu.Lock()
	id := d.nextSub
	d.nextSub++
	d.subs[id] = ch
	d.subMu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			d.subMu.Lock()
			delete(d.subs, id)
			d.subMu.Unlock()
		})
	}
}

// Close closes the ports' MAD agents, stops the event reader and closes the device.
// Queue pairs, completion queues and address handles must be closed first.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		for _, p := range d.ports {
			p.mu.Lock()
			if p.agent != nil {
				p.agent.Close()
			}
			p.mu.Unlock()
		}
		_, _ = syscall.Write(d.wake[1], []byte{1})
		<-d.evDone
		syscall.Close(d.wake[0])
		syscall.Close(d.wake[1])
		C.ibv_dealloc_pd(d.pd)
		C.ibv_close_device(d.ctx)
	})
	return nil
}

func (d *Device) qpByNum(n uint32) *QP {
	d.qpMu.RLock()
	defer d.qpMu.RUnlock()
	return d.qps[n]
}

// Port is one port of a Device.
type Port struct {
	dev   *Device
	num   int
	mu    sync.Mutex
	pkeys []verbs.PKey // cached; refreshed on P_Key change, client re-register, port active
	agent *Agent
	agErr error
}

func (p *Port) Num() int { return p.num }

func (p *Port) String() string { return fmt.Sprintf("%s port %d", p.dev.name, p.num) }

var widthLanes = map[C.uint8_t]int{1: 1, 2: 4, 4: 8, 8: 12, 16: 2}

var speedMbps = map[C.uint8_t]int{1: 2500, 2: 5000, 4: 10000, 8: 10312, 16: 14062, 32: 25781, 64: 53125, 128: 106250}

var linkLayers = map[C.uint8_t]string{C.IBV_LINK_LAYER_UNSPECIFIED: "InfiniBand", C.IBV_LINK_LAYER_INFINIBAND: "InfiniBand",
	C.IBV_LINK_LAYER_ETHERNET: "Ethernet"}

// Attr queries the port (ibv_query_port) and its GID 0.
func (p *Port) Attr() verbs.PortAttr {
	var a C.struct_ibv_port_attr
	if C.ipoibfs_query_port(p.dev.ctx, C.int(p.num), &a) != 0 {
		return verbs.PortAttr{State: verbs.PortDown}
	}
	out := verbs.PortAttr{
		State: verbs.PortState(a.state), PhysState: verbs.PhysState(a.phys_state),
		LID: verbs.LID(a.lid), SMLID: verbs.LID(a.sm_lid), SMSL: uint8(a.sm_sl), LMC: uint8(a.lmc),
		MaxMTU: verbs.MTU(a.max_mtu), ActiveMTU: verbs.MTU(a.active_mtu),
		Width: widthLanes[a.active_width], LaneMbps: speedMbps[a.active_speed],
		PKeyTabLen: int(a.pkey_tbl_len), LinkLayer: linkLayers[a.link_layer], CapMask: uint32(a.port_cap_flags),
		QKeyViolCnt: uint64(a.qkey_viol_cntr), PKeyViolCnt: uint64(a.bad_pkey_cntr),
	}
	out.Rate = rateOf(out.Width * out.LaneMbps)
	if g, err := p.GID(0); err == nil {
		out.GUID, out.GIDPrefix = g.GUID(), g.Prefix()
	}
	return out
}

// rateOf is the static rate code nearest to mbps.
func rateOf(mbps int) verbs.Rate {
	best, diff := verbs.Rate(0), math.MaxInt
	if mbps == 0 {
		return 0
	}
	for r := verbs.Rate(2); r <= 24; r++ {
		if d := abs(r.Mbps() - mbps); r.Valid() && d < diff {
			best, diff = r, d
		}
	}
	return best
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func (p *Port) GID(index int) (verbs.GID, error) {
	var g C.union_ibv_gid
	if r := C.ibv_query_gid(p.dev.ctx, C.uint8_t(p.num), C.int(index), &g); r != 0 {
		return verbs.GID{}, &verbs.Error{Op: "ibv_query_gid", Obj: fmt.Sprintf("%s index %d", p, index), Err: syscall.Errno(max(int(r), 1))}
	}
	return verbs.GID(*(*[16]byte)(unsafe.Pointer(&g))), nil
}

func (p *Port) refreshPKeys() {
	var a C.struct_ibv_port_attr
	if C.ipoibfs_query_port(p.dev.ctx, C.int(p.num), &a) != 0 {
		return
	}
	tab := make([]verbs.PKey, 0, int(a.pkey_tbl_len))
	for i := range int(a.pkey_tbl_len) {
		var k C.__be16
		if C.ibv_query_pkey(p.dev.ctx, C.uint8_t(p.num), C.int(i), &k) != 0 {
			break
		}
		v := uint16(k)
		tab = append(tab, verbs.PKey(v>>8|v<<8))
	}
	p.mu.Lock()
	p.pkeys = tab
	p.mu.Unlock()
}

func (p *Port) PKeyTable() []verbs.PKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]verbs.PKey(nil), p.pkeys...)
}

func (p *Port) FindPKey(key verbs.PKey) (int, bool) { return findPKey(p.PKeyTable(), key) }

// Counters reads the port's counters from sysfs (counters.go).
func (p *Port) Counters() verbs.PortCounters { return readCounters(p.dev.name, p.num) }

// MAD returns the port's QP1 agent, opened through libibumad on first use. Where
// that fails (no ib_umad, no permission on /dev/infiniband/umad*), every Call fails
// with the reason.
func (p *Port) MAD() verbs.MADAgent {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.agent == nil && p.agErr == nil {
		p.agent, p.agErr = OpenAgent(p.dev.name, p.num)
	}
	if p.agErr != nil {
		return failedAgent{p.agErr}
	}
	return p.agent
}

// failedAgent is the MAD agent of a port whose umad file could not be opened.
type failedAgent struct{ err error }

var errNoUmad = errors.New("no MAD agent")

func (f failedAgent) Call(context.Context, verbs.LID, []byte, time.Duration, int) ([]byte, error) {
	return nil, fmt.Errorf("%w: %w", errNoUmad, f.err)
}
func (f failedAgent) Send(verbs.LID, verbs.QPN, []byte) error {
	return fmt.Errorf("%w: %w", errNoUmad, f.err)
}
func (f failedAgent) Register(uint8, verbs.MADHandler) {}
