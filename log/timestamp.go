package log

import (
	"fmt"
	"math"
)

// OffsetForTimestamp returns the offset of the first record whose
// timestamp is >= ts, as Kafka's ListOffsets does, and ok=false when no
// record is that new. For compressed batches the answer is the batch's
// base offset (the first record of the first batch whose max timestamp is
// >= ts), which may be a few records early. The batches it scans (from
// the time index entry before ts) are read whole and their CRCs checked:
// damage fails with ErrCorrupt rather than giving a wrong offset.
//
// The answer is below the log end offset, but may be at or above the high
// watermark: Kafka answers consumers only below it (records above it may
// be truncated by a leader change), so a caller serving consumers treats
// such an answer as none. ts is a plain timestamp: Kafka's special values
// -1 (latest) and -2 (earliest) are LogEndOffset and LogStartOffset here.
func (l *Log) OffsetForTimestamp(ts int64) (offset int64, ok bool, err error) {
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	if l.closed.Load() { // under readMu: Close then waits to close the files
		return 0, false, ErrClosed
	}
	// The log end is loaded before the segments: an append publishes a
	// batch's bytes (the segment size) before its offsets.
	start, end := l.logStart.Load(), l.leo.Load()
	segs := l.segments()
	for _, s := range segs {
		maxTS, err := l.readerMaxTimestamp(s, s == segs[len(segs)-1])
		if err != nil {
			return 0, false, err
		}
		// A segment without timestamps (NoTimestamp: none, or only
		// times before 1970) is searched for a ts of NoTimestamp or below.
		if maxTS < ts || s.next.Load() <= start {
			continue
		}
		off, found, err := l.offsetForTimestampIn(s, ts, start, end)
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
	ts, _, ok := l.checkedLastTime(s)
	if !ok {
		return math.MaxInt64, nil // unknown: search the segment
	}
	return ts, nil
}

// checkedLastTime returns a sealed segment's max timestamp from the last
// entry of its time index, once checked against the batch it names (no
// checksum covers the time index, and a damaged last entry would hide the
// segment's newest records from time lookups and age retention), or
// ok=false when the index has no entry or the check fails.
func (l *Log) checkedLastTime(s *segment) (ts int64, rel int32, ok bool) {
	ts, rel, ok = s.timeIdx.last()
	if !ok || ts == NoTimestamp || !l.timeEntryMatches(s, ts, rel) {
		return NoTimestamp, 0, false
	}
	return ts, rel, true
}

// timeEntryMatches reports whether the time index entry (ts, rel) of s
// says what the log holds: an entry (T, r) says that the batch ending at
// offset base+r holds the largest timestamp so far, T.
func (l *Log) timeEntryMatches(s *segment, ts int64, rel int32) bool {
	var hdr [BatchHeaderSize]byte
	_, found, err := s.find(s.base+int64(rel), l.opts.MaxBatchBytes, &hdr)
	b := Batch(hdr[:])
	return err == nil && found && b.LastOffset() == s.base+int64(rel) && b.MaxTimestamp() == ts
}

// offsetForTimestampIn searches one segment, from its time index entry,
// for an answer in [start, end). Every batch it steps over is read whole
// and its CRC checked: the answer is an offset, so nothing downstream
// could notice that a damaged max timestamp made it skip the batch
// holding the records asked for.
func (l *Log) offsetForTimestampIn(s *segment, ts, start, end int64) (int64, bool, error) {
	rel := l.timeIndexStart(s, ts)
	from := max(s.base+int64(rel), start)
	var hdr [BatchHeaderSize]byte
	pos, ok, err := s.find(from, l.opts.MaxBatchBytes, &hdr)
	if err != nil || !ok {
		return 0, false, err
	}
	var buf []byte
	size := s.size.Load()
	prevNext := int64(-1) // where the batch stepped over last ended
	for pos < size {
		h, err := s.batchHeaderAt(pos, &hdr)
		if err != nil {
			return 0, false, err
		}
		buf = growLen(buf[:0], h.Size())
		if _, err := s.readAt(buf, pos); err != nil {
			return 0, false, err
		}
		b := Batch(buf)
		if err := b.ValidateHeader(); err != nil {
			return 0, false, fmt.Errorf("segment %d at position %d: %w", s.base, pos, err)
		}
		if b.BaseOffset() < prevNext { // a base offset damaged on disk
			return 0, false, fmt.Errorf("%w: batch at position %d of %s starts at offset %d, below the end of the batch before (%d)",
				ErrCorrupt, pos, s.path(logSuffix), b.BaseOffset(), prevNext)
		}
		if b.BaseOffset() >= end {
			return 0, false, nil // appended after the call began
		}
		if b.MaxTimestamp() >= ts && b.LastOffset() >= start {
			if b.CodecID() != 0 || b.IsLogAppendTime() {
				return max(b.BaseOffset(), start), true, nil
			}
			off, found, err := recordOffsetForTimestamp(b, ts, start)
			if err != nil || found {
				return off, found, err
			}
		}
		pos += int64(b.Size())
		prevNext = b.NextOffset()
	}
	return 0, false, nil
}

// recordOffsetForTimestamp finds the first record >= ts at or after
// start in an uncompressed batch whose header it checked. None there is
// no damage: the log start may lie inside the batch, and a batch may keep
// a max timestamp of records it no longer holds (Kafka's cleaner writes
// such batches, even empty ones); the search goes on with the next batch,
// as Kafka's does.
func recordOffsetForTimestamp(b Batch, ts, start int64) (int64, bool, error) {
	it := b.Records()
	for it.Next() {
		r := it.Record()
		if r.Timestamp >= ts && r.Offset >= start {
			return r.Offset, true, nil
		}
	}
	return 0, false, it.Err()
}

// timeIndexStart returns the relative offset from which to search s for
// ts: that of the time index entry lookup finds, once checked against the
// batch it names (timeEntryMatches), else 0. No checksum covers the time
// index, and a damaged entry would make the search skip the records it
// should find.
func (l *Log) timeIndexStart(s *segment, ts int64) int32 {
	entryTS, rel, ok := s.timeIdx.lookupEntry(ts)
	if !ok || entryTS == NoTimestamp || !l.timeEntryMatches(s, entryTS, rel) {
		return 0
	}
	return rel
}
