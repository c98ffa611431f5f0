package ninep

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/prometheus/procfs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"ipoibfs/fs"
)

// connIdentity is what a connection's peer is known to be, before any attach.
type connIdentity struct {
	// who is the connection's own user: from the kernel for a unix socket or a
	// loopback TCP socket; nobody when it cannot be known.
	who fs.Caller
	// fromKernel: who was reported by the kernel (SO_PEERCRED, sock_diag), so a root
	// connection may attach as other users.
	fromKernel bool
	// trustNames: a remote peer on an allowed network whose attach names are believed
	// (-9p-trust-uname, the NFS sec=sys model).
	trustNames bool
	// holders, for a connection from this host that has CAP_NET_ADMIN, asks again
	// whether every process holding the client's socket has it (at each write that
	// needs it).
	holders *holders
}

// identify establishes a connection's identity. Never from what the client claims,
// except for remote peers with trustUname.
func identify(c net.Conn, diag *sockDiag, trustUname bool, unknown *fs.Caller) connIdentity {
	peer := c.RemoteAddr().String()
	nobody := fs.Caller{UID: fs.Nobody, GIDs: []uint32{fs.Nobody}, Via: "9p", Peer: peer}
	switch a := c.RemoteAddr().(type) {
	case *net.UnixAddr:
		cred, pidfd, pidErr, err := peerCred(c)
		if err != nil {
			return connIdentity{who: nobody}
		}
		id := connIdentity{who: fs.Caller{UID: cred.Uid, GIDs: []uint32{cred.Gid}, Via: "9p",
			Peer: "unix pid " + strconv.Itoa(int(cred.Pid))}, fromKernel: true}
		netAdmin, why := fs.ProcNetAdmin(uint32(cred.Pid)), fmt.Sprintf("the connecting process (pid %d) lacks it", cred.Pid)
		if netAdmin {
			// Every process holding the client's socket must have it too (one
			// the connecting process forked or handed it to), now and at each
			// write that needs it.
			if peer, err := unixPeerInode(c); err != nil {
				netAdmin, why = false, "the client's socket cannot be found: "+err.Error()
			} else {
				id.holders = newHolders(peer)
				netAdmin, why = id.holders.netAdmin()
			}
		}
		if netAdmin && pidErr != nil && !errors.Is(pidErr, unix.ENOPROTOOPT) {
			netAdmin, why = false, "the connecting process exited" // its PID may be another's
		}
		if pidfd >= 0 {
			// The peer's pidfd (SO_PEERPIDFD) holds on to the process itself: if it
			// is still alive after its capabilities were read, they were its own,
			// not those of a process that took its PID after it exited.
			// ESRCH: gone. EPERM (a daemon that may not signal it) says it lives.
			if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); netAdmin && err != nil && !errors.Is(err, unix.EPERM) {
				netAdmin, why = false, "the connecting process exited"
			}
			unix.Close(pidfd)
		}
		id.who.NetAdmin = netAdmin
		if !netAdmin {
			id.who.NoNetAdmin, id.holders = why, nil
		}
		return id
	case *net.TCPAddr:
		// From this host (through any of its addresses, not only loopback) when the
		// client's end of the connection is a socket here.
		local, _ := c.LocalAddr().(*net.TCPAddr)
		uid, inode, here, err := diag.ownerInode(a, local)
		switch {
		case err != nil:
			return connIdentity{who: nobody}
		case here:
			id := connIdentity{who: fs.Caller{UID: uid, GIDs: []uint32{primaryGID(uid)}, Via: "9p", Peer: peer}, fromKernel: true}
			// Only root's sockets are looked up: nobody else writes the tree at all.
			if uid == 0 {
				id.holders = newHolders(uint64(inode))
				var why string
				if id.who.NetAdmin, why = id.holders.netAdmin(); !id.who.NetAdmin {
					id.who.NoNetAdmin, id.holders = why, nil
				}
			}
			return id
		}
		// Another host's names are believed only from a reserved port, which only
		// its root can bind (NFS's "secure" export option): otherwise any of its
		// users could name root.
		return connIdentity{who: nobody, trustNames: trustUname && a.Port < 1024}
	}
	if unknown != nil { // net.Pipe in tests
		w := *unknown
		w.Via = "9p"
		return connIdentity{who: w, fromKernel: true}
	}
	return connIdentity{who: nobody}
}

