package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"ipoibfs/mnt"
)

// `ipoibfs exec` runs an unmodified command (ibstat, ibstatus, a site script, an
// exporter) in a private mount namespace where the tree is bound over the kernel's own
// paths, so the command reads and writes /sys/class/net/ib0/mode and friends as on a
// host with the kernel driver. Everything else under /sys stays the host's.
//
// The parent checks the tree (or mounts a remote one), then re-executes itself as the
// hidden execChildCmd with a new mount namespace (clone flags set by os/exec, since a
// running Go process cannot unshare its own), which binds the paths, runs the command
// and serves the merged /sys/class/net while it runs; the command's exit status is ours.

const execChildCmd = "__exec-child"

// The kernel paths the tree covers: a directory and the tree's entries bound into it.
var execBinds = []struct{ sys, tree string }{
	{"/sys/class/net", "class/net"},                   // each IPoIB interface
	{"/sys/class/infiniband", "class/infiniband"},     // each HCA
	{"/sys/module/ib_ipoib", "module/ib_ipoib"},       // the module as a whole
	{"/sys/kernel/debug/ipoib", "kernel/debug/ipoib"}, // debugfs's ipoib directory
}

func execCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("ipoibfs exec", flag.ContinueOnError)
	fl.SetOutput(stderr)
	tree := fl.String("tree", defaultMount, "the mounted tree to bind (a local daemon's -mount)")
	ninep := fl.String("9p", "", "use the tree served over 9P at `ADDR` (HOST:PORT or unix:PATH) instead of -tree")
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "usage: ipoibfs exec [-tree DIR | -9p ADDR] -- COMMAND [ARG...]")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	argv := fl.Args()
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "ipoibfs exec: no command given")
		fl.Usage()
		return exitUsage
	}
	dir := *tree
	if *ninep != "" {
		tmp, err := os.MkdirTemp("", "ipoibfs-exec-tree")
		if err != nil {
			fmt.Fprintln(stderr, "ipoibfs exec:", err)
			return exitError
		}
		defer os.Remove(tmp)
		srv, err := dialMount(*ninep, tmp)
		if err != nil {
			fmt.Fprintf(stderr, "ipoibfs exec: -9p %s: %v\n", *ninep, err)
			return exitError
		}
		defer srv.Unmount()
		dir = tmp
	}
	if st, err := os.Stat(filepath.Join(dir, "class/net")); err != nil || !st.IsDir() {
		fmt.Fprintf(stderr, "ipoibfs exec: no ipoibfs tree at %s (is the daemon running? see -tree and -9p)\n", dir)
		return exitError
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "ipoibfs exec:", err)
		return exitError
	}
	cmd := exec.Command(self, append([]string{execChildCmd, dir, "--"}, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	// The terminal's SIGINT reaches the command itself; a SIGTERM for us is passed on.
	signal.Ignore(syscall.SIGINT)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	defer signal.Stop(term)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "ipoibfs exec:", err)
		return exitError
	}
	go func() {
		for s := range term {
			_ = cmd.Process.Signal(s)
		}
	}()
	return exitStatus(cmd.Wait(), stderr)
}

func dialMount(addr, dir string) (*mnt.Server, error) {
	conn, err := dial9P(addr)
	if err != nil {
		return nil, err
	}
	return mnt.Mount(dir, conn, mnt.Options{Source: addr})
}

// execChild runs in the new mount namespace: args are TREE -- COMMAND... It binds the
// tree, runs the command and stays beside it, serving the merged /sys/class/net, until
// it ends; its exit status is the command's.
func execChild(args []string, stderr io.Writer) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintln(stderr, "ipoibfs: internal command", execChildCmd, "misused")
		return exitUsage
	}
	tree, argv := args[0], args[2:]
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintln(stderr, "ipoibfs exec:", err)
		return 127 // as a shell says "command not found"
	}
	undo, err := bindTree(tree)
	defer undo()
	if err != nil {
		fmt.Fprintln(stderr, "ipoibfs exec:", err)
		return exitError
	}
	signal.Ignore(syscall.SIGINT) // the terminal sends it to the command too
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "ipoibfs exec:", err)
		return 126
	}
	pass := make(chan os.Signal, 4)
	signal.Notify(pass, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(pass)
	go func() {
		for s := range pass {
			_ = cmd.Process.Signal(s)
		}
	}()
	return exitStatus(cmd.Wait(), stderr)
}

// exitStatus is what a shell would report for a finished command.
func exitStatus(err error, stderr io.Writer) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	default:
		fmt.Fprintln(stderr, "ipoibfs exec:", err)
		return exitError
	}
}

