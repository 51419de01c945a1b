package log

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestHighWatermarkAfterCrashIsNotTheLastCloses: the high-watermark file
// is written only by Close, yet Open read it after a crash too. A follower
// that truncated below the high watermark of its last clean Close and
// appended other (uncommitted) records there, then crashed, came back
// with the old high watermark: the new, never committed records below it
// were reported committed (readers with UpToHighWatermark saw them, and a
// replica that then led served them as committed). After a crash the high
// watermark now restarts at the log start.
func TestHighWatermarkAfterCrashIsNotTheLastCloses(t *testing.T) {
	mem, opts := memLog()
	l, err := Open("/log", opts)
	require.NoError(t, err)
	for i := int64(0); i < 10; i++ {
		_, err := l.AppendAsFollower(followerBatch(t, i*3, 3, 1))
		require.NoError(t, err)
	}
	l.SetHighWatermark(30)
	require.Equal(t, int64(30), l.HighWatermark())
	require.NoError(t, l.Close()) // high-watermark file: 30

	l, err = Open("/log", opts)
	require.NoError(t, err)
	require.Equal(t, int64(30), l.HighWatermark())
	// A new leader's log diverges from offset 15: truncate and fetch its
	// records, not yet committed.
	require.NoError(t, l.TruncateTo(15))
	require.Equal(t, int64(15), l.HighWatermark())
	for i := int64(5); i < 12; i++ {
		_, err := l.AppendAsFollower(followerBatch(t, i*3, 3, 2))
		require.NoError(t, err)
	}
	require.NoError(t, l.Sync())
	require.Equal(t, int64(15), l.HighWatermark(), "nothing above 15 was ever committed in this log")

	// The process dies.
	img := mem.CrashClone(vfs.CrashOptions{Kill: true})
	_ = l.Close()
	opts.FS = img
	l2, err := Open("/log", opts)
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, int64(36), l2.LogEndOffset())
	require.LessOrEqual(t, l2.HighWatermark(), int64(15),
		"after a crash the high watermark of an earlier Close (30) is applied to records written after a truncation to 15: records never committed are reported committed")
}

// TestCleanCloseOfAnEmptyActiveSegmentIsTrusted: a log whose
// active segment is empty (a new log, one restarted by
// TruncateFullyAndStartAt, one whose crash recovery emptied its last
// segment) was closed cleanly, yet the next Open did not trust its
// clean-shutdown marker and recovered it, logging that the marker
// disagreed with the segments: Close appended a time index entry for the
// active segment's max timestamp even when it had none (NoTimestamp,
// relative offset 0), which loadClean then read as an entry at the active
// segment's base, at or past the marker's log end offset.
func TestCleanCloseOfAnEmptyActiveSegmentIsTrusted(t *testing.T) {
	t.Run("new log", func(t *testing.T) {
		mem, opts := memLog()
		l, err := Open("/log", opts)
		require.NoError(t, err)
		require.NoError(t, l.Close())
		ti := readFileFS(t, mem, "/log/"+segmentName(0)+timeIndexSuffix)
		l, err = Open("/log", opts)
		require.NoError(t, err)
		defer l.Close()
		require.Zero(t, l.Stats().RecoveredSegments, "a cleanly closed empty log is recovered: its marker is not trusted (time index left by Close: %x)", ti)
	})
	t.Run("after TruncateFullyAndStartAt", func(t *testing.T) {
		_, opts := memLog()
		l, err := Open("/log", opts)
		require.NoError(t, err)
		appendN(t, l, 5, 0)
		require.NoError(t, l.TruncateFullyAndStartAt(100))
		require.NoError(t, l.Close())
		l, err = Open("/log", opts)
		require.NoError(t, err)
		defer l.Close()
		require.Equal(t, int64(100), l.LogEndOffset())
		require.Zero(t, l.Stats().RecoveredSegments, "a cleanly closed log with an empty active segment is recovered: its marker is not trusted")
	})
}
