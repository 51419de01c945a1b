package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A node that began epoch 5 at its log end (BeginLeaderEpoch) without
// appending then, as a follower, appends an epoch-3 batch after a gap
// (which AppendAsFollower allows, as in compacted topics): the cache says
// epoch 3 wrote that batch, dropping the entry of epoch 5, which holds
// nothing (as Kafka's LeaderEpochFileCache.assign drops non-monotonic
// entries).
func TestBegunEpochThenAnOlderEpochAfterAGap(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 2, 1)) // 0-1, epoch 1
	require.NoError(t, err)
	require.NoError(t, l.BeginLeaderEpoch(5))              // (5, 2), no batch
	_, err = l.AppendAsFollower(followerBatch(t, 4, 2, 3)) // 4-5, epoch 3, gap 2-3
	require.NoError(t, err)
	require.Equal(t, int32(3), l.EpochAt(5), "epoch of the last batch")
	require.Equal(t, []EpochEntry{{1, 0}, {3, 4}}, l.LeaderEpochs())
}

// One follower append whose batches start two epochs after a gap keeps
// both entries, and the begun epoch's when it is the first batch's.
func TestMultiEpochFollowerAppendAfterAGap(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 2, 1))
	require.NoError(t, err)
	require.NoError(t, l.BeginLeaderEpoch(5))
	_, err = l.AppendAsFollower(concat(followerBatch(t, 4, 2, 5), followerBatch(t, 6, 2, 6)))
	require.NoError(t, err)
	require.Equal(t, []EpochEntry{{1, 0}, {5, 2}, {6, 6}}, l.LeaderEpochs())
	_, err = l.AppendAsFollower(concat(followerBatch(t, 8, 2, 7), followerBatch(t, 10, 2, 8)))
	require.NoError(t, err)
	require.Equal(t, []EpochEntry{{1, 0}, {5, 2}, {6, 6}, {7, 8}, {8, 10}}, l.LeaderEpochs())
}
