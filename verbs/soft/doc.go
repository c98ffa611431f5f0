// Package soft is a software HCA on a software fabric: it implements the verbs
// interfaces (devices, ports, CQs, UD and RC queue pairs, address handles, multicast,
// asynchronous events, MADs on QP1) for machines without InfiniBand hardware.
//
// The pieces, a file each:
//   - hca.go: the HCA (verbs.Device) and its configuration; info.go the facts sysfs shows.
//   - port.go: a port, its attributes, P_Key table and GID, the receive demultiplexer,
//     and the GSI agent (QP1) that carries SA and CM MADs.
//   - qp.go: UD queue pairs and completion queues (with moderation; CQ rings grow to
//     their capacity as completions pile up); rc.go: the RC requester and responder
//     (PSNs, ACK/NAK, retransmission, RNR) over the same datagrams.
//   - transport.go: the fabric itself, MemNetwork (in one process) and UDPNetwork (a
//     UDP socket per port, RoCEv2-shaped packets on port 4791, batched with GSO/GRO
//     where the kernel has them), plus the fault injector behind sm/faults.
//   - sm.go and ctl.go: the subnet manager (LIDs, ACTIVE ports, P_Key tables from
//     partitions.conf, routes, the SA in sadb) and its QP0 control messages with the
//     ports; fabrickey.go: the optional fabric key that authenticates them and every MAD.
//   - capture.go: a per-port tap below the fault injector for the tree's capture files.
//
// Packets are encoded with verbs/wire (a UDP payload starting at the BTH, as RoCEv2), so
// tshark decodes a capture of the UDP fabric, and the SA answers raw SA MADs the same
// way OpenSM does (checked against OpenSM on ibsim in the conformance tests).
package soft
