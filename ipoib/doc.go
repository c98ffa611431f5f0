// Package ipoib is a userspace IP-over-InfiniBand engine (RFC 4391, 4392) on top of the
// verbs HCA abstraction, behaving like the Linux ib_ipoib driver: one parent interface
// per HCA port on the P_Key at index 0, P_Key children with their own UD QP, the
// broadcast group joined before carrier, IPv4/IPv6 multicast mapped to MGIDs, ARP with
// 20-byte hardware addresses and IPv6 ND with the padded option, unicast resolved through
// SA path records into address handles, and the kernel's MTU rules.
//
// The kernel side of an interface (a TUN device in the daemon, a fake in tests) is a
// Host: the engine hands it received IP packets and learns its addresses from it;
// outgoing IP packets enter through Interface.Transmit.
//
// Files follow the kernel driver's split: engine.go (ipoib_main: engine, interfaces,
// attributes), ib.go (UD data path), multicast.go, path.go (neighbours and path
// records), gidmode.go (RoCE ports: groups and paths from GIDs, no SA), arp.go and
// ndisc.go (address resolution, done here because a TUN device has no link layer),
// vlan.go (P_Key children), fs.go (debugfs text), ethtool.go, params.go.
//
// Locking: Engine.mu guards the interface list. Each Interface has one mutex, mu, for
// its control state (mode, MTU, carrier, groups, paths, neighbours, queues); the data
// path takes it briefly per batch and never calls the Host or the HCA while holding it,
// except PostSend/PostRecv, which do not call back. Statistics are atomics.
package ipoib