// bindTree binds the tree's directories over the kernel's paths in this (private)
// mount namespace; /sys/class/net gets the live merged view. The returned function
// undoes what needs undoing before the namespace goes (the merged view's server, the
// staging directory on the host's /tmp).
func bindTree(tree string) (func(), error) {
	var undo []func()
	done := func() {
		for k := len(undo) - 1; k >= 0; k-- {
			undo[k]()
		}
	}
	// Nothing done here may propagate back to the host's mount table.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return done, fmt.Errorf("making the mount namespace private: %w", err)
	}
	stage, err := os.MkdirTemp("", "ipoibfs-exec")
	if err != nil {
		return done, err
	}
	undo = append(undo, func() { os.Remove(stage) })
	for _, b := range execBinds {
		src := filepath.Join(tree, b.tree)
		if _, err := os.Stat(src); err != nil {
			continue // this tree has no such directory
		}
		if b.sys == "/sys/class/net" {
			host := filepath.Join(stage, "net")
			if err := os.Mkdir(host, 0o755); err != nil {
				return done, err
			}
			undo = append(undo, func() { os.Remove(host) })
			if err := unix.Mount(b.sys, host, "", unix.MS_BIND, ""); err != nil {
				return done, fmt.Errorf("bind %s: %w", b.sys, err)
			}
			undo = append(undo, func() { unix.Unmount(host, unix.MNT_DETACH) })
			stop, err := mountNetClass(b.sys, host, src)
			if err != nil {
				return done, fmt.Errorf("covering %s: %w", b.sys, err)
			}
			undo = append(undo, stop)
			continue
		}
		extra := map[string]string{}
		dir := b.sys
		if b.sys == "/sys/class/infiniband" {
			// HCA by HCA, so the host's own HCAs stay.
			es, err := os.ReadDir(src)
			if err != nil {
				return done, err
			}
			for _, e := range es {
				extra[e.Name()] = filepath.Join(src, e.Name())
			}
		} else {
			dir = filepath.Dir(b.sys)
			extra[filepath.Base(b.sys)] = src
		}
		if len(extra) == 0 {
			continue
		}
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			// No such class on this host (no InfiniBand): bind the whole directory.
			dir, extra = filepath.Dir(dir), map[string]string{filepath.Base(dir): src}
		}
		if err := bindInto(stage, dir, extra); err != nil {
			return done, err
		}
	}
	return done, nil
}

// bindInto makes each extra[name] appear as dir/name. When every name already exists
// in dir, each is a bind mount over the existing entry (over a symlink's target, as
// mount(2) follows it). Otherwise dir is rebuilt as a tmpfs holding its original
// entries (symlinks copied, directories and files bound from a staging bind of the
// original) plus the new ones, because sysfs does not let anyone add a name.
func bindInto(stage, dir string, extra map[string]string) error {
	names := make([]string, 0, len(extra))
	missing := false
	for n := range extra {
		names = append(names, n)
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			missing = true
		}
	}
	sort.Strings(names)
	if !missing {
		for _, n := range names {
			if err := bind(extra[n], filepath.Join(dir, n)); err != nil {
				return err
			}
		}
		return nil
	}
	orig, err := os.MkdirTemp(stage, "orig")
	if err != nil {
		return err
	}
	defer os.Remove(orig)
	if err := unix.Mount(dir, orig, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	// The binds made from the staging copy stay when the copy itself goes.
	defer unix.Unmount(orig, unix.MNT_DETACH)
	// The tmpfs keeps the directory's mode and owner: /sys/kernel/debug is root's
	// alone (0700), and a 0755 stand-in would let any user of the namespace read the
	// tree's debug files and the host's.
	var st unix.Stat_t
	if err := unix.Stat(orig, &st); err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	opts := fmt.Sprintf("mode=%04o,uid=%d,gid=%d", st.Mode&0o7777, st.Uid, st.Gid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", dir, err)
	}
	es, err := os.ReadDir(orig)
	if err != nil {
		return err
	}
	for _, e := range es {
		if _, ours := extra[e.Name()]; ours {
			continue
		}
		from, to := filepath.Join(orig, e.Name()), filepath.Join(dir, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(from)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case e.IsDir():
			if err := os.Mkdir(to, 0o755); err != nil {
				return err
			}
			if err := unix.Mount(from, to, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("bind %s: %w", to, err)
			}
		default:
			if err := os.WriteFile(to, nil, 0o644); err != nil {
				return err
			}
			if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s: %w", to, err)
			}
		}
	}
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			return err
		}
		if err := bind(extra[n], filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

func bind(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", src, dst, err)
	}
	return nil
}
