package tests

import (
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"ipoibfs/verbs"
	"ipoibfs/verbs/wire"
)

func writeKey(t *testing.T, mode os.FileMode) string {
	t.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	f := filepath.Join(t.TempDir(), "fabric.key")
	if err := os.WriteFile(f, k, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, mode); err != nil {
		t.Fatal(err)
	}
	return f
}

func readUint(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q", path, b)
	}
	return n
}

// Two daemons sharing a fabric key ping each other; unsigned management packets sent to
// the subnet manager are dropped and each is counted; a third daemon with another key
// never becomes ACTIVE, says why in its log, and is counted too.
func TestFabricKeyEndToEnd(t *testing.T) {
	requireE2E(t)
	key, wrong := writeKey(t, 0o600), writeKey(t, 0o600)
	mA := mountDir(t)
	nsA, nsB, nsC := netns(t, "ka"), netns(t, "kb"), netns(t, "kc")
	const sm = "127.0.1.41:4791"
	startDaemon(t, "ka", "-sm", sm, "-fabric-key", key, "-netns", nsA, "-mount", mA)
	startDaemon(t, "kb", "-fabric", sm, "-listen", "127.0.1.42:4791", "-fabric-key", key, "-netns", nsB)
	waitLink(t, nsA, "ib0")
	waitLink(t, nsB, "ib0")
	waitTree(t, mA)
	mustRun(t, "ip", "-n", nsA, "addr", "add", "10.81.0.1/24", "dev", "ib0")
	mustRun(t, "ip", "-n", nsB, "addr", "add", "10.81.0.2/24", "dev", "ib0")
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "3", "-i", "0.2", "-W", "3", "10.81.0.2")

	failures := filepath.Join(mA, "sm/auth_failures")
	nodes := sh(t, "cat "+mA+"/sm/nodes")
	before := readUint(t, failures)
	// Unsigned management packets, well formed down to the ICRC, to QP0 and QP1 of the SM.
	c, err := net.Dial("udp", sm)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const forged = 40
	for k := range forged {
		mad := make([]byte, 256)
		mad[0], mad[1], mad[2], mad[3] = 1, 0x09, 1, 3 // a control-class Send
		dqp := uint32(k % 2)
		q := uint32(0)
		if dqp == 1 {
			mad[1], mad[2], mad[3] = 0x03, 2, 0x15 // SA Delete
			q = verbs.GSIQKey
		}
		pkt := wire.Packet{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: dqp},
			DETH: wire.DETH{QKey: q, SrcQP: dqp}, Payload: mad}
		if _, err := c.Write(pkt.AppendTo(nil, verbs.GID{}, verbs.GID{})); err != nil {
			t.Fatal(err)
		}
	}
	// QP1 packets from an unknown address are dropped before the MAC check (no route
	// back), so exactly the QP0 half reaches it.
	deadline := time.Now().Add(10 * time.Second)
	for readUint(t, failures) < before+forged/2 {
		if time.Now().After(deadline) {
			t.Fatalf("sm/auth_failures %d -> %d after %d unsigned control messages", before, readUint(t, failures), forged/2)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := sh(t, "cat "+mA+"/sm/nodes"); got != nodes {
		t.Errorf("sm/nodes changed by unsigned messages:\n%s\nwas\n%s", got, nodes)
	}

	// A node with another key.
	dc := startDaemon(t, "kc", "-fabric", sm, "-listen", "127.0.1.43:4791", "-fabric-key", wrong, "-netns", nsC)
	deadline = time.Now().Add(20 * time.Second)
	for !strings.Contains(dc.log.String(), "port 1: not ACTIVE: no valid answer from the subnet manager at "+sm) {
		if time.Now().After(deadline) {
			t.Fatalf("the wrong-key node never said why it is down; log:\n%s", dc.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(dc.log.String(), "a -fabric-key different from the fabric's is the likely cause") {
		t.Errorf("the wrong-key node's log does not name the key:\n%s", dc.log)
	}
	if out, _ := run(t, 5*time.Second, "ip", "-n", nsC, "link", "show", "ib0"); strings.Contains(out, "LOWER_UP") {
		t.Errorf("the wrong-key node has carrier: %s", out)
	}
	if got := sh(t, "cat "+mA+"/sm/nodes"); got != nodes {
		t.Errorf("the wrong-key node was registered:\n%s", got)
	}
	mustRun(t, "ip", "netns", "exec", nsA, "ping", "-c", "2", "-i", "0.2", "-W", "3", "10.81.0.2")
}

// A key file others can read, or a short one, stops the daemon before it starts.
func TestFabricKeyFileChecks(t *testing.T) {
	for _, c := range []struct {
		file string
		want string
	}{
		{writeKey(t, 0o644), "lets group or others read or write the key; chmod 600"},
		{func() string {
			f := filepath.Join(t.TempDir(), "short")
			os.WriteFile(f, []byte("short"), 0o600)
			return f
		}(), "want at least 16 random bytes"},
		{filepath.Join(t.TempDir(), "missing"), "no such file or directory"},
	} {
		out, err := run(t, 20*time.Second, binPath, "-name", "kf", "-mount", "", "-9p", "", "-fabric-key", c.file)
		if err == nil || !strings.Contains(out, c.want) || strings.Contains(out, "endpoint") {
			t.Errorf("-fabric-key %s: %v %q; want a refusal saying %q before anything starts", c.file, err, out, c.want)
		}
	}
}
