package log

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// countLogReads opens a log on a filesystem that counts the reads of its
// .log files.
func countLogReads(t *testing.T) (*Log, *atomic.Int64, Options) {
	t.Helper()
	var reads atomic.Int64
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpRead && strings.HasSuffix(op.Path, logSuffix) {
			reads.Add(1)
		}
		return vfs.Fault{}
	}))
	opts := testLogOptions(efs)
	return openLog(t, "/log", opts), &reads, opts
}

// regionBytes reads a region's bytes from its file.
func regionBytes(t *testing.T, r Region) []byte {
	t.Helper()
	buf := make([]byte, r.Length)
	_, err := r.File.ReadAt(buf, r.Position)
	require.NoError(t, err)
	return buf
}

// A follower's next fetch, or a tailing consumer's, asks for the batch
// just appended: the log finds it from what the appender remembers, not
// by reading headers back from the file, and answers what a log that
// remembers nothing (reopened) answers.
func TestReadAtLogEndReadsNoHeader(t *testing.T) {
	requireNoGoroutineLeak(t)
	l, reads, opts := countLogReads(t)
	want := appendN(t, l, 20, 0)
	last := Batch(want[len(want)-1])
	end := l.LogEndOffset()
	require.Equal(t, last.NextOffset(), end)

	var regions []Region
	for _, off := range []int64{last.BaseOffset(), last.BaseOffset() + 1, last.LastOffset()} {
		reads.Store(0)
		r, err := l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		require.Zero(t, reads.Load(), "ReadRegion(%d) at the log end read the file", off)
		require.Equal(t, last.BaseOffset(), r.FirstOffset)
		require.Equal(t, end, r.NextOffset)
		require.Equal(t, []byte(last), regionBytes(t, r))
		regions = append(regions, r)

		reads.Store(0)
		buf, err := l.Read(nil, off, ReadOptions{})
		require.NoError(t, err)
		require.Equal(t, []byte(last), buf)
		require.Equal(t, int64(1), reads.Load(), "Read(%d) at the log end: the batch itself only", off)
	}
	// Earlier batches are found from the index, as before.
	mid, err := l.ReadRegion(Batch(want[3]).BaseOffset(), ReadOptions{MaxBytes: len(want[3])})
	require.NoError(t, err)
	require.Equal(t, want[3], regionBytes(t, mid))

	require.NoError(t, l.Close())
	reopened := openLog(t, "/log", opts)
	for i, off := range []int64{last.BaseOffset(), last.BaseOffset() + 1, last.LastOffset()} {
		r, err := reopened.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		r.File, regions[i].File = nil, nil
		require.Equal(t, r, regions[i], "offset %d", off)
	}
}

// What the appender remembers follows the log: after a truncation the
// last batch is the one before the cut, and after the next append the new
// batch, though the same position held another before.
func TestReadAtLogEndAfterTruncation(t *testing.T) {
	requireNoGoroutineLeak(t)
	l, _, _ := countLogReads(t)
	want := appendN(t, l, 10, 0)
	cut := Batch(want[8]).BaseOffset()
	require.NoError(t, l.TruncateTo(cut))
	r, err := l.ReadRegion(Batch(want[7]).BaseOffset(), ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, want[7], regionBytes(t, r))

	next := buildBatch(t, 5, 30, 5000) // another size at the same position
	_, err = l.Append(next)
	require.NoError(t, err)
	for off := cut; off < cut+5; off++ {
		r, err = l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		require.Equal(t, next, regionBytes(t, r), "offset %d", off)
		require.Equal(t, cut, r.FirstOffset)
		require.Equal(t, cut+5, r.NextOffset)
	}
	_, err = l.ReadRegion(cut+5, ReadOptions{})
	require.NoError(t, err)
}

// A follower's log may have a gap before its last batch (offsets the
// leader's log start skipped): an offset in the gap reads that batch.
func TestReadAtLogEndInAFollowerGap(t *testing.T) {
	requireNoGoroutineLeak(t)
	l, reads, _ := countLogReads(t)
	first := followerBatch(t, 0, 3, 1)
	_, err := l.AppendAsFollower(first)
	require.NoError(t, err)
	after := followerBatch(t, 10, 3, 1)
	_, err = l.AppendAsFollower(after)
	require.NoError(t, err)
	for off := int64(3); off < 13; off++ {
		reads.Store(0)
		r, err := l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		if off >= 10 {
			require.Zero(t, reads.Load(), "offset %d", off)
		}
		require.Equal(t, after, regionBytes(t, r), "offset %d", off)
	}
	r, err := l.ReadRegion(2, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, first, regionBytes(t, r))
}

