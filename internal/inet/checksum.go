// Package inet holds the Internet checksum (RFC 1071), which the packets the engine
// builds and checks (ICMP errors, captures, DHCP replies) all need.
package inet

// Sum adds b as big-endian 16-bit words (an odd last byte padded with zero) to the
// unfolded one's-complement sum.
func Sum(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
		if sum >= 1<<31 {
			sum = uint32(Fold(sum))
		}
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

// Fold reduces an unfolded one's-complement sum to 16 bits.
func Fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}

// Checksum is the Internet checksum of b: its folded sum, complemented.
func Checksum(b []byte) uint16 { return ^Fold(Sum(0, b)) }
