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

// TestNegativeLeaderEpochIsRefused: BeginLeaderEpoch and AppendAsLeader
// accepted a leader epoch below NoLeaderEpoch (-1) and, in an empty epoch
// cache, recorded and persisted it (assignEpoch only skipped
// NoLeaderEpoch). loadEpochs rejects a negative epoch as corrupt, so the
// next Open failed with ErrCorrupt: bad input made the log unopenable.
func TestNegativeLeaderEpochIsRefused(t *testing.T) {
	requireNoGoroutineLeak(t)
	for _, tc := range []struct {
		name string
		call func(l *Log) error
	}{
		{"BeginLeaderEpoch", func(l *Log) error { return l.BeginLeaderEpoch(-2) }},
		{"AppendAsLeader", func(l *Log) error {
			_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 0), -7)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			err := tc.call(l)
			if err == nil {
				// Accepted: then it must survive a reopen.
				require.NoError(t, l.Close())
				l2, err := Open("/log", opts)
				require.NoError(t, err, "the log cannot be opened again after %s with a negative epoch", tc.name)
				require.NoError(t, l2.Close())
				return
			}
			// Refused: with a typed error, and nothing changed.
			require.ErrorIs(t, err, ErrInvalidRecord)
			require.Empty(t, l.LeaderEpochs())
		})
	}
}

// TestFailedAppendLeavesNoEpoch: a leader append at a new epoch whose
// write failed (ENOSPC, not sticky) left the epoch it had recorded
// (assignBatchEpochs runs before maybeRoll and writeToActive), though a
// rejected append changes nothing: LatestEpoch and EndOffsetForEpoch
// reported an epoch that wrote no record, and a Close+Open (loadEpochs
// drops entries at the log end) gave other epochs than before it.
func TestFailedAppendLeavesNoEpoch(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 0)
	opts := testLogOptions(efs)
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1)
	require.NoError(t, err)
	before := l.LeaderEpochs()

	armed.Store(true)
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 5)
	require.Error(t, err)
	require.False(t, l.Stats().Failed, "a failed write is not sticky")
	require.Equal(t, int64(2), l.LogEndOffset(), "nothing appended")
	require.Equal(t, before, l.LeaderEpochs(), "a failed append recorded a leader epoch")
	require.Equal(t, int32(1), l.LatestEpoch())

	live := l.LeaderEpochs()
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, live, l.LeaderEpochs(), "leader epochs after Close+Open")
}

// TestStaleLeaderEpochIsRefused: AppendAsLeader at an epoch older than
// the log's latest wrote batches stamped with it that the epoch cache did
// not show (EpochAt answered the newer epoch for them), and a follower
// copying them was refused. It is now refused, changing nothing.
func TestStaleLeaderEpochIsRefused(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 1000), 3)
	require.NoError(t, err)
	leo := l.LogEndOffset()
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 1000), 2)
	require.ErrorIs(t, err, ErrInvalidRecord)
	require.Equal(t, leo, l.LogEndOffset(), "nothing appended")
	require.Equal(t, []EpochEntry{{Epoch: 3, StartOffset: 0}}, l.LeaderEpochs())
	_, err = l.Append(buildBatch(t, 2, 10, 1000)) // NoLeaderEpoch: a log used without epochs
	require.NoError(t, err)
}

