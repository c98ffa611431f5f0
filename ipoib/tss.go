package ipoib

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"ipoibfs/verbs"
)

// Send queues (the vendor's TSS): a host that transmits from several queues at once
// (a multi-queue TUN device, a reader per queue) gives the interface as many send
// queues, so that their batches are encoded and posted in parallel instead of one at a
// time. Queue 0 posts on the interface's own QP; the others on send-only QPs that carry
// its number (verbs.QPAttr.SourceQPN), so peers see one address whichever queue a
// packet left from. A flow stays in its host queue, so its packets keep their order.
// What the queues share (the tables, under dmu) is held only to classify and resolve a
// batch; the post, where the HCA encodes and sends, is the queue's own.

// maxSendQueues bounds SetSendQueues: the kernel's TUN device has at most 256 queues.
const maxSendQueues = 256

// txLane is one send queue. Its mu serialises the queue's posts, so the scratch slices
// are reused.
type txLane struct {
	mu    sync.Mutex
	qp    verbs.QP    // the interface's own QP for queue 0
	scq   verbs.CQ    // its send CQ (the interface's for queue 0)
	ready atomic.Bool // queues after the first: in RTS (set under the interface's mu)
	wrs   []verbs.SendWR
	hdr   [][encapLen]byte
	out   []outFrame
	// unsig counts the sends posted since the last signalled one (signalEvery).
	unsig int
}

// signalEvery returns after how many unsignalled sends one is signalled, for a send
// queue of size entries. A provider takes back the slot of an unsignalled send only
// with a later completion (verbs/rdma, as a real send queue), so without one every
// post after the queue's size failed with a full queue; the driver signals every
// send, which on the soft HCA would cost a completion a packet. Half the queue
// leaves room for the batch in flight until the completion is reaped (at each post).
func signalEvery(entries int) int { return max(1, entries/2) }

// SetSendQueues gives the interface n send queues for TransmitQueue. It only adds: a
// count at or below the current one changes nothing. A device that cannot send under
// another QP's number (errors.ErrUnsupported) leaves the interface with one queue and
// the error says so; packets of any queue still go out, through the first.
func (i *Interface) SetSendQueues(n int) error {
	if n < 1 || n > maxSendQueues {
		return &Error{Op: "set_send_queues", If: i.Name(), Err: syscall.EINVAL,
			Detail: fmt.Sprintf("%d send queues outside 1..%d", n, maxSendQueues)}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return &Error{Op: "set_send_queues", If: i.Name(), Err: syscall.ENODEV}
	}
	lanes := *i.lanes.Load()
	if n <= len(lanes) {
		return nil
	}
	grown := append([]*txLane(nil), lanes...)
	var err error
	for len(grown) < n {
		// A CQ each: one shared by the queues would overflow with their error
		// completions, sized for one queue's sends.
		var cq verbs.CQ
		if cq, err = i.e.dev.CreateCQ(verbs.CQAttr{Entries: i.e.params.SendQueueSize}); err != nil {
			break
		}
		var qp verbs.QP
		qp, err = i.e.dev.CreateQP(verbs.QPAttr{Type: verbs.QPTypeUD, Port: i.port, SendCQ: cq, RecvCQ: cq,
			MaxSendWR: i.e.params.SendQueueSize, MaxRecvWR: 1, SourceQPN: i.qp.Num()})
		if err != nil {
			_ = cq.Close()
			break
		}
		l := &txLane{qp: qp, scq: cq}
		if i.data().qpReady {
			l.ready.Store(i.laneUpLocked(l))
		}
		grown = append(grown, l)
	}
	i.lanes.Store(&grown)
	if err != nil {
		e := &Error{Op: "set_send_queues", If: i.Name(), Err: err,
			Detail: fmt.Sprintf("%d of %d send queues made", len(grown), n)}
		if errors.Is(err, errors.ErrUnsupported) {
			e.Detail += "; the HCA cannot send as another QP"
		}
		return e
	}
	return nil
}

// SendQueues returns the number of send queues.
func (i *Interface) SendQueues() int { return len(*i.lanes.Load()) }

// lane returns the send queue for host queue q: the first when that queue's QP is not
// ready (it follows the interface's QP, and a restart may have failed for it alone).
func (i *Interface) lane(q int) *txLane {
	lanes := *i.lanes.Load()
	if l := lanes[uint(q)%uint(len(lanes))]; l.ready.Load() {
		return l
	}
	return lanes[0]
}

// lanesUpLocked brings the queues after the first up with the interface's QP.
// Called with mu held.
func (i *Interface) lanesUpLocked() {
	for _, l := range (*i.lanes.Load())[1:] {
		l.ready.Store(i.laneUpLocked(l))
	}
}

// lanesDownLocked takes the queues after the first down with the interface's QP, as
// resetQPLocked does: error state, their flushed sends reaped (a provider's send
// slots come back with them), reset. Called with mu held.
func (i *Interface) lanesDownLocked() {
	for _, l := range (*i.lanes.Load())[1:] {
		l.ready.Store(false)
		_ = l.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPErr})
		i.reapCQ(l.scq)
		_ = l.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPReset})
	}
}

// lanesQKeyLocked gives the queues after the first the interface's new Q_Key (a
// send with a controlled Q_Key uses the QP's own). Called with mu held.
func (i *Interface) lanesQKeyLocked(qkey uint32) {
	for _, l := range (*i.lanes.Load())[1:] {
		_ = l.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskQKey, QKey: qkey})
	}
}

// closeLanes destroys the queues' QPs after the first, as close destroys the
// interface's.
func (i *Interface) closeLanes() {
	for _, l := range (*i.lanes.Load())[1:] {
		l.ready.Store(false)
		_ = l.qp.Close()
		_ = l.scq.Close()
	}
}

// laneUpLocked takes a send queue's QP to RTS with the interface's P_Key index and
// Q_Key, and reports whether it got there. Called with mu held.
func (i *Interface) laneUpLocked(l *txLane) bool {
	err := l.qp.Modify(verbs.QPModify{Mask: verbs.QPMaskState, State: verbs.QPReset})
	if err == nil {
		err = verbs.UDToRTS(l.qp, i.pkeyIndex, i.data().qkey)
	}
	if err != nil {
		i.e.log.Printf("%s: send queue QP %#x to RTS: %v", i.Name(), uint32(l.qp.Num()), err)
		return false
	}
	return true
}
