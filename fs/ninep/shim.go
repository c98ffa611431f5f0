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
// every request through except Tauth, which it answers itself with Rlerror(ENOENT) —
// diod's "authentication not required". Writing, it reassembles the server's
// several-writes-per-message output into whole frames, so an injected reply never lands
// inside another message.
type authShim struct {
	net.Conn

	rmu  sync.Mutex
	rbuf []byte // rest of the current request frame for the server

	wmu  sync.Mutex
	wbuf []byte // server output not yet a whole frame
}

func newAuthShim(c net.Conn) *authShim { return &authShim{Conn: c} }

func (s *authShim) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for len(s.rbuf) == 0 {
		f, err := readFrame(s.Conn)
		if err != nil {
			return 0, err
		}
		if f[4] == msgTauth {
			if err := s.writeFrame(rlerror([2]byte{f[5], f[6]}, enoent)); err != nil {
				return 0, err
			}
			continue
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
	}
	if len(s.wbuf) == 0 {
		s.wbuf = nil
	}
	return len(p), nil
}
