package log

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// leaderEpochFile is Kafka's leader-epoch-checkpoint: one "<epoch>
// <startOffset>" line per epoch, in the checkpoint text format.
const leaderEpochFile = "leader-epoch-checkpoint"

// EpochEntry says that leader epoch Epoch wrote the log from StartOffset
// on (until the next entry's StartOffset).
type EpochEntry struct {
	// Epoch is the leader epoch.
	Epoch int32
	// StartOffset is the first offset written in Epoch.
	StartOffset int64
}

// epochCache is the log's leader-epoch cache, kept consistent with the
// log by appends (new epochs), truncation and log-start moves, and
// persisted atomically before the data it describes is written.
type epochCache struct {
	mu      sync.RWMutex
	entries []EpochEntry // epochs and start offsets strictly increase
}

func (c *epochCache) snapshot() []EpochEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return append([]EpochEntry(nil), c.entries...)
}

func (c *epochCache) latest() (EpochEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if len(c.entries) == 0 {
		return EpochEntry{}, false
	}
	return c.entries[len(c.entries)-1], true
}

// LeaderEpochs returns the leader-epoch cache: which epoch wrote which
// offsets. The caller owns the returned slice.
func (l *Log) LeaderEpochs() []EpochEntry { return l.epochs.snapshot() }

// EpochAt returns the leader epoch that wrote offset: that of the newest
// cached epoch starting at or below it, or NoLeaderEpoch if none does.
// Unlike LeaderEpochs it copies nothing, for callers that ask per fetch.
func (l *Log) EpochAt(offset int64) int32 {
	c := &l.epochs
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := len(c.entries) - 1; i >= 0; i-- {
		if c.entries[i].StartOffset <= offset {
			return c.entries[i].Epoch
		}
	}
	return NoLeaderEpoch
}

// LatestEpoch returns the newest leader epoch in the log, or NoLeaderEpoch.
func (l *Log) LatestEpoch() int32 {
	if e, ok := l.epochs.latest(); ok {
		return e.Epoch
	}
	return NoLeaderEpoch
}

// EndOffsetForEpoch answers a follower's "where does my epoch end on your
// log" (KIP-101/KIP-279). For NoLeaderEpoch, or an epoch above every
// cached one, it returns (NoLeaderEpoch, -1), as Kafka does. Otherwise,
// for the largest cached epoch <= epoch it returns that epoch and the
// start offset of the next higher cached epoch, or the log end offset
// when it is the latest; for an epoch below the first cached one, epoch
// and the first epoch's start offset.
func (l *Log) EndOffsetForEpoch(epoch int32) (int32, int64) {
	if epoch == NoLeaderEpoch {
		return NoLeaderEpoch, -1
	}
	c := &l.epochs
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := len(c.entries)
	if n > 0 && c.entries[n-1].Epoch == epoch {
		return epoch, l.leo.Load()
	}
	hi := sort.Search(n, func(i int) bool { return c.entries[i].Epoch > epoch })
	if hi == n {
		return NoLeaderEpoch, -1
	}
	if hi == 0 {
		return epoch, c.entries[0].StartOffset
	}
	return c.entries[hi-1].Epoch, c.entries[hi].StartOffset
}

// epochChanges reports whether assignEpoch(epoch, offset) would change
// the cache: epoch is newer than the latest epoch, or the latest epoch
// starts at or after offset. No epoch (negative) changes nothing.
func (l *Log) epochChanges(epoch int32, offset int64) bool {
	if epoch < 0 {
		return false
	}
	last, ok := l.epochs.latest()
	// An older epoch changes the cache only when the latest entry holds no
	// batch (it starts at the log end: an epoch begun without appends),
	// even if the batch comes after a gap.
	return !ok || !(epoch < last.Epoch && last.StartOffset < min(offset, l.leo.Load()) ||
		epoch == last.Epoch && last.StartOffset <= offset)
}

// assignEpoch records that epoch starts at offset, if epochChanges, and
// persists the cache before the caller writes data. Callers hold l.mu.
func (l *Log) assignEpoch(epoch int32, offset int64) error {
	if !l.epochChanges(epoch, offset) {
		return nil
	}
	c := &l.epochs
	c.mu.Lock()
	// An epoch cannot start below an older epoch's start: those entries
	// were truncated away. Entries at or after offset hold no data yet: a
	// newer epoch begun by BeginLeaderEpoch on a node that lost the
	// leadership before appending, whose follower appends then bring
	// older epochs' batches (as Kafka's LeaderEpochFileCache.assign
	// removes non-monotonic entries).
	for n := len(c.entries); n > 0 && (c.entries[n-1].StartOffset >= offset ||
		c.entries[n-1].StartOffset >= l.leo.Load() && c.entries[n-1].Epoch >= epoch); n = len(c.entries) {
		c.entries = c.entries[:n-1]
	}
	if n := len(c.entries); n == 0 || c.entries[n-1].Epoch < epoch {
		c.entries = append(c.entries, EpochEntry{Epoch: epoch, StartOffset: offset})
	}
	c.mu.Unlock()
	return l.persistEpochs()
}

// truncateEpochsFromEnd drops epochs starting at or after end.
func (l *Log) truncateEpochsFromEnd(end int64) error {
	c := &l.epochs
	c.mu.Lock()
	n := len(c.entries)
	for len(c.entries) > 0 && c.entries[len(c.entries)-1].StartOffset >= end {
		c.entries = c.entries[:len(c.entries)-1]
	}
	changed := n != len(c.entries)
	c.mu.Unlock()
	if !changed {
		return nil
	}
	return l.persistEpochs()
}