// peerCred returns the credentials the kernel recorded for a unix socket's peer, and a
// pidfd of the peer process (SO_PEERPIDFD), which the caller closes, or why there is
// none (ENOPROTOOPT: a kernel before 6.5; otherwise the peer has exited).
func peerCred(c net.Conn) (cred *unix.Ucred, pidfd int, pidErr, err error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, -1, nil, errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, -1, nil, err
	}
	var cerr error
	pidfd = -1
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		pidfd, pidErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, -1, nil, err
	}
	if pidErr != nil {
		pidfd = -1
	}
	if cerr != nil && pidfd >= 0 {
		unix.Close(pidfd)
		pidfd = -1
	}
	return cred, pidfd, pidErr, cerr
}

// sockDiag asks the kernel (NETLINK_INET_DIAG, what ss -e uses) who owns a TCP socket
// on this host. Its netlink socket is opened where the listener is, once.
type sockDiag struct {
	mu sync.Mutex
	h  *netlink.Handle
}

func newSockDiag() *sockDiag {
	h, err := netlink.NewHandle(unix.NETLINK_INET_DIAG)
	if err != nil {
		return &sockDiag{}
	}
	return &sockDiag{h: h}
}

// ownerInode returns the uid owning, and the inode of, the established TCP socket in
// this network namespace whose own address is client and whose peer is server: the
// client's end of a connection to us. here is false when there is none (the client is
// on another host, or in another namespace). The match is exact and must be unique:
// the kernel's dump filters on the ports alone, and a closed socket with the same
// ports, in TIME_WAIT, is reported as root's with no inode, so taking the first answer
// would let anyone who reuses a port of root's be root.
func (d *sockDiag) ownerInode(client, server *net.TCPAddr) (uid, inode uint32, here bool, err error) {
	if d == nil || d.h == nil {
		return 0, 0, false, errors.New("no sock_diag netlink socket")
	}
	if client == nil || server == nil {
		return 0, 0, false, errors.New("not a TCP connection")
	}
	// A v4 client may hold an AF_INET6 socket with mapped addresses.
	families := []uint8{unix.AF_INET6}
	if client.IP.To4() != nil {
		families = []uint8{unix.AF_INET, unix.AF_INET6}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var found *netlink.Socket
	for _, fam := range families {
		var socks []*netlink.Socket
		for range 3 { // a dump interrupted by a concurrent change is retried
			if socks, err = d.h.SocketDiagTCP(fam); !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return 0, 0, false, fmt.Errorf("sock_diag %s -> %s: %w", client, server, err)
		}
		for _, s := range socks {
			if s.ID.SourcePort != uint16(client.Port) || s.ID.DestinationPort != uint16(server.Port) ||
				!s.ID.Source.Equal(client.IP) || !s.ID.Destination.Equal(server.IP) {
				continue
			}
			if found != nil {
				return 0, 0, false, fmt.Errorf("sock_diag %s -> %s: more than one socket", client, server)
			}
			found = s
		}
	}
	if found == nil {
		return 0, 0, false, nil
	}
	if found.State != tcpEstablished || found.INode == 0 {
		return 0, 0, false, fmt.Errorf("sock_diag %s -> %s: the socket is not an open one (state %d)", client, server, found.State)
	}
	return found.UID, found.INode, true, nil
}

const tcpEstablished = 1 // TCP_ESTABLISHED

// holders checks that every process holding one socket, the client's end of a
// connection, has CAP_NET_ADMIN, found as ss -p finds a socket's processes: through
// /proc/<pid>/fd. Every holder must (any of them can write through it: a client that
// forked, or handed the socket on), and every thread of it (credentials are a
// thread's, and each can write). It is asked when the connection attaches and again
// at each write that needs the capability, as the kernel asks capable() of the
// writing task at each store, by a full look each time: what can have changed since
// the last (a fork, a descriptor passed to a process that already existed) leaves no
// cheaper trace. Fail closed: a socket no process holds (the kernel's, as the Linux
// v9fs client's, or one in flight in a message), a holder whose descriptors cannot be
// read, a /proc that hides processes from the daemon, or a holder that exits while
// looked at, count as without.
type holders struct {
	want string     // "socket:[inode]"
	mu   sync.Mutex // one look at a time per connection
}

func newHolders(inode uint64) *holders {
	return &holders{want: "socket:[" + strconv.FormatUint(inode, 10) + "]"}
}

// netAdmin reports whether every holder has CAP_NET_ADMIN, and why not.
func (h *holders) netAdmin() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := procShowsAll(); err != nil {
		return false, err.Error()
	}
	// A client that starts a program forks a child that holds every descriptor of
	// the parent until its exec closes those marked close-on-exec, and which may
	// have dropped its credentials already (exec.Cmd's Credential): a refusal
	// because of such a transient holder is looked at again, for up to 100 ms.
	ok, why, transient := h.scan()
	for k := 0; !ok && transient && k < 20; k++ {
		time.Sleep(5 * time.Millisecond)
		ok, why, transient = h.scan()
	}
	return ok, why
}

