package ipoib

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"ipoibfs/verbs/soft"
)

// Options.PortNames names ports' parents (ipoibfs -ifname ib0=uib0): the others keep
// NameTemplate's name, and a bad or shared name fails New with EINVAL.
func TestPortNames(t *testing.T) {
	r := newRig(t)
	e := r.engine("names", 2, Options{PortNames: map[int]string{1: "uib0"}})
	var got []string
	for _, i := range e.Interfaces() {
		got = append(got, i.Name())
	}
	if !slices.Equal(got, []string{"ib1", "uib0"}) {
		t.Fatalf("interfaces %v, want [ib1 uib0]", got)
	}
	if i := iface(t, e, "uib0"); i.Port() != 1 {
		t.Errorf("uib0 is on port %d, want 1", i.Port())
	}

	for _, tc := range []struct {
		names map[int]string
		want  string
	}{
		{map[int]string{1: "ib1"}, "ports 1 and 2 would both be ib1"},
		{map[int]string{3: "x"}, "port 3 of an HCA with 2 ports"},
		{map[int]string{1: "a/b"}, `port 1: "a/b" is not a valid interface name`},
		{map[int]string{2: "sixteen-bytes-xx"}, "is not a valid interface name"},
	} {
		o := Options{PortNames: tc.names, NameTemplate: "ib%d"}
		_, err := o.parentNames(2)
		if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PortNames %v: %v, want EINVAL saying %q", tc.names, err, tc.want)
		}
	}
	h, err := soft.New(soft.Config{Name: "names-bad", Network: r.net, SM: r.smh.Endpoint(1), Heartbeat: hb})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if e, err := New(h, Options{PortNames: map[int]string{1: "a:b"}}); !errors.Is(err, syscall.EINVAL) {
		if e != nil {
			e.Close()
		}
		t.Errorf("New with a bad port name: %v, want EINVAL", err)
	}
}
