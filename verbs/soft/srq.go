package soft

import (
	"fmt"
	"sync"

	"ipoibfs/verbs"
)

// SRQ is a soft shared receive queue (verbs.SRQ).
type SRQ struct {
	hca *HCA
	max int

	mu     sync.Mutex
	q      []verbs.RecvWR // posted buffers, FIFO
	h      int            // head index into q
	users  int            // QPs created with it
	closed bool
}

// CreateSRQ creates a shared receive queue.
func (h *HCA) CreateSRQ(attr verbs.SRQAttr) (verbs.SRQ, error) {
	if attr.MaxWR <= 0 || attr.MaxWR > 1<<16 {
		return nil, &verbs.Error{Op: "create_srq", Obj: h.cfg.Name, Err: fmt.Errorf("%w: max_wr %d", verbs.ErrInvalid, attr.MaxWR)}
	}
	if h.cfg.NoSRQ {
		return nil, &verbs.Error{Op: "create_srq", Obj: h.cfg.Name, Err: fmt.Errorf("%w: the HCA has no shared receive queues", verbs.ErrInvalid)}
	}
	h.mu.RLock()
	closed := h.closed
	h.mu.RUnlock()
	if closed {
		return nil, &verbs.Error{Op: "create_srq", Obj: h.cfg.Name, Err: verbs.ErrClosed}
	}
	return &SRQ{hca: h, max: attr.MaxWR}, nil
}

func (s *SRQ) String() string { return s.hca.cfg.Name + " srq" }

// PostRecv adds buffers to the pool.
func (s *SRQ) PostRecv(wrs []verbs.RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, &verbs.Error{Op: "post_srq_recv", Obj: s.String(), Err: verbs.ErrClosed}
	}
	if s.h > 0 && s.h == len(s.q) {
		s.q, s.h = s.q[:0], 0
	}
	for n, wr := range wrs {
		if len(s.q)-s.h >= s.max {
			return n, &verbs.Error{Op: "post_srq_recv", Obj: s.String(), Err: verbs.ErrQueueFull}
		}
		s.q = append(s.q, wr)
	}
	return len(wrs), nil
}

// take hands the oldest posted buffer to a receiving QP.
func (s *SRQ) take() (wr verbs.RecvWR, ok, last bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == len(s.q) {
		return verbs.RecvWR{}, false, false
	}
	wr = s.q[s.h]
	s.q[s.h] = verbs.RecvWR{}
	s.h++
	return wr, true, s.h == len(s.q)
}

// use and release count the QPs drawing from the pool, which may not be destroyed
// while any does (ibv_destroy_srq: EBUSY).
func (s *SRQ) use() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return verbs.ErrClosed
	}
	s.users++
	return nil
}

func (s *SRQ) release() {
	s.mu.Lock()
	s.users--
	s.mu.Unlock()
}

// Close destroys the SRQ; posted buffers are dropped without completions.
func (s *SRQ) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users > 0 {
		return &verbs.Error{Op: "destroy_srq", Obj: s.String(), Err: fmt.Errorf("%w: %d QPs use it", verbs.ErrBusy, s.users)}
	}
	s.closed = true
	s.q, s.h = nil, 0
	return nil
}
