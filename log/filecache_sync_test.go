package log

import (
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestFileCacheInFlightWriteIsNotCountedAsSynced: an fsync that runs
// while a write is in flight (Log.Sync runs concurrently with an Append,
// which writes outside any lock Sync takes) does not cover it: the file
// stays dirty, off the list of synced files evicted first, so that an
// error of its writeback is not lost with its descriptor.
func TestFileCacheInFlightWriteIsNotCountedAsSynced(t *testing.T) {
	c := newFileCache(vfs.NewMem(), 8)
	cf, err := c.openFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)

	// An append's WriteAt has acquired the file and is about to write.
	f, err := cf.acquireWrite()
	require.NoError(t, err)
	// Meanwhile a Sync's fsync runs and completes.
	require.NoError(t, cf.Datasync())
	// Now the append's bytes land, after the fsync; the use ends.
	_, err = f.WriteAt([]byte("written after the fsync"), 0)
	require.NoError(t, err)
	cf.release()

	c.mu.Lock()
	onDirty := cf.list == &c.dirty
	c.mu.Unlock()
	require.True(t, onDirty, "a file whose last write no fsync covered is on the synced list")
}

// TestFileCacheFailedReopenOnWriteDoesNotStayInFlight: a WriteAt whose
// reopen of an evicted file fails (EMFILE, ENOMEM...) never writes, yet
// acquireFor counted it as a write in progress and the error path did not
// undo that. The file then stayed "dirty" for good: every later
// successful fsync covered writes-writing < writes, so the synced file
// sat on the dirty list (closed last) instead of the idle one.
func TestFileCacheFailedReopenOnWriteDoesNotStayInFlight(t *testing.T) {
	var failOpen atomic.Bool
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if failOpen.Load() && op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, "/a") {
			return vfs.Fault{Err: syscall.EMFILE}
		}
		return vfs.Fault{}
	}))
	c := newFileCache(efs, 1)
	a, err := c.openFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	_, err = c.openFile("/b", os.O_RDWR|os.O_CREATE, 0o644) // evicts /a
	require.NoError(t, err)
	c.mu.Lock()
	require.Nil(t, a.f, "/a evicted")
	c.mu.Unlock()

	failOpen.Store(true)
	_, err = a.WriteAt([]byte("x"), 0)
	require.Error(t, err)
	failOpen.Store(false)

	_, err = a.WriteAt([]byte("data"), 0)
	require.NoError(t, err)
	require.NoError(t, a.Sync())

	c.mu.Lock()
	writing, onDirty := a.writing, a.list == &c.dirty
	c.mu.Unlock()
	require.Zero(t, writing, "no write is in flight")
	require.False(t, onDirty, "a file whose every write was fsynced is still on the dirty list")
}
