package log

import (
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// leapBatch is a follower batch at base with n records of leader
// epoch epoch, whose contents depend on tag (so that re-appended data at
// the same offsets differs).
func leapBatch(t testing.TB, base int64, n int, epoch int32, tag int) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	for i := 0; i < n; i++ {
		v := make([]byte, 40+(tag*13+i*7)%60)
		for j := range v {
			v[j] = byte(tag*31 + i + j)
		}
		bb.Add(1_000_000+base+int64(i), []byte(fmt.Sprintf("t%d-%d-%d", tag, base, i)), v)
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	Batch(b).setBaseOffset(base)
	Batch(b).setLeaderEpoch(epoch)
	return b
}

// readLeaping reads every batch of a log whose offsets may leap (a
// follower's gaps): whole, valid batches with growing offsets.
func readLeaping(l *Log) (logState, error) {
	st := logState{start: l.LogStartOffset(), end: l.LogEndOffset()}
	next := st.start
	for next < st.end {
		buf, err := l.Read(nil, next, ReadOptions{MaxBytes: 3000})
		if err != nil {
			return st, fmt.Errorf("read at %d of [%d, %d): %w", next, st.start, st.end, err)
		}
		if len(buf) == 0 {
			return st, fmt.Errorf("nothing readable at %d below the log end %d", next, st.end)
		}
		for rest := buf; len(rest) > 0; {
			b, r, err := SplitBatch(rest)
			if err != nil {
				return st, err
			}
			if err := b.Validate(); err != nil {
				return st, err
			}
			if b.NextOffset() <= next || (len(st.batches) > 0 && b.BaseOffset() < next) {
				return st, fmt.Errorf("batch [%d, %d) read at %d", b.BaseOffset(), b.NextOffset(), next)
			}
			st.batches = append(st.batches, append([]byte(nil), b...))
			next = b.NextOffset()
			rest = r
		}
	}
	if next != st.end {
		return st, fmt.Errorf("last batch ends at %d, log end %d", next, st.end)
	}
	return st, nil
}

// failNextSegmentWrite returns a filesystem on inner whose next write to
// the segment file of base, once armed, fails with ENOSPC, whether the
// roll made that segment from the flusher's spare file or created it
// (ErrorFS names an open file by its current name).
func failNextSegmentWrite(inner vfs.FS, base int64) (*vfs.ErrorFS, *atomic.Bool) {
	var armed atomic.Bool
	name := segmentName(base) + logSuffix
	return vfs.NewErrorFS(inner, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpWrite && strings.HasSuffix(op.Path, name) && armed.CompareAndSwap(true, false) {
			return vfs.Fault{Err: syscall.ENOSPC}
		}
		return vfs.Fault{}
	})), &armed
}

func leapOptions(fsys vfs.FS) Options {
	return Options{FS: fsys, SegmentBytes: 1 << 10, IndexIntervalBytes: 256, CheckpointInterval: -1}
}

// TestFailedLeapAppendFailsTheLog: a follower append that leaps far past
// the end of an empty log rolls first, which moves the log start up to
// its offset, durably; when its write then fails (ENOSPC), the log start
// lay above the log end, a leader append below it was acknowledged, and
// the next Open, finding the start past the end, restarted the log empty:
// the acknowledged batch was gone. The failure is now sticky: nothing is
// acknowledged until a reopen, which finds a consistent log.
func TestFailedLeapAppendFailsTheLog(t *testing.T) {
	mem := vfs.NewMem()
	efs, armed := failNextSegmentWrite(mem, 1<<32)
	l, err := Open(crashDir, leapOptions(efs))
	require.NoError(t, err)
	defer func() { l.Close() }()

	armed.Store(true)
	_, err = l.AppendAsFollower(leapBatch(t, 1<<32, 2, 3, 1))
	require.ErrorIs(t, err, syscall.ENOSPC)
	_, err = l.Append(testBatch(t, 0))
	require.ErrorIs(t, err, ErrSyncFailed, "nothing is acknowledged below the moved log start")
	require.ErrorIs(t, l.Close(), ErrSyncFailed)

	l, err = Open(crashDir, leapOptions(mem))
	require.NoError(t, err)
	require.LessOrEqual(t, l.LogStartOffset(), l.LogEndOffset())
	b := leapBatch(t, l.LogEndOffset(), 2, 3, 2)
	_, err = l.AppendAsFollower(b)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l, err = Open(crashDir, leapOptions(mem))
	require.NoError(t, err)
	st, err := readLeaping(l)
	require.NoError(t, err)
	checkAcked(t, st, [][]byte{b})
}

// TestFailedGapAppendFailsTheLog: a follower append that leaves a gap
// makes the recovery point durable at the gap's end before its data is
// written. When the write then failed (ENOSPC, not sticky), the log went
// on below that recovery point (a new leader's data) while the checkpoint
// claimed it durable; after a power loss recovery skipped the segments
// below it, which had lost their unsynced data, and the log claimed
// offsets it did not hold. The failure is now sticky, and a power loss
// keeps every batch synced before it.
func TestFailedGapAppendFailsTheLog(t *testing.T) {
	mem := vfs.NewMem()
	const end, gap = 10, 10 + 1<<31 + 1000 // five batches of two, then the gap
	efs, armed := failNextSegmentWrite(mem, gap)
	l, err := Open(crashDir, leapOptions(efs))
	require.NoError(t, err)
	defer func() { l.Close() }()
	var acked [][]byte
	for i := range 5 {
		b := leapBatch(t, l.LogEndOffset(), 2, 1, i)
		_, err := l.AppendAsFollower(b)
		require.NoError(t, err)
		acked = append(acked, b)
	}
	require.NoError(t, l.Sync())
	require.Equal(t, int64(end), l.LogEndOffset())

	armed.Store(true)
	_, err = l.AppendAsFollower(leapBatch(t, gap, 2, 2, 99))
	require.ErrorIs(t, err, syscall.ENOSPC)
	_, err = l.AppendAsFollower(leapBatch(t, end, 2, 3, 200))
	require.ErrorIs(t, err, ErrSyncFailed, "nothing is appended below the durable recovery point")

	l2, err := Open(crashDir, leapOptions(mem.CrashClone(vfs.CrashOptions{})))
	require.NoError(t, err)
	defer l2.Close()
	st, err := readLeaping(l2)
	require.NoError(t, err, "after a power loss the recovered log is not a prefix of what was appended (segments %v)", segmentBases(l2))
	checkAcked(t, st, acked)
}
