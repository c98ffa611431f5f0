//go:build pprof

package main

import (
	"log"
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/ on the default mux
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

// Built with -tags pprof, the daemon writes a CPU profile to $IPOIBFS_CPUPROFILE from
// start until SIGUSR1 (for data-path hot spots), and serves net/http/pprof (heap,
// goroutines, allocations) on $IPOIBFS_PPROF_ADDR, which must be a loopback address.
func init() {
	if path := os.Getenv("IPOIBFS_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			_ = pprof.StartCPUProfile(f)
			ch := make(chan os.Signal, 1)
			signal.Notify(ch, syscall.SIGUSR1)
			go func() {
				<-ch
				pprof.StopCPUProfile()
				f.Close()
			}()
		}
	}
	if addr := os.Getenv("IPOIBFS_PPROF_ADDR"); addr != "" {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			log.Printf("IPOIBFS_PPROF_ADDR %q: not a loopback address; pprof not served", addr)
			return
		}
		go func() { log.Print(http.ListenAndServe(addr, nil)) }()
	}
}
