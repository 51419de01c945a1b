package log

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerTruncateBelowTheFilesRecoveryPoint: after an unclean
// OpenManager, recovery lowers a log's recovery point to its active
// segment's base in memory only (the Manager writes it at its next timed
// checkpoint), while the checkpoint file still holds the higher one of
// the last clean close. A TruncateTo below the file's recovery point must
// lower it on disk before it cuts, although the in-memory one is low
// enough.
func TestManagerTruncateBelowTheFilesRecoveryPoint(t *testing.T) {
	requireNoGoroutineLeak(t)
	mo, img1, _ := killedAfterCleanClose(t)

	// Manager C recovers.
	m, err := OpenManager(mgrCrashDir, mo(img1))
	require.NoError(t, err)
	defer m.Close()
	x, _ := m.Get("x")
	rps, _, err := readNamed(img1, managerCheckpointFile)
	require.NoError(t, err)
	require.Greater(t, rps["x"], int64(20), "the scenario needs the file's recovery point above the cut")

	// A follower truncation below the on-disk recovery point...
	require.NoError(t, x.TruncateTo(20))
	rps, _, err = readNamed(img1, managerCheckpointFile)
	require.NoError(t, err)
	require.LessOrEqual(t, rps["x"], int64(20), "TruncateTo left a recovery point above the new log end on disk")
}

// TestManagerTruncateBelowTheFilesRecoveryPointCrash continues the
// scenario above to appends, rolls and a power loss: recovery must scan
// the cut segment.
func TestManagerTruncateBelowTheFilesRecoveryPointCrash(t *testing.T) {
	requireNoGoroutineLeak(t)
	mo, img1, old := killedAfterCleanClose(t)
	group := mo(img1).Log.FlushGroup
	m, err := OpenManager(mgrCrashDir, mo(img1))
	require.NoError(t, err)
	x, _ := m.Get("x")
	require.NoError(t, x.TruncateTo(20))
	// New data after the cut: big one-record batches, so the segment rolls
	// (twice) at offsets below 80. The roll flushes wait for the group's
	// turn, held here; nothing is synced.
	release := group.acquire(false)
	want := [][]byte{old[0]}
	for k := 0; k < 8; k++ {
		b := buildBatch(t, 1, 1000, int64(5000+k))
		_, err := x.Append(b)
		require.NoError(t, err)
		want = append(want, b)
	}
	t.Logf("before the power loss: log end %d, segments %d, in-memory recovery point %d", x.LogEndOffset(), x.Stats().Segments, x.RecoveryPoint())
	img2 := img1.CrashClone(vfs.CrashOptions{KeepDirOps: 1}) // unsynced data lost, entries kept
	release()
	require.NoError(t, m.Close())

	m, err = OpenManager(mgrCrashDir, mo(img2))
	require.NoError(t, err)
	defer m.Close()
	x, _ = m.Get("x")
	st, err := tryReadState(x)
	require.NoError(t, err, "recovery skipped the cut segment")
	require.Equal(t, int64(0), x.LogStartOffset())
	require.GreaterOrEqual(t, x.LogEndOffset(), int64(20), "the batch made durable by the clean close is kept")
	require.NotEmpty(t, st.batches)
	for i, b := range st.batches {
		require.Equal(t, want[i], b, "batch %d", i)
	}
}

// killedAfterCleanClose sets up the scenario of the tests above: Manager
// A writes 4 batches of 20 records (log "x", one segment) and closes
// cleanly, so the checkpoint holds recovery point 80; Manager B opens it
// and its process is killed. It returns the options (sharing one flush
// group), the image B left and the batches.
func killedAfterCleanClose(t *testing.T) (mo func(vfs.FS) ManagerOptions, img *vfs.MemFS, old [][]byte) {
	t.Helper()
	group := NewFlushGroup(1)
	mo = func(fs vfs.FS) ManagerOptions {
		return ManagerOptions{
			Log:                Options{FS: fs, SegmentBytes: 4096, IndexIntervalBytes: 256, FlushGroup: group},
			CheckpointInterval: time.Hour, // no timed write within the test
		}
	}
	mem := vfs.NewMem()
	m, err := OpenManager(mgrCrashDir, mo(mem))
	require.NoError(t, err)
	x, err := m.Create("x")
	require.NoError(t, err)
	for k := 0; k < 4; k++ {
		b := buildBatch(t, 20, 4, int64(1000+k*100))
		_, err := x.Append(b)
		require.NoError(t, err)
		old = append(old, b)
	}
	require.Equal(t, int64(80), x.LogEndOffset())
	require.Equal(t, 1, x.Stats().Segments)
	require.NoError(t, m.Close())
	m, err = OpenManager(mgrCrashDir, mo(mem))
	require.NoError(t, err)
	img = mem.CrashClone(vfs.CrashOptions{Kill: true})
	require.NoError(t, m.Close())
	return mo, img, old
}
