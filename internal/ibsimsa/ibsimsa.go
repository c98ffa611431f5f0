// Package ibsimsa runs unmodified OpenSM as a real subnet administrator on an ibsim
// fabric for tests, and relays raw 256-byte SA MADs to it. It wraps the tool kit in
// shared/tools/ibsim-sa (see its README): ibsim 0.10 simulates the fabric on abstract
// unix sockets, OpenSM and the madrelay helper attach to it through the libumad2sim.so
// preload library. No IB hardware, kernel module or IP traffic is involved.
//
// Topology (net.1sw3hca, LIDs as OpenSM assigns them):
//
//	Hca1  port GUID 0x100001  fe80::10:1  LID 1  OpenSM (SM LID)
//	Switch1                               LID 2
//	Hca2  port GUID 0x100003  fe80::10:3  LID 3  madrelay
//	Hca3  port GUID 0x100005  fe80::10:5  LID 4  second member / saquery
//
// ibsim caps port MTU at 2048, and allows at most 10 attached clients at once (OpenSM
// plus each Relay or tool started with Command).
package ibsimsa

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
)

// UMAD2Sim is the preload library that redirects libibumad to ibsim.
const UMAD2Sim = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so"

// MADSize is the size of every MAD the relay carries.
const MADSize = 256

// Node names and OpenSM's port GUID in net.1sw3hca.
const (
	HostSM    = "Hca1"
	HostHca2  = "Hca2"
	HostHca3  = "Hca3"
	smGUIDArg = "0x100001"
)

var instance atomic.Uint64

// Fabric is a running ibsim plus OpenSM.
type Fabric struct {
	dir   string // working copy of ibsim-sa; OpenSM cache, tmp and logs live here too
	sock  string // IBSIM_SOCKNAME
	ibsim *proc
	osm   *proc
	osmN  int // how many times OpenSM was started (log file suffix)
	mu    sync.Mutex
}

// proc is a started daemon whose exit is observed by a goroutine.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(name string, cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs and waits for the exit.
func (p *proc) stop(grace time.Duration) (killed bool) {
	if p == nil || p.exited() {
		return false
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return false
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return true
}

// sharedDir finds shared/tools/ibsim-sa beside the repository root (the directory
// holding go.mod, found by walking up from the working directory).
func sharedDir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatalf("no go.mod above %s", wd)
		}
		root = parent
	}
	dir := filepath.Join(filepath.Dir(root), "shared", "tools", "ibsim-sa")
	if st, err := os.Stat(filepath.Join(dir, "madrelay.c")); err != nil || !st.Mode().IsRegular() {
		testenv.Missing(t, "shared ibsim-sa tool kit at "+dir)
	}
	return dir
}

// copyDir copies the regular files of src (not the prebuilt madrelay) into dst.
func copyDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "madrelay" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if info, err := e.Info(); err == nil && info.Mode()&0o111 != 0 {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, mode); err != nil {
			return err
		}
	}
	return nil
}

// baseEnv is the environment for every fabric process: the caller's, without the
// variables that would switch ibsim to inet sockets, plus the unique socket name.
func (f *Fabric) baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "IBSIM_SERVER_NAME", "IBSIM_SERVER_PORT", "IBSIM_SOCKNAME", "SIM_HOST", "LD_PRELOAD":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "IBSIM_SOCKNAME="+f.sock)
}

// simEnv is baseEnv plus the preload and the attachment node.
func (f *Fabric) simEnv(simHost string) []string {
	return append(f.baseEnv(), "SIM_HOST="+simHost, "LD_PRELOAD="+UMAD2Sim)
}

