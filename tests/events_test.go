package tests

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
)

// A child created by another shell appears in a blocked `cat events`, with the write
// that made it and who made it; killing the cat ends its read (FUSE interrupt); only
// root may open events, as debugfs.
func TestEventsFollow(t *testing.T) {
	td := treeStart(t, "ev", "")
	waitLink(t, td.ns, "ib0")
	if st, err := os.Stat(td.path("events")); err != nil || st.Mode().Perm() != 0o400 {
		t.Fatalf("events: %v %v, want mode 0400", st, err)
	}
	cat := exec.Command("cat", td.path("events"))
	var catErr strings.Builder
	cat.Stderr = &catErr
	out, err := cat.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// The cat has the file open once the daemon sees a reader: a change before that
	// is not its to see, so the child is made (and, unseen, deleted again) until the
	// line arrives; a write that is refused (the child exists) makes no event.
	var got []string
	deadline := time.After(15 * time.Second)
	created := false
	for k := 0; !created; k++ {
		if k < 50 {
			if k > 0 {
				_, _, _ = td.bash(t, "echo 0x8001 > class/net/ib0/delete_child", nil)
			}
			_, _, _ = td.bash(t, "echo 0x8001 > class/net/ib0/create_child", nil)
		}
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("cat of events ended: %q; got:\n%s", catErr.String(), strings.Join(got, "\n"))
			}
			got = append(got, l)
			created = strings.Contains(l, "ib0.8001: created (parent ib0, pkey 0x8001)")
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no creation line in events; got:\n%s", strings.Join(got, "\n"))
		}
	}
	// The write that made it follows, with who made it.
	for !containsLine(got, `class/net/ib0/create_child: ok; wrote "0x8001\n" as uid=0 via=fuse`) {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("cat of events ended: %q; got:\n%s", catErr.String(), strings.Join(got, "\n"))
			}
			got = append(got, l)
		case <-deadline:
			t.Fatalf("no write line in events; got:\n%s", strings.Join(got, "\n"))
		}
	}
	if err := cat.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cat.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("cat blocked in a read of events did not end when killed")
	}
	// Nobody else may read it.
	as := exec.Command("cat", td.path("events"))
	as.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if b, err := as.CombinedOutput(); err == nil || !strings.Contains(string(b), "Permission denied") {
		t.Errorf("nobody reading events: %v %q", err, b)
	}
}

func containsLine(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// A capture taken during a ping decodes as IPoIB ARP and ICMP in tshark.
func TestCaptureDecodes(t *testing.T) {
	requireE2E(t)
	tshark := testenv.Tool(t, "tshark")
	mntB := treeMountDir(t)
	treeNoMountAt(t, mntB)
	nsA, nsB := netns(t, "cpa"), netns(t, "cpb")
	startDaemon(t, "cpa", "-sm", "127.0.1.95:4791", "-netns", nsA)
	startDaemon(t, "cpb", "-fabric", "127.0.1.95:4791", "-listen", "127.0.1.96:4791", "-netns", nsB, "-mount", mntB)
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	waitTree(t, mntB)
	mustRun(t, "ip", "-n", nsA, "addr", "add", "10.66.0.1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.66.0.2/24", "dev", "ib0")
	es, err := os.ReadDir(mntB + "/class/infiniband")
	if err != nil || len(es) != 1 {
		t.Fatalf("class/infiniband: %v %v", es, err)
	}
	capPath := mntB + "/class/infiniband/" + es[0].Name() + "/ports/1/capture"
	if st, err := os.Stat(capPath); err != nil || st.Mode().Perm() != 0o400 {
		t.Fatalf("capture: %v %v, want mode 0400", st, err)
	}
	f, err := os.Open(capPath)
	if err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(t.TempDir(), "ib.pcap")
	out, err := os.Create(pcap)
	if err != nil {
		t.Fatal(err)
	}
	copied := make(chan error, 1)
	go func() { _, err := io.Copy(out, f); copied <- err }()
	mustRun(t, "ip", "netns", "exec", nsB, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.66.0.1")
	// Closing the file ends the copy at its next read; one more ping wakes it.
	f.Close()
	_, _ = run(t, 10*time.Second, "ip", "netns", "exec", nsB, "ping", "-c", "1", "-W", "1", "10.66.0.1")
	select {
	case <-copied:
	case <-time.After(20 * time.Second):
		t.Fatal("the capture copy did not end after close")
	}
	out.Close()
	for _, c := range []struct{ filter, field, want string }{
		{"arp", "arp.dst.proto_ipv4", "10.66.0.1"},
		{"icmp.type == 8", "ip.dst", "10.66.0.1"},
		{"icmp.type == 0", "ip.src", "10.66.0.1"},
	} {
		dec, err := exec.Command(tshark, "-r", pcap, "-Y", c.filter, "-T", "fields", "-e", c.field).CombinedOutput()
		if err != nil || !strings.Contains(string(dec), c.want) {
			t.Errorf("tshark -Y %q found no %s %s in the capture: %v\n%s", c.filter, c.field, c.want, err, dec)
		}
	}
}
