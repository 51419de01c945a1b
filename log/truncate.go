package log

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// TruncateTo removes every batch whose last offset is >= offset, so the
// log end offset becomes the base offset of the first batch removed
// (offset itself when offset is a batch boundary, as leader-epoch end
// offsets are), or, when a follower's gap lies before that batch, the end
// of the batch before the gap. Later segments are deleted. The
// truncation is fsynced before TruncateTo returns, so truncated data
// never reappears after a crash. Truncating at or past the log end offset
// does nothing; below the log start offset it returns
// ErrOffsetOutOfRange.
func (l *Log) TruncateTo(offset int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.failure(); err != nil {
		return err
	}
	if offset >= l.leo.Load() {
		return nil
	}
	if offset < l.logStart.Load() {
		return fmt.Errorf("%w: truncate to %d below log start %d", ErrOffsetOutOfRange, offset, l.logStart.Load())
	}
	l.readMu.Lock()
	defer l.readMu.Unlock()
	segs := l.segments()
	i, pos, newLEO, err := l.truncationPoint(segs, offset)
	if err != nil {
		return err
	}
	s := segs[i]
	// The later segments go first, newest first: if one cannot be
	// deleted, what is left is still the start of the log, on disk and in
	// the list. A failure before any went leaves the log as it was; one
	// after fails it, as does any failure from here on.
	later := make([]*segment, 0, len(segs)-i-1)
	for j := len(segs) - 1; j > i; j-- {
		later = append(later, segs[j])
	}
	if gone, err := l.deleteSegments(later); err != nil {
		if gone > 0 {
			left := len(segs) - gone
			l.setSegments(segs[:left:left])
		}
		return err
	}
	l.setSegments(segs[: i+1 : i+1])
	if newLEO < l.logStart.Load() {
		// The batch holding the log start offset goes: the start follows
		// the end down, as in Kafka's truncateTo, durably before the data
		// goes, so that a reopen finds the same start.
		if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), newLEO); err != nil {
			return l.fail(err)
		}
		l.logStart.Store(newLEO)
	}
	l.bg.flushMu.Lock()
	l.bg.forget(s) // s is the active segment again
	l.bg.flushMu.Unlock()
	// Before s is cut, durably: the later segments' deletion, so that a
	// crash cannot bring them back behind a cut segment (a hole in the
	// offsets), and a recovery point no higher than s, so that recovery
	// scans s whatever state the crash left it in.
	if err := l.syncDirIfDirty(); err != nil {
		return l.fail(err)
	}
	if l.recoveryPointMayExceed(s.base) {
		if err := l.writeRecoveryPoint(min(l.recoveryPt.Load(), s.base)); err != nil {
			return err
		}
	}
	if err := l.truncateSegment(s, pos, newLEO); err != nil {
		return l.fail(err)
	}
	if s.rollBase.IsZero() {
		// A sealed segment opened from disk has no creation time: as for
		// the active segment at Open, its age counts from now, instead of
		// from year 1, which rolled it at the next append.
		s.rollBase = l.now()
	}
	if err := l.syncDirIfDirty(); err != nil {
		return l.fail(err)
	}
	if err := l.afterTruncation(newLEO); err != nil {
		return l.fail(err)
	}
	if err := l.truncateEpochsFromEnd(newLEO); err != nil {
		return l.fail(err)
	}
	if err := l.loadProducerState(newLEO); err != nil {
		return l.fail(err)
	}
	if err := l.syncDirIfDirty(); err != nil {
		return l.fail(err)
	}
	return nil
}

// restoreLogStartCheckpoint writes the log start back to its checkpoint
// file after TruncateFullyAndStartAt wrote a new one and then failed
// before any segment went. It returns err, or, if that write fails too,
// why the log failed: a reopen would take the new log start for the
// log's.
func (l *Log) restoreLogStartCheckpoint(err error) error {
	if werr := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), l.logStart.Load()); werr != nil {
		return l.fail(werr)
	}
	return err
}

