package ipoib

import (
	"sync"
	"testing"
	"time"
)

// stallHost is a host whose first SetMTU stalls before it takes effect, until another
// SetMTU comes or a while has passed: what the device sees when the push of one
// change is slow and the push of a later change overtakes it.
type stallHost struct {
	fakeHost
	another chan struct{}
	armed   bool // SetMTU counts calls (and stalls the first) once armed
	calls   int
	cmu     sync.Mutex
}

func (h *stallHost) SetMTU(m int) {
	h.cmu.Lock()
	if h.armed {
		h.calls++
	}
	first := h.calls == 1
	if h.calls == 2 {
		close(h.another)
	}
	h.cmu.Unlock()
	if first {
		select {
		case <-h.another:
		case <-time.After(300 * time.Millisecond):
		}
	}
	h.fakeHost.SetMTU(m)
}

// Two MTU changes pushed to the host at once: whatever order the pushes run in, the
// host ends with the engine's MTU. (When each push carried the value of its own
// change, the later change's push could overtake the earlier one and the device kept
// the older MTU for good: a tree write racing an adopted `ip link set mtu`.) The same
// for a bond's device.
func TestHostEndsWithTheEnginesValue(t *testing.T) {
	t.Run("interface", func(t *testing.T) {
		_, nodes := testFabric(t, "", "a")
		i := nodes[0].ib0
		waitFor(t, "carrier", i.Carrier)
		overtake(t, i.AttachHost, i.SetMTU, i.MTU)
	})
	t.Run("bond", func(t *testing.T) {
		b := newBondRig(t, "ib0").bond
		overtake(t, b.AttachHost, b.SetMTU, b.MTU)
	})
}

// overtake attaches a stallHost, sets two MTUs at once, the first one's push stalled,
// and checks that the host ends with the MTU the engine holds.
func overtake(t *testing.T, attach func(Host), set func(int) error, mtu func() int) {
	t.Helper()
	h := &stallHost{another: make(chan struct{})}
	attach(h)
	h.cmu.Lock()
	h.armed = true // the attach's own push does not count
	h.cmu.Unlock()
	// Two values other than the current one (a set to it pushes nothing).
	first, second := mtu()-100, mtu()-200
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = set(first) }() // its push stalls in the host
	waitFor(t, "the first push in the host", func() bool {
		h.cmu.Lock()
		defer h.cmu.Unlock()
		return h.calls == 1
	})
	if err := set(second); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got, want := h.state().mtu, mtu(); got != want {
		t.Fatalf("the host holds MTU %d, the engine %d", got, want)
	}
}

// AttachHost gives a new host the interface's state as the engine holds it: the
// effective offloads (connected mode turns checksum and TSO off whatever was asked),
// IFF_MULTICAST and the administrative state.
func TestAttachHostPushesTheCurrentState(t *testing.T) {
	_, nodes := testFabric(t, "", "a")
	i := nodes[0].ib0
	waitFor(t, "carrier", i.Carrier)
	i.SetFeatures(Features{RxChecksum: true, TxChecksum: true, TSO: true, GRO: true})
	if err := i.SetMode(Connected); err != nil {
		t.Fatal(err)
	}
	i.SetMulticast(false)
	h := &fakeHost{}
	i.AttachHost(h)
	if !h.state().noMcast {
		t.Error("the new host has IFF_MULTICAST, the interface not")
	}
	i.SetMulticast(true) // pushed as it changes
	if h.state().noMcast {
		t.Error("SetMulticast(true) did not reach the host")
	}
	got := h.state()
	if want := i.Features(); got.feat != want || want.TSO {
		t.Errorf("the new host has offloads %+v, the interface %+v", got.feat, want)
	}
	if got.mtu != i.MTU() || !got.up || got.carrier != i.Carrier() {
		t.Errorf("the new host has %+v; the interface MTU %d, up, carrier %v", got, i.MTU(), i.Carrier())
	}
}
