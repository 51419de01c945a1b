package log

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestNegativeLeaderEpochIsRefused: BeginLeaderEpoch and AppendAsLeader
// accepted a leader epoch below NoLeaderEpoch (-1) and, in an empty epoch
// cache, recorded and persisted it (assignEpoch only skipped
// NoLeaderEpoch). loadEpochs rejects a negative epoch as corrupt, so the
// next Open failed with ErrCorrupt: bad input made the log unopenable.
func TestNegativeLeaderEpochIsRefused(t *testing.T) {
	requireNoGoroutineLeak(t)
	for _, tc := range []struct {
		name string
		call func(l *Log) error
	}{
		{"BeginLeaderEpoch", func(l *Log) error { return l.BeginLeaderEpoch(-2) }},
		{"AppendAsLeader", func(l *Log) error {
			_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 0), -7)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			err := tc.call(l)
			if err == nil {
				// Accepted: then it must survive a reopen.
				require.NoError(t, l.Close())
				l2, err := Open("/log", opts)
				require.NoError(t, err, "the log cannot be opened again after %s with a negative epoch", tc.name)
				require.NoError(t, l2.Close())
				return
			}
			// Refused: with a typed error, and nothing changed.
			require.ErrorIs(t, err, ErrInvalidRecord)
			require.Empty(t, l.LeaderEpochs())
		})
	}
}

// TestFailedAppendLeavesNoEpoch: a leader append at a new epoch whose
// write failed (ENOSPC, not sticky) left the epoch it had recorded
// (assignBatchEpochs runs before maybeRoll and writeToActive), though a
// rejected append changes nothing: LatestEpoch and EndOffsetForEpoch
// reported an epoch that wrote no record, and a Close+Open (loadEpochs
// drops entries at the log end) gave other epochs than before it.
func TestFailedAppendLeavesNoEpoch(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 0)
	opts := testLogOptions(efs)
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1)
	require.NoError(t, err)
	before := l.LeaderEpochs()

	armed.Store(true)
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 5)
	require.Error(t, err)
	require.False(t, l.Stats().Failed, "a failed write is not sticky")
	require.Equal(t, int64(2), l.LogEndOffset(), "nothing appended")
	require.Equal(t, before, l.LeaderEpochs(), "a failed append recorded a leader epoch")
	require.Equal(t, int32(1), l.LatestEpoch())

	live := l.LeaderEpochs()
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, live, l.LeaderEpochs(), "leader epochs after Close+Open")
}

// TestStaleLeaderEpochIsRefused: AppendAsLeader at an epoch older than
// the log's latest wrote batches stamped with it that the epoch cache did
// not show (EpochAt answered the newer epoch for them), and a follower
// copying them was refused. It is now refused, changing nothing.
func TestStaleLeaderEpochIsRefused(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 1000), 3)
	require.NoError(t, err)
	leo := l.LogEndOffset()
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 1000), 2)
	require.ErrorIs(t, err, ErrInvalidRecord)
	require.Equal(t, leo, l.LogEndOffset(), "nothing appended")
	require.Equal(t, []EpochEntry{{Epoch: 3, StartOffset: 0}}, l.LeaderEpochs())
	_, err = l.Append(buildBatch(t, 2, 10, 1000)) // NoLeaderEpoch: a log used without epochs
	require.NoError(t, err)
}

// TestFailedAppendEpochStaysGoneAfterLaterAppends: a leader append at a
// new epoch writes the epoch's entry to the checkpoint file before its
// data; when the write failed (ENOSPC, which does not fail the log), the
// entry was taken out of memory but stayed in the file, where Open would
// drop it only while it was at the log end. Once a later append at the
// older epoch moved the log end past it (which changes no entry, so the
// file was not rewritten), the next Open loaded an epoch that wrote no
// record.
func TestFailedAppendEpochStaysGoneAfterLaterAppends(t *testing.T) {
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 0)
	opts := testLogOptions(efs)
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1)
	require.NoError(t, err)

	armed.Store(true)
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 5)
	require.Error(t, err)
	require.False(t, l.Stats().Failed)

	// The same leader (epoch 1) appends again: accepted, offsets 2..3.
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1)
	require.NoError(t, err)
	live := l.LeaderEpochs()
	require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: 0}}, live)
	require.Equal(t, int32(1), l.EpochAt(3))

	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, live, l.LeaderEpochs(), "leader epochs after Close+Open: an epoch that wrote no record came back")
	e, end := l.EndOffsetForEpoch(1)
	require.Equal(t, int32(1), e)
	require.Equal(t, l.LogEndOffset(), end, "EndOffsetForEpoch(1) after reopen")
}

// TestFailedFollowerAppendEpochStaysGone is the follower's case: a
// fetched batch of epoch 5 fails to append (ENOSPC), the follower then
// copies another leader's batches of epoch 1 at the same offsets (KIP-101
// divergence), and a restart brought back epoch 5 at an offset that holds
// epoch-1 batches.
func TestFailedFollowerAppendEpochStaysGone(t *testing.T) {
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 0)
	opts := testLogOptions(efs)
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 2, 1))
	require.NoError(t, err)
	armed.Store(true)
	_, err = l.AppendAsFollower(followerBatch(t, 2, 2, 5))
	require.Error(t, err)
	require.False(t, l.Stats().Failed)
	_, err = l.AppendAsFollower(followerBatch(t, 2, 3, 1))
	require.NoError(t, err)
	require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: 0}}, l.LeaderEpochs())

	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, int32(1), l.EpochAt(3), "EpochAt(3) after reopen: offset 3 was written in epoch 1")
}
