package log

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// FuzzLogOps runs a sequence of operations decoded from the input on a
// Log with small segments (leader and follower appends, with offset leaps
// of up to 2^31 as a follower's may have, leader epochs, TruncateTo,
// DeleteRecordsBefore, TruncateFullyAndStartAt, retention, idempotent
// producers and their retries, Sync, a Sync whose fsyncs fail (the
// writeback lost, as on Linux) and a reopen, Close and reopen, a process
// crash or a power loss and reopen) and checks the log against a model
// after each one: start and end offsets, the leader epochs, and every
// batch read back byte for byte, whole and from offsets inside batches
// and gaps. testdata/fuzz/FuzzLogOps holds the inputs that found two
// TruncateTo bugs in follower gaps.
func FuzzLogOps(f *testing.F) { fuzzOps(f, false) }

// FuzzManagerLogOps is FuzzLogOps on a log of a Manager, whose checkpoints
// (recovery points, high watermarks, the clean-shutdown marker) are the
// Manager's, and whose segment files go through its file cache.
func FuzzManagerLogOps(f *testing.F) { fuzzOps(f, true) }

func fuzzOps(f *testing.F, manager bool) {
	for _, seed := range [][]byte{
		{opsLeaderAppend, 2, opsLeaderAppend, 1, opsReopen, 0, opsLeaderAppend, 0},
		// Follower leaps, then truncations at and around the gaps.
		{opsFollowerAppend, 0x22, opsFollowerAppend, 0x22, opsFollowerAppend, 0x22,
			opsFollowerAppend, 0x23, opsFollowerAppend, 0x32, opsTruncate, 0x03, opsLeaderAppend, 1},
		{opsFollowerAppend, 0x40, opsNewEpoch, 1, opsFollowerAppend, 0x31, opsDeleteBefore, 0x05,
			opsTruncate, 0x02, opsCrash, 0, opsLeaderAppend, 2},
		{opsLeaderAppend, 2, opsBeginEpoch, 0, opsTruncateFully, 0x13, opsFollowerAppend, 0x45,
			opsReopen, 0, opsTruncate, 0x01},
		// Power losses after a sync, a truncation and a full truncation.
		{opsLeaderAppend, 2, opsProduce, 1, opsSync, 0, opsLeaderAppend, 1, opsPowerLoss, 0x1f,
			opsTruncate, 0x01, opsFollowerAppend, 0x12, opsPowerLoss, 0x02, opsTruncateFully, 0x02,
			opsLeaderAppend, 0, opsPowerLoss, 0x0c, opsRetry, 1},
		// A failed fsync loses the writeback; the reopen must rewrite it.
		{opsLeaderAppend, 2, opsLeaderAppend, 1, opsSync, 0x80, opsLeaderAppend, 0, opsSync, 0,
			opsPowerLoss, 0x00},
		// Idempotent producers retrying across truncation and a crash.
		{opsProduce, 0, opsProduce, 1, opsProduce, 4, opsRetry, 0, opsProduce, 0, opsTruncate, 0x05,
			opsRetry, 0, opsCrash, 0, opsRetry, 1, opsRetry, 4, opsProduce, 1},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, program []byte) {
		if len(program) > 96 {
			return
		}
		r := &opsRunner{t: t, fs: vfs.NewMem(), in: program, manager: manager}
		r.open(r.fs)
		defer func() { _ = r.close() }()
		for len(r.in) > 0 {
			r.step()
			r.check()
		}
	})
}

// The operations of FuzzLogOps, each taking one parameter byte.
const (
	opsLeaderAppend = iota
	opsFollowerAppend
	opsNewEpoch
	opsBeginEpoch
	opsTruncate
	opsDeleteBefore
	opsTruncateFully
	opsReopen
	opsCrash
	opsRetention
	opsProduce
	opsRetry
	opsSync
	opsPowerLoss
	opsCount
)

type opsRunner struct {
	t  *testing.T
	fs *vfs.MemFS
	l  *Log
	m  opsModel
	in []byte
	n  int // batches built, for distinct contents
	// failSyncs makes every fsync of a segment file fail with EIO.
	failSyncs atomic.Bool
	// manager runs the log as log "p" of a Manager, mgr.
	manager bool
	mgr     *Manager
}

func opsOptions(fsys vfs.FS) Options {
	return Options{FS: fsys, SegmentBytes: 1 << 10, IndexIntervalBytes: 128, RetentionBytes: 3 << 10, ProducerIDExpiration: neverExpire}
}

