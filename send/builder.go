package send

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"syscall"
)

// Errors returned by this package. They are wrapped with context; match
// them with errors.Is.
var (
	// ErrInvalidRegion is returned by AddFile for a nil file, a negative
	// offset or length, or a region whose end overflows int64.
	ErrInvalidRegion = errors.New("send: invalid file region")
	// ErrRegionPastEOF is returned by WriteTo when a file region extends
	// past the end of its file. The bytes of the response before the first
	// missing byte have been written (WriteTo's count says how many
	// reached the writer); nothing after it is written.
	ErrRegionPastEOF = errors.New("send: file region past end of file")
	// ErrShortWrite is returned by WriteTo when a writer other than a
	// socket or file it writes to directly (a plain io.Writer, or a
	// net.Conn wrapper) accepted fewer bytes than it was given without
	// returning an error.
	ErrShortWrite = errors.New("send: short write")
)

// Defaults used for the zero fields of Options (and by a zero Builder).
const (
	// DefaultCopyThreshold is the largest slice AddBytes copies into the
	// coalescing buffer. Encoded headers (tens of bytes) are copied, so
	// consecutive ones become one buffer; record data (a KiB or more) is
	// referenced and costs one iovec instead of a copy.
	DefaultCopyThreshold = 512
	// DefaultReadThreshold is the largest file region that is read with
	// ReadAt into builder-owned memory and sent in the surrounding writev
	// rather than by its own sendfile. The package documentation gives the
	// measurements behind it.
	DefaultReadThreshold = 32 << 10
	// DefaultMaxReadBuffer bounds the builder-owned memory holding file data
	// read for one gathering write. When more is needed, the response is
	// sent in several gathering writes.
	DefaultMaxReadBuffer = 1 << 20
	// minReadBuffer is the smallest read buffer accepted, so progress is
	// made in reasonably sized steps.
	minReadBuffer = 4 << 10
)

// iovMax is the largest number of buffers handed to one gathering write.
// It is Linux's IOV_MAX (and net.Buffers' limit).
const iovMax = 1024

// Options tunes a Builder. The zero value selects the defaults.
type Options struct {
	// CopyThreshold is the size up to which AddBytes copies a slice into
	// the coalescing buffer instead of referencing it. Zero selects
	// DefaultCopyThreshold; a negative value makes AddBytes always
	// reference (AddCopy still copies).
	CopyThreshold int
	// ReadThreshold is the size up to which a file region that could be
	// sent with sendfile is instead read into memory and sent with the
	// surrounding slices in one writev. Zero selects DefaultReadThreshold;
	// a negative value sends every such region with sendfile.
	ReadThreshold int64
	// MaxReadBuffer bounds the memory (in bytes) the Builder uses to hold
	// file data read for one gathering write; the Builder keeps it across
	// Reset. Zero or negative selects DefaultMaxReadBuffer; values below
	// 4 KiB are raised to 4 KiB.
	MaxReadBuffer int
}

// withDefaults returns o with zero fields replaced by defaults and
// out-of-range values clamped.
func (o Options) withDefaults() Options {
	if o.CopyThreshold == 0 {
		o.CopyThreshold = DefaultCopyThreshold
	}
	if o.ReadThreshold == 0 {
		o.ReadThreshold = DefaultReadThreshold
	}
	if o.MaxReadBuffer <= 0 {
		o.MaxReadBuffer = DefaultMaxReadBuffer
	}
	if o.MaxReadBuffer < minReadBuffer {
		o.MaxReadBuffer = minReadBuffer
	}
	return o
}

// Stats counts what a Builder did. Counters accumulate over the Builder's
// life (Reset does not clear them): take the difference of two snapshots to
// measure one WriteTo.
type Stats struct {
	// Writev counts gathering writes: writev system calls on the socket
	// path, including calls that returned EAGAIN; on the portable path,
	// batches handed to one of the net package's connections through
	// net.Buffers.
	Writev int64
	// Sendfile counts sendfile system calls, including calls that returned
	// EAGAIN.
	Sendfile int64
	// Write counts single-buffer Write calls on the portable path (a writer
	// that is not a socket).
	Write int64
	// EAGAIN counts writev and sendfile calls that found the socket full
	// and were resumed once the runtime poller reported it writable.
	EAGAIN int64
	// Partial counts writev and sendfile calls that wrote some, but not
	// all, of what remained of their batch or file region (the socket
	// filled up during the call); the next call resumes it. On the socket
	// path, a WriteTo that succeeds makes one call per batch and per
	// sendfile region, plus one for each EAGAIN and each Partial.
	Partial int64
	// Pread counts ReadAt calls reading file regions into memory.
	Pread int64
	// Bytes counts bytes written.
	Bytes int64
}

