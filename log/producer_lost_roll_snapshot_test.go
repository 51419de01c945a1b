package log

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// crashBeforeRollFlush writes producer 9's batch and a marker raising
// it to epoch 1 (no cached batch left), then producer 1's batches until
// the log has rolled, with every roll flush held back (so no roll
// snapshot is written), syncs, and reopens on what a power loss leaves:
// every batch, no snapshot. Recovery replays all segments, so the
// reopened log has producer 9 fenced at epoch 1.
func crashBeforeRollFlush(t *testing.T) (*vfs.MemFS, *Log) {
	mem := idemMem()
	group := NewFlushGroup(1)
	release := group.acquire(false) // roll flushes wait
	l := idemOpen(t, mem, Options{SegmentBytes: 256, IndexIntervalBytes: 64, FlushGroup: group})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000)) // 0..2
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))     // 3
	for i := int32(0); len(l.segments()) < 3; i += 3 {
		idemAppend(t, l, idemBatch(t, 1, 0, i, 3, 1000))
	}
	require.NoError(t, l.Sync())
	img := mem.CrashClone(vfs.CrashOptions{}) // the process dies before the roll flush
	require.Empty(t, idemSnapshotFiles(t, img))
	release()
	require.NoError(t, l.Close())

	l2 := idemOpen(t, img, Options{SegmentBytes: 256, IndexIntervalBytes: 64})
	_, err := l2.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "after recovery: epoch 0 fenced")
	return img, l2
}

// The snapshot at a segment's base is the only record, once the segments
// below are deleted, of what they held (an epoch a marker raised). A
// crash before the roll flush loses it, and recovery writes none; a
// deletion then writes it before the segments go (keepSnapshotAt), so
// that a later rebuild (TruncateTo, or Open after a crash), which
// replays only the segments left, keeps producer 9 fenced at epoch 1.
func TestMarkerFenceSurvivesDeletionAfterACrashLostTheRollSnapshot(t *testing.T) {
	t.Run("TruncateTo", func(t *testing.T) {
		_, l := crashBeforeRollFlush(t)
		segs := idemSegmentBases(l)
		require.NoError(t, l.DeleteRecordsBefore(segs[len(segs)-1]))
		_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
		require.ErrorIs(t, err, ErrProducerFenced, "live: epoch 0 fenced")
		require.NoError(t, l.TruncateTo(l.LogEndOffset()-1))
		_, err = l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
		require.ErrorIs(t, err, ErrProducerFenced, "after TruncateTo: epoch 0 must stay fenced")
	})
	t.Run("crash", func(t *testing.T) {
		img, l := crashBeforeRollFlush(t)
		segs := idemSegmentBases(l)
		require.NoError(t, l.DeleteRecordsBefore(segs[len(segs)-1]))
		before := idemState(l)
		// The process is killed: what it wrote survives.
		l3 := idemOpen(t, img.CrashClone(vfs.CrashOptions{Kill: true}), Options{})
		require.Equal(t, before, idemState(l3), "recovery must rebuild the state the log had")
		_, err := l3.Append(idemBatch(t, 9, 0, 3, 1, 1000))
		require.ErrorIs(t, err, ErrProducerFenced, "after a second crash: epoch 0 must stay fenced")
	})
}

// The same without a marker: a producer's last timestamp is the largest
// of its batches' (producerEntry.add), and the largest lies in the
// deleted segment. The live log keeps producer 7 (idle 20 minutes by
// that timestamp) and answers its retry as a duplicate; so must the log
// after a TruncateTo, which rebuilds the state from the snapshot the
// deletion wrote rather than from the segment left (idle 70 minutes by
// its batch there: expired, and the retry stored again).
func TestProducerLastTimestampSurvivesDeletionAfterACrashLostTheRollSnapshot(t *testing.T) {
	clock := &idemClock{now: time.UnixMilli(100_000_000)}
	t0 := clock.Now().UnixMilli()
	opts := Options{SegmentBytes: 256, IndexIntervalBytes: 64, Now: clock.Now,
		ProducerIDExpiration: time.Hour, ProducerExpiryCheckInterval: 1000 * time.Hour}
	mem := idemMem()
	group := NewFlushGroup(1)
	release := group.acquire(false) // roll flushes wait
	o := opts
	o.FlushGroup = group
	l := idemOpen(t, mem, o)
	idemAppend(t, l, idemBatch(t, 7, 0, 0, 1, t0)) // offset 0: the newest timestamp
	for i := int32(0); len(l.segments()) < 2; i += 3 {
		idemAppend(t, l, idemBatch(t, 1, 0, i, 3, t0))
	}
	// Producer 7's clock went back 50 minutes.
	retry := idemBatch(t, 7, 0, 1, 1, t0-50*time.Minute.Milliseconds())
	orig := idemAppend(t, l, retry)
	require.NoError(t, l.Sync())
	img := mem.CrashClone(vfs.CrashOptions{}) // the process dies before the roll flush
	release()
	require.NoError(t, l.Close())

	l2 := idemOpen(t, img, opts)
	require.Equal(t, t0, idemState(l2)[7].LastTimestamp, "recovery replayed every segment")
	segs := idemSegmentBases(l2)
	require.NoError(t, l2.DeleteRecordsBefore(segs[len(segs)-1]))
	idemAppend(t, l2, idemBatch(t, 2, 0, 0, 1, t0)) // so that TruncateTo has something to cut
	clock.Advance(20 * time.Minute)
	l2.expireProducers()
	require.Contains(t, idemState(l2), int64(7), "live: producer 7 is idle 20 minutes")

	require.NoError(t, l2.TruncateTo(l2.LogEndOffset()-1))
	info, err := l2.Append(append([]byte(nil), retry...))
	require.NoError(t, err)
	require.True(t, info.Duplicate, "after TruncateTo: the retry was stored again at %d (original at %d)", info.FirstOffset, orig.FirstOffset)
}
