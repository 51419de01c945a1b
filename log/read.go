package log

import (
	"bytes"
	"fmt"
	"io"
	"sort"
)

// ReadOptions bound a read.
type ReadOptions struct {
	// MaxBytes bounds the bytes returned, except that the first batch is
	// always returned whole even if larger. 0 means DefaultReadMaxBytes.
	MaxBytes int
	// UpToHighWatermark returns only batches below the high watermark
	// (what consumers may see), instead of up to the log end offset. An
	// offset between the high watermark and the log end then reads
	// nothing, without an error, as in Kafka: the high watermark may move
	// down (when a node steps down, after a restart) below where a
	// consumer already is.
	UpToHighWatermark bool
}

// Region is a run of whole batches inside a segment file, for zero-copy
// sending (package send writes it with sendfile). File stays readable
// until the segment is deleted and FileDeleteDelay has passed, or the Log
// is closed (reading it then fails with the file's own error, such as
// os.ErrClosed, not ErrClosed), and its
// bytes stay those batches until then, unless TruncateTo cuts below
// NextOffset inside the same segment: the segment file is then truncated
// in place, and the log's next appends write new batches at those
// positions (as in Kafka). Send a Region soon after reading it, or copy
// it (Read) where a truncation may come between.
type Region struct {
	// File is the segment file: with the real filesystem an *os.File for
	// a standalone log, which package send can send with sendfile; for a
	// Manager's log a handle of its file cache, which send reads instead
	// (the cache may close and reopen the file meanwhile, so its
	// descriptor is not handed out).
	File io.ReaderAt
	// Position and Length locate the bytes in File.
	Position, Length int64
	// FirstOffset is the base offset of the first batch, NextOffset the
	// offset after the last one (where the next read continues).
	FirstOffset, NextOffset int64
}

// readBounds checks offset against the log's range and returns where the
// readable batches end: the log end, or the high watermark with
// UpToHighWatermark. Nothing is readable at an offset at or past that end.
func (l *Log) readBounds(offset int64, o ReadOptions) (end int64, err error) {
	if l.closed.Load() {
		return 0, ErrClosed
	}
	start, end := l.logStart.Load(), l.leo.Load()
	if offset < start || offset > end {
		return 0, fmt.Errorf("%w: offset %d, log range [%d, %d]", ErrOffsetOutOfRange, offset, start, end)
	}
	if o.UpToHighWatermark {
		end = l.HighWatermark()
	}
	return end, nil
}

// locate finds the first batch whose last offset is >= offset, searching
// from the segment that should hold it, and returns its header, read
// into hdr. With remembered, the header of the log's last batch may be
// the one appended rather than the file's (segment.findRemembered), and
// the caller checks the file's against it. Callers hold readMu shared.
func (l *Log) locate(offset, end int64, hdr *[BatchHeaderSize]byte, remembered bool) (*segment, int64, Batch, bool, error) {
	segs := l.segments()
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > offset }) - 1
	for i = max(i, 0); i < len(segs); i++ {
		var pos int64
		var ok bool
		var err error
		if remembered {
			pos, ok, err = segs[i].findRemembered(offset, l.opts.MaxBatchBytes, hdr)
		} else {
			pos, ok, err = segs[i].find(offset, l.opts.MaxBatchBytes, hdr)
		}
		if err != nil {
			return nil, 0, nil, false, err
		}
		if ok {
			if Batch(hdr[:]).BaseOffset() >= end {
				return nil, 0, nil, false, nil
			}
			return segs[i], pos, Batch(hdr[:]), true, nil
		}
	}
	return nil, 0, nil, false, nil
}

// regionEnd returns the position where the batches readable below end
// stop in s, starting from pos.
func (l *Log) regionEnd(s *segment, end int64) (int64, error) {
	limit := s.size.Load()
	if end < s.next.Load() {
		hdr := headerPool.Get().(*[BatchHeaderSize]byte)
		defer headerPool.Put(hdr)
		p, ok, err := s.findRemembered(end, l.opts.MaxBatchBytes, hdr)
		if err != nil {
			return 0, err
		}
		if ok {
			limit = p
		}
	}
	return limit, nil
}

