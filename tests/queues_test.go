package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ipoibfs/internal/testenv"
)

// With -queues 4 ib0 is a multi-queue TUN device with four queues (its children have
// one), and eight parallel
// TCP streams all move data: the kernel sends them out of several of its queues (its
// flow steering follows the queue the daemon wrote each flow's packets to), so a
// queue nobody read would stall the streams on it.
func TestParallelStreamsOverQueues(t *testing.T) {
	requireE2E(t)
	testenv.Tool(t, "iperf3") // before the daemons start
	tc := testenv.Tool(t, "tc")
	mnt := t.TempDir()
	nsA, nsB := twoNodes(t, "127.0.1.101:4791", "127.0.1.102:4791", "10.65.0", "-queues", "4", "-mount", mnt)
	if out := mustRun(t, "ip", "-n", nsA, "-d", "link", "show", "ib0"); !strings.Contains(out, "multi_queue numqueues 4 ") {
		t.Fatalf("ib0 is not a TUN with 4 queues:\n%s", out)
	}
	// A P_Key child's device has one queue (a multi-queue TUN costs megabytes of
	// kernel memory once up).
	if err := os.WriteFile(filepath.Join(mnt, "class/net/ib0/create_child"), []byte("0x8001\n"), 0); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "ip", "-n", nsA, "-d", "link", "show", "ib0.8001"); strings.Contains(out, "multi_queue") {
		t.Fatalf("ib0.8001 is a multi-queue TUN:\n%s", out)
	}
	out := iperf3(t, nsA, nsB, "10.65.0.2", 5298, "-t", "2", "-P", "8")
	var res struct {
		End struct {
			Streams []struct {
				Receiver struct {
					Bytes int64 `json:"bytes"`
				} `json:"receiver"`
			} `json:"streams"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Error != "" || len(res.End.Streams) != 8 {
		t.Fatalf("iperf3 -P 8 did not complete (%v):\n%s", err, out)
	}
	for k, s := range res.End.Streams {
		if s.Receiver.Bytes == 0 {
			t.Errorf("stream %d moved nothing", k+1)
		}
	}
	// The per-queue qdiscs under mq count what the kernel sent out of each queue.
	var qdiscs []struct {
		Kind    string `json:"kind"`
		Parent  string `json:"parent"`
		Packets int64  `json:"packets"`
	}
	js := mustRun(t, tc, "-n", nsA, "-s", "-j", "qdisc", "show", "dev", "ib0")
	if err := json.Unmarshal([]byte(js), &qdiscs); err != nil {
		t.Fatalf("tc -j: %v\n%s", err, js)
	}
	used := 0
	for _, q := range qdiscs {
		if q.Parent != "" && q.Packets > 100 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("8 streams left through %d of ib0's 4 queues:\n%s", used, js)
	}
}
