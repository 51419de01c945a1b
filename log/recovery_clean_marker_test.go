package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCleanMarkerOffsetIndexAtMarker: a clean-shutdown marker is
// not trusted when the offset index has an entry at the marker's offset
// (a batch whose last offset is the marker's log end lies past it).
// Here the marker says one less than the true log end: trusting it would
// hand out an offset of the last batch again.
func TestCleanMarkerOffsetIndexAtMarker(t *testing.T) {
	fs, opts := memLog()
	opts.IndexIntervalBytes = 1 // every batch after the first is indexed
	l := openLog(t, "/log", opts)
	// Decreasing timestamps: the time index's last entry stays at the
	// first batch, so only the offset index contradicts the marker.
	for i, ts := range []int64{5000, 4000, 3000} {
		info, err := l.Append(buildBatch(t, 1, 16, ts))
		require.NoError(t, err)
		require.Equal(t, int64(i), info.FirstOffset)
	}
	leo := l.LogEndOffset()
	require.NoError(t, l.Close())
	rel, _, ok := l.active().offIdx.lookupEntry(1 << 30)
	require.True(t, ok)
	require.Equal(t, leo-1, int64(rel), "the last batch is indexed")

	writeFileFS(t, fs, "/log/"+cleanShutdownFile, EncodeCheckpoint([][]int64{{leo - 1}}))
	l = openLog(t, "/log", opts)
	require.Equal(t, leo, l.LogEndOffset(), "a marker contradicted by the offset index must not be trusted")
	require.Len(t, readAllBatches(t, l), 3)
	info, err := l.Append(buildBatch(t, 1, 16, 6000))
	require.NoError(t, err)
	require.Equal(t, leo, info.FirstOffset)
}
