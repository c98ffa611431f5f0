package main

import (
	"errors"
	"os"
	"testing"
)

// push goes through the IfChanged setter only for the value of the attribute being
// adopted, and only while it is.
func TestPushAdoptedValueOnly(t *testing.T) {
	var d adopter
	var got []string
	set := func(name string) (func(int) error, func(int) error) {
		return func(int) error { got = append(got, name+" set"); return nil },
			func(int) error { got = append(got, name+" ifChanged"); return nil }
	}
	mtuSet, mtuIf := set("mtu")
	txqSet, txqIf := set("txq")
	d.adopt(attrMTU, 1500, func() {
		_ = push(&d, attrMTU, 1500, mtuSet, mtuIf) // the adopted value
		_ = push(&d, attrMTU, 1400, mtuSet, mtuIf) // the engine lowered it: a different value
		_ = push(&d, attrTxq, 1500, txqSet, txqIf) // another attribute, the same number
	})
	_ = push(&d, attrMTU, 1500, mtuSet, mtuIf) // the adoption is over
	bset := func(bool) error { got = append(got, "up set"); return nil }
	bif := func(bool) error { got = append(got, "up ifChanged"); return nil }
	d.adopt(attrUp, true, func() { _ = push(&d, attrUp, false, bset, bif); _ = push(&d, attrUp, true, bset, bif) })
	want := []string{"mtu ifChanged", "mtu set", "txq set", "mtu set", "up set", "up ifChanged"}
	if len(got) != len(want) {
		t.Fatalf("pushes %q, want %q", got, want)
	}
	for k := range want {
		if got[k] != want[k] {
			t.Fatalf("pushes %q, want %q", got, want)
		}
	}
}

// A push the device refuses leaves the attribute out of step (onLink then takes a
// change made on the device as it is: the device kept its older value, and the change
// is the newest); the next push that succeeds puts it back in step. A closed device
// changes nothing.
func TestPushFailureMarksOutOfStep(t *testing.T) {
	var d adopter
	fail := errors.New("netlink: no buffer space")
	res := fail
	set := func(string) error { return res }
	if err := push(&d, attrAlias, "a", set, set); err != fail || !d.outOfSync(attrAlias) {
		t.Fatalf("a failed push: %v, out of step %v", err, d.outOfSync(attrAlias))
	}
	if d.outOfSync(attrTxq) {
		t.Error("another attribute out of step")
	}
	res = os.ErrClosed
	_ = push(&d, attrAlias, "b", set, set)
	if !d.outOfSync(attrAlias) {
		t.Error("a push to a closed device put the attribute back in step")
	}
	res = nil
	_ = push(&d, attrAlias, "c", set, set)
	if d.outOfSync(attrAlias) {
		t.Error("still out of step after a push that succeeded")
	}
}
