package log

import (
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replog/replog/internal/vfs"
)

// flusher is the Log's background worker: it makes rolled segments
// durable and advances the recovery point, removes deleted segments' files
// after FileDeleteDelay, and runs interval syncs and retention. Its
// goroutine is started by Open and stopped by Close.
type flusher struct {
	l *Log

	mu        sync.Mutex
	pending   []rolled // rolled segments not yet flushed, oldest first
	deletions []deletion
	// deleting counts, per base offset, the deleted segments whose files
	// may still exist (renamed, not yet removed), and deletedSeq numbers
	// those whose names need a tag (tagDeleted); guarded by mu.
	deleting   map[int64]int
	deletedSeq uint64
	// snapBuf is a flushed snapshot's buffer, kept for the next roll to
	// encode into: a roll then allocates nothing for its snapshot, and
	// the append that rolls is not made to assist the garbage collector
	// for a producer state of 100s of KiB.
	snapBuf []byte

	// rpLazy, guarded by flushMu, spaces out a standalone log's
	// recovery-point checkpoint writes after roll flushes (see
	// Options.CheckpointInterval).
	rpLazy struct {
		written time.Time // last checkpoint write
		behind  bool      // the file holds less than recoveryPt
	}

	// spare is the file the next roll renames instead of creating one
	// (spare.go); spareMu guards it and serializes its creation with its
	// use. wantSpare is set when the active segment is half full or a
	// roll found no spare.
	spareMu      sync.Mutex
	spare        vfs.File
	wantSpare    atomic.Bool
	spareRunning atomic.Bool    // a prepareSpareSoon goroutine runs
	spareWG      sync.WaitGroup // that goroutine, for stop

	// flushMu serializes roll flushes with each other and with segment
	// deletion, so a flush never touches the files of a deleted segment.
	// Lock order: Log.mu before flushMu.
	flushMu sync.Mutex

	// stepMu serializes steps (a shared scheduler may run them on any
	// worker) and guards the fields below it.
	stepMu                              sync.Mutex
	stopped                             bool
	nextSync, nextRetention, nextExpiry time.Time

	// A standalone Log's flusher has its own goroutine (kick, stopCh,
	// done); a Manager's logs share the Manager's scheduler instead.
	sched  *scheduler
	kick   chan struct{}
	stopCh chan struct{}
	done   chan struct{}

	// queued, running and rerun are the scheduler's, under its mu: in its
	// queue, being stepped by a worker, kicked while being stepped.
	queued, running, rerun bool
	due                    time.Time // when timed work is next due (scheduler; under its mu)
}

// rolled is a segment waiting for its background flush, with the
// producer-state snapshot taken when it was rolled.
type rolled struct {
	seg     *segment
	snapOff int64
	snap    []byte
}

type deletion struct {
	seg *segment
	at  time.Time
}

func startFlusher(l *Log) *flusher {
	f := &flusher{l: l}
	now := l.now()
	f.nextSync = now.Add(l.opts.SyncInterval)
	f.nextRetention = now.Add(l.opts.RetentionCheckInterval)
	f.nextExpiry = now.Add(l.opts.ProducerExpiryCheckInterval)
	l.bg = f // before any step can run and use it
	if s := l.opts.sched; s != nil {
		// No channels: a Manager's idle log holds nothing for its
		// background work but this struct.
		f.sched = s
		s.register(f)
		return f
	}
	f.kick, f.stopCh, f.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go f.run()
	return f
}

