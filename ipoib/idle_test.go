package ipoib

import (
	"runtime"
	"testing"
)

// A child that is never brought up runs no goroutine of its own: its receive loop,
// task and connected mode's loops start at its first open (thousands of idle children
// held six goroutines each, most of their memory). Opened, they run; deleted, they end.
func TestIdleChildrenRunNoGoroutines(t *testing.T) {
	const n = 50
	r := newRig(t)
	e := r.engine("a", 1, Options{})
	ib0, _ := e.Interface("ib0")
	if err := ib0.SetUp(true); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	kids := make([]*Interface, n)
	for k := range kids {
		c, err := ib0.CreateChild(int64(0x8001 + k))
		if err != nil {
			t.Fatal(err)
		}
		kids[k] = c
	}
	// Goroutines of the fabric's and the SA client's may come and go meanwhile: a
	// bound well below one per child.
	if g := runtime.NumGoroutine() - base; g > n/5 {
		t.Fatalf("%d children never brought up added %d goroutines, want none of their own", n, g)
	}
	for _, c := range kids[:10] {
		if err := c.SetUp(true); err != nil {
			t.Fatal(err)
		}
	}
	if g := runtime.NumGoroutine() - base; g < 10*2 {
		t.Fatalf("10 children brought up: %d more goroutines than before them, want their loops (2 or more each)", g)
	}
	for _, c := range kids {
		if err := ib0.RemoveChild(c); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the children's goroutines to end", func() bool { return runtime.NumGoroutine()-base <= n/5 })
}