// closeOnExec says whether the descriptor at fd path p (/proc/.../fd/<n>) is marked
// close-on-exec (its fdinfo's flags).
func closeOnExec(p string) bool {
	b, err := os.ReadFile(strings.Replace(p, "/fd/", "/fdinfo/", 1))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			f, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && f&unix.O_CLOEXEC != 0
		}
	}
	return false
}

// holderNetAdmin reads the capabilities of the process holding the socket at fd path
// p (/proc/<pid>/fd/<n> or /proc/<pid>/task/<tid>/fd/<n>), every thread's, and looks at
// the descriptor again after: a process that exited meanwhile may have left its PID to
// another, whose capabilities are not the socket's.
func (h *holders) holderNetAdmin(p string) (bool, string) {
	pid, _ := strconv.ParseUint(strings.SplitN(strings.TrimPrefix(p, "/proc/"), "/", 2)[0], 10, 32)
	ok, tid, err := fs.ProcThreadsNetAdmin(uint32(pid))
	switch {
	case ok:
		return true, ""
	case err != nil:
		return false, fmt.Sprintf("pid %d, holding the client's socket, cannot be looked into: %v", pid, err)
	case uint64(tid) == pid:
		return false, fmt.Sprintf("pid %d holds the client's socket without CAP_NET_ADMIN", pid)
	}
	return false, fmt.Sprintf("pid %d holds the client's socket and its thread %d has no CAP_NET_ADMIN", pid, tid)
}

// procShowsAll says why the daemon's /proc may not show it every process (mounted with
// hidepid, and the daemon without CAP_SYS_PTRACE to see past it), nil when it does: a
// holder /proc does not list would be passed over. (CAP_SYS_PTRACE does not show a
// process an LSM hides, or one of a user namespace above the daemon's.)
func procShowsAll() error {
	mounts, err := procfs.GetProcMounts(os.Getpid())
	if err != nil {
		return fmt.Errorf("the socket's holders cannot be found: /proc/self/mountinfo: %w", err)
	}
	for _, m := range mounts {
		if m.MountPoint != "/proc" || m.FSType != "proc" {
			continue
		}
		// subset=pid hides no process, only what is not one.
		if v, ok := m.SuperOptions["hidepid"]; ok && v != "0" && v != "off" {
			if !fs.ProcCap(uint32(os.Getpid()), capSysPtrace) {
				return errors.New("the socket's holders cannot all be found: /proc is mounted with hidepid and the daemon lacks CAP_SYS_PTRACE")
			}
		}
	}
	return nil
}

const capSysPtrace = 19 // CAP_SYS_PTRACE

