package main

import (
	"fmt"
	"log"
	"os"

	"ipoibfs/verbs"
	"ipoibfs/verbs/soft"
)

// loadFabricKey reads -fabric-key: random bytes, at least soft.MinFabricKeyLen of them,
// in a file only its owner may read or write (as ssh refuses a private key others can
// read).
func loadFabricKey(file string) ([]byte, error) {
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("-fabric-key: %w", err)
	}
	if m := st.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("-fabric-key %s: mode %04o lets group or others read or write the key; chmod 600 %s", file, m, file)
	}
	key, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("-fabric-key: %w", err)
	}
	if len(key) < soft.MinFabricKeyLen {
		return nil, fmt.Errorf("-fabric-key %s: %d bytes, want at least %d random bytes (head -c 32 /dev/urandom > %s)", file, len(key), soft.MinFabricKeyLen, file)
	}
	return key, nil
}

// reportInactive says, for each port that is not ACTIVE while it should have joined
// the subnet manager at sm, why it probably is not.
func reportInactive(hca *soft.HCA, sm string, keyed bool) {
	for n := 1; n <= hca.NumPorts(); n++ {
		p := hca.SoftPort(n)
		if a := p.Attr(); a.State == verbs.PortActive || a.LID != 0 && a.PhysState == verbs.PhysPolling {
			continue // active, or configured with its link down (a link fault): the SM answers
		}
		why := "is the subnet manager running there?"
		if keyed {
			why = fmt.Sprintf("%d management messages without a valid MAC were dropped here; a -fabric-key different from the fabric's is the likely cause", p.AuthFailures())
		}
		log.Printf("port %d: not ACTIVE: no valid answer from the subnet manager at %s (%s)", n, sm, why)
	}
}
