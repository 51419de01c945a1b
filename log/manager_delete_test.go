package log

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerDeleteFailedCheckpointThenCreate: Delete forgets the log's
// recovery point and writes the checkpoint; if that write fails, the file
// may still hold the deleted log's recovery point. The name stays taken
// until a Delete finishes, and a log created under it afterwards must not
// be recovered from the old recovery point after a power loss.
func TestManagerDeleteFailedCheckpointThenCreate(t *testing.T) {
	requireNoGoroutineLeak(t)
	deleteThenCreate(t, true)
}

// TestManagerDeleteThenCreate is the same workload with a Delete that
// succeeds.
func TestManagerDeleteThenCreate(t *testing.T) {
	requireNoGoroutineLeak(t)
	deleteThenCreate(t, false)
}

func deleteThenCreate(t *testing.T, failDelete bool) {
	mem := vfs.NewMem()
	efs, armed := failCheckpointWrites(mem)
	group := NewFlushGroup(1)
	opts := ManagerOptions{
		Log:                Options{FS: efs, SegmentBytes: 1 << 10, IndexIntervalBytes: 256, FlushGroup: group},
		CheckpointInterval: time.Hour,
	}

	// The old log "a", closed cleanly: the checkpoint holds its recovery
	// point at its log end.
	m, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	a, err := m.Create("a")
	require.NoError(t, err)
	for k := 0; k < 60; k++ {
		_, err := a.Append(testBatch(t, k))
		require.NoError(t, err)
	}
	oldEnd := a.LogEndOffset()
	require.NoError(t, m.Close())
	m, err = OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	rps, _, err := readNamed(mem, managerCheckpointFile)
	require.NoError(t, err)
	require.Equal(t, oldEnd, rps["a"])

	// Delete fails at its checkpoint write (a transient ENOSPC).
	armed.Store(failDelete)
	if failDelete {
		require.Error(t, m.Delete("a"))
	} else {
		require.NoError(t, m.Delete("a"))
	}
	armed.Store(false)
	if failDelete {
		// The name stays taken until a Delete finishes.
		_, err = m.Create("a")
		require.ErrorIs(t, err, ErrLogExists)
		require.NoError(t, m.Delete("a"))
	}

	// The name is free: create the new log.
	a, err = m.Create("a")
	require.NoError(t, err)
	rps, _, err = readNamed(mem, managerCheckpointFile)
	require.NoError(t, err)
	assert.NotContains(t, rps, "a", "the deleted log's recovery point is still on disk after Create returned")

	// The new log rolls a few times; its roll flushes wait for a turn of
	// the FlushGroup (held here), so its rolled segments are not synced yet.
	release := group.acquire(false)
	var appended [][]byte
	for k := 0; k < 20; k++ {
		b := testBatch(t, 100+k)
		_, err := a.Append(b)
		require.NoError(t, err)
		appended = append(appended, b)
	}
	require.Greater(t, a.Stats().Segments, 2)
	require.Less(t, a.LogEndOffset(), oldEnd)
	// Power loss: unsynced data gone, directory entries kept.
	img := mem.CrashClone(vfs.CrashOptions{KeepDirOps: 1})
	release()
	require.NoError(t, m.Close())

	opts.Log.FS = img
	m2, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	defer m2.Close()
	l, ok := m2.Get("a")
	require.True(t, ok)
	t.Logf("recovered: start %d end %d recovery point %d, segments %d", l.LogStartOffset(), l.LogEndOffset(), l.RecoveryPoint(), l.Stats().Segments)
	st, err := tryReadState(l)
	require.NoError(t, err, "the new log recovered from the deleted log's recovery point")
	for i, b := range st.batches {
		require.Equal(t, appended[i], b)
	}
}

// TestManagerDeleteFailedRenameCanBeRetried: Delete closes the log before
// renaming its directory; if the rename fails, the name stays taken
// (Create would open the old log's data) and Delete can be called again
// to finish; then Create makes a new, empty log.
func TestManagerDeleteFailedRenameCanBeRetried(t *testing.T) {
	requireNoGoroutineLeak(t)
	var armed atomic.Bool
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if armed.Load() && op.Kind == vfs.OpRename && strings.HasSuffix(op.NewPath, "/a"+deletedDirSuffix) {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: efs}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	a, err := m.Create("a")
	require.NoError(t, err)
	_, err = a.Append(testBatch(t, 1))
	require.NoError(t, err)

	armed.Store(true)
	require.Error(t, m.Delete("a"))
	armed.Store(false)
	_, ok := m.Get("a")
	t.Logf("after the failed Delete: Get finds the log: %v; Names: %v", ok, m.Names())
	_, err = m.Create("a")
	require.ErrorIs(t, err, ErrLogExists, "Create would open the old log's data")
	require.NoError(t, m.Delete("a"), "a failed Delete can be retried")
	a, err = m.Create("a")
	require.NoError(t, err)
	assert.Zero(t, a.LogEndOffset(), "Create returned the old log's data instead of a new, empty log")
}

// failCheckpointWrites returns a filesystem on inner where, once armed,
// every write of the Manager's recovery-point checkpoint fails with
// ENOSPC (its temporary file cannot be created).
func failCheckpointWrites(inner vfs.FS) (*vfs.ErrorFS, *atomic.Bool) {
	var armed atomic.Bool
	return vfs.NewErrorFS(inner, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if armed.Load() && op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, managerCheckpointFile+tmpSuffix) {
			return vfs.Fault{Err: syscall.ENOSPC}
		}
		return vfs.Fault{}
	})), &armed
}
