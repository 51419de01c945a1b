package log

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// Fault tests of truncation and retention: a filesystem operation of
// TruncateTo, TruncateFullyAndStartAt, DeleteRecordsBefore or
// ApplyRetention fails. The call must return an error and either leave
// the log as it was (every listed segment keeps its data file, appends
// and syncs go on) or fail the log (sticky: nothing later is
// acknowledged); and after Close and reopen, before and after a power
// loss, every synced batch the call did not mean to remove is readable at
// its offset (A1-A5).

// switchFault fails, while armed, the n-th operation (counted from 0)
// that match selects.
type switchFault struct {
	match func(op vfs.Op) bool
	n     int64
	err   error

	armed atomic.Bool
	count atomic.Int64
	hits  atomic.Int64
}

func (f *switchFault) Inject(op vfs.Op) vfs.Fault {
	if !f.armed.Load() || !f.match(op) {
		return vfs.Fault{}
	}
	if f.count.Add(1)-1 != f.n {
		return vfs.Fault{}
	}
	f.hits.Add(1)
	return vfs.Fault{Err: f.err}
}

// renameToDeleted matches the renames that take a segment's files out of
// the log.
func renameToDeleted(op vfs.Op) bool {
	return op.Kind == vfs.OpRename && strings.HasSuffix(op.NewPath, deletedSuffix)
}

func keepBatches(bs [][]byte, keep func(Batch) bool) [][]byte {
	var out [][]byte
	for _, b := range bs {
		if keep(b) {
			out = append(out, b)
		}
	}
	return out
}

func keepAll(Batch) bool  { return true }
func keepNone(Batch) bool { return false }

// keepBelow keeps the batches TruncateTo(off) leaves.
func keepBelow(off int64) func(Batch) bool {
	return func(b Batch) bool { return b.LastOffset() < off }
}

// keepFrom keeps the batches that hold offsets at or past off.
func keepFrom(off int64) func(Batch) bool {
	return func(b Batch) bool { return b.LastOffset() >= off }
}

// truncationFault runs call on a synced log of several segments while f
// is armed, and checks what RELIABILITY.md S7 asks of it (see the top of
// this file). call returns the batches it leaves if it succeeds or fails
// part way. It reports whether f failed an operation.
func truncationFault(t *testing.T, f *switchFault, call func(l *Log) (func(Batch) bool, error)) bool {
	t.Helper()
	mem := vfs.NewMem()
	opts := testLogOptions(vfs.NewErrorFS(mem, f))
	opts.FileDeleteDelay = time.Hour
	l, err := openCrashLog(t, crashDir, opts)
	require.NoError(t, err)
	acked := appendN(t, l, 150, 0)
	require.NoError(t, l.Sync())
	require.Greater(t, len(l.segments()), 4)
	waitRecoveryPoint(t, l)
	bases, leo := segmentBases(l), l.LogEndOffset()

	f.armed.Store(true)
	keep, err := call(l)
	f.armed.Store(false)
	if f.hits.Load() == 0 {
		require.NoError(t, err)
		require.NoError(t, l.Close())
		return false
	}
	desc := fmt.Sprintf("(fault at matching operation %d: %v)", f.n, err)
	require.Error(t, err, "the failed operation went unreported %s", desc)
	if l.Stats().Failed {
		// Sticky: nothing is acknowledged any more.
		require.ErrorIs(t, err, ErrSyncFailed, "%s", desc)
		_, aerr := l.Append(buildBatch(t, 1, 10, 0))
		require.ErrorIs(t, aerr, ErrSyncFailed, "append after a failed truncation %s", desc)
		require.ErrorIs(t, l.Sync(), ErrSyncFailed, "sync after a failed truncation %s", desc)
		require.Error(t, l.Close())
		acked = keepBatches(acked, keep)
	} else {
		// Unchanged: every segment is there, with its data file, and the
		// log goes on.
		require.Equal(t, bases, segmentBases(l), "segments changed by a failed call %s", desc)
		require.Equal(t, leo, l.LogEndOffset(), "log end moved by a failed call %s", desc)
		for _, s := range l.segments() {
			require.True(t, fileExists(mem, s.path(logSuffix)), "listed segment %d lost its data file %s", s.base, desc)
		}
		acked = keepBatches(acked, keepFrom(l.LogStartOffset()))
		st, err := tryReadState(l)
		require.NoError(t, err, "%s", desc)
		checkAcked(t, st, acked)
		b := buildBatch(t, 2, 50, 5000)
		_, err = l.Append(b)
		require.NoError(t, err, "append after a failed call that changed nothing %s", desc)
		require.NoError(t, l.Sync(), "sync after a failed call that changed nothing %s", desc)
		acked = append(acked, b)
		require.NoError(t, l.Close())
	}
	checkAfterFaults(t, mem, acked, desc)
	return true
}

