package log

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

func deletedFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, deletedSuffix) {
			out = append(out, n)
		}
	}
	return out
}

func TestDeleteRecordsBefore(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 100, 0)
	require.NoError(t, l.Sync())
	segs := l.segments()
	require.Greater(t, len(segs), 3)

	require.ErrorIs(t, l.DeleteRecordsBefore(-1), ErrOffsetOutOfRange)
	require.ErrorIs(t, l.DeleteRecordsBefore(301), ErrOffsetOutOfRange)

	// Inside the third segment: the first two go, the third stays whole
	// on disk but reads below the new start fail.
	start := segs[2].base + 4
	require.NoError(t, l.DeleteRecordsBefore(start))
	require.Equal(t, start, l.LogStartOffset())
	require.Equal(t, segs[2].base, l.segments()[0].base)
	require.Equal(t, int64(2), l.Stats().DeletedSegments)
	require.Equal(t, start, l.HighWatermark(), "the high watermark is raised to the start")
	_, err := l.Read(nil, start-1, ReadOptions{})
	require.ErrorIs(t, err, ErrOffsetOutOfRange)
	buf, err := l.Read(nil, start, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, want[start/3], buf, "the batch holding the new start is returned whole")
	require.NoError(t, l.DeleteRecordsBefore(start-1), "below the start: nothing to delete, as in Kafka")
	require.Equal(t, start, l.LogStartOffset(), "the start never moves back")
	require.NoError(t, l.DeleteRecordsBefore(start), "the same start again is fine")
	lost := fs.CrashClone(vfs.CrashOptions{})
	require.NoError(t, l.Close())

	// Checkpointed durably: survives a clean reopen and a power loss.
	l = openLog(t, "/log", opts)
	require.Equal(t, start, l.LogStartOffset())
	require.Equal(t, want[start/3:], readAllBatches(t, l))
	o := opts
	o.FS = lost
	l2 := openLog(t, "/log", o)
	require.Equal(t, start, l2.LogStartOffset())
	require.Equal(t, want[start/3:], readAllBatches(t, l2))

	// Up to the end: every segment but the active one goes.
	require.NoError(t, l.DeleteRecordsBefore(300))
	require.Len(t, l.segments(), 1)
	require.Equal(t, int64(300), l.LogStartOffset())
	buf, err = l.Read(nil, 300, ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, buf)
	info, err := l.Append(buildBatch(t, 1, 1, 0))
	require.NoError(t, err)
	require.Equal(t, int64(300), info.FirstOffset)
}

// TestDeleteRecordsBeforeUnsyncedData: the start moved past data that was
// never fsynced; after a power loss the data is gone but the start is
// not: the log restarts empty there, as Kafka's LogLoader does, and
// offsets below it are not handed out again.
func TestDeleteRecordsBeforeUnsyncedData(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	opts.SegmentBytes = 1 << 20 // one segment, never flushed by a roll
	l := openLog(t, "/log", opts)
	appendN(t, l, 50, 0)
	require.NoError(t, l.DeleteRecordsBefore(100))
	lost := fs.CrashClone(vfs.CrashOptions{})
	require.NoError(t, l.Close())

	o := opts
	o.FS = lost
	l = openLog(t, "/log", o)
	require.Equal(t, int64(100), l.LogStartOffset())
	require.Equal(t, int64(100), l.LogEndOffset())
	info, err := l.Append(buildBatch(t, 2, 10, 0))
	require.NoError(t, err)
	require.Equal(t, int64(100), info.FirstOffset)
	require.NoError(t, l.Close())
	l = openLog(t, "/log", o)
	require.Equal(t, int64(100), l.LogStartOffset())
	require.Equal(t, int64(102), l.LogEndOffset())
}

func TestApplyRetentionBySize(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 100, 0)
	segs := l.segments()
	require.Greater(t, len(segs), 3)
	segSize := segs[0].size.Load()
	opts.RetentionBytes = segSize + segSize/2
	// Kafka's rule: delete the oldest segment while what remains without
	// it is still at least RetentionBytes.
	total := l.Stats().Bytes
	wantN := 0
	for wantN < len(segs)-1 && total-segs[wantN].size.Load() >= opts.RetentionBytes {
		total -= segs[wantN].size.Load()
		wantN++
	}
	require.Positive(t, wantN)
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)

	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Equal(t, wantN, n)
	st := l.Stats()
	require.GreaterOrEqual(t, st.Bytes, opts.RetentionBytes, "no more is deleted than needed")
	require.Less(t, st.Bytes-l.segments()[0].size.Load(), opts.RetentionBytes)
	first := l.segments()[0].base
	require.Equal(t, first, l.LogStartOffset())
	require.Equal(t, want[first/3:], readAllBatches(t, l))
	require.Len(t, deletedFiles(t, fs), 3*n, "files renamed, removed later")

	n, err = l.ApplyRetention()
	require.NoError(t, err)
	require.Zero(t, n, "nothing more to do")

	// Never the active segment, whatever the limit.
	l.opts.RetentionBytes = 1
	_, err = l.ApplyRetention()
	require.NoError(t, err)
	require.Len(t, l.segments(), 1)
	require.Equal(t, l.active().base, l.LogStartOffset())
	require.NoError(t, l.Close())
	require.Empty(t, deletedFiles(t, fs), "Close removes deleted files")

	l = openLog(t, "/log", opts)
	require.Equal(t, want[len(want)-len(readAllBatches(t, l)):], readAllBatches(t, l))
}

