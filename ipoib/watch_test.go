package ipoib

import (
	"fmt"
	"testing"
)

// Watch loses nothing: a reader that falls behind finds "" (look at every name) queued
// after the changes whose names did not fit, so the last thing it reads covers the
// newest change.
func TestWatchSaysWhenNamesWentMissing(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	e, ib0 := nodes[0].e, nodes[0].ib0
	ch, cancel := e.Watch()
	defer cancel()
	if _, err := ib0.CreateChild(0x8001); err != nil {
		t.Fatal(err)
	}
	if got := <-ch; got != "ib0.8001" {
		t.Fatalf("first change %q, want ib0.8001", got)
	}
	const n = 100 // more than the channel holds
	for k := 2; k < 2+n; k++ {
		if _, err := ib0.CreateChild(int64(0x8000 + k)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for len(ch) > 0 {
		got = append(got, <-ch)
	}
	blank := 0
	for _, s := range got {
		if s == "" {
			blank++
		}
	}
	if last := got[len(got)-1]; blank == 0 || (last != "" && last != fmt.Sprintf("ib0.%04x", 0x8000+n+1)) {
		t.Fatalf("%d changes queued, %d of them \"\", last %q: want a \"\", and the newest name or \"\" last", len(got), blank, last)
	}
}
