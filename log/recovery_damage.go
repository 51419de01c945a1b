package log

import (
	"encoding/binary"
	"errors"
	"io"
	"math"
)

// How recovery tells a torn tail, which a crash leaves in data that was
// never synced and which it truncates, from damage in the middle of the
// data, which it refuses to truncate (see the package documentation).

// damageVerdict is what judgeDamage concluded about an invalid batch.
type damageVerdict struct {
	// validAfter: a whole valid batch continuing the offsets follows the
	// invalid one, which does not look torn: the damage is in the middle
	// of the data, not a torn tail.
	validAfter bool
	// endsFile: the invalid batch's length ends it exactly at the end of
	// the file and it holds no sector of zeros, which a crash does not
	// leave either: a next segment that starts with a valid batch past
	// the offsets before it means damage in the middle of the log.
	endsFile bool
	// wholeAtEnd: the invalid batch is the last of the file and whole
	// (its bytes match its CRC; only fields outside the CRC are damaged),
	// which no crash leaves: a segment after it means damage in the
	// middle of the log.
	wholeAtEnd bool
}

// judgeDamage judges the invalid batch at pos, where a batch starting at
// or after offset next was expected, in a file of end bytes: is it what a
// crash leaves in unsynced data (a torn tail, to be truncated), or damage
// in the middle of the data (validAfter)?
//
// A crash leaves a cut batch, zeros (an aligned sector of them, the rest
// of a sector from pos, a header of them) or nothing after the last batch
// that reached the disk. So the damage lies in the middle when the
// invalid batch's magic and length frame it inside the file, it holds no
// aligned sector of zeros, and a whole valid batch continuing the offsets
// starts where its length ends. When it ends exactly at the end of the
// file, the caller looks at the next segment instead (endsFile). When its
// framing is not believable, or nothing valid starts where it says,
// damagedNotTorn looks past it.
func (s *segment) judgeDamage(pos, next, end int64, maxBatch int) (damageVerdict, error) {
	var torn damageVerdict
	var hdr [BatchHeaderSize]byte
	if n, _ := s.file.ReadAt(hdr[:], pos); n < BatchHeaderSize || allZero(hdr[:]) {
		return torn, nil
	}
	bad := Batch(hdr[:])
	plausible := s.plausibleHeader(bad, pos, next, end)
	if !plausible && s.tornSectorRest(bad, pos, next, end) {
		return torn, nil
	}
	size := int64(bad.Length()) + LogOverhead
	if size > end-pos && bad.CodecID() == 0 && s.plausibleHeader(bad, pos, next, pos+size) {
		return s.judgeCut(pos, bad, end, maxBatch)
	}
	if bad.Magic() == MagicV2 && size >= BatchHeaderSize && size <= end-pos {
		zeros, err := s.holdsZeroSector(pos, size, end)
		if err != nil || zeros {
			return torn, err
		}
		if pos+size == end {
			return damageVerdict{endsFile: true}, nil
		}
		after := next
		if plausible {
			after = bad.NextOffset()
		}
		if ok, err := s.validBatchAt(pos+size, after, end, maxBatch); err != nil || ok {
			return damageVerdict{validAfter: ok}, err
		}
	}
	return s.damagedNotTorn(pos, bad.CRC(), next, end)
}

// tornSectorRest reports whether the implausible header h at pos starts
// with zeros up to the next sector boundary that a torn sector explains:
// the rest of a sector whose unsynced part was lost, with what follows it
// kept. Eight or more zeros there would make the base offset 0, which no
// batch after the first of a log has; fewer are torn when some base
// offset from next on, with the low bytes left, makes the header
// plausible (the zeros replaced the high bytes of its base offset). A
// flip that zeroes the bytes before a sector boundary reads as torn.
func (s *segment) tornSectorRest(h Batch, pos, next, end int64) bool {
	run := min(zeroSector-pos%zeroSector, BatchHeaderSize)
	if !allZero(h[:run]) {
		return false
	}
	if run >= 8 {
		return true
	}
	// The smallest base offset from next on whose low bytes are the ones
	// left: next's high bytes, or one more if the low bytes are smaller
	// (a follower's offsets may leap).
	var fixed [BatchHeaderSize]byte
	copy(fixed[:], h)
	binary.BigEndian.PutUint64(fixed[:8], uint64(next))
	copy(fixed[run:8], h[run:8])
	if base := Batch(fixed[:]).BaseOffset(); base < next {
		binary.BigEndian.PutUint64(fixed[:8], uint64(base+int64(1)<<(8*(8-run))))
	}
	return s.plausibleHeader(Batch(fixed[:]), pos, next, end)
}