// Start copies the ibsim-sa kit to a temporary directory, builds madrelay, starts
// ibsim and then OpenSM on Hca1 and waits for SUBNET UP. partitionsConf is the text of
// OpenSM's partitions.conf; "" uses the kit's file (Default=0xffff, ipoib, mtu=5 and
// P1=0x8001, ipoib, both ALL=full). Everything is stopped when the test ends, OpenSM
// first (SIGKILL after 2 s), then ibsim. Missing tools skip the test (fail under CI).
func Start(t testing.TB, partitionsConf string) *Fabric {
	t.Helper()
	testenv.Tool(t, "opensm")
	testenv.Tool(t, "ibsim")
	testenv.Tool(t, "make")
	testenv.Tool(t, "cc") // the kit's Makefile says CC ?= gcc, but make predefines CC=cc
	testenv.File(t, UMAD2Sim)
	testenv.File(t, "/usr/include/infiniband/umad.h")
	src := sharedDir(t)

	f := &Fabric{
		dir:  filepath.Join(t.TempDir(), "ibsim-sa"),
		sock: fmt.Sprintf("ipoibfs%d_%d", os.Getpid(), instance.Add(1)),
	}
	if err := copyDir(src, f.dir); err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
	mk := exec.Command("make", "-s", "madrelay")
	mk.Dir = f.dir
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make madrelay: %v\n%s", err, out)
	}

	t.Cleanup(func() { f.stop(t) })

	// ibsim
	ibsimLog, err := os.Create(filepath.Join(f.dir, "ibsim.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer ibsimLog.Close()
	cmd := exec.Command("ibsim", "-n", "-s", "net.1sw3hca")
	cmd.Dir = f.dir
	cmd.Env = f.baseEnv()
	cmd.Stdout, cmd.Stderr = ibsimLog, ibsimLog
	if f.ibsim, err = startProc("ibsim", cmd); err != nil {
		t.Fatal(err)
	}
	if !waitFor(filepath.Join(f.dir, "ibsim.log"), "Network simulator ready", 10*time.Second, f.ibsim) {
		t.Fatalf("ibsim did not start:\n%s", tail(filepath.Join(f.dir, "ibsim.log"), 20))
	}

	f.StartOpenSM(t, partitionsConf)
	return f
}

// StartOpenSM (re)starts OpenSM with the given partitions.conf text ("" = the kit's
// file) and waits for SUBNET UP, retrying up to three times. A running OpenSM is
// stopped first, so a test can switch partition files (for example mtu=4 for the
// Default partition) on the same fabric. Relays stay attached across the restart.
func (f *Fabric) StartOpenSM(t testing.TB, partitionsConf string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopOSM(t)

	parts := filepath.Join(f.dir, "partitions.conf")
	if partitionsConf != "" {
		parts = filepath.Join(f.dir, fmt.Sprintf("partitions-%d.conf", f.osmN+1))
		if err := os.WriteFile(parts, []byte(partitionsConf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for attempt := 1; attempt <= 3; attempt++ {
		f.osmN++
		logPath := f.OpenSMLogPath()
		out, err := os.Create(logPath + ".stdout")
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("opensm", "-d2", "-f", logPath, "-P", parts, "-g", smGUIDArg, "-s", "0")
		cmd.Dir = f.dir
		cmd.Env = append(f.simEnv(HostSM), "OSM_CACHE_DIR="+f.dir, "OSM_TMP_DIR="+f.dir)
		cmd.Stdout, cmd.Stderr = out, out
		p, err := startProc("opensm", cmd)
		out.Close()
		if err != nil {
			t.Fatal(err)
		}
		f.osm = p
		if waitFor(logPath, "SUBNET UP", 10*time.Second, p) {
			return
		}
		t.Logf("OpenSM attempt %d: no SUBNET UP within 10 s; log tail:\n%s", attempt, tail(logPath, 20))
		f.stopOSM(t)
	}
	t.Fatalf("OpenSM never reached SUBNET UP")
}

// OpenSMLogPath is the log file of the current (latest) OpenSM run.
func (f *Fabric) OpenSMLogPath() string {
	return filepath.Join(f.dir, fmt.Sprintf("osm-%d.log", f.osmN))
}

// OpenSMLog returns the current OpenSM log (for example to look for "ERR 1B11").
func (f *Fabric) OpenSMLog() string {
	b, _ := os.ReadFile(f.OpenSMLogPath())
	return string(b)
}

// Dir is the working directory: the copied kit with the built madrelay, mkmad.py and
// the logs.
func (f *Fabric) Dir() string { return f.dir }

// Command returns a command (saquery, smpquery, ...) attached to node simHost of this
// fabric. Each running one counts against ibsim's 10-client limit.
func (f *Fabric) Command(simHost, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = f.dir
	cmd.Env = f.simEnv(simHost)
	return cmd
}

func (f *Fabric) stopOSM(t testing.TB) {
	if f.osm == nil {
		return
	}
	// OpenSM under umad2sim does not always exit on SIGTERM: 2 s, then SIGKILL.
	if f.osm.stop(2 * time.Second) {
		t.Logf("OpenSM ignored SIGTERM for 2 s; killed")
	}
	f.osm = nil
}

func (f *Fabric) stop(t testing.TB) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.Failed() && f.osm != nil {
		t.Logf("OpenSM log tail (%s):\n%s", f.OpenSMLogPath(), tail(f.OpenSMLogPath(), 40))
	}
	f.stopOSM(t) // before ibsim: with ibsim gone OpenSM blocks on the dead socket
	if f.ibsim != nil {
		f.ibsim.stop(2 * time.Second)
		f.ibsim = nil
	}
}

// waitFor polls path until it contains want, p exits, or the timeout passes.
func waitFor(path, want string, timeout time.Duration, p *proc) bool {
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(want)) {
			return true
		}
		if p.exited() || time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Relay is a long-lived madrelay process attached to one node. It sends MADs to the
// SM LID, QP1, Q_Key 0x80010000, and returns the responses whose TID low 32 bits match.
type Relay struct {
	host   string
	p      *proc
	stdin  io.WriteCloser
	lines  chan string
	stderr *testenv.Buffer
	mu     sync.Mutex
	broken bool
}

// Relay starts madrelay attached to node simHost (SIM_HOST, e.g. "Hca2"). It is closed
// when the test ends, before the fabric stops.
func (f *Fabric) Relay(t testing.TB, simHost string) *Relay {
	t.Helper()
	cmd := f.Command(simHost, filepath.Join(f.dir, "madrelay"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// An explicit pipe, not StdoutPipe: cmd.Wait runs concurrently (in startProc) and
	// would close a StdoutPipe while the reader goroutine still uses it.
	stdout, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	r := &Relay{host: simHost, stdin: stdin, lines: make(chan string, 4), stderr: &testenv.Buffer{}}
	cmd.Stderr = r.stderr
	r.p, err = startProc("madrelay", cmd)
	pw.Close()
	if err != nil {
		stdout.Close()
		t.Fatal(err)
	}
	go func() {
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 4096), 1<<20)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() { r.Close() })
	return r
}

// Timeout bounds one Do call; madrelay itself gives up after about 5 s (1 s timeout,
// 3 retries, plus 1 s).
const Timeout = 15 * time.Second

// ErrClosed is returned by Do after the relay process has gone away or an earlier
// request timed out.
var ErrClosed = errors.New("ibsimsa: relay closed")

// Do sends one MAD (at most 256 bytes; shorter is zero padded by madrelay) and returns
// the 256-byte response. madrelay's "ERR ..." lines (timeouts, send failures) come back
// as errors.
func (r *Relay) Do(mad []byte) ([]byte, error) {
	if len(mad) > MADSize {
		return nil, fmt.Errorf("ibsimsa: MAD of %d bytes, max %d", len(mad), MADSize)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken {
		return nil, fmt.Errorf("%w: an earlier request on %s timed out", ErrClosed, r.host)
	}
	if _, err := io.WriteString(r.stdin, hex.EncodeToString(mad)+"\n"); err != nil {
		return nil, fmt.Errorf("ibsimsa: write to madrelay on %s: %w (stderr: %s)", r.host, err, r.stderr.String())
	}
	select {
	case line, ok := <-r.lines:
		if !ok {
			return nil, fmt.Errorf("%w: madrelay on %s exited (stderr: %s)", ErrClosed, r.host, r.stderr.String())
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "ERR") {
			return nil, fmt.Errorf("ibsimsa: madrelay on %s: %s", r.host, line)
		}
		b, err := hex.DecodeString(line)
		if err != nil || len(b) != MADSize {
			return nil, fmt.Errorf("ibsimsa: bad madrelay output %q", line)
		}
		return b, nil
	case <-time.After(Timeout):
		// A late answer would be taken for the next request's: refuse further use.
		r.broken = true
		return nil, fmt.Errorf("ibsimsa: no answer from madrelay on %s within %v (stderr: %s)", r.host, Timeout, r.stderr.String())
	}
}

// Close ends the relay (closing stdin makes madrelay detach and exit).
func (r *Relay) Close() {
	r.stdin.Close()
	select {
	case <-r.p.done:
	case <-time.After(2 * time.Second):
		_ = r.p.cmd.Process.Kill()
		<-r.p.done
	}
}
