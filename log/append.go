package log

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"
)

// AppendInfo describes the result of an append.
type AppendInfo struct {
	// FirstOffset and LastOffset are the offsets of the first and last
	// record appended.
	FirstOffset, LastOffset int64
	// MaxTimestamp is the largest batch max timestamp appended.
	MaxTimestamp int64
	// Batches and Records count what was appended.
	Batches, Records int
	// Bytes is the number of bytes written to the log.
	Bytes int
	// Duplicate reports that every batch was a retry of an idempotent
	// producer's batch already in the log: nothing was written, and the
	// offsets are those of the original batches.
	Duplicate bool
}

// Append appends one or more record batches (concatenated v2 batches, as a
// produce request carries them) as the leader: every batch is validated,
// then given consecutive offsets starting at LogEndOffset and the leader
// epoch NoLeaderEpoch. See AppendAsLeader.
func (l *Log) Append(batches []byte) (AppendInfo, error) {
	return l.AppendAsLeader(batches, NoLeaderEpoch)
}

// AppendAsLeader appends batches as the partition leader at leaderEpoch:
// each batch is validated (framing, CRC, records), then its base offset
// and partition leader epoch are rewritten in place in the caller's slice
// (both lie outside the CRC) and the bytes written to the active segment.
// It returns once the data is in the segment file (page cache) and
// indexed: offsets are final, and readers can see it. With
// Options.SyncEveryAppend (or once Options.SyncEveryMessages is reached)
// it also waits for the fsync.
//
// As Kafka's leader does, every batch must hold at least one record and
// have a last offset delta of record count - 1 (else ErrInvalidRecord;
// ErrCorrupt for an uncompressed batch, whose records are counted when it
// is validated); its max timestamp must be its records' largest (or -1 if
// that is lower); a batch with a producer id must carry a sequence and an
// epoch (else ErrInvalidRecord); leaderEpoch may not be older than the
// log's latest epoch (ErrInvalidRecord), though NoLeaderEpoch is always
// accepted; and a compressed batch is decompressed (with a pooled
// compression.Local, within compression's default decompressed-size
// limit) and its records checked like an uncompressed batch's (ErrCorrupt
// for a corrupt stream or records, ErrBatchTooLarge over the limit). A
// batch with the LogAppendTime attribute is refused (ErrInvalidRecord):
// the log keeps producers' create times, where Kafka's leader would
// rewrite the attribute to its topic's timestamp type.
//
// On a validation, producer-state, roll or write error nothing is
// appended. The one exception is a failed fsync of SyncEveryAppend or
// SyncEveryMessages, which runs after the write: then the batches are in
// the log and visible to readers, the returned AppendInfo describes them,
// and the error wraps ErrSyncFailed. They are not acknowledged as
// durable, and the Log refuses further appends until it is reopened
// (recovery then keeps or drops them). When instead a Manager's file
// cache could not reopen a segment file for that fsync (EMFILE, say), the
// error is the reopen's: no fsync ran, the Log stays writable, and a later
// Sync makes the batches durable. Either way the batches are in the log,
// and retrying them appends them again (an idempotent producer's retry
// is recognised as a duplicate instead). An append whose fsync a Close
// overtakes returns once Close is done: nil if Close's fsync made its
// batches durable, else that fsync's failure, or ErrClosed if Close could
// not reopen a segment file to run it. The caller may reuse batches when
// Append returns.
func (l *Log) AppendAsLeader(batches []byte, leaderEpoch int32) (AppendInfo, error) {
	if leaderEpoch < NoLeaderEpoch {
		return AppendInfo{}, fmt.Errorf("%w: leader epoch %d", ErrInvalidRecord, leaderEpoch)
	}
	info, err := l.validateBatches(batches, true)
	if err != nil {
		return info, err
	}
	if info.Records > math.MaxInt32 {
		// An append goes to one segment, whose relative offsets are
		// int32 (compressed batches can hold that many records).
		return info, fmt.Errorf("%w: %d records in one append, more than a segment holds (2^31 offsets)", ErrInvalidRecord, info.Records)
	}
	return l.appendValidated(batches, info, true, func(first int64) error {
		if last, ok := l.epochs.latest(); ok && leaderEpoch >= 0 && leaderEpoch < last.Epoch {
			// Its batches would carry an epoch the cache does not show
			// there, and a follower copying them would be refused.
			return fmt.Errorf("%w: leader epoch %d, older than the log's latest, %d", ErrInvalidRecord, leaderEpoch, last.Epoch)
		}
		next := first
		for rest := batches; len(rest) > 0; {
			b, r, _ := SplitBatch(rest)
			if next > math.MaxInt64-1-int64(b.LastOffsetDelta()) {
				return fmt.Errorf("%w: offsets from %d with last offset delta %d overflow int64", ErrInvalidRecord, next, b.LastOffsetDelta())
			}
			b.setBaseOffset(next)
			b.setLeaderEpoch(leaderEpoch)
			next += int64(b.LastOffsetDelta()) + 1
			rest = r
		}
		return nil
	})
}