func TestApplyRetentionByAge(t *testing.T) {
	requireNoGoroutineLeak(t)
	clock := newTestClock()
	fs, opts := memLog()
	opts.Now = clock.Now
	opts.RetentionAge = time.Hour
	opts.FileDeleteDelay = time.Minute
	l := openLog(t, "/log", opts)
	// Segment k's records are stamped around now - (10-k) hours, so the
	// oldest segments are past the retention age.
	t0 := clock.Now().Add(-10 * time.Hour).UnixMilli()
	hour := time.Hour.Milliseconds()
	var bases []int64
	for k := 0; k < 6; k++ {
		bases = append(bases, l.LogEndOffset())
		appendN(t, l, 20, t0+int64(k)*2*hour)
		l.mu.Lock()
		err := l.roll(l.LogEndOffset())
		l.mu.Unlock()
		require.NoError(t, err)
	}
	appendN(t, l, 5, clock.Now().UnixMilli())
	require.Len(t, l.segments(), 7)

	// Segment k's newest record: t0 + 2k hours (+190 ms). Age limit 1 h:
	// segments 0..4 (newest at -10..-2 h) are older; segment 5 (at -0 h)
	// is not.
	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, bases[5], l.LogStartOffset())

	// Later everything is old, but the active segment stays.
	clock.Advance(48 * time.Hour)
	n, err = l.ApplyRetention()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, l.segments(), 1)

	// Deleted files go once FileDeleteDelay has passed on the log's clock.
	require.NotEmpty(t, deletedFiles(t, fs))
	clock.Advance(2 * time.Minute)
	l.bg.wake()
	deadline := time.Now().Add(20 * time.Second)
	for len(deletedFiles(t, fs)) > 0 {
		require.True(t, time.Now().Before(deadline), "deleted files never removed: %v", deletedFiles(t, fs))
		time.Sleep(time.Millisecond)
		l.bg.wake()
	}
}

// TestDeletedFilesWaitForTheDelay: within FileDeleteDelay the renamed
// files stay (readers holding regions can finish); the flusher removes
// them after it.
func TestDeletedFilesWaitForTheDelay(t *testing.T) {
	requireNoGoroutineLeak(t)
	clock := newTestClock()
	fs, opts := memLog()
	opts.Now = clock.Now
	opts.FileDeleteDelay = time.Hour
	l := openLog(t, "/log", opts)
	appendN(t, l, 60, 0)
	first := l.segments()[0]
	r, err := l.ReadRegion(0, ReadOptions{MaxBytes: 100})
	require.NoError(t, err)
	require.NoError(t, l.DeleteRecordsBefore(l.segments()[1].base))
	name := filepath.Join("/log", segmentName(first.base)+logSuffix+deletedSuffix)
	require.True(t, fileExists(fs, name))
	clock.Advance(30 * time.Minute)
	l.bg.wake()
	// Give the flusher a chance to (wrongly) remove the file, then check
	// it is still there and readable.
	for i := 0; i < 3; i++ {
		l.bg.wake()
		time.Sleep(time.Millisecond)
	}
	require.True(t, fileExists(fs, name))
	buf := make([]byte, r.Length)
	_, err = r.File.ReadAt(buf, r.Position)
	require.NoError(t, err)
	require.NoError(t, Batch(buf).ValidateHeader())

	clock.Advance(31 * time.Minute)
	deadline := time.Now().Add(20 * time.Second)
	for fileExists(fs, name) {
		require.True(t, time.Now().Before(deadline), "%s never removed", name)
		l.bg.wake()
		time.Sleep(time.Millisecond)
	}
}

// TestBackgroundRetention: with RetentionCheckInterval the flusher applies
// retention by itself.
func TestBackgroundRetention(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 100, 0)
	require.Greater(t, len(l.segments()), 3)
	require.NoError(t, l.Close())
	opts.RetentionBytes = 1
	opts.RetentionCheckInterval = time.Millisecond
	l = openLog(t, "/log", opts)
	deadline := time.Now().Add(20 * time.Second)
	for len(l.segments()) > 1 {
		require.True(t, time.Now().Before(deadline), "retention never ran")
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, l.active().base, l.LogStartOffset())
}

// TestRetainAboveHighWatermark: after RetainAboveHighWatermark, retention
// deletes only segments that end at or below the high watermark, and
// DeleteRecordsBefore refuses an offset above it; the log start, and with
// it the high watermark, never pass records not yet committed.
func TestRetainAboveHighWatermark(t *testing.T) {
	_, opts := memLog()
	opts.RetentionBytes = 1 // as little as possible: every closed segment is due
	opts.RetentionCheckInterval = time.Hour
	l := openLog(t, "/log", opts)
	appendN(t, l, 200, 0)
	segs := l.segments()
	require.Greater(t, len(segs), 4)
	l.RetainAboveHighWatermark()
	hw := segs[2].base + 1 // inside the third segment
	l.SetHighWatermark(hw)

	require.ErrorIs(t, l.DeleteRecordsBefore(hw+1), ErrOffsetOutOfRange)
	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Equal(t, 2, n, "only the segments that end at or below the high watermark")
	require.Equal(t, segs[2].base, l.LogStartOffset())
	require.Equal(t, hw, l.HighWatermark())

	require.NoError(t, l.DeleteRecordsBefore(hw))
	l.SetHighWatermark(segs[4].base)
	n, err = l.ApplyRetention()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, segs[4].base, l.LogStartOffset())
}
