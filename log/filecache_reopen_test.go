package log

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// reopenFaultFS fails the opens of paths ending in suffix with EMFILE
// while fails is positive, counting them down.
func reopenFaultFS(suffix *atomic.Pointer[string], fails *atomic.Int32) vfs.FS {
	return vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if s := suffix.Load(); op.Kind == vfs.OpOpen && s != nil && strings.HasSuffix(op.Path, *s) && fails.Add(-1) >= 0 {
			return vfs.Fault{Err: syscall.EMFILE}
		}
		return vfs.Fault{}
	}))
}

// TestReopenFailureIsNotAnFsyncFailure: a Manager's file cache that could
// not reopen an evicted segment file (EMFILE while sockets took the
// descriptors, say) for an fsync, or for an append's write and then for
// the truncation undoing it, failed the log for good with ErrSyncFailed,
// although no fsync ran and nothing reached the file. Sync and Append now
// return the error, and the log works once the file opens again.
func TestReopenFailureIsNotAnFsyncFailure(t *testing.T) {
	var suffix atomic.Pointer[string]
	var fails atomic.Int32
	opts := ManagerOptions{Log: Options{FS: reopenFaultFS(&suffix, &fails)}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	m, err := OpenManager("/data", opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	a, err := m.Create("a")
	require.NoError(t, err)
	b, err := m.Create("b")
	require.NoError(t, err)
	seg := "/a/" + segmentName(0) + logSuffix
	suffix.Store(&seg)
	evictA := func() {
		t.Helper()
		_, err := b.Append(buildBatch(t, 1, 10, 1))
		require.NoError(t, err)
		m.files.mu.Lock()
		evicted := a.active().file.(*cachedFile).f == nil
		m.files.mu.Unlock()
		require.True(t, evicted, "a's segment file still open")
	}

	_, err = a.Append(buildBatch(t, 2, 10, 1))
	require.NoError(t, err)
	evictA()
	fails.Store(1)
	err = a.Sync()
	require.ErrorIs(t, err, syscall.EMFILE)
	require.NotErrorIs(t, err, ErrSyncFailed)
	require.Equal(t, int64(0), a.DurableOffset())
	require.NoError(t, a.Sync(), "the file opens again")
	require.Equal(t, int64(2), a.DurableOffset())

	evictA()
	fails.Store(2) // the write's reopen, and the undo truncation's before the fix
	_, err = a.Append(buildBatch(t, 3, 10, 1))
	require.ErrorIs(t, err, syscall.EMFILE)
	require.NotErrorIs(t, err, ErrSyncFailed)
	fails.Store(0)
	info, err := a.Append(buildBatch(t, 4, 10, 1))
	require.NoError(t, err)
	require.Equal(t, int64(2), info.FirstOffset, "the failed append took no offsets")
	require.NoError(t, a.Sync())
	got, err := a.Read(nil, 0, ReadOptions{})
	require.NoError(t, err)
	n := 0
	for rest := got; len(rest) > 0; n++ {
		_, rest, err = SplitBatch(rest)
		require.NoError(t, err)
	}
	require.Equal(t, 2, n, "the two appended batches")
	require.Equal(t, int64(6), a.LogEndOffset())
}

// TestRollFlushRetriesAReopenFailure: a background roll flush whose
// segment file could not be reopened stays pending and is tried again
// within a couple of seconds, instead of failing the log (or waiting for
// the next timed work, an interval sync or a producer expiry check).
func TestRollFlushRetriesAReopenFailure(t *testing.T) {
	var suffix atomic.Pointer[string]
	var fails atomic.Int32
	opts := ManagerOptions{Log: Options{FS: reopenFaultFS(&suffix, &fails), SegmentBytes: 1 << 10},
		MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	m, err := OpenManager("/data", opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	a, err := m.Create("a")
	require.NoError(t, err)
	seg := "/a/" + segmentName(0) + logSuffix
	suffix.Store(&seg)
	fails.Store(3) // the flush's reopens fail until three were tried
	for a.RecoveryPoint() == 0 && len(a.segments()) < 2 {
		_, err = a.Append(buildBatch(t, 1, 300, 1))
		require.NoError(t, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.RecoveryPoint() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.NotZero(t, a.RecoveryPoint(), "the roll flush was not retried")
	require.LessOrEqual(t, fails.Load(), int32(0), "the flush never met the failing reopen")
	require.NoError(t, a.Sync())
	_, err = a.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)
}