// truncationPoint finds where TruncateTo(offset) cuts segs: the index of
// the segment that becomes the active one, the position it is cut at, and
// the new log end offset. That end is where the batch before the first
// one removed ends (its base offset, unless a follower's gap lies between
// them, and then the log claims no offset of the gap), or where the
// segment's last batch ends. Callers hold mu and readMu.
func (l *Log) truncationPoint(segs []*segment, offset int64) (i int, pos, newLEO int64, err error) {
	i = max(sort.Search(len(segs), func(i int) bool { return segs[i].base > offset })-1, 0)
	s := segs[i]
	var hdr [BatchHeaderSize]byte
	pos, newLEO, ok, err := s.findAfter(offset, l.opts.MaxBatchBytes, &hdr, true)
	if err != nil {
		return 0, 0, 0, err
	}
	if ok && pos == 0 && i > 0 {
		// The first batch removed starts a segment: if a gap lies before
		// it, the whole segment goes, and the log ends where the one
		// before it does.
		prevEnd, err := segs[i-1].dataEnd(l.opts.MaxBatchBytes)
		if err != nil {
			return 0, 0, 0, err
		}
		if prevEnd < s.base {
			i--
			s, newLEO, ok = segs[i], prevEnd, false
		}
	}
	if !ok {
		pos = s.size.Load()
	}
	return i, pos, newLEO, nil
}

// truncateSegment cuts s at pos (a batch boundary), fixes its indexes and
// metadata, and fsyncs it.
func (l *Log) truncateSegment(s *segment, pos, newNext int64) error {
	if err := s.file.Truncate(pos); err != nil {
		return err
	}
	if err := l.syncCutSegment(s, pos); err != nil {
		return err
	}
	if err := s.loadIndexes(l.opts.MaxBatchBytes); err != nil {
		return err
	}
	rel := newNext - s.base
	s.offIdx.truncateEntries(rel, offsetKey)
	s.timeIdx.truncateEntries(rel, timeRelOffset)
	s.next.Store(newNext)
	return l.recomputeTail(s)
}

// recomputeTail sets the appender state of s (max timestamp, bytes since
// the last index entry) by stepping over the batch headers after its last
// index entries.
func (l *Log) recomputeTail(s *segment) error {
	s.maxTS.Store(NoTimestamp)
	s.relOfMaxTS = 0
	from := int64(0)
	if ts, rel, ok := s.timeIdx.last(); ok {
		s.maxTS.Store(ts)
		s.relOfMaxTS = rel
		from = s.offIdx.lookup(rel)
	}
	lastIndexed := s.offIdx.floorPosition(s.size.Load())
	from = min(from, lastIndexed)
	var hdr [BatchHeaderSize]byte
	size := s.size.Load()
	for p := from; p < size; {
		b, err := s.batchHeaderAt(p, &hdr)
		if err != nil {
			return err
		}
		if ts := b.MaxTimestamp(); ts > s.maxTS.Load() {
			s.maxTS.Store(ts)
			s.relOfMaxTS = int32(b.LastOffset() - s.base)
		}
		p += int64(b.Size())
	}
	s.sinceIndex = int(size - lastIndexed)
	return nil
}

// afterTruncation lowers the offsets that may now point past the end. An
// error is from the recovery point's checkpoint, and has failed the log.
func (l *Log) afterTruncation(newLEO int64) error {
	l.truncations.add(newLEO)
	l.hwMu.Lock()
	l.leo.Store(newLEO)
	if l.hw.Load() > newLEO {
		l.hw.Store(newLEO)
	}
	l.hwMu.Unlock()
	l.sync.mu.Lock()
	l.sync.durable = min(l.sync.durable, newLEO)
	l.sync.mu.Unlock()
	var err error
	if l.recoveryPointMayExceed(newLEO) {
		// writeRecoveryPoint publishes it once written, and fails the log
		// if it cannot be.
		err = l.writeRecoveryPoint(min(l.recoveryPt.Load(), l.active().base))
	}
	l.waiters.wake()
	return err
}