// AppendAsFollower appends batches that already carry their offsets and
// leader epochs, as a replica copying its leader does. The first batch's
// base offset must be at least LogEndOffset (and not negative) and each
// batch must start after the previous one ends (gaps are allowed, as in
// compacted Kafka topics); batches are validated but not modified. The
// batches of one call go to one segment, so they may span at most 2^31
// offsets (ErrInvalidRecord otherwise): append batches beyond a larger
// leap in a call of their own. Leader epochs must not go down from the
// log's last batch on, nor below NoLeaderEpoch (ErrInvalidRecord). In a
// log that holds no batch, a first batch too far past the log start for
// its segment (2^31 offsets) starts a new segment in place of the empty
// one, and the log start offset moves up to it, durably: no record lies
// between.
//
// Validation is a follower's, more lenient than a leader's as in Kafka:
// framing, CRC, offsets that fit int64, and the records of uncompressed
// batches (Validate). A batch may have no records whatever its offset
// range, and a compressed one a last offset delta above count-1
// (compaction leaves such batches); compressed bodies are not
// decompressed: the leader validated them when it appended them. Errors
// are those of AppendAsLeader; on error nothing is appended, except after
// a failed SyncEveryAppend or SyncEveryMessages fsync, as there.
func (l *Log) AppendAsFollower(batches []byte) (AppendInfo, error) {
	info, err := l.validateBatches(batches, false)
	if err != nil {
		return info, err
	}
	return l.appendValidated(batches, info, false, func(first int64) error {
		next, epoch := first, l.EpochAt(first-1)
		firstBase := Batch(batches).BaseOffset()
		for rest := batches; len(rest) > 0; {
			b, r, _ := SplitBatch(rest)
			if b.BaseOffset() < next {
				return fmt.Errorf("%w: follower batch at offset %d, expected at least %d", ErrInvalidRecord, b.BaseOffset(), next)
			}
			// An append goes to one segment, which a roll starts at the
			// first batch's base offset at the earliest, and whose
			// relative offsets are int32.
			if b.LastOffset()-firstBase > math.MaxInt32 {
				return fmt.Errorf("%w: follower batches from offset %d to %d span more than a segment holds (2^31 offsets); append them in separate calls",
					ErrInvalidRecord, firstBase, b.LastOffset())
			}
			// Leader epochs never go down along a log: a batch's epoch
			// below the one before it is damaged (it is outside the CRC).
			if b.LeaderEpoch() < max(epoch, NoLeaderEpoch) {
				return fmt.Errorf("%w: follower batch at offset %d of leader epoch %d, after epoch %d", ErrInvalidRecord, b.BaseOffset(), b.LeaderEpoch(), epoch)
			}
			next, epoch = b.NextOffset(), b.LeaderEpoch()
			rest = r
		}
		return nil
	})
}

