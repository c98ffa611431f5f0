package ninep

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
)

// 9P framing: size[4] (including itself) type[1] tag[2] body.
const (
	frameHeader = 7
	maxFrame    = 8 << 20 // above p9's 4 MiB msize cap
	msgRlerror  = 7
	msgTauth    = 102
	enoent      = 2
)

var errFrame = errors.New("9p: malformed frame")

// readFrame reads one whole 9P message from r.
func readFrame(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n < frameHeader || n > maxFrame {
		return nil, errFrame
	}
	f := make([]byte, n)
	copy(f, h[:])
	if _, err := io.ReadFull(r, f[4:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return f, nil
}

// rlerror builds Rlerror{ecode} for tag.
func rlerror(tag [2]byte, ecode uint32) []byte {
	r := make([]byte, 11)
	binary.LittleEndian.PutUint32(r, 11)
	r[4] = msgRlerror
	copy(r[5:7], tag[:])
	binary.LittleEndian.PutUint32(r[7:], ecode)
	return r
}

// authShim wraps a client connection in front of the p9 server. Reading, it passes
// every request through, except Tauth when answerTauth is set, which it answers itself
// with Rlerror(ENOENT) — diod's "authentication not required". Writing, it reassembles
// the server's several-writes-per-message output into whole frames, so an injected
// reply never lands inside another message. It also bounds the requests in flight: p9
// handles each request in its own goroutine, so without a bound a client that
// pipelines requests without reading replies would grow the daemon; a new request is
// read only while fewer than cap(slots) replies are owed.
type authShim struct {
	net.Conn
	answerTauth bool
	slots       chan struct{}
	closed      chan struct{} // closed by Close: a read waiting for a slot gives up
	closeOnce   sync.Once
	dead        chan struct{} // closed when reading the connection fails: the client is gone
	deadOnce    sync.Once

	rmu  sync.Mutex
	rbuf []byte // rest of the current request frame for the server

	wmu  sync.Mutex
	wbuf []byte // server output not yet a whole frame
}

// DefaultMaxOutstanding bounds the requests of one connection in flight.
const DefaultMaxOutstanding = 64

func newAuthShim(c net.Conn) *authShim { return newShim(c, true, DefaultMaxOutstanding) }

func newShim(c net.Conn, answerTauth bool, maxOutstanding int) *authShim {
	return &authShim{Conn: c, answerTauth: answerTauth, slots: make(chan struct{}, maxOutstanding),
		closed: make(chan struct{}), dead: make(chan struct{})}
}

// Done is closed once the client is gone (reading its connection failed or it was
// closed): requests still waiting (a stream's read) should give up.
func (s *authShim) Done() <-chan struct{} { return s.dead }

func (s *authShim) markDead() { s.deadOnce.Do(func() { close(s.dead) }) }

// Close closes the connection and releases a read waiting for a reply slot.
func (s *authShim) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	s.markDead()
	return s.Conn.Close()
}

func (s *authShim) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for len(s.rbuf) == 0 {
		f, err := readFrame(s.Conn)
		if err != nil {
			s.markDead()
			return 0, err
		}
		if f[4] == msgTauth && s.answerTauth {
			if err := s.writeFrame(rlerror([2]byte{f[5], f[6]}, enoent)); err != nil {
				return 0, err
			}
			continue
		}
		select { // one reply owed; waits while the bound is reached
		case s.slots <- struct{}{}:
		case <-s.closed:
			return 0, net.ErrClosed
		}
		s.rbuf = f
	}
	n := copy(p, s.rbuf)
	s.rbuf = s.rbuf[n:]
	return n, nil
}

// writeFrame sends one whole frame of our own.
func (s *authShim) writeFrame(f []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.Conn.Write(f)
	return err
}

// Write collects server output and sends each complete frame in one write.
func (s *authShim) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wbuf = append(s.wbuf, p...)
	for len(s.wbuf) >= 4 {
		n := binary.LittleEndian.Uint32(s.wbuf)
		if n < frameHeader || n > maxFrame {
			s.wbuf = nil
			return 0, errFrame
		}
		if uint32(len(s.wbuf)) < n {
			break
		}
		if _, err := s.Conn.Write(s.wbuf[:n]); err != nil {
			return 0, err
		}
		s.wbuf = s.wbuf[n:]
		select {
		case <-s.slots: // a reply paid
		default:
		}
	}
	if len(s.wbuf) == 0 {
		s.wbuf = nil
	}
	return len(p), nil
}
