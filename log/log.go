package log

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replog/replog/internal/vfs"
)

// Log is a segmented, append-only log of record batches in one directory.
//
// A Log is safe for concurrent use: Append calls serialize internally,
// Read and Sync may run concurrently with them and with each other, and
// readers do not wait for appenders. Every goroutine the Log starts (its
// background flusher) stops in Close.
type Log struct {
	dir     string
	dirLock io.Closer // held until Close (lockDir); for a Manager's log, a no-op
	opts    Options
	seg     segConfig

	// mu serializes appends, rolls, truncation and retention: everything
	// that changes segments or offsets.
	mu sync.Mutex
	// readMu is held shared by readers while they read segment files, and
	// exclusively by truncation and segment deletion, so that a reader
	// never sees bytes being truncated under it.
	readMu sync.RWMutex

	segs       atomic.Pointer[[]*segment] // immutable slice, replaced on change
	leo        atomic.Int64               // log end offset: next offset to assign
	logStart   atomic.Int64
	hw         atomic.Int64
	recoveryPt atomic.Int64 // offsets below it are durable; see rpLazy
	// hwMu is held by whoever stores hw and by whoever lowers leo or
	// raises logStart, so that SetHighWatermark clamps to bounds that
	// still hold when it stores (a leaf lock: nothing is taken under it).
	hwMu sync.Mutex

	unsyncedMsgs int // records since the last sync (appender-only, under mu)
	// rollMovedDurable says the current append's roll moved the log start
	// or the recovery point durably to its base (under mu).
	rollMovedDurable bool
	dirDirty         atomic.Bool
	// dirSyncMu is held across taking dirDirty and the directory fsync, so
	// that a caller finding the flag clear knows no fsync is in flight.
	dirSyncMu sync.Mutex

	producers *producerState // guarded by mu
	snapshots snapshotFiles
	epochs    epochCache

	sync    syncState
	waiters waitList
	bg      *flusher
	stats   statCounters
	rng     *rand.Rand // segment jitter, under mu

	truncations truncationMarks // where truncations cut the log, so Readers notice them
	keepAboveHW atomic.Bool     // RetainAboveHighWatermark was called
	// epochsUnsaved is set while the leader-epoch checkpoint file may hold
	// an entry a failed append left (see restoreEpochs).
	epochsUnsaved atomic.Bool

	closed    atomic.Bool
	closing   chan struct{}         // closed when the first Close begins
	closeDone chan struct{}         // closed when the first Close has finished
	failed    atomic.Pointer[error] // sticky fsync failure
}

// Open opens the log in dir, creating the directory if needed, and
// recovers it if it was not closed cleanly (see the package
// documentation). It locks dir until Close: while another Log, in this
// process or another, has it open, Open fails with ErrLocked.
func Open(dir string, opts Options) (*Log, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	// The directory's own entry is durable only once its parent is synced;
	// without this a power loss can take a new log, synced data and all.
	// Done on every Open, not only at creation, in case an earlier Open
	// created the directory and failed before syncing its parent (unless
	// a Manager synced the parent for all its logs).
	if o.dirSynced {
		// A Manager's log directory exists (OpenManager listed it):
		// failing here changed no file of the log.
		if err = o.FS.MkdirAll(dir, 0o755); err != nil {
			err = unchangedOpen{err}
		}
	} else {
		err = mkdirDurable(o.FS, dir)
	}
	if err != nil {
		return nil, err
	}
	// A Manager's logs are covered by its lock on the data directory.
	var dirLock io.Closer = noDirLock{}
	if o.files == nil {
		if dirLock, err = lockDir(o.FS, dir); err != nil {
			return nil, err
		}
	}
	l := &Log{
		dir:     dir,
		dirLock: dirLock,
		opts:    o,
		seg:     segConfig{fs: o.FS, dir: dir, interval: o.IndexIntervalBytes, files: o.files},
		rng:     rand.New(rand.NewPCG(uint64(o.Now().UnixNano()), 0x5eed)),

		closing:   make(chan struct{}),
		closeDone: make(chan struct{}),
	}
	l.sync.init()
	l.producers = newProducerState()
	if err := l.load(); err != nil {
		l.closeFiles()
		_ = dirLock.Close()
		return nil, fmt.Errorf("replog/log: open %s: %w", dir, err)
	}
	startFlusher(l) // sets l.bg
	if err := l.endAtLastBatch(); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("replog/log: open %s: %w", dir, err)
	}
	return l, nil
}