// validateBatches checks every batch without holding the lock and counts
// records, bytes and the largest timestamp. A leader's batches must also
// pass checkLeaderRules, and compressed ones are decompressed and their
// records checked; a follower's must have non-negative base offsets.
func (l *Log) validateBatches(batches []byte, leader bool) (AppendInfo, error) {
	var info AppendInfo
	info.MaxTimestamp = NoTimestamp
	if len(batches) == 0 {
		return info, fmt.Errorf("%w: no batches", ErrInvalidRecord)
	}
	var scratch *leaderScratch // taken at the first compressed batch
	defer func() { scratch.release() }()
	for rest := batches; len(rest) > 0; {
		b, r, err := SplitBatch(rest)
		if err != nil {
			return info, err
		}
		if b.Size() > l.opts.MaxBatchBytes {
			return info, fmt.Errorf("%w: %d bytes, limit %d", ErrBatchTooLarge, b.Size(), l.opts.MaxBatchBytes)
		}
		maxTS, err := b.validate()
		if err != nil {
			return info, err
		}
		if leader {
			if err := b.checkLeaderRules(); err != nil {
				return info, err
			}
			if b.CodecID() != 0 {
				if scratch == nil {
					scratch = getLeaderScratch()
				}
				if maxTS, err = scratch.checkCompressed(b); err != nil {
					return info, fmt.Errorf("batch %d: %w", info.Batches, err)
				}
			}
			if err := b.checkLeaderMaxTimestamp(maxTS); err != nil {
				return info, fmt.Errorf("batch %d: %w", info.Batches, err)
			}
		} else if b.BaseOffset() < 0 {
			return info, fmt.Errorf("%w: follower batch with negative base offset %d", ErrInvalidRecord, b.BaseOffset())
		}
		info.Batches++
		info.Records += int(b.RecordCount())
		info.MaxTimestamp = max(info.MaxTimestamp, b.MaxTimestamp())
		rest = r
	}
	info.Bytes = len(batches)
	if info.Bytes > int(l.opts.SegmentBytes) {
		return info, fmt.Errorf("%w: %d bytes in one append, segment size %d", ErrBatchTooLarge, info.Bytes, l.opts.SegmentBytes)
	}
	return info, nil
}

// appendValidated assigns or checks offsets (stamp), applies the
// idempotent-producer checks (leader) or state updates (follower), rolls
// if needed and writes. stamp gets the log end offset and must leave the
// batches' offsets final.
func (l *Log) appendValidated(batches []byte, info AppendInfo, leader bool, stamp func(leo int64) error) (AppendInfo, error) {
	l.mu.Lock()
	if err := l.failure(); err != nil {
		l.mu.Unlock()
		return info, err
	}
	leo := l.leo.Load()
	if err := stamp(leo); err != nil {
		l.mu.Unlock()
		return info, err
	}
	first, _, _ := SplitBatch(batches)
	info.FirstOffset = first.BaseOffset()
	info.LastOffset = lastBatchOf(batches).LastOffset()
	if dup, isDup, err := l.checkProducers(batches, leader); err != nil || isDup {
		l.mu.Unlock()
		if !isDup {
			return info, err
		}
		dup.Records, dup.MaxTimestamp = info.Records, info.MaxTimestamp
		if l.opts.SyncEveryAppend && l.DurableOffset() <= dup.LastOffset {
			// The original may still be in its fsync, which may fail: the
			// retry is acknowledged only once it is durable.
			if err := l.syncWritten(dup.LastOffset + 1); err != nil {
				return dup, err
			}
		}
		return dup, nil
	}
	if err := l.saveUnsavedEpochs(); err != nil {
		l.producers.discard()
		l.mu.Unlock()
		return info, fmt.Errorf("replog/log: rewrite %s after a failed append: %w", leaderEpochFile, err)
	}
	epochsBefore, err := l.assignBatchEpochs(batches)
	if err != nil {
		l.producers.discard()
		l.mu.Unlock()
		return info, err
	}
	l.rollMovedDurable = false
	if err := l.maybeRoll(info); err != nil {
		l.producers.discard()
		if !l.rollMovedDurable && l.failedErr() == nil {
			l.restoreEpochs(epochsBefore)
		}
		l.mu.Unlock()
		return info, err
	}
	if err := l.writeToActive(batches); err != nil {
		l.producers.discard()
		if l.rollMovedDurable {
			// The roll moved the log start or the recovery point, durably,
			// up to this append's first offset: appends below them, or a
			// reopen, would find a log that does not hold what its
			// checkpoints say. Refuse writes until a reopen, whose
			// recovery goes by what the files hold.
			err = l.fail(err)
		} else if l.failedErr() == nil {
			// (A failed log keeps them: its batches may be whole on
			// disk, and a reopen's recovery judges them.)
			l.restoreEpochs(epochsBefore)
		}
		l.mu.Unlock()
		return info, err
	}
	l.producers.commit()
	l.askSpareIfHalfFull()
	l.leo.Store(info.LastOffset + 1)
	l.unsyncedMsgs += info.Records
	syncNow := l.opts.SyncEveryAppend ||
		(l.opts.SyncEveryMessages > 0 && l.unsyncedMsgs >= l.opts.SyncEveryMessages)
	if syncNow {
		l.unsyncedMsgs = 0
	}
	l.mu.Unlock()
	l.waiters.wake()
	l.stats.appended(info)
	if syncNow {
		if err := l.syncWritten(info.LastOffset + 1); err != nil {
			if isReopenError(err) {
				l.owePeriodicSync()
			}
			return info, err
		}
	}
	return info, nil
}