// Syscalls returns the number of write-side calls: Writev + Sendfile +
// Write. Calls that returned EAGAIN are included.
func (s Stats) Syscalls() int64 { return s.Writev + s.Sendfile + s.Write }

// Sub returns s - t, counter by counter.
func (s Stats) Sub(t Stats) Stats {
	return Stats{
		Writev:   s.Writev - t.Writev,
		Sendfile: s.Sendfile - t.Sendfile,
		Write:    s.Write - t.Write,
		EAGAIN:   s.EAGAIN - t.EAGAIN,
		Partial:  s.Partial - t.Partial,
		Pread:    s.Pread - t.Pread,
		Bytes:    s.Bytes - t.Bytes,
	}
}

type partKind uint8

const (
	kindRef   partKind = iota // caller memory, referenced
	kindOwned                 // a range of Builder.buf
	kindFile                  // a file region
)

// part is one piece of the response. Parts are never empty.
type part struct {
	kind partKind
	// sendfile is set for file regions whose source exposes a descriptor
	// (syscall.Conn); it is cleared if the kernel refuses sendfile for it.
	sendfile bool
	p        []byte      // kindRef
	lo, hi   int         // kindOwned: b.buf[lo:hi]
	f        io.ReaderAt // kindFile
	off, n   int64       // kindFile
}

// cursor is a position in the response: byte off of parts[i].
type cursor struct {
	i   int
	off int64
}

// entry is one buffer of a batch: caller or owned memory (p != nil), or
// n bytes of file data at roff in the read buffer.
type entry struct {
	p       []byte
	roff, n int
}

// span is one ReadAt: n bytes of f at off into the read buffer at roff.
type span struct {
	f       io.ReaderAt
	off     int64
	roff, n int
}

// Builder assembles a response from byte slices and file regions and
// writes it with as few system calls as it can (see the package
// documentation). The zero value is ready to use with default Options.
//
// A Builder is not safe for concurrent use. Distinct Builders may be used
// concurrently, also when they reference the same files: file data is
// always read at explicit offsets. A copy of a Builder value shares its
// buffers, so once a Builder is copied (as when a slice of Builders
// grows), only one of the two may be used again.
//
// On Linux a Builder keeps the socket (or file) it last wrote to, with its
// raw connection, until it writes to another, so that writing responses
// to one connection allocates nothing; Reset does not drop it. Sendfile
// regions are the exception: a WriteTo takes the raw connection of each
// file it sends from (once for consecutive regions of one file), one small
// allocation each, and drops them when it returns.
type Builder struct {
	opts     Options
	optsSet  bool
	parts    []part
	buf      []byte // coalescing buffer for copied slices
	size     int64
	stats    Stats
	rbuf     []byte // file data read for the current batch
	rlen     int    // bytes of rbuf planned for the current batch
	ents     []entry
	spans    []span
	vec      [][]byte // the current batch, ready to write
	fast     fastState
	fastStep func(fd uintptr) bool
	// fastFor is the Builder that fastStep (and fast's cached method
	// values) are bound to: a Builder copied after use, as a growing
	// slice of Builders copies them, must not run its original's.
	fastFor *Builder
}

// NewBuilder returns a Builder using opts (zero fields select defaults).
func NewBuilder(opts Options) *Builder {
	return &Builder{opts: opts.withDefaults(), optsSet: true}
}

func (b *Builder) options() *Options {
	if !b.optsSet {
		b.opts = b.opts.withDefaults()
		b.optsSet = true
	}
	return &b.opts
}

