package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSnapshotWriteTimeCountsEverySnapshot: SnapshotWriteTime counted
// only the snapshots of roll flushes, while SnapshotsWritten also counted
// Close's (and a deletion's): Stats showed a snapshot written in no time.
func TestSnapshotWriteTimeCountsEverySnapshot(t *testing.T) {
	l, err := Open(t.TempDir(), Options{}) // the real filesystem: the write takes time
	require.NoError(t, err)
	_, err = l.Append(buildBatch(t, 2, 100, 1000))
	require.NoError(t, err)
	require.NoError(t, l.Close())
	st := l.Stats()
	require.Equal(t, int64(1), st.SnapshotsWritten, "the Close snapshot")
	require.Positive(t, st.SnapshotWriteTime)
}
