// Package testenv checks test prerequisites (root, FUSE, TUN, network namespaces,
// external tools). Outside CI a missing prerequisite skips the test; when the CI
// environment variable is set it fails the test with a message, so nothing is skipped
// silently where the suite is supposed to prove everything.
package testenv

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// InCI reports whether the CI environment variable is set to a non-empty value.
func InCI() bool { return os.Getenv("CI") != "" }

// Missing skips the test, or fails it under CI, naming the missing prerequisite.
func Missing(t testing.TB, what string) {
	t.Helper()
	if InCI() {
		t.Fatalf("prerequisite missing under CI: %s (the README test command installs it)", what)
	}
	t.Skipf("prerequisite missing: %s", what)
}

// Tool returns the path of an executable on PATH, or skips/fails via Missing.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "tool "+name+" not on PATH")
	}
	return p
}

// Root requires that the test runs as root.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root privileges")
	}
}

// File requires that a path exists (a device node, a shared tool directory).
func File(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, path+": "+err.Error())
	}
}

// Short skips a long test under -short outside CI. CI never passes -short: there it
// fails instead, so the suite cannot lose its long tests quietly.
func Short(t testing.TB, why string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	if InCI() {
		t.Fatalf("-short under CI would skip this test (%s); CI runs the whole suite", why)
	}
	t.Skipf("%s; skipped with -short", why)
}

// InNetns runs fn on an OS thread that entered the named network namespace and returns
// what it returns (a socket it opened stays in that namespace); the thread is discarded
// afterwards instead of returning to the scheduler in the wrong namespace.
func InNetns(t testing.TB, name string, fn func() (int, error)) int {
	t.Helper()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(h); err != nil {
			ch <- result{-1, err}
			return
		}
		fd, err := fn()
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("in netns %s: %v", name, r.err)
	}
	return r.fd
}
