package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// Guest describes a run of RunGuest: a guest without the 9P mount and without a network
// card, for tests of other kernel subsystems (rdma_rxe over a veth pair, for one).
type Guest struct {
	// Modules are loaded with insmod in this order before the script runs; ExtraModules
	// returns such a list.
	Modules []string
	// Copy lists host files copied into the guest at the same path (symbolic links
	// followed). ELF executables and shared objects among them bring along every shared
	// library ldd lists for them, also at the same path.
	Copy []string
	// Files are written into the guest as given.
	Files []File
	// Env is added to the script's environment (NAME=value).
	Env []string
	// MemoryMB is the guest's memory; 0 means 256.
	MemoryMB int
}

// File is a file written into the guest's initramfs.
type File struct {
	Path string // absolute
	Mode os.FileMode
	Data []byte
}

// extraDir is the directory below an Image's Dir that holds modules outside the 9P set,
// with extraDeps listing every module of the kernel package and its dependencies.
const (
	extraDir  = "extra"
	extraDeps = "modules.deps"
)

// ExtraModules makes sure the cache holds the named kernel modules and everything they
// depend on, and returns them all in load order (dependencies first). Modules not yet in
// the cache are read from the kernel package of im.Release, downloaded again with
// "apt-get download" for that (and deleted afterwards); errors that mean the package
// cannot be had wrap ErrMissing.
func (im *Image) ExtraModules(names ...string) ([]string, error) {
	prepareMu.Lock()
	defer prepareMu.Unlock()
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(im.Dir), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	dir := filepath.Join(im.Dir, extraDir)
	if deps, err := readDeps(filepath.Join(dir, extraDeps)); err == nil {
		if order, err := loadOrder(names, deps); err == nil && haveAll(dir, order) {
			return order, nil
		}
	}
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %s not on PATH (needed to fetch the kernel package)", ErrMissing, tool)
		}
	}
	pkg := "linux-image-" + im.Release
	dl, err := os.MkdirTemp(filepath.Dir(im.Dir), "download-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dl)
	cmd := exec.Command("apt-get", "download", "-q", pkg)
	cmd.Dir = dl
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: kernel package %s: apt-get download: %v: %s", ErrMissing, pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dl, pkg+"_*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("%w: kernel package %s: apt-get download left %d .deb files", ErrMissing, pkg, len(debs))
	}
	deps, kos, err := readModules(debs[0], nil)
	if err != nil {
		return nil, err
	}
	order, err := loadOrder(names, deps)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, m := range order {
		want[m] = true
	}
	if _, kos, err = readModules(debs[0], want); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, m := range order {
		if kos[m] == nil {
			return nil, fmt.Errorf("module %s: not in %s", m, filepath.Base(debs[0]))
		}
		if err := os.WriteFile(filepath.Join(dir, m+".ko"), kos[m], 0o644); err != nil {
			return nil, err
		}
	}
	var b strings.Builder
	mods := make([]string, 0, len(deps))
	for m := range deps {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	for _, m := range mods {
		fmt.Fprintf(&b, "%s:%s\n", m, strings.Join(deps[m], ","))
	}
	tmp := filepath.Join(dir, extraDeps+".tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return order, os.Rename(tmp, filepath.Join(dir, extraDeps))
}

func readDeps(path string) (map[string][]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		m, d, _ := strings.Cut(l, ":")
		deps[m] = nil
		if d != "" {
			deps[m] = strings.Split(d, ",")
		}
	}
	return deps, nil
}

func haveAll(dir string, mods []string) bool {
	for _, m := range mods {
		if _, err := os.Stat(filepath.Join(dir, m+".ko")); err != nil {
			return false
		}
	}
	return true
}

// readModules streams the kernel package's data tar and returns every module's
// dependencies, and the contents of the modules in keep.
func readModules(deb string, keep map[string]bool) (map[string][]string, map[string][]byte, error) {
	deps, kos := map[string][]string{}, map[string][]byte{}
	err := eachDebFile(deb, func(h *tar.Header, r io.Reader) error { return addModule(h, r, keep, deps, kos) })
	return deps, kos, err
}

// guestInit is /init for RunGuest: modules, loopback, the script, power off.
const guestInit = `#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "@@FAIL@@ $*"; dmesg | tail -n 30; poweroff -f; sleep 10; }
for m in @@MODULES@@; do
	insmod /lib/modules/extra/$m.ko || fail "insmod $m"
done
ip link set lo up
dmesg -n 1
stty -onlcr 2>/dev/null
@@ENV@@
echo "@@BEGIN@@"
(cd / && exec /bin/sh /script.sh) </dev/null 2>&1
rc=$?
echo
echo "@@END@@ $rc"
poweroff -f
sleep 10
`

