//go:build linux

package kernel

import (
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"
)

// Queue is one of a device's TUN queues. A device opened with Config.Queues above 1 is
// a multi-queue TUN (IFF_MULTI_QUEUE): the kernel sends each flow out of one queue,
// the one a packet of that flow was last written to (the TUN driver's automatic flow
// steering; by hash before any was), so a reader per queue takes its flows in
// parallel with the others', and the replies of a flow written to a queue come back
// on it. Read calls on a queue are serialised among themselves, as are Write calls;
// queues are independent of each other.
type Queue struct {
	d   *Device
	tun tun.Device
	rc  syscall.RawConn

	wmu   sync.Mutex
	wbufs [][]byte // write slots, cap vnetHdrLen+maxPacket each (GRO grows packets in place)
	wvec  [][]byte
	// GRO's buffers for packets written in place (WriteOffset) that it coalesces into
	// and that are too small for it (growGRO): made at first use, handed out from
	// gnext on in one write.
	gbufs [][]byte
	gnext int

	rmu     sync.Mutex // serialises Read
	readErr error      // met by a Read after its first packet; the next Read returns it
}

// newQueue wraps a TUN file descriptor of the device (created or attached).
func newQueue(d *Device, fd int) (*Queue, error) {
	dev, _, err := tun.CreateUnmonitoredTUNFromFD(fd)
	if err != nil {
		// createTUN ran the same ioctls successfully, so this does not happen in
		// practice; the fd may be owned by an unreachable *os.File now, but closing
		// it is the only way to remove the device.
		unix.Close(fd)
		return nil, err
	}
	q := &Queue{d: d, tun: dev}
	if nt, ok := dev.(*tun.NativeTun); ok {
		nt.SetGrow(q.growGRO)
	}
	if q.rc, err = dev.File().SyscallConn(); err != nil {
		dev.Close()
		return nil, err
	}
	return q, nil
}

// Queues is the number of the device's TUN queues.
func (d *Device) Queues() int { return len(d.q) }

// Queue returns the device's queue k (0 <= k < Queues()).
func (d *Device) Queue(k int) *Queue { return d.q[k] }

// Read, ReadOffset, WaitReadable, Write and WriteOffset of a Device are its first
// queue's: see Queue.
func (d *Device) Read(bufs [][]byte, sizes []int) (int, error) { return d.q[0].Read(bufs, sizes) }

func (d *Device) ReadOffset(bufs [][]byte, sizes []int, offset int) (int, error) {
	return d.q[0].ReadOffset(bufs, sizes, offset)
}

func (d *Device) WaitReadable() error { return d.q[0].WaitReadable() }

func (d *Device) Write(pkts [][]byte) (int, error) { return d.q[0].Write(pkts) }

func (d *Device) WriteOffset(frames [][]byte, offset int) (int, error) {
	return d.q[0].WriteOffset(frames, offset)
}

// Read waits for a packet from the kernel and returns it as IP packets in
// bufs[i][:sizes[i]]: a super-packet (TSO) is split into MTU-sized packets with fixed-up
// IP/TCP/UDP headers and checksums, a packet with a partial checksum gets it completed.
// Then, without waiting, it takes what else the kernel has queued while buffers are
// left, so a burst (of plain packets, with large send off) makes one batch: n counts
// the packets of all of them. A queued super-packet that needs more of the remaining
// buffers than there are stays for the next Read. Every packet returned fits the MTU.
//
// Buffers need no headroom (offset 0; ReadOffset takes one). Each element of bufs must
// hold at least the MTU (Read refuses smaller ones), and len(bufs) should be
// BatchSize(): the device's
// gso_max_segs is set to BatchSize so a super-packet never splits into more; with fewer
// buffers a larger super-packet is truncated to len(bufs) packets and an error wrapping
// tun.ErrTooManySegments is returned with them. len(sizes) must be >= len(bufs).
// A packet larger than the buffers (the MTU raised while the Read waited, or behind the
// package's back) fails the Read with an error ShortBuffer reports, and is kept for the
// next Read. After Close, errors.Is(err, os.ErrClosed).
// An error met after the first packet is returned by the next call, with no packets.
func (q *Queue) Read(bufs [][]byte, sizes []int) (n int, err error) {
	return q.ReadOffset(bufs, sizes, 0)
}

// ReadHeadroom is the offset at which ReadOffset can read a packet straight into a
// buffer of ReadBufferLen bytes instead of copying it there (the virtio-net header
// lands before it).
const ReadHeadroom = 10