// plausibleHeader reports whether h, read at pos, could start a batch
// continuing offset next in a file of end bytes.
func (s *segment) plausibleHeader(h Batch, pos, next, end int64) bool {
	size := int64(h.Length()) + LogOverhead
	return h.Magic() == MagicV2 && size >= BatchHeaderSize && size <= end-pos &&
		h.BaseOffset() >= next && h.LastOffsetDelta() >= 0 && h.LastOffset()-s.base <= math.MaxInt32
}

// validBatchAt reports whether a whole batch that passes validation, CRC
// included, starts at pos and continues offset next.
func (s *segment) validBatchAt(pos, next, end int64, maxBatch int) (bool, error) {
	sc := &batchScanner{s: s, maxBatch: maxBatch, pos: pos, end: end}
	b, _, err := sc.next()
	if err != nil && !errors.Is(err, ErrCorrupt) && err != io.EOF {
		return false, err
	}
	return err == nil && b.BaseOffset() >= next && b.LastOffset()-s.base <= math.MaxInt32, nil
}

// judgeCut judges an uncompressed batch at pos whose header is plausible
// but runs past the end of the file: a batch that a crash cut, or one
// whose length field is damaged. Its records, each framed by its length,
// tell: a cut batch's records run past the end of the file (and may hold
// whole batches in their values, as a mirror's do, which must not count
// as data after the damage), while a batch with a damaged length field
// ends after its last record. Such a batch is whole if its bytes match
// its CRC, and followed by valid data if a batch starts where it ends.
func (s *segment) judgeCut(pos int64, h Batch, end int64, maxBatch int) (damageVerdict, error) {
	var v damageVerdict
	stop, ok, err := s.recordsEnd(pos, h.RecordCount(), end)
	if err != nil || !ok {
		return v, err
	}
	if stop < end {
		after, err := s.validBatchAt(stop, h.NextOffset(), end, maxBatch)
		if err != nil || after {
			return damageVerdict{validAfter: after}, err
		}
	}
	whole, err := batchCRCMatches(s.file, pos, stop-pos, h.CRC(), make([]byte, min(scanChunk, stop-pos)))
	if err != nil || !whole {
		return v, err
	}
	return damageVerdict{validAfter: stop < end, wholeAtEnd: stop == end}, nil
}

// recordsEnd steps over count length-framed records from the end of the
// header of the batch at pos and returns where they end; ok is false if
// they run past end or a length is not a valid varint.
func (s *segment) recordsEnd(pos int64, count int32, end int64) (stop int64, ok bool, err error) {
	var buf [binary.MaxVarintLen32]byte
	p := pos + BatchHeaderSize
	for range max(count, 0) {
		n, err := s.file.ReadAt(buf[:min(int64(len(buf)), end-p)], p)
		if err != nil && err != io.EOF {
			return 0, false, err
		}
		size, w, verr := readVarint(buf[:n], binary.MaxVarintLen32)
		if verr != nil || size < 0 || p+int64(w)+size > end {
			return 0, false, nil
		}
		p += int64(w) + size
	}
	return p, count > 0, nil
}

// damagedNotTorn judges an invalid batch at pos whose header misstates
// its length or offsets (a flipped bit in the length, base offset, magic
// or last offset delta), or whose stated length ends inside garbage, by
// what lies past it: the first valid batch after pos that is followed by
// another valid batch or by the end of the file (so that a batch embedded
// in a torn batch's records does not count), at q, or the end of the file
// if there is none. A crash cannot leave
//   - a batch whose bytes from pos to q match the CRC in its header: it is
//     whole, and only fields outside the CRC are damaged (wholeAtEnd if
//     it ends the file);
//   - valid data at q after damage that holds no aligned sector of zeros.
//
// Either is damage in the middle of the data. A crash can leave data that
// was never synced after a hole of zeros, and such a hole reads as a torn
// tail.
func (s *segment) damagedNotTorn(pos int64, crc uint32, next, end int64) (damageVerdict, error) {
	var v damageVerdict
	q, err := s.findValidBatch(pos+1, next, end)
	if err != nil {
		return v, err
	}
	stop := end
	if q >= 0 {
		stop = q
	}
	if stop-pos >= BatchHeaderSize {
		whole, err := batchCRCMatches(s.file, pos, stop-pos, crc, make([]byte, min(scanChunk, stop-pos)))
		if err != nil {
			return v, err
		}
		if whole {
			v.validAfter, v.wholeAtEnd = q >= 0, q < 0
			return v, nil
		}
	}
	if q < 0 {
		return v, nil
	}
	zeros, err := s.holdsZeroSector(pos, q-pos, end)
	v.validAfter = !zeros
	return v, err
}

