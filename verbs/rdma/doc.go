// Package rdma is the verbs provider for real HCAs: the verbs interfaces implemented
// over rdma-core's libibverbs (devices, ports, completion queues with a completion
// channel, UD queue pairs, address handles, multicast, asynchronous events) and
// libibumad (the port's QP1 MAD agent for the SA client and the CM).
//
// It needs cgo and rdma-core's development files (Debian: libibverbs-dev,
// libibumad-dev) and is built only with the build tag rdma on Linux:
//
//	go build -tags rdma ./cmd/ipoibfs
//
// Without the tag this file is all there is and the default build stays pure Go.
//
// The MAD agent runs on libibumad alone (OpenMADPort), without an ibverbs device:
// that is how it is checked here, with libumad2sim redirecting libibumad to an ibsim
// fabric where unmodified OpenSM is the SA (see sa_umad2sim_test.go). The SA class is
// registered with RMPP version 1, so the kernel's MAD layer joins long answers; Call
// matches responses on the low 32 bits of the transaction ID (the MAD layer owns the
// high 32) and resends after each timeout itself, since umad2sim reports none.
//
// Data buffers: the device registers one memory region per queue pair, carved into
// fixed slots (send and receive rings), once; posted buffers are copied into a slot
// on send and out of it when Poll returns the completion, so no Go memory is ever
// handed to the HCA.
//
// The ibverbs data path is checked on the kernel's soft-RoCE driver (rdma_rxe) in the
// QEMU guest of internal/vm (rxe_test.go): two rxe devices over a veth pair, device
// list and ports, UD send/receive in both directions addressed by GID, immediate data,
// Q_Keys, batches, multicast attach/detach, port events, flushes.
//
// Not implemented yet: RC queue pairs and SRQ (Modify and CreateQP refuse RC with
// verbs.ErrInvalid), port counters (zero), and a Device for a RoCE port's
// GID-derived addressing: a port does not say a GID's type (RoCE v1/v2) or netdev,
// and AttachMcast on RoCE does not join the IPv6 group on the netdev, which the 6.1
// kernel's rxe needs to receive multicast (rxe_test.go joins it from a socket).
package rdma