func (r *opsRunner) open(fsys *vfs.MemFS) {
	efs := vfs.NewErrorFS(fsys, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, logSuffix) && r.failSyncs.Load() {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	r.fs = fsys
	if !r.manager {
		l, err := Open(crashDir, opsOptions(efs))
		require.NoError(r.t, err)
		r.l = l
		return
	}
	m, err := OpenManager(crashDir, ManagerOptions{Log: opsOptions(efs), CheckpointInterval: time.Hour, Workers: 1, RecoveryWorkers: 1})
	require.NoError(r.t, err)
	l, ok := m.Get("p")
	if !ok {
		l, err = m.Create("p")
		require.NoError(r.t, err)
	}
	r.l, r.mgr = l, m
}

// close closes the log, or its Manager.
func (r *opsRunner) close() error {
	if r.mgr != nil {
		return r.mgr.Close()
	}
	return r.l.Close()
}

func (r *opsRunner) next() byte {
	if len(r.in) == 0 {
		return 0
	}
	b := r.in[0]
	r.in = r.in[1:]
	return b
}

func (r *opsRunner) step() {
	op, p := r.next()%opsCount, r.next()
	r.t.Logf("op %d(%#x) on [%d, %d) epoch %d", op, p, r.m.start, r.m.end, r.m.epoch)
	switch op {
	case opsLeaderAppend:
		r.leaderAppend(int(p % 3))
	case opsFollowerAppend:
		r.followerAppend(p)
	case opsNewEpoch:
		r.m.epoch += 1 + int32(p%3)
	case opsBeginEpoch:
		require.NoError(r.t, r.l.BeginLeaderEpoch(r.m.epoch))
		r.m.assignEpoch(r.m.epoch, r.m.end)
	case opsTruncate:
		r.truncate(r.pickOffset(p))
	case opsDeleteBefore:
		off := r.pickOffset(p)
		require.NoError(r.t, r.l.DeleteRecordsBefore(off))
		r.m.deleteBefore(off)
		r.m.durableStart = off
	case opsTruncateFully:
		off := r.m.end + int64(p%4)*100 - 100
		if off < 0 {
			off = 0
		}
		require.NoError(r.t, r.l.TruncateFullyAndStartAt(off))
		r.m.batches, r.m.epochs = nil, nil
		r.m.start, r.m.end = off, off
		r.m.durable, r.m.durableStart = 0, off
	case opsReopen:
		require.NoError(r.t, r.close())
		r.m.durable = len(r.m.batches)
		r.open(r.fs)
		r.m.truncateEpochsFromEnd(r.m.end) // an epoch with no batch yet is not kept
	case opsCrash:
		// The page cache survives a killed process, writeback lost to a
		// failed fsync included; recovery must make what it keeps durable.
		image := r.fs.CrashClone(vfs.CrashOptions{Kill: true})
		require.NoError(r.t, r.close())
		r.open(image)
		r.m.truncateEpochsFromEnd(r.m.end)
		r.m.durable, r.m.durableStart = len(r.m.batches), r.m.start
	case opsRetention:
		r.retention()
	case opsProduce:
		r.produce(int64(1+p%3), 1+int(p>>2)%3)
	case opsRetry:
		r.retry(int64(1+p%3), int(p>>2)%5)
	case opsSync:
		if p&0x80 != 0 {
			r.failedSync()
			break
		}
		require.NoError(r.t, r.l.Sync())
		r.m.durable = len(r.m.batches)
	case opsPowerLoss:
		r.powerLoss(p)
	}
}

// failedSync syncs while every fsync of a segment fails, which loses the
// writeback of the unsynced data, then reopens the log in the same boot,
// as an application must after ErrSyncFailed. The reopened log holds
// everything (the page cache does), and its recovery must have made all
// of it durable, lost writeback included.
func (r *opsRunner) failedSync() {
	r.failSyncs.Store(true)
	err := r.l.Sync()
	if err != nil {
		require.ErrorIs(r.t, err, ErrSyncFailed)
	}
	r.failSyncs.Store(false)
	_ = r.close() // the flusher may have failed too, or instead
	r.open(r.fs)
	r.m.truncateEpochsFromEnd(r.m.end)
	r.m.durable, r.m.durableStart = len(r.m.batches), r.m.start
}

// powerLoss reopens the log on what a power loss would leave of its files
// now, keeping some unsynced changes as p says. Open must succeed, and
// the log must hold a prefix of the model's batches, at least the synced
// ones, from a start no lower than the last durable one.
func (r *opsRunner) powerLoss(p byte) {
	image := r.fs.CrashClone(vfs.CrashOptions{
		Seed:         int64(p),
		KeepUnsynced: float64(p&3) / 3,
		ZeroSectors:  0.3 * float64(p>>2&1),
		KeepDirOps:   float64(p >> 3 & 1),
		DirOpsPrefix: 0.5 * float64(p>>4&1),
	})
	require.NoError(r.t, r.close())
	r.open(image)
	start, end := r.l.LogStartOffset(), r.l.LogEndOffset()
	require.True(r.t, r.m.durableStart <= start && start <= r.m.start,
		"log start %d after a power loss outside [%d, %d]", start, r.m.durableStart, r.m.start)
	i := 0
	for i < len(r.m.batches) && Batch(r.m.batches[i]).LastOffset() < start {
		i++
	}
	got := r.readFrom(start, -1)
	require.LessOrEqual(r.t, i+len(got), len(r.m.batches), "more batches after a power loss than appended")
	r.requireBatches(r.m.batches[i:i+len(got)], got, "batches after a power loss")
	k := i + len(got)
	require.GreaterOrEqual(r.t, k, r.m.durable, "a power loss lost synced batches")
	if len(got) > 0 {
		require.Equal(r.t, Batch(got[len(got)-1]).NextOffset(), end, "log end after a power loss")
	} else {
		limit := r.m.end
		if i < len(r.m.batches) {
			// Where the first lost batch was, or the start if it began
			// below it (the log restarts empty at the start).
			limit = max(Batch(r.m.batches[i]).BaseOffset(), start)
		}
		require.True(r.t, start <= end && end <= limit, "log end %d after a power loss outside [%d, %d]", end, start, limit)
	}
	r.m.batches, r.m.start, r.m.end = r.m.batches[:k], start, end
	r.m.durable, r.m.durableStart = k, start
	r.m.truncateEpochsFromEnd(end)
	r.m.truncateEpochsFromStart(start)
}

// produce appends a batch of records from idempotent producer pid, epoch
// 0, with the sequence after its last batch in the model: the log accepts
// it whether it still has that batch in its producer state or, having
// dropped the producer (its batches fell below the log start), none.
func (r *opsRunner) produce(pid int64, records int) {
	seq := int32(0)
	if last := r.m.producerBatches(pid, false); len(last) > 0 {
		seq = Batch(last[len(last)-1]).LastSequence() + 1
	}
	r.n++
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: 0, BaseSequence: seq})
	for i := range records {
		bb.Add(int64(1_000_000+r.n*10+i), fmt.Appendf(nil, "p%d-%d", pid, r.n), fmt.Appendf(nil, "v%d", i))
	}
	b, err := bb.Build(nil)
	require.NoError(r.t, err)
	info, err := r.l.AppendAsLeader(b, r.m.epoch)
	require.NoError(r.t, err)
	require.False(r.t, info.Duplicate, "a new sequence taken for a retry")
	require.Equal(r.t, r.m.end, info.FirstOffset)
	r.m.add(Batch(b))
}

