package log

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"

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
	// Offset is the reader's position.
	Offset int64
	// LogStartOffset is where the log now starts.
	LogStartOffset int64
}

// Error describes the offset and the log start offset.
func (e *OutOfRangeError) Error() string {
	return fmt.Sprintf("replog/log: offset %d is below the log start offset %d", e.Offset, e.LogStartOffset)
}

// Unwrap makes errors.Is(err, ErrOffsetOutOfRange) true.
func (e *OutOfRangeError) Unwrap() error { return ErrOffsetOutOfRange }

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// BufferBytes is how much a Reader reads from a segment file per call
	// (default 1 MiB; a larger batch is read whole; at least a batch
	// header, BatchHeaderSize).
	BufferBytes int
	// UpToHighWatermark makes the Reader stop (and wait) at the high
	// watermark instead of the log end offset.
	UpToHighWatermark bool
	// SkipCRC skips the CRC check of each batch the Reader returns. By
	// default a Reader, like a Kafka consumer, verifies every batch's
	// CRC, so a bit flip on disk is reported as ErrCorrupt instead of
	// being returned.
	SkipCRC bool
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

	// wait is the offset the end of the readable range must pass before
	// the next batch is readable: next, or the last offset of a batch
	// held back because it straddles the end.
	wait int64

	seg   *segment
	pos   int64  // file position in seg of the next batch to read
	gen   uint64 // truncation generation the position is valid in
	buf   []byte
	batch []byte                // unread part of buf
	hdr   [BatchHeaderSize]byte // scratch for locate
	it    RecordIterator
	cur   Batch
}

// NewReader returns a Reader positioned at offset.
func (l *Log) NewReader(offset int64, o ReaderOptions) *Reader {
	if o.BufferBytes <= 0 {
		o.BufferBytes = DefaultReadMaxBytes
	}
	o.BufferBytes = max(o.BufferBytes, BatchHeaderSize) // a read must hold the next batch's length
	return &Reader{l: l, opts: o, next: offset, gen: l.truncations.gen.Load()}
}

// Offset is the offset of the next record Next will return.
func (r *Reader) Offset() int64 { return r.next }

// SetOffset moves the reader to offset.
func (r *Reader) SetOffset(offset int64) {
	r.next, r.seg, r.batch = offset, nil, nil
	r.gen = r.l.truncations.gen.Load()
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
		if err := r.l.waitForData(ctx, max(r.next, r.wait), r.opts.UpToHighWatermark, &r.gen, r.next); err != nil {
			return nil, err
		}
	}
}

// TryNext is Next without waiting: it returns nil, nil at the end.
func (r *Reader) TryNext() (Batch, error) { return r.tryNext() }

func (r *Reader) tryNext() (Batch, error) {
	l := r.l
	for {
		if l.closed.Load() {
			return nil, ErrClosed
		}
		if err := r.checkTruncated(); err != nil {
			return nil, err
		}
		end := l.leo.Load()
		if r.opts.UpToHighWatermark {
			end = l.HighWatermark()
		}
		if start := l.logStart.Load(); r.next < start {
			r.seg, r.batch = nil, nil
			return nil, &OutOfRangeError{Offset: r.next, LogStartOffset: start}
		}
		r.wait = r.next
		if r.next >= end {
			return nil, nil
		}
		if len(r.batch) == 0 {
			retry, err := r.fill(end)
			if err != nil {
				return nil, err
			}
			if retry {
				continue
			}
			if len(r.batch) == 0 {
				// No batch from r.next to the log's end, which a follower's
				// gap at the tail would leave (Open removes such tails):
				// wait for the log to grow past end, not past r.next,
				// which it already has, so that Next does not spin.
				r.wait = end
				return nil, nil
			}
		}
		b, rest, err := SplitBatch(r.batch)
		if err != nil {
			return nil, err
		}
		if b.NextOffset() > end {
			// Not readable yet: above the high watermark, or written and
			// not yet published by its append. Read it again from the
			// file once the end passes it.
			r.pos -= int64(len(r.batch))
			r.batch = nil
			r.wait = b.LastOffset()
			return nil, nil
		}
		r.batch, r.cur = rest, b
		r.next = max(r.next, b.NextOffset())
		return b, nil
	}
}

// checkTruncated reports a truncation below the reader's position since
// it last looked, even if the log has grown past the position again: the
// reader moves to where the lowest such truncation cut the log.
func (r *Reader) checkTruncated() error {
	t := &r.l.truncations
	if t.gen.Load() == r.gen {
		return nil
	}
	cut, gen := t.lowestSince(r.gen)
	r.gen, r.seg, r.batch = gen, nil, nil
	if r.next > cut {
		r.next = cut
		return fmt.Errorf("%w: reading again from %d", ErrTruncated, cut)
	}
	return nil
}

