package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"ipoibfs/fs/ninep"
	"ipoibfs/internal/testenv"
)

// permGarbage is what the table writes: no parser accepts it, so a write that gets past
// the permission check fails in the engine (EINVAL and the like) and changes nothing.
const permGarbage = "\x01not a value\n"

// permRole runs as one user (the test starts it with that user's credentials): for
// every path on stdin it opens the file for writing, writes permGarbage and closes it,
// then opens it for reading, through target ("fuse:MNT" or "9p:ADDR"), and prints
// "path write-errno read-errno".
func permRole(target string) int {
	kind, where, _ := strings.Cut(target, ":")
	var c *ninep.Client
	if kind == "9p" {
		network, addr := "tcp", where
		if p, ok := strings.CutPrefix(where, "unix:"); ok {
			network, addr = "unix", p
		}
		conn, err := net.Dial(network, addr)
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		if c, err = ninep.NewClient(conn); err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		defer c.Close()
	}
	errnoOf := func(err error) int {
		var e syscall.Errno
		if err == nil {
			return 0
		}
		if errors.As(err, &e) {
			return int(e)
		}
		return -1
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		path := sc.Text()
		var werr, rerr error
		if c != nil {
			werr = c.WriteFile(path, []byte(permGarbage))
			_, rerr = c.ReadFile(path)
		} else {
			full := filepath.Join(where, path)
			f, err := os.OpenFile(full, os.O_WRONLY, 0)
			if err == nil {
				_, err = f.Write([]byte(permGarbage))
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			werr = err
			_, rerr = os.ReadFile(full)
		}
		fmt.Printf("%s %d %d\n", path, errnoOf(werr), errnoOf(rerr))
	}
	return 0
}

// permExe is a copy of the test binary that other users may run.
func permExe(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := treeMountDir(t) // parents traversable by all
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(filepath.Dir(dir), "perm.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// The permission table: for every file of the tree, a write (and a read) as root, as an
// ordinary user and as nobody, over FUSE, 9P on TCP from this host and 9P on a unix
// socket, gives the same errno on every front end for the same user, and the errno
// matches the file's mode: non-root users never write, nobody is refused reading only
// what sysfs refuses everyone.
func TestPermissionTable(t *testing.T) {
	treeRequire(t)
	sock := filepath.Join(filepath.Dir(treeMountDir(t)), "9p.sock")
	tcp := treeStart(t, "ptcp", "")
	// A second daemon of the same name (so the same paths) for the unix socket: -9p
	// takes one address.
	ud := startDaemon(t, "tree-ptcp", "-mount", "", "-9p", "unix:"+sock, "-netns", treeNetns(t, "pu2"))
	for deadline := time.Now().Add(15 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 9P socket at %s; log:\n%s", sock, ud.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var files []string
	err := filepath.WalkDir(tcp.mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(tcp.mnt, p)
			// pkeys/1..63 repeat pkeys/0; one stands for all.
			if strings.Contains(rel, "/pkeys/") && !strings.HasSuffix(rel, "/pkeys/0") {
				return nil
			}
			// events and capture are streams (a read waits for what comes next); their
			// modes are checked in TestEventsFollow and TestCaptureDecodes.
			if rel == "events" || strings.HasSuffix(rel, "/capture") {
				return nil
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 60 {
		t.Fatalf("only %d files in the tree: %v", len(files), files)
	}
	// Files under kernel/debug are root's alone, and the walk as root found them.
	exe := permExe(t)
	type result struct{ write, read int }
	testenv.Tool(t, "setpriv")
	users := []struct {
		name  string
		cred  *syscall.Credential
		noCap bool // root without CAP_NET_ADMIN (setpriv drops it from the bounding set)
	}{
		{"root", nil, false},
		{"root without CAP_NET_ADMIN", nil, true},
		{"uid 1000", &syscall.Credential{Uid: 1000, Gid: 1000}, false},
		{"nobody", &syscall.Credential{Uid: 65534, Gid: 65534}, false},
	}
	// net-sysfs's stores and the driver's create_child/delete_child need CAP_NET_ADMIN,
	// as do ethtool's changes and the fabric's partitions and faults.
	netAdminFile := func(f string) bool {
		switch {
		case f == "link": // named children, as rtnetlink's newlink needs CAP_NET_ADMIN
			return true
		case f == "reload": // the daemon's SIGHUP
			return true
		case f == "sm/partitions", f == "sm/faults", strings.HasSuffix(f, "/ethtool/coalesce"), strings.HasSuffix(f, "/ethtool/features"):
			return true
		}
		base := filepath.Base(f)
		return strings.HasPrefix(f, "class/net/") && filepath.Dir(f) == "class/net/"+strings.Split(f, "/")[2] &&
			(base == "mtu" || base == "flags" || base == "tx_queue_len" || base == "ifalias" || base == "create_child" || base == "delete_child")
	}
	var rootRes map[string]result
	fronts := []string{"fuse:" + tcp.mnt, "9p:" + tcp.addr, "9p:unix:" + sock}
	for _, u := range users {
		got := map[string]map[string]result{}
		for _, front := range fronts {
			cmd := exec.Command(exe)
			if u.noCap {
				cmd = exec.Command("setpriv", "--bounding-set=-net_admin", "--", exe)
			}
			cmd.Env = append(os.Environ(), "IPOIBFS_E2E_ROLE=perm", "IPOIBFS_E2E_ADDR="+front)
			cmd.Stdin = strings.NewReader(strings.Join(files, "\n") + "\n")
			if u.cred != nil {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.cred}
			}
			cmd.Dir = "/"
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s via %s: %v\n%s", u.name, front, err, out)
			}
			res := map[string]result{}
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				var p string
				var r result
				if _, err := fmt.Sscanf(l, "%s %d %d", &p, &r.write, &r.read); err != nil {
					t.Fatalf("%s via %s: bad line %q", u.name, front, l)
				}
				res[p] = r
			}
			got[front] = res
		}
		if u.cred == nil && !u.noCap {
			rootRes = got[fronts[0]]
		}
		for _, f := range files {
			fuse := got[fronts[0]][f]
			for _, front := range fronts[1:] {
				if r := got[front][f]; r != fuse {
					t.Errorf("%s %s: FUSE gives write %v read %v, %s gives write %v read %v",
						u.name, f, syscall.Errno(fuse.write), syscall.Errno(fuse.read), front, syscall.Errno(r.write), syscall.Errno(r.read))
				}
			}
			if u.noCap {
				want := rootRes[f]
				// create_child and delete_child parse before they check (EINVAL for
				// the garbage written, as root gets), the others check first.
				if b := filepath.Base(f); netAdminFile(f) && b != "create_child" && b != "delete_child" {
					want.write = int(syscall.EPERM)
				}
				if fuse != want {
					t.Errorf("%s %s: write %v read %v, want write %v read %v", u.name, f,
						syscall.Errno(fuse.write), syscall.Errno(fuse.read), syscall.Errno(want.write), syscall.Errno(want.read))
				}
				continue
			}
			st, err := os.Stat(filepath.Join(tcp.mnt, f))
			if err != nil {
				t.Fatal(err)
			}
			perm := st.Mode().Perm()
			debug := strings.HasPrefix(f, "kernel/debug/")
			eacces := int(syscall.EACCES)
			switch {
			case u.cred == nil && perm&0o200 == 0 && fuse.write != eacces:
				t.Errorf("root wrote %s (mode %v): %v", f, perm, syscall.Errno(fuse.write))
			case u.cred == nil && perm&0o200 != 0 && fuse.write == eacces:
				t.Errorf("root may not write %s (mode %v)", f, perm)
			case u.cred != nil && fuse.write != eacces:
				t.Errorf("%s writing %s (mode %v): %v, want EACCES", u.name, f, perm, syscall.Errno(fuse.write))
			case u.cred != nil && !debug && perm&0o004 != 0 && fuse.read != 0 && fuse.read != int(syscall.EINVAL):
				t.Errorf("%s reading %s (mode %v): %v", u.name, f, perm, syscall.Errno(fuse.read))
			case (u.cred != nil && (debug || perm&0o004 == 0) || perm&0o444 == 0) && fuse.read != eacces:
				t.Errorf("%s read %s (mode %v, under kernel/debug %v): %v, want EACCES", u.name, f, perm, debug, syscall.Errno(fuse.read))
			}
		}
	}
	// No write by anyone changed anything: the garbage was refused everywhere.
	if got := treeLs(t, tcp.path("class/net")); len(got) != 1 || got[0] != "ib0" {
		t.Errorf("class/net after the table: %v", got)
	}
	if b, _ := os.ReadFile(tcp.path("class/net/ib0/mode")); string(b) != "datagram\n" {
		t.Errorf("mode after the table: %q", b)
	}
}

// The Linux v9fs client in a guest, mounted with access=user: one connection (from the
// host's QEMU process, so root as the host sees it) and one attach per guest user.
// Guest root may write mode; guest uid 1000 reads pkey and is refused writing mode (by
// the guest kernel already, which checks the modes the server reports; the server's own
// refusal of such a user is what TestPermissionTable shows).
// With or without -9p-trust-uname the same: the guest arrives over loopback, so the
// kernel-reported owner (root) decides that its attaches may name users, and a user
// other than root is read-only either way.
func TestGuestAccessUser(t *testing.T) {
	treeRequire(t)
	im := guestImage(t)
	guest := *im
	guest.MountOptions = "access=user"
	const script = `cat class/net/ib0/pkey
su user -s /bin/sh -c 'id -u; cat class/net/ib0/pkey; echo connected > class/net/ib0/mode; echo "user: exit $?"'
echo connected > class/net/ib0/mode; echo "root: exit $?"
cat class/net/ib0/mode
`
	const want = "0xffff\n1000\n0xffff\nsh: can't create class/net/ib0/mode: Permission denied\nuser: exit 1\nroot: exit 0\nconnected\n"
	for _, trust := range []bool{true, false} {
		var extra []string
		tag := "gau0"
		if trust {
			extra, tag = []string{"-9p-trust-uname"}, "gau1"
		}
		td := treeStart(t, tag, "", extra...)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, code, err := guest.Run(ctx, td.port, script)
		cancel()
		if err != nil {
			t.Fatalf("guest (trust-uname %v): %v", trust, err)
		}
		if code != 0 || out != want {
			t.Errorf("guest with access=user (trust-uname %v): exit %d, transcript (-want +got):\n%s", trust, code, cmp.Diff(want, out))
		}
	}
}

// CAP_NET_ADMIN is the writer's, checked at the write, as the driver's stores check
// capable() when they run: a descriptor of create_child opened by root and handed to
// root without the capability (setpriv drops it) creates nothing, and the log names
// the writer's pid; the same descriptor still works for its opener.
func TestCapabilityIsTheWritersAtTheWrite(t *testing.T) {
	testenv.Tool(t, "setpriv")
	td := treeStart(t, "pcap", "")
	f, err := os.OpenFile(td.path("class/net/ib0/create_child"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("setpriv", "--bounding-set=-net_admin", "--", "sh", "-c", "printf 0x8005 >&3")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a write without CAP_NET_ADMIN through root's descriptor succeeded: %s", out)
	}
	if got := treeLs(t, td.path("class/net")); len(got) != 1 {
		t.Fatalf("class/net after the refused write: %v", got)
	}
	if _, err := f.Write([]byte("0x8006")); err != nil {
		t.Fatalf("the opener's own write: %v", err)
	}
	if got := treeLs(t, td.path("class/net")); len(got) != 2 {
		t.Fatalf("class/net after the opener's write: %v", got)
	}
	refused := regexp.MustCompile(fmt.Sprintf(`create_child: CAP_NET_ADMIN is needed \(EPERM\); wrote \\?"0x8005\\?" as uid=0 via=fuse peer=\\?"pid %d \(sh\)\\?"`, cmd.Process.Pid))
	if !refused.MatchString(td.log.String()) {
		t.Errorf("the refusal is not logged with the writer's pid %d:\n%s", cmd.Process.Pid, td.log.String())
	}
}

// Over the FUSE mount, root's chmod and chown of a tree file fail with EPERM (the
// tree's modes are fixed; it does not report a change it did not make) and the mode
// stays; truncating works, as `echo x > file` needs.
func TestChmodIsRefusedTruncateIsNot(t *testing.T) {
	td := treeStart(t, "pchm", "")
	p := td.path("class/net/ib0/pkey")
	if err := os.Chmod(p, 0o666); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chmod 0666 pkey: %v, want EPERM", err)
	}
	if err := os.Chown(p, 1000, 1000); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chown 1000 pkey: %v, want EPERM", err)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o444 {
		t.Errorf("pkey's mode after the chmod: %v %v", st.Mode(), err)
	}
	if err := os.Truncate(td.path("class/net/ib0/mtu"), 0); err != nil {
		t.Errorf("truncate mtu: %v", err)
	}
	// As on sysfs, root truncates and touches even a read-only file (nothing changes);
	// nobody may not.
	if err := os.Truncate(p, 0); err != nil {
		t.Errorf("root's truncate of pkey (0444): %v, want success as on sysfs", err)
	}
	if out, err := exec.Command("touch", p).CombinedOutput(); err != nil {
		t.Errorf("root's touch of pkey: %v %s", err, out)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "0xffff\n" {
		t.Errorf("pkey after the truncate: %q %v", b, err)
	}
	_, stderr, code := td.bash(t, "touch class/net/ib0/mtu", &syscall.Credential{Uid: 65534, Gid: 65534})
	if code == 0 || !strings.Contains(stderr, "Permission denied") {
		t.Errorf("nobody's touch of mtu: exit %d, stderr %q; want Permission denied", code, stderr)
	}
}

// Over the FUSE mount, a user other than root with CAP_DAC_OVERRIDE (a service with
// AmbientCapabilities=) writes what it may write on sysfs: the kernel's own check of
// the modes counts the capability, and the tree does not refuse it again. Without the
// capability the same user is refused.
func TestDACOverrideOfAnotherUserOverFUSE(t *testing.T) {
	testenv.Tool(t, "setpriv")
	td := treeStart(t, "pdac", "")
	txq := td.path("class/net/ib0/tx_queue_len")
	run := func(caps string) ([]byte, error) {
		args := []string{"--reuid=1000", "--regid=1000", "--clear-groups"}
		if caps != "" {
			args = append(args, "--inh-caps="+caps, "--ambient-caps="+caps)
		}
		args = append(args, "--", "sh", "-c", "printf 1234 > "+txq)
		return exec.Command("setpriv", args...).CombinedOutput()
	}
	if out, err := run("+net_admin"); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("uid 1000 with CAP_NET_ADMIN only: %v %s, want Permission denied", err, out)
	}
	if out, err := run("+dac_override,+net_admin"); err != nil {
		t.Errorf("uid 1000 with CAP_DAC_OVERRIDE and CAP_NET_ADMIN: %v %s, want the write taken as on sysfs", err, out)
	}
	if b, err := os.ReadFile(txq); err != nil || string(b) != "1234\n" {
		t.Errorf("tx_queue_len after the write: %q %v", b, err)
	}
}