// retry appends again the k-th last batch of producer pid, as a producer
// retrying it does, if it and every later batch of pid are at or after
// the log start: the log must keep them in its producer state (the last
// 5 batches of each producer) and answer with the original offsets,
// appending nothing.
func (r *opsRunner) retry(pid int64, k int) {
	live := r.m.producerBatches(pid, true) // a suffix of pid's batches
	if k >= len(live) {
		return
	}
	orig := Batch(live[len(live)-1-k])
	again := slices.Clone([]byte(orig))
	Batch(again).setBaseOffset(0)
	info, err := r.l.AppendAsLeader(again, r.m.epoch+1)
	require.NoError(r.t, err)
	require.True(r.t, info.Duplicate, "retry of producer %d's batch [%d, %d]", pid, orig.BaseOffset(), orig.LastOffset())
	require.Equal(r.t, orig.BaseOffset(), info.FirstOffset, "retry's first offset")
	require.Equal(r.t, orig.LastOffset(), info.LastOffset, "retry's last offset")
}

// retention runs ApplyRetention: the log may then start at the base of a
// later segment, which is the base of one of its batches or, when a
// follower's gap lies below the segment's first batch, in that gap. No
// batch may straddle the new start, and the last batch stays.
func (r *opsRunner) retention() {
	_, err := r.l.ApplyRetention()
	require.NoError(r.t, err)
	start := r.l.LogStartOffset()
	if start == r.m.start {
		return
	}
	require.Greater(r.t, start, r.m.start, "log start offset after retention")
	live := r.m.live()
	require.False(r.t, slices.ContainsFunc(live, func(b []byte) bool {
		return Batch(b).BaseOffset() < start && start <= Batch(b).LastOffset()
	}), "log start offset %d after retention is inside a batch", start)
	if len(live) > 0 {
		require.LessOrEqual(r.t, start, Batch(live[len(live)-1]).BaseOffset(), "retention deleted the last batch")
	}
	r.m.deleteBefore(start)
}

