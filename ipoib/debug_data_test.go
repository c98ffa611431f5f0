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
