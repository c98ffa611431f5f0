package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"strings"

	"ipoibfs/fs"
	"ipoibfs/fs/fuse"
	"ipoibfs/fs/ninep"
)

// mountTree mounts the tree with FUSE at dir, cleaning up a dead mount a crashed
// daemon left there. Without FUSE (no /dev/fuse, no privilege to mount) the daemon goes
// on and says why: it returns a nil unmount function and the reason, which the
// readiness status repeats.
func mountTree(tree *fs.Tree, dir string) (unmount func(), off string) {
	fail := func(format string, a ...any) (func(), string) {
		off = fmt.Sprintf(format, a...)
		log.Printf("FUSE mount off: %s", off)
		return nil, off
	}
	// A dead mount answers every access (mkdir included) with ENOTCONN: clean it first.
	if cleaned, err := fuse.CleanupStale(dir); err != nil {
		return fail("%s: stale mount: %v", dir, err)
	} else if cleaned {
		log.Printf("%s: removed a dead mount left by an earlier daemon", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("%v", err)
	}
	changes, cancel := tree.Changes()
	srv, err := fuse.Mount(dir, tree.Root(), fuse.Options{Log: func(l string) { log.Print(l) }, Changes: changes})
	if err != nil {
		cancel()
		return fail("%v", err)
	}
	log.Printf("control tree mounted at %s", dir)
	return func() {
		if err := srv.Unmount(); err != nil {
			log.Printf("unmount %s: %v", dir, err)
		}
		cancel()
	}, ""
}

// ninepListener is the 9P listening socket, opened before anything else starts so a
// bad address, a busy port or another daemon's socket fails the daemon at once.
type ninepListener struct {
	addr    string
	ln      net.Listener
	allowed []netip.Prefix
	unix    string // the socket file to remove at exit
}

// listen9P validates -9p and -9p-allow and opens the listener. A non-loopback TCP
// address needs an explicit allow list. For unix:PATH, a stale socket left by a
// crashed daemon is replaced; a live one, or anything that is not a socket, is refused.
func listen9P(addr, allow string) (*ninepListener, error) {
	nl := &ninepListener{addr: addr}
	if allow != "" {
		for _, c := range strings.Split(allow, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(c))
			if err != nil {
				return nil, usageError{fmt.Errorf("-9p-allow %q: %v", c, err)}
			}
			nl.allowed = append(nl.allowed, p)
		}
	}
	network, where := "tcp", addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where, nl.unix = "unix", path, path
		if err := clearStaleSocket(path); err != nil {
			return nil, fmt.Errorf("-9p %s: %w", addr, err)
		}
	} else {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, usageError{fmt.Errorf("-9p %q: want HOST:PORT or unix:PATH: %v", addr, err)}
		}
		if !ap.Addr().IsLoopback() && len(nl.allowed) == 0 {
			return nil, usageError{fmt.Errorf("-9p %s is not a loopback address: serving it needs -9p-allow CIDR,...", addr)}
		}
		if ap.Addr().IsLoopback() && len(nl.allowed) == 0 {
			nl.allowed = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
		}
	}
	ln, err := net.Listen(network, where)
	if err != nil {
		return nil, fmt.Errorf("-9p %s: %w", addr, err)
	}
	nl.ln = ln
	if nl.unix != "" {
		// Anyone may connect, as anyone may open the FUSE mount: the peer's own
		// credentials decide what it may do (read-only unless root).
		if err := os.Chmod(nl.unix, 0o666); err != nil {
			nl.close()
			return nil, fmt.Errorf("-9p %s: %w", addr, err)
		}
	}
	return nl, nil
}

// clearStaleSocket removes a unix socket nobody listens on any more. A socket that
// answers belongs to a running daemon; a file of another kind is not ours to delete.
func clearStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; not removing it", path)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("%s is served by a running daemon", path)
	}
	return os.Remove(path)
}

// close closes a listener that was never served (startup failed after listen9P).
func (nl *ninepListener) close() {
	nl.ln.Close()
	if nl.unix != "" {
		_ = os.Remove(nl.unix)
	}
}

// serve serves the tree on the listener; the returned function stops serving, closes
// every connection and removes a unix socket file.
func (nl *ninepListener) serve(tree *fs.Tree, trustUname bool) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := ninep.Serve(ctx, nl.ln, tree.Root(), ninep.Options{AllowCIDRs: nl.allowed, TauthCompat: true,
			TrustUname: trustUname, Log: func(l string) { log.Print(l) }})
		if err != nil {
			log.Printf("9P server on %s stopped: %v", nl.addr, err)
		}
	}()
	log.Printf("9P2000.L on %s", nl.addr)
	return func() {
		cancel()
		<-done
		if nl.unix != "" {
			_ = os.Remove(nl.unix)
		}
	}
}

func ninepCommand(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 3 {
		return errors.New("usage: ipoibfs 9p ADDR ls|read|write|stat PATH")
	}
	addr, op, path := args[0], args[1], strings.Trim(args[2], "/")
	conn, err := dial9P(addr)
	if err != nil {
		return err
	}
	c, err := ninep.NewClient(conn)
	if err != nil {
		conn.Close()
		return err
	}
	defer c.Close()
	fail := func(err error) error { return fmt.Errorf("%s %s: %w", op, args[2], err) }
	switch op {
	case "ls":
		ents, err := c.ReadDir(path)
		if err != nil {
			return fail(err)
		}
		for _, e := range ents {
			fmt.Fprintln(stdout, e)
		}
	case "read":
		b, err := c.ReadFile(path)
		if err != nil {
			return fail(err)
		}
		_, err = stdout.Write(b)
		return err
	case "write":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		if err := c.WriteFile(path, b); err != nil {
			return fail(err)
		}
	case "stat":
		st, err := c.Stat(path)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout, st)
	default:
		return fmt.Errorf("unknown operation %q: want ls, read, write or stat", op)
	}
	return nil
}