// endAtLastBatch removes an empty last segment that a follower's gap
// separates from the segment before it, as a roll to it leaves when the
// append that rolled is lost (a crash before its data was written or
// synced, a failed write): the log then ends where its last batch does,
// as after TruncateTo, instead of claiming the gap, in which readers
// would find nothing below the log end. If that batch lies below the log
// start (DeleteRecordsBefore moved it into the gap), the log restarts
// empty at its start instead: recovery never moves the start down.
func (l *Log) endAtLastBatch() error {
	segs := l.segments()
	act := segs[len(segs)-1]
	start := l.logStart.Load()
	if len(segs) < 2 || act.size.Load() > 0 || act.base <= start {
		return nil
	}
	prevEnd, err := segs[len(segs)-2].dataEnd(l.opts.MaxBatchBytes)
	if err != nil || prevEnd >= act.base {
		return err
	}
	l.opts.Logger.Info("replog/log: removing an empty last segment after a gap", "dir", l.dir, "segment", act.base, "logEnd", max(prevEnd, start))
	if prevEnd < start {
		return l.TruncateFullyAndStartAt(start)
	}
	return l.TruncateTo(act.base - 1)
}

// Dir is the log's directory.
func (l *Log) Dir() string { return l.dir }

// LogEndOffset is the offset the next appended record will get.
func (l *Log) LogEndOffset() int64 { return l.leo.Load() }

// LogStartOffset is the first offset that can be read. It is usually a
// batch's base offset, but may lie below the first batch, in a gap a
// follower's append left (as Kafka's does): after ApplyRetention it is
// the base offset of the oldest segment kept, and a segment may begin
// before its first batch. A read from it returns that first batch.
func (l *Log) LogStartOffset() int64 { return l.logStart.Load() }

// HighWatermark is the offset set by SetHighWatermark, never above the
// log end offset. Reads with ReadOptions.UpToHighWatermark stop below it.
func (l *Log) HighWatermark() int64 { return min(l.hw.Load(), l.leo.Load()) }

// SetHighWatermark sets the high watermark, clamped to [LogStartOffset,
// LogEndOffset], and wakes readers waiting on it. Replication calls it on
// the leader as followers catch up; a standalone log may set it after
// each Sync to expose only durable data.
func (l *Log) SetHighWatermark(hw int64) {
	l.hwMu.Lock()
	l.hw.Store(max(min(hw, l.leo.Load()), l.logStart.Load()))
	l.hwMu.Unlock()
	l.waiters.wake()
}

// RetainAboveHighWatermark makes retention and DeleteRecordsBefore keep
// every record at or above the high watermark from now on, as Kafka does:
// retention deletes only segments that end at or below it, and
// DeleteRecordsBefore refuses an offset above it. A replicated leader must
// not delete records its followers have not fetched (an acknowledgement
// would then count records no follower holds); replication.Node calls it
// on every log it is given. It cannot be undone.
func (l *Log) RetainAboveHighWatermark() { l.keepAboveHW.Store(true) }

// deletionLimit is the highest log start that retention and
// DeleteRecordsBefore may set: the high watermark after
// RetainAboveHighWatermark, else the log end.
func (l *Log) deletionLimit() int64 {
	if l.keepAboveHW.Load() {
		return l.HighWatermark()
	}
	return l.leo.Load()
}

// RecoveryPoint is the offset below which everything is fsynced and need
// not be scanned after a crash.
func (l *Log) RecoveryPoint() int64 { return l.recoveryPt.Load() }

// segments returns the current immutable segment list.
func (l *Log) segments() []*segment { return *l.segs.Load() }

func (l *Log) setSegments(s []*segment) { l.segs.Store(&s) }

func (l *Log) active() *segment {
	s := l.segments()
	return s[len(s)-1]
}

