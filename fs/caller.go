package fs

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Caller is who makes a request into the tree, as the front end established it: the
// FUSE request's uid and gid from the kernel; for 9P the connection's peer credentials,
// the owner of a loopback socket, or a trusted attach name (fs/ninep). The tree decides
// access from it in one place (Node.Access) for every front end, and names it in the
// log line of every write.
type Caller struct {
	UID  uint32
	GIDs []uint32 // primary group first
	Via  string   // front end: "fuse", "9p"
	Peer string   // where the request came from: "127.0.0.1:40000", "unix pid 99"
	// PID is the process making the request where the front end knows it for each
	// request (FUSE); a log line names it with its command name, read then.
	PID uint32
	// NetAdmin: the caller holds CAP_NET_ADMIN, which net-sysfs's stores and the
	// driver's create_child/delete_child require even of uid 0. From the calling
	// process's effective capabilities where the front end knows it (FUSE, 9P on a unix
	// socket); otherwise uid 0 holds it.
	NetAdmin bool
	// ModesChecked: the front end's kernel has applied the file modes to this request
	// already (FUSE's default_permissions), with everything generic_permission counts,
	// CAP_DAC_OVERRIDE of a user other than root included; the tree then applies only
	// kernfs's own rules, which the kernel's check does not know.
	ModesChecked bool
	// NoNetAdmin says why the caller has no CAP_NET_ADMIN, where the front end knows
	// more than that the process lacks it (9P: a process holding the client's socket
	// does); it is named in the refusal.
	NoNetAdmin string
}

// Nobody is the unprivileged user (overflowuid) that unauthenticated clients act as.
const Nobody = 65534

// Internal is the daemon itself (configuration files, tests of the model).
var Internal = Caller{UID: 0, GIDs: []uint32{0}, Via: "internal", NetAdmin: true}

func (c Caller) String() string {
	s := "uid=" + strconv.FormatUint(uint64(c.UID), 10)
	if c.Via != "" {
		s += " via=" + c.Via
	}
	switch {
	case c.PID != 0:
		p := "pid " + strconv.FormatUint(uint64(c.PID), 10)
		if comm := procComm(c.PID); comm != "" {
			p += " (" + comm + ")"
		}
		s += " peer=" + strconv.Quote(p)
	case c.Peer != "":
		s += " peer=" + strconv.Quote(c.Peer)
	}
	return s
}

// procComm is a process's command name (/proc/<pid>/comm), "" when it cannot be read.
func procComm(pid uint32) string {
	if ProcIsOurs() != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// Access mask bits, as access(2): read, write, search/execute.
const (
	MayRead  = 4
	MayWrite = 2
	MayExec  = 1
)

// Access reports whether c may use n as mask asks. Every node is owned by root:root
// with the kernel's modes, so this is generic_permission for such a file: uid 0
// passes (CAP_DAC_OVERRIDE), members of group 0 get the group bits, everyone else
// the other bits. kernfs's rule comes first and holds for root as well: a file with
// no read (write) bit, or no show (store) method, cannot be opened for reading
// (writing). The error is EACCES, as the kernel's.
func (n *Node) Access(c Caller, mask int) error {
	if !n.dir {
		if mask&MayRead != 0 && (n.perm&0444 == 0 || n.read == nil) {
			return syscall.EACCES
		}
		if mask&MayWrite != 0 && (n.perm&0222 == 0 || (n.write == nil && n.commit == nil)) {
			return syscall.EACCES
		}
	}
	if c.UID == 0 || c.ModesChecked {
		return nil
	}
	bits := n.perm & 07
	if slices.Contains(c.GIDs, 0) {
		bits = n.perm >> 3 & 07
	}
	if uint32(mask)&^bits != 0 {
		return syscall.EACCES
	}
	return nil
}

// maxLogged is how much of a write its log line quotes.
const maxLogged = 64

// audit logs one line for a write that reached the engine (or was refused by it):
// "path: result; wrote "data" as who". Failures keep the "path: reason" start that
// operators grep for.
func (t *Tree) audit(c Caller, path string, data []byte, err error) syscall.Errno {
	errno, reason := describe(err)
	if t.log == nil {
		return errno
	}
	if len(data) > maxLogged {
		data = data[:maxLogged]
	}
	result := "ok"
	if err != nil {
		result = reason + " (" + errnoName(errno) + ")"
	}
	t.log(fmt.Sprintf("%s: %s; wrote %q as %s", path, result, data, c))
	return errno
}

// errnoName is the errno's symbolic name where we know it (for the log line).
func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.EACCES:
		return "EACCES"
	case syscall.EPERM:
		return "EPERM"
	case syscall.ENODEV:
		return "ENODEV"
	case syscall.ENOTUNIQ:
		return "ENOTUNIQ"
	case syscall.EEXIST:
		return "EEXIST"
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EOPNOTSUPP:
		return "EOPNOTSUPP"
	case syscall.ERANGE:
		return "ERANGE"
	case syscall.EFBIG:
		return "EFBIG"
	case syscall.EBUSY:
		return "EBUSY"
	}
	return "errno " + strconv.Itoa(int(e))
}

// ownUserNS is the daemon's user namespace ("user:[inode]"); if it cannot be read, a
// name no process's matches (then none counts as holding a capability).
var ownUserNS = sync.OnceValue(func() string {
	ns, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return "\x00" // matches no process's
	}
	return ns
})

// capNetAdmin is CAP_NET_ADMIN's bit in /proc/<pid>/status's CapEff.
const capNetAdmin = 12

