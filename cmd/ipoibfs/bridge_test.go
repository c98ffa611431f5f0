package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
	"ipoibfs/ipoib"
	"ipoibfs/ipoib/kernel"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// Once the interfaces have devices, a device that cannot be made (EPERM from the TUN
// driver, as an LSM or a lost capability gives) fails its create_child or bond with
// that errno: the child or bond is not made, and later ones still get devices. (The
// first such failure turned devices off for good, and every later child existed
// without one.)
func TestDeviceRefusedAfterStartFailsItsChild(t *testing.T) {
	eng, ns := bridgeRig(t, "br", 1)
	saved := openDevice
	defer func() { openDevice = saved }()
	openDevice = func(cfg kernel.Config) (*kernel.Device, error) {
		if cfg.Name == "ib0.8001" || cfg.Name == "bond1" {
			return nil, fmt.Errorf("%w: %s: create TUN (needs CAP_NET_ADMIN): %w", kernel.ErrUnavailable, cfg.Name, syscall.EPERM)
		}
		return saved(cfg)
	}
	brs := startBridges(eng, ns, 1)
	defer brs.close()
	bonds := startBonds(eng, ns, brs)
	defer bonds.close()
	ib0, _ := eng.Interface("ib0")
	if brs.device(ib0) == nil {
		t.Fatal("ib0 has no device")
	}
	if _, err := ib0.CreateChild(0x8001); !errors.Is(err, syscall.EPERM) {
		t.Errorf("create_child whose device is refused: %v, want EPERM", err)
	}
	if _, ok := eng.Interface("ib0.8001"); ok {
		t.Error("ib0.8001 exists without its device")
	}
	c, err := ib0.CreateChild(0x8002)
	if err != nil {
		t.Fatal(err)
	}
	if brs.device(c) == nil {
		t.Error("after one refused device, ib0.8002 was made without one")
	}
	if _, err := bonds.bonds.Create("bond1"); !errors.Is(err, syscall.EPERM) {
		t.Errorf("a bond whose device is refused: %v, want EPERM", err)
	}
	if _, ok := bonds.bonds.Bond("bond1"); ok {
		t.Error("bond1 exists without its device")
	}
	b, err := bonds.bonds.Create("bond2")
	if err != nil {
		t.Fatal(err)
	}
	bonds.mu.Lock()
	made := bonds.m[b] != nil
	bonds.mu.Unlock()
	if !made {
		t.Error("after one refused device, bond2 was made without one")
	}
	if err := ib0.DeleteChild(0x8002); err != nil {
		t.Error(err)
	}
}

// A port interface whose device cannot be made at startup (its name taken, say) is
// not left without one: it is tried again until it is made.
func TestPortDeviceRetriedAfterStartup(t *testing.T) {
	eng, ns := bridgeRig(t, "bp", 2)
	saved := openDevice
	defer func() { openDevice = saved }()
	var refused atomic.Int32
	openDevice = func(cfg kernel.Config) (*kernel.Device, error) {
		if cfg.Name == "ib1" && refused.Add(1) == 1 {
			return nil, fmt.Errorf("kernel bridge: %s: %w", cfg.Name, kernel.ErrExists)
		}
		return saved(cfg)
	}
	brs := startBridges(eng, ns, 1)
	defer brs.close()
	ib0, _ := eng.Interface("ib0")
	ib1, _ := eng.Interface("ib1")
	if brs.device(ib0) == nil {
		t.Fatal("ib0 has no device")
	}
	for deadline := time.Now().Add(20 * time.Second); brs.device(ib1) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ib1's device, refused once at startup, was not made again (%d tries)", refused.Load())
		}
	}
}

// bridgeRig is an engine on a soft HCA with ports ports, all active, and a network
// namespace for its devices, removed at cleanup (with the log silenced meanwhile).
func bridgeRig(t *testing.T, name string, ports int) (*ipoib.Engine, string) {
	t.Helper()
	testenv.Root(t)
	testenv.File(t, "/dev/net/tun")
	testenv.Tool(t, "ip")
	ns := fmt.Sprintf("ipo%s%d", name, os.Getpid()%100000)
	_ = exec.Command("ip", "netns", "del", ns).Run()
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	log.SetOutput(io.Discard)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	h, err := soft.New(soft.Config{Name: name, Ports: ports, Network: soft.NewMemNetwork(), HostSM: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	for deadline := time.Now().Add(20 * time.Second); h.SoftPort(ports).Attr().State != verbs.PortActive; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("port %d not active", ports)
		}
	}
	eng, err := ipoib.New(h, ipoib.Options{Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	return eng, ns
}