// TestFailedAppendEpochStaysGoneAfterLaterAppends: a leader append at a
// new epoch writes the epoch's entry to the checkpoint file before its
// data; when the write failed (ENOSPC, which does not fail the log), the
// entry was taken out of memory but stayed in the file, where Open would
// drop it only while it was at the log end. Once a later append at the
// older epoch moved the log end past it (which changes no entry, so the
// file was not rewritten), the next Open loaded an epoch that wrote no
// record.
func TestFailedAppendEpochStaysGoneAfterLaterAppends(t *testing.T) {
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 0)
	opts := testLogOptions(efs)
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1)
	require.NoError(t, err)

	armed.Store(true)
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 5)
	require.Error(t, err)
	require.False(t, l.Stats().Failed)

	// The same leader (epoch 1) appends again: accepted, offsets 2..3.
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1)
	require.NoError(t, err)
	live := l.LeaderEpochs()
	require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: 0}}, live)
	require.Equal(t, int32(1), l.EpochAt(3))

	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, live, l.LeaderEpochs(), "leader epochs after Close+Open: an epoch that wrote no record came back")
	e, end := l.EndOffsetForEpoch(1)
	require.Equal(t, int32(1), e)
	require.Equal(t, l.LogEndOffset(), end, "EndOffsetForEpoch(1) after reopen")
}

// TestFailedFollowerAppendEpochStaysGone is the follower's case: a
// fetched batch of epoch 5 fails to append (ENOSPC), the follower then
// copies another leader's batches of epoch 1 at the same offsets (KIP-101
// divergence), and a restart brought back epoch 5 at an offset that holds
// epoch-1 batches.
func TestFailedFollowerAppendEpochStaysGone(t *testing.T) {
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 0)
	opts := testLogOptions(efs)
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 2, 1))
	require.NoError(t, err)
	armed.Store(true)
	_, err = l.AppendAsFollower(followerBatch(t, 2, 2, 5))
	require.Error(t, err)
	require.False(t, l.Stats().Failed)
	_, err = l.AppendAsFollower(followerBatch(t, 2, 3, 1))
	require.NoError(t, err)
	require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: 0}}, l.LeaderEpochs())

	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, int32(1), l.EpochAt(3), "EpochAt(3) after reopen: offset 3 was written in epoch 1")
}

// TestNewEpochAppendUnderEMFILEKeepsTheLog: ManagerOptions.MaxOpenFiles
// says a reopen that fails for want of descriptors (EMFILE) fails that
// append only, not the log. An append at a new leader epoch writes the
// epoch checkpoint, then its data write's reopen of the evicted segment
// file fails with EMFILE; rewriting the checkpoint without the epoch
// failed with EMFILE too, and failed the log. The rewrite is now left to
// the next append.
func TestNewEpochAppendUnderEMFILEKeepsTheLog(t *testing.T) {
	var full atomic.Bool  // the descriptor table is full
	var armed atomic.Bool // the next epoch checkpoint written fills the table
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpRename && strings.HasSuffix(op.Path, "/a/"+leaderEpochFile+tmpSuffix) && armed.CompareAndSwap(true, false) {
			full.Store(true) // from right after it, opens fail
			return vfs.Fault{}
		}
		if op.Kind == vfs.OpOpen && strings.Contains(op.Path, "/a/") && full.Load() {
			return vfs.Fault{Err: syscall.EMFILE}
		}
		return vfs.Fault{}
	}))
	opts := ManagerOptions{Log: Options{FS: fs}, MaxOpenFiles: 1, CheckpointInterval: time.Hour}
	m, logs := managerWithLogs(t, opts, "a", "b")
	a, b := logs[0], logs[1]
	_, err := a.AppendAsLeader(buildBatch(t, 2, 10, 1), 1)
	require.NoError(t, err)
	_, err = b.Append(buildBatch(t, 1, 10, 1)) // evicts a's segment file
	require.NoError(t, err)
	m.files.mu.Lock()
	evicted := a.active().file.(*cachedFile).f == nil
	m.files.mu.Unlock()
	require.True(t, evicted)

	armed.Store(true)
	_, err = a.AppendAsLeader(buildBatch(t, 2, 10, 1), 2) // new epoch 2
	t.Logf("append at epoch 2: %v", err)
	require.Error(t, err)
	require.ErrorIs(t, err, syscall.EMFILE)
	full.Store(false) // descriptors are free again
	require.False(t, a.Stats().Failed, "a transient EMFILE failed the log: %v", err)
	_, err = a.AppendAsLeader(buildBatch(t, 2, 10, 1), 2)
	require.NoError(t, err, "the retry once descriptors are free")
}

