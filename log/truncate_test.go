package log

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// TestTruncate follows Kafka's testTruncate: truncation mid-segment,
// mid-batch, at a segment boundary and across segments; appends continue
// at the new end; the result survives a clean reopen, a process crash
// and a power loss, and truncated data never comes back.
func TestTruncate(t *testing.T) {
	// Batches hold 3 records each (offsets 3i..3i+2); about 29 batches
	// fit a segment.
	tests := []struct {
		name    string
		offset  int64
		wantLEO int64
	}{
		{"batch boundary in the active segment", 285, 285},
		{"inside a batch in the active segment", 287, 285},
		{"inside a batch of an earlier segment", 100, 99},
		{"start of a segment", -1, -1}, // filled in below: the second segment's base
		{"everything", 0, 0},
		{"last offset", 299, 297},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireNoGoroutineLeak(t)
			fs, opts := memLog()
			l := openLog(t, "/log", opts)
			want := appendN(t, l, 100, 0)
			require.NoError(t, l.Sync())
			segsBefore := l.segments()
			require.Greater(t, len(segsBefore), 3)
			if tt.offset < 0 {
				tt.offset, tt.wantLEO = segsBefore[1].base, segsBefore[1].base
			}

			require.NoError(t, l.TruncateTo(tt.offset))
			require.Equal(t, tt.wantLEO, l.LogEndOffset())
			kept := want[:tt.wantLEO/3]
			require.Equal(t, kept, readAllBatches(t, l))
			for _, s := range l.segments() {
				require.LessOrEqual(t, s.base, tt.wantLEO, "no segment starts past the new end")
			}
			// The timestamps of truncated records are gone from the index.
			if tt.wantLEO < 300 {
				_, ok, err := l.OffsetForTimestamp(int64(tt.wantLEO/3) * 10)
				require.NoError(t, err)
				require.False(t, ok, "no record has a timestamp that new")
			}
			// Nothing truncated reappears after a power loss.
			lost := fs.CrashClone(vfs.CrashOptions{})
			crashed := crashCopy(t, fs)

			// Appends continue at the new end, with working indexes.
			more := appendN(t, l, 40, 1_000_000)
			all := append(append([][]byte(nil), kept...), more...)
			require.Equal(t, tt.wantLEO+120, l.LogEndOffset())
			require.Equal(t, all, readAllBatches(t, l))
			for i := 0; i < 40; i += 5 {
				off, ok, err := l.OffsetForTimestamp(1_000_000 + int64(i)*10 + 2)
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, tt.wantLEO+int64(i)*3+2, off)
			}
			require.NoError(t, l.Close())

			l = openLog(t, "/log", opts)
			require.Equal(t, all, readAllBatches(t, l), "clean reopen")
			require.NoError(t, l.Close())

			for name, img := range map[string]*vfs.MemFS{"process crash": crashed, "power loss": lost} {
				o := opts
				o.FS = img
				l = openLog(t, "/log", o)
				require.Equal(t, tt.wantLEO, l.LogEndOffset(), name)
				require.Equal(t, kept, readAllBatches(t, l), name)
				require.NoError(t, l.Close())
			}
		})
	}
}

func TestTruncateToEdges(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 10, 0)
	require.NoError(t, l.TruncateTo(30), "at the end: nothing to do")
	require.NoError(t, l.TruncateTo(1000), "past the end: nothing to do")
	require.Equal(t, want, readAllBatches(t, l))
	require.NoError(t, l.DeleteRecordsBefore(6))
	require.ErrorIs(t, l.TruncateTo(5), ErrOffsetOutOfRange)
	require.Equal(t, int64(30), l.LogEndOffset())
	require.NoError(t, l.TruncateTo(6))
	require.Equal(t, int64(6), l.LogEndOffset())
	require.Equal(t, int64(6), l.LogStartOffset())
	buf, err := l.Read(nil, 6, ReadOptions{})
	require.NoError(t, err)
	require.Empty(t, buf)
}

// TestTruncateIntoSealedSegment follows Kafka's
// testIndexResizingAtTruncation: a sealed segment whose index was trimmed
// and written becomes active again; it takes appends, indexes them and
// rolls as usual.
func TestTruncateIntoSealedSegment(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 100, 0)
	waitRecoveryPoint(t, l)
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts) // sealed segments' indexes are now lazy
	segs := l.segments()
	mid := segs[1].base + 9
	require.NoError(t, l.TruncateTo(mid))
	require.Len(t, l.segments(), 2)
	require.Equal(t, mid, l.LogEndOffset())
	act := l.active()
	require.Equal(t, segs[1].base, act.base)
	before := act.offIdx.count()
	more := appendN(t, l, 60, 50_000)
	require.Greater(t, len(l.segments()), 3, "rolled again")
	require.Greater(t, act.offIdx.count(), before, "the segment keeps indexing")
	require.NoError(t, validateOffsetEntries(act.offIdx.entries, act.size.Load()))
	got := readAllBatches(t, l)
	require.Equal(t, more, got[len(got)-60:])
	for i := 0; i < 60; i++ {
		buf, err := l.Read(nil, mid+int64(i)*3+1, ReadOptions{MaxBytes: 1})
		require.NoError(t, err)
		require.Equal(t, more[i], buf)
	}
}

