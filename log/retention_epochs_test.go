package log

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// epochStepLog appends 100 leader batches of 3 records (about 30 per
// segment), the epoch going up by one every 20 batches (epoch e starts at
// offset 60*(e-1)), and syncs.
func epochStepLog(t *testing.T, opts Options) *Log {
	t.Helper()
	l := openLog(t, "/log", opts)
	for i := 0; i < 100; i++ {
		_, err := l.AppendAsLeader(buildBatch(t, 3, 60, int64(i)*10), int32(1+i/20))
		require.NoError(t, err)
	}
	require.NoError(t, l.Sync())
	require.Greater(t, len(l.segments()), 3)
	return l
}

// requireEpochsMatchBatches checks that the leader-epoch cache agrees
// with the log it describes: every readable batch's leader epoch is the
// one EpochAt gives for its offsets, and EndOffsetForEpoch of an epoch
// that is followed by a newer one in the log answers where that newer
// one's batches start (KIP-101: what a follower truncates to).
func requireEpochsMatchBatches(t *testing.T, l *Log, msg string) {
	t.Helper()
	st, err := readLeaping(l)
	require.NoError(t, err, msg)
	require.NotEmpty(t, st.batches, msg)
	for i, raw := range st.batches {
		b := Batch(raw)
		off := max(b.BaseOffset(), l.LogStartOffset())
		require.Equal(t, b.LeaderEpoch(), l.EpochAt(off),
			"%s: EpochAt(%d) disagrees with the batch there (log start %d, epochs %v)", msg, off, l.LogStartOffset(), l.LeaderEpochs())
		if i+1 < len(st.batches) {
			if next := Batch(st.batches[i+1]); next.LeaderEpoch() > b.LeaderEpoch() {
				e, end := l.EndOffsetForEpoch(b.LeaderEpoch())
				require.Equal(t, [2]int64{int64(b.LeaderEpoch()), next.BaseOffset()}, [2]int64{int64(e), end},
					"%s: EndOffsetForEpoch(%d) (epochs %v)", msg, b.LeaderEpoch(), l.LeaderEpochs())
			}
		}
	}
}

// TestRetentionPowerLossKeepsEpochsConsistent: ApplyRetention raised the
// log start in memory only (it wrote no log-start-offset checkpoint) and
// rewrote the leader-epoch checkpoint from that start durably, before it
// renamed the old segments to *.deleted, renames nothing fsynced then. A
// power loss right after the call kept the old segments, so the log
// started at 0 again with its epoch-1..3 batches readable, but the epoch
// cache had lost their entries: EpochAt(0) was NoLeaderEpoch and
// EndOffsetForEpoch(2) answered 180 instead of 120 (where epoch 3
// starts), so a follower holding divergent epoch-2 records in [120, 180)
// would have kept them (KIP-101, RELIABILITY.md S10/S11). The log start
// is now checkpointed first, as DeleteRecordsBefore does.
func TestRetentionPowerLossKeepsEpochsConsistent(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	opts := testLogOptions(mem)
	l := epochStepLog(t, opts)
	requireEpochsMatchBatches(t, l, "before retention")

	l.opts.RetentionBytes = l.active().size.Load() + 1 // keep the newest two segments
	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	requireEpochsMatchBatches(t, l, "after retention")

	img := mem.CrashClone(vfs.CrashOptions{}) // a power loss now
	require.NoError(t, l.Close())
	o := opts
	o.FS = img
	l = openLog(t, "/log", o)
	requireEpochsMatchBatches(t, l, "after a power loss following ApplyRetention")
}

// TestRetentionFailedRenameKeepsEpochsConsistent: ApplyRetention's first
// rename to *.deleted fails (EIO), so no segment is deleted and the log
// is not failed. It had raised the log start first, in memory only, and
// persisted the leader epochs truncated from that start: Close+Open then
// showed records the live log hid, and the epoch cache no longer covered
// them. The raised log start is now durable: a reopen keeps it.
func TestRetentionFailedRenameKeepsEpochsConsistent(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	f := &switchFault{match: renameToDeleted, n: 0, err: syscall.EIO}
	opts := testLogOptions(vfs.NewErrorFS(mem, f))
	l := epochStepLog(t, opts)
	bases := segmentBases(l)

	l.opts.RetentionBytes = l.active().size.Load() + 1 // keep the newest two segments
	f.armed.Store(true)
	n, err := l.ApplyRetention()
	f.armed.Store(false)
	require.Equal(t, int64(1), f.hits.Load())
	require.Error(t, err)
	require.Zero(t, n)
	require.False(t, l.Stats().Failed, "no segment went: the error is not sticky")
	require.Equal(t, bases, segmentBases(l), "no segment went")

	liveStart := l.LogStartOffset()
	requireEpochsMatchBatches(t, l, "after the failed retention")
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, liveStart, l.LogStartOffset(), "log start after Close+Open differs from the live one")
	requireEpochsMatchBatches(t, l, "after the failed retention and Close+Open")

	// The next retention removes the segments left below the log start,
	// even with no limit that would.
	l.opts.RetentionBytes = 0
	n, err = l.ApplyRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	require.Equal(t, liveStart, segmentBases(l)[0], "segments below the log start are gone")
}