// owePeriodicSync makes the next append fsync after one of
// SyncEveryMessages met a reopen failure: its count was reset for an
// fsync that did not run.
func (l *Log) owePeriodicSync() {
	l.mu.Lock()
	l.unsyncedMsgs = max(l.unsyncedMsgs, l.opts.SyncEveryMessages)
	l.mu.Unlock()
}

// syncWritten is the Sync of an append whose batches, below end, are
// written. A Close that began meanwhile makes Sync return ErrClosed, which
// would read as a refused append although the batches are in the log: it
// waits instead for Close, whose clean shutdown fsyncs them, and returns
// nil if they are durable then. Else it returns the failure of Close's
// fsync (wrapping ErrSyncFailed), or ErrClosed when Close could not run
// it (a segment file it could not reopen).
func (l *Log) syncWritten(end int64) error {
	err := l.Sync()
	if !errors.Is(err, ErrClosed) {
		return err
	}
	<-l.closeDone
	if err := l.failedErr(); err != nil {
		return err
	}
	if l.DurableOffset() < end {
		return fmt.Errorf("%w before its fsync of offsets below %d could run", ErrClosed, end)
	}
	return nil
}

// checkProducers stages the producer-state updates of an append: for a
// leader it first recognises retries (all batches duplicates: their
// original offsets are returned with isDup) and checks epochs and
// sequences. Staged updates are committed once the append is written.
func (l *Log) checkProducers(batches []byte, leader bool) (AppendInfo, bool, error) {
	if leader {
		if dup, isDup, err := l.producers.findDuplicates(batches); err != nil || isDup {
			return dup, isDup, err
		}
	}
	for rest := batches; len(rest) > 0; {
		b, r, _ := SplitBatch(rest)
		if err := l.producers.update(b, leader); err != nil {
			l.producers.discard()
			return AppendInfo{}, false, err
		}
		rest = r
	}
	return AppendInfo{}, false, nil
}

// lastBatchOf returns the last batch of already-validated batches.
func lastBatchOf(batches []byte) Batch {
	var last Batch
	for rest := batches; len(rest) > 0; {
		last, rest, _ = SplitBatch(rest)
	}
	return last
}

