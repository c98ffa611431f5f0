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
// daemon left there. Without FUSE the daemon goes on and says why; it returns the
// unmount function or nil.
func mountTree(tree *fs.Tree, dir string) func() {
	// A dead mount answers every access (mkdir included) with ENOTCONN: clean it first.
	if cleaned, err := fuse.CleanupStale(dir); err != nil {
		log.Printf("FUSE mount off: %s: stale mount: %v", dir, err)
		return nil
	} else if cleaned {
		log.Printf("%s: removed a dead mount left by an earlier daemon", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Printf("FUSE mount off: %v", err)
		return nil
	}
	srv, err := fuse.Mount(dir, tree.Root(), fuse.Options{Log: func(l string) { log.Print(l) }})
	if err != nil {
		log.Printf("FUSE mount off: %v", err)
		return nil
	}
	log.Printf("control tree mounted at %s", dir)
	return func() {
		if err := srv.Unmount(); err != nil {
			log.Printf("unmount %s: %v", dir, err)
		}
	}
}

// serve9P listens on addr (TCP, or unix:PATH) and serves the tree. A non-loopback TCP
// address needs an explicit allow list; connections from elsewhere are refused and
// logged.
func serve9P(tree *fs.Tree, addr, allow string) (func(), error) {
	var allowed []netip.Prefix
	if allow != "" {
		for _, c := range strings.Split(allow, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(c))
			if err != nil {
				return nil, fmt.Errorf("-9p-allow %q: %v", c, err)
			}
			allowed = append(allowed, p)
		}
	}
	network, where := "tcp", addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", path
		_ = os.Remove(path) // a socket left by a crashed daemon
	} else {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("-9p %q: want HOST:PORT or unix:PATH: %v", addr, err)
		}
		if !ap.Addr().IsLoopback() && len(allowed) == 0 {
			return nil, fmt.Errorf("-9p %s is not a loopback address: serving it needs -9p-allow CIDR,...", addr)
		}
		if ap.Addr().IsLoopback() && len(allowed) == 0 {
			allowed = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
		}
	}
	ln, err := net.Listen(network, where)
	if err != nil {
		return nil, fmt.Errorf("9P: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := ninep.Serve(ctx, ln, tree.Root(), ninep.Options{AllowCIDRs: allowed, TauthCompat: true,
			Log: func(l string) { log.Print(l) }})
		if err != nil {
			log.Printf("9P server on %s stopped: %v", addr, err)
		}
	}()
	log.Printf("9P2000.L on %s", addr)
	return func() {
		cancel()
		<-done
		if network == "unix" {
			_ = os.Remove(where)
		}
	}, nil
}

// ninepCommand is `ipoibfs 9p ADDR ls|read|write|stat PATH` for scripts on hosts
// without a kernel 9P client. write takes the content from stdin.
func ninepCommand(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 3 {
		return errors.New("usage: ipoibfs 9p ADDR ls|read|write|stat PATH")
	}
	addr, op, path := args[0], args[1], strings.Trim(args[2], "/")
	network, where := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", p
	}
	conn, err := net.Dial(network, where)
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
