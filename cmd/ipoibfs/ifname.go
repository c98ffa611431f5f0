package main

import (
	"fmt"
	"strconv"
	"strings"

	"ipoibfs/ipoib"
)

// ifnameFlags collects -ifname ib0=uib0 (repeatable, or comma-separated): the name of
// a port's parent interface instead of ib<port-1>, for a host whose kernel ib_ipoib
// already has ib0. A bad value is refused by the flag package, which names the flag.
type ifnameFlags struct {
	byPort map[int]string // port number (1-based) -> name
	order  []string       // as given, for String
}

func (f *ifnameFlags) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.order, ",")
}

func (f *ifnameFlags) Set(v string) error {
	for _, kv := range strings.Split(v, ",") {
		kv = strings.TrimSpace(kv)
		from, to, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q: want ibN=NAME, e.g. ib0=uib0", kv)
		}
		port, err := portOfDefaultName(from)
		if err != nil {
			return fmt.Errorf("%q: %v", kv, err)
		}
		if err := ipoib.ValidIfName(to); err != nil {
			return fmt.Errorf("%q: %v (1..15 bytes, no '/', ':' or spaces)", kv, err)
		}
		if f.byPort == nil {
			f.byPort = map[int]string{}
		}
		if old, dup := f.byPort[port]; dup && old != to {
			return fmt.Errorf("%q: %s is already named %s", kv, from, old)
		}
		for p, n := range f.byPort {
			if n == to && p != port {
				return fmt.Errorf("%q: ib%d is already named %s", kv, p-1, to)
			}
		}
		f.byPort[port] = to
		f.order = append(f.order, kv)
	}
	return nil
}

// portOfDefaultName is the port whose parent is by default name: ib0 is port 1.
func portOfDefaultName(name string) (int, error) {
	digits, ok := strings.CutPrefix(name, "ib")
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 0 || n > 253 || strconv.Itoa(n) != digits {
		return 0, fmt.Errorf("%q is not a port's interface (ib0 for port 1 ... ib253)", name)
	}
	return n + 1, nil
}

// names are the parent interfaces' names on an HCA with ports ports, index port-1, as
// the engine will make them (ipoib.Options.PortNames, default NameTemplate "ib%d").
// A port beyond the HCA's, or a name another port keeps, is an error naming -ifname.
func (f *ifnameFlags) names(ports int) ([]string, error) {
	names := make([]string, ports)
	for p := 1; p <= ports; p++ {
		names[p-1] = fmt.Sprintf("ib%d", p-1)
	}
	for p, n := range f.byPort {
		if p > ports {
			return nil, fmt.Errorf("-ifname ib%d=%s: the HCA has %d port(s), ib0..ib%d", p-1, n, ports, ports-1)
		}
		names[p-1] = n
	}
	for i, n := range names {
		for j := range i {
			if names[j] == n {
				return nil, fmt.Errorf("-ifname: ib%d and ib%d would both be %s", j, i, n)
			}
		}
	}
	return names, nil
}