// forEachFault runs truncationFault with the n-th matching operation
// failing, for n = 0, 1, ... until the call no longer reaches it. The call
// must reach at least one: a fault never injected tests nothing.
func forEachFault(t *testing.T, match func(vfs.Op) bool, call func(l *Log) (func(Batch) bool, error)) {
	for n := int64(0); ; n++ {
		require.Less(t, n, int64(200))
		hit := false
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			hit = truncationFault(t, &switchFault{match: match, n: n, err: syscall.EIO}, call)
		})
		if n == 0 {
			require.True(t, hit, "the call reached no matching operation")
		}
		if !hit || t.Failed() {
			return
		}
	}
}

// TestTruncateFullyCreateFails is the reviewer's case: the new segment's
// file cannot be created (disk full). Before the fix the old segments
// were renamed away first and stayed listed: appends and syncs went on
// into renamed files, which Close removed, losing synced data. Offsets
// that collide with a listed segment's base are covered too.
func TestTruncateFullyCreateFails(t *testing.T) {
	requireNoGoroutineLeak(t)
	for _, tc := range []struct {
		name string
		off  func(l *Log) int64
	}{
		{"past the end", func(*Log) int64 { return 1000 }},
		{"first segment's base", func(l *Log) int64 { return l.segments()[0].base }},
		{"a middle segment's base", func(l *Log) int64 { return l.segments()[2].base }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var name atomic.Value
			name.Store("none")
			f := &switchFault{err: syscall.ENOSPC, match: func(op vfs.Op) bool {
				return op.Kind == vfs.OpOpen && strings.Contains(op.Path, name.Load().(string)+logSuffix)
			}}
			truncationFault(t, f, func(l *Log) (func(Batch) bool, error) {
				name.Store(segmentName(tc.off(l)))
				return keepNone, l.TruncateFullyAndStartAt(tc.off(l))
			})
			require.NotZero(t, f.hits.Load(), "the create was not attempted")
		})
	}
}

// TestTruncateFullyAtListedBase: starting over at the base offset of a
// listed segment replaces that segment's file by an empty one.
func TestTruncateFullyAtListedBase(t *testing.T) {
	requireNoGoroutineLeak(t)
	for _, seg := range []int{0, 2} {
		mem := vfs.NewMem()
		l, err := openCrashLog(t, crashDir, testLogOptions(mem))
		require.NoError(t, err)
		appendN(t, l, 100, 0)
		require.NoError(t, l.Sync())
		off := l.segments()[seg].base
		require.NoError(t, l.TruncateFullyAndStartAt(off))
		require.Equal(t, []int64{off}, segmentBases(l))
		b := buildBatch(t, 2, 10, 0)
		_, err = l.Append(b)
		require.NoError(t, err)
		require.NoError(t, l.Sync())
		require.Equal(t, [][]byte{b}, readAllBatches(t, l))
		require.NoError(t, l.Close())
		for _, img := range []*vfs.MemFS{mem.CrashClone(vfs.CrashOptions{Seed: int64(seg), DirOpsPrefix: 0.5}), mem} {
			l, err := openCrashLog(t, crashDir, testLogOptions(img))
			require.NoError(t, err)
			require.Equal(t, off, l.LogStartOffset())
			require.Equal(t, [][]byte{b}, readAllBatches(t, l))
			require.NoError(t, l.Close())
		}
		checkAfterFaults(t, mem, [][]byte{b}, fmt.Sprintf("(start over at segment %d)", seg))
	}
}

