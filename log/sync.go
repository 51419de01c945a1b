package log

import (
	"sync"

	"github.com/replog/replog/internal/vfs"
)

// syncState implements group commit: one caller at a time runs the
// fsyncs, covering everything appended before it started; callers that
// arrive meanwhile wait for it and are done if it covered them, else the
// next of them syncs for all.
type syncState struct {
	mu      sync.Mutex
	cond    *sync.Cond
	running bool
	durable int64 // every offset below it is fsynced
	closed  bool
}

func (s *syncState) init() { s.cond = sync.NewCond(&s.mu) }

func (s *syncState) closeWaiters() {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// DurableOffset is the offset below which every record is known to be
// fsynced by Sync, a roll flush or an earlier Close.
func (l *Log) DurableOffset() int64 {
	l.sync.mu.Lock()
	defer l.sync.mu.Unlock()
	return l.sync.durable
}

// Sync returns once every record appended before the call is durable: the
// segment files holding it are fsynced and so are the directory entries
// of segments created since the last sync. Concurrent callers share
// fsyncs (group commit). A failed fsync is sticky: this and every later
// Sync and Append return an error wrapping ErrSyncFailed until the Log is
// reopened. A segment file that a Manager's file cache cannot reopen for
// its fsync (EMFILE, say) makes Sync return that error without failing
// the log: no fsync ran, and a later Sync tries again. Like os.File.Sync
// it takes no context: it waits only for
// fsyncs, its own or the one in progress that it shares, which the disk
// bounds and which cannot be stopped halfway; a caller that must give up
// earlier can wait for it in a goroutine.
func (l *Log) Sync() error {
	if err := l.failure(); err != nil {
		return err
	}
	target := l.leo.Load()
	s := &l.sync
	s.mu.Lock()
	for {
		if err := l.failure(); err != nil {
			s.mu.Unlock()
			return err
		}
		if s.durable >= target {
			s.mu.Unlock()
			return nil
		}
		if !s.running {
			break
		}
		s.cond.Wait()
	}
	s.running = true
	s.mu.Unlock()

	// A truncation (and re-append) while the fsyncs run would make end
	// stale: then the durable offset is left for the next Sync to raise.
	gen := l.truncations.gen.Load()
	end := l.leo.Load()
	err := l.syncData()
	switch {
	case isReopenError(err):
		// A segment file could not be reopened for its fsync: nothing
		// was synced, nor lost; a later Sync tries again.
	case err != nil:
		err = l.fail(err)
	default:
		// Another fsync may have failed meanwhile (the flusher's): the
		// log's durability can no longer be vouched for.
		err = l.failedErr()
	}

	s.mu.Lock()
	s.running = false
	if err == nil && end > s.durable && l.truncations.gen.Load() == gen {
		s.durable = end
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	l.stats.syncs.Add(1)
	return err
}

// syncData fsyncs every segment holding bytes not yet known durable, and
// the directory if segments were created or deleted since its last fsync.
func (l *Log) syncData() error {
	for _, seg := range l.segments() {
		if err := l.syncSegment(seg); err != nil {
			return err
		}
	}
	return l.syncDirIfDirty()
}

// syncSegment fsyncs s's data unless it is known durable. Sync and the
// flusher may both fsync a rolled segment; they take turns on s.syncMu,
// and the second one sees the first one's failure: when two fsyncs of a
// file overlap, Linux reports a write-back error to only one of them, and
// the other would report durable data that is lost.
func (l *Log) syncSegment(s *segment) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if err := l.failedErr(); err != nil {
		return err
	}
	size := s.size.Load()
	if s.durable.Load() >= size || s.deleted.Load() {
		return nil // durable, or no longer in the log (its file may be closed)
	}
	if err := vfs.Datasync(s.file); err != nil {
		if isReopenError(err) {
			return err // no fsync ran (see reopenError)
		}
		return l.fail(err)
	}
	l.stats.fsyncs.Add(1)
	s.durable.Store(size)
	return nil
}

// syncCutSegment fsyncs s after its file was truncated to size, and
// sets its size and durable size. Like syncSegment it takes its turn on
// s.syncMu and fails the log before the turn ends, so that a Sync of s
// that follows sees the failure rather than a write-back error reported
// to this fsync only; and it sets the sizes within its turn, or a Sync
// taking the next turn could read the size from before the cut and,
// storing it as durable after the cut, skip the fsync of the bytes
// appended up to that size again.
func (l *Log) syncCutSegment(s *segment, size int64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.tail.forget() // the file is cut, whether or not the fsync succeeds
	if err := s.file.Sync(); err != nil {
		return l.fail(err)
	}
	s.size.Store(size)
	s.durable.Store(size)
	return nil
}

// syncDirIfDirty fsyncs the log directory if an entry changed. A failure
// fails the log before the lock is released, so that a Sync waiting for
// the lock does not retry the fsync (whose success would then prove
// nothing) and report the directory durable.
func (l *Log) syncDirIfDirty() error {
	// Without the lock, a Sync finding the flag taken by the flusher would
	// return before the flusher's fsync completed, or after it failed.
	l.dirSyncMu.Lock()
	defer l.dirSyncMu.Unlock()
	if err := l.failedErr(); err != nil {
		return err
	}
	if !l.dirDirty.Swap(false) {
		return nil
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		l.dirDirty.Store(true)
		return l.fail(err)
	}
	l.stats.fsyncs.Add(1)
	return nil
}

// markDurable records that everything below off is durable (after a roll
// flush or recovery).
func (l *Log) markDurable(off int64) {
	l.sync.mu.Lock()
	if off > l.sync.durable {
		l.sync.durable = off
	}
	l.sync.mu.Unlock()
}
