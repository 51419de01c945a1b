package log

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a Log's counters and sizes.
type Stats struct {
	// Segments is the number of segments.
	Segments int
	// Bytes is the sum of the segments' sizes.
	Bytes int64
	// LogStartOffset, LogEndOffset, HighWatermark, RecoveryPoint and
	// DurableOffset are the Log's methods' values.
	LogStartOffset int64
	LogEndOffset   int64 // see LogStartOffset
	HighWatermark  int64 // see LogStartOffset
	RecoveryPoint  int64 // see LogStartOffset
	DurableOffset  int64 // see LogStartOffset

	// Appends counts the appends that wrote batches, AppendedBytes their
	// bytes and Records their records.
	Appends       int64
	AppendedBytes int64 // see Appends
	Records       int64 // see Appends
	// Rolls counts segment rolls.
	Rolls int64
	// Syncs counts Sync calls that led a group commit (ran the fsyncs of
	// what was not yet durable, if anything was).
	Syncs int64
	// Fsyncs counts fsyncs of segment data (by Sync, the SyncEvery
	// options and roll flushes) and of the directory (a truncation's
	// included); those of index, snapshot and checkpoint files and of a
	// truncated segment's data are not counted.
	Fsyncs int64
	// BackgroundFlushes counts roll flushes, and BackgroundFlushTime the
	// time they took: those of the background flusher, and the few run
	// inline (by Close, and by a follower append that leaves a gap).
	BackgroundFlushes   int64
	BackgroundFlushTime time.Duration // see BackgroundFlushes
	// RecoveredSegments and TruncatedBytes describe the last Open: the
	// segments recovery scanned and the bytes it cut.
	RecoveredSegments int
	TruncatedBytes    int64 // see RecoveredSegments
	// DeletedSegments counts the segments deleted (retention,
	// DeleteRecordsBefore, truncation).
	DeletedSegments int64
	// Producers is the number of idempotent producer ids tracked;
	// Snapshots the number of producer-state snapshot files; and
	// SnapshotsWritten and SnapshotWriteTime count the snapshots written
	// (in the background at roll, and at Close) and the time that took.
	Producers         int
	Snapshots         int           // see Producers
	SnapshotsWritten  int64         // see Producers
	SnapshotWriteTime time.Duration // see Producers
	// Failed is true once the log refuses writes until reopened: after a
	// failed fsync or another failed write to durable state (see
	// ErrSyncFailed).
	Failed bool
}

type statCounters struct {
	appends, appendedBytes, records atomic.Int64
	rolls, syncs, fsyncs            atomic.Int64
	bgFlushes, bgFlushNanos         atomic.Int64
	deleted                         atomic.Int64
	snapshotsWritten, snapshotNanos atomic.Int64
	recoveredSegments               int
	truncatedBytes                  int64
}

func (c *statCounters) appended(info AppendInfo) {
	c.appends.Add(1)
	c.appendedBytes.Add(int64(info.Bytes))
	c.records.Add(int64(info.Records))
}

// Stats returns a snapshot of the log's counters. Safe for concurrent use.
func (l *Log) Stats() Stats {
	segs := l.segments()
	var bytes int64
	for _, s := range segs {
		bytes += s.size.Load()
	}
	c := &l.stats
	l.mu.Lock()
	producers := l.producers.count()
	l.mu.Unlock()
	return Stats{
		Producers:           producers,
		Snapshots:           len(l.snapshots.list()),
		SnapshotsWritten:    c.snapshotsWritten.Load(),
		SnapshotWriteTime:   time.Duration(c.snapshotNanos.Load()),
		Segments:            len(segs),
		Bytes:               bytes,
		LogStartOffset:      l.LogStartOffset(),
		LogEndOffset:        l.LogEndOffset(),
		HighWatermark:       l.HighWatermark(),
		RecoveryPoint:       l.RecoveryPoint(),
		DurableOffset:       l.DurableOffset(),
		Appends:             c.appends.Load(),
		AppendedBytes:       c.appendedBytes.Load(),
		Records:             c.records.Load(),
		Rolls:               c.rolls.Load(),
		Syncs:               c.syncs.Load(),
		Fsyncs:              c.fsyncs.Load(),
		BackgroundFlushes:   c.bgFlushes.Load(),
		BackgroundFlushTime: time.Duration(c.bgFlushNanos.Load()),
		RecoveredSegments:   c.recoveredSegments,
		TruncatedBytes:      c.truncatedBytes,
		DeletedSegments:     c.deleted.Load(),
		Failed:              l.failed.Load() != nil,
	}
}