// TestFailedCutKeepsTheEpochOfAWrittenBatch: an append at a new leader
// epoch (2) of two batches writes the first whole and fails (ENOSPC,
// short write); its truncation back fails too (EIO), so the log fails,
// with the whole first batch past the segment's size for recovery to
// judge. The failed append's epoch was still taken out of the checkpoint
// file: the reopened log recovered the batch written in epoch 2 without
// epoch 2, and EpochAt answered 1. A failed log now keeps it.
func TestFailedCutKeepsTheEpochOfAWrittenBatch(t *testing.T) {
	mem := vfs.NewMem()
	var armed atomic.Bool
	var firstLen atomic.Int64
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if !armed.Load() || !strings.HasSuffix(op.Path, logSuffix) {
			return vfs.Fault{}
		}
		switch op.Kind {
		case vfs.OpWrite:
			return vfs.Fault{Err: syscall.ENOSPC, Written: int(firstLen.Load())}
		case vfs.OpTruncate:
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	opts := testLogOptions(efs)
	l, err := Open(crashDir, opts)
	require.NoError(t, err)
	_, err = l.AppendAsLeader(buildBatch(t, 2, 10, 0), 1) // 0..1, epoch 1
	require.NoError(t, err)
	b1, b2 := buildBatch(t, 2, 10, 0), buildBatch(t, 2, 10, 0)
	firstLen.Store(int64(len(b1)))
	armed.Store(true)
	_, err = l.AppendAsLeader(concat(b1, b2), 2) // 2..3 and 4..5, epoch 2
	armed.Store(false)
	t.Logf("append: %v", err)
	require.Error(t, err)
	require.True(t, l.Stats().Failed)
	_ = l.Close()

	l2, err := Open(crashDir, testLogOptions(mem.CrashClone(vfs.CrashOptions{Kill: true})))
	require.NoError(t, err)
	defer l2.Close()
	t.Logf("reopened: log end %d, epochs %v", l2.LogEndOffset(), l2.LeaderEpochs())
	if l2.LogEndOffset() > 2 {
		rb, err := l2.Read(nil, 2, ReadOptions{})
		require.NoError(t, err)
		b, _, err := SplitBatch(rb)
		require.NoError(t, err)
		require.Equal(t, int32(2), b.LeaderEpoch(), "the recovered batch at 2 says epoch 2")
		require.Equal(t, int32(2), l2.EpochAt(2), "EpochAt(2): the batch there was written in epoch 2; epochs %v", l2.LeaderEpochs())
	}
}

// TestEpochsLeftUnsavedAreSavedBeforeTheNextAppend: when the checkpoint
// file cannot be rewritten after a failed append at a new epoch (the disk
// full for both), the next append rewrites it before it writes, and
// fails, changing nothing and not failing the log, while it still cannot:
// the failed append's epoch must never lie below the log end in the file,
// where a reopen would believe it.
func TestEpochsLeftUnsavedAreSavedBeforeTheNextAppend(t *testing.T) {
	mem := vfs.NewMem()
	l, diskFull := openWithUnsavedEpoch(t, mem, true, nil)
	_, err := l.AppendAsFollower(followerBatch(t, 2, 3, 1)) // another leader's epoch-1 batches
	require.ErrorIs(t, err, syscall.ENOSPC, "appended past an epoch entry the file may still hold")
	require.Equal(t, int64(2), l.LogEndOffset())
	require.False(t, l.Stats().Failed)

	diskFull.Store(false)
	_, err = l.AppendAsFollower(followerBatch(t, 2, 3, 1))
	require.NoError(t, err)
	img := mem.CrashClone(vfs.CrashOptions{Kill: true})
	require.NoError(t, l.Close())
	for name, fs := range map[string]vfs.FS{"after a crash": img, "after Close": mem} {
		l2, err := Open(crashDir, testLogOptions(fs))
		require.NoError(t, err, name)
		require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: 0}}, l2.LeaderEpochs(), name)
		require.NoError(t, l2.Close())
	}
}

