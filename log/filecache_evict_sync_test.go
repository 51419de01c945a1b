package log

import (
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// writebackFS models Linux's report of a failed writeback: the error
// goes to the next fsync of a descriptor that wrote to the file before
// it; a descriptor opened afterwards never sees it (the inode may have
// left memory with it once no descriptor was open). Fsyncs of files whose
// name ends in failSuffix, through a descriptor that wrote, fail with EIO.
type writebackFS struct {
	vfs.FS
	failSuffix atomic.Pointer[string]
}

func (w *writebackFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := w.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &writebackFile{File: f, fs: w}, nil
}

type writebackFile struct {
	vfs.File
	fs    *writebackFS
	wrote atomic.Bool
}

func (f *writebackFile) WriteAt(p []byte, off int64) (int, error) {
	f.wrote.Store(true)
	return f.File.WriteAt(p, off)
}

func (f *writebackFile) Sync() error {
	if s := f.fs.failSuffix.Load(); s != nil && strings.HasSuffix(f.Name(), *s) && f.wrote.Swap(false) {
		return syscall.EIO
	}
	return f.File.Sync()
}

// TestEvictedDirtyFileFsyncErrorReachesSync: a Manager's file cache that
// must close a segment file written since its last fsync (no clean idle
// file left under MaxOpenFiles) closed it without an fsync, so that a
// failed writeback's error, reported only to a descriptor open before
// it, was lost: the log's next Sync reopened the file, its fsync
// succeeded, and data the disk never got was reported durable. The cache
// now fsyncs such a file before closing it, and the log's next Sync
// returns that fsync's error.
func TestEvictedDirtyFileFsyncErrorReachesSync(t *testing.T) {
	fs := &writebackFS{FS: vfs.NewMem()}
	opts := ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	m, logs := managerWithLogs(t, opts, "a", "b")
	t.Cleanup(func() { _ = m.Close() }) // before managerWithLogs's
	a, b := logs[0], logs[1]
	_, err := a.Append(buildBatch(t, 2, 10, 1))
	require.NoError(t, err)
	seg := "/a/" + segmentName(0) + logSuffix
	fs.failSuffix.Store(&seg) // a's write back fails

	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's dirty segment file
	require.NoError(t, err)
	m.files.mu.Lock()
	evicted := a.active().file.(*cachedFile).f == nil
	m.files.mu.Unlock()
	require.True(t, evicted, "a's segment file still open")

	err = a.Sync()
	require.ErrorIs(t, err, syscall.EIO, "a Sync after the failed write back reported a's data durable")
	require.ErrorIs(t, err, ErrSyncFailed)
	require.Equal(t, int64(0), a.DurableOffset())
	_, err = b.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err, "b is not affected")
	require.NoError(t, b.Sync())
}

// TestEvictionFsyncIsNotTheEvictingCallsWait: the fsync of a dirty
// segment file the cache evicts ran in the call that needed the
// descriptor, under its own log's locks: an append to log a, or a read of
// it, waited for an fsync of log b's file (500 ms here). It now runs in
// the background; a Sync of b waits for it.
func TestEvictionFsyncIsNotTheEvictingCallsWait(t *testing.T) {
	const slowSync = 500 * time.Millisecond
	var slow atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && strings.Contains(op.Path, "/b/") && slow.Load() {
			time.Sleep(slowSync)
		}
		return vfs.Fault{}
	}))
	opts := ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	_, logs := managerWithLogs(t, opts, "a", "b")
	a, b := logs[0], logs[1]
	_, err := a.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's file; b's is open and dirty
	require.NoError(t, err)
	slow.Store(true)
	start := time.Now()
	_, err = a.Append(buildBatch(t, 1, 10, 1)) // evicts b's dirty file
	require.NoError(t, err)
	require.Less(t, time.Since(start), slowSync/2, "an append to a waited for log b's fsync")
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // dirty again; evicts a's
	require.NoError(t, err)
	start = time.Now()
	_, err = a.Read(nil, 0, ReadOptions{}) // evicts b's dirty file
	require.NoError(t, err)
	require.Less(t, time.Since(start), slowSync/2, "a read of a waited for log b's fsync")
	require.NoError(t, b.Sync())
	require.Equal(t, b.LogEndOffset(), b.DurableOffset())
}