// Read appends to dst whole batches starting with the one that holds
// offset, up to o.MaxBytes (at least one whole batch), all from one
// segment, and returns the extended slice. Reading at the end of the
// readable range (the log end, or the high watermark with
// UpToHighWatermark), or past the high watermark, returns dst unchanged
// and no error; below the log start or past its end it returns
// ErrOffsetOutOfRange. The first batch may start before offset
// (offsets are per batch). Each batch's framing, header fields and
// offsets are checked; its CRC only with Options.VerifyReadCRC (see
// there). Read never blocks appends by itself (see the package
// documentation for the calls that wait for reads).
func (l *Log) Read(dst []byte, offset int64, o ReadOptions) ([]byte, error) {
	// The bounds are checked under readMu: segment deletion and
	// truncation take it after moving them, so a read cannot find the
	// segments after a deletion with an offset checked before it.
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	end, err := l.readBounds(offset, o)
	if err != nil || offset >= end {
		return dst, err
	}
	hp := headerPool.Get().(*[BatchHeaderSize]byte)
	defer headerPool.Put(hp)
	s, pos, hdr, ok, err := l.locate(offset, end, hp, true)
	if err != nil || !ok {
		return dst, err
	}
	limit, err := l.regionEnd(s, end)
	if err != nil {
		return dst, err
	}
	n := int64(max(readMax(o), hdr.Size()))
	n = min(n, limit-pos)
	start := len(dst)
	dst = growLen(dst, int(n))
	m, err := s.readAt(dst[start:], pos)
	if err != nil {
		return dst[:start], err
	}
	if m >= BatchHeaderSize && !bytes.Equal(dst[start:start+BatchHeaderSize], hdr[:BatchHeaderSize]) {
		// At the log end, locate takes the header the log appended
		// rather than reading it: the file's must be that one.
		return dst[:start], fmt.Errorf("%w: the batch header at position %d of %s is not the one appended there", ErrCorrupt, pos, s.path(logSuffix))
	}
	keep, err := l.wholeBatches(dst[start:start+m], pos, s, l.opts.VerifyReadCRC)
	return dst[:start+keep], err
}

func readMax(o ReadOptions) int {
	if o.MaxBytes <= 0 {
		return DefaultReadMaxBytes
	}
	return o.MaxBytes
}

// growLen extends b by n bytes, reallocating only when capacity is short.
func growLen(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), len(b)+n)
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

// wholeBatches returns how many leading bytes of buf are whole batches,
// checking each one's header fields and offsets, and its CRC if crc is
// set.
func (l *Log) wholeBatches(buf []byte, pos int64, s *segment, crc bool) (int, error) {
	keep, lastLen := 0, 0
	prevNext := int64(-1)
	for rest := buf; len(rest) > 0; {
		if keep > 0 && !startsWithBatch(rest) {
			break // a partial batch ends the chunk: the next read gets it
		}
		b, r, err := SplitBatch(rest)
		if err != nil {
			if keep == 0 {
				return 0, fmt.Errorf("segment %s position %d: %w", s.path(logSuffix), pos, err)
			}
			break
		}
		err = b.validateHeader(crc)
		if err == nil {
			if err = checkFollows(b, prevNext, s); err != nil {
				// Either this batch's or the previous one's base
				// offset is damaged: return neither.
				keep -= lastLen
			}
		}
		if err == nil {
			if !startsWithBatch(r) {
				// b is the last whole batch read: check it against
				// the header after it, which no later step sees.
				err = l.checkNextHeader(b, r, pos+int64(keep+len(b)), s)
			}
		}
		if err != nil {
			if keep == 0 {
				return 0, fmt.Errorf("segment %s position %d: %w", s.path(logSuffix), pos+int64(keep), err)
			}
			break // return the good batches; the next read reports it
		}
		prevNext, lastLen = b.NextOffset(), len(b)
		keep += len(b)
		rest = r
	}
	return keep, nil
}

// startsWithBatch reports whether SplitBatch would split a batch off buf,
// without building the error it returns otherwise.
func startsWithBatch(buf []byte) bool {
	if len(buf) < BatchHeaderSize {
		return false
	}
	b := Batch(buf)
	return b.Length() >= BatchHeaderSize-LogOverhead && int64(b.Size()) <= int64(len(buf)) && b.Magic() == MagicV2
}

// checkFollows checks the offsets of a batch read from s, which its CRC
// does not cover: they must lie in the segment's range and start at or
// after prevNext, where the batch before it ended.
func checkFollows(b Batch, prevNext int64, s *segment) error {
	if base, next := b.BaseOffset(), s.next.Load(); base < max(s.base, prevNext) || base >= next ||
		int64(b.LastOffsetDelta()) >= next-base {
		return fmt.Errorf("%w: batch offsets [%d, %d] do not follow %d inside the segment's [%d, %d)",
			ErrCorrupt, base, b.LastOffset(), prevNext, s.base, next)
	}
	return nil
}

