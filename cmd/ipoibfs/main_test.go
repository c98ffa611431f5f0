package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The command line follows the conventions of Go tools and daemons: -h is not an
// error, a bad command line exits 2 with the reason, -version prints the build.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		status    int
		stdout    string // substring expected on stdout
		stderr    string // substring expected on stderr
		notStderr string
	}{
		{args: []string{"-h"}, status: exitOK, stderr: "ipoibfs 9p ADDR"},
		{args: []string{"-help"}, status: exitOK, stderr: "-fabric"},
		{args: []string{"-h"}, status: exitOK, stderr: `(default "/run/ipoibfs/tree")`},
		{args: []string{"-version"}, status: exitOK, stdout: "ipoibfs "},
		{args: []string{"-no-such-flag"}, status: exitUsage, stderr: "flag provided but not defined: -no-such-flag"},
		{args: []string{"-ports", "two"}, status: exitUsage, stderr: "invalid value"},
		{args: []string{"extra"}, status: exitUsage, stderr: `unexpected argument "extra" (subcommands: 9p, mount, exec, status, link, reload)`},
		{args: []string{"-sm", "127.0.0.1:1", "-fabric", "127.0.0.1:2"}, status: exitUsage, stderr: "exclude each other"},
		{args: []string{"-sm", "nowhere"}, status: exitUsage, stderr: `-sm "nowhere"`},
		{args: []string{"-fabric", "127.0.0.1:1", "-listen", "x"}, status: exitUsage, stderr: `-listen "x"`},
		{args: []string{"9p"}, status: exitError, stderr: "usage: ipoibfs 9p ADDR"},
		{args: []string{"-ports", "0"}, status: exitUsage, stderr: "-ports 0: an HCA has 1..254 ports"},
		{args: []string{"-ports", "255"}, status: exitUsage, stderr: "-ports 255: an HCA has 1..254 ports"},
		{args: []string{"-mount", "", "-9p", "", "-param", "debug_level"}, status: exitUsage, stderr: `-param "debug_level": want name=value`, notStderr: "subnet manager on"},
		{args: []string{"-netns", "a/b"}, status: exitUsage, stderr: `-netns: invalid network namespace name "a/b"`},
		{args: []string{"-mount", "", "-config", "/nonexistent/ifcfg"}, status: exitUsage, stderr: "-config: stat /nonexistent/ifcfg: no such file or directory"},
		{args: []string{"-mount", "", "-9p", "", "-name", "flagtest", "-partitions", "/nonexistent/p.conf"}, status: exitError, stderr: "-partitions: open /nonexistent/p.conf"},
		{args: []string{"status", "-nosuch"}, status: exitUsage, stderr: "flag provided but not defined"},
		{args: []string{"link", "-tree", "/nonexistent", "frobnicate"}, status: exitUsage, stderr: `unknown command "frobnicate"`},
	} {
		var out, errb bytes.Buffer
		got := cli(tc.args, strings.NewReader(""), &out, &errb)
		if got != tc.status {
			t.Errorf("ipoibfs %s: exit %d, want %d (stderr %q)", strings.Join(tc.args, " "), got, tc.status, errb.String())
		}
		if !strings.Contains(out.String(), tc.stdout) {
			t.Errorf("ipoibfs %s: stdout %q lacks %q", strings.Join(tc.args, " "), out.String(), tc.stdout)
		}
		if !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("ipoibfs %s: stderr %q lacks %q", strings.Join(tc.args, " "), errb.String(), tc.stderr)
		}
	}
}

// -version names the Go toolchain the binary was built with, from its build
// information (a test binary has some too).
func TestVersionFromBuildInfo(t *testing.T) {
	v := version()
	if !strings.HasPrefix(v, "ipoibfs ") || !strings.Contains(v, "go1.") {
		t.Fatalf("version() = %q, want \"ipoibfs <version> ... go1.N\"", v)
	}
}

