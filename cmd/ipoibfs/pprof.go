//go:build pprof

package main

import (
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

// Built with -tags pprof, the daemon writes a CPU profile to $IPOIBFS_CPUPROFILE from
// start to SIGINT/SIGTERM, for finding data-path hot spots.
func init() {
	path := os.Getenv("IPOIBFS_CPUPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		return
	}
	_ = pprof.StartCPUProfile(f)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		<-ch
		pprof.StopCPUProfile()
		f.Close()
	}()
}
