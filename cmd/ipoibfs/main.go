// Command ipoibfs runs the ipoibfs daemon: a soft HCA on its fabric (hosting or joining
// a subnet manager), the IPoIB engine with one interface per port, and a TUN device per
// interface so the kernel's IP stack uses them. SIGHUP reloads the partition file;
// SIGINT/SIGTERM remove the devices and exit 0.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"ipoibfs/fs"
	"ipoibfs/ipoib"
	"ipoibfs/verbs/soft"
	"ipoibfs/verbs/soft/partitions"
)

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("ipoibfs: ")
	if len(os.Args) > 1 && os.Args[1] == "9p" {
		if err := ninepCommand(os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "ipoibfs 9p:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ipoibfs:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	host, _ := os.Hostname()
	fl := flag.NewFlagSet("ipoibfs", flag.ContinueOnError)
	name := fl.String("name", host, "node `name`; port GUIDs derive from it")
	ports := fl.Int("ports", 1, "number of HCA `ports`")
	smAddr := fl.String("sm", "", "host the subnet manager and fabric on this UDP `address`")
	fabric := fl.String("fabric", "", "join the fabric whose subnet manager listens on this UDP `address`")
	listen := fl.String("listen", "127.0.0.1:0", "UDP `address` of port 1 when joining a fabric")
	partFile := fl.String("partitions", "", "OpenSM partitions.conf `file` for the subnet manager")
	netns := fl.String("netns", "", "place the kernel interfaces in this network `namespace` (created if missing)")
	mountDir := fl.String("mount", "mnt", "mount the control tree here with FUSE (\"\" disables)")
	ninepAddr := fl.String("9p", "127.0.0.1:5640", "serve the tree over 9P2000.L on this TCP `address` or unix:PATH (\"\" disables)")
	ninepAllow := fl.String("9p-allow", "", "comma-separated `CIDRs` allowed to connect to a non-loopback 9P address")
	var params paramFlags
	fl.Var(&params, "param", "ib_ipoib module parameter `name=value` at load time (repeatable), e.g. recv_queue_size=1024")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fl.Arg(0))
	}
	if *smAddr != "" && *fabric != "" {
		return fmt.Errorf("-sm and -fabric exclude each other: a node either hosts the subnet manager or joins one")
	}
	// Signals are caught from the start, so one arriving while the tree is being set
	// up is handled (after setup) instead of killing the daemon.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	cfg := soft.Config{Name: *name, Ports: *ports}
	var parts *partitions.Config
	if *partFile != "" {
		p, err := loadPartitions(*partFile)
		if err != nil {
			return err
		}
		parts = p
	}
	switch {
	case *smAddr != "":
		a, err := netip.ParseAddrPort(*smAddr)
		if err != nil {
			return fmt.Errorf("-sm %q: %v", *smAddr, err)
		}
		cfg.Network, cfg.Listen, cfg.HostSM, cfg.Partitions = soft.UDPNetwork{}, a, true, parts
	case *fabric != "":
		a, err := netip.ParseAddrPort(*fabric)
		if err != nil {
			return fmt.Errorf("-fabric %q: %v", *fabric, err)
		}
		l, err := netip.ParseAddrPort(*listen)
		if err != nil {
			return fmt.Errorf("-listen %q: %v", *listen, err)
		}
		if parts != nil {
			return fmt.Errorf("-partitions needs -sm or the embedded fabric: only the subnet manager reads it")
		}
		cfg.Network, cfg.Listen, cfg.SM = soft.UDPNetwork{}, l, a
	default:
		cfg.Network, cfg.HostSM, cfg.Partitions = soft.NewMemNetwork(), true, parts
	}
	hca, err := soft.New(cfg)
	if err != nil {
		return err
	}
	defer hca.Close()
	events, cancel := hca.Subscribe(64)
	defer cancel()
	for i := 1; i <= hca.NumPorts(); i++ {
		log.Printf("port %d: endpoint %s", i, hca.Endpoint(i))
	}
	if sm := hca.SM(); sm != nil {
		log.Printf("subnet manager on %s", sm.Addr())
	}
	mp, err := params.build()
	if err != nil {
		return err
	}
	eng, err := ipoib.New(hca, ipoib.Options{Params: mp})
	if err != nil {
		return err
	}
	defer eng.Close()
	brs := startBridges(eng, *netns)
	defer brs.close()
	for _, i := range eng.Interfaces() {
		if err := i.SetUp(true); err != nil {
			return err
		}
		log.Printf("%s: up, hardware address %s", i.Name(), i.HWAddr())
	}
	tree := fs.New(eng, fs.Options{SM: hca.SM(), Log: func(l string) { log.Print(l) }})
	if *ninepAddr != "" {
		stop, err := serve9P(tree, *ninepAddr, *ninepAllow)
		if err != nil {
			return err
		}
		defer stop()
	}
	if *mountDir != "" {
		if unmount := mountTree(tree, *mountDir); unmount != nil {
			defer unmount()
		}
	}

	for {
		select {
		case ev := <-events:
			p, _ := hca.Port(ev.Port)
			a := p.Attr()
			log.Printf("port %d: %v (state %v, LID %#x, SM LID %#x, P_Keys %v)", ev.Port, ev.Type, a.State, a.LID, a.SMLID, p.PKeyTable())
		case s := <-sig:
			if s != syscall.SIGHUP {
				log.Printf("%v: shutting down", s)
				for n := 1; n <= hca.NumPorts(); n++ {
					p, _ := hca.Port(n)
					log.Printf("port %d counters: %+v", n, p.Counters())
				}
				for _, i := range eng.Interfaces() {
					log.Printf("%s statistics: %+v", i.Name(), i.Stats())
				}
				return nil
			}
			sm := hca.SM()
			if sm == nil || *partFile == "" {
				log.Printf("SIGHUP: nothing to reload (no subnet manager here or no -partitions file)")
				continue
			}
			p, err := loadPartitions(*partFile)
			if err != nil {
				log.Printf("SIGHUP: %v; keeping the previous partitions", err)
				continue
			}
			sm.SetPartitions(p)
			log.Printf("SIGHUP: partitions reloaded from %s", *partFile)
		}
	}
}

func loadPartitions(file string) (*partitions.Config, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return partitions.Parse(file, f)
}

// paramFlags collects -param name=value like modprobe options.
type paramFlags []string

func (p *paramFlags) String() string     { return strings.Join(*p, ",") }
func (p *paramFlags) Set(v string) error { *p = append(*p, v); return nil }

func (p paramFlags) build() (*ipoib.Params, error) {
	q := map[string]int{"send_queue_size": 128, "recv_queue_size": 256, "max_nonsrq_conn_qp": 128}
	debug := map[string]string{}
	for _, kv := range p {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("-param %q: want name=value", kv)
		}
		if _, isQ := q[name]; isQ {
			n, err := strconv.Atoi(val)
			if err != nil {
				return nil, fmt.Errorf("-param %s: %q is not an integer", name, val)
			}
			q[name] = n
			continue
		}
		if !slices.Contains(ipoib.ParamNames, name) {
			return nil, fmt.Errorf("-param %s: no such ib_ipoib parameter (have %s)", name, strings.Join(ipoib.ParamNames, ", "))
		}
		debug[name] = val
	}
	mp := ipoib.NewParams(q["send_queue_size"], q["recv_queue_size"], q["max_nonsrq_conn_qp"])
	for name, val := range debug {
		if err := mp.SetParam(name, val); err != nil {
			return nil, fmt.Errorf("-param %s: %v", name, err)
		}
	}
	return mp, nil
}
