package log

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/testlog"
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

// managerWithLogs opens a Manager at /data with opts and creates the
// named logs; the cleanup closes it, ignoring its error (some tests fail
// logs on purpose).
func managerWithLogs(t *testing.T, opts ManagerOptions, names ...string) (*Manager, []*Log) {
	t.Helper()
	m, err := OpenManager("/data", opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	logs := make([]*Log, len(names))
	for i, name := range names {
		logs[i], err = m.Create(name)
		require.NoError(t, err)
	}
	return m, logs
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
	m, logs := managerWithLogs(t, opts, "a", "b")
	t.Cleanup(func() { require.NoError(t, m.Close()) }) // before managerWithLogs's
	a, b := logs[0], logs[1]
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

	_, err := a.Append(buildBatch(t, 2, 10, 1))
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
	m, logs := managerWithLogs(t, opts, "a")
	t.Cleanup(func() { require.NoError(t, m.Close()) }) // before managerWithLogs's
	a := logs[0]
	var err error
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

// TestGapRollFlushReopenFailureFailsTheLog: a follower's append across a
// gap rolls to a segment at the gap's far side, and the gap must lie
// below a written recovery point before anything is written after it.
// When the roll flush before that write could not reopen a file, the log
// stayed writable: the follower's retry found the new segment in place,
// wrote after the unprotected gap, and Sync reported it durable, though
// recovery after a crash took the gap for a lost tail and dropped it.
// The log now fails there, as it did before reopen failures were
// tolerated.
func TestGapRollFlushReopenFailureFailsTheLog(t *testing.T) {
	before, after := gapBatches(t)
	var suffix atomic.Pointer[string]
	var fails atomic.Int32
	var logged testlog.Buffer
	opts := ManagerOptions{Log: Options{FS: reopenFaultFS(&suffix, &fails), SegmentBytes: int64(len(concat(before...))),
		Logger: testlog.New(&logged)},
		MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	_, logs := managerWithLogs(t, opts, "p-0", "b")
	l, b := logs[0], logs[1]
	var err error
	seg := "/p-0/" + segmentName(0) + logSuffix
	suffix.Store(&seg)
	_, err = l.AppendAsFollower(concat(before...))
	require.NoError(t, err)
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts p-0's segment 0
	require.NoError(t, err)

	fails.Store(1 << 20)
	_, err = l.AppendAsFollower(after)
	fails.Store(0)
	require.ErrorIs(t, err, syscall.EMFILE)
	require.ErrorIs(t, err, ErrSyncFailed, "the gap is not below a written recovery point")
	_, err = l.AppendAsFollower(after)
	require.ErrorIs(t, err, ErrSyncFailed, "the retry wrote after the unprotected gap")

	// The failure wraps the reopen's, yet is sticky: the flusher, whose
	// roll flush stays pending, must not take it for a transient one and
	// retry it every second. (It did, warning each time. One warning may
	// come from a background flush that met the reopen failure itself
	// before the log failed.)
	require.False(t, isReopenError(err))
	time.Sleep(2500 * time.Millisecond)
	require.LessOrEqual(t, strings.Count(logged.String(), "retrying"), 1, logged.String())
}

// TestPermanentReopenFailureFailsTheLog: only a shortage of descriptors
// or memory counts as a transient reopen failure. A segment file that is
// gone (ENOENT), or a filesystem remounted read-only, was retried every
// second for good, with a warning each time, and the log never failed.
func TestPermanentReopenFailureFailsTheLog(t *testing.T) {
	var gone atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if gone.Load() && op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, "/a/"+segmentName(0)+logSuffix) {
			return vfs.Fault{Err: syscall.ENOENT}
		}
		return vfs.Fault{}
	}))
	opts := ManagerOptions{Log: Options{FS: fs, SegmentBytes: 1 << 10}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	_, logs := managerWithLogs(t, opts, "a")
	a := logs[0]
	var err error
	gone.Store(true)
	for len(a.segments()) < 2 {
		_, err = a.Append(buildBatch(t, 1, 300, 1))
		require.NoError(t, err)
	}
	// The roll flush reopens segment 0, evicted by the new segment.
	deadline := time.Now().Add(10 * time.Second)
	for a.failedErr() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.ErrorIs(t, a.Sync(), ErrSyncFailed)
	require.ErrorIs(t, a.Sync(), syscall.ENOENT)
}

