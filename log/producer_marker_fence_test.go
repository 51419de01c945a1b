package log

import (
	"strings"
	"sync/atomic"
	"syscall"
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

// carriedSnapshotScenario: a follower's leap to B past an empty active
// segment writes the producer snapshot at B and then, with failCreate,
// fails to create B's segment file (ENOSPC): the append fails, the log
// does not. The follower then leaps to B' < B instead (another leader's
// log), producer 7 writes its batches in [B', B), and a batch without
// producer takes the log end past B with no roll in [B, end]. Producer 7
// must survive a crash, or with truncate a TruncateTo past B, which
// rebuild the producer state from the newest snapshot at or below the
// end: the snapshot the failed leap left at B held none of it.
func carriedSnapshotScenario(t *testing.T, failCreate, truncate bool) {
	mem := idemMem()
	act := int64(0)
	var armed atomic.Bool
	var target string
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpOpen && target != "" && strings.HasSuffix(op.Path, target) && armed.CompareAndSwap(true, false) {
			return vfs.Fault{Err: syscall.ENOSPC}
		}
		return vfs.Fault{}
	}))
	l := idemOpen(t, efs, Options{SegmentBytes: 4096, IndexIntervalBytes: 64, CheckpointInterval: -1})
	// Producer 9 gives the log a producer state; then an empty active
	// segment.
	for i := int32(0); len(l.segments()) < 3; i += 3 {
		idemAppend(t, l, idemBatch(t, 9, 0, i, 3, 1000))
	}
	act = l.active().base
	require.NoError(t, l.Sync())
	waitRecoveryPoint(t, l)
	require.NoError(t, l.TruncateTo(act))
	require.Equal(t, int64(0), l.active().size.Load())

	B := act + 1<<31 + 100
	if failCreate {
		target = segmentName(B) + logSuffix
		armed.Store(true)
		_, err := l.AppendAsFollower(followerBatch(t, B, 1, -1))
		require.Error(t, err, "the leap's segment file could not be created")
		require.False(t, l.Stats().Failed, "a failed create does not fail the log")
		t.Logf("after the failed leap: leo %d, snapshots %v", l.LogEndOffset(), l.snapshots.list())
	}

	// The follower leaps to B' = B-50 instead, then producer 7 writes
	// B'..B'+4, and a batch without producer takes the end past B.
	Bp := B - 50
	for i := int32(0); i < 5; i++ {
		b := idemBatch(t, 7, 0, i, 1, 2000+int64(i))
		Batch(b).setBaseOffset(Bp + int64(i))
		_, err := l.AppendAsFollower(b)
		require.NoError(t, err)
	}
	var err error
	for _, fb := range [][2]int64{{Bp + 5, 45}, {B, 5}, {B + 5, 10}} { // B-45 .. B+14
		_, err = l.AppendAsFollower(followerBatch(t, fb[0], int(fb[1]), -1))
		require.NoError(t, err)
	}
	require.Greater(t, l.LogEndOffset(), B)
	require.NoError(t, l.Sync())
	live := idemState(l)
	require.Contains(t, live, int64(7))
	t.Logf("live: leo %d, segments %v, snapshots %v", l.LogEndOffset(), idemSegmentBases(l), l.snapshots.list())

	if truncate {
		require.NoError(t, l.TruncateTo(B+7))
		require.Equal(t, live[7], idemState(l)[7], "producer 7 after TruncateTo(%d), live (snapshots %v)", B+7, l.snapshots.list())
		return
	}
	img := mem.CrashClone(vfs.CrashOptions{})
	l2, err := Open(idemDir, Options{FS: img, ProducerIDExpiration: neverExpire})
	require.NoError(t, err)
	defer l2.Close()
	got := idemState(l2)
	require.Equal(t, live[7], got[7], "producer 7 after a crash (snapshots on disk %v)", l2.snapshots.list())
	// Producer 7 retries its last batch: a duplicate.
	info, err := l2.Append(idemBatch(t, 7, 0, 4, 1, 2004))
	require.NoError(t, err)
	require.True(t, info.Duplicate, "the retry of producer 7's last batch was written again at %d", info.FirstOffset)
}

// TestFailedLeapLeavesNoProducerSnapshot runs carriedSnapshotScenario,
// with and without the failed leap, across a crash and a TruncateTo.
func TestFailedLeapLeavesNoProducerSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		failCreate, truncate bool
	}{{"crash", true, false}, {"truncate", true, true}, {"control-crash", false, false}, {"control-truncate", false, true}} {
		t.Run(tc.name, func(t *testing.T) { carriedSnapshotScenario(t, tc.failCreate, tc.truncate) })
	}
}