// checkNextHeader checks the last batch of a read against the header of
// the batch after it at pos, if there is one: that batch must start after
// it ends, or the last batch's base offset was damaged. rest is what the
// read got of that batch: its header, when whole, is checked from there
// rather than read again.
func (l *Log) checkNextHeader(b Batch, rest []byte, pos int64, s *segment) error {
	if pos >= s.size.Load() {
		return nil
	}
	var n Batch
	if len(rest) >= BatchHeaderSize {
		n = Batch(rest[:BatchHeaderSize])
		if s.checkHeaderAt(n, pos) != nil {
			return nil // that batch's own read reports its damage
		}
	} else {
		hdr := headerPool.Get().(*[BatchHeaderSize]byte)
		defer headerPool.Put(hdr)
		var err error
		if n, err = s.batchHeaderAt(pos, hdr); err != nil {
			return nil // as above
		}
	}
	if n.BaseOffset() < b.NextOffset() {
		return fmt.Errorf("%w: batch offsets [%d, %d] overlap the next batch at %d", ErrCorrupt, b.BaseOffset(), b.LastOffset(), n.BaseOffset())
	}
	return nil
}

// ReadRegion is Read without copying: it returns the file region of the
// same batches, for package send to write with sendfile. A zero Length
// means there is nothing to read at offset yet. The bytes are not
// verified; a region of the batch last appended to a segment is located
// from its header as appended, not read back from the file.
func (l *Log) ReadRegion(offset int64, o ReadOptions) (Region, error) {
	// The bounds are checked under readMu: segment deletion and
	// truncation take it after moving them, so a read cannot find the
	// segments after a deletion with an offset checked before it.
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	end, err := l.readBounds(offset, o)
	if err != nil || offset >= end {
		return Region{FirstOffset: offset, NextOffset: offset}, err
	}
	hp := headerPool.Get().(*[BatchHeaderSize]byte)
	defer headerPool.Put(hp)
	s, pos, hdr, ok, err := l.locate(offset, end, hp, true)
	if err != nil || !ok {
		return Region{FirstOffset: offset, NextOffset: offset}, err
	}
	limit, err := l.regionEnd(s, end)
	if err != nil {
		return Region{}, err
	}
	if limit <= pos {
		// The batch holding offset straddles the end (a high watermark
		// inside it): nothing is readable yet, as for Read.
		return Region{FirstOffset: offset, NextOffset: offset}, nil
	}
	stop, next, err := l.cutRegion(s, pos, hdr, limit, int64(readMax(o)))
	if err != nil {
		return Region{}, err
	}
	return Region{File: s.file, Position: pos, Length: stop - pos, FirstOffset: hdr.BaseOffset(), NextOffset: next}, nil
}

// cutRegion returns the end position of the longest run of whole batches
// from pos that fits in maxBytes (at least the first batch) and stays
// below limit, and the offset where a following read continues.
func (l *Log) cutRegion(s *segment, pos int64, first Batch, limit, maxBytes int64) (int64, int64, error) {
	stop, next := pos+int64(first.Size()), first.NextOffset()
	want := min(pos+maxBytes, limit)
	hdr := headerPool.Get().(*[BatchHeaderSize]byte)
	defer headerPool.Put(hdr)
	// Every batch before an indexed boundary <= want fits: jump past an
	// indexed batch that fits, then step header by header. (Stopping at
	// the boundary itself would take next from the batch after it, which
	// is wrong when a follower's offset gap lies between the two.)
	if p := s.offIdx.floorPosition(want); p > stop && p < limit {
		b, err := s.batchHeaderAt(p, hdr)
		if err != nil {
			return 0, 0, err
		}
		if end := p + int64(b.Size()); end <= want {
			stop, next = end, b.NextOffset()
		} else if q := s.offIdx.floorPosition(p - 1); q > stop {
			// The previous indexed batch ends at or before p: it fits.
			b, err := s.batchHeaderAt(q, hdr)
			if err != nil {
				return 0, 0, err
			}
			stop, next = q+int64(b.Size()), b.NextOffset()
		}
	}
	for stop < want {
		b, err := s.batchHeaderAt(stop, hdr)
		if err != nil {
			return 0, 0, err
		}
		if stop+int64(b.Size()) > want {
			break
		}
		stop += int64(b.Size())
		next = b.NextOffset()
	}
	return stop, next, nil
}