// TestTruncateDeletionRenameFails fails each rename of a deleted
// segment's files in turn. Before the fix deleteLater renamed the data
// file first and left the segment listed without it when a later rename
// failed, and the call's error was not sticky.
func TestTruncateDeletionRenameFails(t *testing.T) {
	requireNoGoroutineLeak(t)
	t.Run("TruncateTo", func(t *testing.T) {
		forEachFault(t, renameToDeleted, func(l *Log) (func(Batch) bool, error) {
			off := l.segments()[1].base + 4
			return keepBelow(off), l.TruncateTo(off)
		})
	})
	t.Run("TruncateFullyAndStartAt", func(t *testing.T) {
		forEachFault(t, renameToDeleted, func(l *Log) (func(Batch) bool, error) {
			return keepNone, l.TruncateFullyAndStartAt(l.LogEndOffset() + 10)
		})
	})
}

// TestRetentionDeletionRenameFails is TestTruncateDeletionRenameFails for
// DeleteRecordsBefore and ApplyRetention.
func TestRetentionDeletionRenameFails(t *testing.T) {
	requireNoGoroutineLeak(t)
	t.Run("DeleteRecordsBefore", func(t *testing.T) {
		forEachFault(t, renameToDeleted, func(l *Log) (func(Batch) bool, error) {
			off := l.segments()[3].base + 4
			return keepFrom(off), l.DeleteRecordsBefore(off)
		})
	})
	t.Run("ApplyRetention", func(t *testing.T) {
		forEachFault(t, renameToDeleted, func(l *Log) (func(Batch) bool, error) {
			l.opts.RetentionBytes = l.active().size.Load() + 1 // keep the newest two segments
			_, err := l.ApplyRetention()
			return keepFrom(l.LogStartOffset()), err
		})
	})
}

// TestTruncateRecoveryPointWriteFails: the recovery point checkpoint that
// TruncateTo lowers cannot be written. The log fails, and TruncateTo must
// say so (it returned nil before the fix).
func TestTruncateRecoveryPointWriteFails(t *testing.T) {
	requireNoGoroutineLeak(t)
	f := &switchFault{err: syscall.EIO, match: func(op vfs.Op) bool {
		return op.Kind == vfs.OpOpen && strings.Contains(op.Path, recoveryPointFile)
	}}
	require.True(t, truncationFault(t, f, func(l *Log) (func(Batch) bool, error) {
		off := l.segments()[1].base + 4
		require.Greater(t, l.RecoveryPoint(), off)
		return keepBelow(off), l.TruncateTo(off)
	}))
}

// faultCall runs a truncation or retention call in a fault workload, as
// faultRun's appendOne and sync do: a failure is counted, and a sticky
// one makes the run reopen the log. call returns the batches it leaves
// if it succeeds or fails part way; the acknowledged and appended
// batches are cut to them.
func faultCall(r *faultRun, name string, call func(l *Log) (func(Batch) bool, error)) {
	if !r.open() {
		return
	}
	r.calls++
	keep, err := call(r.l)
	r.acked = keepBatches(r.acked, keep)
	r.appended = keepBatches(r.appended, keep)
	if err != nil {
		r.failed(name, err)
		r.reopenIfFailed(err)
	}
}

