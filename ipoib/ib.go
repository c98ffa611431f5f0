package ipoib

import (
	"encoding/binary"
	"net/netip"

	"ipoibfs/verbs"
)

const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd
)

// outFrame is a frame ready to post: its AH and destination QPN.
type outFrame struct {
	ah    verbs.AH
	qpn   verbs.QPN
	frame [][]byte // gather list: the 4-byte header, then the packet
	size  int
}

// Transmit sends IP packets the kernel routed out of this interface. Packets are
// batched into one post; packets waiting for a neighbour, path or join are copied into
// bounded queues, as the kernel driver does.
func (i *Interface) Transmit(pkts [][]byte) {
	i.txMu.Lock()
	defer i.txMu.Unlock()
	out := i.txOut[:0]
	if cap(i.txHdr) < len(pkts) {
		i.txHdr = make([][encapLen]byte, len(pkts))
	}
	hdrs := i.txHdr[:len(pkts)]
	var icmps [][]byte
	i.mu.Lock()
	if !i.up || !i.carrier || !i.qpReady {
		i.mu.Unlock()
		i.stats.txDropped.Add(uint64(len(pkts)))
		return
	}
	host := i.host
	for k, pkt := range pkts {
		et, dst, ok := classify(pkt)
		if !ok {
			i.stats.txDropped.Add(1)
			continue
		}
		if len(pkt) > i.mtu {
			// Too long for the UD path: dropped, and the sender learns the group MTU.
			i.stats.txDropped.Add(1)
			i.stats.txErrors.Add(1)
			if m := tooBig(pkt, i.mcastMTU); m != nil {
				icmps = append(icmps, m)
			}
			continue
		}
		if et == etherIPv6 && isNDMessage(pkt) {
			continue // the engine does ND itself; the kernel's own (a TUN has no link layer) is dropped
		}
		binary.BigEndian.PutUint16(hdrs[k][:], et)
		hdrs[k][2], hdrs[k][3] = 0, 0
		frame := [][]byte{hdrs[k][:], pkt}
		if mgid, ok := i.groupForDstLocked(dst); ok {
			ah, ok := i.sendMulticastLocked(mgid, joinFrame(frame))
			if ok {
				out = append(out, outFrame{ah, verbs.MulticastQPN, frame, len(pkt) + encapLen})
			}
			continue
		}
		if ah, qpn, ok := i.sendUnicastLocked(dst, frame); ok {
			out = append(out, outFrame{ah, qpn, frame, len(pkt) + encapLen})
		}
	}
	i.mu.Unlock()
	i.post(out)
	i.txOut = out[:0]
	if len(icmps) > 0 && host != nil {
		host.Deliver(icmps)
	}
}

// joinFrame flattens a gather list into one new buffer (for queueing).
func joinFrame(f [][]byte) []byte {
	n := 0
	for _, p := range f {
		n += len(p)
	}
	b := make([]byte, 0, n)
	for _, p := range f {
		b = append(b, p...)
	}
	return b
}

// post sends frames in one batch. Called with txMu held.
func (i *Interface) post(out []outFrame) {
	if len(out) == 0 {
		return
	}
	i.mu.Lock()
	qkey := i.qkey
	i.mu.Unlock()
	wrs := i.txWRs[:0]
	var bytes uint64
	for _, o := range out {
		wrs = append(wrs, verbs.SendWR{AH: o.ah, RemoteQPN: o.qpn, RemoteQKey: qkey, Data: o.frame})
		bytes += uint64(o.size)
	}
	if dataDebug {
		i.e.dtracef("%s: tx %d frames, %d bytes", i.name, len(wrs), bytes)
	}
	n, err := i.qp.PostSend(wrs)
	if err != nil {
		i.stats.txErrors.Add(uint64(len(wrs) - n))
		i.stats.txDropped.Add(uint64(len(wrs) - n))
	}
	i.stats.txPackets.Add(uint64(n))
	i.stats.txBytes.Add(bytes)
	clear(wrs)
	i.txWRs = wrs[:0]
}

// sendFrames posts already-encapsulated frames (flushed queues, ARP and ND replies).
func (i *Interface) sendFrames(frames [][]byte, ah verbs.AH, qpn verbs.QPN) {
	if len(frames) == 0 || ah == nil {
		return
	}
	out := make([]outFrame, len(frames))
	for k, f := range frames {
		out[k] = outFrame{ah, qpn, [][]byte{f}, len(f)}
	}
	i.txMu.Lock()
	i.post(out)
	i.txMu.Unlock()
}