func (f *flusher) wake() {
	if f.sched != nil {
		f.sched.kick(f)
		return
	}
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// stop ends the background work and waits for a step in progress.
func (f *flusher) stop() {
	defer f.spareWG.Wait()
	if f.sched != nil {
		f.sched.unregister(f)
		f.stepMu.Lock()
		f.stopped = true
		f.stepMu.Unlock()
		return
	}
	close(f.stopCh)
	<-f.done
}

// run is the goroutine of a standalone Log's flusher.
func (f *flusher) run() {
	defer close(f.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := f.step()
		timer.Reset(max(next.Sub(f.l.now()), time.Millisecond))
		select {
		case <-f.stopCh:
			return
		case <-f.kick:
		case <-timer.C:
		}
	}
}

// step does the background work that is due: roll flushes, deletions,
// interval sync, retention and producer expiry. It returns when timed work
// is next due. One step runs at a time.
func (f *flusher) step() time.Time {
	f.stepMu.Lock()
	defer f.stepMu.Unlock()
	l := f.l
	if f.stopped {
		return l.now().Add(time.Hour)
	}
	if f.sched != nil && !l.opts.syncRollInline {
		f.prepareSpare() // see prepareSpareSoon
	}
	retryFlush := false
	if f.hasPending() {
		release := l.opts.FlushGroup.acquire(false)
		if err := f.flushRolled(); isReopenError(err) {
			l.opts.Logger.Warn("replog/log: background flush could not reopen a segment file; retrying", "dir", l.dir, "err", err)
			retryFlush = true
		} else if err != nil {
			l.opts.Logger.Error("replog/log: background flush failed", "dir", l.dir, "err", err)
		}
		release()
	}
	now := l.now()
	lateCheckpoint, late := f.writeLateCheckpoint(now)
	f.deleteDue(now)
	if l.opts.SyncInterval > 0 && !now.Before(f.nextSync) {
		if err := l.Sync(); isReopenError(err) {
			// Other failures are sticky and reported by later calls.
			l.opts.Logger.Warn("replog/log: interval sync could not reopen a segment file", "dir", l.dir, "err", err)
		}
		f.nextSync = now.Add(l.opts.SyncInterval)
	}
	if l.opts.RetentionCheckInterval > 0 && !now.Before(f.nextRetention) {
		if _, err := l.ApplyRetention(); err != nil {
			l.opts.Logger.Warn("replog/log: retention failed", "dir", l.dir, "err", err)
		}
		f.nextRetention = now.Add(l.opts.RetentionCheckInterval)
	}
	if !now.Before(f.nextExpiry) {
		l.expireProducers()
		f.nextExpiry = now.Add(l.opts.ProducerExpiryCheckInterval)
	}
	next := f.nextExpiry
	if late {
		next = minTime(next, lateCheckpoint)
	}
	if d, ok := f.nextDeletion(); ok {
		next = minTime(next, d)
	}
	if retryFlush {
		next = minTime(next, now.Add(flushRetryDelay))
	}
	if l.opts.SyncInterval > 0 {
		next = minTime(next, f.nextSync)
	}
	if l.opts.RetentionCheckInterval > 0 {
		next = minTime(next, f.nextRetention)
	}
	return minTime(next, now.Add(time.Hour))
}

// flushRetryDelay is how long the flusher waits before it tries again a
// roll flush that could not reopen a segment file (see reopenError).
const flushRetryDelay = time.Second

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (f *flusher) hasPending() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending) > 0
}

// enqueueRolled queues a just-rolled segment for flushing.
func (f *flusher) enqueueRolled(s *segment, snapOff int64, snap []byte) {
	f.mu.Lock()
	f.pending = append(f.pending, rolled{seg: s, snapOff: snapOff, snap: snap})
	f.mu.Unlock()
	f.wake()
}

// takeSnapBuf returns an empty buffer for a roll's snapshot, reusing a
// flushed one when there is one.
func (f *flusher) takeSnapBuf() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.snapBuf[:0]
	f.snapBuf = nil
	return b
}

// flushRolled fsyncs the pending rolled segments (index files written and
// fsynced too) and the directory, then advances and checkpoints the
// recovery point. On failure the recovery point stays and the failure is
// sticky, except when a segment file could not be reopened (reopenError):
// the flush then stays pending, and the flusher tries again.
func (f *flusher) flushRolled() error {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	f.mu.Lock()
	pending := append([]rolled(nil), f.pending...)
	f.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	l := f.l
	if err := l.failedErr(); err != nil {
		return err
	}
	start := time.Now()
	// First the next roll's file, so that it is ready long before that
	// roll; a roll flush, inline or not, leaves it ready before the
	// recovery point moves.
	f.prepareSpare()
	for _, r := range pending {
		s := r.seg
		// A segment that filled its allocation keeps the few KiB past
		// its end: releasing them would cost a truncation, and on
		// filesystems mounted with discard a synchronous discard, at
		// every roll.
		l.releasePreallocated(s, max(64<<10, l.opts.PreallocateBytes/16))
		if err := s.flushIndexes(true); err != nil {
			return l.failUnlessReopen(err)
		}
		if err := l.syncSegment(s); err != nil {
			return err
		}
		// The snapshot only after its segment's data is durable, so a
		// snapshot never reflects batches a crash could lose.
		if err := l.writeSnapshot(r.snapOff, r.snap); err != nil {
			return l.failUnlessReopen(err)
		}
	}
	if err := l.syncDirIfDirty(); err != nil {
		return l.fail(err)
	}
	rp := l.segmentAfter(pending[len(pending)-1].seg)
	if rp > l.recoveryPt.Load() {
		if err := f.advanceRecoveryPoint(rp); err != nil {
			return err
		}
		l.markDurable(rp)
	}
	f.mu.Lock()
	f.pending = f.pending[len(pending):]
	for _, r := range pending {
		if cap(r.snap) > cap(f.snapBuf) {
			f.snapBuf = r.snap
		}
	}
	f.mu.Unlock()
	l.stats.bgFlushes.Add(1)
	l.stats.bgFlushNanos.Add(int64(time.Since(start)))
	return nil
}

