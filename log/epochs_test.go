package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// EpochAt answers from the cache without copying it: the epoch of the
// newest entry starting at or below the offset, an epoch begun without
// appends included, and NoLeaderEpoch below the first entry.
func TestEpochAt(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	require.Equal(t, NoLeaderEpoch, l.EpochAt(0), "empty cache")
	_, err := l.AppendAsLeader(buildBatch(t, 3, 10, 0), 1) // offsets 0-2
	require.NoError(t, err)
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 3) // offsets 3-4
	require.NoError(t, err)
	require.NoError(t, l.BeginLeaderEpoch(5)) // starts at 5, no batch yet
	want := map[int64]int32{-1: NoLeaderEpoch, 0: 1, 2: 1, 3: 3, 4: 3, 5: 5, 100: 5}
	for off, epoch := range want {
		require.Equal(t, epoch, l.EpochAt(off), "offset %d", off)
	}
	for off := int64(-1); off < 8; off++ { // agrees with the copied cache
		e := NoLeaderEpoch
		for _, x := range l.LeaderEpochs() {
			if x.StartOffset <= off {
				e = x.Epoch
			}
		}
		require.Equal(t, e, l.EpochAt(off), "offset %d", off)
	}
}
