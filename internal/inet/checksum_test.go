package inet

import "testing"

// RFC 1071's worked example: the sum of 0001 f203 f4f5 f6f7 is ddf2 (folded), and a
// buffer with its checksum in place sums to 0xffff.
func TestChecksum(t *testing.T) {
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	if got := Fold(Sum(0, b)); got != 0xddf2 {
		t.Fatalf("sum %#x, want 0xddf2", got)
	}
	c := Checksum(b)
	with := append(b, byte(c>>8), byte(c))
	if got := Fold(Sum(0, with)); got != 0xffff {
		t.Fatalf("sum with the checksum %#x, want 0xffff", got)
	}
	if got := Fold(Sum(0, []byte{0x01})); got != 0x0100 {
		t.Fatalf("odd byte: %#x, want 0x0100", got)
	}
	big := make([]byte, 1<<17) // a sum past 2^31 is folded on the way
	for k := range big {
		big[k] = 0xff
	}
	if got := Fold(Sum(0, big)); got != 0xffff {
		t.Fatalf("all ones: %#x", got)
	}
}