// writeToActive writes validated, stamped batches to the active segment
// and indexes them. On a write error the segment keeps its old size.
func (l *Log) writeToActive(batches []byte) error {
	s := l.active()
	pos := s.size.Load()
	if _, err := s.file.WriteAt(batches, pos); err != nil {
		if isReopenError(err) {
			// The file could not be reopened: nothing reached it.
			return fmt.Errorf("replog/log: append to %s: %w", s.path(logSuffix), err)
		}
		// Drop whatever part reached the file so that a crash does not
		// find it; the next append overwrites it anyway. The cut is
		// fsynced: a concurrent Sync may have made the part durable, and
		// whole batches of it left behind a shorter append by a crash
		// would read as damage, offsets going backwards.
		terr := s.file.Truncate(pos)
		if terr == nil {
			terr = l.syncCutSegment(s, pos)
		}
		if terr != nil {
			// Part of a batch may stay past the segment's size. A shorter
			// append would leave its tail behind, and a clean Close would
			// make the next Open trust it: only recovery may cut it, so
			// the log refuses writes until reopened.
			l.fail(terr)
		}
		return fmt.Errorf("replog/log: append to %s: %w", s.path(logSuffix), err)
	}
	for rest, p := batches, pos; len(rest) > 0; {
		b, r, _ := SplitBatch(rest)
		s.indexBatch(b, p)
		s.noteBatch(b)
		if len(r) == 0 {
			s.tail.set(b, p)
		}
		p += int64(len(b))
		rest = r
	}
	s.size.Store(pos + int64(len(batches)))
	return nil
}

// maybeRoll rolls the active segment if the append described by info
// would not fit it: size, age, a full index, or offsets too far from the
// segment's base offset for the index's 32-bit relative offsets.
func (l *Log) maybeRoll(info AppendInfo) error {
	s := l.active()
	size := s.size.Load()
	if size == 0 {
		if info.FirstOffset != s.base && (info.LastOffset-s.base > math.MaxInt32 || info.FirstOffset < s.base) {
			return l.roll(info.FirstOffset)
		}
		return nil
	}
	switch {
	case size+int64(info.Bytes) > l.opts.SegmentBytes,
		l.opts.SegmentAge > 0 && l.now().Sub(s.rollBase) >= l.segmentAgeFor(s),
		s.offIdx.count()+info.Batches >= l.opts.MaxIndexBytes/offsetEntrySize,
		info.LastOffset-s.base > math.MaxInt32:
		return l.roll(info.FirstOffset)
	}
	return nil
}

// segmentAgeFor is SegmentAge minus the segment's jitter.
func (l *Log) segmentAgeFor(s *segment) time.Duration {
	return l.opts.SegmentAge - s.jitter
}

// roll makes a new active segment starting at base. The old segment's
// fsyncs happen on the background flusher (or inline when syncRollInline
// is set, to measure what that costs).
func (l *Log) roll(base int64) error {
	old := l.active()
	if old.size.Load() == 0 {
		if old.base == base {
			return nil
		}
		// Replace an empty active segment instead of keeping it.
		return l.replaceEmptyActive(base)
	}
	s, err := l.newRollSegment(base)
	if err != nil {
		return fmt.Errorf("replog/log: roll: %w", err)
	}
	l.setJitter(s)
	old.timeIdx.maybeAppend(old.maxTS.Load(), old.relOfMaxTS)
	// The producer state as of the new segment's base offset is captured
	// now, cheaply; the file is written and fsynced by the flusher.
	snap := encodeSnapshot(l.bg.takeSnapBuf(), l.producers)
	segs := l.segments()
	next := make([]*segment, len(segs), len(segs)+1)
	copy(next, segs)
	l.setSegments(append(next, s))
	l.dirDirty.Store(true)
	l.stats.rolls.Add(1)
	l.bg.enqueueRolled(old, base, snap)
	if base != old.next.Load() {
		return l.makeGapDurable(base)
	}
	if l.opts.syncRollInline {
		return l.bg.flushRolled()
	}
	return nil
}

// newRollSegment makes the new active segment of a roll from the
// flusher's spare file, renamed, or else from a newly created file.
func (l *Log) newRollSegment(base int64) (*segment, error) {
	name := filepath.Join(l.seg.dir, segmentName(base)+logSuffix)
	if f := l.bg.takeSpare(name); f != nil {
		return newEmptySegment(l.seg, base, f, l.now()), nil
	}
	return createSegment(l.seg, base, l.now())
}