// mkdirDurable creates dir and its missing parents, and makes their
// entries durable: it fsyncs dir's parent, and the parent of every
// ancestor it had to create (deepest first), since a directory's entry is
// durable only once its parent is synced.
func mkdirDurable(fsys vfs.FS, dir string) error {
	var created []string // missing ancestors of dir, deepest first
	for p := filepath.Dir(dir); filepath.Dir(p) != p; p = filepath.Dir(p) {
		if _, err := fsys.Stat(p); !os.IsNotExist(err) {
			break
		}
		created = append(created, p)
	}
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range append([]string{dir}, created...) {
		if err := fsys.SyncDir(filepath.Dir(p)); err != nil {
			return err
		}
	}
	return nil
}

// failure returns the sticky fsync error, or ErrClosed, or nil.
func (l *Log) failure() error {
	if l.closed.Load() {
		return ErrClosed
	}
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records a failed fsync; every later append and sync returns it.
func (l *Log) fail(err error) error {
	wrapped := fmt.Errorf("%w: %w", ErrSyncFailed, err)
	if l.failed.CompareAndSwap(nil, &wrapped) {
		l.opts.Logger.Error("replog/log: fsync failed; the log refuses writes until reopened", "dir", l.dir, "err", err)
	}
	return *l.failed.Load()
}

// Close flushes everything, writes the checkpoints and the clean-shutdown
// marker, stops the background flusher and closes all files. After a
// failed fsync, or one it could not run because a Manager's file cache
// could not reopen a segment file (Close then returns that error), Close
// still releases everything but writes no marker, so the next Open
// recovers. Close is idempotent: a later or concurrent call
// returns nil once the first has finished.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed.Swap(true) {
		l.mu.Unlock()
		<-l.closeDone
		return nil
	}
	l.mu.Unlock()
	defer close(l.closeDone)
	// Waiters first: they return ErrClosed at once, not after the
	// flusher stopped (it may be waiting for a FlushGroup turn).
	close(l.closing)
	l.waiters.wake()
	l.sync.closeWaiters()
	l.bg.stop()
	l.bg.dropSpare()

	l.mu.Lock()
	defer l.mu.Unlock()
	// readMu first: a reader holding it shared may be rebuilding a
	// segment's missing indexes, which cleanShutdown flushes and the
	// clean-shutdown marker then vouches for.
	l.readMu.Lock()
	err := l.failedErr()
	if err == nil {
		err = l.cleanShutdown()
	}
	l.bg.deleteAllPending()
	if cerr := l.closeFiles(); err == nil {
		err = cerr
	}
	l.readMu.Unlock()
	if cerr := l.dirLock.Close(); err == nil {
		err = cerr
	}
	return err
}

// Closing returns a channel that is closed once Close has begun, for
// code that waits on the log by its own means (as a Replicator's acks=all
// Produce waits for the high watermark) and must stop waiting when the
// log closes. WaitForData needs no such help: it returns ErrClosed.
func (l *Log) Closing() <-chan struct{} { return l.closing }

// failUnlessReopen fails the log with err, unless err is a reopenError:
// an open for want of descriptors that wrote nothing, which a retry may
// get past.
func (l *Log) failUnlessReopen(err error) error {
	if isReopenError(err) {
		return err
	}
	return l.fail(err)
}

func (l *Log) failedErr() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// cleanShutdown makes everything durable and leaves the marker that lets
// the next Open skip recovery.
func (l *Log) cleanShutdown() error {
	if err := l.bg.flushRolled(); err != nil {
		return err
	}
	act := l.active()
	l.releasePreallocated(act, 0)
	if err := l.syncData(); isReopenError(err) {
		return err // no marker: the next Open recovers
	} else if err != nil {
		return l.fail(err)
	}
	l.markDurable(l.leo.Load()) // for DurableOffset and Stats after Close
	if ts := act.maxTS.Load(); ts != NoTimestamp {
		// The final entry, as at a roll; an empty segment gets none (an
		// entry at its base would be past the log end, and make the next
		// Open distrust the clean-shutdown marker).
		act.timeIdx.maybeAppend(ts, act.relOfMaxTS)
	}
	for _, s := range l.segments() {
		if err := s.flushIndexes(true); err != nil {
			return l.failUnlessReopen(err) // no marker: the next Open recovers
		}
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		return l.fail(err)
	}
	leo := l.leo.Load()
	if err := l.writeSnapshot(leo, encodeSnapshot(nil, l.producers)); err != nil {
		return l.failUnlessReopen(err)
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		return l.fail(err)
	}
	if err := l.storeRecoveryPoint(leo, false); err != nil {
		return err
	}
	if st := l.opts.recoveryPoints; st != nil {
		// The Manager writes both for all its logs when it closes.
		st.storeClean(l.dir, leo, l.HighWatermark())
		return nil
	}
	if err := writeOffsetCheckpoint(l.opts.FS, l.path(highWatermarkFile), l.HighWatermark()); err != nil {
		return l.fail(err)
	}
	if err := writeOffsetCheckpoint(l.opts.FS, l.path(cleanShutdownFile), leo); err != nil {
		return l.fail(err)
	}
	return nil
}