// ReadBufferLen is the length of a read buffer for packets of up to mtu bytes at
// offset ReadHeadroom: with an MTU of 48 KiB or more (connected mode's 65520), room for
// the largest read the kernel makes, so that ReadOffset reads straight into it
// (copying 64 KiB packets out of an intermediate buffer was 5-6% of the sending
// daemon's CPU) for at most a third more memory; below that, the MTU (a super-packet
// is split into such buffers anyway).
func ReadBufferLen(mtu int) int {
	if mtu >= 48<<10 {
		return ReadHeadroom + max(mtu, 65535)
	}
	return ReadHeadroom + mtu
}

// ReadOffset is Read with packets returned in bufs[i][offset:offset+sizes[i]]; each
// buffer must hold the MTU after offset. The bytes before offset may be overwritten
// (a read in place puts the virtio-net header there).
func (q *Queue) ReadOffset(bufs [][]byte, sizes []int, offset int) (n int, err error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	if len(sizes) < len(bufs) {
		return 0, q.d.errorf("read: %d sizes for %d buffers", len(sizes), len(bufs))
	}
	if offset < 0 {
		return 0, q.d.errorf("read: offset %d", offset)
	}
	mtu := int(q.d.mtu.Load())
	for i, b := range bufs {
		if len(b)-offset < mtu {
			return 0, q.d.errorf("read: buffer %d holds %d bytes after offset %d, the MTU is %d", i, len(b)-offset, offset, mtu)
		}
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if err := q.readErr; err != nil {
		q.readErr = nil
		return 0, err
	}
	good := 0 // packets of the reads that returned
	defer func() {
		// The patched split checks the buffers' length (ShortBuffer); this stays so
		// that a slip in the copied code cannot crash the engine. The packets of the
		// reads before the one that panicked are good; the error waits for the next
		// call then, as any error met after the first packet.
		if r := recover(); r != nil {
			perr := q.d.errorf("read: packet larger than the buffers (MTU changed outside ipoibfs?): %v", r)
			if good > 0 {
				n, err, q.readErr = good, nil, perr
			} else {
				n, err = 0, perr
			}
		}
	}()
	m, err := q.tun.Read(bufs, sizes, offset)
	if err != nil {
		return m, q.d.readIOErr("read", err)
	}
	good = m
	if tr, ok := q.tun.(tryReader); ok {
		for good < len(bufs) {
			m, err := tr.TryRead(bufs[good:], sizes[good:], offset)
			if err != nil {
				q.readErr = q.d.readIOErr("read", err) // the packets so far are good
				break
			}
			if m == 0 {
				break
			}
			good += m
		}
	}
	return good, nil
}

// tryReader is the patched wireguard TUN's read without waiting (third_party/wireguard).
type tryReader interface {
	TryRead(bufs [][]byte, sizes []int, offset int) (int, error)
	ReadKept() bool
}

// Write injects IP packets into the kernel as if received on the device. With GRO on,
// TCP/UDP segments of one flow are coalesced into super-packets first. The packets are
// copied (the caller keeps ownership of pkts and needs no headroom).
//
// Packets the kernel refuses (malformed, device down: EIO) are dropped and their errors
// joined into err; n still counts them as consumed, so n == len(pkts) unless the device
// was closed (errors.Is(err, os.ErrClosed)) or a packet is empty or longer than 65535
// bytes (nothing is written then).
func (q *Queue) Write(pkts [][]byte) (n int, err error) {
	for i, p := range pkts {
		if len(p) == 0 || len(p) > maxPacket {
			return 0, q.d.errorf("write: packet %d has %d bytes (1..%d)", i, len(p), maxPacket)
		}
	}
	q.wmu.Lock()
	defer q.wmu.Unlock()
	return q.writeLocked(pkts, vnetHdrLen, q.toSlotsLocked)
}

// toSlotsLocked copies a chunk of packets into the write slots, after room for the
// virtio-net header, and returns the slots.
func (q *Queue) toSlotsLocked(chunk [][]byte) [][]byte {
	vec := q.wvec[:0]
	for i, p := range chunk {
		if i == len(q.wbufs) {
			q.wbufs = append(q.wbufs, make([]byte, vnetHdrLen+maxPacket))
		}
		b := q.wbufs[i][:vnetHdrLen+len(p)]
		copy(b[vnetHdrLen:], p)
		vec = append(vec, b)
	}
	q.wvec = vec
	return vec
}

// WriteHeadroom is what WriteOffset needs before each packet to write it in place.
const WriteHeadroom = vnetHdrLen

// WriteOffset is Write for packets in frames[i][offset:]: with offset >= WriteHeadroom
// they are written in place, the virtio-net header put before each (the bytes before
// offset are overwritten, and with GRO a packet may grow into the capacity after it),
// sparing Write's copy of every packet (7% of a connected-mode receiver's CPU, for 64
// KiB packets); with less headroom it is Write. GRO may replace frames' entries (a
// flow head it coalesces into gets one of the queue's larger buffers, valid until the
// next write; entries are also swapped): the caller does not use them after.
func (q *Queue) WriteOffset(frames [][]byte, offset int) (n int, err error) {
	if offset < WriteHeadroom {
		pkts := make([][]byte, len(frames))
		for i, f := range frames {
			pkts[i] = f[offset:]
		}
		return q.Write(pkts)
	}
	for i, f := range frames {
		if l := len(f) - offset; l <= 0 || l > maxPacket {
			return 0, q.d.errorf("write: packet %d has %d bytes (1..%d)", i, l, maxPacket)
		}
	}
	q.wmu.Lock()
	defer q.wmu.Unlock()
	return q.writeLocked(frames, offset, nil)
}

// writeLocked writes frames in chunks of the batch size, each chunk turned by prep
// (if set) into frames with their packets at offset.
func (q *Queue) writeLocked(frames [][]byte, offset int, prep func([][]byte) [][]byte) (n int, err error) {
	gro := q.d.gro.Load()
	var errs []error
	for len(frames) > 0 {
		chunk := frames[:min(len(frames), q.d.batch)]
		frames = frames[len(chunk):]
		vec := chunk
		if prep != nil {
			vec = prep(chunk)
		}
		if errs, err = q.writeVecLocked(vec, offset, gro, errs); err != nil {
			return n, err
		}
		n += len(chunk)
	}
	if len(errs) > 0 {
		return n, q.d.errorf("write: %w", errors.Join(errs...))
	}
	return n, nil
}

// growGROSize is the size of a buffer growGRO hands out: the largest packet and twice
// the engine's frame offsets (GRO's capacity check counts the offset twice; the fork
// limits a grown buffer's capacity so that no packet passes 65535 bytes).
const growGROSize = maxPacket + 1024

// growGRO gives GRO a larger buffer, holding b, for a packet written in place that
// it coalesces into (tun.GrowFunc): frames from the HCA's receive buffers are sized
// for one packet, and only such a flow head is copied, where copying every packet
// into a write slot first cost 5% of the receiving daemon's CPU (netbench -profile).
// Called by the write, under wmu; the buffers are reused from the next write on.
func (q *Queue) growGRO(b []byte, need int) []byte {
	if need > growGROSize || cap(b) >= maxPacket {
		return nil // a write slot already, or more than any packet
	}
	if q.gnext == len(q.gbufs) {
		q.gbufs = append(q.gbufs, make([]byte, growGROSize))
	}
	nb := q.gbufs[q.gnext][:len(b)]
	q.gnext++
	copy(nb, b)
	return nb
}

// writeVecLocked writes the packets vec[i][offset:] (offset >= vnetHdrLen), with GRO
// or one at a time; a packet's error is added to errs, a closed device is err.
func (q *Queue) writeVecLocked(vec [][]byte, offset int, gro bool, errs []error) ([]error, error) {
	if gro {
		q.gnext = 0 // what growGRO handed out for the last write is free again
		if _, err := q.tun.Write(vec, offset); err != nil {
			if isClosed(err) {
				return errs, q.d.ioErr("write", err)
			}
			errs = append(errs, err)
		}
		return errs, nil
	}
	f := q.tun.File()
	for _, b := range vec {
		b = b[offset-vnetHdrLen:]
		clear(b[:vnetHdrLen]) // no GSO, no checksum offload
		if _, err := f.Write(b); err != nil {
			if isClosed(err) {
				return errs, q.d.ioErr("write", err)
			}
			errs = append(errs, err)
		}
	}
	return errs, nil
}

// pollNow polls fd for input without waiting and returns the events it reports (0:
// none yet).
func pollNow(fd uintptr) int16 {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(p, 0); n > 0 {
		return p[0].Revents
	}
	return 0
}

// WaitReadable returns when the kernel has a packet for Read, or with an error wrapping
// os.ErrClosed once the device is closed: a reader can hold no buffers while its device
// is idle (a child created and never used).
func (q *Queue) WaitReadable() error {
	if tr, ok := q.tun.(tryReader); ok && tr.ReadKept() {
		return nil // a packet is waiting in the device already
	}
	err := q.rc.Read(func(fd uintptr) bool {
		// Readable now? (The poller waits for the next edge otherwise; a packet left
		// queued by an earlier Read makes no new one.)
		return pollNow(fd) != 0
	})
	if err != nil {
		return q.d.readIOErr("wait", err) // the file's "use of closed file" is not os.ErrClosed
	}
	return nil
}
