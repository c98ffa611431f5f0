package ipoib

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Params are the ib_ipoib module parameters. Queue sizes and max_nonsrq_conn_qp are
// load-time values (0444); the debug levels can be changed at run time (0644).
type Params struct {
	SendQueueSize   int
	RecvQueueSize   int
	MaxNonSRQConnQP int

	DebugLevel       atomic.Int32
	McastDebugLevel  atomic.Int32
	DataDebugLevel   atomic.Int32
	CMDataDebugLevel atomic.Int32
}

// DefaultParams returns the kernel defaults.
func DefaultParams() *Params {
	return NewParams(128, 256, 128)
}

// NewParams applies the kernel's load-time rounding and bounds: send_queue_size is
// rounded up to a power of two, capped at 8192 and raised to at least 128;
// recv_queue_size is rounded up to a power of two and clamped to [2, 8192];
// max_nonsrq_conn_qp is clamped to [0, 4096].
func NewParams(sendQ, recvQ, maxConn int) *Params {
	p := &Params{}
	p.SendQueueSize = max(min(roundPow2(sendQ), 8192), 128)
	p.RecvQueueSize = min(max(roundPow2(recvQ), 2), 8192)
	p.MaxNonSRQConnQP = min(max(maxConn, 0), 4096)
	return p
}

func roundPow2(n int) int {
	if n <= 1 {
		return 1
	}
	if n > 1<<30 {
		return 1 << 30
	}
	return 1 << bits.Len(uint(n-1))
}

// ParamNames lists the parameter files in the order the tree shows them. The data-path
// debug levels exist only in builds with the ipoib_debug_data tag, as the kernel's
// exist only with CONFIG_INFINIBAND_IPOIB_DEBUG_DATA.
var ParamNames = func() []string {
	if dataDebug {
		return []string{"cm_data_debug_level", "data_debug_level", "debug_level",
			"max_nonsrq_conn_qp", "mcast_debug_level", "recv_queue_size", "send_queue_size"}
	}
	return []string{"debug_level", "max_nonsrq_conn_qp", "mcast_debug_level", "recv_queue_size", "send_queue_size"}
}()

// ParamWritable reports whether a parameter file is 0644.
func ParamWritable(name string) bool { return strings.HasSuffix(name, "debug_level") }

// Param reads a parameter as its sysfs file shows it ("%d\n").
func (p *Params) Param(name string) (string, error) {
	var v int
	switch name {
	case "send_queue_size":
		v = p.SendQueueSize
	case "recv_queue_size":
		v = p.RecvQueueSize
	case "max_nonsrq_conn_qp":
		v = p.MaxNonSRQConnQP
	case "debug_level":
		v = int(p.DebugLevel.Load())
	case "mcast_debug_level":
		v = int(p.McastDebugLevel.Load())
	case "data_debug_level":
		v = int(p.DataDebugLevel.Load())
	case "cm_data_debug_level":
		v = int(p.CMDataDebugLevel.Load())
	default:
		return "", &Error{Op: "read", If: "module/ib_ipoib/parameters/" + name, Err: syscall.ENOENT}
	}
	if !dataDebug && strings.Contains(name, "data_debug") {
		return "", &Error{Op: "read", If: "module/ib_ipoib/parameters/" + name, Err: syscall.ENOENT}
	}
	return strconv.Itoa(v) + "\n", nil
}

// SetParam writes a run-time parameter the way the kernel's param_set_int does: an
// optionally signed integer (base auto-detected) with at most one trailing newline.
func (p *Params) SetParam(name, val string) error {
	file := "module/ib_ipoib/parameters/" + name
	var dst *atomic.Int32
	switch name {
	case "debug_level":
		dst = &p.DebugLevel
	case "mcast_debug_level":
		dst = &p.McastDebugLevel
	case "data_debug_level":
		dst = &p.DataDebugLevel
	case "cm_data_debug_level":
		dst = &p.CMDataDebugLevel
	case "send_queue_size", "recv_queue_size", "max_nonsrq_conn_qp":
		return &Error{Op: "write", If: file, Err: syscall.EACCES, Detail: "load-time parameter is read-only"}
	default:
		return &Error{Op: "write", If: file, Err: syscall.ENOENT}
	}
	if !dataDebug && dst != nil && strings.Contains(name, "data_debug") {
		return &Error{Op: "write", If: file, Err: syscall.ENOENT, Detail: "data-path debugging is not built in (build tag ipoib_debug_data)"}
	}
	s := strings.TrimSuffix(val, "\n")
	n, err := strconv.ParseInt(s, 0, 32)
	if errors.Is(err, strconv.ErrRange) { // as kstrtoint, behind the kernel's param_set_int
		return &Error{Op: "write", If: file, Err: syscall.ERANGE, Detail: fmt.Sprintf("%s is out of the int range", s)}
	}
	if err != nil {
		return &Error{Op: "write", If: file, Err: syscall.EINVAL, Detail: fmt.Sprintf("%q is not an integer", s)}
	}
	dst.Store(int32(n))
	return nil
}