// openWithUnsavedEpoch opens a log on an ErrorFS over mem and writes
// epoch 1 at 0..1; with unsaved, a follower append at epoch 5 follows
// whose data write fails (ENOSPC), filling the disk so that the rewrite of
// the epoch file fails too: the file keeps [1@0 5@2] while memory holds
// [1@0] (epochsUnsaved). The disk stays full until the returned flag is
// cleared. crash, if not nil, is consulted for every operation.
func openWithUnsavedEpoch(t *testing.T, mem *vfs.MemFS, unsaved bool, crash *crashAfterOps) (*Log, *atomic.Bool) {
	var failWrite, diskFull atomic.Bool
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		switch {
		case op.Kind == vfs.OpWrite && strings.HasSuffix(op.Path, logSuffix) && failWrite.CompareAndSwap(true, false):
			diskFull.Store(true)
			return vfs.Fault{Err: syscall.ENOSPC}
		case op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, leaderEpochFile+tmpSuffix) && diskFull.Load():
			return vfs.Fault{Err: syscall.ENOSPC}
		}
		if crash != nil {
			return crash.Inject(op)
		}
		return vfs.Fault{}
	}))
	l, err := Open(crashDir, testLogOptions(efs))
	require.NoError(t, err)
	_, err = l.AppendAsFollower(followerBatch(t, 0, 2, 1))
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	if unsaved {
		failWrite.Store(true)
		_, err = l.AppendAsFollower(followerBatch(t, 2, 2, 5)) // epoch 5 saved, its data not written, nor the file rewritten
		require.ErrorIs(t, err, syscall.ENOSPC)
		require.False(t, l.Stats().Failed)
		require.True(t, l.epochsUnsaved.Load())
	}
	require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: 0}}, l.LeaderEpochs())
	return l, &diskFull
}

// TestTruncateFullyAfterAnUnsavedEpochCrash: with the epoch file still
// holding a failed append's entry 5@2 (epochsUnsaved),
// TruncateFullyAndStartAt(100) moved the log end past 2 on disk before it
// rewrote the file: a crash in between reopened the log empty at 100 with
// epoch 5 moved there, an epoch that never wrote to this log as its
// latest. It now rewrites the file first. The control (no failed append)
// never had epoch 5.
func TestTruncateFullyAfterAnUnsavedEpochCrash(t *testing.T) {
	for _, unsaved := range []bool{false, true} {
		bad := 0
		for k := int64(0); ; k++ {
			mem := vfs.NewMem()
			crash := &crashAfterOps{n: k}
			l, diskFull := openWithUnsavedEpoch(t, mem, unsaved, crash)
			diskFull.Store(false)
			crash.armed.Store(true)
			terr := l.TruncateFullyAndStartAt(100)
			_ = l.Close()
			if !crash.hit.Load() {
				require.NoError(t, terr)
				break
			}
			img := mem.CrashClone(vfs.CrashOptions{Kill: true})
			l2, err := Open(crashDir, testLogOptions(img))
			require.NoError(t, err, "crash at op %d", k)
			eps := l2.LeaderEpochs()
			for _, e := range eps {
				if e.Epoch == 5 {
					bad++
					t.Errorf("unsaved=%v crash at op %d of TruncateFullyAndStartAt(100): reopened [%d, %d) with epochs %v, LatestEpoch %d: epoch 5 wrote nothing",
						unsaved, k, l2.LogStartOffset(), l2.LogEndOffset(), eps, l2.LatestEpoch())
				}
			}
			require.NoError(t, l2.Close())
		}
		t.Logf("unsaved=%v: %d crash points load epoch 5", unsaved, bad)
	}
}