// findValidBatch returns the first position in [from, end) where a valid
// batch continuing offset next starts and is followed by another valid
// batch continuing it or by the end of the file; -1 if there is none. It
// reads the file in chunks, and reads a candidate whole only if its
// header is plausible, what follows it looks like a batch or the end of
// the file, and its bytes match its CRC. The CRC checks read at most
// about four times the bytes searched: past that, crafted headers (each
// claiming the rest of the file) would make the search quadratic, and it
// gives up.
func (s *segment) findValidBatch(from, next, end int64) (int64, error) {
	if end-from < BatchHeaderSize {
		return -1, nil
	}
	buf := make([]byte, min(scanChunk, end-from))
	scratch := make([]byte, 64<<10)
	var batch []byte // a candidate read whole, reused
	budget := 4*(end-from) + scanChunk
	for p := from; p+BatchHeaderSize <= end; {
		n, err := s.file.ReadAt(buf[:min(int64(len(buf)), end-p)], p)
		if n < BatchHeaderSize {
			if err == nil || err == io.EOF {
				return -1, nil
			}
			return -1, err
		}
		for i := 0; i+BatchHeaderSize <= n; i++ {
			h := Batch(buf[i : i+BatchHeaderSize])
			q := p + int64(i)
			if h.Magic() != MagicV2 || !s.plausibleHeader(h, q, next, end) {
				continue
			}
			size := int64(h.Length()) + LogOverhead
			afterSize, ok, err := s.batchOrEndAt(q+size, h.NextOffset(), end)
			if err != nil {
				return -1, err
			}
			if !ok {
				continue
			}
			if budget -= size; budget < 0 {
				return -1, nil
			}
			ok, err = batchCRCMatches(s.file, q, size, h.CRC(), scratch)
			if err == nil && ok {
				ok, err = s.wholeValidBatch(q, size, next, &batch)
			}
			if err == nil && ok && afterSize > 0 {
				ok, err = s.wholeValidBatch(q+size, afterSize, h.NextOffset(), &batch)
			}
			if err != nil {
				return -1, err
			}
			if ok {
				return q, nil
			}
		}
		p += int64(n - BatchHeaderSize + 1)
	}
	return -1, nil
}

// batchOrEndAt reports whether pos is the end of the file or holds a
// plausible header of a batch continuing offset next, and that batch's
// size (0 at the end of the file).
func (s *segment) batchOrEndAt(pos, next, end int64) (size int64, ok bool, err error) {
	if pos == end {
		return 0, true, nil
	}
	var hdr [BatchHeaderSize]byte
	n, err := s.file.ReadAt(hdr[:], pos)
	if n < BatchHeaderSize {
		if err == nil || err == io.EOF {
			return 0, false, nil
		}
		return 0, false, err
	}
	h := Batch(hdr[:])
	return int64(h.Length()) + LogOverhead, s.plausibleHeader(h, pos, next, end), nil
}

// wholeValidBatch reads the size bytes at pos into *buf and reports
// whether they are a valid batch (CRC, framing, counts) continuing offset
// next; *buf is reused.
func (s *segment) wholeValidBatch(pos, size, next int64, buf *[]byte) (bool, error) {
	if int64(cap(*buf)) < size {
		*buf = make([]byte, size)
	}
	b := (*buf)[:size]
	if n, err := s.file.ReadAt(b, pos); int64(n) < size {
		if err == nil || err == io.EOF {
			return false, nil
		}
		return false, err
	}
	batch := Batch(b)
	return batch.ValidateHeader() == nil && batch.BaseOffset() >= next && batch.LastOffset()-s.base <= math.MaxInt32, nil
}

// holdsZeroSector reports whether the size bytes at pos contain an
// aligned zeroSector-byte block of zeros, as a torn write leaves; a block
// cut short by the end of the file (end) counts when its bytes are zeros.
func (s *segment) holdsZeroSector(pos, size, end int64) (bool, error) {
	if last := end / zeroSector * zeroSector; pos+size == end && last < end && last >= pos {
		tail := make([]byte, end-last)
		if n, err := s.file.ReadAt(tail, last); n < len(tail) {
			if err == nil || err == io.EOF {
				return true, nil // shorter than its size: torn
			}
			return false, err
		}
		if allZero(tail) {
			return true, nil
		}
	}
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