// Len returns the number of bytes the response holds.
func (b *Builder) Len() int64 { return b.size }

// Stats returns the counters accumulated since the Builder was created.
func (b *Builder) Stats() Stats { return b.stats }

// Reset empties the response, keeping the Builder's memory (parts list,
// coalescing buffer, read buffer) for reuse. It drops the Builder's
// references to slices and files added before, so the caller may modify
// or close them after Reset.
func (b *Builder) Reset() {
	clear(b.parts)
	b.parts = b.parts[:0]
	b.buf = b.buf[:0]
	b.size = 0
}

// AddBytes appends p to the response.
//
// If len(p) is at most the CopyThreshold (DefaultCopyThreshold for a zero
// Builder), p is copied into the Builder's coalescing buffer and the caller
// may reuse p at once. Otherwise the Builder keeps a reference to p: the
// caller must not modify p until Reset is called (or the Builder is no
// longer used); WriteTo only reads it. Consecutive copied slices become
// one buffer, and consecutive referenced slices that are adjacent in
// memory are joined.
func (b *Builder) AddBytes(p []byte) {
	if len(p) == 0 {
		return
	}
	if len(p) <= b.options().CopyThreshold {
		b.AddCopy(p)
		return
	}
	b.size += int64(len(p))
	if k := len(b.parts) - 1; k >= 0 && b.parts[k].kind == kindRef && adjacent(b.parts[k].p, p) {
		last := b.parts[k].p
		b.parts[k].p = last[:len(last)+len(p)]
		return
	}
	b.parts = append(b.parts, part{kind: kindRef, p: p})
}

// AddCopy appends a copy of p to the response, whatever its size; the
// caller may reuse p at once.
func (b *Builder) AddCopy(p []byte) {
	if len(p) == 0 {
		return
	}
	b.size += int64(len(p))
	lo := len(b.buf)
	b.buf = append(b.buf, p...)
	if k := len(b.parts) - 1; k >= 0 && b.parts[k].kind == kindOwned && b.parts[k].hi == lo {
		b.parts[k].hi = len(b.buf)
		return
	}
	b.parts = append(b.parts, part{kind: kindOwned, lo: lo, hi: len(b.buf)})
}

// AddFile appends n bytes of f starting at offset off to the response.
// The data is read when WriteTo runs, always at explicit offsets (ReadAt,
// or sendfile with an offset), never through the file's shared offset, so
// any number of Builders may send regions of one file concurrently.
//
// If f also implements syscall.Conn, as *os.File does, WriteTo may send the
// region with sendfile from f's descriptor, which must then read the same
// bytes as f.ReadAt. f must stay open until WriteTo returns; the Builder
// never closes it and drops its reference on Reset. A region that is
// adjacent in the file to the region added just before it (same f, off
// equal to that region's end) is merged with it.
//
// AddFile returns ErrInvalidRegion (and adds nothing) for a nil f (or a
// nil pointer, func or channel in f, such as a nil *os.File), a negative
// off or n, off+n overflowing int64, or a response that would pass
// MaxInt64 bytes (Len). Whether the region lies inside the file is
// checked by WriteTo (ErrRegionPastEOF). An empty region adds nothing.
func (b *Builder) AddFile(f io.ReaderAt, off, n int64) error {
	if isNil(f) || off < 0 || n < 0 || off > maxInt64-n || n > maxInt64-b.size {
		return fmt.Errorf("%w: offset %d length %d", ErrInvalidRegion, off, n)
	}
	if n == 0 {
		return nil
	}
	b.size += n
	if k := len(b.parts) - 1; k >= 0 {
		last := &b.parts[k]
		if last.kind == kindFile && last.off+last.n == off && sameFile(last.f, f) {
			last.n += n
			return nil
		}
	}
	_, sf := f.(syscall.Conn)
	b.parts = append(b.parts, part{kind: kindFile, f: f, off: off, n: n, sendfile: sf})
	return nil
}

const maxInt64 = 1<<63 - 1

// adjacent reports whether b starts right where a ends in memory, within
// a's capacity, so that a[:len(a)+len(b)] is a followed by b.
func adjacent(a, b []byte) bool {
	if cap(a)-len(a) < len(b) {
		return false
	}
	return &a[:len(a)+1][len(a)] == &b[0]
}

