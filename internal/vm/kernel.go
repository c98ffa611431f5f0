package vm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// rootModules are the modules the guest needs; their dependencies (from each module's
// .modinfo "depends=") are added and everything is loaded in dependency order.
// virtio-net rather than e1000: e1000 takes about 1 s longer to probe and get a link
// under TCG, and its first received packet waited about 0.8 s (for the driver's
// watchdog, it seemed). 9pnet_fd provides trans=tcp; v9fs would request_module("9p-tcp")
// for it, but the guest has no modprobe, so it is loaded explicitly.
var rootModules = []string{"virtio_pci", "virtio_net", "9pnet_fd", "9p"}

// cacheFormat is written to a kernel directory in the cache; directories with another
// format (an older module set) are unpacked again.
var cacheFormat = "2 " + strings.Join(rootModules, " ")

// kernelPackage finds the name of the current Debian 6.1 kernel image package, e.g.
// linux-image-6.1.0-56-amd64, from what the linux-image-amd64 metapackage depends on.
func kernelPackage() (string, error) {
	re := regexp.MustCompile(`Depends:\s*(linux-image-[0-9][^\s]*-amd64)\s*$`)
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	if err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if m := re.FindStringSubmatch(l); m != nil {
				return m[1], nil
			}
		}
	}
	// Fallback: the highest-numbered linux-image-6.1.0-N-amd64 apt knows about.
	out, err = exec.Command("apt-cache", "search", "--names-only", `^linux-image-6\.1\.0-[0-9]+-amd64$`).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache search: %v", err)
	}
	reN := regexp.MustCompile(`^linux-image-6\.1\.0-([0-9]+)-amd64 `)
	best, bestN := "", -1
	for _, l := range strings.Split(string(out), "\n") {
		if m := reN.FindStringSubmatch(l); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > bestN {
				best, bestN = strings.Fields(l)[0], n
			}
		}
	}
	if best == "" {
		return "", errors.New("apt-cache knows no linux-image-6.1.0-*-amd64 package")
	}
	return best, nil
}

// modInfo is what a module's .modinfo section says about its name and dependencies.
type modInfo struct {
	name    string
	depends []string
}

// parseModinfo reads the .modinfo section of an ELF kernel module.
func parseModinfo(ko []byte) (modInfo, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return modInfo{}, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return modInfo{}, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return modInfo{}, err
	}
	var mi modInfo
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			mi.name = v
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					mi.depends = append(mi.depends, modName(d))
				}
			}
		}
	}
	return mi, nil
}