// writeSegmentAt overwrites bytes at pos in the first segment of the log
// in /log, as damage on disk would.
func writeSegmentAt(t *testing.T, fs vfs.FS, pos int64, b []byte) {
	t.Helper()
	f, err := fs.OpenFile("/log/"+segmentName(0)+logSuffix, 2, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, pos)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// positionOf returns where batches[i] starts in a segment holding
// batches from its start.
func positionOf(batches [][]byte, i int) int {
	pos := 0
	for _, b := range batches[:i] {
		pos += len(b)
	}
	return pos
}

// setBaseOffset overwrites the base offset of the batch at pos in the
// first segment of the log in /log.
func setBaseOffset(t *testing.T, fs vfs.FS, pos, base int64) {
	t.Helper()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(base))
	writeSegmentAt(t, fs, pos, b[:])
}

// Read at the log end takes the last batch's header from what the
// appender remembers, and checks the file against it: a base offset
// damaged on disk (no CRC covers it), overlapping the batch before, is
// refused as it was when the header was read from the file.
func TestReadAtLogEndRefusesADamagedHeader(t *testing.T) {
	for _, crc := range []bool{false, true} {
		fs, opts := memLog()
		opts.VerifyReadCRC = crc
		l := openLog(t, "/log", opts)
		want := appendN(t, l, 10, 0)
		last := Batch(want[len(want)-1])
		setBaseOffset(t, fs, int64(positionOf(want, len(want)-1)), last.BaseOffset()-1)
		buf, err := l.Read(nil, last.BaseOffset(), ReadOptions{})
		require.ErrorIs(t, err, ErrCorrupt, "VerifyReadCRC %v", crc)
		require.Empty(t, buf)
		require.NoError(t, l.Close())
	}
}

// A truncation whose fsync fails has cut the file: reads must not locate
// the batch that was last before the cut from memory.
func TestReadRegionAfterAFailedTruncationSync(t *testing.T) {
	var armed atomic.Bool
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if armed.Load() && op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, logSuffix) {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	l := openLog(t, "/log", testLogOptions(efs))
	want := appendN(t, l, 10, 0)
	last := Batch(want[len(want)-1])
	armed.Store(true)
	require.Error(t, l.TruncateTo(Batch(want[5]).BaseOffset()))
	r, err := l.ReadRegion(last.BaseOffset(), ReadOptions{})
	if err == nil {
		buf := make([]byte, r.Length)
		_, err = r.File.ReadAt(buf, r.Position)
		require.NoError(t, err, "ReadRegion returned %+v, whose bytes were cut", r)
		require.Equal(t, []byte(last), buf)
	}
}

// checkTailLookups compares, for every offset around every segment, find
// (which may answer from the remembered last batch) with findAfter,
// which reads headers from the file. It returns how many offsets the
// remembered batch answered.
func checkTailLookups(t *testing.T, l *Log, step int) (hits int) {
	t.Helper()
	l.readMu.RLock()
	defer l.readMu.RUnlock()
	for _, s := range l.segments() {
		for off := max(s.base-1, 0); off <= s.next.Load()+1; off++ {
			var fast, slow [BatchHeaderSize]byte
			p2, _, ok2, err2 := s.findAfter(off, l.opts.MaxBatchBytes, &slow, false)
			if _, ok := s.tail.find(off, s.size.Load(), &fast); ok {
				hits++
			}
			p1, ok1, err1 := s.find(off, l.opts.MaxBatchBytes, &fast)
			require.Equal(t, err2 == nil, err1 == nil, "step %d segment %d offset %d: %v / %v", step, s.base, off, err1, err2)
			require.Equal(t, ok2, ok1, "step %d segment %d offset %d", step, s.base, off)
			if ok1 {
				require.Equal(t, p2, p1, "step %d segment %d offset %d", step, s.base, off)
				require.Equal(t, slow, fast, "step %d segment %d offset %d", step, s.base, off)
			}
		}
	}
	return hits
}