// -param follows modprobe: an unknown name is a warning, not a failure; values beyond
// int are ERANGE as the kernel's parameter parser says.
func TestParamFlags(t *testing.T) {
	mp, warn, err := paramFlags{"recv_queue_size=1024", "no_such=1", "debug_level=2"}.build()
	if err != nil || len(warn) != 1 || !strings.Contains(warn[0], "unknown parameter 'no_such' ignored") {
		t.Fatalf("build: %v, warnings %q", err, warn)
	}
	if v, _ := mp.Param("recv_queue_size"); v != "1024\n" {
		t.Errorf("recv_queue_size = %q", v)
	}
	if v, _ := mp.Param("debug_level"); v != "2\n" {
		t.Errorf("debug_level = %q", v)
	}
	for _, bad := range []struct{ kv, want string }{
		{"recv_queue_size=4294967296", "numerical result out of range"},
		{"debug_level=2147483648", "numerical result out of range"},
		{"recv_queue_size=x", "not an integer"},
		{"debug_level", "want name=value"},
	} {
		if _, _, err := (paramFlags{bad.kv}).build(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("-param %s: %v, want an error saying %q", bad.kv, err, bad.want)
		}
	}
}

// The 9P address is checked and opened before anything starts: a non-loopback address
// without -9p-allow, or a unix:PATH that is not a stale socket, fails at once, and a
// file in the way is never deleted.
func TestNinepAddressChecks(t *testing.T) {
	dir := t.TempDir()
	precious := filepath.Join(dir, "precious")
	if err := os.WriteFile(precious, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	for _, tc := range []struct {
		addr, allow, want string
		code              int // a bad flag is a usage error; a socket in the way a failure
	}{
		{"192.0.2.1:5640", "", "is not a loopback address: serving it needs -9p-allow", exitUsage},
		{"127.0.0.1:5640", "bogus", `-9p-allow "bogus"`, exitUsage},
		{"unix:" + precious, "", "exists and is not a socket; not removing it", exitError},
		{"unix:" + live, "", "is served by a running daemon", exitError},
		{"nowhere", "", "want HOST:PORT or unix:PATH", exitUsage},
	} {
		var out, errb bytes.Buffer
		code := cli([]string{"-9p", tc.addr, "-9p-allow", tc.allow, "-mount", "", "-netns", "", "-name", "chk"}, strings.NewReader(""), &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("-9p %s: exit %d, stderr %q; want exit %d saying %q", tc.addr, code, errb.String(), tc.code, tc.want)
		}
	}
	if b, err := os.ReadFile(precious); err != nil || string(b) != "keep me" {
		t.Errorf("the regular file named by -9p unix: was touched: %q, %v", b, err)
	}
	nl, err := listen9P("unix:"+stale, "")
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	nl.close()
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file left after close: %v", err)
	}
}

// The mount command line: ADDR and DIR around options either way, ro and rw honoured,
// mount(8)'s -f (fake) noticed.
func TestMountArgs(t *testing.T) {
	for _, c := range []struct {
		args []string
		want mountSpec
	}{
		{[]string{"-o", "ro,_netdev", "h:5640", "/m"}, mountSpec{addr: "h:5640", dir: "/m", ro: true}},
		{[]string{"h:5640", "/m", "-o", "rw"}, mountSpec{addr: "h:5640", dir: "/m"}},
		{[]string{"h:5640", "/m", "-o", "ro,rw"}, mountSpec{addr: "h:5640", dir: "/m"}},
		{[]string{"-f", "h:5640", "/m", "-oro"}, mountSpec{addr: "h:5640", dir: "/m", ro: true, fake: true}},
	} {
		if got, err := mountArgs(c.args); err != nil || got != c.want {
			t.Errorf("mountArgs(%q) = %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
	if _, err := mountArgs([]string{"h:5640"}); err == nil {
		t.Error("one argument accepted")
	}
	// -f mounts nothing: not even the server is dialled (nobody listens on port 1).
	var out, errb bytes.Buffer
	if code := cli([]string{"mount", "-f", "127.0.0.1:1", t.TempDir()}, strings.NewReader(""), &out, &errb); code != exitOK {
		t.Errorf("ipoibfs mount -f: exit %d, stderr %q", code, errb.String())
	}
}