func (l *Log) closeFiles() error {
	var first error
	if p := l.segs.Load(); p != nil {
		for _, s := range *p {
			if err := s.close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

func (l *Log) path(name string) string { return l.dir + string(os.PathSeparator) + name }

// writeRecoveryPoint persists rp durably before returning and publishes
// it; callers that rely on it for correctness (gaps, truncation) use it.
// It holds the flusher's flushMu, so that a lazy checkpoint write (which
// writes the published value) cannot land after it with an older value.
func (l *Log) writeRecoveryPoint(rp int64) error {
	l.bg.flushMu.Lock()
	defer l.bg.flushMu.Unlock()
	return l.writeRecoveryPointLocked(rp)
}

// writeRecoveryPointAtLeast makes sure the checkpoint file holds at least
// min: it writes the published recovery point, raised to min, unless the
// file already holds that much (a roll flush may have published one it
// left for later).
func (l *Log) writeRecoveryPointAtLeast(min int64) error {
	l.bg.flushMu.Lock()
	defer l.bg.flushMu.Unlock()
	rp := l.recoveryPt.Load()
	if st := l.opts.recoveryPoints; st != nil {
		// A Manager writes lazy stores later: only what its file holds
		// counts.
		if st.fileHoldsAtLeast(l.dir, min) {
			return nil
		}
	} else if rp >= min && !l.bg.rpLazy.behind {
		return nil
	}
	return l.writeRecoveryPointLocked(max(rp, min))
}

// recoveryPointMayExceed reports whether recovery after a crash now may
// start above off: the published recovery point is, or a Manager's
// checkpoint file may still hold one that is (recovery lowers the
// published one without writing it at once).
func (l *Log) recoveryPointMayExceed(off int64) bool {
	if l.recoveryPt.Load() > off {
		return true
	}
	st := l.opts.recoveryPoints
	return st != nil && st.fileMayExceed(l.dir, off)
}

func (l *Log) writeRecoveryPointLocked(rp int64) error {
	err := l.storeRecoveryPoint(rp, true)
	if err == nil {
		l.bg.rpLazy.written, l.bg.rpLazy.behind = l.now(), false
	}
	return err
}

// storeRecoveryPoint persists and publishes rp. Without urgent a
// Manager may batch it into its checkpoint later: an older recovery
// point only makes recovery scan more.
func (l *Log) storeRecoveryPoint(rp int64, urgent bool) error {
	if err := l.persistRecoveryPoint(rp, urgent); err != nil {
		return l.fail(err)
	}
	l.recoveryPt.Store(rp)
	return nil
}

func (l *Log) persistRecoveryPoint(rp int64, urgent bool) error {
	if st := l.opts.recoveryPoints; st != nil {
		return st.store(l.dir, rp, urgent)
	}
	return writeOffsetCheckpoint(l.opts.FS, l.path(recoveryPointFile), rp)
}

func (l *Log) loadRecoveryPoint() (int64, bool, error) {
	if st := l.opts.recoveryPoints; st != nil {
		rp, ok, lost := st.load(l.dir)
		if lost {
			return 0, false, fmt.Errorf("%w: the Manager's recovery-point checkpoint is unreadable", ErrCorrupt)
		}
		return rp, ok, nil
	}
	return readOffsetCheckpoint(l.opts.FS, l.path(recoveryPointFile))
}

// now returns the log's clock.
func (l *Log) now() time.Time { return l.opts.Now() }
