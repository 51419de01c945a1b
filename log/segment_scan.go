package log

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
)

// scanChunk is how much of a segment file recovery reads per call.
const scanChunk = 1 << 20

// zeroSector is the unit of a torn write: a crash can leave an aligned
// block of this many bytes of unsynced data reading back as zeros.
const zeroSector = 512

// batchScanner reads whole batches sequentially from a segment file,
// validating each (framing, magic, CRC, counts). It allocates at most
// max(scanChunk, maxBatch, the largest valid batch actually present),
// never what a corrupt length field claims: a batch larger than
// max(scanChunk, maxBatch) (Options.MaxBatchBytes bounds appends, and may
// have been lowered since the batch was written) is accepted only when
// its bytes, read in chunks, match its CRC, and only then read whole.
type batchScanner struct {
	s        *segment
	maxBatch int
	pos      int64 // file position of buf[r]
	end      int64 // file size
	buf      []byte
	r, w     int
	scratch  []byte // for the chunked CRC check of large batches
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
	if size < BatchHeaderSize || size > sc.end-pos {
		return nil, pos, fmt.Errorf("%w: batch at position %d claims %d bytes (%d left in file)", ErrCorrupt, pos, size, sc.end-pos)
	}
	if size > int64(max(sc.maxBatch, scanChunk)) {
		if sc.scratch == nil {
			sc.scratch = make([]byte, scanChunk)
		}
		ok, err := batchCRCMatches(sc.s.file, pos, size, Batch(avail).CRC(), sc.scratch)
		if err != nil {
			return nil, pos, err
		}
		if !ok {
			return nil, pos, fmt.Errorf("%w: batch at position %d claims %d bytes, which do not match its CRC", ErrCorrupt, pos, size)
		}
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

// batchCRCMatches reports whether the size bytes of the batch at pos in f
// match the CRC stored in its header, reading them through scratch so that
// what is allocated does not depend on size. A file shorter than the batch
// does not match.
func batchCRCMatches(f io.ReaderAt, pos, size int64, stored uint32, scratch []byte) (bool, error) {
	var crc uint32
	for p, end := pos+offAttributes, pos+size; p < end; {
		n := min(int64(len(scratch)), end-p)
		m, err := f.ReadAt(scratch[:n], p)
		crc = crc32.Update(crc, castagnoli, scratch[:m])
		p += int64(m)
		if int64(m) < n {
			if err == nil || err == io.EOF {
				return false, nil
			}
			return false, err
		}
	}
	return crc == stored, nil
}

// rebuildResult is what a scan of a segment found.
type rebuildResult struct {
	validEnd int64 // position after the last valid batch
	// invalid is non-nil when the scan stopped before the end of file.
	invalid error
	// validAfter reports that a whole valid batch continuing the offsets
	// follows the invalid one, which does not look torn: the damage is in
	// the middle of the data, not a torn tail.
	validAfter bool
	// tailNext is set when the invalid batch is the last one of the file
	// by its own framing and does not look torn: it is the offset the
	// next segment must start at for the damage to lie in the middle of
	// the log (see Log.recover).
	tailNext int64
	// err is an I/O error that stopped the scan: it says nothing about
	// the data, which must not be truncated because of it.
	err error
}

// rebuild rescans the segment from position 0, rebuilding its indexes,
// next offset and max timestamp from the valid batches. It stops at the
// first invalid batch (see rebuildResult); it never changes the file.
//
// The next offset and max timestamp are published once, at the end: a
// lazy rebuild of a sealed segment's indexes runs while Readers use the
// segment, and they check offsets against its next offset.
func (s *segment) rebuild(maxBatch int) rebuildResult {
	s.offIdx.reset()
	s.timeIdx.reset()
	next, maxTS, relOfMaxTS, since := s.base, NoTimestamp, int32(0), 0
	publish := func() {
		s.sinceIndex, s.relOfMaxTS = since, relOfMaxTS
		s.maxTS.Store(maxTS)
		s.next.Store(next)
	}
	sc := newBatchScanner(s, maxBatch)
	var res rebuildResult
	res.tailNext = -1
	for {
		b, pos, err := sc.next()
		if err == io.EOF {
			res.validEnd = pos
			publish()
			return res
		}
		if err == nil {
			err = s.checkContinues(b, next)
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			res.validEnd, res.err = pos, fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
			return res
		}
		if err != nil {
			res.validEnd, res.invalid = pos, fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
			res.validAfter, res.tailNext, res.err = s.validBatchAfter(pos, next, sc.end, maxBatch)
			publish()
			return res
		}
		// As noteBatch and indexBatch do for an append.
		next = b.NextOffset()
		if ts := b.MaxTimestamp(); ts > maxTS {
			maxTS, relOfMaxTS = ts, int32(b.LastOffset()-s.base)
		}
		if since >= s.interval {
			s.offIdx.append(int32(b.LastOffset()-s.base), int32(pos))
			s.timeIdx.maybeAppend(maxTS, relOfMaxTS)
			since = 0
		}
		since += len(b)
	}
}

// checkContinues verifies that b's offsets follow next, where the
// segment's batches before it end, and fit its relative-offset range.
func (s *segment) checkContinues(b Batch, next int64) error {
	if b.BaseOffset() < next {
		return fmt.Errorf("%w: batch base offset %d below expected %d", ErrCorrupt, b.BaseOffset(), next)
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

// validBatchAfter judges the invalid batch at pos, where a batch starting
// at or after offset next was expected, in a file of end bytes. The damage
// lies in the middle of the data (validAfter) when the invalid batch's
// header is plausible (magic, offsets continuing next, a length inside the
// file), a whole batch that passes validation, CRC included, starts where
// that length ends and continues the invalid batch's offsets, and the
// invalid batch holds no aligned sector of zeros. Anything else (a cut
// batch, zeros or garbage after it, a zeroed sector inside it) is what a
// crash leaves in unsynced data: a torn tail. When the invalid batch ends
// exactly at the end of the file, tailNext is the offset after it (-1
// otherwise), for the caller to look at the next segment.
func (s *segment) validBatchAfter(pos, next, end int64, maxBatch int) (validAfter bool, tailNext int64, err error) {
	tailNext = -1
	var hdr [BatchHeaderSize]byte
	if n, _ := s.file.ReadAt(hdr[:], pos); n < BatchHeaderSize {
		return false, -1, nil
	}
	bad := Batch(hdr[:])
	size := int64(bad.Length()) + LogOverhead
	if bad.Magic() != MagicV2 || size < BatchHeaderSize || size > end-pos ||
		bad.BaseOffset() < next || bad.LastOffsetDelta() < 0 || bad.LastOffset()-s.base > math.MaxInt32 {
		return false, -1, nil
	}
	torn, err := s.holdsZeroSector(pos, size)
	if err != nil || torn {
		return false, -1, err
	}
	if pos+size == end {
		return false, bad.NextOffset(), nil
	}
	sc := &batchScanner{s: s, maxBatch: maxBatch, pos: pos + size, end: end}
	b, _, err := sc.next()
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return false, -1, err
	}
	return err == nil && b.BaseOffset() >= bad.NextOffset() && b.LastOffset()-s.base <= math.MaxInt32, -1, nil
}

// holdsZeroSector reports whether the size bytes at pos contain an
// aligned zeroSector-byte block of zeros, as a torn write leaves.
func (s *segment) holdsZeroSector(pos, size int64) (bool, error) {
	first := (pos + zeroSector - 1) / zeroSector * zeroSector
	if first+zeroSector > pos+size {
		return false, nil
	}
	buf := make([]byte, min(scanChunk, (pos+size-first)/zeroSector*zeroSector))
	for p := first; p+zeroSector <= pos+size; {
		n := min(int64(len(buf)), (pos+size-p)/zeroSector*zeroSector)
		m, err := s.file.ReadAt(buf[:n], p)
		if int64(m) < n {
			if err == nil || err == io.EOF {
				return true, nil // shorter than its size: torn
			}
			return false, err
		}
		for i := int64(0); i < n; i += zeroSector {
			if allZero(buf[i : i+zeroSector]) {
				return true, nil
			}
		}
		p += n
	}
	return false, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
