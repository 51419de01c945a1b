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
	// invalid is non-nil when the scan stopped before the end of file,
	// at an invalid batch: recovery judges it (judgeDamage), a lazy index
	// rebuild needs only the valid batches before it.
	invalid error
	// backwards reports that the batch at validEnd is whole and valid
	// but goes back in offsets, which no crash leaves: its base offset,
	// or the one of the batch before it, is damaged (the CRC covers
	// neither).
	backwards bool
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
		// The newest timestamp gets an entry, as a roll gives the segment
		// it seals: readers of a sealed segment learn its max timestamp
		// from its time index's last entry, and a segment smaller than
		// the index interval would otherwise have none.
		if maxTS != NoTimestamp {
			s.timeIdx.maybeAppend(maxTS, relOfMaxTS)
		}
		s.sinceIndex, s.relOfMaxTS = since, relOfMaxTS
		s.maxTS.Store(maxTS)
		s.next.Store(next)
	}
	sc := newBatchScanner(s, maxBatch)
	var res rebuildResult
	for {
		b, pos, err := sc.next()
		if err == io.EOF {
			res.validEnd = pos
			publish()
			return res
		}
		if err == nil {
			if err = s.checkContinues(b, next); err != nil && !s.tornSectorRest(b, pos, next, sc.end) {
				res.validEnd, res.backwards = pos, true
				res.invalid = fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
				publish()
				return res
			}
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			// A read error (EMFILE, EIO) is no verdict on the data: the
			// indexes are rebuilt again at their next use rather than
			// left empty, which would hide the segment's records from
			// lookups and make age retention judge it by its mtime.
			s.offIdx.unload()
			s.timeIdx.unload()
			res.validEnd, res.err = pos, fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
			return res
		}
		if err != nil {
			res.validEnd, res.invalid = pos, fmt.Errorf("segment %s: %w", s.path(logSuffix), err)
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
