package main

import (
	"errors"
	"log"
	"os"
	"sync"

	"ipoibfs/ipoib"
	"ipoibfs/ipoib/kernel"
)

// bridge connects one engine interface to its TUN device: the device is the
// interface's Host (received packets, MTU, carrier, offloads) and a reader goroutine
// feeds what the kernel sends out of the device into Interface.Transmit.
type bridge struct {
	i    *ipoib.Interface
	dev  *kernel.Device
	done chan struct{}
}

func openBridge(i *ipoib.Interface, netns string) (*bridge, error) {
	f := i.Features()
	dev, err := kernel.Open(kernel.Config{Name: i.Name(), MTU: i.MTU(), NetNS: netns,
		Offloads: kernel.Offloads{Checksum: f.Checksum, TSO: f.TSO, GRO: f.GRO}})
	if err != nil {
		return nil, err
	}
	b := &bridge{i: i, dev: dev, done: make(chan struct{})}
	// The kernel must not invent a random link-local address: IPoIB's comes from the GUID.
	if err := dev.SetLinkLocal(i.LinkLocal()); err != nil {
		log.Printf("%s: %v", i.Name(), err)
	}
	i.AttachHost(b)
	if err := dev.SetUp(true); err != nil {
		dev.Close()
		return nil, err
	}
	dev.WatchAddrs(i.SetHostAddrs)
	go b.txLoop()
	return b, nil
}

func (b *bridge) txLoop() {
	defer close(b.done)
	n := b.dev.BatchSize()
	bufs := make([][]byte, n)
	for k := range bufs {
		bufs[k] = make([]byte, 65536)
	}
	sizes := make([]int, n)
	pkts := make([][]byte, n)
	for {
		c, err := b.dev.Read(bufs, sizes)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			log.Printf("%s: read from the kernel: %v", b.i.Name(), err)
			continue
		}
		for k := 0; k < c; k++ {
			pkts[k] = bufs[k][:sizes[k]]
		}
		b.i.Transmit(pkts[:c])
	}
}

func (b *bridge) close() {
	b.i.AttachHost(nil)
	b.dev.Close()
	<-b.done
}

// Host methods: errors are logged, the data path goes on.

func (b *bridge) Deliver(pkts [][]byte) {
	if _, err := b.dev.Write(pkts); err != nil && !errors.Is(err, os.ErrClosed) {
		log.Printf("%s: write to the kernel: %v", b.i.Name(), err)
	}
}

func (b *bridge) SetMTU(mtu int) {
	if err := b.dev.SetMTU(mtu); err != nil {
		log.Printf("%s: %v", b.i.Name(), err)
	}
}

func (b *bridge) SetCarrier(on bool) {
	if err := b.dev.SetCarrier(on); err != nil {
		log.Printf("%s: %v", b.i.Name(), err)
	}
}

func (b *bridge) SetOffloads(f ipoib.Features) {
	if err := b.dev.SetOffloads(kernel.Offloads{Checksum: f.Checksum, TSO: f.TSO, GRO: f.GRO}); err != nil {
		log.Printf("%s: %v", b.i.Name(), err)
	}
}

// bridges keeps one bridge per engine interface, following interfaces as they are
// created and deleted. When the kernel bridge is unavailable it says why once and the
// engine runs without it.
type bridges struct {
	e     *ipoib.Engine
	netns string
	mu    sync.Mutex
	m     map[string]*bridge
	off   bool
}

func startBridges(e *ipoib.Engine, netns string) *bridges {
	bs := &bridges{e: e, netns: netns, m: map[string]*bridge{}}
	ch, _ := e.Watch()
	bs.sync()
	go func() {
		for range ch {
			bs.sync()
		}
	}()
	return bs
}

// sync opens bridges for new interfaces and closes those of deleted ones.
func (bs *bridges) sync() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	live := map[string]bool{}
	for _, i := range bs.e.Interfaces() {
		live[i.Name()] = true
		if bs.m[i.Name()] != nil || bs.off {
			continue
		}
		b, err := openBridge(i, bs.netns)
		if err != nil {
			if errors.Is(err, kernel.ErrUnavailable) {
				log.Printf("kernel bridge off, the engine runs without TUN devices: %v", err)
				bs.off = true
				continue
			}
			log.Printf("%s: %v", i.Name(), err)
			continue
		}
		bs.m[i.Name()] = b
	}
	for name, b := range bs.m {
		if !live[name] {
			b.close()
			delete(bs.m, name)
		}
	}
}

func (bs *bridges) close() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for name, b := range bs.m {
		b.close()
		delete(bs.m, name)
	}
	bs.off = true
}
