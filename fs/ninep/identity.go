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

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/vishvananda/netlink"
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
		netAdmin := fs.ProcNetAdmin(uint32(cred.Pid))
		if netAdmin {
			// Every process holding the client's socket must have it too (one
			// the connecting process forked or handed it to); none found: the
			// kernel holds it (a v9fs mount), the connecting process counts.
			if peer, ok := unixPeerInode(c); ok {
				if held, all := socketHoldersNetAdmin(peer); held > 0 && !all {
					netAdmin = false
				}
			}
		}
		if pidErr != nil && !errors.Is(pidErr, unix.ENOPROTOOPT) {
			netAdmin = false // the peer is gone: its PID may be another's
		}
		if pidfd >= 0 {
			// The peer's pidfd (SO_PEERPIDFD) holds on to the process itself: if it
			// is still alive after its capabilities were read, they were its own,
			// not those of a process that took its PID after it exited.
			// ESRCH: gone. EPERM (a daemon that may not signal it) says it lives.
			if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); netAdmin && err != nil && !errors.Is(err, unix.EPERM) {
				netAdmin = false
			}
			unix.Close(pidfd)
		}
		return connIdentity{who: fs.Caller{UID: cred.Uid, GIDs: []uint32{cred.Gid}, Via: "9p",
			Peer: "unix pid " + strconv.Itoa(int(cred.Pid)), NetAdmin: netAdmin}, fromKernel: true}
	case *net.TCPAddr:
		// From this host (through any of its addresses, not only loopback) when the
		// client's end of the connection is a socket here.
		local, _ := c.LocalAddr().(*net.TCPAddr)
		uid, inode, here, err := diag.ownerInode(a, local)
		switch {
		case err != nil:
			return connIdentity{who: nobody}
		case here:
			// Only root's sockets are looked up: nobody else writes the tree at all.
			netAdmin := uid == 0 && socketNetAdmin(inode)
			return connIdentity{who: fs.Caller{UID: uid, GIDs: []uint32{primaryGID(uid)}, Via: "9p", Peer: peer, NetAdmin: netAdmin}, fromKernel: true}
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

// socketNetAdmin reports whether the processes holding the socket with this inode hold
// CAP_NET_ADMIN, found as ss -p finds a socket's processes: through /proc/<pid>/fd.
// Every holder must (any of them can write through it: a client that forked, or handed
// the socket on); a socket whose process is not found (another PID namespace) has
// none. A holder's fd is looked at again after its capabilities are read: a process
// that exited meanwhile may have left its PID to another, whose capabilities are not
// the socket's. Fail closed in each case.
func socketNetAdmin(inode uint32) bool {
	held, all := socketHoldersNetAdmin(inode)
	return held > 0 && all
}

// socketHoldersNetAdmin counts the processes holding the socket with this inode and
// says whether all of them hold CAP_NET_ADMIN (false as soon as one does not, or one
// cannot be seen).
func socketHoldersNetAdmin(inode uint32) (held int, all bool) {
	want := "socket:[" + strconv.FormatUint(uint64(inode), 10) + "]"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, p := range procs {
		pid, err := strconv.ParseUint(p.Name(), 10, 32)
		if err != nil {
			continue
		}
		dir := "/proc/" + p.Name() + "/fd/"
		fds, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited
		}
		if err != nil {
			return held + 1, false // a process whose descriptors cannot be seen may hold it
		}
		for _, fd := range fds {
			if l, err := os.Readlink(dir + fd.Name()); err != nil || l != want {
				continue
			}
			held++
			if !fs.ProcNetAdmin(uint32(pid)) {
				return held, false
			}
			if l, err := os.Readlink(dir + fd.Name()); err != nil || l != want {
				return held, false // gone, or its PID reused
			}
			break
		}
	}
	return held, true
}

// unixPeerInode returns the inode of the socket at the other end of a unix
// connection (sock_diag's UNIX_DIAG_PEER, what ss -x shows as the peer).
func unixPeerInode(c net.Conn) (uint32, bool) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var own uint64
	if err := raw.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) == nil {
			own = st.Ino
		}
	}); err != nil || own == 0 {
		return 0, false
	}
	socks, err := netlink.UnixSocketDiagInfo()
	if err != nil {
		return 0, false
	}
	for _, s := range socks {
		if s.DiagMsg != nil && uint64(s.DiagMsg.INode) == own && s.Peer != nil {
			return *s.Peer, true
		}
	}
	return 0, false
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
