package soft

import (
	"testing"

	"ipoibfs/verbs"
)

// A CQ's ring grows as completions pile up, keeps them in order across the growth
// (also when the ring has wrapped), holds exactly its capacity and counts the rest as
// overruns. A CQ that never had a completion holds no ring.
func TestCQGrowsToCapacity(t *testing.T) {
	const entries = 300
	c := newCQ(entries)
	if len(c.ring) != 0 {
		t.Fatalf("a new CQ of %d entries allocated %d up front, want none until a completion", entries, len(c.ring))
	}
	next, want := uint64(0), uint64(0)
	wcs := make([]verbs.WC, 7)
	// Wrap the small ring first: push 50, poll 40, so head is not 0 when it grows.
	for range 50 {
		c.push(verbs.WC{WRID: next})
		next++
	}
	for got := 0; got < 40; {
		n := c.Poll(wcs[:min(7, 40-got)])
		for _, wc := range wcs[:n] {
			if wc.WRID != want {
				t.Fatalf("completion %d polled as %d", want, wc.WRID)
			}
			want++
		}
		got += n
	}
	for c.n < entries {
		c.push(verbs.WC{WRID: next})
		next++
	}
	c.push(verbs.WC{WRID: next}) // one too many
	if c.Overruns() != 1 {
		t.Errorf("overruns %d after exceeding %d entries, want 1", c.Overruns(), entries)
	}
	for n := c.Poll(wcs); n > 0; n = c.Poll(wcs) {
		for _, wc := range wcs[:n] {
			if wc.WRID != want {
				t.Fatalf("completion %d polled as %d", want, wc.WRID)
			}
			want++
		}
	}
	if want != next {
		t.Errorf("polled up to %d, pushed %d (the last one overran)", want, next)
	}
}
