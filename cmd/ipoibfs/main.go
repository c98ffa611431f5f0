// Command ipoibfs runs the ipoibfs daemon: a soft HCA on its fabric (hosting or joining
// a subnet manager), or with -hca an rdma-core device, the IPoIB engine with one
// interface per port, and a TUN device per interface so the kernel's IP stack uses
// them. SIGHUP reloads the partition file; SIGINT/SIGTERM remove the devices and exit 0.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"ipoibfs/fs"
	"ipoibfs/ipoib"
	"ipoibfs/ipoib/kernel"
)

func main() {
	traceLog = setupLogging()
	os.Exit(cli(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// traceLog receives the engine's debug traces (level=DEBUG); nil in tests of cli.
var traceLog *log.Logger

// Exit statuses, as Go's flag package and most daemons use them.
const (
	exitOK    = 0
	exitError = 1 // the daemon or a subcommand failed
	exitUsage = 2 // bad flags or arguments
)

// usageError is a command line that cannot be run; the message was already printed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// cli runs the daemon or a subcommand and returns the exit status: 0 after -h or
// -version, 2 for a bad command line, 1 when the daemon or subcommand fails.
func cli(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if filepath.Base(os.Args[0]) == mountHelperName {
		return mountHelper(args, stderr)
	}
	if len(args) > 0 {
		switch args[0] {
		case "mount":
			return mountCommand(args[1:], stderr)
		case "exec":
			return execCommand(args[1:], stdin, stdout, stderr)
		case "status":
			return statusCommand(args[1:], stdout, stderr)
		case "reload":
			return reloadCommand(args[1:], stdout, stderr)
		case "link":
			return linkCommand(args[1:], stdout, stderr)
		case execChildCmd:
			return execChild(args[1:], stderr)
		}
	}
	if len(args) > 0 && args[0] == "9p" {
		if err := ninepCommand(args[1:], stdin, stdout); err != nil {
			fmt.Fprintln(stderr, "ipoibfs 9p:", err)
			return exitError
		}
		return exitOK
	}
	err := run(args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	default:
		fmt.Fprintln(stderr, "ipoibfs:", err)
		return exitError
	}
}

// defaultMount is where the tree is mounted without -mount: an absolute path (a unit
// started in / must not mount over /mnt), under the runtime directory systemd gives the
// service (RuntimeDirectory=ipoibfs), and never inside the source tree.
const defaultMount = "/run/ipoibfs/tree"

// subcommands are listed in the usage text.
var subcommands = [][2]string{
	{"9p ADDR ls|read|write|stat PATH", "talk to a tree served over 9P (write takes stdin)"},
	{"mount [-o OPTS] ADDR DIR", "mount a tree served over 9P on DIR with FUSE (also as mount.ipoibfs)"},
	{"exec [-tree DIR | -9p ADDR] -- CMD...", "run CMD with the tree bound over /sys's IPoIB paths"},
	{"status [-tree DIR | -9p ADDR]", "the HCA, its ports and interfaces and the counters that moved, on one screen"},
	{"link [-tree DIR | -9p ADDR] add|del|show ...", "named children as ip link add ... type ipoib makes them"},
	{"reload [-tree DIR | -9p ADDR]", "what SIGHUP does, waited for; exits 1 when something did not apply (systemctl reload)"},
}

func usage(fl *flag.FlagSet) func() {
	return func() {
		w := fl.Output()
		fmt.Fprintf(w, "usage: ipoibfs [flags]          run the daemon\n")
		for _, c := range subcommands {
			fmt.Fprintf(w, "       ipoibfs %-32s %s\n", c[0], c[1])
		}
		fmt.Fprintf(w, "\nflags:\n")
		fl.PrintDefaults()
	}
}

// version describes the binary from its build information: the module version and,
// for a build from a checkout, the VCS revision and whether the tree was modified.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "ipoibfs (no build information)"
	}
	v := "ipoibfs " + bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = " (modified)"
			}
		}
	}
	if rev != "" {
		v += " revision " + rev + modified
	}
	return v + " " + bi.GoVersion
}

