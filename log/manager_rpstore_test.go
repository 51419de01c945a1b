package log

import (
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestRPStoreFailedWriteLowersWhatTheFileHolds: after a failed
// checkpoint write that lowered a log's recovery point, the file may
// hold the lower value (here it does: only the directory fsync failed),
// so the store must not claim the file certainly holds the higher one.
// A follower gap relies on that claim (writeRecoveryPointAtLeast) to
// skip writing the recovery point past the gap.
func TestRPStoreFailedWriteLowersWhatTheFileHolds(t *testing.T) {
	mem := vfs.NewMem()
	var armed atomic.Bool
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if armed.Load() && op.Kind == vfs.OpSyncDir && filepath.Clean(op.Path) == mgrCrashDir {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(efs))
	require.NoError(t, err)
	defer m.Close()
	dir := filepath.Join(mgrCrashDir, "orders")
	require.NoError(t, m.rp.store(dir, 100, true))
	require.True(t, m.rp.fileHoldsAtLeast(dir, 100))

	armed.Store(true)
	require.Error(t, m.rp.store(dir, 10, true))
	armed.Store(false)
	onDisk, ok, err := readNamed(mem, managerCheckpointFile)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(10), onDisk["orders"], "the rename went through")
	require.False(t, m.rp.fileHoldsAtLeast(dir, 50), "the file may hold 10 after the failed write")
}
