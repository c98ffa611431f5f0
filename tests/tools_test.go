package tests

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs/sysfs"

	"ipoibfs/internal/testenv"
)

// ibstat (infiniband-diags, through libibumad's sysfs reader) prints the soft HCA in
// full under `ipoibfs exec`.
func TestExecIbstat(t *testing.T) {
	testenv.Tool(t, "ibstat")
	td := treeStart(t, "ibstat", "")
	guid := strings.TrimSpace(strings.ReplaceAll(mustRun(t, "cat", td.path("class/infiniband/tree-ibstat/node_guid")), ":", ""))
	out, stderr, code := td.exec(t, "-tree", td.mnt, "--", "ibstat")
	if code != 0 {
		t.Fatalf("ibstat under exec: exit %d, stderr %q, stdout %q", code, stderr, out)
	}
	for _, want := range []string{
		"CA 'tree-ibstat'\n",
		"\tCA type: ipoibfs-soft\n",
		"\tNumber of ports: 1\n",
		"\tFirmware version: 1.0.0\n",
		"\tHardware version: 0\n",
		"\tNode GUID: 0x" + guid + "\n",
		"\tSystem image GUID: 0x" + guid + "\n",
		"\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 40\n\t\tBase lid: 1\n\t\tLMC: 0\n\t\tSM lid: 1\n",
		"\t\tLink layer: InfiniBand\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ibstat output lacks %q:\n%s", want, out)
		}
	}
}

// node_exporter's parser (prometheus/procfs) reads the tree as a sysfs mount and sees
// the port counters, which move with a ping over ib0.
func TestProcfsReadsPortCounters(t *testing.T) {
	requireE2E(t)
	td := treeStart(t, "prom", "")
	fs, err := sysfs.NewFS(td.mnt)
	if err != nil {
		t.Fatal(err)
	}
	read := func() (xmitPkts, xmitBytes uint64) {
		t.Helper()
		ib, err := fs.InfiniBandClass()
		if err != nil {
			t.Fatalf("procfs InfiniBandClass: %v", err)
		}
		dev, ok := ib["tree-prom"]
		if !ok {
			t.Fatalf("procfs sees no device tree-prom: %v", ib)
		}
		if dev.HCAType != "ipoibfs-soft" || dev.BoardID != "IPOIBFS_0000000001" || dev.FirmwareVersion != "1.0.0" {
			t.Errorf("procfs device facts: %+v", dev)
		}
		p, ok := dev.Ports[1]
		if !ok || p.State != "ACTIVE" || p.Rate != 40*125000000 {
			t.Fatalf("procfs port 1: %+v", p)
		}
		c := p.Counters
		if c.PortXmitPackets == nil || c.PortXmitData == nil || c.PortRcvPackets == nil || c.SymbolError == nil {
			t.Fatalf("procfs found no port counters: %+v", c)
		}
		return *c.PortXmitPackets, *c.PortXmitData
	}
	pkts0, bytes0 := read()
	mustRun(t, "ip", "-n", td.ns, "addr", "add", "10.77.0.1/24", "dev", "ib0")
	waitLink(t, td.ns, "ib0")
	// A broadcast ping leaves over the fabric even with no peer to answer it.
	_, _ = run(t, 10*time.Second, "ip", "netns", "exec", td.ns, "ping", "-b", "-c", "3", "-i", "0.2", "-W", "1", "10.77.0.255")
	pkts1, bytes1 := read()
	if pkts1 < pkts0+3 || bytes1 < bytes0+3*84 {
		t.Errorf("port counters after 3 broadcast pings: packets %d -> %d, bytes %d -> %d", pkts0, pkts1, bytes0, bytes1)
	}
}

// node_exporter's netclass parser reads the tree's class/net as it reads /sys/class/net:
// every interface parses, and ib0's link settings, carrier counts and alias are what
// the port and the kernel device say. The alias follows the device both ways (ip link
// set alias, and a write of ifalias).
func TestProcfsReadsNetClass(t *testing.T) {
	requireE2E(t)
	testenv.Tool(t, "ethtool")
	td := treeStart(t, "pnc", "")
	waitLink(t, td.ns, "ib0")
	mustRun(t, "ip", "-n", td.ns, "link", "set", "ib0", "alias", "set by ip")
	waitUntil(t, "the alias ip set in ifalias", func() bool { return readTrim(t, td.path("class/net/ib0/ifalias")) == "set by ip" })
	if err := os.WriteFile(td.path("class/net/ib0/ifalias"), []byte("rack 4, HCA port 1\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the tree's alias on the device", func() bool {
		return strings.Contains(ipOut(t, td.ns, "link", "show", "ib0"), "alias rack 4, HCA port 1")
	})
	fs, err := sysfs.NewFS(td.mnt)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := fs.NetClass()
	if err != nil {
		t.Fatalf("procfs NetClass: %v", err)
	}
	ib0, ok := nc["ib0"]
	if !ok {
		t.Fatalf("procfs sees no ib0: %v", nc)
	}
	var dev struct {
		IfIndex   int64  `json:"ifindex"`
		MTU       int64  `json:"mtu"`
		TxQLen    int64  `json:"txqlen"`
		OperState string `json:"operstate"`
	}
	var devs []json.RawMessage
	if err := json.Unmarshal([]byte(mustRun(t, "ip", "-n", td.ns, "-j", "link", "show", "ib0")), &devs); err != nil || len(devs) != 1 {
		t.Fatalf("ip -j link show ib0: %v", err)
	}
	if err := json.Unmarshal(devs[0], &dev); err != nil {
		t.Fatal(err)
	}
	eth := mustRun(t, "ip", "netns", "exec", td.ns, "ethtool", "ib0")
	for what, c := range map[string]struct {
		got  any
		want any
	}{
		"ifalias":          {ib0.IfAlias, "rack 4, HCA port 1"},
		"speed":            {deref(ib0.Speed), int64(40000)},
		"ethtool speed":    {strings.Contains(eth, "Speed: 40000Mb/s"), true},
		"duplex":           {ib0.Duplex, "full"},
		"type":             {deref(ib0.Type), int64(32)},
		"addr_len":         {deref(ib0.AddrLen), int64(20)},
		"ifindex":          {deref(ib0.IfIndex), dev.IfIndex},
		"mtu":              {deref(ib0.MTU), dev.MTU},
		"tx_queue_len":     {deref(ib0.TxQueueLen), dev.TxQLen},
		"operstate":        {ib0.OperState, strings.ToLower(dev.OperState)},
		"carrier":          {deref(ib0.Carrier), int64(1)},
		"carrier_up_count": {deref(ib0.CarrierUpCount), int64(1)},
		"carrier_changes":  {deref(ib0.CarrierChanges), deref(ib0.CarrierUpCount) + deref(ib0.CarrierDownCount)},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", what, c.got, c.want)
		}
	}
}

// deref is *p, or -1 for nil (a file procfs did not find).
func deref(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}
