package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"ipoibfs/internal/testenv"
)

// exec runs `ipoibfs exec ARGS...` and returns stdout, stderr and the exit status.
func (td *treeDaemon) exec(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, append([]string{"exec"}, args...)...)
	return runOutput(t, "ipoibfs exec", cmd)
}

// An unmodified script that drives the kernel driver's sysfs paths works under
// `ipoibfs exec`, against a local tree or one served over 9P; the host's /sys is left
// as it was, and the command's exit status is exec's.
func TestExecBindsTreeOverSys(t *testing.T) {
	td := treeStart(t, "exec", "")
	// A site script as it would run on a host with ib_ipoib: it only knows /sys paths.
	const script = `set -e
ls /sys/class/net | grep -x ib0
ls /sys/class/net | grep -x lo
cat /sys/class/net/ib0/mode
echo connected > /sys/class/net/ib0/mode
cat /sys/class/net/ib0/mtu
echo 0x8005 > /sys/class/net/ib0/create_child
cat /sys/class/net/ib0.8005/pkey
cat /sys/module/ib_ipoib/parameters/recv_queue_size
ls /sys/kernel/debug/ipoib | grep -x ib0_mcg
stat -c %a /sys/kernel/debug
if echo bogus > /sys/class/net/ib0/mode 2>/dev/null; then echo "bogus mode accepted"; fi
`
	// The directory the tree's debug files are put into keeps the host's mode
	// (root's alone where debugfs is mounted).
	st, err := os.Stat("/sys/kernel/debug")
	if err != nil {
		t.Fatal(err)
	}
	debugMode := strconv.FormatUint(uint64(st.Mode().Perm()), 8)
	for _, how := range [][]string{{"-tree", td.mnt}, {"-9p", td.addr}} {
		out, stderr, code := td.exec(t, append(how, "--", "bash", "-c", script)...)
		if code != 0 {
			t.Fatalf("exec %v: exit %d, stderr %q, stdout %q", how, code, stderr, out)
		}
		mode := "datagram"
		if how[0] == "-9p" {
			mode = "connected" // the -tree run switched it
		}
		want := "ib0\nlo\n" + mode + "\n65520\n0x8005\n256\nib0_mcg\n" + debugMode + "\n"
		if out != want {
			t.Errorf("exec %v printed %q, want %q", how, out, want)
		}
		if b, err := os.ReadFile(td.path("class/net/ib0/mode")); err != nil || string(b) != "connected\n" {
			t.Errorf("after exec %v: the tree's mode is %q (%v), want the script's write", how, b, err)
		}
		if _, err := os.Stat(td.path("class/net/ib0.8005")); err != nil {
			t.Errorf("after exec %v: ib0.8005 not created in the tree: %v", how, err)
		}
		_, _, _ = td.bash(t, "echo 0x8005 > class/net/ib0/delete_child", nil)
	}
	// Nothing is left behind: no staging directory, no mount.
	if m, _ := filepath.Glob(filepath.Join(os.TempDir(), "ipoibfs-exec*")); len(m) > 0 {
		t.Errorf("exec left %v behind", m)
	}
	// The host's /sys was never changed: ib0 lives in the daemon's namespace only.
	if _, err := os.Stat("/sys/class/net/ib0/mode"); err == nil {
		t.Errorf("/sys/class/net/ib0/mode exists on the host after exec")
	}
	if _, err := os.Stat("/sys/module/ib_ipoib"); err == nil {
		t.Errorf("/sys/module/ib_ipoib exists on the host after exec")
	}
	// Exit status and signals of the command are exec's own.
	if _, _, code := td.exec(t, "-tree", td.mnt, "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exec of 'exit 7': status %d", code)
	}
	if _, _, code := td.exec(t, "-tree", td.mnt, "--", "sh", "-c", "kill -TERM $$"); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exec of a command killed by SIGTERM: status %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if _, stderr, code := td.exec(t, "-tree", t.TempDir(), "--", "true"); code != 1 || !strings.Contains(stderr, "no ipoibfs tree at") {
		t.Errorf("exec on a directory without a tree: status %d, stderr %q", code, stderr)
	}
}

// ibstatus (infiniband-diags) reads only /sys/class/infiniband: under exec it reports the
// soft HCA's port as a real one.
func TestExecIbstatus(t *testing.T) {
	testenv.Tool(t, "ibstatus")
	td := treeStart(t, "ibst", "")
	out, stderr, code := td.exec(t, "-tree", td.mnt, "--", "ibstatus")
	if code != 0 {
		t.Fatalf("ibstatus under exec: exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"Infiniband device '", "port 1 status:", "state:\t\t 4: ACTIVE", "phys state:\t 5: LinkUp", "link_layer:\t InfiniBand"} {
		if !strings.Contains(out, want) {
			t.Errorf("ibstatus output lacks %q:\n%s", want, out)
		}
	}
}
