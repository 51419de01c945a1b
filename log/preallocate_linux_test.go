package log

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// allocatedBytes returns the disk space held by the file at path.
func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}

// dirPreallocates reports whether dir's filesystem allocates space ahead
// of a file's size, found with fallocate itself, not with the code under
// test (a Preallocate that does nothing must fail the test, not skip it).
func dirPreallocates(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.CreateTemp(dir, "fallocate-probe")
	require.NoError(t, err)
	defer os.Remove(f.Name())
	defer f.Close()
	const keepSize = 1 // FALLOC_FL_KEEP_SIZE
	if err := syscall.Fallocate(int(f.Fd()), keepSize, 0, 1<<20); err != nil {
		return false // EOPNOTSUPP, ENOSYS...
	}
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	return st.Blocks*512 >= 1<<20
}

// TestPreallocatedSegments, on the real filesystem: the spare file is
// allocated PreallocateBytes ahead with size 0; once its segment rolls,
// the roll flush releases what the segment did not use, and Close does
// the same for the active segment. PreallocateBytes < 0 allocates
// nothing ahead.
func TestPreallocatedSegments(t *testing.T) {
	requireNoGoroutineLeak(t)
	const segBytes = 1 << 20
	dir := t.TempDir()
	if !dirPreallocates(t, dir) {
		t.Skip("the temporary directory's filesystem does not preallocate")
	}
	l := openLog(t, dir, Options{SegmentBytes: segBytes})
	batch := func() []byte { return buildBatch(t, 4, 4000, 0) } // ~16 KiB
	for l.active().size.Load() < segBytes/2 {
		_, err := l.Append(batch())
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return readySpare(l) != nil }, 10*time.Second, time.Millisecond)
	spare := l.path(spareName)
	require.GreaterOrEqual(t, allocatedBytes(t, spare), int64(segBytes), "the spare is allocated ahead")
	st, err := os.Stat(spare)
	require.NoError(t, err)
	require.Zero(t, st.Size())

	// Roll into the spare, write a little, and roll again: the flush of
	// that short segment releases its unused space. The first segment,
	// full, keeps the little it did not use (no truncation at every roll).
	first := l.active()
	before := len(l.segments())
	for len(l.segments()) == before {
		_, err := l.Append(batch())
		require.NoError(t, err)
	}
	short := l.active()
	_, err = l.Append(batch())
	require.NoError(t, err)
	require.GreaterOrEqual(t, allocatedBytes(t, short.path(logSuffix)), int64(segBytes))
	require.Eventually(t, func() bool { return readySpare(l) != nil }, 10*time.Second, time.Millisecond)
	nextSpare := readySpare(l)
	next := l.LogEndOffset()
	l.mu.Lock()
	err = l.roll(next)
	l.mu.Unlock()
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.RecoveryPoint() >= next }, 10*time.Second, time.Millisecond)
	require.Less(t, allocatedBytes(t, short.path(logSuffix)), short.size.Load()+64<<10, "the roll flush released the rest")
	require.Less(t, segBytes-first.size.Load(), int64(64<<10), "the first segment is full")
	require.GreaterOrEqual(t, allocatedBytes(t, first.path(logSuffix)), int64(segBytes), "a full segment's tail is kept")

	act := l.active()
	require.Same(t, nextSpare, act.file, "the roll took the new spare")
	_, err = l.Append(batch())
	require.NoError(t, err)
	require.GreaterOrEqual(t, allocatedBytes(t, act.path(logSuffix)), int64(segBytes))
	require.NoError(t, l.Close())
	require.Less(t, allocatedBytes(t, act.path(logSuffix)), act.size.Load()+64<<10, "Close released the rest")

	off := t.TempDir()
	l2 := openLog(t, off, Options{SegmentBytes: segBytes, PreallocateBytes: -1})
	for l2.active().size.Load() < segBytes/2 {
		_, err := l2.Append(batch())
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return readySpare(l2) != nil }, 10*time.Second, time.Millisecond)
	require.Less(t, allocatedBytes(t, l2.path(spareName)), int64(64<<10), "nothing allocated ahead")
	require.NoError(t, l2.Close())
}
