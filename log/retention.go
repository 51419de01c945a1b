package log

import (
	"fmt"
	"slices"
)

// DeleteRecordsBefore makes offset the new log start offset: reads below
// it fail with ErrOffsetOutOfRange and segments that end at or before it
// are deleted, but for the active segment, which stays (empty of
// readable records when offset is the log end). The new start offset is
// checkpointed durably before the call returns. offset must lie in
// [0, LogEndOffset], or [0, HighWatermark] after
// RetainAboveHighWatermark; at or below LogStartOffset there is nothing
// to delete and it returns nil, as Kafka's DeleteRecords does (a retry
// after retention moved the start, say): the start never moves back.
// A checkpoint that cannot be written fails the log, except for want of
// descriptors or memory to open its temporary file (EMFILE, ENFILE,
// ENOMEM): then the call returns that error having changed nothing, and
// may be retried.
func (l *Log) DeleteRecordsBefore(offset int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.failure(); err != nil {
		return err
	}
	if limit := l.deletionLimit(); offset < 0 || offset > limit {
		return fmt.Errorf("%w: delete before %d outside [0, %d]", ErrOffsetOutOfRange, offset, limit)
	}
	if offset <= l.logStart.Load() {
		return nil
	}
	if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), offset); err != nil {
		return l.failUnlessReopen(err)
	}
	if err := l.raiseLogStart(offset); err != nil {
		return err
	}
	segs := l.segments()
	n := 0
	for n+1 < len(segs) && segs[n+1].base <= offset {
		n++
	}
	_, err := l.deleteOldest(n)
	return err
}

// ApplyRetention deletes the oldest segments that RetentionBytes or
// RetentionAge no longer allow, never the active segment (nor, after
// RetainAboveHighWatermark, one that ends above the high watermark), and
// returns how many it deleted. The log then starts at the base offset of
// the oldest segment kept; the new log start is checkpointed durably
// before any segment goes, so it holds even if the deletion fails or a
// crash undoes it (a checkpoint whose file cannot be opened for want of
// descriptors deletes nothing and does not fail the log, as with
// DeleteRecordsBefore). Segments wholly below the log start go too,
// whatever the limits.
// The background flusher calls it every RetentionCheckInterval when that
// is set.
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
	limit := l.deletionLimit()
	n := 0
	for ; n+1 < len(segs) && segs[n+1].base <= limit; n++ {
		s := segs[n]
		size := s.size.Load()
		bySize := l.opts.RetentionBytes > 0 && total-size >= l.opts.RetentionBytes
		byAge := false
		if l.opts.RetentionAge > 0 {
			ts, err := l.retentionTimestamp(s)
			if err != nil {
				return 0, err
			}
			byAge = ts != NoTimestamp && ts < cutoff
		}
		// A segment wholly below the log start goes whatever the
		// limits (Kafka's log-start breach): one a failed or crashed
		// deletion left, or one DeleteRecordsBefore passed.
		byStart := segs[n+1].base <= l.logStart.Load()
		if !bySize && !byAge && !byStart {
			break
		}
		total -= size
	}
	if n == 0 {
		return 0, nil
	}
	if start := segs[n].base; start > l.logStart.Load() {
		// Durably first, as DeleteRecordsBefore does: the leader epochs
		// below start are dropped from their checkpoint now, while the
		// segments' removal is not durable before the next directory
		// fsync. A crash that brought them back without this checkpoint
		// would make the log start below its epochs.
		if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), start); err != nil {
			return 0, l.failUnlessReopen(err)
		}
		if err := l.raiseLogStart(start); err != nil {
			return 0, err
		}
	}
	return l.deleteOldest(n)
}

// raiseLogStart moves the log start offset up to start, and the high
// watermark and the leader epochs with it, and wakes waiters (a high
// watermark that moved may pass their offset). Callers hold l.mu and have
// checkpointed start if it must survive a reopen.
func (l *Log) raiseLogStart(start int64) error {
	l.hwMu.Lock()
	l.logStart.Store(start)
	if l.hw.Load() < start {
		l.hw.Store(start)
	}
	l.hwMu.Unlock()
	l.waiters.wake()
	if err := l.truncateEpochsFromStart(start); err != nil {
		return l.fail(err)
	}
	return nil
}

// segmentMaxTimestamp returns the newest timestamp in s, loading its time
// index if needed.
// retentionTimestamp is what age retention judges s by: its largest
// timestamp, or, when its batches carry none (NoTimestamp, or times before
// 1970, which Kafka's rule sets to NoTimestamp), the modification time of
// its data file, as Kafka does (LogSegment.largestTimestamp): else such a
// segment would never expire, nor would any after it. A segment whose
// time index's last entry fails its check goes by its batch headers.
// Callers hold l.mu.
func (l *Log) retentionTimestamp(s *segment) (int64, error) {
	ts, err := l.segmentMaxTimestamp(s)
	if err != nil || ts != NoTimestamp {
		return ts, err
	}
	if last, _, ok := s.timeIdx.last(); ok && last != NoTimestamp {
		// The last entry failed its check: the segment's max timestamp
		// comes from its batch headers instead (keeping the segment
		// would hold back every later one forever).
		if ts, err := l.scanMaxTimestamp(s); err != nil || ts != NoTimestamp {
			return ts, err
		}
	}
	st, err := l.opts.FS.Stat(s.path(logSuffix))
	if err != nil {
		return NoTimestamp, err
	}
	return st.ModTime().UnixMilli(), nil
}

