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

// damageVerdict is what judgeDamage concluded; see rebuildResult.
type damageVerdict struct{ validAfter, endsFile, wholeAtEnd bool }

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
	if bad.Magic() == MagicV2 && size >= BatchHeaderSize && size <= end-pos {
		zeros, err := s.holdsZeroSector(pos, size)
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
	return s.damagedNotTorn(pos, bad.CRC(), next, end, maxBatch)
}

// tornSectorRest reports whether the implausible header h at pos starts
// with zeros up to the next sector boundary that a torn sector explains:
// the rest of a sector whose unsynced part was lost, with what follows it
// kept. Eight or more zeros there would make the base offset 0, which no
// batch after the first of a log has; fewer are torn when the header is
// plausible with those bytes taken from offset next (the zeros replaced
// the high bytes of its base offset).
func (s *segment) tornSectorRest(h Batch, pos, next, end int64) bool {
	run := min(zeroSector-pos%zeroSector, BatchHeaderSize)
	if !allZero(h[:run]) {
		return false
	}
	if run >= 8 {
		return true
	}
	var fixed [BatchHeaderSize]byte
	copy(fixed[:], h)
	binary.BigEndian.PutUint64(fixed[:8], uint64(next))
	copy(fixed[run:8], h[run:8])
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
func (s *segment) damagedNotTorn(pos int64, crc uint32, next, end int64, maxBatch int) (damageVerdict, error) {
	var v damageVerdict
	q, err := s.findValidBatch(pos+1, next, end, maxBatch)
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
	zeros, err := s.holdsZeroSector(pos, q-pos)
	v.validAfter = !zeros
	return v, err
}

// findValidBatch returns the first position in [from, end) where a valid
// batch continuing offset next starts and is followed by another valid
// batch continuing it or by the end of the file; -1 if there is none. It
// reads the file in chunks and checks a full batch only where a plausible
// header starts.
func (s *segment) findValidBatch(from, next, end int64, maxBatch int) (int64, error) {
	if end-from < BatchHeaderSize {
		return -1, nil
	}
	buf := make([]byte, min(scanChunk, end-from))
	scratch := make([]byte, 64<<10)
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
			// The CRC first, through scratch: garbage makes many
			// plausible headers, and a full check reads a whole chunk.
			size := int64(h.Length()) + LogOverhead
			ok, err := batchCRCMatches(s.file, q, size, h.CRC(), scratch)
			if err == nil && ok {
				ok, err = s.validBatchAt(q, next, end, maxBatch)
			}
			if err != nil {
				return -1, err
			}
			if ok && q+size < end {
				ok, err = s.validBatchAt(q+size, h.NextOffset(), end, maxBatch)
				if err != nil {
					return -1, err
				}
			}
			if ok {
				return q, nil
			}
		}
		p += int64(n - BatchHeaderSize + 1)
	}
	return -1, nil
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
