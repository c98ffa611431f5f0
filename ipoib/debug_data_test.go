//go:build ipoib_debug_data

package ipoib

import (
	"ipoibfs/internal/testenv"
	"log"
	"net/netip"
	"strings"
	"testing"
)

func TestDataDebugTracesOnlyWhenSet(t *testing.T) {
	if !dataDebug {
		t.Fatal("built with the tag but dataDebug is off")
	}
	_, nodes := testFabric(t, "", "a", "b")
	var buf testenv.Buffer
	a, b := nodes[0], nodes[1]
	a.e.trace = log.New(&buf, "", 0)
	a.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.1/24")})
	b.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24")})
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1)
	if strings.Contains(buf.String(), "ipoib data:") {
		t.Fatalf("data trace with data_debug_level 0:\n%s", buf.String())
	}
	if err := a.e.Params().SetParam("data_debug_level", "1"); err != nil {
		t.Fatal(err)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 2)
	if !strings.Contains(buf.String(), "ipoib data: ib0: tx 1 frames") {
		t.Fatalf("no data trace:\n%s", buf.String())
	}
}

// cm_data_debug_level traces the connected-mode data path, and only it: datagram
// traffic with the level set, or connected traffic without it, writes no such line.
func TestCMDataDebugTraces(t *testing.T) {
	_, nodes := testFabric(t, "", "a", "b")
	var buf testenv.Buffer
	a, b := nodes[0], nodes[1]
	a.e.trace = log.New(&buf, "", 0)
	a.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.1/24")})
	b.ib0.SetHostAddrs([]netip.Prefix{pfx("10.0.0.2/24")})
	if err := a.e.Params().SetParam("cm_data_debug_level", "1"); err != nil {
		t.Fatal(err)
	}
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 1) // datagram mode
	if strings.Contains(buf.String(), "ipoib cm data:") {
		t.Fatalf("connected-mode trace for datagram traffic:\n%s", buf.String())
	}
	for _, n := range nodes {
		if err := n.ib0.SetMode(Connected); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a connected-mode trace", func() bool {
		ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 2)
		return strings.Contains(buf.String(), "ipoib cm data: ib0: cm tx ")
	})
	if err := a.e.Params().SetParam("cm_data_debug_level", "0"); err != nil {
		t.Fatal(err)
	}
	before := strings.Count(buf.String(), "ipoib cm data:")
	ping(t, a.ib0, b.ib0, b.host, "10.0.0.1", "10.0.0.2", 3)
	if after := strings.Count(buf.String(), "ipoib cm data:"); after != before {
		t.Errorf("%d connected-mode trace lines with cm_data_debug_level 0", after-before)
	}
}