// TestAppendOvertakenByCloseWithoutItsFsync: an append with
// SyncEveryAppend whose Sync a Close overtakes waits for Close, and
// returned nil "since Close's fsync made its batches durable". When
// Close could not run that fsync, because the Manager's file cache could
// not reopen the segment (EMFILE, which no longer fails the log), Close
// returned that error and wrote no marker, yet the append returned nil:
// acknowledged as durable with no fsync behind it (found by a review).
// It now returns ErrClosed.
func TestAppendOvertakenByCloseWithoutItsFsync(t *testing.T) {
	seg := "/data/a/" + segmentName(0) + logSuffix
	var failOpen, blockDirSync atomic.Bool
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		switch {
		case op.Kind == vfs.OpOpen && failOpen.Load() && strings.HasSuffix(op.Path, seg[len("/data"):]):
			return vfs.Fault{Err: syscall.EMFILE}
		case op.Kind == vfs.OpSyncDir && strings.HasSuffix(op.Path, "/a") && blockDirSync.CompareAndSwap(true, false):
			entered <- struct{}{}
			<-release
		}
		return vfs.Fault{}
	}))
	opts := ManagerOptions{Log: Options{FS: fs, SyncEveryAppend: true}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	m, logs := managerWithLogs(t, opts, "a", "b")
	a, b := logs[0], logs[1]
	_, err := a.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)

	// Y1: an append whose Sync is held in the directory fsync (as after
	// a roll), so that the next append's Sync waits for it.
	a.dirDirty.Store(true)
	blockDirSync.Store(true)
	y1 := make(chan error, 1)
	go func() { _, err := a.Append(buildBatch(t, 1, 10, 1)); y1 <- err }()
	<-entered
	// Y2: written, its Sync waiting behind Y1's.
	y2 := make(chan error, 1)
	go func() { _, err := a.Append(buildBatch(t, 1, 10, 1)); y2 <- err }()
	require.Eventually(t, func() bool { return a.LogEndOffset() == 3 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // Y2 is in its Sync's wait

	// a's segment file is evicted, and cannot be reopened for now.
	_, err = b.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)
	m.files.mu.Lock()
	evicted := a.active().file.(*cachedFile).f == nil
	m.files.mu.Unlock()
	require.True(t, evicted)
	failOpen.Store(true)

	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	require.NoError(t, <-y1)
	cerr := <-closed
	require.ErrorIs(t, cerr, syscall.EMFILE, "Close could not fsync Y2's batch")
	require.Less(t, a.DurableOffset(), int64(3), "Y2's batch is not durable")
	err = <-y2
	require.ErrorIs(t, err, ErrClosed, "the append was acknowledged as durable although Close's fsync never ran")
}

// TestSyncEveryMessagesOwedAfterAReopenFailure: an append that reached
// SyncEveryMessages reset the count before its fsync; when that fsync
// could not run (a reopen failure, which leaves the log usable), the
// count stayed reset, and the records went unsynced until as many more
// came. The next append now fsyncs.
func TestSyncEveryMessagesOwedAfterAReopenFailure(t *testing.T) {
	var suffix atomic.Pointer[string]
	var fails atomic.Int32
	var blockDirSync atomic.Bool
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	efs := vfs.NewErrorFS(reopenFaultFS(&suffix, &fails), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSyncDir && strings.HasSuffix(op.Path, "/a") && blockDirSync.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-release
		}
		return vfs.Fault{}
	}))
	opts := ManagerOptions{Log: Options{FS: efs, SyncEveryMessages: 2}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	m, logs := managerWithLogs(t, opts, "a", "b")
	t.Cleanup(func() { require.NoError(t, m.Close()) }) // before managerWithLogs's
	a, b := logs[0], logs[1]
	seg := "/a/" + segmentName(0) + logSuffix
	suffix.Store(&seg)
	_, err := a.Append(buildBatch(t, 1, 10, 1)) // counted, not synced
	require.NoError(t, err)

	// A Sync held in its directory fsync, so that the next append's
	// fsync waits for it and runs after the file was evicted.
	a.dirDirty.Store(true)
	blockDirSync.Store(true)
	synced := make(chan error, 1)
	go func() { synced <- a.Sync() }()
	<-entered
	appended := make(chan error, 1)
	go func() { _, err := a.Append(buildBatch(t, 1, 10, 1)); appended <- err }() // reaches the count
	require.Eventually(t, func() bool { return a.LogEndOffset() == 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)          // its Sync waits for the held one
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's segment file
	require.NoError(t, err)
	fails.Store(1)
	close(release)
	require.NoError(t, <-synced)
	require.ErrorIs(t, <-appended, syscall.EMFILE)
	require.Less(t, a.DurableOffset(), int64(2))

	_, err = a.Append(buildBatch(t, 1, 10, 1))
	require.NoError(t, err)
	require.Equal(t, int64(3), a.DurableOffset(), "the append after the failed fsync did not fsync")
}

// The durability contract names EMFILE, ENFILE and ENOMEM as the reopen
// failures that fail only the call, not the log; only EMFILE was tested.
func TestReopenENFILEAndENOMEMAreTransient(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENFILE, syscall.ENOMEM} {
		t.Run(errno.Error(), func(t *testing.T) {
			var fails atomic.Int32
			seg := "/a/" + segmentName(0) + logSuffix
			fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				if op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, seg) && fails.Add(-1) >= 0 {
					return vfs.Fault{Err: errno}
				}
				return vfs.Fault{}
			}))
			opts := ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
			m, logs := managerWithLogs(t, opts, "a", "b")
			a, b := logs[0], logs[1]
			_, err := a.Append(buildBatch(t, 2, 10, 1))
			require.NoError(t, err)
			_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's file
			require.NoError(t, err)
			m.files.mu.Lock()
			evicted := a.active().file.(*cachedFile).f == nil
			m.files.mu.Unlock()
			require.True(t, evicted)
			fails.Store(1)
			err = a.Sync()
			require.ErrorIs(t, err, errno)
			require.NotErrorIs(t, err, ErrSyncFailed, "a reopen failure for want of descriptors or memory failed the log")
			require.False(t, a.Stats().Failed)
			require.NoError(t, a.Sync(), "the file opens again")
			require.Equal(t, int64(2), a.DurableOffset())
		})
	}
}