// truncateEpochsFromStart moves the epochs below start to start, keeping
// the latest of them.
func (l *Log) truncateEpochsFromStart(start int64) error {
	c := &l.epochs
	c.mu.Lock()
	i := sort.Search(len(c.entries), func(i int) bool { return c.entries[i].StartOffset > start })
	changed := false
	if i > 0 {
		keep := c.entries[i-1]
		changed = i > 1 || keep.StartOffset != start
		keep.StartOffset = start
		c.entries = append([]EpochEntry{keep}, c.entries[i:]...)
	}
	c.mu.Unlock()
	if !changed {
		return nil
	}
	return l.persistEpochs()
}

func (l *Log) clearEpochs() error {
	l.epochs.mu.Lock()
	l.epochs.entries = nil
	l.epochs.mu.Unlock()
	return l.persistEpochs()
}

func (l *Log) persistEpochs() error {
	entries := l.epochs.snapshot()
	rows := make([][]int64, len(entries))
	for i, e := range entries {
		rows[i] = []int64{int64(e.Epoch), e.StartOffset}
	}
	if err := writeCheckpoint(l.opts.FS, l.path(leaderEpochFile), rows); err != nil {
		return err
	}
	l.epochsUnsaved.Store(false)
	return nil
}

// loadEpochs reads the checkpoint and drops entries past the log end
// (written before data a crash then lost).
func (l *Log) loadEpochs(start, end int64) error {
	rows, _, err := readCheckpoint(l.opts.FS, l.path(leaderEpochFile), 2)
	if err != nil {
		return err
	}
	var entries []EpochEntry
	for _, r := range rows {
		e := EpochEntry{Epoch: int32(r[0]), StartOffset: r[1]}
		if r[0] < 0 || r[0] > 1<<31-1 || r[1] < 0 ||
			(len(entries) > 0 && (e.Epoch <= entries[len(entries)-1].Epoch || e.StartOffset < entries[len(entries)-1].StartOffset)) {
			return fmt.Errorf("%w: %s: epochs and offsets must increase", ErrCorrupt, leaderEpochFile)
		}
		entries = append(entries, e)
	}
	l.epochs.entries = entries
	if err := l.truncateEpochsFromEnd(end); err != nil {
		return err
	}
	return l.truncateEpochsFromStart(start)
}

// assignBatchEpochs records the leader epochs that batches start, before
// they are written. If that changed the cache, it returns the entries as
// they were, for restoreEpochs should the write fail (nil otherwise: the
// common append changes nothing and copies nothing). Callers hold l.mu.
func (l *Log) assignBatchEpochs(batches []byte) (before []EpochEntry, err error) {
	for rest := batches; len(rest) > 0; {
		b, r, _ := SplitBatch(rest)
		if l.epochChanges(b.LeaderEpoch(), b.BaseOffset()) {
			if before == nil {
				before = append(make([]EpochEntry, 0, 1), l.epochs.snapshot()...)
			}
			if err := l.assignEpoch(b.LeaderEpoch(), b.BaseOffset()); err != nil {
				return nil, l.fail(err)
			}
		}
		rest = r
	}
	return before, nil
}

// restoreEpochs puts back the entries assignBatchEpochs changed, after the
// append failed without failing the log, in memory and in the checkpoint
// file: left there, the failed append's entry would come back at the next
// Open once later appends at an older epoch took the log end past its
// start (as a follower's do), an epoch that wrote nothing claiming their
// offsets. If the file cannot be rewritten now (the disk full, no
// descriptor left), epochsUnsaved makes the next append, or full
// truncation, rewrite it first; until then the entry stays at or past the
// log end, where Open drops it. A failed directory fsync fails the log.
// Callers hold l.mu.
func (l *Log) restoreEpochs(before []EpochEntry) {
	if before == nil {
		return
	}
	l.epochs.mu.Lock()
	l.epochs.entries = before
	l.epochs.mu.Unlock()
	if err := l.saveEpochsOrMarkUnsaved(); err != nil {
		l.opts.Logger.Warn("replog/log: rewriting the leader epochs after a failed append; the next append retries", "dir", l.dir, "err", err)
	}
}

// saveUnsavedEpochs rewrites the leader-epoch checkpoint file if
// restoreEpochs could not, before a call moves the log end past where
// the failed append's entry may lie in it. Callers hold l.mu.
func (l *Log) saveUnsavedEpochs() error {
	if !l.epochsUnsaved.Load() {
		return nil
	}
	return l.saveEpochsOrMarkUnsaved()
}

// saveEpochsOrMarkUnsaved writes the leader-epoch checkpoint file; if
// that fails it sets epochsUnsaved, and fails the log if the failure was
// the directory fsync's. Callers hold l.mu.
func (l *Log) saveEpochsOrMarkUnsaved() error {
	err := l.persistEpochs()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errDirSync):
		return l.fail(err)
	}
	l.epochsUnsaved.Store(true)
	return err
}

// BeginLeaderEpoch records that epoch starts at the log end offset, as a
// new leader does before its first append so that EndOffsetForEpoch can
// answer followers at once. Epochs not newer than the latest are ignored,
// unless the latest starts at the log end (it has no batch yet), and so
// is NoLeaderEpoch; a lower epoch fails with ErrInvalidRecord.
func (l *Log) BeginLeaderEpoch(epoch int32) error {
	if epoch < NoLeaderEpoch {
		return fmt.Errorf("%w: leader epoch %d", ErrInvalidRecord, epoch)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.failure(); err != nil {
		return err
	}
	if err := l.assignEpoch(epoch, l.leo.Load()); err != nil {
		return l.fail(err)
	}
	return nil
}
