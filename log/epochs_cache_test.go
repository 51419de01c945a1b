package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEndOffsetForUnknownMiddleEpoch: for an epoch the cache does
// not hold, between two it does, EndOffsetForEpoch answers with the
// largest cached epoch below it and the start of the next one (KIP-279).
func TestEndOffsetForUnknownMiddleEpoch(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 2, 1))
	require.NoError(t, err)
	_, err = l.AppendAsFollower(followerBatch(t, 2, 2, 3))
	require.NoError(t, err)
	require.Equal(t, []EpochEntry{{1, 0}, {3, 2}}, l.LeaderEpochs())
	e, end := l.EndOffsetForEpoch(2)
	require.Equal(t, int32(1), e, "largest cached epoch <= 2")
	require.Equal(t, int64(2), end)
}

// TestBegunEpochReplacedByFollowerData: an epoch begun at the log
// end (BeginLeaderEpoch) that wrote nothing is replaced when follower
// data of an older epoch arrives at that offset.
func TestBegunEpochReplacedByFollowerData(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 2, 1))
	require.NoError(t, err)
	require.NoError(t, l.BeginLeaderEpoch(5))
	require.Equal(t, []EpochEntry{{1, 0}, {5, 2}}, l.LeaderEpochs())
	_, err = l.AppendAsFollower(followerBatch(t, 2, 2, 3))
	require.NoError(t, err)
	require.Equal(t, []EpochEntry{{1, 0}, {3, 2}}, l.LeaderEpochs())
	require.Equal(t, int32(3), l.EpochAt(2))
}
