package log

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerReservedLogNames: Create refuses the names of the Manager's
// own files in the data directory (clean-shutdown,
// recovery-point-offset-checkpoint, replication-offset-checkpoint and
// their ".tmp" files): a log directory there would make checkpoint writes
// fail and the data directory no longer open.
func TestManagerReservedLogNames(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	opts := ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour}
	m, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	_, err = m.Create("ok-0")
	require.NoError(t, err)
	for _, name := range []string{managerCleanShutdownFile, managerCheckpointFile, managerHighWatermarkFile} {
		for _, n := range []string{name, name + tmpSuffix} {
			_, err := m.Create(n)
			require.ErrorIs(t, err, ErrInvalidLogName, "Create(%q)", n)
		}
	}
	require.NoError(t, m.Close())
	m, err = OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// TestManagerIgnoresReservedNameDirectories: OpenManager opened a stray
// directory named like the Manager's temporary files ("x.tmp") as a log,
// writing segment files into it, and Names listed a log that Create
// refuses; one in the place of a checkpoint's temporary file
// ("clean-shutdown.tmp") made every checkpoint write and Close fail, so
// OpenManager now refuses it.
func TestManagerIgnoresReservedNameDirectories(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	opts := ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour}
	require.NoError(t, mem.MkdirAll(mgrCrashDir+"/x.tmp", 0o755))
	m, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	require.Empty(t, m.Names())
	entries, err := mem.ReadDir(mgrCrashDir + "/x.tmp")
	require.NoError(t, err)
	require.Empty(t, entries, "nothing written into the stray directory")
	require.NoError(t, m.Close())

	require.NoError(t, mem.MkdirAll(mgrCrashDir+"/"+managerCleanShutdownFile+tmpSuffix, 0o755))
	_, err = OpenManager(mgrCrashDir, opts)
	require.ErrorContains(t, err, "checkpoint's temporary file")
}

// TestManagerOpenFailsOnAStatError: OpenManager refuses to start when it
// cannot tell whether an entry of the data directory is a log (a Stat
// error other than "does not exist"): skipping the log would hide its
// data, and the next checkpoint would drop its recovery point.
func TestManagerOpenFailsOnAStatError(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	l, err := m.Create("orders-0")
	require.NoError(t, err)
	_, err = l.Append(buildBatch(t, 2, 10, 1000))
	require.NoError(t, err)
	require.NoError(t, m.Close())

	failing := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpStat && filepath.Base(op.Path) == "orders-0" {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	_, err = OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: failing}, CheckpointInterval: time.Hour})
	require.ErrorIs(t, err, syscall.EIO)

	m, err = OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	l, ok := m.Get("orders-0")
	require.True(t, ok)
	require.Equal(t, int64(2), l.LogEndOffset())
}