// scan looks through every process's descriptors for the socket.
func (h *holders) scan() (ok bool, why string, transient bool) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false, fmt.Sprintf("the socket's holders cannot be found: %v", err), false
	}
	held := 0
	for _, p := range procs {
		pid, err := strconv.ParseUint(p.Name(), 10, 32)
		if err != nil {
			continue
		}
		path, err := h.procHolds("/proc/" + p.Name())
		if err != nil {
			// Whether it holds the socket matters only if it lacks the capability.
			// A process the daemon may not look into (its capabilities are more than
			// the daemon's, or its user namespace is above the daemon's) has it in
			// its own namespace: what it could write through the socket, it could
			// write itself.
			if fs.ProcNetAdminInItsNS(uint32(pid)) {
				continue
			}
			return false, fmt.Sprintf("pid %d, which may hold the client's socket and lacks CAP_NET_ADMIN, cannot be looked into: %v", pid, err), false
		}
		if path == "" {
			continue
		}
		ok, why := h.holderNetAdmin(path)
		if l, err := os.Readlink(path); err != nil || l != h.want {
			// It let the socket go (an exec closed it, or it exited and its PID may
			// be another's, whose capabilities were read): not a holder.
			continue
		}
		if !ok {
			return false, why, closeOnExec(path)
		}
		held++
	}
	if held == 0 {
		return false, "no process holds the client's socket (the kernel's, or one in flight)", false
	}
	return true, "", false
}

// procHolds returns the path of a descriptor of process dir (/proc/<pid>) that is the
// socket, "" for none. A process's threads share its descriptor table unless one has
// left it with unshare(CLONE_FILES): such a thread's own table is looked at too, found
// by kcmp(2) as CRIU finds them (every other thread's is, where kcmp cannot tell). A
// process whose first thread has exited shows no descriptors there: its other
// threads' tables are looked at then.
func (h *holders) procHolds(dir string) (string, error) {
	path, n, err := h.fdsHold(dir + "/fd/")
	if err != nil || path != "" {
		return path, err
	}
	tasks, err := os.ReadDir(dir + "/task")
	if errors.Is(err, os.ErrNotExist) {
		return "", nil // exited
	}
	if err != nil || len(tasks) < 2 {
		return "", err
	}
	pid, _ := strconv.Atoi(strings.TrimPrefix(dir, "/proc/"))
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil || tid == pid {
			continue
		}
		if n > 0 && sameFiles(pid, tid) {
			continue // the leader's table, looked at already
		}
		if path, _, err := h.fdsHold(dir + "/task/" + t.Name() + "/fd/"); err != nil || path != "" {
			return path, err
		}
	}
	return "", nil
}

// kcmpFiles is KCMP_FILES (linux/kcmp.h), which x/sys/unix does not name.
const kcmpFiles = 2

// sameFiles says whether two tasks share one descriptor table (kcmp(2), which needs
// ptrace's read access to both); false when it cannot tell.
func sameFiles(pid, tid int) bool {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(tid), kcmpFiles, 0, 0, 0)
	return errno == 0 && r == 0
}

// fdsHold looks through one descriptor table (a /proc/.../fd/ directory) for the
// socket; n is how many descriptors it has.
func (h *holders) fdsHold(dir string) (path string, n int, err error) {
	fds, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, nil // exited
	}
	if err != nil {
		return "", 0, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(dir + fd.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue // closed meanwhile
		}
		if err != nil {
			return "", 0, err
		}
		if l == h.want {
			return dir + fd.Name(), len(fds), nil
		}
	}
	return "", len(fds), nil
}

// unixPeerInode returns the inode of the socket at the other end of a unix
// connection (sock_diag's UNIX_DIAG_PEER, what ss -x shows as the peer). The accepted
// socket lives in the client's network namespace (unix_stream_connect makes it
// there), so the dump is asked in that namespace (SIOCGSKNS).
func unixPeerInode(c net.Conn) (uint64, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var own uint64
	nsfd, nsErr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) == nil {
			own = st.Ino
		}
		nsfd, nsErr = unix.IoctlRetInt(int(fd), unix.SIOCGSKNS)
	}); err != nil || own == 0 {
		return 0, errors.New("the connection's socket cannot be read")
	}
	if nsErr != nil {
		return 0, fmt.Errorf("the socket's network namespace: %w", nsErr)
	}
	defer unix.Close(nsfd)
	var socks []*netlink.UnixDiagInfoResp
	var nsSt, ownSt unix.Stat_t
	if unix.Fstat(nsfd, &nsSt) == nil && unix.Stat("/proc/thread-self/ns/net", &ownSt) == nil && nsSt.Ino == ownSt.Ino && nsSt.Dev == ownSt.Dev {
		// The daemon's own namespace: no setns (which needs CAP_SYS_ADMIN).
		socks, err = netlink.UnixSocketDiagInfo()
	} else {
		var h *netlink.Handle
		h, err = netlink.NewHandleAt(netns.NsHandle(nsfd), unix.NETLINK_SOCK_DIAG)
		if err != nil {
			return 0, fmt.Errorf("sock_diag in the socket's network namespace (another than the daemon's: CAP_SYS_ADMIN needed): %w", err)
		}
		defer h.Close()
		socks, err = h.UnixSocketDiagInfo()
	}
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	for _, s := range socks {
		if s.DiagMsg != nil && uint64(s.DiagMsg.INode) == own && s.Peer != nil {
			return uint64(*s.Peer), nil
		}
	}
	return 0, errors.New("sock_diag does not show the connection's socket")
}

