package log

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestAppendSyncedByCloseIsNotReportedClosed: with SyncEveryAppend, an
// Append whose batch is written when a Close begins used to return
// ErrClosed from its fsync, though Close then fsynced the batch and a
// reopen found it: a caller reading ErrClosed as "refused" and retrying
// stored the records twice. It now waits for Close and returns nil (or
// ErrSyncFailed had Close's fsync failed). The first append's fsync is
// held while the second append waits behind it and Close begins.
func TestAppendSyncedByCloseIsNotReportedClosed(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	h := &syncHookFS{FS: mem, beforeSync: func(name string) {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	}}
	opts := crashOptions(h)
	opts.SyncEveryAppend = true
	l, err := Open(crashDir, opts)
	require.NoError(t, err)

	b0, b1 := testBatch(t, 0), testBatch(t, 1)
	firstEnd := int64(Batch(b0).LastOffsetDelta()) + 1
	bothEnd := firstEnd + int64(Batch(b1).LastOffsetDelta()) + 1
	armed.Store(true)
	firstDone := make(chan error, 1)
	go func() { _, err := l.Append(b0); firstDone <- err }()
	<-entered // the first append's fsync is in progress
	secondDone := make(chan error, 1)
	go func() { _, err := l.Append(b1); secondDone <- err }()
	require.Eventually(t, func() bool { return l.LogEndOffset() == bothEnd }, 5*time.Second, time.Millisecond)
	closeDone := make(chan error, 1)
	go func() { closeDone <- l.Close() }()
	require.Eventually(t, l.closed.Load, 5*time.Second, time.Millisecond)
	close(release)

	require.NoError(t, <-firstDone)
	secondErr := <-secondDone
	require.NoError(t, <-closeDone)
	l2, err := Open(crashDir, opts)
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, bothEnd, l2.LogEndOffset(), "the second batch is in the log")
	require.False(t, errors.Is(secondErr, ErrClosed), "Append returned %v, yet its batch is in the log after reopen", secondErr)
	require.NoError(t, secondErr)
}
