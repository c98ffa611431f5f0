// Package ipoib is a userspace IP-over-InfiniBand engine (RFC 4391, 4392) on top of the
// verbs HCA abstraction, behaving like the Linux ib_ipoib driver: one parent interface
// per HCA port on the P_Key at index 0, P_Key children with their own UD QP, the
// broadcast group joined before carrier, IPv4/IPv6 multicast mapped to MGIDs, ARP with
// 20-byte hardware addresses and IPv6 ND with the padded option, unicast resolved through
// SA path records into address handles, and the kernel's MTU rules.
//
// The kernel side of an interface (a TUN device in the daemon, a fake in tests) is a
// Host: the engine hands it received IP packets and learns its addresses from it;
// outgoing IP packets enter through Interface.Transmit, or TransmitQueue from a host
// with several queues (each posts through a send queue of its own: tss.go).
//
// Files follow the kernel driver's split: engine.go (ipoib_main: engine, interfaces,
// attributes), ib.go (UD data path), multicast.go, path.go (neighbours and path
// records), gidmode.go (RoCE ports: groups and paths from GIDs, no SA), arp.go and
// ndisc.go (address resolution, done here because a TUN device has no link layer),
// vlan.go (P_Key children), tss.go (send queues), fs.go (debugfs text), ethtool.go,
// params.go.
//
// # Locking
//
// An interface's state is split by who uses it. The control path (sysfs writes, port
// events, the join and path task) owns Interface.mu. What the data path reads (up,
// carrier, QP ready and its ring generation, mode, MTUs, Q_Key, P_Key, broadcast
// address, host and the host's addresses) is a dataState published whole through an
// atomic pointer: Transmit, the receive loops and post load it once per batch and take
// no lock for it. The tables both paths change (neighbours, paths, multicast groups,
// connections, queued ICMP errors) are under Interface.dmu. The hardware address and
// the verbs objects are fixed once newInterface returns.
//
// Locks, outermost first; a goroutine holding one takes only those below it:
//
//  1. Interface.childOps (a parent's): one create or delete of its children at a time,
//     the kernel device included.
//  2. Bonds.mu: the list of bonds and their device maker.
//  3. Bond.hostMu: one push of a bond's state to its host at a time, as
//     Interface.hostMu (host.go).
//  4. Bond.mu: a bond's configuration and slaves (bond.go); releaseGone looks names
//     up in the engine holding it.
//  5. Engine.mu: the interface table, the watchers and the device maker.
//  6. Interface.upMu: one SetUp or close of the interface at a time, from its state
//     change to the open or stop it makes (a parent's is released before its
//     children's SetUps). A stop holds it over the SA leaves and the QP's flush (a
//     few seconds at worst), and a SetUp waits that long: a bond's Enslave under
//     Bond.mu, the device's link callback.
//  7. Interface.hostMu: one push of the interface's state to its host at a time, each
//     sending the value current when its turn comes (host.go), so the device ends
//     with the engine's latest whatever order the pushes run in.
//  8. Interface.udRx.mu and cmRxS.mu (rxState.mu): one drain of the UD (connected
//     mode's) receive CQ at a time, the receive loop's or the completion handler's on
//     the HCA's receive path, from the poll to the host's Deliver, so batches reach
//     the host in order. Never one under the other.
//  9. txLane.mu: a send queue's scratch slices (tss.go); one post at a time per
//     queue, the queues in parallel. Never two of them at once.
//  10. Interface.mu: the control path's fields (admin MTU, features, moderation,
//     children, the host's groups, the P_Key index, closed). The dataState is replaced
//     only with it held (setLocked), so a holder reads a state that stays current. A
//     child's is taken before its parent's (SetUp reads the parent's), never after.
//  11. Interface.rxMu: a received UD batch (poll, delivery from the receive buffers,
//     re-post) against restartQP posting the ring afresh, so no buffer is handed to
//     the HCA while the host reads its packet; a buffer's work request ID carries the
//     ring generation it was posted in, and a completion of an older ring is dropped,
//     its buffer posted already.
//  12. Interface.dmu: the tables, and the moment a new dataState is published
//     (setLocked takes it; publishLocked is for a holder), so that Transmit, which
//     holds it over a batch, routes on the mode and addresses its tables were made
//     for; SetMode changes the mode and empties the tables in one step.
//  13. Interface.leaveMu: leavesDone, against close waiting for the background leaves.
//  14. Interface.loopMu: whether the interface's goroutines have started (they start at
//     its first open or connection) and whether close has begun, so none starts after
//     close waits for them.
//  15. ratelimit.mu: a warning's window and counts (ratelimit.go), taken to log a
//     send path warning under any of the above and holding nothing else.
//
// Functions named ...Locked say what they need: setCarrierLocked, setMTULocked,
// wantedGroupsLocked and the bond's need mu; the table functions (sendUnicastLocked,
// sendToPeerLocked, sendToHWLocked, sendMulticastLocked, cmRouteLocked, learnLocked,
// flushPathsLocked, startJoinLocked, bcastGroupLocked, tooLongLocked,
// dropGroupLocked) need dmu; mcastRoundLocked needs both.
//
// Below all of them, and never held while this package is called: the CM's lock (its
// callbacks and listeners run on goroutines of their own, after it is released), the
// HCA's (completions and events come through channels, and the receive CQs'
// handlers, rxHandler for UD and cmRxHandler for connected mode, are called with none
// of the HCA's locks held: the soft HCA's at the end of a received batch, verbs/rdma's
// on its completion channel's goroutine), the kernel device's (its watch callbacks run
// with none held), the event log's and the loggers'.
//
// Calls out, and the locks held while they are made:
//   - Host methods: none, except Interface.hostMu and Bond.hostMu (every push of
//     state, and AttachHost), Interface.upMu (SetUp's and close's pushes), childOps
//     (a child closed or its mode set while it is created or deleted), udRx.mu and
//     cmRxS.mu (Deliver, so received batches keep their order), Interface.rxMu (the UD
//     drain's Deliver from the receive buffers, which a restart must not post again
//     meanwhile) and Bond.mu (Enslave and Bond.SetMTU set a slave's MTU and state,
//     which calls the slave's own host; a bond's own host is called after Bond.mu). A
//     Host must not call the engine from these methods, nor keep what Deliver gives it,
//     with two reads as exceptions: SetCarrier may ask Interface.SpeedMbps (the HCA
//     alone) and, a bond's host, Bond.SpeedMbps (Bond.mu, which no push holds), for
//     the link settings the carrier brings.
//   - Devices.Create and Delete: childOps or none; their implementations take
//     Interface.mu and what is below it. BondDevices.CreateBond: Bonds.mu; its
//     implementation takes the new bond's Bond.mu. DeleteBond: none.
//   - The SA client and the CM's Connect and Disconnect: none. Joins, path queries,
//     leaves and connections run on goroutines of their own.
//   - The HCA: under Interface.mu on the control path (QP state, attach and detach,
//     address handles, the receive ring, with rxMu where the ring is posted); on the
//     data path recvLoop's PostRecv under rxMu.
//     PostSend is made under a txLane.mu alone (post) or no lock.
//   - Options.Event and the loggers: under any lock.
//
// Where a lock is dropped to call out: the ...Locked functions that change what a host
// sees (setCarrierLocked, setMTULocked; a bond's selectActiveLocked,
// changeActiveLocked, carrierLocked, hostSetupLocked, releaseLocked) return closures
// that the caller runs after unlocking; Transmit and resend resolve under dmu and post
// after it, and hand the ICMP errors they made to the host after txLane.mu; the
// connected-mode drain delivers with no lock but its rxState's (and answers ARP and
// ND after dmu), the UD drain with its rxState's and rxMu (from the receive buffers;
// a batch with ARP or ND is copied and goes after rxMu, its ARP and ND first); the
// goroutines of joins, path queries and connections take the locks again to finish,
// and cmConnect checks that its connection is still current before keeping what it
// made. Engine.Close, eventLoop and SetDevices copy the interface list under Engine.mu
// and call the interfaces after it.
//
// The data path takes dmu once per batch (Transmit over the batch's classification
// and resolution, the connected-mode drain over its completions; ARP and ND per
// packet), a drain's rxState.mu and rxMu once per received batch, and never mu. It
// reads a bond's active slave and host through atomics and counts with atomics.
// lockorder_test.go checks this order and these rules on the code.
package ipoib
