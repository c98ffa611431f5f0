//go:build !linux

package soft

import (
	"errors"
	"net"
)

// Without Linux UDP segmentation offload, endpoints send and receive plain datagrams.

const udpGSOCmsgSpace = 0

func forceSockBufs(*net.UDPConn, int) {}

func udpGSOSupported(*net.UDPConn) bool { return false }

func setUDPGRO(*net.UDPConn, bool) error { return errors.ErrUnsupported }

func putUDPGSOSize(b []byte, _ int) []byte { return b }

func udpGROSize([]byte) int { return 0 }

func udpGSORefused(error) bool { return false }
