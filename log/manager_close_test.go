package log

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerConcurrentCloseWaits: a second Close that ran while the first
// was still closing the logs returned nil at once, before the checkpoint
// and clean-shutdown files were written; a caller that reopened the data
// directory then raced the first Close's writes (the clean-shutdown file
// could land after the new Manager removed it, and make the next
// OpenManager trust logs the new Manager wrote). It now waits, as
// Log.Close does.
func TestManagerConcurrentCloseWaits(t *testing.T) {
	requireNoGoroutineLeak(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		// The first Close blocks in the log's final fsync.
		if op.Kind == vfs.OpSync && strings.Contains(op.Path, "/a/") && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: fs}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	l, err := m.Create("a")
	require.NoError(t, err)
	_, err = l.Append(testBatch(t, 1))
	require.NoError(t, err)

	armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- m.Close() }()
	<-entered // the first Close is closing log a

	second := make(chan error, 1)
	go func() { second <- m.Close() }()
	var returnedEarly bool
	select {
	case err := <-second:
		require.NoError(t, err)
		returnedEarly = true
	case <-time.After(200 * time.Millisecond):
	}
	// What a caller sees when its Close returned early: the clean-shutdown
	// file is not written yet.
	_, cleanWritten, _ := readNamed(fs, managerCleanShutdownFile)
	close(release)
	require.NoError(t, <-first)
	if !returnedEarly {
		require.NoError(t, <-second)
	}
	require.False(t, returnedEarly && !cleanWritten,
		"a concurrent Manager.Close returned nil while the first was still closing the logs (clean-shutdown file written: %v)", cleanWritten)
}

// TestManagerCloseWaitsForCreate: Close did not wait for a Create in
// progress (its name was only marked busy): it returned, with its
// scheduler stopped and its checkpoint and clean-shutdown files written,
// while the Create was still opening the new log in the data directory
// with files open in the Manager's cache; the Create then returned
// ErrClosed, but its directory stayed and the next OpenManager opened it.
// Close now waits for it, and closes the new log with the others.
func TestManagerCloseWaitsForCreate(t *testing.T) {
	requireNoGoroutineLeak(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		// Create's Open blocks in its last step: the log directory's fsync
		// after the first segment was created.
		if op.Kind == vfs.OpSyncDir && op.Path == mgrCrashDir+"/x" && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: fs}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	armed.Store(true)
	created := make(chan error, 1)
	go func() {
		_, err := m.Create("x")
		created <- err
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	var closeReturned bool
	select {
	case err := <-closed:
		require.NoError(t, err)
		closeReturned = true
	case <-time.After(200 * time.Millisecond):
	}
	openAfterClose := m.files.openFiles()
	close(release)
	cerr := <-created
	if !closeReturned {
		require.NoError(t, <-closed)
	}
	require.False(t, closeReturned,
		"Manager.Close returned while a Create was still opening a log (%d files open in the Manager's cache)", openAfterClose)
	require.NoError(t, cerr, "a Create that began before Close completes")
	require.Zero(t, m.files.openFiles(), "Close closed the new log too")
	_, err = m.Create("y")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, m.Delete("x"), ErrClosed)
	m, err = OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: fs}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"x"}, m.Names())
	require.NoError(t, m.Close())
}
