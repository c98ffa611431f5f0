package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Multi-segment RMPP (IBA 13.6) for SA answers longer than one MAD, as the kernel's
// mad_rmpp.c does it: the sender splits the class data into 200-byte segments, each
// carrying the whole 56-byte header; the receiver ACKs each window and the last
// segment; the sender may send up to the window the last ACK granted.
//
// A transfer in its joined-up form ("the long MAD") is what the kernel hands to
// userspace: the 56-byte header of the first segment followed by all the class data.

// RMPPSegData is the class data each segment carries (the data area of an SA MAD).
const RMPPSegData = SADataSize

// rmppSegSize is what PayloadLength counts per segment: the SA header after the RMPP
// header plus the data (the kernel's IB_MGMT_RMPP_DATA for SA).
const rmppSegSize = rmppSAHeaderLen + RMPPSegData

// RMPPWindow is the receive window granted in each ACK (the kernel grants a window of
// its receive queue size / 8, 64 for its default).
const RMPPWindow = 64

// MaxRMPPSegments bounds a transfer this package reassembles or builds (3.2 MB of
// records), so a peer cannot make a receiver hold unbounded memory.
const MaxRMPPSegments = 16384

// ErrRMPP is wrapped by every RMPP protocol error (bad flags, abort, too long).
var ErrRMPP = errors.New("rmpp")

// rmppActive reports whether b is a whole MAD with an active RMPP header.
func rmppActive(b []byte) bool {
	return len(b) >= Size && b[HeaderSize] == RMPPVersion1 && b[HeaderSize+2]&RMPPFlagActive != 0
}

// RMPPType returns the RMPP type of an active RMPP MAD of an RMPP class, or 0.
func RMPPType(b []byte) uint8 {
	if !rmppActive(b) || b[1] != ClassSA {
		return 0
	}
	return b[HeaderSize+1]
}

// SplitRMPP cuts a long SA MAD (56-byte header, then the class data) into DATA
// segments: First on the first, Last on the last, PayloadLength on those two as the
// kernel writes it. A long MAD of at most one segment's data gives one segment.
func SplitRMPP(long []byte) ([][]byte, error) {
	if len(long) < SADataOffset {
		return nil, short("RMPP long MAD", len(long), SADataOffset)
	}
	data := long[SADataOffset:]
	n := max(1, (len(data)+RMPPSegData-1)/RMPPSegData)
	if n > MaxRMPPSegments {
		return nil, fmt.Errorf("%w: %d bytes need %d segments (at most %d)", ErrRMPP, len(data), n, MaxRMPPSegments)
	}
	pad := n*RMPPSegData - len(data)
	segs := make([][]byte, n)
	for i := range segs {
		s := make([]byte, Size)
		copy(s, long[:SADataOffset])
		h := s[HeaderSize:]
		h[0], h[1], h[3] = RMPPVersion1, RMPPTypeData, 0
		flags := uint8(RMPPFlagActive)
		var paylen uint32
		if i == 0 {
			flags |= RMPPFlagFirst
			paylen = uint32(n*rmppSegSize - pad)
		}
		if i == n-1 {
			flags |= RMPPFlagLast
			paylen = uint32(rmppSegSize - pad)
		}
		h[2] = h[2]&^0x07 | flags
		binary.BigEndian.PutUint32(h[4:], uint32(i+1))
		binary.BigEndian.PutUint32(h[8:], paylen)
		copy(s[SADataOffset:], data[i*RMPPSegData:min(len(data), (i+1)*RMPPSegData)])
		segs[i] = s
	}
	return segs, nil
}

// RMPPAck builds the ACK a receiver sends for seg: the segment's header with the R bit
// flipped (an ACK of a response travels as a request, as the kernel's format_ack
// does), type ACK, SegNum lastSeg and NewWindowLast newWin, no data.
func RMPPAck(seg []byte, lastSeg, newWin uint32) []byte {
	a := make([]byte, Size)
	copy(a, seg[:SADataOffset])
	a[3] ^= MethodResp
	h := a[HeaderSize:]
	h[0], h[1], h[3] = RMPPVersion1, RMPPTypeAck, 0
	h[2] = h[2]&^0x07 | RMPPFlagActive
	binary.BigEndian.PutUint32(h[4:], lastSeg)
	binary.BigEndian.PutUint32(h[8:], newWin)
	return a
}

// RMPPAckOf reads an ACK: the last segment received in order and the new window end.
func RMPPAckOf(b []byte) (lastSeg, newWin uint32, ok bool) {
	if RMPPType(b) != RMPPTypeAck {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[HeaderSize+4:]), binary.BigEndian.Uint32(b[HeaderSize+8:]), true
}