// dirOpenEMFILEFS behaves as vfs.Default's SyncDir does when the process
// is out of descriptors: os.Open(dir) fails with EMFILE before any fsync
// runs (vfs.go osFS.SyncDir). ErrorFS cannot inject that (its SyncDir is
// one OpSyncDir), so the wrapper returns the *os.PathError osFS returns.
type dirOpenEMFILEFS struct {
	vfs.FS
	failDirOpen *atomic.Bool
}

func (f dirOpenEMFILEFS) SyncDir(dir string) error {
	if f.failDirOpen.CompareAndSwap(true, false) {
		return &os.PathError{Op: "open", Path: dir, Err: syscall.EMFILE}
	}
	return f.FS.SyncDir(dir)
}

// TestEpochRewriteDirSyncFailure: the rewrite of the epoch file after a
// failed append fails at its directory fsync.
//   - EIO: it only marked the epochs unsaved, and the next append's
//     rewrite was trusted, though a later directory fsync proves nothing
//     after a failed one. It fails the log, as a failed epoch-file write
//     elsewhere does.
//   - EMFILE opening the directory: no fsync ran, yet that was taken for
//     a failed one and failed the log for good, where a descriptor
//     shortage must fail that append only.
func TestEpochRewriteDirSyncFailure(t *testing.T) {
	for _, eio := range []bool{true, false} {
		t.Run(map[bool]string{true: "EIO", false: "EMFILE"}[eio], func(t *testing.T) {
			var failWrite, failDirSync, failDirOpen atomic.Bool
			efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				switch {
				case op.Kind == vfs.OpWrite && strings.HasSuffix(op.Path, logSuffix) && failWrite.CompareAndSwap(true, false):
					// The restore's directory fsync fails next.
					failDirSync.Store(eio)
					failDirOpen.Store(!eio)
					return vfs.Fault{Err: syscall.ENOSPC}
				case op.Kind == vfs.OpSyncDir && failDirSync.CompareAndSwap(true, false):
					return vfs.Fault{Err: syscall.EIO}
				}
				return vfs.Fault{}
			}))
			l, err := Open(crashDir, testLogOptions(dirOpenEMFILEFS{FS: efs, failDirOpen: &failDirOpen}))
			require.NoError(t, err)
			defer l.Close()
			_, err = l.AppendAsFollower(followerBatch(t, 0, 2, 1))
			require.NoError(t, err)
			failWrite.Store(true)
			_, err = l.AppendAsFollower(followerBatch(t, 2, 2, 5))
			require.ErrorIs(t, err, syscall.ENOSPC)
			_, next := l.AppendAsFollower(followerBatch(t, 2, 3, 1))
			if eio {
				require.True(t, l.Stats().Failed, "a failed directory fsync of the epoch file's rewrite left the log accepting writes")
				require.ErrorIs(t, next, ErrSyncFailed)
				return
			}
			require.False(t, l.Stats().Failed, "EMFILE opening the directory (no fsync ran) failed the log: %v", l.failedErr())
			require.NoError(t, next, "the next append once a descriptor is free")
		})
	}
}

// Once the append after a failed one rewrote the leader-epoch file
// (epochsUnsaved), later appends no longer rewrite it: with the file's
// temporary unwritable again (a full disk), appends of the epoch in place
// still succeed.
func TestSavedEpochsAreNotRewrittenByLaterAppends(t *testing.T) {
	mem := vfs.NewMem()
	l, diskFull := openWithUnsavedEpoch(t, mem, true, nil)
	diskFull.Store(false)
	_, err := l.AppendAsFollower(followerBatch(t, 2, 3, 1)) // rewrites the file, then writes
	require.NoError(t, err)
	diskFull.Store(true) // the epoch file's temporary cannot be created now
	_, err = l.AppendAsFollower(followerBatch(t, 5, 3, 1))
	require.NoError(t, err, "an append at the current epoch rewrote the epoch file")
	require.NoError(t, l.Close())
}
