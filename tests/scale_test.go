package tests

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rssKiB reads a process's resident set size.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Bounds, not timings: 200 children cost at most 128 KiB each (about 58 KiB measured,
// the daemon's fixed costs included: a child that was never used holds no receive
// ring, no segment buffers and no GRO tables, third_party/wireguard/PATCH.md, and runs
// no goroutine), every device is present
// when create_child returns and gone when delete_child returns, and after deleting
// them all the daemon is back within 16 MiB of its size before: what stays is the Go
// runtime's bookkeeping for the peak heap (its span and GC metadata is never returned),
// and a leak of 80 KiB per child would exceed it.
func TestChildrenMemoryBound(t *testing.T) {
	const n = 200
	td := treeStart(t, "mem", "")
	waitLink(t, td.ns, "ib0")
	pid := td.daemon.cmd.Process.Pid
	write := func(file string, k int) {
		if err := os.WriteFile(td.path("class/net/ib0/"+file), []byte(fmt.Sprintf("%#x\n", 0x8000+k)), 0); err != nil {
			t.Fatalf("%s %#x: %v", file, 0x8000+k, err)
		}
	}
	// Warm up once (the first child's code paths and pools), then measure.
	write("create_child", n+1)
	write("delete_child", n+1)
	time.Sleep(3 * time.Second) // let the deferred release of memory run once
	base := rssKiB(t, pid)
	for k := 1; k <= n; k++ {
		write("create_child", k)
	}
	links := treeLinks(t, td.ns)
	if len(links) != n+1 {
		t.Fatalf("%d devices after %d create_child writes returned, want %d", len(links), n, n+1)
	}
	if grown := rssKiB(t, pid) - base; grown > n*128 {
		t.Errorf("%d children grew the daemon by %d KiB, more than 128 KiB each", n, grown)
	} else {
		t.Logf("%d children: +%d KiB (%d KiB each)", n, grown, grown/n)
	}
	for k := 1; k <= n; k++ {
		write("delete_child", k)
	}
	if links := treeLinks(t, td.ns); len(links) != 1 {
		t.Fatalf("devices left after the deletes returned: %v", links)
	}
	var after int
	for deadline := time.Now().Add(15 * time.Second); ; {
		after = rssKiB(t, pid)
		if after-base <= 16*1024 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if after-base > 16*1024 {
		t.Errorf("after deleting %d children the daemon is %d KiB above its size before (%d KiB)", n, after-base, base)
	}
}
