package main

import (
	"bytes"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
	"ipoibfs/verbs/soft"
)

// The daemon runs on any verbs device as it would on an rdma-core one with -hca: here
// a soft HCA without its extras (plainHCA, as -hca wraps the rdma device) on a fabric
// whose subnet manager is another node's, as OpenSM is for a real HCA. The engine,
// the kernel device (named with -ifname), the tree over 9P and readiness work; the
// tree has no sm/ and the log no soft-HCA lines (endpoints, the fabric key).
func TestDaemonOnAnyDevice(t *testing.T) {
	testenv.Root(t)
	testenv.File(t, "/dev/net/tun")
	testenv.Tool(t, "ip")
	fabric := soft.NewMemNetwork()
	smh, err := soft.New(soft.Config{Name: "any-sm", Network: fabric, HostSM: true})
	if err != nil {
		t.Fatal(err)
	}
	defer smh.Close()
	saved := planDevice
	defer func() { planDevice = saved }()
	planDevice = func(name string) (*hcaPlan, error) {
		h, err := soft.New(soft.Config{Name: "any-" + name, Network: fabric, SM: smh.Endpoint(1)})
		if err != nil {
			return nil, err
		}
		return &hcaPlan{ports: h.NumPorts(), open: func() (daemonHCA, error) { return plainHCA{h}, nil },
			release: func() { h.Close() }}, nil
	}

	var logb testenv.Buffer
	log.SetOutput(&logb)
	defer log.SetOutput(os.Stderr)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	ns := fmt.Sprintf("ipoany%d", os.Getpid()%100000)
	_ = exec.Command("ip", "netns", "del", ns).Run()
	defer exec.Command("ip", "netns", "del", ns).Run()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	done := make(chan error, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run([]string{"-hca", "dev0", "-ifname", "ib0=uib0", "-netns", ns, "-mount", "", "-9p", addr}, &out, &errb)
	}()
	buf := make([]byte, 4096)
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := conn.Read(buf)
	if err != nil {
		select {
		case err := <-done:
			t.Fatalf("the daemon ended: %v; stderr %q; log:\n%s", err, errb.String(), logb.String())
		default:
		}
		t.Fatalf("no READY=1: %v; log:\n%s", err, logb.String())
	}
	stop := func() {
		// run has caught SIGTERM since before READY=1 (and keeps it caught after).
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run after SIGTERM: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("run did not return within 10 s of SIGTERM; log:\n%s", logb.String())
		}
	}
	if msg := string(buf[:n]); !strings.Contains(msg, "READY=1") || !strings.Contains(msg, "STATUS=interfaces uib0; 9P on "+addr) {
		stop()
		t.Fatalf("notification %q", msg)
	}
	if o, err := exec.Command("ip", "-n", ns, "link", "show", "uib0").CombinedOutput(); err != nil {
		t.Errorf("ip -n %s link show uib0: %v %s", ns, err, o)
	}
	ninep := func(op, path string) string {
		var b bytes.Buffer
		if err := ninepCommand([]string{addr, op, path}, strings.NewReader(""), &b); err != nil {
			t.Errorf("9p %s %s: %v", op, path, err)
		}
		return b.String()
	}
	root := ninep("ls", "/")
	if strings.Contains(root, "sm\n") || !strings.Contains(root, "class\n") {
		t.Errorf("tree root:\n%s", root)
	}
	if got := ninep("ls", "class/net"); got != "uib0\n" {
		t.Errorf("class/net: %q, want uib0", got)
	}
	if got := ninep("ls", "class/infiniband"); got != "any-dev0\n" {
		t.Errorf("class/infiniband: %q", got)
	}
	if got := ninep("read", "class/net/uib0/pkey"); got != "0xffff\n" {
		t.Errorf("class/net/uib0/pkey: %q", got)
	}
	stop()
	l2 := logb.String()
	for _, want := range []string{"HCA any-dev0: 1 ports, firmware", "port 1: ", "(InfiniBand, LID ", "uib0: up, hardware address", "interface statistics"} {
		if !strings.Contains(l2, want) {
			t.Errorf("log lacks %q:\n%s", want, l2)
		}
	}
	for _, soft := range []string{"endpoint", "subnet manager on", "fabric unauthenticated"} {
		if strings.Contains(l2, soft) {
			t.Errorf("log has the soft HCA's %q:\n%s", soft, l2)
		}
	}
}