// Whatever a follower's log goes through (gaps, leaps to a new segment,
// several batches per append, truncations, failed appends, a moving log
// start), finding a batch from the remembered last one agrees with
// finding it from the index and the file.
func TestTailLookupAgreesWithTheIndex(t *testing.T) {
	for seed := int64(1); seed <= 4; seed++ {
		var failWrite atomic.Bool
		efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
			if op.Kind == vfs.OpWrite && strings.HasSuffix(op.Path, logSuffix) && failWrite.CompareAndSwap(true, false) {
				return vfs.Fault{Err: syscall.ENOSPC, Written: op.Len / 2}
			}
			return vfs.Fault{}
		}))
		l := openLog(t, "/log", testLogOptions(efs))
		rng := rand.New(rand.NewSource(seed))
		hits := 0
		for step := range 200 {
			leo, start := l.LogEndOffset(), l.LogStartOffset()
			switch k := rng.Intn(10); {
			case k < 5: // sometimes with a gap, or a leap past the index's range
				base := leo
				if rng.Intn(4) == 0 {
					base += int64(1 + rng.Intn(40))
				}
				if rng.Intn(40) == 0 {
					base += 1 << 33
				}
				_, err := l.AppendAsFollower(followerBatch(t, base, 1+rng.Intn(4), 1))
				require.NoError(t, err)
			case k < 7:
				_, err := l.AppendAsFollower(concat(followerBatch(t, leo, 2, 1), followerBatch(t, leo+2, 3, 1)))
				require.NoError(t, err)
			case k < 8:
				if leo > start {
					require.NoError(t, l.TruncateTo(start+rng.Int63n(leo-start)))
				}
			case k < 9:
				failWrite.Store(true)
				_, err := l.AppendAsFollower(followerBatch(t, leo, 3, 1))
				require.Error(t, err)
				failWrite.Store(false)
			default:
				if leo > start {
					require.NoError(t, l.DeleteRecordsBefore(start+rng.Int63n(leo-start)))
				}
			}
			hits += checkTailLookups(t, l, step)
		}
		require.NoError(t, l.Close())
		require.Positive(t, hits)
	}
}

// Reads at the log end racing appends, truncations and a moving log
// start return whole, valid batches holding the offset asked for.
func TestReadsAtTheEndRaceAppendsAndTruncations(t *testing.T) {
	_, opts := memLog()
	opts.VerifyReadCRC = true
	l := openLog(t, "/log", opts)
	appendN(t, l, 5, 0)
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	read := func(off int64, region bool) error {
		if region {
			r, err := l.ReadRegion(off, ReadOptions{MaxBytes: 1})
			if err == nil && r.Length > 0 && (r.FirstOffset > off || r.NextOffset <= off) {
				err = fmt.Errorf("ReadRegion(%d) returned [%d, %d)", off, r.FirstOffset, r.NextOffset)
			}
			return err
		}
		buf, err := l.Read(nil, off, ReadOptions{MaxBytes: 1})
		if err != nil || len(buf) == 0 { // empty: truncated below off meanwhile
			return err
		}
		b, rest, err := SplitBatch(buf)
		if err == nil {
			err = b.ValidateHeader()
		}
		switch {
		case err != nil:
			return err
		case len(rest) != 0 || b.BaseOffset() > off || b.LastOffset() < off:
			return fmt.Errorf("Read(%d) returned [%d, %d] and %d more bytes", off, b.BaseOffset(), b.LastOffset(), len(rest))
		}
		return nil
	}
	for r := range 2 {
		wg.Go(func() {
			for !stop.Load() {
				leo := l.LogEndOffset()
				for _, off := range []int64{leo - 1, leo - 2, leo - 4} {
					if off < 0 {
						continue
					}
					if err := read(off, r == 1); err != nil && !errors.Is(err, ErrOffsetOutOfRange) {
						errc <- err
						return
					}
				}
			}
		})
	}
	rng := rand.New(rand.NewSource(1))
	for i, deadline := 0, time.Now().Add(time.Second); time.Now().Before(deadline); i++ {
		_, err := l.Append(buildBatch(t, 1+rng.Intn(5), 10+rng.Intn(100), int64(i)))
		require.NoError(t, err)
		if to := l.LogEndOffset() - int64(1+rng.Intn(12)); i%7 == 6 && to > l.LogStartOffset() {
			require.NoError(t, l.TruncateTo(to))
		}
		if i%50 == 49 {
			require.NoError(t, l.DeleteRecordsBefore(l.LogEndOffset()-30))
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
}
