package tun

import (
	"errors"
	"fmt"
)

var (
	// ErrTooManySegments is returned by Device.Read() when segmentation
	// overflows the length of supplied buffers. This error should not cause
	// reads to cease.
	ErrTooManySegments = errors.New("too many segments")
)

// BufferTooSmallError is returned by NativeTun.Read when a packet, or one segment
// of a super-packet, is larger than the buffers given (their owner sized them for an
// MTU raised since). The packet is kept: the next Read returns it first, into
// buffers of at least Need bytes (an ipoibfs patch; upstream loses the packet).
type BufferTooSmallError struct {
	Need int // bytes the largest packet or segment needs, offset excluded
	Have int
}

func (e *BufferTooSmallError) Error() string {
	return fmt.Sprintf("read len %d overflows bufs element len %d", e.Need, e.Have)
}