// advanceRecoveryPoint publishes rp, the end of a roll flush, and
// checkpoints it unless a standalone log's last checkpoint write is more
// recent than CheckpointInterval: then the file keeps an older recovery
// point (a crash only makes recovery scan more) and writeLateCheckpoint
// catches up. Callers hold flushMu.
func (f *flusher) advanceRecoveryPoint(rp int64) error {
	l := f.l
	now := l.now()
	if l.opts.recoveryPoints == nil && l.opts.CheckpointInterval > 0 && now.Sub(f.rpLazy.written) < l.opts.CheckpointInterval {
		l.recoveryPt.Store(rp)
		f.rpLazy.behind = true
		return nil
	}
	if err := l.storeRecoveryPoint(rp, false); err != nil {
		return err
	}
	f.rpLazy.written, f.rpLazy.behind = now, false
	return nil
}

// writeLateCheckpoint writes the published recovery point if
// advanceRecoveryPoint left the file behind and CheckpointInterval has
// passed since the last write. It returns when it is next due.
func (f *flusher) writeLateCheckpoint(now time.Time) (time.Time, bool) {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	if !f.rpLazy.behind {
		return time.Time{}, false
	}
	if due := f.rpLazy.written.Add(f.l.opts.CheckpointInterval); now.Before(due) {
		return due, true
	}
	if f.l.failedErr() != nil {
		return time.Time{}, false
	}
	if err := f.l.storeRecoveryPoint(f.l.recoveryPt.Load(), false); err != nil {
		return time.Time{}, false // sticky: storeRecoveryPoint failed the log
	}
	f.rpLazy.written, f.rpLazy.behind = now, false
	return time.Time{}, false
}

// writePendingSnapshot writes the producer snapshot at off that a
// pending roll flush is to write, if there is one, and reports whether it
// did. It holds flushMu, as the flush does when it writes its snapshots
// (they share a temporary file name, and the flush recycles the buffer).
func (f *flusher) writePendingSnapshot(off int64) (bool, error) {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	f.mu.Lock()
	i := slices.IndexFunc(f.pending, func(r rolled) bool { return r.snapOff == off })
	var snap []byte
	if i >= 0 {
		snap = f.pending[i].snap
	}
	f.mu.Unlock()
	if i < 0 {
		return false, nil
	}
	return true, f.l.writeSnapshot(off, snap)
}

// forget drops a segment from the pending flushes (it is being deleted).
// Callers hold flushMu.
func (f *flusher) forget(s *segment) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, p := range f.pending {
		if p.seg == s {
			f.pending = append(f.pending[:i:i], f.pending[i+1:]...)
			return
		}
	}
}

// deleteLater renames a removed segment's files to *.deleted and removes
// them after FileDeleteDelay, so that readers holding file regions can
// finish. Callers hold Log.mu and have taken the segment out of the list.
// See deleteSegment for what an error leaves.
func (f *flusher) deleteLater(s *segment) error {
	_, err := f.deleteSegment(s)
	return err
}

// deleteSegment is deleteLater for a segment that may stay in the list
// if it cannot be deleted. Callers hold Log.mu.
//
// The index files are renamed first and the data file last, so that a
// failed rename leaves the segment its data file: deleteSegment then
// returns the error with gone false, and the segment may stay in the log
// (an index file it lost is rebuilt when missing, and rewritten whole by
// its next flush). Once the data file is renamed, the segment is gone
// (gone is true, its files are queued for removal) and the caller must
// take it out of the list; a failure after that fails the log.
func (f *flusher) deleteSegment(s *segment) (gone bool, err error) {
	l := f.l
	// Under flushMu, so that a roll flush never writes the index files
	// of a segment being renamed, and only a segment that is gone is
	// dropped from the pending flushes.
	f.flushMu.Lock()
	err = f.renameDeleted(s)
	if err == nil {
		s.deleted.Store(true)
		f.forget(s)
	}
	f.flushMu.Unlock()
	if err != nil {
		return false, err
	}
	l.stats.deleted.Add(1)
	f.mu.Lock()
	f.deletions = append(f.deletions, deletion{seg: s, at: l.now().Add(l.opts.FileDeleteDelay)})
	f.mu.Unlock()
	f.wake()
	if err := l.deleteSnapshot(s.base); err != nil {
		return true, l.fail(err)
	}
	return true, nil
}