// newBatch builds a distinct batch of 1-3 records.
func (r *opsRunner) newBatch(records int) []byte {
	r.n++
	return buildTestBatch(r.t, r.n*3+records)
}

func (r *opsRunner) leaderAppend(extra int) {
	b := r.newBatch(extra)
	info, err := r.l.AppendAsLeader(b, r.m.epoch)
	require.NoError(r.t, err)
	require.Equal(r.t, r.m.end, info.FirstOffset, "leader append's base offset")
	r.m.add(Batch(b))
}

// followerAppend appends one or two batches as a follower, the first
// after a leap chosen by p's high bits: none, a few offsets, or just past
// 2^8, 2^16 or 2^31 offsets.
func (r *opsRunner) followerAppend(p byte) {
	leaps := []int64{0, 3, 1<<8 + 1, 1<<16 + 7, 1<<31 + 5}
	base := r.m.end + leaps[int(p>>4)%len(leaps)]
	var all []byte
	var batches [][]byte
	for i := range 1 + int(p>>3)%2 {
		b := r.newBatch(int(p) + i)
		Batch(b).setBaseOffset(base)
		Batch(b).setLeaderEpoch(r.m.epoch)
		base = Batch(b).NextOffset() + int64(i)*2 // the second batch leaps a little
		all = append(all, b...)
		batches = append(batches, b)
	}
	_, err := r.l.AppendAsFollower(all)
	require.NoError(r.t, err)
	live := r.m.live()
	for _, b := range batches {
		r.m.add(Batch(b))
	}
	if start := r.l.LogStartOffset(); start != r.m.start {
		// A log holding no batch, whose only segment cannot hold the
		// first batch (2^31 offsets past its base), starts at it.
		require.Empty(r.t, live, "log start moved from %d to %d by an append", r.m.start, start)
		require.Equal(r.t, Batch(batches[0]).BaseOffset(), start, "log start after an append to an empty log")
		r.m.deleteBefore(start)
	}
}

// pickOffset picks an offset in [start, end]: a batch's base, an offset
// inside a batch or a gap, or the end.
func (r *opsRunner) pickOffset(p byte) int64 {
	live := r.m.live()
	if int(p>>2) >= len(live) {
		return r.m.end
	}
	b := Batch(live[int(p>>2)])
	switch p % 4 {
	case 0:
		return max(b.BaseOffset(), r.m.start)
	case 1:
		return max(b.LastOffset(), r.m.start)
	case 2:
		return max(b.BaseOffset()-1, r.m.start) // in a gap or the batch before
	}
	return b.NextOffset()
}

// truncate runs TruncateTo(off) and updates the model by the contract:
// every batch ending at or after off goes; the log then ends where the
// last batch kept ends. When that batch is wholly below the log start
// (its segment may have been deleted) or there is none, the end may be
// anywhere from there up to the base of the first batch removed.
func (r *opsRunner) truncate(off int64) {
	err := r.l.TruncateTo(off)
	if off < r.m.start {
		require.ErrorIs(r.t, err, ErrOffsetOutOfRange)
		return
	}
	require.NoError(r.t, err)
	if off >= r.m.end {
		return
	}
	keep := 0
	for keep < len(r.m.batches) && Batch(r.m.batches[keep]).LastOffset() < off {
		keep++
	}
	firstGone := Batch(r.m.batches[keep]).BaseOffset()
	end := r.l.LogEndOffset()
	switch {
	case keep > 0 && Batch(r.m.batches[keep-1]).NextOffset() > r.m.start:
		require.Equal(r.t, Batch(r.m.batches[keep-1]).NextOffset(), end, "log end after TruncateTo(%d)", off)
	default:
		low := int64(0)
		if keep > 0 {
			low = Batch(r.m.batches[keep-1]).NextOffset()
		}
		require.True(r.t, low <= end && end <= min(firstGone, off),
			"log end %d after TruncateTo(%d) outside [%d, %d]", end, off, low, min(firstGone, off))
	}
	r.m.batches = r.m.batches[:keep]
	r.m.end = end
	r.m.start = min(r.m.start, end)
	r.m.durable = min(r.m.durable, keep)
	r.m.durableStart = min(r.m.durableStart, r.m.start)
	r.m.truncateEpochsFromEnd(end)
}
