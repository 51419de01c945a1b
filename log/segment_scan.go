package log

import (
	"errors"
	"fmt"
	"io"
	"math"
)

// scanChunk is how much of a segment file recovery reads per call.
const scanChunk = 1 << 20

// batchScanner reads whole batches sequentially from a segment file,
// validating each (framing, magic, CRC, counts). It allocates at most
// max(scanChunk, the largest batch actually present), never what a corrupt
// length field claims.
type batchScanner struct {
	s        *segment
	maxBatch int
	pos      int64 // file position of buf[r]
	end      int64 // file size
	buf      []byte
	r, w     int
}

func newBatchScanner(s *segment, maxBatch int) *batchScanner {
	return &batchScanner{s: s, maxBatch: maxBatch, end: s.size.Load()}
}

// fill makes at least n bytes available in buf[r:w], or as many as the
// file has left.
func (sc *batchScanner) fill(n int) error {
	if sc.w-sc.r >= n {
		return nil
	}
	copy(sc.buf, sc.buf[sc.r:sc.w])
	sc.w -= sc.r
	sc.r = 0
	want := max(n, scanChunk)
	if left := sc.end - sc.pos; int64(want) > left {
		want = int(left)
	}
	if cap(sc.buf) < want {
		nb := make([]byte, want)
		copy(nb, sc.buf[:sc.w])
		sc.buf = nb
	}
	sc.buf = sc.buf[:cap(sc.buf)]
	for sc.w < want {
		m, err := sc.s.file.ReadAt(sc.buf[sc.w:want], sc.pos+int64(sc.w))
		sc.w += m
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// next returns the next valid batch and its file position. It returns
// io.EOF at a clean end of file, and an error wrapping ErrCorrupt at the
// first batch that is torn or invalid. I/O errors are returned as they are.
func (sc *batchScanner) next() (Batch, int64, error) {
	pos := sc.pos
	if pos >= sc.end {
		return nil, pos, io.EOF
	}
	if err := sc.fill(BatchHeaderSize); err != nil {
		return nil, pos, err
	}
	avail := sc.buf[sc.r:sc.w]
	if len(avail) < BatchHeaderSize {
		return nil, pos, fmt.Errorf("%w: torn batch header at position %d", ErrCorrupt, pos)
	}
	size := int64(Batch(avail).Length()) + LogOverhead
	if size < BatchHeaderSize || size > int64(sc.maxBatch) || size > sc.end-pos {
		return nil, pos, fmt.Errorf("%w: batch at position %d claims %d bytes (%d left in file)", ErrCorrupt, pos, size, sc.end-pos)
	}
	if err := sc.fill(int(size)); err != nil {
		return nil, pos, err
	}
	b := Batch(sc.buf[sc.r : sc.r+int(size)])
	if err := b.ValidateHeader(); err != nil {
		return nil, pos, fmt.Errorf("at position %d: %w", pos, err)
	}
	sc.r += int(size)
	sc.pos += size
	return b, pos, nil
}

// rebuildResult is what a scan of a segment found.
type rebuildResult struct {
	validEnd int64 // position after the last valid batch
	// invalid is non-nil when the scan stopped before the end of file.
	invalid error
	// validAfter reports that a valid batch follows the invalid one: the
	// damage is in the middle of the data, not a torn tail.
	validAfter bool
	// err is an I/O error that stopped the scan: it says nothing about
	// the data, which must not be truncated because of it.
	err error
}

// rebuild rescans the segment from position 0, rebuilding its indexes,
// next offset and max timestamp from the valid batches. It stops at the
// first invalid batch (see rebuildResult); it never changes the file.
func (s *segment) rebuild(maxBatch int) rebuildResult {
	s.offIdx.reset()
	s.timeIdx.reset()
	s.sinceIndex = 0
	s.maxTS.Store(NoTimestamp)
	s.next.Store(s.base)
	sc := newBatchScanner(s, maxBatch)
	var res rebuildResult
	for {
		b, pos, err := sc.next()
		if err == io.EOF {
			res.validEnd = pos
			return res
		}
		if err == nil {
			err = s.checkContinues(b)
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			res.validEnd, res.err = pos, fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
			return res
		}
		if err != nil {
			res.validEnd, res.invalid = pos, fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
			res.validAfter = s.validBatchAfter(pos, maxBatch)
			return res
		}
		s.noteBatch(b)
		s.indexBatch(b, pos)
	}
}

// checkContinues verifies that b's offsets follow the segment's batches
// and fit its relative-offset range.
func (s *segment) checkContinues(b Batch) error {
	if b.BaseOffset() < s.next.Load() {
		return fmt.Errorf("%w: batch base offset %d below expected %d", ErrCorrupt, b.BaseOffset(), s.next.Load())
	}
	if b.LastOffset()-s.base > math.MaxInt32 {
		return fmt.Errorf("%w: batch last offset %d too far from segment base %d", ErrCorrupt, b.LastOffset(), s.base)
	}
	return nil
}

// noteBatch updates next offset and max timestamp for an appended batch.
func (s *segment) noteBatch(b Batch) {
	s.next.Store(b.NextOffset())
	if ts := b.MaxTimestamp(); ts > s.maxTS.Load() {
		s.maxTS.Store(ts)
		s.relOfMaxTS = int32(b.LastOffset() - s.base)
	}
}

// validBatchAfter reports whether a valid batch follows the invalid one at
// pos, judged by its length field when plausible.
func (s *segment) validBatchAfter(pos int64, maxBatch int) bool {
	var hdr [BatchHeaderSize]byte
	n, _ := s.file.ReadAt(hdr[:], pos)
	if n < BatchHeaderSize {
		return false
	}
	size := int64(Batch(hdr[:]).Length()) + LogOverhead
	if size < BatchHeaderSize || size > int64(maxBatch) {
		return false
	}
	next := &batchScanner{s: s, maxBatch: maxBatch, pos: pos + size, end: s.size.Load()}
	b, _, err := next.next()
	return err == nil && b.BaseOffset() >= s.base
}
