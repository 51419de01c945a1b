package log

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// countLogReads opens a log on a filesystem that counts the reads of its
// .log files.
func countLogReads(t *testing.T) (*Log, *atomic.Int64, Options) {
	t.Helper()
	var reads atomic.Int64
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpRead && strings.HasSuffix(op.Path, logSuffix) {
			reads.Add(1)
		}
		return vfs.Fault{}
	}))
	opts := testLogOptions(efs)
	return openLog(t, "/log", opts), &reads, opts
}

// regionBytes reads a region's bytes from its file.
func regionBytes(t *testing.T, r Region) []byte {
	t.Helper()
	buf := make([]byte, r.Length)
	_, err := r.File.ReadAt(buf, r.Position)
	require.NoError(t, err)
	return buf
}

// A follower's next fetch, or a tailing consumer's, asks for the batch
// just appended: the log finds it from what the appender remembers, not
// by reading headers back from the file, and answers what a log that
// remembers nothing (reopened) answers.
func TestReadAtLogEndReadsNoHeader(t *testing.T) {
	requireNoGoroutineLeak(t)
	l, reads, opts := countLogReads(t)
	want := appendN(t, l, 20, 0)
	last := Batch(want[len(want)-1])
	end := l.LogEndOffset()
	require.Equal(t, last.NextOffset(), end)

	var regions []Region
	for _, off := range []int64{last.BaseOffset(), last.BaseOffset() + 1, last.LastOffset()} {
		reads.Store(0)
		r, err := l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		require.Zero(t, reads.Load(), "ReadRegion(%d) at the log end read the file", off)
		require.Equal(t, last.BaseOffset(), r.FirstOffset)
		require.Equal(t, end, r.NextOffset)
		require.Equal(t, []byte(last), regionBytes(t, r))
		regions = append(regions, r)

		reads.Store(0)
		buf, err := l.Read(nil, off, ReadOptions{})
		require.NoError(t, err)
		require.Equal(t, []byte(last), buf)
		require.Equal(t, int64(1), reads.Load(), "Read(%d) at the log end: the batch itself only", off)
	}
	// Earlier batches are found from the index, as before.
	mid, err := l.ReadRegion(Batch(want[3]).BaseOffset(), ReadOptions{MaxBytes: len(want[3])})
	require.NoError(t, err)
	require.Equal(t, want[3], regionBytes(t, mid))

	require.NoError(t, l.Close())
	reopened := openLog(t, "/log", opts)
	for i, off := range []int64{last.BaseOffset(), last.BaseOffset() + 1, last.LastOffset()} {
		r, err := reopened.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		r.File, regions[i].File = nil, nil
		require.Equal(t, r, regions[i], "offset %d", off)
	}
}

// What the appender remembers follows the log: after a truncation the
// last batch is the one before the cut, and after the next append the new
// batch, though the same position held another before.
func TestReadAtLogEndAfterTruncation(t *testing.T) {
	requireNoGoroutineLeak(t)
	l, _, _ := countLogReads(t)
	want := appendN(t, l, 10, 0)
	cut := Batch(want[8]).BaseOffset()
	require.NoError(t, l.TruncateTo(cut))
	r, err := l.ReadRegion(Batch(want[7]).BaseOffset(), ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, want[7], regionBytes(t, r))

	next := buildBatch(t, 5, 30, 5000) // another size at the same position
	_, err = l.Append(next)
	require.NoError(t, err)
	for off := cut; off < cut+5; off++ {
		r, err = l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		require.Equal(t, next, regionBytes(t, r), "offset %d", off)
		require.Equal(t, cut, r.FirstOffset)
		require.Equal(t, cut+5, r.NextOffset)
	}
	_, err = l.ReadRegion(cut+5, ReadOptions{})
	require.NoError(t, err)
}

// A follower's log may have a gap before its last batch (offsets the
// leader's log start skipped): an offset in the gap reads that batch.
func TestReadAtLogEndInAFollowerGap(t *testing.T) {
	requireNoGoroutineLeak(t)
	l, reads, _ := countLogReads(t)
	first := followerBatch(t, 0, 3, 1)
	_, err := l.AppendAsFollower(first)
	require.NoError(t, err)
	after := followerBatch(t, 10, 3, 1)
	_, err = l.AppendAsFollower(after)
	require.NoError(t, err)
	for off := int64(3); off < 13; off++ {
		reads.Store(0)
		r, err := l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		if off >= 10 {
			require.Zero(t, reads.Load(), "offset %d", off)
		}
		require.Equal(t, after, regionBytes(t, r), "offset %d", off)
	}
	r, err := l.ReadRegion(2, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, first, regionBytes(t, r))
}
