package log

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// A Region of a Manager's log whose file the cache had closed (evicted)
// is read while the log is deleted and a log of the same name created:
// the read's reopen, by path, started before the Delete and opens the
// path after the Create; it must not return the new log's bytes.
func TestRegionReopenRacingDeleteAndCreateReadsNoOtherLog(t *testing.T) {
	seg := mgrCrashDir + "/x/" + segmentName(0) + logSuffix
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpOpen && op.Path == seg && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, ManagerOptions{
		Log:          Options{FS: fs, PreallocateBytes: -1},
		MaxOpenFiles: 1, CheckpointInterval: time.Hour,
	})
	require.NoError(t, err)
	defer m.Close()
	x, err := m.Create("x")
	require.NoError(t, err)
	old := testBatch(t, 1)
	_, err = x.Append(old)
	require.NoError(t, err)
	require.NoError(t, x.Sync())
	r, err := x.ReadRegion(0, ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(len(old)), r.Length)

	// Another log's files push x's (synced, idle) file out of the cache.
	y, err := m.Create("y")
	require.NoError(t, err)
	_, err = y.Append(testBatch(t, 2))
	require.NoError(t, err)
	require.NoError(t, y.Sync())

	armed.Store(true)
	done := readRegionAsync(r)
	<-entered // the read reopens x's segment file by its path

	require.NoError(t, m.Delete("x"))
	x2, err := m.Create("x")
	require.NoError(t, err)
	for i := 3; i < 8; i++ {
		_, err = x2.Append(testBatch(t, i))
		require.NoError(t, err)
	}
	require.NoError(t, x2.Sync())
	close(release)
	got := <-done
	if got.err == nil {
		require.Equal(t, old, got.buf[:got.n],
			"a Region of the deleted log returned the bytes of the new log of the same name")
	}
}

// The same within one log: a Region's segment is truncated away (its
// file renamed to *.deleted) and, after FileDeleteDelay, closed and
// removed while a read of the Region reopens it; a later segment at the
// same base offset, truncated away too, takes the free *.deleted name:
// the read must not return its bytes.
func TestRegionReopenRacingItsRemovalReadsNoOtherSegment(t *testing.T) {
	bb := NewBatchBuilder()
	one := seqBatch(t, bb, 0, 1, 8)
	deleted := mgrCrashDir + "/a/" + segmentName(2) + logSuffix + deletedSuffix
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	mem := vfs.NewMem()
	fs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpOpen && op.Path == deleted && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, ManagerOptions{
		Log:          Options{FS: fs, SegmentBytes: int64(len(one)), FileDeleteDelay: time.Millisecond, PreallocateBytes: -1},
		MaxOpenFiles: 1, CheckpointInterval: time.Hour,
	})
	require.NoError(t, err)
	defer m.Close()
	l, err := m.Create("a")
	require.NoError(t, err)
	appendSeqBatches(t, l, bb, 0, 3) // segments 0, 1, 2
	require.NoError(t, l.Sync())
	reg, err := l.ReadRegion(2, ReadOptions{})
	require.NoError(t, err)
	want := make([]byte, reg.Length)
	_, err = reg.File.ReadAt(want, reg.Position)
	require.NoError(t, err)
	require.NoError(t, l.TruncateTo(1))    // segment 2's file becomes 2.log.deleted
	_, err = l.Read(nil, 0, ReadOptions{}) // the cache closes it
	require.NoError(t, err)

	armed.Store(true)
	done := readRegionAsync(reg)
	<-entered
	// FileDeleteDelay passes: the flusher closes and removes the file.
	require.Eventually(t, func() bool { _, err := mem.Stat(deleted); return err != nil }, 5*time.Second, time.Millisecond)
	appendSeqBatches(t, l, bb, 1000, 2) // a new segment 2, other bytes
	require.NoError(t, l.TruncateTo(1)) // ... renamed to the free 2.log.deleted
	close(release)
	got := <-done
	if got.err == nil {
		require.Equal(t, want, got.buf[:got.n], "the Region read another segment's bytes")
	}
}

// regionRead is what readRegionAsync's read returned.
type regionRead struct {
	n   int
	err error
	buf []byte
}

// readRegionAsync reads r whole in a new goroutine.
func readRegionAsync(r Region) <-chan regionRead {
	done := make(chan regionRead, 1)
	go func() {
		buf := make([]byte, r.Length)
		n, err := r.File.ReadAt(buf, r.Position)
		done <- regionRead{n, err, buf}
	}()
	return done
}