// truncationWorkload is the fault workload of TestFaultEveryOperation
// with truncation and retention: appends with periodic Syncs across
// several rolls, TruncateTo into the first segment, DeleteRecordsBefore,
// ApplyRetention, TruncateFullyAndStartAt, each followed by more appends,
// and a final Close.
func truncationWorkload(r *faultRun, mem *vfs.MemFS, inj vfs.Injector) *vfs.MemFS {
	r.fsys = vfs.NewErrorFS(mem, inj)
	appendSync := func(n int) {
		for i := 0; i < n; i++ {
			r.appendOne()
			if i%4 == 3 {
				r.sync()
			}
		}
	}
	appendSync(16)
	faultCall(r, "truncate", func(l *Log) (func(Batch) bool, error) {
		off := l.LogStartOffset() + (l.LogEndOffset()-l.LogStartOffset())/3 + 1
		return keepBelow(off), l.TruncateTo(off)
	})
	appendSync(12)
	faultCall(r, "delete records", func(l *Log) (func(Batch) bool, error) {
		off := l.LogStartOffset() + (l.LogEndOffset()-l.LogStartOffset())/2
		return keepFrom(off), l.DeleteRecordsBefore(off)
	})
	appendSync(12)
	faultCall(r, "retention", func(l *Log) (func(Batch) bool, error) {
		_, err := l.ApplyRetention()
		return keepFrom(l.LogStartOffset()), err
	})
	faultCall(r, "truncate fully", func(l *Log) (func(Batch) bool, error) {
		return keepNone, l.TruncateFullyAndStartAt(l.LogEndOffset() + 5)
	})
	appendSync(4)
	r.close()
	return mem
}

func truncationFaultOptions(fsys vfs.FS) Options {
	o := faultOptions(fsys)
	o.RetentionBytes = 2 << 10
	return o
}

// TestTruncationFaultEveryOperation is S7 for truncation and retention:
// an EIO at operation 0, 1, 2, ... of truncationWorkload. Every call
// returns nil or an error, Close stops the flusher, and A1-A5 hold
// afterwards for every acknowledged batch no call meant to remove.
func TestTruncationFaultEveryOperation(t *testing.T) {
	requireNoGoroutineLeak(t)
	clean := &faultRun{t: t, opts: truncationFaultOptions}
	counter := &nthFault{n: 1 << 62}
	truncationWorkload(clean, vfs.NewMem(), counter)
	require.Zero(t, clean.failures)
	faultLoop(t, 0, func(t *testing.T, n int64) *nthFault {
		inj := &nthFault{n: n, err: syscall.EIO}
		r := &faultRun{t: t, opts: truncationFaultOptions}
		r.onError = func(call string, err error) {
			if errors.Is(err, ErrOffsetOutOfRange) {
				require.Failf(t, "bad arguments", "%s: %v", call, err)
			}
		}
		mem := truncationWorkload(r, vfs.NewMem(), inj)
		checkAfterFaults(t, mem, r.acked, fmt.Sprintf("(EIO at operation %d of %d; %d of %d calls failed)", n, counter.count.Load(), r.failures, r.calls))
		return inj
	})
}

// crashAfterOps lets n operations pass once armed, then fails every later
// one with vfs.ErrCrashed, as a power loss at that point would.
type crashAfterOps struct {
	armed atomic.Bool
	n     int64
	count atomic.Int64
	hit   atomic.Bool
}

func (c *crashAfterOps) Inject(op vfs.Op) vfs.Fault {
	if !c.armed.Load() || c.count.Add(1)-1 < c.n {
		return vfs.Fault{}
	}
	c.hit.Store(true)
	return vfs.Fault{Err: vfs.ErrCrashed}
}

