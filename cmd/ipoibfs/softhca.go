package main

import (
	"fmt"
	"log"
	"net/netip"
	"os"

	"ipoibfs/fs"
	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
	"ipoibfs/verbs/soft/partitions"
)

// softFlags are the flags of the soft HCA and its fabric.
type softFlags struct {
	name, sm, fabric, listen, partFile, fabricKey string
	ports                                         int
}

// planSoft checks the soft HCA's flags (a bad address is a usage error, said with bad)
// and returns the plan that reads the key and partitions and starts the HCA on its
// fabric: hosting the subnet manager (-sm, or the embedded fabric) or joining one.
func planSoft(f softFlags, bad func(string, ...any) error) (*hcaPlan, error) {
	cfg := soft.Config{Name: f.name, Ports: f.ports, Logger: log.Default()}
	switch {
	case f.sm != "":
		a, err := netip.ParseAddrPort(f.sm)
		if err != nil {
			return nil, bad("-sm %q: %v", f.sm, err)
		}
		cfg.Network, cfg.Listen, cfg.HostSM = soft.UDPNetwork{}, a, true
	case f.fabric != "":
		a, err := netip.ParseAddrPort(f.fabric)
		if err != nil {
			return nil, bad("-fabric %q: %v", f.fabric, err)
		}
		l, err := netip.ParseAddrPort(f.listen)
		if err != nil {
			return nil, bad("-listen %q: %v", f.listen, err)
		}
		if f.partFile != "" {
			return nil, bad("-partitions needs -sm or the embedded fabric: only the subnet manager reads it")
		}
		cfg.Network, cfg.Listen, cfg.SM = soft.UDPNetwork{}, l, a
	}
	open := func() (daemonHCA, error) {
		if f.fabricKey != "" {
			key, err := loadFabricKey(f.fabricKey)
			if err != nil {
				return nil, err
			}
			cfg.FabricKey = key
		}
		if f.partFile != "" {
			p, err := loadPartitions(f.partFile)
			if err != nil {
				return nil, err
			}
			cfg.Partitions = p
		}
		if cfg.Network == nil { // embedded
			cfg.Network, cfg.HostSM = soft.NewMemNetwork(), true
		}
		hca, err := soft.New(cfg)
		if err != nil {
			return nil, err
		}
		return &softHCA{hca: hca, fabric: f.fabric, partFile: f.partFile, keyed: cfg.FabricKey != nil}, nil
	}
	return &hcaPlan{ports: f.ports, open: open}, nil
}

// softHCA is the soft HCA on its fabric.
type softHCA struct {
	hca      *soft.HCA
	fabric   string // the subnet manager joined (-fabric), "" when hosting it
	partFile string // -partitions, reloaded on SIGHUP where the subnet manager runs
	keyed    bool   // -fabric-key
}

func (s *softHCA) device() verbs.Device { return s.hca }

func (s *softHCA) treeSM() fs.SubnetManager {
	if sm := s.hca.SM(); sm != nil { // a nil *soft.SM in the interface would not be nil
		return sm
	}
	return nil
}

func (s *softHCA) started() {
	for i := 1; i <= s.hca.NumPorts(); i++ {
		log.Printf("port %d: endpoint %s", i, s.hca.Endpoint(i))
	}
	if sm := s.hca.SM(); sm != nil {
		log.Printf("subnet manager on %s", sm.Addr())
	}
}

func (s *softHCA) ready() {
	if !s.keyed {
		log.Printf("fabric unauthenticated: management messages are not signed (see -fabric-key)")
	}
}

// tick: a port that never becomes ACTIVE says why, every few seconds.
func (s *softHCA) tick() {
	if s.fabric != "" {
		reportInactive(s.hca, s.fabric, s.keyed)
	}
}

// reload re-reads -partitions where the subnet manager runs; a bad file keeps the
// previous partitions.
func (s *softHCA) reload() (string, error) {
	sm := s.hca.SM()
	if sm == nil || s.partFile == "" {
		return "", nil
	}
	p, err := loadPartitions(s.partFile)
	if err != nil {
		return "", fmt.Errorf("%w; keeping the previous partitions", err)
	}
	sm.SetPartitions(p)
	return "partitions reloaded from " + s.partFile, nil
}

// loadPartitions reads a partitions.conf (-partitions).
func loadPartitions(file string) (*partitions.Config, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("-partitions: %w", err)
	}
	defer f.Close()
	return partitions.Parse(file, f)
}