func run(args []string, stdout, stderr io.Writer) error {
	host, _ := os.Hostname()
	fl := flag.NewFlagSet("ipoibfs", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = usage(fl)
	showVersion := fl.Bool("version", false, "print the version and exit")
	name := fl.String("name", host, "node `name`; port GUIDs derive from it")
	ports := fl.Int("ports", 1, "number of HCA `ports`")
	smAddr := fl.String("sm", "", "host the subnet manager and fabric on this UDP `address`")
	fabric := fl.String("fabric", "", "join the fabric whose subnet manager listens on this UDP `address`")
	listen := fl.String("listen", "127.0.0.1:0", "UDP `address` of port 1 when joining a fabric")
	partFile := fl.String("partitions", "", "OpenSM partitions.conf `file` for the subnet manager")
	configDir := fl.String("config", "", "apply the network-scripts ifcfg-ib* files of this `directory` (or one installer-style file) at start and on SIGHUP")
	netns := fl.String("netns", "", "place the kernel interfaces in this network `namespace` (created if missing)")
	mountDir := fl.String("mount", defaultMount, "mount the control tree here with FUSE (\"\" disables)")
	ninepAddr := fl.String("9p", "127.0.0.1:5640", "serve the tree over 9P2000.L on this TCP `address` or unix:PATH (\"\" disables)")
	ninepAllow := fl.String("9p-allow", "", "comma-separated `CIDRs` allowed to connect to a non-loopback 9P address")
	fabricKey := fl.String("fabric-key", "", "authenticate fabric management messages with the key in `file` (0600, at least 16 random bytes; the same on every node)")
	trustUname := fl.Bool("9p-trust-uname", false, "believe the user named in 9P attaches from allowed remote hosts connecting from a reserved port (NFS sec=sys, secure); without it they are read-only as nobody")
	loadBonding := fl.Bool("bonding", false, "load the bonding driver: class/net/bonding_masters in the tree (implied by bonding files in -config)")
	hcaName := fl.String("hca", "", "run on this rdma-core `device` instead of the soft HCA (\"list\" prints the devices libibverbs sees; needs a build with -tags rdma)")
	queues := fl.Int("queues", defaultQueues(), "TUN `queues` of each port's interface (IFF_MULTI_QUEUE; P_Key children have one): flows spread over them both ways, a reader each; 1..256")
	var ifnames ifnameFlags
	fl.Var(&ifnames, "ifname", "rename a port's interface: `ibN=NAME` (repeatable or comma-separated), e.g. ib0=uib0 where the kernel's ib_ipoib has ib0")
	var params paramFlags
	fl.Var(&params, "param", "ib_ipoib module parameter `name=value` at load time (repeatable), e.g. recv_queue_size=1024")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err} // flag printed it with the usage
	}
	if *showVersion {
		fmt.Fprintln(stdout, version())
		return nil
	}
	bad := func(format string, a ...any) error {
		err := fmt.Errorf(format, a...)
		fmt.Fprintln(stderr, "ipoibfs:", err)
		return usageError{err}
	}
	if err := checkHCAFlags(fl, *hcaName); err != nil {
		return bad("%v", err)
	}
	if *hcaName == "list" {
		return hcaCommand(*hcaName, stdout)
	}
	if fl.NArg() > 0 {
		return bad("unexpected argument %q (subcommands: %s)", fl.Arg(0), subcommandNames())
	}
	if *smAddr != "" && *fabric != "" {
		return bad("-sm and -fabric exclude each other: a node either hosts the subnet manager or joins one")
	}
	if *queues < 1 || *queues > kernel.MaxQueues {
		return bad("-queues %d: a TUN device has 1..%d queues", *queues, kernel.MaxQueues)
	}
	if *ports < 1 || *ports > 254 {
		return bad("-ports %d: an HCA has 1..254 ports", *ports)
	}
	// Checked with the other flags, before anything is opened or joined: a bad
	// -param is a bad command line (exit 2), not a failure after startup.
	mp, warnings, err := params.build()
	if err != nil {
		return bad("%v", err)
	}
	var plan *hcaPlan
	if *hcaName != "" {
		p, err := planDevice(*hcaName) // opens the device: its ports name the interfaces
		if err != nil {
			return err
		}
		plan = p
	} else {
		p, err := planSoft(softFlags{name: *name, ports: *ports, sm: *smAddr, fabric: *fabric, listen: *listen,
			partFile: *partFile, fabricKey: *fabricKey}, bad)
		if err != nil {
			return err
		}
		plan = p
	}
	if plan.release != nil {
		defer func() {
			if plan != nil { // not opened: startup failed before
				plan.release()
			}
		}()
	}
	names, err := ifnames.names(plan.ports)
	if err != nil {
		return bad("%v", err)
	}
	if err := kernel.ValidNetNS(*netns); err != nil {
		return bad("-netns: %v", err)
	}
	if *configDir != "" {
		if _, err := os.Stat(*configDir); err != nil {
			return bad("-config: %v", err)
		}
	}
	if err := checkMountPoint(*mountDir); err != nil {
		return err
	}
	if err := checkDevices(*netns, names); err != nil {
		return err
	}
	var ninepLn *ninepListener
	if *ninepAddr != "" {
		l, err := listen9P(*ninepAddr, *ninepAllow)
		if ue := (usageError{}); errors.As(err, &ue) {
			return bad("%v", ue.err) // a bad -9p or -9p-allow, said like the other flags
		}
		if err != nil {
			return err
		}
		ninepLn = l
		defer func() {
			if ninepLn != nil { // not served: startup failed
				ninepLn.close()
			}
		}()
	}
	// Signals are caught from the start, so one arriving while the tree is being set
	// up is handled (after setup) instead of killing the daemon.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	hca, err := plan.open()
	plan = nil
	if err != nil {
		return err
	}
	dev := hca.device()
	defer dev.Close()
	events, cancel := dev.Subscribe(64)
	defer cancel()
	hca.started()
	for _, w := range warnings {
		log.Print(w)
	}
	evlog := fs.NewEventLog()
	eng, err := ipoib.New(dev, ipoib.Options{Params: mp, Event: evlog.Emit, Trace: traceLog, PortNames: ifnames.byPort})
	if err != nil {
		return err
	}
	defer eng.Close()
	// ip netns del of the daemon's namespace, said when it happens: the devices live
	// on in the namespace where the name no longer leads, and children cannot be
	// made until the daemon starts again.
	defer kernel.OnNamespaceGone(func(name string) {
		msg := fmt.Sprintf("network namespace %s was deleted (ip netns del) while this daemon's devices live in it: "+
			"they go on where the name no longer leads; create_child fails with ENODEV until the daemon restarts", name)
		log.Print(msg)
		evlog.Emit(msg)
	})()
	brs := startBridges(eng, *netns, *queues)
	defer brs.close()
	bonds := startBonds(eng, *netns, brs) // bond.go
	defer bonds.close()                   // slaves released before their devices go
	if *loadBonding {
		bonds.bonds.Load()
	}
	for _, i := range eng.Interfaces() {
		if err := i.SetUp(true); err != nil {
			return err
		}
		log.Printf("%s: up, hardware address %s", i.Name(), i.HWAddr())
	}
	var ifcfgs *ifcfgApplier
	if *configDir != "" {
		ifcfgs = &ifcfgApplier{dir: *configDir, netns: *netns, eng: eng, brs: brs, addrs: map[string]netip.Prefix{}, bonds: bonds}
		defer ifcfgs.close() // DHCP releases, before the devices go
		ifcfgs.apply(log.Printf)
	}
	// reload is what SIGHUP and a write of the tree's reload do: -partitions read
	// again where the subnet manager runs, the -config files applied again. One at a
	// time; each line it logs starts with via.
	var reloadMu sync.Mutex
	reload := func(via string) error {
		reloadMu.Lock()
		defer reloadMu.Unlock()
		logf := func(format string, a ...any) { log.Printf(via+": "+format, a...) }
		var errs []string // one line for the writer
		did := false
		if ifcfgs != nil {
			did = true
			if n := ifcfgs.apply(logf); n > 0 {
				errs = append(errs, fmt.Sprintf("%d problem(s) in the interface files of %s (logged; the other files applied)", n, *configDir))
			} else {
				logf("interface files applied from %s", *configDir)
			}
		}
		what, err := hca.reload()
		switch {
		case err != nil:
			did = true
			logf("%v", err)
			errs = append(errs, err.Error())
		case what != "":
			did = true
			logf("%s", what)
		}
		if !did {
			logf("nothing to reload (no subnet manager here or no -partitions file, no -config)")
		}
		if len(errs) > 0 {
			return errors.New(strings.Join(errs, "; "))
		}
		return nil
	}
	topts := fs.Options{Log: func(l string) { log.Print(l) }, Events: evlog, Bonds: bonds.bonds, SM: hca.treeSM(),
		Reload: func() error { return reload("reload") }}
	tree := fs.New(eng, topts)
	if err := fs.ProcIsOurs(); err != nil && (ninepLn != nil || *mountDir != "") {
		log.Printf("%v: no process writing the tree counts as holding CAP_NET_ADMIN (mount a /proc of the daemon's PID namespace: unshare --mount-proc)", err)
	}
	if ninepLn != nil {
		defer ninepLn.serve(tree, *trustUname)()
		ninepLn = nil
	}
	mounted, mountOff := "", ""
	if *mountDir != "" {
		var unmount func()
		if unmount, mountOff = mountTree(tree, *mountDir); unmount != nil {
			defer unmount()
			mounted = *mountDir
		}
	}
	// Ready: every interface has its kernel device and the tree is served, so
	// `ip addr add` and scripts against the tree work from here on; a tree that could
	// not be mounted is said in the status (systemctl status shows it).
	sdNotify("READY=1\nSTATUS=" + readyStatus(eng, mounted, mountOff, *ninepAddr))
	defer sdNotify("STOPPING=1")

	hca.ready()
	// A port that never becomes ACTIVE says why, every few seconds.
	inactive := time.NewTicker(5 * time.Second)
	defer inactive.Stop()
	for {
		select {
		case <-inactive.C:
			hca.tick()
		case ev := <-events:
			logPortEvent(dev, ev)
		case s := <-sig:
			if s != syscall.SIGHUP {
				// A second one ends the process at once (a shutdown that hangs can
				// still be stopped).
				signal.Reset(syscall.SIGINT, syscall.SIGTERM)
				log.Printf("%v: shutting down", s)
				for n := 1; n <= dev.NumPorts(); n++ {
					p, _ := dev.Port(n)
					slog.Info("port counters", append([]any{"port", n}, kv(p.Counters())...)...)
				}
				for _, i := range eng.Interfaces() {
					slog.Info("interface statistics", append([]any{"if", i.Name()}, kv(i.Stats())...)...)
				}
				return nil
			}
			_ = reload("SIGHUP") // what went wrong is logged
		}
	}
}