// TruncateFullyAndStartAt deletes every segment and restarts the log
// empty at offset, as a follower does when its leader's log starts after
// its own end. A crash during the call reopens the log as it was less a
// prefix of its segments (as after DeleteRecordsBefore), or empty at
// offset; for an offset below the log start, empty at that start instead
// of a prefix (records below the start never come back).
func (l *Log) TruncateFullyAndStartAt(offset int64) error {
	if offset < 0 {
		return fmt.Errorf("%w: negative offset %d", ErrOffsetOutOfRange, offset)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.failure(); err != nil {
		return err
	}
	if err := l.saveUnsavedEpochs(); err != nil {
		// (A failed append's epoch may be in the file: the restart
		// empty at offset that a crash may bring would keep it.)
		return err
	}
	l.readMu.Lock()
	defer l.readMu.Unlock()
	// Waiters look again on every return: one after a failure may leave
	// the new segments, log start or log end published (a spurious wake
	// only makes them check).
	defer l.waiters.wake()
	segs := l.segments()
	// The new segment's file first, so that if it cannot be created
	// (disk full) nothing has changed. It gets a temporary name until the
	// old segments are gone: offset may be the base of one of them, whose
	// files must stay until then, and Open removes a temporary file that
	// a crash leaves.
	name := filepath.Join(l.seg.dir, segmentName(offset)+logSuffix)
	tmp := name + tmpSuffix
	f, err := l.seg.openFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	dropTmp := func() {
		_ = f.Close()
		if rerr := l.opts.FS.Remove(tmp); rerr != nil && !os.IsNotExist(rerr) {
			l.opts.Logger.Warn("replog/log: removing a temporary segment file", "dir", l.dir, "err", rerr)
		}
	}
	// Then the new log start, durably, before any segment goes: a crash
	// that leaves some or all of them deleted then reopens the log at
	// offset (past the old end, it restarts empty there; with no segment
	// left, it starts there; below it, it has lost a prefix, as after
	// DeleteRecordsBefore), never empty at the old log start, which would
	// hand the old offsets out again. Not if offset is below the log
	// start, which would bring records below it back: the checkpoint then
	// follows the deletions, and a crash between them leaves the log
	// empty at its old start.
	ckptFirst := offset >= l.logStart.Load()
	if ckptFirst {
		if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), offset); err != nil {
			// As for DeleteRecordsBefore: the new one may be in place, or
			// its rename not durable (a failed directory fsync, after
			// which a later success proves nothing).
			dropTmp()
			return l.fail(err)
		}
	}
	// Oldest first: if one cannot be deleted, what is left is still the
	// end of the log, on disk and in the list. A failure before any went
	// leaves the log as it was, its log start checkpoint written back;
	// one after fails it, as does any failure from here on.
	if gone, err := l.deleteSegments(segs); err != nil {
		dropTmp()
		if gone == 0 && ckptFirst {
			return l.restoreLogStartCheckpoint(err)
		}
		if gone < len(segs) {
			// (With all gone, the list keeps them: it is never empty.)
			l.setSegments(segs[gone:])
		}
		return err // deleteSegments failed the log
	}
	if err := l.renameSegmentFile(f, tmp, name); err != nil {
		_ = f.Close()
		return l.fail(err)
	}
	s := newEmptySegment(l.seg, offset, f, l.now())
	l.setJitter(s)
	l.setSegments([]*segment{s})
	l.dirDirty.Store(true)
	if !ckptFirst {
		if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), offset); err != nil {
			return l.fail(err)
		}
	}
	if err := l.syncDirIfDirty(); err != nil {
		return l.fail(err)
	}
	for _, off := range l.snapshots.list() {
		if err := l.deleteSnapshot(off); err != nil {
			return l.fail(err)
		}
	}
	l.producers = newProducerState()
	l.truncations.add(offset)
	if err := l.clearEpochs(); err != nil {
		return l.fail(err)
	}
	l.hwMu.Lock()
	l.logStart.Store(offset)
	l.leo.Store(offset)
	l.hw.Store(offset)
	l.hwMu.Unlock()
	l.sync.mu.Lock()
	l.sync.durable = offset
	l.sync.mu.Unlock()
	return l.writeRecoveryPoint(offset)
}
