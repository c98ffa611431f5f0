//go:build linux

package kernel

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Devices asking for the namespace's multicast lists at once share reads: callers
// arriving while a read is under way get the next read (one started after they came,
// so it sees any change they were told of), and many callers cost two reads, not one
// each.
func TestGroupListsShareReadsStartedAfterTheCall(t *testing.T) {
	var m monitor
	var reads atomic.Int32
	release := make(chan struct{})
	first := make(chan struct{})
	read := func() (map[int][]netip.Addr, error) {
		n := reads.Add(1)
		if n == 1 {
			close(first)
			<-release // hold the first read until everyone has arrived
		}
		return map[int][]netip.Addr{1: {netip.AddrFrom4([4]byte{224, 0, 0, byte(n)})}}, nil
	}
	got0 := make(chan netip.Addr, 1)
	go func() {
		res, _ := m.groupLists(read)
		got0 <- res[1][0]
	}()
	<-first
	const callers = 50
	var wg sync.WaitGroup
	got := make([]netip.Addr, callers)
	for k := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _ := m.groupLists(read)
			got[k] = res[1][0]
		}()
	}
	for { // every caller waiting on the read under way
		m.gmu.Lock()
		n := m.gWaiters
		m.gmu.Unlock()
		if n == callers {
			break
		}
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if g := <-got0; g != netip.AddrFrom4([4]byte{224, 0, 0, 1}) {
		t.Errorf("the first caller got %v, want the first read's", g)
	}
	if n := reads.Load(); n != 2 {
		t.Errorf("%d reads for 1+%d callers, want 2", n, callers)
	}
	for k, g := range got {
		if g != netip.AddrFrom4([4]byte{224, 0, 0, 2}) {
			t.Errorf("caller %d got %v: a read that may predate its call", k, g)
		}
	}
}