// TestTruncateKeepsRegionsReadable: a region handed out before a
// truncation that deletes its segment stays readable until the file
// delete delay has passed.
func TestTruncateKeepsRegionsReadable(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 100, 0)
	segs := l.segments()
	r, err := l.ReadRegion(segs[2].base, ReadOptions{MaxBytes: 1000})
	require.NoError(t, err)
	want := make([]byte, r.Length)
	_, err = r.File.ReadAt(want, r.Position)
	require.NoError(t, err)

	require.NoError(t, l.TruncateTo(segs[1].base+1))
	name := filepath.Join("/log", segmentName(segs[2].base)+logSuffix)
	require.False(t, fileExists(fs, name))
	require.True(t, fileExists(fs, name+deletedSuffix), "renamed, not removed yet")
	got := make([]byte, r.Length)
	_, err = r.File.ReadAt(got, r.Position)
	require.NoError(t, err)
	require.Equal(t, want, got)

	require.NoError(t, l.Close())
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)
	for _, n := range names {
		require.False(t, strings.HasSuffix(n, deletedSuffix), "%s removed at Close", n)
	}
}

func TestTruncateFullyAndStartAt(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 60, 0)
	old := segmentFiles(t, fs, "/log", logSuffix)
	l.SetHighWatermark(100)

	require.ErrorIs(t, l.TruncateFullyAndStartAt(-1), ErrOffsetOutOfRange)
	require.NoError(t, l.TruncateFullyAndStartAt(1000))
	check := func(l *Log, end int64) {
		t.Helper()
		require.Equal(t, int64(1000), l.LogStartOffset())
		require.Equal(t, end, l.LogEndOffset())
		require.Equal(t, []int64{1000}, segmentBases(l))
		_, err := l.Read(nil, 0, ReadOptions{})
		require.ErrorIs(t, err, ErrOffsetOutOfRange)
	}
	check(l, 1000)
	require.Equal(t, int64(1000), l.HighWatermark())
	for _, p := range old {
		require.False(t, fileExists(fs, p), "%s deleted", p)
	}
	lost := fs.CrashClone(vfs.CrashOptions{})

	info, err := l.Append(buildBatch(t, 2, 10, 0))
	require.NoError(t, err)
	require.Equal(t, int64(1000), info.FirstOffset)
	check(l, 1002)
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	check(l, 1002)

	// Durable at once: a power loss right after keeps the new start.
	o := opts
	o.FS = lost
	l2 := openLog(t, "/log", o)
	check(l2, 1000)
	info, err = l2.Append(buildBatch(t, 1, 10, 0))
	require.NoError(t, err)
	require.Equal(t, int64(1000), info.FirstOffset)

	// Starting below the old start is allowed too (a new leader's log).
	require.NoError(t, l.TruncateFullyAndStartAt(7))
	require.Equal(t, int64(7), l.LogStartOffset())
	require.Equal(t, int64(7), l.LogEndOffset())
}

// TestTruncateToLogStartInsideBatch: truncating to a log start offset
// that lies inside a batch removes that whole batch, so the log end falls
// below the old start. The start must follow it down (as Kafka's
// truncateTo lowers logStartOffset), durably: a reopen gives the same
// state and the next append the same offset.
func TestTruncateToLogStartInsideBatch(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 10, 0)
	require.NoError(t, l.DeleteRecordsBefore(7)) // inside batch [6, 8]
	require.NoError(t, l.TruncateTo(7))
	require.Equal(t, int64(6), l.LogEndOffset())
	require.LessOrEqual(t, l.LogStartOffset(), l.LogEndOffset(), "the start never passes the end")
	start, end := l.LogStartOffset(), l.LogEndOffset()
	require.NoError(t, l.Close())

	l = openLog(t, "/log", opts)
	require.Equal(t, start, l.LogStartOffset(), "reopen gives the same start")
	require.Equal(t, end, l.LogEndOffset(), "reopen gives the same end")
	info, err := l.Append(buildBatch(t, 1, 5, 0))
	require.NoError(t, err)
	require.Equal(t, int64(6), info.FirstOffset)
	got := readAllBatches(t, l)
	require.Len(t, got, 1)
	require.Equal(t, int64(6), Batch(got[0]).BaseOffset())
}
