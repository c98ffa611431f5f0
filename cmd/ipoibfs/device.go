package main

import (
	"flag"
	"fmt"
	"log"
	"strings"

	"ipoibfs/fs"
	"ipoibfs/verbs"
)

// The HCA the daemon runs on: the soft HCA on its fabric (softhca.go, the default), or
// with -hca NAME an rdma-core device (hca_rdma.go, build tag rdma). Everything above
// it (engine, kernel devices, tree, events, interface files) is the same for both;
// what only the soft HCA has (its fabric, subnet manager, endpoints) stays behind
// daemonHCA.

// daemonHCA is the device the engine runs on with what the daemon does around it.
type daemonHCA interface {
	// device is the verbs device itself (not wrapped, so that the tree sees every
	// interface it implements).
	device() verbs.Device
	// treeSM is the subnet manager the tree shows as sm/, or nil.
	treeSM() fs.SubnetManager
	// started logs what was opened (the soft HCA's endpoints and subnet manager).
	started()
	// ready runs once the daemon is ready (the soft fabric's key warning).
	ready()
	// tick runs every 5 s (the soft HCA says why a port is not ACTIVE).
	tick()
	// reload serves SIGHUP and the tree's reload: what it did ("" when this HCA has
	// nothing to reload), or why it could not.
	reload() (string, error)
}

// hcaPlan is the HCA chosen and checked on the command line, before anything starts.
type hcaPlan struct {
	ports int                       // its number of ports, for the interface names
	open  func() (daemonHCA, error) // the soft HCA joins or hosts its fabric here
	// release gives back what choosing took, when open is never called (the rdma
	// device is opened while choosing, to know its ports); nil when nothing.
	release func()
}

// planDevice plans -hca NAME: planRDMA (hca_rdma.go, or the error of a build without
// rdma-core); tests put any verbs device there.
var planDevice = planRDMA

// softOnlyFlags configure the soft HCA and its fabric; with -hca they would be
// ignored, so they are refused.
var softOnlyFlags = []string{"name", "ports", "sm", "fabric", "listen", "partitions", "fabric-key"}

// checkHCAFlags refuses soft-only flags given together with -hca.
func checkHCAFlags(fl *flag.FlagSet, hca string) error {
	if hca == "" {
		return nil
	}
	var given []string
	fl.Visit(func(f *flag.Flag) {
		for _, s := range softOnlyFlags {
			if f.Name == s {
				given = append(given, "-"+s)
			}
		}
	})
	if len(given) == 0 {
		return nil
	}
	verb := "configures"
	if len(given) > 1 {
		verb = "configure"
	}
	return fmt.Errorf("-hca %s: %s %s only the soft HCA and its fabric; an rdma-core device has its own ports and GUIDs, and the fabric's subnet manager (OpenSM) manages it",
		hca, strings.Join(given, ", "), verb)
}

// plainHCA is a verbs device with nothing around it: no subnet manager of ours, no
// endpoints (an rdma-core device).
type plainHCA struct{ dev verbs.Device }

func (h plainHCA) device() verbs.Device     { return h.dev }
func (h plainHCA) treeSM() fs.SubnetManager { return nil }
func (h plainHCA) ready()                   {}
func (h plainHCA) tick()                    {}
func (h plainHCA) reload() (string, error)  { return "", nil }

// started logs the device and the state of its ports; the subnet manager is the
// fabric's, so a port that is not ACTIVE says where to look.
func (h plainHCA) started() {
	d := h.dev
	log.Printf("HCA %s: %d ports, firmware %s, node GUID %v", d.Name(), d.NumPorts(), d.FWVersion(), d.NodeGUID())
	for n := 1; n <= d.NumPorts(); n++ {
		p, err := d.Port(n)
		if err != nil {
			log.Printf("port %d: %v", n, err)
			continue
		}
		a := p.Attr()
		log.Printf("port %d: %v (%s, LID %#x, SM LID %#x, MTU %d)", n, a.State, a.LinkLayer, a.LID, a.SMLID, a.ActiveMTU.Bytes())
		if a.State != verbs.PortActive {
			log.Printf("port %d: not ACTIVE: is the link up and a subnet manager (OpenSM) running on the fabric?", n)
		}
	}
}

// logPortEvent logs an asynchronous event with the port's attributes after it.
func logPortEvent(dev verbs.Device, ev verbs.Event) {
	p, err := dev.Port(ev.Port)
	if err != nil {
		log.Printf("port %d: %v", ev.Port, ev.Type)
		return
	}
	a := p.Attr()
	log.Printf("port %d: %v (state %v, LID %#x, SM LID %#x, P_Keys %v)", ev.Port, ev.Type, a.State, a.LID, a.SMLID, p.PKeyTable())
}