// A roll flush whose index (or snapshot) file could not be opened for
// want of descriptors failed the log for good: the open wrote nothing,
// and the flush is now tried again later, as when its segment file could
// not be reopened.
func TestRollFlushRetriesAnIndexOpenUnderEMFILE(t *testing.T) {
	var on atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if on.Load() && op.Kind == vfs.OpOpen && strings.HasPrefix(op.Path, "/data/e/") &&
			(strings.HasSuffix(op.Path, indexSuffix) || strings.Contains(op.Path, snapshotSuffix)) {
			return vfs.Fault{Err: syscall.EMFILE}
		}
		return vfs.Fault{}
	}))
	opts := ManagerOptions{Log: Options{FS: fs, SegmentBytes: 1 << 10, IndexIntervalBytes: 256}, MaxOpenFiles: 4, CheckpointInterval: time.Hour}
	_, logs := managerWithLogs(t, opts, "e")
	l := logs[0]
	on.Store(true)
	for l.Stats().Rolls < 3 {
		_, err := l.Append(buildBatch(t, 2, 100, 1))
		require.NoError(t, err)
	}
	err := l.bg.flushRolled() // what the flusher runs, now or a second later
	require.ErrorIs(t, err, syscall.EMFILE, "the roll flush cannot open the index files")
	require.False(t, l.Stats().Failed)
	_, err = l.Append(buildBatch(t, 2, 100, 1))
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	on.Store(false)
	require.NoError(t, l.bg.flushRolled(), "the flush is tried again")
	require.Equal(t, l.active().base, l.RecoveryPoint())
}

// emfileOn fails with EMFILE every open of an index, time index or
// snapshot file (or a snapshot's temporary) while on is set.
func emfileOn(inner vfs.FS, on *atomic.Bool, snapshotsOnly bool) *vfs.ErrorFS {
	return vfs.NewErrorFS(inner, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if !on.Load() || op.Kind != vfs.OpOpen {
			return vfs.Fault{}
		}
		idx := strings.HasSuffix(op.Path, indexSuffix) || strings.HasSuffix(op.Path, timeIndexSuffix)
		snap := strings.Contains(op.Path, snapshotSuffix)
		if snap || (idx && !snapshotsOnly) {
			return vfs.Fault{Err: syscall.EMFILE}
		}
		return vfs.Fault{}
	}))
}

// The snapshot half of a roll flush retried after an open under EMFILE:
// the recovery point stays until the snapshot is written, and a crash
// after the retry recovers the log and its producer state.
func TestRollFlushRetriesASnapshotOpenUnderEMFILE(t *testing.T) {
	mem := vfs.NewMem()
	var on atomic.Bool
	fs := emfileOn(mem, &on, true)
	opts := Options{FS: fs, SegmentBytes: 1 << 10, IndexIntervalBytes: 128, ProducerIDExpiration: neverExpire}
	l, err := Open("/c", opts)
	require.NoError(t, err)
	defer l.Close()
	seq := int32(0)
	var sent [][]byte
	on.Store(true)
	for l.Stats().Rolls < 3 {
		b := idemBatch(t, 9, 0, seq, 3, 1000+int64(seq))
		_, err := l.Append(b)
		require.NoError(t, err)
		sent = append(sent, b)
		seq += 3
	}
	rp := l.RecoveryPoint()
	err = l.bg.flushRolled()
	require.ErrorIs(t, err, syscall.EMFILE)
	require.False(t, l.Stats().Failed)
	require.Equal(t, rp, l.RecoveryPoint(), "recovery point moved past a segment whose snapshot was not written")
	on.Store(false)
	require.NoError(t, l.bg.flushRolled())
	require.Equal(t, l.active().base, l.RecoveryPoint())
	_, err = mem.Stat(l.snapshotPath(l.RecoveryPoint()))
	require.NoError(t, err, "no snapshot at the recovery point")
	require.NoError(t, l.Sync())
	img := mem.CrashClone(vfs.CrashOptions{Seed: 1})
	opts.FS = img
	l2, err := Open("/c", opts)
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, len(sent), len(readAllBatches(t, l2)))
	_, err = l2.Append(idemBatch(t, 9, 0, seq, 3, 5000))
	require.NoError(t, err)
}
