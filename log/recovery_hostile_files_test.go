package log

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// Files in a log directory that no operation of the log leaves there, or
// checkpoints damaged from outside: Open keeps every acknowledged batch
// or refuses with ErrCorrupt.

// TestSignedSegmentNameIsNotASegment: a stray "-0000000000000000000.log"
// has a segment name's length, and ParseInt read it as base 0: Open listed
// segment 0 twice, both opened on the real file, and retention then
// renamed the real segment away as the older of the two.
func TestSignedSegmentNameIsNotASegment(t *testing.T) {
	for _, name := range []string{"-0000000000000000000.log", "+0000000000000000000.log", "+0000000000000000007.log"} {
		t.Run(name, func(t *testing.T) {
			fs, opts, batches := closedLog(t, 30) // one segment, base 0
			writeFileFS(t, fs, "/log/"+name, nil)
			opts.RetentionBytes = 1 // only the active segment may stay
			l := openLog(t, "/log", opts)
			require.Equal(t, []int64{0}, segmentBases(l))
			_, err := l.ApplyRetention()
			require.NoError(t, err)
			require.NoError(t, l.Close())
			l2 := openLog(t, "/log", opts)
			defer l2.Close()
			require.Equal(t, batches, readAllBatches(t, l2))
		})
	}
}

// TestUnreadableRecoveryPointKeepsSyncedDataAfterAGap: a follower's gap
// between segments lies below the recovery point (makeGapDurable), and
// recovery takes a gap above it for a lost tail. With the recovery point
// unreadable (a damaged recovery-point file, or a Manager's damaged
// checkpoint, which OpenManager ignores), recovery scanned from 0 and
// deleted the synced segment after the gap. Open now refuses with
// ErrCorrupt (unless TruncateAtCorruption).
func TestUnreadableRecoveryPointKeepsSyncedDataAfterAGap(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		before, after := gapBatches(t)
		mem := vfs.NewMem()
		opts := Options{FS: mem, SegmentBytes: int64(len(concat(before...))), CheckpointInterval: time.Hour}
		l, err := Open("/log", opts)
		require.NoError(t, err)
		appendAcrossGap(t, l, before, after)
		require.NoError(t, l.Close())
		writeFileFS(t, mem, "/log/"+recoveryPointFile, []byte("garbage"))

		_, err = Open("/log", opts)
		require.ErrorIs(t, err, ErrCorrupt)
		writeFileFS(t, mem, "/log/"+recoveryPointFile, EncodeCheckpoint([][]int64{{1003}})) // repaired
		l2 := openLog(t, "/log", opts)
		defer l2.Close()
		require.Equal(t, append(before, after), readAllBatches(t, l2))
	})
	t.Run("manager", func(t *testing.T) {
		before, after := gapBatches(t)
		mem := vfs.NewMem()
		mo := ManagerOptions{Log: Options{FS: mem, SegmentBytes: int64(len(concat(before...)))}, CheckpointInterval: time.Hour}
		m, err := OpenManager("/data", mo)
		require.NoError(t, err)
		l, err := m.Create("p-0")
		require.NoError(t, err)
		appendAcrossGap(t, l, before, after)
		require.NoError(t, m.Close())
		writeFileFS(t, mem, "/data/"+managerCheckpointFile, []byte("0\n1\np-0 x\n"))

		_, err = OpenManager("/data", mo)
		require.ErrorIs(t, err, ErrCorrupt)
		require.Equal(t, int64(1003), Batch(readFileFS(t, mem, "/data/p-0/"+segmentName(1000)+logSuffix)).NextOffset(),
			"the segment after the gap is still there")
	})
}

// TestEmptySealedSegmentDoesNotStallAReader: a sealed segment whose .log
// file is empty (no operation of the log leaves one) made a sequential
// Reader take it for the end of the data and wait for appends, with
// hundreds of offsets still below the log end.
func TestEmptySealedSegmentDoesNotStallAReader(t *testing.T) {
	fs, opts, _ := closedLog(t, 300)
	l := openLog(t, "/log", opts)
	bases := segmentBases(l)
	require.NoError(t, l.Close())
	require.Greater(t, len(bases), 4)
	writeFileFS(t, fs, "/log/"+segmentName(bases[2])+logSuffix, nil)

	l2, err := Open("/log", opts)
	if err != nil {
		require.ErrorIs(t, err, ErrCorrupt)
		return
	}
	defer l2.Close()
	r := l2.NewReader(l2.LogStartOffset(), ReaderOptions{})
	for r.Offset() < l2.LogEndOffset() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		at := r.Offset()
		_, err := r.Next(ctx)
		cancel()
		require.NoError(t, err, "Reader.Next at offset %d (log end %d, empty segment %d)", at, l2.LogEndOffset(), bases[2])
	}
}
