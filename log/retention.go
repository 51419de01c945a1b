package log

import "fmt"

// DeleteRecordsBefore makes offset the new log start offset: reads below
// it fail with ErrOffsetOutOfRange and segments that end at or before it
// are deleted. The new start offset is checkpointed durably before the
// call returns. offset must lie in [LogStartOffset, LogEndOffset].
func (l *Log) DeleteRecordsBefore(offset int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.failure(); err != nil {
		return err
	}
	if offset < l.logStart.Load() || offset > l.leo.Load() {
		return fmt.Errorf("%w: delete before %d outside [%d, %d]", ErrOffsetOutOfRange, offset, l.logStart.Load(), l.leo.Load())
	}
	if offset == l.logStart.Load() {
		return nil
	}
	if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), offset); err != nil {
		return l.fail(err)
	}
	l.logStart.Store(offset)
	if l.hw.Load() < offset {
		l.hw.Store(offset)
	}
	if err := l.truncateEpochsFromStart(offset); err != nil {
		return l.fail(err)
	}
	segs := l.segments()
	n := 0
	for n+1 < len(segs) && segs[n+1].base <= offset {
		n++
	}
	return l.deleteOldest(n)
}

// ApplyRetention deletes the oldest segments that RetentionBytes or
// RetentionAge no longer allow, never the active segment, and returns how
// many it deleted. The background flusher calls it every
// RetentionCheckInterval when that is set.
func (l *Log) ApplyRetention() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.failure(); err != nil {
		return 0, err
	}
	segs := l.segments()
	var total int64
	for _, s := range segs {
		total += s.size.Load()
	}
	cutoff := l.now().Add(-l.opts.RetentionAge).UnixMilli()
	n := 0
	for ; n+1 < len(segs); n++ {
		s := segs[n]
		size := s.size.Load()
		bySize := l.opts.RetentionBytes > 0 && total-size >= l.opts.RetentionBytes
		byAge := false
		if l.opts.RetentionAge > 0 {
			ts, err := l.segmentMaxTimestamp(s)
			if err != nil {
				return 0, err
			}
			byAge = ts != NoTimestamp && ts < cutoff
		}
		if !bySize && !byAge {
			break
		}
		total -= size
	}
	if n == 0 {
		return 0, nil
	}
	if start := segs[n].base; start > l.logStart.Load() {
		l.logStart.Store(start)
		if l.hw.Load() < start {
			l.hw.Store(start)
		}
		if err := l.truncateEpochsFromStart(start); err != nil {
			return 0, l.fail(err)
		}
	}
	return n, l.deleteOldest(n)
}

// segmentMaxTimestamp returns the newest timestamp in s, loading its time
// index if needed.
func (l *Log) segmentMaxTimestamp(s *segment) (int64, error) {
	if ts := s.maxTS.Load(); ts != NoTimestamp {
		return ts, nil
	}
	if err := s.loadIndexes(l.opts.MaxBatchBytes); err != nil {
		return NoTimestamp, err
	}
	l.loadSegmentMeta(s)
	return s.maxTS.Load(), nil
}

// deleteOldest removes the first n segments (never the active one).
// Callers hold l.mu.
func (l *Log) deleteOldest(n int) error {
	l.producers.truncateHead(l.logStart.Load())
	if n == 0 {
		return nil
	}
	l.readMu.Lock()
	defer l.readMu.Unlock()
	segs := l.segments()
	for _, s := range segs[:n] {
		if err := l.bg.deleteLater(s); err != nil {
			return err
		}
	}
	// Snapshots below the new first segment are of no use any more; those
	// not named by a segment's base offset (written by Close at the log
	// end) would otherwise be left behind forever.
	for _, off := range l.snapshots.list() {
		if off < segs[n].base {
			if err := l.deleteSnapshot(off); err != nil {
				return err
			}
		}
	}
	l.setSegments(append([]*segment(nil), segs[n:]...))
	return nil
}