// scanMaxTimestamp sets s's max timestamp from the headers of its
// batches, for a sealed segment whose time index cannot be trusted.
// Callers hold l.mu.
func (l *Log) scanMaxTimestamp(s *segment) (int64, error) {
	var hdr [BatchHeaderSize]byte
	maxTS, rel := NoTimestamp, int32(0)
	for p, size := int64(0), s.size.Load(); p < size; {
		b, err := s.batchHeaderAt(p, &hdr)
		if err != nil {
			return NoTimestamp, err
		}
		if ts := b.MaxTimestamp(); ts > maxTS {
			maxTS, rel = ts, int32(b.LastOffset()-s.base)
		}
		p += int64(b.Size())
	}
	if maxTS != NoTimestamp && s.maxTS.CompareAndSwap(NoTimestamp, maxTS) {
		s.relOfMaxTS = rel
	}
	return maxTS, nil
}

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

// deleteOldest removes the first n segments (never the active one) and
// returns how many it removed. An error with none removed left the
// segments as they were; one after a segment was removed fails the log.
// Callers hold l.mu.
func (l *Log) deleteOldest(n int) (int, error) {
	l.producers.truncateHead(l.logStart.Load())
	if n == 0 {
		return 0, nil
	}
	l.readMu.Lock()
	defer l.readMu.Unlock()
	segs := l.segments()
	if err := l.keepPendingSnapshot(segs[n].base); err != nil {
		return 0, err
	}
	if err := l.keepSnapshotAt(segs[n].base); err != nil {
		return 0, err
	}
	// Oldest first: if one cannot be deleted, the segments left are
	// still the end of the log, on disk and in the list.
	gone, err := l.deleteSegments(segs[:n])
	if gone > 0 {
		l.setSegments(append([]*segment(nil), segs[gone:]...))
	}
	if err != nil {
		return gone, err
	}
	// Snapshots below the new first segment are of no use any more; those
	// not named by a segment's base offset (written by Close at the log
	// end) would otherwise be left behind forever.
	for _, off := range l.snapshots.list() {
		if off < segs[n].base {
			if err := l.deleteSnapshot(off); err != nil {
				return gone, l.fail(err)
			}
		}
	}
	return gone, nil
}

// keepPendingSnapshot writes, durably, the producer snapshot at base (the
// first segment left by a deletion) that a roll flush still pending is
// to write: the deletion drops that flush, and the snapshot holds the
// state the deleted batches left (an epoch a marker raised, for one),
// which a recovery or a rebuild after TruncateTo starts from. The state
// it holds is of batches the deletion removes from the log anyway, so it
// need not wait for their fsync.
func (l *Log) keepPendingSnapshot(base int64) error {
	written, err := l.bg.writePendingSnapshot(base)
	if err != nil || !written {
		return err
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil { // before the deletion's renames
		return l.fail(err)
	}
	return nil
}

// keepSnapshotAt writes, durably, a producer snapshot at base (the first
// segment left by a deletion) when there is none: a crash can lose a roll
// snapshot before its flush wrote it, and recovery writes none, yet a
// later rebuild (a crash, TruncateTo) starts at base once the segments
// below are gone, and would lose what they held (an epoch a marker
// raised). The state is rebuilt from the segments about to go.
func (l *Log) keepSnapshotAt(base int64) error {
	if slices.Contains(l.snapshots.list(), base) {
		return nil
	}
	ps, err := l.rebuildProducers(base)
	if err != nil {
		return err
	}
	if err := l.writeSnapshot(base, encodeSnapshot(nil, ps)); err != nil {
		return err
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil { // before the deletion's renames
		return l.fail(err)
	}
	return nil
}

// deleteSegments deletes segs with deleteSegment, in the order given, and
// returns how many of them are gone. It stops at the first error: with
// none gone the log is as it was and the error is returned as is; once a
// segment is gone the log is no longer what the call promised, nor what
// it was, so the error fails the log (sticky: nothing later is
// acknowledged, and a reopen finds the segments that are left). Callers
// hold l.mu and readMu, and take the segments that are gone out of the
// list.
func (l *Log) deleteSegments(segs []*segment) (int, error) {
	for i, s := range segs {
		gone, err := l.bg.deleteSegment(s)
		if err == nil {
			continue
		}
		if gone {
			i++
		}
		if i > 0 {
			return i, l.fail(err)
		}
		return 0, err
	}
	return len(segs), nil
}