// RunGuest boots the guest described by g, runs script with busybox sh in / (stdin
// /dev/null, stderr merged into stdout) and powers off. It returns the script's output
// and exit status; err is non-nil only if the guest did not get to report the exit
// status (setup failure, timeout, cancellation) and then includes the serial console.
// The guest has no network card: only lo and what the script creates.
func (im *Image) RunGuest(ctx context.Context, g Guest, script string) (out string, code int, err error) {
	write := func(initrd, begin, end, failm string) error {
		return im.writeGuestInitrd(initrd, g, script, begin, end, failm)
	}
	mem := g.MemoryMB
	if mem == 0 {
		mem = 256
	}
	return im.boot(ctx, write, mem)
}

var reLdd = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// sharedLibs returns the absolute paths of the shared libraries ldd lists for an ELF
// file with a dynamic section (none for a static executable or a non-ELF file).
func sharedLibs(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, nil // not ELF: a plain file
	}
	dyn := f.Section(".dynamic") != nil
	f.Close()
	if !dyn {
		return nil, nil
	}
	out, err := exec.Command("ldd", path).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %v: %s", path, err, out)
	}
	if bytes.Contains(out, []byte("not found")) {
		return nil, fmt.Errorf("ldd %s: %s", path, out)
	}
	var libs []string
	for _, m := range reLdd.FindAllSubmatch(out, -1) {
		libs = append(libs, string(m[1]))
	}
	return libs, nil
}

func (im *Image) writeGuestInitrd(path string, g Guest, script, begin, end, failm string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := newCPIOWriter(f)
	t := newInitrdTree(w)
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "mnt", "tmp", "lib/modules/extra"} {
		t.mkdir(d)
	}
	if err := im.writeBase(w); err != nil {
		return err
	}
	for _, m := range g.Modules {
		ko, err := os.ReadFile(filepath.Join(im.Dir, extraDir, m+".ko"))
		if err != nil {
			return fmt.Errorf("module %s (not prepared by ExtraModules?): %w", m, err)
		}
		w.File("lib/modules/extra/"+m+".ko", 0o644, ko)
	}
	for _, p := range g.Copy {
		if err := t.copyIn(p); err != nil {
			return err
		}
	}
	for _, fl := range g.Files {
		rel := strings.TrimPrefix(filepath.Clean(fl.Path), "/")
		t.mkdir(filepath.Dir(rel))
		w.File(rel, uint32(fl.Mode.Perm()), fl.Data)
	}
	var env strings.Builder
	for _, e := range g.Env {
		k, v, _ := strings.Cut(e, "=")
		fmt.Fprintf(&env, "export %s='%s'\n", k, strings.ReplaceAll(v, "'", `'\''`))
	}
	init := strings.NewReplacer(
		"@@MODULES@@", strings.Join(g.Modules, " "),
		"@@ENV@@", env.String(),
		"@@BEGIN@@", begin,
		"@@END@@", end,
		"@@FAIL@@", failm,
	).Replace(guestInit)
	w.File("init", 0o755, []byte(init))
	w.File("script.sh", 0o644, []byte(script))
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}

// initrdTree writes directories and host files into an initramfs, each directory once.
type initrdTree struct {
	w      *cpioWriter
	dirs   map[string]bool
	copied map[string]bool
}

func newInitrdTree(w *cpioWriter) *initrdTree {
	return &initrdTree{w: w, dirs: map[string]bool{}, copied: map[string]bool{}}
}

// mkdir writes d and its parents (relative paths) unless written already.
func (t *initrdTree) mkdir(d string) {
	if d == "." || d == "/" || d == "" || t.dirs[d] {
		return
	}
	t.mkdir(filepath.Dir(d))
	t.dirs[d] = true
	t.w.Dir(d, 0o755)
}

// copyIn copies the host file p (absolute; symbolic links followed) to the same path,
// with the shared libraries ldd lists for it.
func (t *initrdTree) copyIn(p string) error {
	p = filepath.Clean(p)
	if t.copied[p] {
		return nil
	}
	t.copied[p] = true
	if !filepath.IsAbs(p) {
		return fmt.Errorf("vm: copy %s: not an absolute path", p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	rel := strings.TrimPrefix(p, "/")
	t.mkdir(filepath.Dir(rel))
	t.w.File(rel, uint32(st.Mode().Perm()), b)
	libs, err := sharedLibs(p)
	if err != nil {
		return err
	}
	for _, l := range libs {
		if err := t.copyIn(l); err != nil {
			return err
		}
	}
	return nil
}
