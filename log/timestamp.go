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
	for _, s := range l.segments() {
		maxTS, err := l.segmentMaxTimestamp(s)
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

// offsetForTimestampIn searches one segment, from its time index entry.
func (l *Log) offsetForTimestampIn(s *segment, ts, start int64) (int64, bool, error) {
	rel := s.timeIdx.lookup(ts)
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