// fill reads the next chunk of whole batches below end into the buffer.
// It returns retry when the log was truncated or its start moved since
// tryNext looked, which must then look again.
func (r *Reader) fill(end int64) (retry bool, err error) {
	l := r.l
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	// Truncation and segment deletion hold readMu exclusively: from here
	// on the position cannot move under the reader. Close sets closed
	// before it takes readMu to close the files.
	if l.closed.Load() {
		return false, ErrClosed
	}
	if l.truncations.gen.Load() != r.gen || r.next < l.logStart.Load() {
		return true, nil
	}
	i := r.segmentIndex()
	switch {
	case i < 0:
		if err := r.locate(end); err != nil || r.seg == nil {
			return false, err
		}
	case r.pos >= r.seg.size.Load():
		// Past the end of its segment: the next one starts with the
		// next batch (offsets between them, a follower's gap, do not
		// exist), with no index search. An empty one (which only damage
		// from outside leaves before the active segment) is passed.
		segs := l.segments()
		for r.pos >= r.seg.size.Load() {
			if i+1 >= len(segs) {
				return false, nil
			}
			i++
			r.seg, r.pos = segs[i], 0
		}
	}
	s := r.seg
	avail := s.size.Load() - r.pos
	if avail <= 0 {
		return false, nil
	}
	n := min(int64(r.opts.BufferBytes), avail)
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	buf := r.buf[:n]
	m, err := s.readAt(buf, r.pos)
	if err != nil {
		return false, err
	}
	if m < BatchHeaderSize {
		return false, fmt.Errorf("%w: partial batch header at position %d of %s", ErrCorrupt, r.pos, s.path(logSuffix))
	}
	if size := int64(Batch(buf).Size()); size > int64(m) {
		// The next batch is larger than the buffer: read it whole.
		if size < BatchHeaderSize || size > avail {
			return false, fmt.Errorf("%w: batch at position %d of %s claims %d bytes", ErrCorrupt, r.pos, s.path(logSuffix), size)
		}
		if size > int64(max(l.opts.MaxBatchBytes, scanChunk)) {
			// Larger than Append accepts now (Options.MaxBatchBytes may
			// have been lowered since it was written): allocate for it
			// only once its bytes, read in chunks, match its CRC, so a
			// damaged length field cannot make the Reader allocate up to
			// the segment's size.
			ok, err := batchCRCMatches(s.file, r.pos, size, Batch(buf).CRC(), make([]byte, scanChunk))
			if err != nil {
				return false, err
			}
			if !ok {
				return false, fmt.Errorf("%w: batch at position %d of %s claims %d bytes, which do not match its CRC", ErrCorrupt, r.pos, s.path(logSuffix), size)
			}
		}
		r.buf = make([]byte, size)
		if m, err = s.readAt(r.buf, r.pos); err != nil {
			return false, err
		}
		buf = r.buf
	}
	keep, err := l.wholeBatches(buf[:m], r.pos, s, !r.opts.SkipCRC)
	if err != nil {
		return false, err
	}
	r.batch = buf[:keep]
	r.pos += int64(keep)
	return false, nil
}

// segmentIndex returns the index of the reader's segment in the log's
// list, or -1 when it has none or it is no longer listed.
func (r *Reader) segmentIndex() int {
	if r.seg == nil {
		return -1
	}
	segs := r.l.segments()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base >= r.seg.base })
	if i < len(segs) && segs[i] == r.seg {
		return i
	}
	return -1
}

// locate finds the segment and position of r.next through the index.
// Callers hold readMu shared.
func (r *Reader) locate(end int64) error {
	s, pos, _, ok, err := r.l.locate(r.next, end, &r.hdr, false)
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

// truncationMarks tells Readers where truncations cut the log. gen counts
// truncations; a Reader remembers the gen its position is valid in and,
// when gen moved, asks for the lowest cut since, which it cannot learn
// from the log end once the log has grown again.
type truncationMarks struct {
	gen atomic.Uint64

	mu sync.Mutex
	// marks holds (gen, cut) pairs with gen and cut both increasing: a
	// mark at or above a later cut tells no reader anything more.
	marks []truncationMark
}

type truncationMark struct {
	gen uint64
	cut int64
}

// maxTruncationMarks bounds the marks kept. Past it the two oldest merge
// into the lower cut: a reader that slept through both is sent back
// further than needed, never past data it has not seen.
const maxTruncationMarks = 64

// add records a truncation to cut and moves gen. Callers hold readMu
// exclusively.
func (t *truncationMarks) add(cut int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	gen := t.gen.Load() + 1
	k := len(t.marks)
	for k > 0 && t.marks[k-1].cut >= cut {
		k--
	}
	t.marks = append(t.marks[:k], truncationMark{gen, cut})
	if len(t.marks) > maxTruncationMarks {
		t.marks[1].cut = t.marks[0].cut
		t.marks = append(t.marks[:0], t.marks[1:]...)
	}
	t.gen.Store(gen)
}

// lowestSince returns the lowest cut of the truncations after gen, and
// the current gen.
func (t *truncationMarks) lowestSince(gen uint64) (cut int64, now uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.marks {
		if m.gen > gen {
			return m.cut, t.gen.Load()
		}
	}
	return math.MaxInt64, t.gen.Load()
}