func (d *sockDiag) close() {
	if d != nil && d.h != nil {
		d.h.Close()
	}
}

// primaryGID is the user's primary group from the password database (nobody's when the
// user is unknown).
func primaryGID(uid uint32) uint32 {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return fs.Nobody
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return fs.Nobody
	}
	return uint32(g)
}

// claimedUID is the user a Tattach names: n_uname when sent, else uname looked up in
// the password database. ok is false when it names nobody in particular.
func claimedUID(uname string, uid p9.UID) (uint32, bool, error) {
	if uid != p9.NoUID {
		return uint32(uid), true, nil
	}
	if uname == "" {
		return 0, false, nil
	}
	if n, err := strconv.ParseUint(uname, 10, 32); err == nil {
		return uint32(n), true, nil
	}
	u, err := user.Lookup(uname)
	if err != nil {
		return 0, false, fmt.Errorf("unknown user %q", uname)
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, false, fmt.Errorf("user %q has uid %q", uname, u.Uid)
	}
	return uint32(n), true, nil
}

// NoNetAdminUname returns the Tattach uname (with n_uname unset) that attaches as uid
// without CAP_NET_ADMIN. It only takes away: 'ipoibfs mount' attaches so for a local
// root process that lacks the capability, whose writes the server would otherwise
// take as the mount process's. A server that does not know the form looks the name
// up as a user, finds none and refuses the attach: it fails closed.
func NoNetAdminUname(uid uint32) string {
	return noNetAdminPrefix + strconv.FormatUint(uint64(uid), 10)
}

const noNetAdminPrefix = "ipoibfs:-cap_net_admin:"

// attachAs decides who one Tattach acts as. A kernel-identified root connection may
// attach as anyone (the Linux client's access=user: one connection, one attach per
// local user); any other kernel-identified connection only as itself (EPERM for
// another user); a remote connection as the named user only with trust, else nobody.
// NoNetAdminUname drops CAP_NET_ADMIN from any of these.
func (id connIdentity) attachAs(uname string, uid p9.UID) (fs.Caller, error) {
	if rest, ok := strings.CutPrefix(uname, noNetAdminPrefix); ok && uid == p9.NoUID {
		n, err := strconv.ParseUint(rest, 10, 32)
		if err != nil {
			return fs.Caller{}, linux.EINVAL
		}
		c, err := id.attachNamed("", p9.UID(n))
		c.NetAdmin = false
		return c, err
	}
	return id.attachNamed(uname, uid)
}

func (id connIdentity) attachNamed(uname string, uid p9.UID) (fs.Caller, error) {
	claimed, named, err := claimedUID(uname, uid)
	switch {
	case id.fromKernel && id.who.UID == 0:
		if err != nil {
			return fs.Caller{}, linux.EPERM
		}
		if !named {
			return id.who, nil
		}
		c := id.who
		c.UID, c.GIDs = claimed, []uint32{primaryGID(claimed)}
		c.NetAdmin = c.NetAdmin && claimed == 0 // root's connection acting for another user has none
		return c, nil
	case id.fromKernel:
		if named && claimed != id.who.UID {
			return fs.Caller{}, linux.EPERM
		}
		return id.who, nil
	case id.trustNames && named && err == nil:
		c := id.who
		c.UID, c.GIDs = claimed, []uint32{primaryGID(claimed)}
		c.NetAdmin = claimed == 0 // sec=sys: the trusted name is all there is
		return c, nil
	default:
		return id.who, nil // nobody: read-only
	}
}
