package main

import (
	"fmt"
	"log"
	"strings"

	"github.com/coreos/go-systemd/v22/daemon"

	"ipoibfs/ipoib"
)

// sdNotify tells the service manager (systemd's NOTIFY_SOCKET, Type=notify) about the
// daemon's state; without NOTIFY_SOCKET it does nothing. go-systemd's daemon package is
// the library systemd's own Go users share, so the datagram format, abstract socket
// names and unsetting of the variable are not ours to get wrong.
func sdNotify(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Printf("sd_notify: %v", err)
	}
}

// readyStatus is the STATUS= line sent with READY=1: what is now usable.
func readyStatus(eng *ipoib.Engine, mount, mountOff, ninep string) string {
	var names []string
	for _, i := range eng.Interfaces() {
		names = append(names, i.Name())
	}
	s := fmt.Sprintf("interfaces %s", strings.Join(names, " "))
	if mount != "" {
		s += "; tree at " + mount
	}
	if mountOff != "" {
		s += "; FUSE mount off: " + mountOff
	}
	if ninep != "" {
		s += "; 9P on " + ninep
	}
	return s
}