// paramFlags collects -param name=value like modprobe options.
type paramFlags []string

func (p *paramFlags) String() string     { return strings.Join(*p, ",") }
func (p *paramFlags) Set(v string) error { *p = append(*p, v); return nil }

// build turns the -param flags into the engine's parameters, as modprobe does: an
// unknown name is ignored with a warning, a bad value is an error (ERANGE beyond int).
func (p paramFlags) build() (*ipoib.Params, []string, error) {
	q := map[string]int{"send_queue_size": 128, "recv_queue_size": 256, "max_nonsrq_conn_qp": 128}
	debug := map[string]string{}
	var warnings []string
	for _, kv := range p {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, nil, fmt.Errorf("-param %q: want name=value", kv)
		}
		if _, isQ := q[name]; isQ {
			n, err := strconv.ParseInt(val, 0, 32)
			if errors.Is(err, strconv.ErrRange) {
				return nil, nil, fmt.Errorf("-param %s: %s: %w (out of the int range)", name, val, syscall.ERANGE)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("-param %s: %q is not an integer", name, val)
			}
			q[name] = int(n)
			continue
		}
		if !slices.Contains(ipoib.ParamNames, name) {
			warnings = append(warnings, fmt.Sprintf("ib_ipoib: unknown parameter '%s' ignored (have %s)", name, strings.Join(ipoib.ParamNames, ", ")))
			continue
		}
		debug[name] = val
	}
	mp := ipoib.NewParams(q["send_queue_size"], q["recv_queue_size"], q["max_nonsrq_conn_qp"])
	for name, val := range debug {
		if err := mp.SetParam(name, val); err != nil {
			return nil, nil, fmt.Errorf("-param %s: %v", name, err)
		}
	}
	return mp, warnings, nil
}

func subcommandNames() string {
	var names []string
	for _, c := range subcommands {
		names = append(names, strings.Fields(c[0])[0])
	}
	return strings.Join(names, ", ")
}