// renameDeleted renames s's index files, then its data file, to
// *.deleted. Callers hold flushMu and Log.mu.
func (f *flusher) renameDeleted(s *segment) error {
	l := f.l
	f.tagDeleted(s)
	for _, suffix := range []string{indexSuffix, timeIndexSuffix, logSuffix} {
		p := s.path(suffix)
		var err error
		if suffix == logSuffix {
			err = l.renameSegmentFile(s.file, p, s.deletedPath(suffix))
		} else {
			err = l.opts.FS.Rename(p, s.deletedPath(suffix))
		}
		if err != nil && !os.IsNotExist(err) {
			if suffix != indexSuffix {
				// The index files renamed so far are gone from the
				// segment, which stays: its indexes' next flush must
				// write their files whole, not only what is new.
				rewriteWhole(s.offIdx.index)
				if suffix == logSuffix {
					rewriteWhole(s.timeIdx.index)
				}
				l.dirDirty.Store(true)
			}
			return err
		}
	}
	l.dirDirty.Store(true)
	return nil
}

// tagDeleted gives s's deleted files names no other deleted segment's
// files have: "<base>.log.deleted", or, when a segment of the same base
// offset (truncated, then rolled again) is still waiting for its
// FileDeleteDelay, "<base>.log.<n>.deleted". Renaming onto the waiting
// one's names would replace its files, which readers of its regions (and
// a Manager's file cache, reopening them by name) still use, and its
// removal would then take the newer files early. Callers hold flushMu
// and Log.mu, which every deletion holds.
func (f *flusher) tagDeleted(s *segment) {
	if s.deletedTag != "" {
		return // a retry keeps the names of the files already renamed
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deleting == nil {
		f.deleting = map[int64]int{}
	}
	if f.deleting[s.base] > 0 {
		f.deletedSeq++
		s.deletedTag = "." + strconv.FormatUint(f.deletedSeq, 10)
	}
	f.deleting[s.base]++
}

// rewriteWhole makes the next flush of x write its file from the start.
func rewriteWhole(x *index) {
	x.mu.Lock()
	x.dirty = true
	x.mu.Unlock()
}

// renameSegmentFile renames a segment's data file f from from to to.
func (l *Log) renameSegmentFile(f vfs.File, from, to string) error {
	if cf, ok := f.(*cachedFile); ok {
		// A Manager's file may be closed and reopened by name behind the
		// segment: the cache renames it.
		return cf.renameFile(l.opts.FS, to)
	}
	return l.opts.FS.Rename(from, to)
}

func (f *flusher) nextDeletion() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.deletions) == 0 {
		return time.Time{}, false
	}
	return f.deletions[0].at, true
}

// deleteDue closes and removes the files of deletions that are due.
func (f *flusher) deleteDue(now time.Time) {
	f.mu.Lock()
	var due []deletion
	for len(f.deletions) > 0 && !f.deletions[0].at.After(now) {
		due = append(due, f.deletions[0])
		f.deletions = f.deletions[1:]
	}
	f.mu.Unlock()
	for _, d := range due {
		f.removeFiles(d.seg)
	}
}

// deleteAllPending removes every deleted segment's files now (Close).
func (f *flusher) deleteAllPending() {
	f.mu.Lock()
	due := f.deletions
	f.deletions = nil
	f.mu.Unlock()
	for _, d := range due {
		f.removeFiles(d.seg)
	}
}

func (f *flusher) removeFiles(s *segment) {
	s.syncMu.Lock() // not while a Sync that found s before its deletion fsyncs it
	_ = s.close()
	s.syncMu.Unlock()
	for _, suffix := range []string{logSuffix, indexSuffix, timeIndexSuffix} {
		if err := f.l.opts.FS.Remove(s.deletedPath(suffix)); err != nil && !os.IsNotExist(err) {
			f.l.opts.Logger.Warn("replog/log: removing deleted segment file", "err", err)
		}
	}
	f.mu.Lock()
	if f.deleting[s.base]--; f.deleting[s.base] <= 0 {
		delete(f.deleting, s.base)
	}
	f.mu.Unlock()
}
