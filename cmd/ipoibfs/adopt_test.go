package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
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

// A tx_queue_len the device refuses (a TUN's ring cannot grow past what the kernel
// allocates) is not taken: the write gets the device's errno and the engine
// keeps the length the device has, as dev_change_tx_queue_len puts the old one back.
func TestRefusedTxQueueLenIsNotTaken(t *testing.T) {
	eng, ns := bridgeRig(t, "rq", 1)
	brs := startBridges(eng, ns, 1)
	defer brs.close()
	ib0, _ := eng.Interface("ib0")
	dev := brs.device(ib0)
	if dev == nil {
		t.Fatal("ib0 has no device")
	}
	if err := ib0.SetTxQueueLen(2000); err != nil {
		t.Fatalf("tx_queue_len 2000: %v", err)
	}
	err := ib0.SetTxQueueLen(1 << 20)
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		t.Errorf("tx_queue_len %d: %v, want the device's errno", 1<<20, err)
	}
	out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "ib0").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show: %v %s", err, out)
	}
	_, qlen, _ := strings.Cut(string(out), " qlen ")
	if n := ib0.TxQueueLen(); n != 2000 || !strings.HasPrefix(qlen, "2000") {
		t.Errorf("after the refusal: engine %d, device %q; want both 2000", n, out)
	}
}

// ethtool -K on a bond's device: a bond's offloads follow its slaves (no tree file
// sets them), so the change is put back, and ethtool -k, the device's writes and the
// bond agree again.
func TestBondEthtoolFeaturesPutBack(t *testing.T) {
	ethtool := testenv.Tool(t, "ethtool")
	eng, ns := bridgeRig(t, "bf", 1)
	brs := startBridges(eng, ns, 1)
	defer brs.close()
	bonds := startBonds(eng, ns, brs)
	defer bonds.close()
	b, err := bonds.bonds.Create("bond0")
	if err != nil {
		t.Fatal(err)
	}
	dev := bonds.device(b)
	if dev == nil {
		t.Fatal("bond0 has no device")
	}
	shownGRO := func() bool {
		out, err := exec.Command("ip", "netns", "exec", ns, ethtool, "-k", "bond0").CombinedOutput()
		if err != nil {
			t.Fatalf("ethtool -k: %v %s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "generic-receive-offload:"); ok {
				return strings.HasPrefix(strings.TrimSpace(v), "on")
			}
		}
		t.Fatalf("no generic-receive-offload in %s", out)
		return false
	}
	if !b.Features().GRO || !dev.Offloads().GRO || !shownGRO() {
		t.Fatalf("a new bond: GRO %v, its device's writes %v, ethtool -k %v; want on", b.Features().GRO, dev.Offloads().GRO, shownGRO())
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, ethtool, "-K", "bond0", "gro", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K: %v %s", err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !shownGRO() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if shown, writes := shownGRO(), dev.Offloads().GRO; !shown || !writes || !b.Features().GRO {
		t.Errorf("after ethtool -K bond0 gro off: ethtool -k says GRO %v, the device's writes %v, the bond %v; want on, put back",
			shown, writes, b.Features().GRO)
	}
}
