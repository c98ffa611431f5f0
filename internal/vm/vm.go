// Package vm boots a small Linux guest under QEMU (TCG, no KVM) whose kernel v9fs client
// mounts a 9P2000.L server listening on the host's loopback, runs a shell script in the
// mounted directory and returns the script's output and exit code. Tests use it to check
// a 9P server against the real Linux client, which this host's kernel lacks.
//
// The guest is Debian's linux-image-6.1.0-*-amd64 kernel (booted uncompressed through its
// PVH entry) with an initramfs written here: busybox-static, the 9p, 9pnet, 9pnet_fd,
// netfs, fscache and virtio-net modules, and an /init script. Networking is QEMU's user
// mode (slirp) with IPv6 off: the guest is 10.0.2.15/24 with no default route and reaches
// the host's 127.0.0.1 as 10.0.2.2; nothing else is contacted. (restrict=on with a
// guestfwd rule would also work, but it carries a single chardev connection opened when
// QEMU starts, and when the server closed it the guest's next access hung instead of
// failing with EIO as it does here.)
//
// The script runs under busybox ash (there is no bash; ash has [[ ]] and $((...)) but no
// arrays) as "/bin/sh /script.sh", so shell diagnostics look like
// "sh: write error: Invalid argument" or "/script.sh: line 3: can't create f: ..." (see
// WriteError). Its output travels over the emulated serial console: fine for up to a few
// hundred KB (140 KB took well under a second), not for bulk data; bytes pass unchanged
// (no \n -> \r\n translation).
package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"ipoibfs/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrMissing is wrapped by errors from Prepare that mean a prerequisite is not installed
// or cannot be fetched (qemu-system-x86_64, busybox-static, the kernel package); tests
// turn these into testenv.Missing.
var ErrMissing = errors.New("vm: missing")

// Image is a prepared guest: kernel, modules and busybox in the cache directory.
type Image struct {
	Dir     string        // kernel-<release> directory in the cache
	Release string        // e.g. 6.1.0-56-amd64
	Kernel  string        // the kernel QEMU boots (uncompressed vmlinux, PVH entry)
	QEMU    string        // path of qemu-system-x86_64
	Timeout time.Duration // per Run if ctx has no deadline; default 3 minutes
	// Append is added to the kernel command line.
	Append string
	// MountOptions are added to the guest's 9p mount options (e.g. "access=user").
	MountOptions string
	// Copy lists host files Run copies into the guest at the same path, as Guest.Copy.
	Copy []string

	busybox string   // path of the cached static busybox
	applets []string // busybox --list
	modules []string // in load order
}

// CacheDir is where Prepare keeps its files: $IPOIBFS_VM_CACHE, else
// $XDG_CACHE_HOME/ipoibfs-vm, else /var/tmp/ipoibfs-vm.
func CacheDir() string {
	if d := os.Getenv("IPOIBFS_VM_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "ipoibfs-vm")
	}
	return "/var/tmp/ipoibfs-vm"
}

var prepareMu sync.Mutex

// Prepare finds qemu-system-x86_64 and a static busybox, and makes sure the cache holds
// an unpacked kernel: if none is there it downloads the current linux-image-6.1.0-*-amd64
// .deb with "apt-get download" (never installing it), extracts vmlinux and the needed
// modules, and deletes the .deb. Errors for things that are not installed or cannot be
// fetched wrap ErrMissing and name the Debian package to install.
func Prepare() (*Image, error) {
	prepareMu.Lock()
	defer prepareMu.Unlock()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("%w: qemu-system-x86_64 not on PATH (Debian package qemu-system-x86)", ErrMissing)
	}
	bbSrc, err := findBusybox()
	if err != nil {
		return nil, err
	}
	cache := CacheDir()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	// Serialize with other test processes preparing the same cache.
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	bb, err := cacheBusybox(bbSrc, cache)
	if err != nil {
		return nil, err
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %v", bb, err)
	}
	dir := newestKernelDir(cache)
	if dir == "" {
		if dir, err = fetchKernel(cache); err != nil {
			return nil, err
		}
	}
	order, err := os.ReadFile(filepath.Join(dir, "modules.order"))
	if err != nil {
		return nil, err
	}
	rel, err := os.ReadFile(filepath.Join(dir, "release"))
	if err != nil {
		return nil, err
	}
	return &Image{
		Dir:     dir,
		Release: strings.TrimSpace(string(rel)),
		Kernel:  filepath.Join(dir, "vmlinux"),
		QEMU:    qemu,
		busybox: bb,
		applets: strings.Fields(string(list)),
		modules: strings.Fields(string(order)),
	}, nil
}