// modName normalizes a module name the way the kernel does ('-' and '_' are the same).
func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// loadOrder returns roots plus their transitive dependencies, each after everything it
// depends on. deps maps a module name to its dependencies.
func loadOrder(roots []string, deps map[string][]string) ([]string, error) {
	var order []string
	state := map[string]int{} // 0 unseen, 1 visiting, 2 done
	var visit func(string, []string) error
	visit = func(m string, path []string) error {
		switch state[m] {
		case 1:
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(path, m), " -> "))
		case 2:
			return nil
		}
		d, ok := deps[m]
		if !ok {
			return fmt.Errorf("module %s (needed by %s) not found in the kernel package", m, strings.Join(path, " -> "))
		}
		state[m] = 1
		for _, x := range d {
			if err := visit(x, append(path, m)); err != nil {
				return err
			}
		}
		state[m] = 2
		order = append(order, m)
		return nil
	}
	for _, r := range roots {
		if err := visit(modName(r), nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

var (
	reModule  = regexp.MustCompile(`^(?:\./)?(?:usr/)?lib/modules/([^/]+)/.*/([^/]+)\.ko$`)
	reVmlinuz = regexp.MustCompile(`^(?:\./)?boot/vmlinuz-(.+)$`)
)

// unpackKernel streams the data tar of a linux-image .deb (via dpkg-deb --fsys-tarfile,
// never writing the 400 MB tree to disk) and writes into dir: vmlinux (the uncompressed
// kernel, booted through its PVH entry, which under TCG saves the ~3 s the bzImage
// spends decompressing itself), modules/NAME.ko for the modules
// the guest loads, modules.order (one name a line, in load order) and release.
func unpackKernel(deb, dir string) error {
	keep := map[string]bool{}
	for _, m := range []string{"9p", "9pnet", "9pnet_fd", "netfs", "fscache",
		"virtio", "virtio_ring", "virtio_pci", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
		"virtio_net", "net_failover", "failover"} {
		keep[m] = true
	}
	var (
		deps    map[string][]string
		kos     map[string][]byte
		vmlinuz []byte
		release string
	)
	pass := func() error {
		deps, kos = map[string][]string{}, map[string][]byte{}
		return eachDebFile(deb, func(h *tar.Header, r io.Reader) error {
			if m := reVmlinuz.FindStringSubmatch(h.Name); m != nil {
				release = m[1]
				var err error
				vmlinuz, err = io.ReadAll(r)
				return err
			}
			return addModule(h, r, keep, deps, kos)
		})
	}
	if err := pass(); err != nil {
		return err
	}
	order, err := loadOrder(rootModules, deps)
	if err != nil {
		return err
	}
	var again bool
	for _, m := range order {
		if kos[m] == nil {
			keep[m], again = true, true
		}
	}
	if again { // a dependency outside the usual set: read the package once more
		if err := pass(); err != nil {
			return err
		}
	}
	if vmlinuz == nil {
		return fmt.Errorf("%s has no boot/vmlinuz-*", deb)
	}
	vmlinux, err := extractVmlinux(vmlinuz)
	if err != nil {
		return fmt.Errorf("extract vmlinux from vmlinuz-%s: %w", release, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "modules"), 0o755); err != nil {
		return err
	}
	for _, m := range order {
		if err := os.WriteFile(filepath.Join(dir, "modules", m+".ko"), kos[m], 0o644); err != nil {
			return err
		}
	}
	files := map[string][]byte{
		"vmlinux":       vmlinux,
		"modules.order": []byte(strings.Join(order, "\n") + "\n"),
		"release":       []byte(release + "\n"),
		"format":        []byte(cacheFormat + "\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// extractVmlinux returns the uncompressed ELF kernel inside an x86 bzImage, like the
// kernel's scripts/extract-vmlinux. The boot protocol header (>= 2.08) gives the
// payload's offset and length; the payload is gzip, xz or zstd compressed (Debian uses
// xz). gzip is decompressed in Go, xz and zstd with the xz / zstd tools.
func extractVmlinux(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage (no HdrS boot header)")
	}
	if v := binary.LittleEndian.Uint16(bz[0x206:]); v < 0x208 {
		return nil, fmt.Errorf("boot protocol %#x too old (no payload_offset)", v)
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	base := (setupSects + 1) * 512
	off := base + int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if off < 0 || n <= 0 || off+n > len(bz) {
		return nil, fmt.Errorf("payload %d+%d outside the %d-byte image", off, n, len(bz))
	}
	payload := bz[off : off+n]
	var out []byte
	var err error
	switch {
	case bytes.HasPrefix(payload, []byte{0x1f, 0x8b}):
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(payload)); err == nil {
			zr.Multistream(false)
			out, err = io.ReadAll(zr)
		}
	case bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")):
		// The payload ends with the 4-byte uncompressed size; --single-stream ignores it.
		out, err = runFilter(payload, "xz", "-dc", "--single-stream")
	case bytes.HasPrefix(payload, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		out, err = runFilter(payload, "zstd", "-dcq")
	default:
		return nil, fmt.Errorf("unsupported payload compression (magic % x)", payload[:min(6, len(payload))])
	}
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(out, []byte("\x7fELF")) {
		return nil, errors.New("decompressed payload is not an ELF file")
	}
	return out, nil
}

func runFilter(in []byte, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%w: %s not on PATH, needed to decompress the kernel (Debian package %s-utils or %s)", ErrMissing, name, name, name)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", name, err, stderr.String())
	}
	return out, nil
}

// newestKernelDir returns the complete kernel-* directory of the current cacheFormat
// under cache with the highest Debian ABI number, or "" if none.
func newestKernelDir(cache string) string {
	ents, _ := filepath.Glob(filepath.Join(cache, "kernel-*", ".complete"))
	var dirs []string
	for _, e := range ents {
		f, err := os.ReadFile(filepath.Join(filepath.Dir(e), "format"))
		if err == nil && strings.TrimSpace(string(f)) == cacheFormat {
			dirs = append(dirs, filepath.Dir(e))
		}
	}
	if len(dirs) == 0 {
		return ""
	}
	num := func(d string) int { // kernel-6.1.0-56-amd64 -> 56
		f := strings.Split(filepath.Base(d), "-")
		if len(f) >= 3 {
			n, _ := strconv.Atoi(f[2])
			return n
		}
		return 0
	}
	sort.Slice(dirs, func(i, j int) bool { return num(dirs[i]) < num(dirs[j]) })
	return dirs[len(dirs)-1]
}

// eachDebFile streams the data tar of the Debian package deb and calls fn with every
// regular file, stopping at fn's first error.
func eachDebFile(deb string, fn func(h *tar.Header, r io.Reader) error) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb: %w", err)
	}
	tr := tar.NewReader(bufio.NewReaderSize(pipe, 1<<20))
	var rerr error
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			rerr = err
			break
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if rerr = fn(h, tr); rerr != nil {
			break
		}
	}
	if rerr != nil {
		_ = cmd.Process.Kill()
	} else {
		_, _ = io.Copy(io.Discard, pipe)
	}
	if err := cmd.Wait(); err != nil && rerr == nil {
		rerr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %v: %s", deb, err, stderr.String())
	}
	return rerr
}

// addModule reads a kernel module from the package's tar stream into deps (its
// dependencies, by name) and, when keep names it, kos (its bytes). Anything that is
// not a module is skipped.
func addModule(h *tar.Header, r io.Reader, keep map[string]bool, deps map[string][]string, kos map[string][]byte) error {
	m := reModule.FindStringSubmatch(h.Name)
	if m == nil {
		return nil
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	mi, err := parseModinfo(b)
	if err != nil {
		return fmt.Errorf("%s: %v", h.Name, err)
	}
	name := modName(m[2])
	if mi.name != "" {
		name = modName(mi.name)
	}
	deps[name] = mi.depends
	if keep[name] {
		kos[name] = b
	}
	return nil
}
