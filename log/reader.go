package log

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/replog/replog/compression"
)

// ErrTruncated reports that the log was truncated below a Reader's
// position (a leader change on a follower, for example). The Reader has
// moved to the new log end; batches it returned before may no longer be
// in the log.
var ErrTruncated = errors.New("replog/log: log truncated below the reader's position")

// OutOfRangeError is returned by a Reader whose position fell below the
// log start offset (retention or DeleteRecordsBefore deleted it). It
// wraps ErrOffsetOutOfRange.
type OutOfRangeError struct {
	Offset         int64 // the reader's position
	LogStartOffset int64 // where the log now starts
}

func (e *OutOfRangeError) Error() string {
	return fmt.Sprintf("replog/log: offset %d is below the log start offset %d", e.Offset, e.LogStartOffset)
}

// Unwrap makes errors.Is(err, ErrOffsetOutOfRange) true.
func (e *OutOfRangeError) Unwrap() error { return ErrOffsetOutOfRange }

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// BufferBytes is how much a Reader reads from a segment file per call
	// (default 1 MiB; a larger batch is read whole).
	BufferBytes int
	// UpToHighWatermark makes the Reader stop (and wait) at the high
	// watermark instead of the log end offset.
	UpToHighWatermark bool
}

// Reader reads a Log's batches in order from a starting offset, for
// in-process consumers. It keeps its position (segment and file position)
// and reads forward in large chunks into a reused buffer, so a sequential
// read costs a few syscalls per chunk and no allocation per batch. At the
// end of the log Next waits for the append that makes more data available.
//
// A Reader is not safe for concurrent use; use one per goroutine. Any
// number of Readers may share a Log.
type Reader struct {
	l    *Log
	opts ReaderOptions
	next int64 // offset of the next record to return

	seg   *segment
	pos   int64 // file position in seg of the next batch to read
	gen   uint64
	buf   []byte
	batch []byte // unread part of buf
	it    RecordIterator
	cur   Batch
}

// NewReader returns a Reader positioned at offset.
func (l *Log) NewReader(offset int64, o ReaderOptions) *Reader {
	if o.BufferBytes <= 0 {
		o.BufferBytes = DefaultReadMaxBytes
	}
	return &Reader{l: l, opts: o, next: offset}
}

// Offset is the offset of the next record Next will return.
func (r *Reader) Offset() int64 { return r.next }

// SetOffset moves the reader to offset.
func (r *Reader) SetOffset(offset int64) {
	r.next, r.seg, r.batch = offset, nil, nil
}

// Next returns the next batch, waiting (until ctx ends) at the end of the
// readable range. The batch's bytes are valid until the next call. The
// first batch may start before the reader's offset when the offset lies
// inside a batch. Errors: ctx's error; ErrClosed; an *OutOfRangeError
// when the position was deleted; ErrTruncated when the log was truncated
// below it (the reader then continues from the new end); ErrCorrupt for
// damaged data.
func (r *Reader) Next(ctx context.Context) (Batch, error) {
	for {
		b, err := r.tryNext()
		if err != nil || b != nil {
			return b, err
		}
		if err := r.l.WaitForData(ctx, r.next, r.opts.UpToHighWatermark); err != nil {
			return nil, err
		}
	}
}

// TryNext is Next without waiting: it returns nil, nil at the end.
func (r *Reader) TryNext() (Batch, error) { return r.tryNext() }

func (r *Reader) tryNext() (Batch, error) {
	l := r.l
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if gen := l.truncations.Load(); gen != r.gen {
		r.gen, r.seg, r.batch = gen, nil, nil
		if end := l.leo.Load(); r.next > end {
			r.next = end
			return nil, fmt.Errorf("%w: now ending at %d", ErrTruncated, end)
		}
	}
	end := l.leo.Load()
	if r.opts.UpToHighWatermark {
		end = l.HighWatermark()
	}
	if start := l.logStart.Load(); r.next < start {
		r.seg, r.batch = nil, nil
		return nil, &OutOfRangeError{Offset: r.next, LogStartOffset: start}
	}
	if r.next >= end {
		return nil, nil
	}
	if len(r.batch) == 0 {
		if err := r.fill(end); err != nil || len(r.batch) == 0 {
			return nil, err
		}
	}
	b, rest, err := SplitBatch(r.batch)
	if err != nil {
		return nil, err
	}
	if b.BaseOffset() >= end {
		r.batch = nil
		return nil, nil
	}
	r.batch, r.cur = rest, b
	r.next = max(r.next, b.NextOffset())
	return b, nil
}

// fill reads the next chunk of whole batches below end into the buffer.
func (r *Reader) fill(end int64) error {
	l := r.l
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	if r.seg == nil || !r.segmentListed() || r.pos >= r.seg.size.Load() {
		if err := r.locate(end); err != nil || r.seg == nil {
			return err
		}
	}
	s := r.seg
	avail := s.size.Load() - r.pos
	n := min(int64(r.opts.BufferBytes), avail)
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	buf := r.buf[:n]
	m, err := s.readAt(buf, r.pos)
	if err != nil {
		return err
	}
	if m < BatchHeaderSize {
		return fmt.Errorf("%w: partial batch header at position %d of %s", ErrCorrupt, r.pos, s.path(logSuffix))
	}
	if size := int64(Batch(buf).Size()); size > int64(m) {
		// The next batch is larger than the buffer: read it whole.
		if size < BatchHeaderSize || size > avail || size > int64(l.opts.MaxBatchBytes) {
			return fmt.Errorf("%w: batch at position %d of %s claims %d bytes", ErrCorrupt, r.pos, s.path(logSuffix), size)
		}
		r.buf = make([]byte, size)
		if m, err = s.readAt(r.buf, r.pos); err != nil {
			return err
		}
		buf = r.buf
	}
	keep, err := l.wholeBatches(buf[:m], r.pos, s)
	if err != nil {
		return err
	}
	r.batch = buf[:keep]
	r.pos += int64(keep)
	return nil
}

// segmentListed reports whether the reader's segment is still in the log.
func (r *Reader) segmentListed() bool {
	segs := r.l.segments()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base >= r.seg.base })
	return i < len(segs) && segs[i] == r.seg
}

// locate finds the segment and position of r.next through the index.
// Callers hold readMu shared.
func (r *Reader) locate(end int64) error {
	s, pos, _, ok, err := r.l.locate(r.next, end)
	if err != nil {
		return err
	}
	if !ok {
		r.seg = nil
		return nil
	}
	r.seg, r.pos = s, pos
	return nil
}

// Records returns an iterator over the records of the batch Next last
// returned, decompressing it with local if it is compressed (local may
// be nil for uncompressed logs). The iterator is reused by the next call.
func (r *Reader) Records(local *compression.Local) (*RecordIterator, error) {
	if r.cur == nil {
		return nil, fmt.Errorf("%w: no current batch", ErrInvalidRecord)
	}
	if err := r.it.ResetBatch(r.cur, local); err != nil {
		return nil, err
	}
	return &r.it, nil
}