// ProcNetAdmin reports whether process pid holds CAP_NET_ADMIN in its effective set
// (/proc/<pid>/status) over the daemon's user namespace: a process in another user
// namespace (unshare -U) shows every capability there, which the kernel's capable()
// does not count, so it holds none here. An unreadable status or namespace is false:
// the process exited, or the daemon may not look into it (reading /proc/<pid>/ns needs
// ptrace's read access: a daemon whose capabilities are not a superset of the
// writer's). Comparing uid_map instead would not do: a new namespace can map the
// whole range as the initial one does.
func ProcNetAdmin(pid uint32) bool {
	if ours, err := inOurUserNS(pid); err != nil || !ours {
		return false
	}
	caps, err := procCapEff(pid)
	return err == nil && caps&(1<<capNetAdmin) != 0
}

// inOurUserNS says whether process (or thread) pid is in the daemon's user namespace,
// or why it cannot be told (/proc is not the daemon's PID namespace's, or the process
// may not be looked into).
func inOurUserNS(pid uint32) (bool, error) {
	if err := ProcIsOurs(); err != nil {
		return false, err
	}
	ns, err := os.Readlink("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/ns/user")
	if err != nil {
		return false, err
	}
	return ns == ownUserNS(), nil
}

// ownUIDMap is the daemon's /proc/self/uid_map (a string no uid_map holds if it cannot
// be read: then no process's matches).
var ownUIDMap = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return "\x00"
	}
	return string(b)
})

// ProcIsOurs says why /proc does not show the daemon's own PID namespace, nil when it
// does. The kernel names processes to the daemon (a FUSE request's pid, a unix peer's)
// by their PIDs in the daemon's namespace; a daemon started in a PID namespace of its
// own with the host's /proc (unshare -p without --mount-proc) would read another
// process's capabilities under that number. Then no process counts as holding any.
var ProcIsOurs = sync.OnceValue(func() error {
	self, err := os.Readlink("/proc/self")
	if err != nil {
		return fmt.Errorf("/proc/self: %w", err)
	}
	if self != strconv.Itoa(os.Getpid()) {
		return fmt.Errorf("/proc is another PID namespace's (/proc/self is %s, the daemon's PID %d)", self, os.Getpid())
	}
	return nil
})

// ProcNetAdminInItsNS reports whether process pid holds CAP_NET_ADMIN in its effective
// set over its own user namespace, where that namespace maps users as the daemon's
// does (/proc/<pid>/uid_map, which anyone may read, the same as the daemon's): the
// daemon's own, or one only a process privileged over it could make. A user namespace
// any user can make (unshare -U) maps that user alone and gives every capability in
// it; such a process counts as without, as does one whose uid_map the daemon sees
// otherwise (a namespace above the daemon's). False when its status cannot be read.
// For a process the daemon may not look into (one with more capabilities than the
// daemon's), it says whether the process has the capability where it counts.
func ProcNetAdminInItsNS(pid uint32) bool {
	if ProcIsOurs() != nil || !ProcCap(pid, capNetAdmin) {
		return false
	}
	theirs, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/uid_map")
	return err == nil && string(theirs) == ownUIDMap()
}

// ProcCap reports whether process (or thread) pid has capability bit c in its
// effective set, over whatever user namespace it is in.
func ProcCap(pid uint32, c uint) bool {
	caps, err := procCapEff(pid)
	return err == nil && caps&(1<<c) != 0
}

// procCapEff reads a task's effective capabilities with capget(2), which any process
// may ask of any other: the same credentials /proc/<pid>/status prints, at a tenth of
// the cost of generating and parsing that file (a socket holder's every thread is
// asked at each privileged 9P write). PID 0 would be the daemon itself.
func procCapEff(pid uint32) (uint64, error) {
	if pid == 0 || pid > math.MaxInt32 {
		return 0, syscall.ESRCH
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: int32(pid)}
	var d [2]unix.CapUserData
	if err := unix.Capget(&hdr, &d[0]); err != nil {
		return 0, err
	}
	return uint64(d[0].Effective) | uint64(d[1].Effective)<<32, nil
}

// ProcThreadsNetAdmin reports whether every thread of process pid holds
// CAP_NET_ADMIN over the daemon's user namespace (ProcNetAdmin for each, with the
// namespace read once: a process's threads share theirs, since the kernel lets only
// a single-threaded process enter or make a user namespace). It returns the first
// thread found without (pid itself when the process is in another user namespace), or
// why it cannot be looked into. Threads that end while looked at are passed over.
func ProcThreadsNetAdmin(pid uint32) (ok bool, without uint32, err error) {
	ours, err := inOurUserNS(pid)
	if err != nil {
		return false, 0, err
	}
	if !ours {
		return false, pid, nil // what it has there, it has over nothing of ours
	}
	dir := "/proc/" + strconv.FormatUint(uint64(pid), 10)
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil || len(tasks) == 0 {
		return false, 0, fmt.Errorf("%s/task: %v", dir, err)
	}
	for _, t := range tasks {
		tid, err := strconv.ParseUint(t.Name(), 10, 32)
		if err != nil {
			continue
		}
		caps, err := procCapEff(uint32(tid))
		if errors.Is(err, syscall.ESRCH) {
			continue // a thread that ended meanwhile
		}
		if err != nil || caps&(1<<capNetAdmin) == 0 {
			return false, uint32(tid), nil
		}
	}
	return true, 0, nil
}
