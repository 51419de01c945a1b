package log

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestMarkerOfOlderEpochFenced: a leader refuses a transaction
// marker of a producer epoch older than the producer's current one
// (ErrProducerFenced), and writes nothing.
func TestMarkerOfOlderEpochFenced(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	idemAppend(t, l, idemBatch(t, 9, 2, 0, 1, 1000))
	leo := l.LogEndOffset()
	_, err := l.Append(markerBatch(t, 9, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced)
	require.Equal(t, leo, l.LogEndOffset(), "a fenced marker changes nothing")
	// The producer's epoch is unchanged: its next batch still follows.
	idemAppend(t, l, idemBatch(t, 9, 2, 1, 1, 1000))
}

// markerFencedThenDeleted writes producer 9's batches and a marker that
// raises it to epoch 1 (leaving it no cached batch), then producer 1's
// batches, and deletes the records below 7 while every roll flush waits:
// the pending flush of the last segment deleted was to write the
// snapshot holding epoch 1. It returns the log and the release of the
// flushes.
func markerFencedThenDeleted(t *testing.T, mem *vfs.MemFS) (*Log, func()) {
	group := NewFlushGroup(1)
	release := group.acquire(false) // roll flushes wait
	l := idemOpen(t, mem, Options{SegmentBytes: 256, IndexIntervalBytes: 64, FlushGroup: group})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000)) // 0..2
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))     // 3
	idemAppend(t, l, idemBatch(t, 1, 0, 0, 3, 1000)) // 4..6
	idemAppend(t, l, idemBatch(t, 1, 0, 3, 3, 1000)) // 7..9
	idemAppend(t, l, idemBatch(t, 1, 0, 6, 3, 1000)) // 10..12
	require.NoError(t, l.DeleteRecordsBefore(7))
	_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "live: epoch 0 fenced")
	return l, release
}

// TestMarkerFenceSurvivesDeletionBeforeTheRollFlush: deleting segments
// whose roll flushes were still pending dropped the snapshot at the
// first segment left, the only record of an epoch raised by a marker in
// a deleted segment: after a crash, or a follower's TruncateTo, which
// rebuild the state from snapshots and the segments left, the producer
// was gone and its fenced epoch could write again. The deletion now
// writes that snapshot first.
func TestMarkerFenceSurvivesDeletionBeforeTheRollFlush(t *testing.T) {
	t.Run("crash", func(t *testing.T) {
		mem := idemMem()
		l, release := markerFencedThenDeleted(t, mem)
		require.NoError(t, l.Sync())
		before := idemState(l)
		img := mem.CrashClone(vfs.CrashOptions{})
		release()
		l2, err := Open(idemDir, Options{FS: img, ProducerIDExpiration: neverExpire})
		require.NoError(t, err)
		defer l2.Close()
		require.Equal(t, before, idemState(l2), "recovery rebuilds the state the log had")
		_, err = l2.Append(idemBatch(t, 9, 0, 3, 1, 1000))
		require.ErrorIs(t, err, ErrProducerFenced, "after a crash: epoch 0 stays fenced")
	})
	t.Run("TruncateTo", func(t *testing.T) {
		l, release := markerFencedThenDeleted(t, idemMem())
		defer release()
		require.NoError(t, l.TruncateTo(10))
		_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
		require.ErrorIs(t, err, ErrProducerFenced, "after TruncateTo: epoch 0 stays fenced")
	})
}

// TestMarkerFenceSurvivesEmptyActiveReplacement: the producer snapshot
// at the base of an empty active segment can be the only durable record
// of an epoch that a transaction marker in a deleted segment raised. A
// follower append that leaps past what that empty segment can index
// replaces it, deleting its snapshot: the state was written nowhere else,
// and after a crash the fenced epoch 0 could write again. (Compare
// TestMarkerFenceSurvivesDeletionBeforeTheRollFlush, the same loss
// through retention.)
func TestMarkerFenceSurvivesEmptyActiveReplacement(t *testing.T) {
	mem := idemMem()
	l := idemOpen(t, mem, Options{SegmentBytes: 256, IndexIntervalBytes: 64, CheckpointInterval: -1})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000)) // producer 9, epoch 0
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))     // marker: epoch 1
	for i := int32(0); len(l.segments()) < 3; i += 3 {
		idemAppend(t, l, idemBatch(t, 1, 0, i, 3, 1000))
	}
	act := l.active().base
	require.NoError(t, l.Sync())
	waitRecoveryPoint(t, l) // the roll flush wrote the snapshot at act
	// Empty the active segment, then delete everything below it.
	require.NoError(t, l.TruncateTo(act))
	require.NoError(t, l.DeleteRecordsBefore(act))
	_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "live: epoch 0 fenced")

	// Control: a crash here keeps the fence (the snapshot at act).
	{
		l2, err := Open(idemDir, Options{FS: mem.CrashClone(vfs.CrashOptions{}), ProducerIDExpiration: neverExpire})
		require.NoError(t, err)
		_, err = l2.Append(idemBatch(t, 9, 0, 3, 1, 1000))
		require.ErrorIs(t, err, ErrProducerFenced, "control: after a crash before the leap, epoch 0 stays fenced")
		require.NoError(t, l2.Close())
	}

	// A follower's batch far past the empty segment's range replaces it.
	fb := followerBatch(t, act+1<<31+5, 1, -1)
	_, err = l.AppendAsFollower(fb)
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	_, err = l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "live, after the leap: epoch 0 fenced")

	img := mem.CrashClone(vfs.CrashOptions{})
	l3, err := Open(idemDir, Options{FS: img, ProducerIDExpiration: neverExpire})
	require.NoError(t, err)
	defer l3.Close()
	_, err = l3.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "after a crash: epoch 0 stays fenced")
}