// findBusybox returns a statically linked busybox (the guest has no libc).
func findBusybox() (string, error) {
	p, err := exec.LookPath("busybox")
	if err != nil {
		return "", fmt.Errorf("%w: busybox not on PATH (Debian package busybox-static)", ErrMissing)
	}
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("busybox %s: %v", p, err)
	}
	defer f.Close()
	for _, ph := range f.Progs {
		if ph.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%w: %s is dynamically linked (Debian package busybox-static)", ErrMissing, p)
		}
	}
	return p, nil
}

// cacheBusybox copies busybox into the cache unless an identical copy is there.
func cacheBusybox(src, cache string) (string, error) {
	dst := filepath.Join(cache, "busybox")
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, b) {
		return dst, nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp, dst)
}

// fetchKernel downloads and unpacks the kernel package into cache/kernel-<release>.
func fetchKernel(cache string) (string, error) {
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%w: %s not on PATH (needed to fetch the kernel package)", ErrMissing, tool)
		}
	}
	pkg, err := kernelPackage()
	if err != nil && os.Geteuid() == 0 {
		// Package lists may be missing on a fresh machine.
		if out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("%w: kernel package linux-image-6.1.0-*-amd64: %v; apt-get update: %v: %s", ErrMissing, err, uerr, out)
		}
		pkg, err = kernelPackage()
	}
	if err != nil {
		return "", fmt.Errorf("%w: kernel package linux-image-6.1.0-*-amd64: %v", ErrMissing, err)
	}
	release := strings.TrimPrefix(pkg, "linux-image-")
	dl, err := os.MkdirTemp(cache, "download-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dl)
	cmd := exec.Command("apt-get", "download", "-q", pkg)
	cmd.Dir = dl
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: kernel package %s: apt-get download: %v: %s", ErrMissing, pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dl, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("%w: kernel package %s: apt-get download left %d .deb files", ErrMissing, pkg, len(debs))
	}
	tmp := filepath.Join(dl, "kernel")
	if err := unpackKernel(debs[0], tmp); err != nil {
		return "", fmt.Errorf("unpack %s: %w", filepath.Base(debs[0]), err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "kernel-"+release)
	os.RemoveAll(dir) // an incomplete leftover
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// initScript is the guest's /init. It loads the modules, configures eth0, mounts the
// server at /mnt and runs /script.sh there with stdout and stderr on the console between
// markers, then powers off. Setup failures print the fail marker.
const initScript = `#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "@@FAIL@@ $*"; dmesg | tail -n 30; poweroff -f; sleep 10; }
for m in @@MODULES@@; do
	insmod /lib/modules/$m.ko || fail "insmod $m"
	if [ $m = virtio_net ]; then
		# Up early, so that the link is up by the time the 9p modules are loaded.
		ip link set lo up
		# No default route: only 10.0.2.0/24 (10.0.2.2 is the host loopback) is reachable.
		ip addr add 10.0.2.15/24 dev eth0 || fail "ip addr add"
		ip link set eth0 up || fail "ip link set eth0 up"
	fi
done
# Without a carrier the qdisc drops packets, and a lost SYN costs a 1 s retransmit.
# virtio-net has its carrier on from the start, so this normally does not wait.
i=0
while [ "$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do
	i=$((i+1))
	[ $i -lt 1000 ] || fail "eth0: no carrier after 10 s"
	sleep 0.01
done
mount -t 9p -o trans=tcp,port=@@PORT@@,version=9p2000.L,msize=262144,cache=none@@MOUNTOPTS@@ 10.0.2.2 /mnt || fail "mount 9p 10.0.2.2:@@PORT@@"
dmesg -n 1
stty -onlcr 2>/dev/null
echo "@@BEGIN@@"
(cd /mnt && exec /bin/sh /script.sh) </dev/null 2>&1
rc=$?
echo
echo "@@END@@ $rc"
poweroff -f
sleep 10
`

// Run boots the guest, mounts the 9P2000.L server listening on the host's 127.0.0.1:port
// at /mnt (mount -t 9p -o trans=tcp,port=PORT,version=9p2000.L,msize=262144,cache=none
// 10.0.2.2 /mnt), runs script with busybox sh in /mnt (stdin /dev/null, stderr merged
// into stdout) and powers off. It returns the script's output and exit status. err is
// non-nil only if the guest did not get to report the exit status (boot or mount
// failure, timeout, cancellation); it then includes the guest's serial console.
func (im *Image) Run(ctx context.Context, port int, script string) (out string, code int, err error) {
	if port <= 0 || port > 65535 {
		return "", -1, fmt.Errorf("vm: bad port %d", port)
	}
	write := func(initrd, begin, end, failm string) error {
		return im.writeInitrd(initrd, port, script, begin, end, failm)
	}
	// ipv6=off: no router advertisement, so the guest has no IPv6 route either.
	return im.boot(ctx, write, 256, "-netdev", "user,id=n0,ipv6=off", "-device", "virtio-net-pci,netdev=n0,romfile=")
}

// boot writes an initramfs with write (given the markers its /init prints around the
// script's output and on a setup failure), boots it with memMB of memory and the extra
// QEMU arguments, and returns what the script printed and its exit status; err is
// non-nil only if the guest did not get to report the exit status (boot or setup
// failure, timeout, cancellation), and then includes the serial console.
func (im *Image) boot(ctx context.Context, write func(initrd, begin, end, failm string) error, memMB int, extra ...string) (out string, code int, err error) {
	if _, ok := ctx.Deadline(); !ok {
		d := im.Timeout
		if d == 0 {
			d = 3 * time.Minute
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	tmp, err := os.MkdirTemp("", "ipoibfs-vm-")
	if err != nil {
		return "", -1, err
	}
	defer os.RemoveAll(tmp)

	nonce := make([]byte, 8)
	rand.Read(nonce)
	tag := "IPOIBFS-" + hex.EncodeToString(nonce)
	begin, end, failm := "<<"+tag+"-BEGIN>>", "<<"+tag+"-END>>", "<<"+tag+"-FAIL>>"
	initrd := filepath.Join(tmp, "initrd")
	if err := write(initrd, begin, end, failm); err != nil {
		return "", -1, err
	}

	args := append([]string{
		"-nodefaults", "-no-user-config", "-display", "none",
		"-M", "pc", "-accel", "tcg", "-smp", "1", "-m", strconv.Itoa(memMB),
		"-no-reboot",
		"-serial", "stdio",
		"-kernel", im.Kernel, "-initrd", initrd,
		"-append", strings.TrimSpace("console=ttyS0 panic=-1 quiet " + im.Append),
	}, extra...)
	cmd := exec.CommandContext(ctx, im.QEMU, args...)
	var console testenv.Buffer
	var stderr bytes.Buffer
	cmd.Stdout = &console
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()

	con := console.String()
	if i := strings.Index(con, failm); i >= 0 {
		return "", -1, fmt.Errorf("vm: guest setup failed: %s\nconsole:\n%s", firstLine(con[i+len(failm):]), con)
	}
	out, code, ok := parseOutput(con, begin, end)
	if ok {
		return out, code, nil
	}
	why := "guest powered off without reporting the script's exit status"
	switch {
	case ctx.Err() != nil:
		why = "timed out or cancelled (" + ctx.Err().Error() + ")"
	case runErr != nil:
		why = "qemu: " + runErr.Error()
	}
	if stderr.Len() > 0 {
		why += "\nqemu stderr: " + strings.TrimSpace(stderr.String())
	}
	return out, -1, fmt.Errorf("vm: %s\nconsole:\n%s", why, con)
}

// parseOutput extracts the script output between the begin marker line and the end
// marker (preceded by one newline /init adds) and the exit status after the end marker.
func parseOutput(con, begin, end string) (out string, code int, ok bool) {
	i := strings.Index(con, begin+"\n")
	if i < 0 {
		return "", -1, false
	}
	rest := con[i+len(begin)+1:]
	j := strings.Index(rest, "\n"+end+" ")
	if j < 0 {
		return rest, -1, false
	}
	m := regexp.MustCompile(`^ ([0-9]+)`).FindStringSubmatch(rest[j+len(end)+1:])
	if m == nil {
		return rest[:j], -1, false
	}
	code, _ = strconv.Atoi(m[1])
	return rest[:j], code, true
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimLeft(s, " "), "\n")
	return strings.TrimSpace(s)
}

// writeInitrd writes an uncompressed newc initramfs (no decompression work for the
// emulated CPU) with /init, /script.sh, busybox with its applet links, and the modules.
func (im *Image) writeInitrd(path string, port int, script, begin, end, failm string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := newCPIOWriter(f)
	t := newInitrdTree(w)
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "mnt", "tmp", "lib", "lib/modules"} {
		t.mkdir(d)
	}
	if err := im.writeBase(w); err != nil {
		return err
	}
	for _, p := range im.Copy {
		if err := t.copyIn(p); err != nil {
			return err
		}
	}
	for _, m := range im.modules {
		ko, err := os.ReadFile(filepath.Join(im.Dir, "modules", m+".ko"))
		if err != nil {
			return err
		}
		w.File("lib/modules/"+m+".ko", 0o644, ko)
	}
	init := strings.NewReplacer(
		"@@MODULES@@", strings.Join(im.modules, " "),
		"@@PORT@@", strconv.Itoa(port),
		"@@MOUNTOPTS@@", mountOpts(im.MountOptions),
		"@@BEGIN@@", begin,
		"@@END@@", end,
		"@@FAIL@@", failm,
	).Replace(initScript)
	w.File("init", 0o755, []byte(init))
	w.File("script.sh", 0o644, []byte(script))
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}

func mountOpts(extra string) string {
	if extra == "" {
		return ""
	}
	return "," + extra
}

// WriteError is the line busybox ash prints to stderr when the write(2) of its echo
// builtin fails with errno, e.g. `echo 1 > file` whose write returns EINVAL prints
// "sh: write error: Invalid argument" and sets $? to 1. The text after the colon is the C
// library's strerror (Go's text with the first letter upper-cased; checked for EINVAL,
// ENODEV, ENOTUNIQ: "Name not unique on network").
//
// Other shapes seen in the guest (busybox 1.35):
//   - the external applet, /bin/echo 1 > file: "echo: write error: Invalid argument"
//   - the printf builtin prints nothing on a write error, but $? is 1
//   - a failing open of the redirect (e.g. Tlopen returns EROFS):
//     "/script.sh: line 3: can't create file: Read-only file system"
//   - dd: "dd: error writing 'file': Invalid argument"
func WriteError(errno syscall.Errno) string {
	s := errno.Error()
	if s != "" {
		s = strings.ToUpper(s[:1]) + s[1:]
	}
	return "sh: write error: " + s
}

// writeBase adds what every initramfs has: users (so that ls -l and id show names,
// and scripts can `su user -c ...` as uid 1000), the console and null devices, and
// busybox with its applets. The directories bin, dev and etc must exist.
func (im *Image) writeBase(w *cpioWriter) error {
	w.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/:/bin/sh\nuser:x:1000:1000:user:/tmp:/bin/sh\n"))
	w.File("etc/group", 0o644, []byte("root:x:0:\nuser:x:1000:\n"))
	w.CharDev("dev/console", 0o600, 5, 1)
	w.CharDev("dev/null", 0o666, 1, 3)
	bb, err := os.ReadFile(im.busybox)
	if err != nil {
		return err
	}
	w.File("bin/busybox", 0o755, bb)
	for _, a := range im.applets {
		if a != "busybox" && !strings.Contains(a, "/") {
			w.Symlink("bin/"+a, "busybox")
		}
	}
	return nil
}
