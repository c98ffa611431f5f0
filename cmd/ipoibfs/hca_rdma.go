//go:build rdma && linux

package main

import (
	"fmt"
	"io"

	"ipoibfs/verbs/rdma"
)

// hcaCommand serves -hca list: what libibverbs sees.
func hcaCommand(name string, stdout io.Writer) error { return listHCAs(stdout) }

// planRDMA opens the named device, so its ports are known before anything starts;
// the daemon runs the engine on it as on the soft HCA.
func planRDMA(name string) (*hcaPlan, error) {
	dev, err := rdma.Open(name)
	if err != nil {
		return nil, fmt.Errorf("-hca %s: %w", name, err)
	}
	h := plainHCA{dev: dev}
	return &hcaPlan{
		ports:   dev.NumPorts(),
		open:    func() (daemonHCA, error) { return h, nil },
		release: func() { dev.Close() },
	}, nil
}

// listHCAs prints one line per device and one per port, like ibv_devinfo in short.
func listHCAs(w io.Writer) error {
	devs, err := rdma.Devices()
	if err != nil {
		return fmt.Errorf("-hca list: %w", err)
	}
	if len(devs) == 0 {
		fmt.Fprintln(w, "no RDMA devices (libibverbs lists none: no HCA, or its kernel driver and ib_uverbs are not loaded)")
		return nil
	}
	for _, d := range devs {
		if d.Err != nil {
			fmt.Fprintf(w, "%s\tnode_guid %v\t%v\n", d.Name, d.NodeGUID, d.Err)
			continue
		}
		fmt.Fprintf(w, "%s\tnode_guid %v\tfw %s\t%d ports\n", d.Name, d.NodeGUID, d.FW, len(d.Ports))
		for _, p := range d.Ports {
			a := p.Attr
			fmt.Fprintf(w, "  port %d\t%v\t%s\tLID %#x\tSM LID %#x\tMTU %d (max %d)\trate %d Mb/s (%dX)\tGID %v\t%d P_Keys\n",
				p.Num, a.State, a.LinkLayer, a.LID, a.SMLID, a.ActiveMTU.Bytes(), a.MaxMTU.Bytes(), a.Rate.Mbps(), a.Width, p.GID0, p.PKeyCount)
		}
	}
	return nil
}
