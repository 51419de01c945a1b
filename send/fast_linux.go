//go:build linux

package send

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxSendfileChunk bounds one sendfile call (Linux transfers at most
// 0x7ffff000 bytes a call anyway).
const maxSendfileChunk = 1 << 30

// fastState is the progress of one WriteTo on the socket path. It lives in
// the Builder so that the RawConn.Write callback, which the runtime calls
// again after each wait for writability, allocates nothing.
type fastState struct {
	cur     cursor // start of the next batch
	vec     [][]byte
	iov     []unix.Iovec
	pending error // error to return once vec is written (a short read)

	// The sendfile in progress: part sfPart from byte sfStart; sfOff is
	// the next file offset, sfRem the bytes still to send.
	sfPart  int
	sfStart int64
	sfOff   int64
	sfRem   int64
	sfSrc   io.ReaderAt      // the source of sfConn, kept for the next region
	sfConn  syscall.RawConn  // raw connection of sfSrc
	sfCtl   func(fd uintptr) // cached method value of sendfileCtl
	outFD   int
	sfN     int
	sfErr   error
	sfTried bool // at least one byte of the region was sent

	n   int64
	err error

	// outW is the writer of the last WriteTo on the socket path and outRC
	// its raw connection, kept for the next WriteTo to the same writer
	// (SyscallConn allocates).
	outW  io.Writer
	outRC syscall.RawConn
}

// fileClosed gives the error of a closed *os.File's raw connection
// (internal/poll's ErrFileClosing, which File.Read and File.Write turn
// into os.ErrClosed but RawConn passes on as is) os.ErrClosed's identity,
// so that callers match it as they do a File.Write's.
func fileClosed(err error) error {
	if err != nil && !errors.Is(err, os.ErrClosed) && err.Error() == "use of closed file" {
		return fmt.Errorf("%w (%w)", os.ErrClosed, err)
	}
	return err
}

// fastConn returns the raw connection of w if w takes the socket path.
func fastConn(w io.Writer) (rc syscall.RawConn, ok bool, err error) {
	var sc syscall.Conn
	switch c := w.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		// Only stream sockets: writev on a datagram socket would send one
		// datagram per call.
		if a := c.LocalAddr(); a == nil || a.Network() != "unix" {
			return nil, false, nil
		}
		sc = c
	case *os.File:
		sc = c
	default:
		return nil, false, nil
	}
	rc, err = sc.SyscallConn()
	if err != nil {
		return nil, true, fmt.Errorf("send: %w", err)
	}
	return rc, true, nil
}

// conn is fastConn(w), from the cache when w is the last writer (a type
// fastConn accepts is a pointer, so comparing w with it cannot panic).
func (s *fastState) conn(w io.Writer) (rc syscall.RawConn, ok bool, err error) {
	if s.outRC != nil && s.outW == w {
		return s.outRC, true, nil
	}
	rc, ok, err = fastConn(w)
	if ok && err == nil {
		s.outW, s.outRC = w, rc
	}
	return rc, ok, err
}