// TestTruncateToPowerLossAtEveryOperation: power is lost at operation 0,
// 1, 2, ... of a TruncateTo that deletes later segments and cuts one.
// After reopening the crash image the offsets are dense (A2: the later
// segments never come back behind the cut one) and every batch below the
// cut is there.
func TestTruncateToPowerLossAtEveryOperation(t *testing.T) {
	for k := int64(0); ; k++ {
		mem := vfs.NewMem()
		inj := &crashAfterOps{n: k}
		opts := testLogOptions(vfs.NewErrorFS(mem, inj))
		opts.CheckpointInterval = -1 // the recovery point follows each roll
		opts.FileDeleteDelay = time.Hour
		l, err := Open(crashDir, opts)
		require.NoError(t, err)
		for i := range 150 {
			_, err := l.Append(buildBatch(t, 3, 60, int64(i)*10))
			require.NoError(t, err)
		}
		require.NoError(t, l.Sync())
		waitRecoveryPoint(t, l)
		segs := l.segments()
		require.Greater(t, len(segs), 3)
		cut := segs[1].base + 3 // TruncateTo(base+5) removes the batch [base+3, base+6)
		inj.armed.Store(true)
		terr := l.TruncateTo(segs[1].base + 5)
		_ = l.Close()
		if !inj.hit.Load() {
			require.NoError(t, terr)
			require.Positive(t, k, "the truncation must do some operation")
			return
		}
		l2, err := Open(crashDir, testLogOptions(mem.CrashClone(vfs.CrashOptions{})))
		require.NoError(t, err, "power loss at operation %d", k)
		st, err := tryReadState(l2)
		require.NoError(t, err, "power loss at operation %d of the truncation", k)
		require.GreaterOrEqual(t, st.end, cut, "power loss at operation %d: a batch below the cut is gone", k)
		require.NoError(t, l2.Close())
	}
}

// TestSyncAfterTheFlushersDirectoryFsyncFailed: a Sync that waited for
// the flusher's directory fsync, which failed, reports the failure rather
// than retrying the fsync and acknowledging.
func TestSyncAfterTheFlushersDirectoryFsyncFailed(t *testing.T) {
	inj := &slowDirSyncFailure{dir: crashDir, delay: 200 * time.Millisecond, inFlight: make(chan struct{})}
	opts := testLogOptions(vfs.NewErrorFS(vfs.NewMem(), inj))
	opts.CheckpointInterval = -1
	l, err := Open(crashDir, opts)
	require.NoError(t, err)
	defer l.Close()
	segs := len(l.segments())
	inj.armed.Store(true)
	for len(l.segments()) == segs { // a roll: the flusher syncs the directory
		_, err := l.Append(buildBatch(t, 3, 60, 1000))
		require.NoError(t, err)
	}
	_, err = l.Append(buildBatch(t, 3, 60, 1000))
	require.NoError(t, err)
	select {
	case <-inj.inFlight:
	case <-time.After(hangGuard):
		t.Fatal("the flusher never synced the directory")
	}
	require.ErrorIs(t, l.Sync(), ErrSyncFailed)
}

// slowDirSyncFailure fails the first fsync of dir once armed, after a
// delay during which a Sync can come to wait for it.
type slowDirSyncFailure struct {
	armed    atomic.Bool
	fired    atomic.Bool
	dir      string
	delay    time.Duration
	inFlight chan struct{}
}

func (f *slowDirSyncFailure) Inject(op vfs.Op) vfs.Fault {
	if !f.armed.Load() || op.Kind != vfs.OpSyncDir || op.Path != f.dir || !f.fired.CompareAndSwap(false, true) {
		return vfs.Fault{}
	}
	close(f.inFlight)
	time.Sleep(f.delay)
	return vfs.Fault{Err: syscall.EIO}
}