// reapSendCQ collects send completions (only errors and signalled sends produce them).
func (i *Interface) reapSendCQ() {
	var wc [32]verbs.WC
	for n := i.scq.Poll(wc[:]); n > 0; n = i.scq.Poll(wc[:]) {
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				i.stats.txErrors.Add(1)
			}
		}
	}
}

// classify returns the EtherType and destination of an IP packet.
func classify(pkt []byte) (uint16, netip.Addr, bool) {
	if len(pkt) < 1 {
		return 0, netip.Addr{}, false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return 0, netip.Addr{}, false
		}
		return etherIPv4, netip.AddrFrom4([4]byte(pkt[16:20])), true
	case 6:
		if len(pkt) < 40 {
			return 0, netip.Addr{}, false
		}
		return etherIPv6, netip.AddrFrom16([16]byte(pkt[24:40])), true
	}
	return 0, netip.Addr{}, false
}

// groupForDstLocked returns the MGID for multicast and broadcast destinations: IP
// multicast maps per RFC 4391; limited broadcast and the directed broadcast of the
// interface's IPv4 subnets go to the broadcast group, as the kernel resolves them to
// dev->broadcast.
func (i *Interface) groupForDstLocked(dst netip.Addr) (verbs.GID, bool) {
	if dst.IsMulticast() {
		return mgidForIP(dst, i.bcast), true
	}
	if !dst.Is4() {
		return verbs.GID{}, false
	}
	if dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return i.bcast.GID(), true
	}
	for _, p := range i.hostAddrs {
		if p.Addr().Is4() && p.Bits() < 31 && p.Contains(dst) && dst == lastAddr(p) {
			return i.bcast.GID(), true
		}
	}
	return verbs.GID{}, false
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a)
}

// recvLoop is the receive completion handler (ipoib_ib_handle_rx_wc).
func (i *Interface) recvLoop() {
	defer i.wg.Done()
	wcs := make([]verbs.WC, recvBatch)
	deliver := make([][]byte, 0, recvBatch)
	repost := make([]verbs.RecvWR, 0, recvBatch)
	for {
		select {
		case <-i.stop:
			return
		case <-i.rcq.Notify():
		}
		for n := i.rcq.Poll(wcs); n > 0; n = i.rcq.Poll(wcs) {
			deliver, repost = deliver[:0], repost[:0]
			i.mu.Lock()
			host := i.host
			gen := i.qpGen
			ownQPN := i.hw.QPN()
			bgid := i.bcast.GID()
			i.mu.Unlock()
			p, _ := i.e.dev.Port(i.port)
			ownLID := p.Attr().LID
			for _, wc := range wcs[:n] {
				if wc.Status == verbs.WCWRFlushErr {
					continue // QP reset: the buffer is re-posted at the next open
				}
				buf := i.recvBufs[wc.WRID]
				repost = append(repost, verbs.RecvWR{ID: wc.WRID, Buf: buf})
				if wc.Status != verbs.WCSuccess || wc.ByteLen < grhLen+encapLen {
					i.stats.rxDropped.Add(1)
					continue
				}
				if wc.SLID == ownLID && wc.SrcQP == ownQPN {
					continue // our own multicast looped back by the HCA
				}
				frame := buf[grhLen:wc.ByteLen]
				if dataDebug {
					i.e.dtracef("%s: rx %d bytes from LID %#x QPN %#x", i.name, len(frame), wc.SLID, wc.SrcQP)
				}
				dgid := verbs.GID(buf[24:40])
				et := binary.BigEndian.Uint16(frame)
				pkt := frame[encapLen:]
				switch et {
				case etherARP:
					i.handleARP(pkt)
					continue
				case etherIPv4, etherIPv6:
				default:
					i.stats.rxDropped.Add(1)
					continue
				}
				if et == etherIPv6 && isNDMessage(pkt) {
					i.handleND(pkt)
					continue
				}
				if _, _, ok := classify(pkt); !ok {
					i.stats.rxDropped.Add(1)
					continue
				}
				if dgid.IsMulticast() && dgid != bgid {
					i.stats.multicast.Add(1)
				}
				i.stats.rxPackets.Add(1)
				i.stats.rxBytes.Add(uint64(len(pkt)))
				deliver = append(deliver, pkt)
			}
			if len(deliver) > 0 {
				if host != nil {
					host.Deliver(deliver)
				} else {
					i.stats.rxDropped.Add(uint64(len(deliver)))
				}
			}
			// A QP restart posts every buffer afresh; re-posting ours then would post
			// them twice.
			i.mu.Lock()
			if len(repost) > 0 && gen == i.qpGen && i.qpReady {
				if _, err := i.qp.PostRecv(repost); err != nil {
					i.e.tracef(1, "%s: re-posting receive buffers: %v", i.name, err)
				}
			}
			i.mu.Unlock()
		}
	}
}
