package log

import (
	"fmt"
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

// The Manager waits at Close for the dirty files its cache evicted and
// fsyncs and closes in the background: no descriptor of its files stays
// open once Close returned.
func TestManagerCloseWaitsForBackgroundEvictionCloses(t *testing.T) {
	var slow atomic.Bool
	var open atomic.Int32
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if strings.HasSuffix(op.Path, logSuffix) && strings.HasPrefix(op.Path, "/data/") {
			switch op.Kind {
			case vfs.OpOpen:
				open.Add(1)
			case vfs.OpClose:
				if strings.Contains(op.Path, "/b/") && slow.CompareAndSwap(true, false) { // the evicted descriptor's
					time.Sleep(300 * time.Millisecond)
				}
				open.Add(-1)
			}
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager("/data", ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	a, err := m.Create("a")
	require.NoError(t, err)
	b, err := m.Create("b")
	require.NoError(t, err)
	_, err = a.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's dirty file
	require.NoError(t, err)
	m.files.waitClosed()
	slow.Store(true)
	_, err = a.Append(buildBatch(t, 1, 10, 1)) // evicts b's dirty file: fsynced and closed in the background, slowly
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.Equal(t, int32(0), open.Load(), "segment files still open after Manager.Close")
}

// A dirty file the cache evicted and fsynced is clean: reopened for a
// read, it is closed again without another fsync (it goes back on the
// idle list, not the dirty one).
func TestEvictionFsyncCountsAsSynced(t *testing.T) {
	var syncs atomic.Int32
	segA := "/data/a/" + segmentName(0) + logSuffix
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && op.Path == segA {
			syncs.Add(1)
		}
		return vfs.Fault{}
	}))
	m, logs := managerWithLogs(t, ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}, "a", "b")
	a, b := logs[0], logs[1]
	_, err := a.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's dirty file: fsynced
	require.NoError(t, err)
	m.files.waitClosed()
	require.Equal(t, int32(1), syncs.Load())
	_, err = a.Read(nil, 0, ReadOptions{}) // reopens a's file, evicts b's
	require.NoError(t, err)
	m.files.waitClosed()
	_, err = b.Read(nil, 0, ReadOptions{}) // reopens b's file, evicts a's: clean
	require.NoError(t, err)
	m.files.waitClosed()
	require.Equal(t, int32(1), syncs.Load(), "a's file, fsynced at its first eviction and only read since, was fsynced again")
}

// With the disk stalled, dirty files evicted for fsync in the background
// queue up to maxBackgroundCloses; the next evicting call fsyncs its file
// itself, so that the descriptors open stay bounded (MaxOpenFiles, the
// queue, the one closeLoop fsyncs and the one the stalled call fsyncs).
func TestBackgroundEvictionQueueIsBounded(t *testing.T) {
	release := make(chan struct{})
	var block atomic.Bool
	var open, blocked atomic.Int32
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if !strings.HasSuffix(op.Path, logSuffix) || !strings.HasPrefix(op.Path, "/data/") {
			return vfs.Fault{}
		}
		switch op.Kind {
		case vfs.OpOpen:
			open.Add(1)
		case vfs.OpClose:
			open.Add(-1)
		case vfs.OpSync:
			if block.Load() {
				blocked.Add(1)
				<-release
			}
		}
		return vfs.Fault{}
	}))
	const n = maxBackgroundCloses + 6
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("l%02d", i)
	}
	m, logs := managerWithLogs(t, ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}, names...)
	m.files.waitClosed()
	block.Store(true)
	var done atomic.Int32
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i, l := range logs {
			if i == 2 {
				// closeLoop took the first eviction off the queue.
				for blocked.Load() == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			if _, err := l.Append(buildBatch(t, 1, 10, 1)); err != nil {
				t.Error(err)
				return
			}
			done.Add(1)
		}
	}()
	// Wait for the appends to stall on the blocked fsyncs.
	for last := int32(-1); ; {
		time.Sleep(200 * time.Millisecond)
		if d := done.Load(); d == last {
			break
		} else {
			last = d
		}
	}
	stalledAt, fds := done.Load(), open.Load()
	close(release)
	<-finished
	require.Equal(t, int32(maxBackgroundCloses+2), stalledAt, "appends done before one had to fsync another log's evicted file itself")
	require.LessOrEqual(t, fds, int32(1+maxBackgroundCloses+2), "segment descriptors open with the disk stalled")
}
