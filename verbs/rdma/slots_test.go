//go:build rdma && linux

package rdma

import (
	"testing"

	"ipoibfs/verbs"
)

// TestSlotGenerations: a reset takes every receive slot back once, and a completion
// polled after it for a request of the older generation is refused instead of freeing
// its slot a second time (which would post two buffers in one slot).
func TestSlotGenerations(t *testing.T) {
	r := newRecvSlots(nil, 4, 64)
	take := func(wrid uint64) uint64 { // what post does, without the device
		k := r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
		r.id[k] = wrid
		return slotID(r.gen, k) | recvBit
	}
	old := take(77)
	take(78)
	r.reset()
	if len(r.free) != 4 {
		t.Fatalf("%d free slots after a reset, want 4", len(r.free))
	}
	var wc verbs.WC
	wc.Status = verbs.WCWRFlushErr // no copy from the (absent) slot memory
	if r.complete(old, &wc) {
		t.Fatalf("a completion of the older generation was taken: %+v", wc)
	}
	if len(r.free) != 4 {
		t.Fatalf("%d free slots after a stale completion, want 4", len(r.free))
	}
	id := take(90)
	if !r.complete(id, &wc) || wc.WRID != 90 || len(r.free) != 4 {
		t.Fatalf("completion of the current generation: %+v, %d free", wc, len(r.free))
	}
	// The generation wraps within its 31 bits and still tells the two apart.
	r.gen = 0x7fffffff
	id = take(91)
	r.reset()
	if gen, _ := slotOf(id &^ recvBit); gen == r.gen&0x7fffffff || r.complete(id, &wc) {
		t.Fatalf("generation %#x after a wrap matches the one before", r.gen)
	}
}