// TestTruncateFullyAndStartAtCrashAtEveryOperation: the process dies, or
// power is lost with the directory's renames kept (as a journaling
// filesystem may keep them), at each filesystem operation of
// TruncateFullyAndStartAt(target), for targets below, at, inside and past
// the log. The reopened log must be the old one (less a prefix, as
// DeleteRecordsBefore leaves it) or the new one, empty at target; below
// the old log start, empty at an offset between target and that start
// (records below the start must not come back). The log start used to be
// checkpointed after every segment was deleted: a crash between left no
// segment, and Open restarted the log empty at the old log start, far
// below its end, handing the old offsets out again.
func TestTruncateFullyAndStartAtCrashAtEveryOperation(t *testing.T) {
	for _, target := range []int64{10, 30, 40, 300, 600, 100_000} {
		for _, model := range []struct {
			name string
			opts vfs.CrashOptions
		}{
			{"kill", vfs.CrashOptions{Kill: true}},
			{"powerloss-keepdirops", vfs.CrashOptions{KeepDirOps: 1}},
		} {
			t.Run(fmt.Sprint(model.name, target), func(t *testing.T) {
				bad := 0
				for k := int64(0); ; k++ {
					mem := vfs.NewMem()
					inj := &crashAfterOps{n: k}
					opts := testLogOptions(vfs.NewErrorFS(mem, inj))
					l, err := Open(crashDir, opts)
					require.NoError(t, err)
					var batches [][]byte
					for i := range 60 {
						b := buildBatch(t, 3, 60, int64(i)*10)
						_, err := l.Append(b)
						require.NoError(t, err)
						batches = append(batches, b)
					}
					require.NoError(t, l.Sync())
					require.NoError(t, l.DeleteRecordsBefore(30))
					oldStart, oldEnd := l.LogStartOffset(), l.LogEndOffset()
					inj.armed.Store(true)
					terr := l.TruncateFullyAndStartAt(target)
					_ = l.Close()
					if !inj.hit.Load() {
						require.NoError(t, terr)
						break
					}
					img := mem.CrashClone(model.opts)
					l2, err := Open(crashDir, testLogOptions(img))
					require.NoError(t, err, "crash at op %d", k)
					start, end := l2.LogStartOffset(), l2.LogEndOffset()
					// The old log, or part of its deletion (a prefix of the
					// segments gone, as retention leaves it), or the new one.
					old := end == oldEnd && start >= oldStart
					asked := start == target && end == target ||
						target < oldStart && start == end && start >= target && start <= oldStart
					if !old && !asked {
						bad++
						t.Errorf("crash at op %d of TruncateFullyAndStartAt(%d): log [%d, %d), neither the old [%d, %d) nor the new [%d, %d)",
							k, target, start, end, oldStart, oldEnd, target, target)
					}
					require.NoError(t, l2.Close())
				}
				if bad > 0 {
					t.Logf("%d crash points left a log that is neither", bad)
				}
			})
		}
	}
}

// TestCheckpointDirSyncFailureFailsTheLog: a failed directory fsync while
// TruncateFullyAndStartAt writes its new log start, before any segment
// went, left the log accepting writes: the old value was written back
// and trusted after a later directory fsync, which proves nothing after
// a failed one. It fails the log, as the same fault in DeleteRecordsBefore
// does.
func TestCheckpointDirSyncFailureFailsTheLog(t *testing.T) {
	for _, call := range []string{"TruncateFullyAndStartAt", "DeleteRecordsBefore"} {
		t.Run(call, func(t *testing.T) {
			var armed atomic.Bool
			efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				if op.Kind == vfs.OpSyncDir && armed.CompareAndSwap(true, false) {
					return vfs.Fault{Err: syscall.EIO}
				}
				return vfs.Fault{}
			}))
			l, err := Open(crashDir, testLogOptions(efs))
			require.NoError(t, err)
			defer l.Close()
			for i := range 10 {
				_, err := l.Append(buildBatch(t, 3, 60, int64(i)))
				require.NoError(t, err)
			}
			require.NoError(t, l.Sync())
			armed.Store(true)
			if call == "TruncateFullyAndStartAt" {
				err = l.TruncateFullyAndStartAt(100)
			} else {
				err = l.DeleteRecordsBefore(6)
			}
			require.ErrorIs(t, err, syscall.EIO)
			require.True(t, l.Stats().Failed, "a failed directory fsync left the log accepting writes")
		})
	}
}