// Reassembly joins the DATA segments of one transfer into the long MAD. Add takes the
// segments as they come (in order, duplicated or out of order) and says what to ACK.
type Reassembly struct {
	hdr    []byte // the first segment's header
	data   []byte
	next   uint32 // the segment wanted next
	window uint32 // the last segment the sender may send
	done   bool
}

// Add takes one received segment. It returns the ACK to send (nil when none is due),
// whether the transfer is complete, and an error for a segment that ends the transfer
// (STOP, ABORT, a bad first segment, a transfer beyond MaxRMPPSegments).
func (r *Reassembly) Add(seg []byte) (ack []byte, complete bool, err error) {
	if len(seg) < Size {
		return nil, false, short("RMPP segment", len(seg), Size)
	}
	switch t := RMPPType(seg); t {
	case RMPPTypeData:
	case RMPPTypeStop, RMPPTypeAbort:
		return nil, false, fmt.Errorf("%w: sender ended the transfer (type %d, status %d)", ErrRMPP, t, seg[HeaderSize+3])
	default:
		return nil, false, fmt.Errorf("%w: not an RMPP DATA segment", ErrRMPP)
	}
	h := seg[HeaderSize:]
	num := binary.BigEndian.Uint32(h[4:])
	flags := h[2] & 0x07
	if r.next == 0 {
		r.next, r.window = 1, 1
	}
	switch {
	case r.done || num < r.next:
		// A duplicate: the sender missed our ACK; say again where we are.
		return RMPPAck(seg, r.next-1, r.window), r.done, nil
	case num > r.next:
		// A gap: dropped without an ACK (as the kernel does); the sender's timeout
		// resends from the first segment not ACKed.
		return nil, false, nil
	}
	if num == 1 {
		if flags&RMPPFlagFirst == 0 {
			return nil, false, fmt.Errorf("%w: segment 1 without the First flag", ErrRMPP)
		}
		r.hdr = append([]byte(nil), seg[:SADataOffset]...)
	}
	if num > MaxRMPPSegments {
		return nil, false, fmt.Errorf("%w: more than %d segments", ErrRMPP, MaxRMPPSegments)
	}
	r.data = append(r.data, seg[SADataOffset:Size]...)
	r.next++
	if flags&RMPPFlagLast != 0 {
		// The last segment's PayloadLength says how much of it is data.
		used := int(binary.BigEndian.Uint32(h[8:])) - rmppSAHeaderLen
		if used < 0 || used > RMPPSegData {
			return nil, false, fmt.Errorf("%w: last segment's PayloadLength %d out of range", ErrRMPP, used+rmppSAHeaderLen)
		}
		r.data = r.data[:len(r.data)-RMPPSegData+used]
		r.done, r.window = true, num
		return RMPPAck(seg, num, num), true, nil
	}
	if num == r.window {
		r.window = num + RMPPWindow
		return RMPPAck(seg, num, r.window), false, nil
	}
	return nil, false, nil
}

// Long returns the joined-up transfer: the first segment's header (RMPP fields as the
// first segment had them) and all the data. Valid once Add said complete. A transfer
// of one segment is that MAD, Size bytes with its padding.
func (r *Reassembly) Long() []byte {
	b := append(append(make([]byte, 0, max(Size, len(r.hdr)+len(r.data))), r.hdr...), r.data...)
	if len(b) < Size {
		b = b[:Size]
	}
	return b
}

// TableOf returns the records of a GetTable answer given as one MAD or as a long MAD
// (the class data of every segment): AttributeOffset*8-byte records, aliasing b. A
// one-MAD answer is read as TableRecords reads it.
func TableOf(b []byte) ([][]byte, error) {
	var m SAMAD
	if err := ParseSA(b, &m); err != nil {
		return nil, err
	}
	if len(b) == Size {
		recs := m.TableRecords()
		for i, r := range recs {
			off := SADataOffset + i*len(r)
			recs[i] = b[off : off+len(r)]
		}
		return recs, nil
	}
	stride := int(m.SA.AttrOffset) * 8
	if stride == 0 {
		return nil, nil
	}
	data := b[SADataOffset:]
	recs := make([][]byte, len(data)/stride)
	for i := range recs {
		recs[i] = data[i*stride : (i+1)*stride]
	}
	return recs, nil
}

// LongTable builds the long MAD of a GetTable answer: hdr's header (its RMPP fields
// are set by SplitRMPP) with AttributeOffset for records of size bytes, then the
// records at that stride.
func LongTable(hdr *SAMAD, size int, recs [][]byte) []byte {
	h := *hdr
	h.SA.AttrOffset = AttrOffsetFor(size)
	stride := int(h.SA.AttrOffset) * 8
	out := make([]byte, SADataOffset+len(recs)*stride)
	h.Header.Marshal(out)
	h.SA.Marshal(out[HeaderSize:])
	for i, r := range recs {
		copy(out[SADataOffset+i*stride:SADataOffset+i*stride+min(size, len(r))], r)
	}
	return out
}