// vecLen returns the total length of bufs.
func vecLen(bufs [][]byte) int64 {
	var n int64
	for _, p := range bufs {
		n += int64(len(p))
	}
	return n
}

// isNil reports whether f is nil or holds a nil pointer, func or
// channel (nil maps and slices have methods that work).
func isNil(f any) bool {
	switch f := f.(type) {
	case *os.File:
		return f == nil
	case *net.TCPConn:
		return f == nil
	case nil:
		return true
	}
	switch v := reflect.ValueOf(f); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// sameFile reports whether a and b are the same value, without panicking
// on incomparable values: the check is on the values, since a comparable
// type (a struct with an interface field) can hold an incomparable one.
// Pointers, *os.File among them, are compared directly: reflect's
// Comparable allocates, and this runs for every region of a response.
func sameFile(a, b io.ReaderAt) bool {
	t := reflect.TypeOf(a)
	switch {
	case t != reflect.TypeOf(b):
		return false
	case t == nil || t.Kind() == reflect.Pointer:
		return a == b
	}
	return reflect.ValueOf(a).Comparable() && reflect.ValueOf(b).Comparable() && a == b
}

// WriteTo writes the response to w and returns the number of bytes
// written. It implements io.WriterTo. The response is not consumed: a
// second call writes it again.
//
// On Linux, when w is a *net.TCPConn, a stream *net.UnixConn or an
// *os.File, runs of memory go out with writev and large file regions with
// sendfile, inside one RawConn.Write: partial writes are resumed, EAGAIN
// waits in the runtime poller, and w's write deadline is honoured. Because
// the connection's write lock is held for the whole response, concurrent
// WriteTo calls on one connection do not interleave their bytes there.
// Any other writer gets the same bytes through plain Write calls (through
// net.Buffers for the net package's own connections).
//
// On error, the count says how many bytes of the response reached w; the
// rest was not written, and the stream is mid-response, so the caller
// should normally close it. Errors wrap the cause: ErrRegionPastEOF, a
// read error of a file, os.ErrDeadlineExceeded, net.ErrClosed,
// syscall.EPIPE or syscall.ECONNRESET for a peer that went away, or
// ErrShortWrite. A nil w is an error, with nothing written.
func (b *Builder) WriteTo(w io.Writer) (int64, error) {
	b.options()
	if isNil(w) {
		return 0, errors.New("send: WriteTo a nil writer")
	}
	if len(b.parts) == 0 {
		return 0, nil
	}
	n, handled, err := b.writeFast(w)
	if !handled {
		n, err = b.writePlain(w)
	}
	clear(b.vec)
	b.vec = b.vec[:0]
	clear(b.ents)
	clear(b.spans)
	return n, err
}

// plan fills b.ents and b.spans with the next batch, starting at cur: at
// most iovMax buffers and MaxReadBuffer bytes of file data. If sendfile is
// true, file regions that are sendfile candidates larger than ReadThreshold
// end the batch; if such a region is at cur, plan returns sf = true and an
// empty batch. next is where the following batch starts.
func (b *Builder) plan(cur cursor, sendfile bool) (next cursor, sf bool) {
	clear(b.ents) // drop references held by the previous batch
	clear(b.spans)
	b.ents = b.ents[:0]
	b.spans = b.spans[:0]
	b.rlen = 0
	maxRead := b.opts.MaxReadBuffer
	for i := cur.i; i < len(b.parts); i++ {
		var skip int64
		if i == cur.i {
			skip = cur.off
		}
		pt := &b.parts[i]
		switch pt.kind {
		case kindRef, kindOwned:
			if len(b.ents) == iovMax {
				return cursor{i, skip}, false
			}
			p := pt.p
			if pt.kind == kindOwned {
				p = b.buf[pt.lo:pt.hi]
			}
			b.ents = append(b.ents, entry{p: p[skip:]})
		case kindFile:
			if sendfile && pt.sendfile && pt.n > b.opts.ReadThreshold {
				return cursor{i, skip}, len(b.ents) == 0
			}
			room := maxRead - b.rlen
			if room == 0 {
				return cursor{i, skip}, false
			}
			k := len(b.ents) - 1
			if k < 0 || b.ents[k].p != nil {
				if len(b.ents) == iovMax {
					return cursor{i, skip}, false
				}
				b.ents = append(b.ents, entry{roff: b.rlen})
				k++
			}
			rem := pt.n - skip
			take := int(min(rem, int64(room)))
			b.ents[k].n += take
			off := pt.off + skip
			if s := len(b.spans) - 1; s >= 0 && b.spans[s].off+int64(b.spans[s].n) == off && sameFile(b.spans[s].f, pt.f) {
				b.spans[s].n += take
			} else {
				b.spans = append(b.spans, span{f: pt.f, off: off, roff: b.rlen, n: take})
			}
			b.rlen += take
			if int64(take) < rem {
				return cursor{i, skip + int64(take)}, false
			}
		}
	}
	return cursor{len(b.parts), 0}, false
}

// load reads the spans of the planned batch and fills b.vec with its
// buffers. If a read comes up short, b.vec stops at the first missing byte
// and the error says why.
func (b *Builder) load() error {
	if cap(b.rbuf) < b.rlen {
		size := minReadBuffer
		for size < b.rlen {
			size *= 2
		}
		b.rbuf = make([]byte, min(size, max(b.opts.MaxReadBuffer, b.rlen)))
	}
	rbuf := b.rbuf[:cap(b.rbuf)]
	valid := b.rlen
	var rerr error
	for _, s := range b.spans {
		got, err := s.f.ReadAt(rbuf[s.roff:s.roff+s.n], s.off)
		b.stats.Pread++
		got = max(0, min(got, s.n))
		if got < s.n {
			valid = s.roff + got
			if err == nil || errors.Is(err, io.EOF) {
				rerr = fmt.Errorf("%w: %d bytes at offset %d, %d available", ErrRegionPastEOF, s.n, s.off, got)
			} else {
				rerr = fmt.Errorf("send: read file region at offset %d: %w", s.off+int64(got), err)
			}
			break
		}
	}
	clear(b.vec)
	b.vec = b.vec[:0]
	for _, e := range b.ents {
		if e.p != nil {
			b.vec = append(b.vec, e.p)
			continue
		}
		end := min(e.roff+e.n, valid)
		if end > e.roff {
			b.vec = append(b.vec, rbuf[e.roff:end])
		}
		if end < e.roff+e.n {
			break
		}
	}
	return rerr
}

// gatheringConn reports whether w is one of the net package's connections,
// for which net.Buffers makes one gathering write (writev). For any other
// writer net.Buffers calls Write once per buffer and goes on past a short
// Write that returned no error, which would send bytes after a gap.
func gatheringConn(w io.Writer) bool {
	switch w.(type) {
	case *net.TCPConn, *net.UnixConn, *net.IPConn:
		return true
	}
	return false
}

// writePlain writes the response to any io.Writer: batches of buffers, file
// data read into memory, no sendfile.
func (b *Builder) writePlain(w io.Writer) (int64, error) {
	var n int64
	gather := gatheringConn(w)
	cur := cursor{}
	for cur.i < len(b.parts) {
		next, _ := b.plan(cur, false)
		rerr := b.load()
		if gather {
			bufs := net.Buffers(b.vec)
			want := vecLen(b.vec)
			b.stats.Writev++
			nw, err := bufs.WriteTo(w)
			n += nw
			b.stats.Bytes += nw
			if err != nil {
				return n, fmt.Errorf("send: write: %w", err)
			}
			if nw < want { // a Write that returned short without an error
				return n, ErrShortWrite
			}
		} else {
			for _, p := range b.vec {
				nw, err := w.Write(p)
				b.stats.Write++
				nw = max(0, min(nw, len(p)))
				n += int64(nw)
				b.stats.Bytes += int64(nw)
				if err != nil {
					return n, fmt.Errorf("send: write: %w", err)
				}
				if nw < len(p) {
					return n, ErrShortWrite
				}
			}
		}
		if rerr != nil {
			return n, rerr
		}
		cur = next
	}
	return n, nil
}