// writeFast writes the response with writev and sendfile when w is a
// socket (or file); handled is false when w does not qualify.
func (b *Builder) writeFast(w io.Writer) (n int64, handled bool, err error) {
	s := &b.fast
	rc, ok, err := s.conn(w)
	if !ok {
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	*s = fastState{iov: s.iov, sfCtl: s.sfCtl, outW: s.outW, outRC: s.outRC}
	if b.fastFor != b { // first use, or b was copied since
		s.sfCtl, b.fastStep, b.fastFor = b.sendfileCtl, b.step, b
	}
	werr := rc.Write(b.fastStep)
	n, err = s.n, s.err
	if err == nil && werr != nil {
		err = fmt.Errorf("send: %w", fileClosed(werr))
	}
	s.vec, s.sfSrc, s.sfConn, s.pending, s.err = nil, nil, nil, nil, nil
	return n, true, err
}

// step is the RawConn.Write callback: it writes until the response is done
// or fails (true), or until the socket is full (false: the runtime waits
// for writability, or for the deadline, and calls it again).
func (b *Builder) step(fd uintptr) bool {
	s := &b.fast
	for {
		switch {
		case len(s.vec) > 0:
			if !b.writevStep(int(fd)) {
				return s.err != nil
			}
		case s.sfRem > 0:
			if !b.sendfileStep(int(fd)) {
				return s.err != nil
			}
		case s.pending != nil:
			s.err = s.pending
			return true
		case s.cur.i >= len(b.parts):
			return true
		default:
			next, sf := b.plan(s.cur, true)
			if sf {
				pt := &b.parts[s.cur.i]
				if s.sfConn == nil || !sameFile(s.sfSrc, pt.f) {
					conn, err := pt.f.(syscall.Conn).SyscallConn()
					if err != nil {
						s.err = fmt.Errorf("send: sendfile source: %w", fileClosed(err))
						return true
					}
					s.sfSrc, s.sfConn = pt.f, conn
				}
				s.sfPart, s.sfStart = s.cur.i, s.cur.off
				s.sfOff, s.sfRem = pt.off+s.cur.off, pt.n-s.cur.off
				s.sfTried = false
				s.cur = cursor{s.cur.i + 1, 0}
				continue
			}
			s.pending = b.load()
			s.vec = b.vec
			s.cur = next
		}
	}
}

// writevStep makes one writev call. It returns false when the caller must
// stop: s.err set (done, with error) or socket full (wait).
func (b *Builder) writevStep(fd int) bool {
	s := &b.fast
	iov := s.iov[:0]
	for _, p := range s.vec[:min(len(s.vec), iovMax)] {
		var v unix.Iovec
		v.Base = &p[0]
		v.SetLen(len(p))
		iov = append(iov, v)
	}
	s.iov = iov
	r, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	clear(iov) // keep no pointers to the caller's memory
	b.stats.Writev++
	switch {
	case errno == 0 && r > 0:
		b.advance(int64(r))
		s.vec = consume(s.vec, int(r))
		if len(s.vec) > 0 {
			b.stats.Partial++
		}
		return true
	case errno == 0:
		s.err = fmt.Errorf("send: writev: %w", io.ErrUnexpectedEOF)
		return false
	case errno == unix.EINTR:
		return true
	case errno == unix.EAGAIN:
		b.stats.EAGAIN++
		return false
	default:
		s.err = fmt.Errorf("send: writev: %w", os.NewSyscallError("writev", errno))
		return false
	}
}

// sendfileStep makes one sendfile call, with the same result convention
// as writevStep.
func (b *Builder) sendfileStep(fd int) bool {
	s := &b.fast
	s.outFD, s.sfN, s.sfErr = fd, 0, nil
	if err := s.sfConn.Control(s.sfCtl); err != nil {
		s.err = fmt.Errorf("send: sendfile source: %w", fileClosed(err))
		return false
	}
	b.stats.Sendfile++
	n, err := s.sfN, s.sfErr
	if n > 0 {
		s.sfTried = true
		s.sfOff += int64(n)
		s.sfRem -= int64(n)
		b.advance(int64(n))
	}
	switch {
	case err == nil && n > 0:
		if s.sfRem > 0 {
			b.stats.Partial++
		}
		return true
	case err == nil:
		s.err = fmt.Errorf("%w: sendfile found end of file at offset %d, %d bytes short", ErrRegionPastEOF, s.sfOff, s.sfRem)
		return false
	case errors.Is(err, unix.EINTR):
		return true
	case errors.Is(err, unix.EAGAIN):
		b.stats.EAGAIN++
		return false
	case errors.Is(err, unix.EOVERFLOW),
		!s.sfTried && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)):
		// The source or destination does not support sendfile, or the
		// offset is past the largest file the source's or destination's
		// file system holds (EOVERFLOW, also mid-region; pread still
		// reads the source there, or finds its end): read the rest of the
		// region into memory instead.
		b.parts[s.sfPart].sendfile = false
		s.cur = cursor{s.sfPart, s.sfOff - b.parts[s.sfPart].off}
		s.sfRem = 0
		return true
	default:
		s.err = fmt.Errorf("send: sendfile: %w", os.NewSyscallError("sendfile", err))
		return false
	}
}

// sendfileCtl runs inside the source file's RawConn.Control, so the
// descriptor stays valid during the call.
func (b *Builder) sendfileCtl(infd uintptr) {
	s := &b.fast
	off := s.sfOff
	s.sfN, s.sfErr = unix.Sendfile(s.outFD, int(infd), &off, int(min(s.sfRem, maxSendfileChunk)))
	s.sfN = max(s.sfN, 0)
}

func (b *Builder) advance(n int64) {
	b.fast.n += n
	b.stats.Bytes += n
}

// consume drops the first n bytes of vec.
func consume(vec [][]byte, n int) [][]byte {
	for n > 0 && len(vec) > 0 {
		if n < len(vec[0]) {
			vec[0] = vec[0][n:]
			return vec
		}
		n -= len(vec[0])
		vec[0] = nil
		vec = vec[1:]
	}
	return vec
}
