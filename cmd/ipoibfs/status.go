package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"ipoibfs/fs/ninep"
)

// dial9P connects to a tree served over 9P: "unix:PATH" or a TCP address. Root
// connects from a reserved port (below 1024), as the Linux client's -o privport does:
// a server on another host believes attach names (-9p-trust-uname) only from one.
func dial9P(addr string) (net.Conn, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return net.Dial("unix", p)
	}
	if os.Geteuid() == 0 {
		for port := 1023; port >= 600; port-- {
			d := net.Dialer{LocalAddr: &net.TCPAddr{Port: port}}
			c, err := d.Dial("tcp", addr)
			if err == nil {
				return c, nil
			}
			if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
				break // root without CAP_NET_BIND_SERVICE: an ordinary port, as before
			}
			if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
				var oe *net.OpError
				if errors.As(err, &oe) {
					oe.Source = nil // the server's address is what the message is about
				}
				return nil, err
			}
		}
	}
	return net.Dial("tcp", addr)
}

// treeReader reads a tree, mounted (os) or over 9P.
type treeReader interface {
	ReadFile(path string) ([]byte, error)
	ReadDir(path string) ([]string, error)
}

// treeClient also writes; ninep.Client and dirTree are both.
type treeClient interface {
	treeReader
	WriteFile(path string, data []byte) error
}

// treeCommand parses the -tree DIR and -9p ADDR of the subcommand name and opens the
// tree they name: the tree, the other arguments (refused, exitUsage, unless
// takesArgs) and what closes the tree; with a nil tree the caller returns code (0
// after -h, exitUsage for a bad command line, exitError when the tree cannot be
// opened, said on stderr).
func treeCommand(name string, args []string, takesArgs bool, stderr io.Writer) (t treeClient, rest []string, done func(), code int) {
	fl := flag.NewFlagSet("ipoibfs "+name, flag.ContinueOnError)
	fl.SetOutput(stderr)
	tree := fl.String("tree", defaultMount, "the mounted tree")
	addr := fl.String("9p", "", "the tree served over 9P at this address (unix:PATH or host:port) instead")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, nil, exitOK
		}
		return nil, nil, nil, exitUsage
	}
	if !takesArgs && fl.NArg() != 0 {
		fmt.Fprintf(stderr, "ipoibfs %s: unexpected argument %q\n", name, fl.Arg(0))
		return nil, nil, nil, exitUsage
	}
	t, done, err := openTree(*tree, *addr)
	if err != nil {
		fmt.Fprintf(stderr, "ipoibfs %s: %v\n", name, err)
		return nil, nil, nil, exitError
	}
	return t, fl.Args(), done, 0
}

// openTree is the tree a subcommand's -tree DIR or -9p ADDR names (9P when addr is
// set), and what closes it.
func openTree(dir, addr string) (treeClient, func(), error) {
	if addr == "" {
		return dirTree(dir), func() {}, nil
	}
	conn, err := dial9P(addr)
	if err != nil {
		return nil, nil, err
	}
	c, err := ninep.NewClient(conn)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return c, func() { c.Close() }, nil
}

type dirTree string

func (d dirTree) ReadFile(p string) ([]byte, error) { return os.ReadFile(filepath.Join(string(d), p)) }

func (d dirTree) WriteFile(p string, b []byte) error {
	return os.WriteFile(filepath.Join(string(d), p), b, 0)
}

func (d dirTree) ReadDir(p string) ([]string, error) {
	es, err := os.ReadDir(filepath.Join(string(d), p))
	names := make([]string, 0, len(es))
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names, err
}

// statusCommand prints one screen like ibstat plus ip -d link: the HCA and its ports,
// each interface, and the counters that are not zero.
func statusCommand(args []string, stdout, stderr io.Writer) int {
	r, _, done, code := treeCommand("status", args, false, stderr)
	if r == nil {
		return code
	}
	defer done()
	if err := printStatus(r, stdout); err != nil {
		fmt.Fprintln(stderr, "ipoibfs status:", err)
		return exitError
	}
	return exitOK
}

func printStatus(r treeReader, w io.Writer) error {
	get := func(p string) string {
		b, err := r.ReadFile(p)
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(b))
	}
	hcas, err := r.ReadDir("class/infiniband")
	if err != nil {
		return fmt.Errorf("class/infiniband: %w (is the tree mounted?)", err)
	}
	sort.Strings(hcas)
	for _, h := range hcas {
		d := "class/infiniband/" + h
		fmt.Fprintf(w, "CA '%s' (%s)\n\tnode GUID %s, system image GUID %s, firmware %s, hardware %s\n",
			h, get(d+"/hca_type"), get(d+"/node_guid"), get(d+"/sys_image_guid"), get(d+"/fw_ver"), get(d+"/hw_rev"))
		ports, _ := r.ReadDir(d + "/ports")
		sort.Strings(ports)
		for _, p := range ports {
			pd := d + "/ports/" + p
			fmt.Fprintf(w, "\tport %s: %s (%s), %s, LID %s, SM LID %s\n", p, stateWord(get(pd+"/state")),
				stateWord(get(pd+"/phys_state")), get(pd+"/rate"), get(pd+"/lid"), get(pd+"/sm_lid"))
			var moved []string
			cs, _ := r.ReadDir(pd + "/counters")
			sort.Strings(cs)
			for _, c := range cs {
				if v := get(pd + "/counters/" + c); v != "0" && v != "?" {
					moved = append(moved, c+"="+v)
				}
			}
			if len(moved) > 0 {
				fmt.Fprintf(w, "\t\t%s\n", strings.Join(moved, " "))
			}
		}
	}
	ifs, err := r.ReadDir("class/net")
	if err != nil {
		return fmt.Errorf("class/net: %w", err)
	}
	sort.Strings(ifs)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "\nIFACE\tPKEY\tPARENT\tMODE\tMTU\tCARRIER\tSTATE\tUMCAST\tCOUNTERS")
	for _, i := range ifs {
		d := "class/net/" + i
		parent := "-"
		if p := get(d + "/parent"); p != "?" {
			parent = p
		}
		carrier := get(d + "/carrier")
		if carrier == "?" {
			carrier = "-" // a down interface's carrier reads EINVAL, as in sysfs
		}
		var moved []string
		for _, s := range []string{"rx_packets", "tx_packets", "rx_dropped", "tx_dropped", "tx_errors"} {
			if v := get(d + "/statistics/" + s); v != "0" && v != "?" {
				moved = append(moved, s+"="+v)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i, get(d+"/pkey"), parent, get(d+"/mode"),
			get(d+"/mtu"), carrier, get(d+"/operstate"), get(d+"/umcast"), strings.Join(moved, " "))
	}
	return tw.Flush()
}

// stateWord turns sysfs's "4: ACTIVE" into "ACTIVE".
func stateWord(s string) string {
	if _, w, ok := strings.Cut(s, ": "); ok {
		return w
	}
	return s
}