// askSpareIfHalfFull has the flusher prepare the next segment's file once
// the active segment is half full, so that it is ready before the roll
// even when the flusher is busy, and before a log's first roll too; a log
// that never fills a segment never gets one. Inline roll flushes prepare
// it themselves.
func (l *Log) askSpareIfHalfFull() {
	s := l.active()
	if s.spareAsked || l.opts.syncRollInline || s.size.Load() < l.opts.SegmentBytes/2 {
		return
	}
	s.spareAsked = true
	l.bg.wantSpare.Store(true)
	l.bg.prepareSpareSoon()
}

// makeGapDurable moves the recovery point to base, the first offset of a
// new active segment that does not start where the previous segment ends
// (a follower's gap). Recovery takes such a gap between two segments it
// scans for the lost tail of the earlier one and drops the later
// segments, so the gap must lie below the recovery point before anything
// is written after it: the rolled segments are flushed first, and the
// checkpoint write syncs the directory.
func (l *Log) makeGapDurable(base int64) error {
	if err := l.bg.flushRolled(); err != nil {
		// Even one that could not reopen a file (reopenError): the new
		// segment stays, and a retry of the append would write after the
		// unprotected gap.
		return l.fail(err)
	}
	l.rollMovedDurable = true
	return l.writeRecoveryPointAtLeast(base)
}

// replaceEmptyActive swaps the empty active segment for one at base.
func (l *Log) replaceEmptyActive(base int64) error {
	old := l.active()
	if err := l.carryProducerSnapshot(base); err != nil {
		return err
	}
	s, err := createSegment(l.seg, base, l.now())
	if err != nil {
		// The snapshot goes too: a later leap to a lower offset, and
		// appends past base with no roll, would leave it the newest at
		// or below the end, holding none of their producers.
		if derr := l.deleteSnapshot(base); derr != nil {
			return l.fail(derr)
		}
		if derr := l.syncDirIfDirty(); derr != nil {
			return derr // failed the log
		}
		return fmt.Errorf("replog/log: roll: %w", err)
	}
	l.setJitter(s)
	segs := l.segments()
	next := append(append([]*segment(nil), segs[:len(segs)-1]...), s)
	l.readMu.Lock()
	l.setSegments(next)
	l.readMu.Unlock()
	l.dirDirty.Store(true)
	if err := l.bg.deleteLater(old); err != nil {
		// The segment list no longer matches the directory (the old
		// segment's files may be partly renamed): refuse writes until a
		// reopen, whose recovery goes by the files.
		return l.fail(fmt.Errorf("replog/log: roll: delete empty segment %s: %w", old.path(logSuffix), err))
	}
	if len(next) > 1 && next[len(next)-2].next.Load() != base {
		return l.makeGapDurable(base)
	}
	if len(next) == 1 && base > l.logStart.Load() {
		// The log held no batch, and now starts at its only segment's
		// base: the log start moves up to it (no record lies between),
		// durably, as a reopen would find it.
		l.rollMovedDurable = true
		if err := writeOffsetCheckpoint(l.opts.FS, l.path(logStartOffsetFile), base); err != nil {
			return l.fail(err)
		}
		return l.raiseLogStart(base)
	}
	return nil
}

func (l *Log) setJitter(s *segment) {
	if l.opts.SegmentJitter > 0 {
		s.jitter = time.Duration(l.rng.Int64N(int64(l.opts.SegmentJitter)))
	}
}

// carryProducerSnapshot writes, durably, a producer snapshot at base for
// replaceEmptyActive, before it deletes the empty segment it replaces and
// that segment's snapshot: that snapshot may be the only record of what
// deleted segments left (an epoch a transaction marker raised), and the
// state at base is the same, the segment holding no batch.
func (l *Log) carryProducerSnapshot(base int64) error {
	if len(l.producers.entries) == 0 {
		return nil
	}
	if err := l.writeSnapshot(base, encodeSnapshot(nil, l.producers)); err != nil {
		return err
	}
	return l.syncDirIfDirty()
}
