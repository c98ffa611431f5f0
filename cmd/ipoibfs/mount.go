package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"ipoibfs/fs/fuse"
	"ipoibfs/mnt"
)

// mount.ipoibfs is how mount(8) runs this binary for `mount -t ipoibfs ADDR DIR` (and
// fstab lines of type ipoibfs): it must return once the tree is mounted, so it serves
// from a detached child.
const mountHelperName = "mount.ipoibfs"

// Exit status of a failed mount helper, as mount(8) documents it.
const exitMountFailure = 32

// envMountChild marks the detached child of mount.ipoibfs; its fd 3 reports the result
// of the mount to the waiting parent.
const envMountChild = "IPOIBFS_MOUNT_CHILD"

// mountCommand runs `ipoibfs mount [-o OPTS] ADDR DIR` in the foreground until DIR is
// unmounted (umount DIR) or a SIGINT/SIGTERM arrives.
func mountCommand(args []string, stderr io.Writer) int {
	m, err := mountArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "ipoibfs mount: %v\nusage: ipoibfs mount [-o OPTIONS] ADDR DIR   (ADDR: HOST:PORT or unix:PATH)\n", err)
		return exitUsage
	}
	if m.fake {
		return exitOK // -f, as mount(8)'s: everything but the mount itself
	}
	var report *os.File
	if os.Getenv(envMountChild) != "" {
		report = os.NewFile(3, "mount-report")
	}
	dir := m.dir
	srv, err := mountRemote(m)
	if err != nil {
		if report != nil {
			fmt.Fprintln(report, err)
			report.Close()
		}
		fmt.Fprintln(stderr, "ipoibfs mount:", err)
		return exitError
	}
	if report != nil {
		fmt.Fprintln(report, "ok")
		report.Close()
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case <-done: // umount DIR
	case s := <-sig:
		log.Printf("%v: unmounting %s", s, dir)
		if err := srv.Unmount(); err != nil {
			fmt.Fprintln(stderr, "ipoibfs mount:", err)
			return exitError
		}
	}
	return exitOK
}

// mountHelper is mount.ipoibfs: it starts the serving child detached from mount(8)'s
// session and returns when the child says the tree is mounted (0) or why not (32).
func mountHelper(args []string, stderr io.Writer) int {
	m, err := mountArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nusage: %s ADDR DIR [-o OPTIONS]\n", mountHelperName, err, mountHelperName)
		return exitMountFailure
	}
	if m.fake {
		return exitOK // mount -f: everything but the mount itself
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", mountHelperName, err)
		return exitMountFailure
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", mountHelperName, err)
		return exitMountFailure
	}
	cmd := exec.Command(self, append([]string{"mount"}, args...)...)
	cmd.Env = append(os.Environ(), envMountChild+"=1")
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/" // never keep mount(8)'s working directory busy
	// Detached: its stdio is /dev/null (mount(8)'s terminal is not its log); the
	// outcome of the mount comes back through the pipe.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", mountHelperName, err)
		return exitMountFailure
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if line != "ok" {
		if line == "" {
			line = "the serving process exited before mounting"
		}
		fmt.Fprintf(stderr, "%s: %s\n", mountHelperName, line)
		_ = cmd.Wait()
		return exitMountFailure
	}
	_ = cmd.Process.Release()
	return exitOK
}

// mountSpec is a mount's command line: what to mount where, read-only (-o ro), and
// mount(8)'s -f (fake: do everything but mount).
type mountSpec struct {
	addr, dir string
	ro, fake  bool
}

// mountArgs takes ADDR and DIR in either order of options: `-o OPTS ADDR DIR` (ours) or
// `ADDR DIR -o OPTS` (how mount(8) calls helpers). ro and rw are honoured; the other
// generic options (defaults, _netdev, noauto...) are mount(8)'s business.
func mountArgs(args []string) (mountSpec, error) {
	var m mountSpec
	var pos []string
	opts := func(list string) {
		for _, o := range strings.Split(list, ",") {
			switch o {
			case "ro":
				m.ro = true
			case "rw":
				m.ro = false
			}
		}
	}
	for k := 0; k < len(args); k++ {
		switch a := args[k]; {
		case a == "-o":
			if k+1 == len(args) {
				return m, errors.New("-o needs an option list")
			}
			k++
			opts(args[k])
		case strings.HasPrefix(a, "-o"):
			opts(a[2:])
		case a == "-f":
			m.fake = true
		case a == "-n" || a == "-s" || a == "-v": // mount(8)'s helper flags
		case strings.HasPrefix(a, "-"):
			return m, fmt.Errorf("unknown flag %s", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return m, fmt.Errorf("want ADDR and DIR, got %d arguments", len(pos))
	}
	m.addr, m.dir = pos[0], pos[1]
	return m, nil
}

func mountRemote(m mountSpec) (*mnt.Server, error) {
	addr := m.addr
	abs, err := filepath.Abs(m.dir)
	if err != nil {
		return nil, err
	}
	if err := checkMountPoint(abs); err != nil {
		return nil, err
	}
	// A dead mount left by a killed earlier mount (checkMountPoint lets it through)
	// answers everything with ENOTCONN, the mount's own stat too: clean it first.
	if cleaned, err := fuse.CleanupStale(abs); err != nil {
		return nil, err
	} else if cleaned {
		log.Printf("%s: removed a dead mount left by an earlier mount", abs)
	}
	conn, err := dial9P(addr)
	if err != nil {
		return nil, err
	}
	return mnt.Mount(abs, conn, mnt.Options{Source: addr, ReadOnly: m.ro, Log: func(l string) { log.Print(l) }})
}
