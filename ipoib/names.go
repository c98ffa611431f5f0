package ipoib

import (
	"fmt"
	"syscall"
)

// ValidIfName says whether name may name a network interface, as the kernel's
// dev_valid_name: 1..15 bytes, not "." or "..", no '/', ':' or whitespace.
func ValidIfName(name string) error { return validIfName(name) }

// parentNames are the names of the ports' parent interfaces, index port-1:
// Options.PortNames where it names the port, NameTemplate elsewhere. A name that is
// not a valid interface name, or that two ports would share, is EINVAL.
func (o *Options) parentNames(ports int) ([]string, error) {
	for n := range o.PortNames {
		if n < 1 || n > ports {
			return nil, fmt.Errorf("parent interface names: PortNames names port %d of an HCA with %d ports: %w", n, ports, syscall.EINVAL)
		}
	}
	names := make([]string, ports)
	seen := map[string]int{}
	for n := 1; n <= ports; n++ {
		name, ok := o.PortNames[n]
		if !ok {
			name = fmt.Sprintf(o.NameTemplate, n-1)
		}
		if err := validIfName(name); err != nil {
			return nil, fmt.Errorf("parent interface names: port %d: %v: %w", n, err, syscall.EINVAL)
		}
		if m, dup := seen[name]; dup {
			return nil, fmt.Errorf("parent interface names: ports %d and %d would both be %s: %w", m, n, name, syscall.EINVAL)
		}
		seen[name] = n
		names[n-1] = name
	}
	return names, nil
}
