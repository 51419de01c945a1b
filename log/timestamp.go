package log

import "fmt"

// OffsetForTimestamp returns the offset of the first record whose
// timestamp is >= ts, as Kafka's ListOffsets does, and ok=false when no
// record is that new. For compressed batches the answer is the batch's
// base offset (the first record of the first batch whose max timestamp is
// >= ts), which may be a few records early.
func (l *Log) OffsetForTimestamp(ts int64) (offset int64, ok bool, err error) {
	if l.closed.Load() {
		return 0, false, ErrClosed
	}
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	start := l.logStart.Load()
	segs := l.segments()
	for _, s := range segs {
		maxTS, err := l.readerMaxTimestamp(s, s == segs[len(segs)-1])
		if err != nil {
			return 0, false, err
		}
		if maxTS == NoTimestamp || maxTS < ts || s.next.Load() <= start {
			continue
		}
		off, found, err := l.offsetForTimestampIn(s, ts, start)
		if err != nil || found {
			return off, found, err
		}
	}
	return 0, false, nil
}

// readerMaxTimestamp returns the newest timestamp in s for a caller that
// holds only readMu: unlike segmentMaxTimestamp it stores nothing in s
// (whose max timestamp the appender, or retention under l.mu, may be
// setting at the same time). The active segment's max timestamp is kept
// by the appender: NoTimestamp there means no record has a timestamp, and
// its time index is not consulted.
func (l *Log) readerMaxTimestamp(s *segment, active bool) (int64, error) {
	if ts := s.maxTS.Load(); ts != NoTimestamp || active {
		return ts, nil
	}
	if err := s.loadIndexes(l.opts.MaxBatchBytes); err != nil {
		return NoTimestamp, err
	}
	if ts := s.maxTS.Load(); ts != NoTimestamp {
		return ts, nil // a rebuild of the indexes set it
	}
	ts, _, ok := s.timeIdx.last()
	if !ok {
		return NoTimestamp, nil
	}
	return ts, nil
}

// offsetForTimestampIn searches one segment, from its time index entry.
func (l *Log) offsetForTimestampIn(s *segment, ts, start int64) (int64, bool, error) {
	rel := l.timeIndexStart(s, ts)
	from := max(s.base+int64(rel), start)
	var hdr [BatchHeaderSize]byte
	pos, ok, err := s.find(from, l.opts.MaxBatchBytes, &hdr)
	if err != nil || !ok {
		return 0, false, err
	}
	var buf []byte
	size := s.size.Load()
	for pos < size {
		b, err := s.batchHeaderAt(pos, &hdr)
		if err != nil {
			return 0, false, err
		}
		if b.MaxTimestamp() >= ts && b.LastOffset() >= start {
			if b.CodecID() != 0 || b.IsLogAppendTime() {
				return max(b.BaseOffset(), start), true, nil
			}
			buf = growLen(buf[:0], b.Size())
			if _, err := s.readAt(buf, pos); err != nil {
				return 0, false, err
			}
			return recordOffsetForTimestamp(Batch(buf), ts, start)
		}
		pos += int64(b.Size())
	}
	return 0, false, nil
}

// recordOffsetForTimestamp finds the first record >= ts in an
// uncompressed batch.
func recordOffsetForTimestamp(b Batch, ts, start int64) (int64, bool, error) {
	if err := b.ValidateHeader(); err != nil {
		return 0, false, err
	}
	it := b.Records()
	for it.Next() {
		r := it.Record()
		if r.Timestamp >= ts && r.Offset >= start {
			return r.Offset, true, nil
		}
	}
	if err := it.Err(); err != nil {
		return 0, false, err
	}
	return 0, false, fmt.Errorf("%w: batch max timestamp %d but no record at or after %d", ErrCorrupt, b.MaxTimestamp(), ts)
}

// timeIndexStart returns the relative offset from which to search s for
// ts: that of the time index entry lookup finds, once checked against the
// batch it names (an entry (T, r) says that the batch ending at offset r
// holds the largest timestamp so far, T), else 0. No checksum covers the
// time index, and a damaged entry would make the search skip the records
// it should find.
func (l *Log) timeIndexStart(s *segment, ts int64) int32 {
	entryTS, rel, ok := s.timeIdx.lookupEntry(ts)
	if !ok || entryTS == NoTimestamp {
		return 0
	}
	var hdr [BatchHeaderSize]byte
	_, found, err := s.find(s.base+int64(rel), l.opts.MaxBatchBytes, &hdr)
	if b := Batch(hdr[:]); err != nil || !found || b.LastOffset() != s.base+int64(rel) || b.MaxTimestamp() != entryTS {
		return 0
	}
	return rel
}
