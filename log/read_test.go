package log

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// splitAll splits concatenated batches.
func splitAll(t *testing.T, buf []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for rest := buf; len(rest) > 0; {
		b, r, err := SplitBatch(rest)
		require.NoError(t, err)
		out = append(out, []byte(b))
		rest = r
	}
	return out
}

func TestReadReturnsWholeBatches(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 20, 0) // all in the first segment: 20 * ~280 bytes < 8 KiB
	require.Len(t, l.segments(), 1)
	size := len(want[0])

	tests := []struct {
		name     string
		offset   int64
		maxBytes int
		want     [][]byte
	}{
		{"first batch, exact size", 0, size, want[:1]},
		{"max bytes below one batch still returns it", 0, 1, want[:1]},
		{"offset inside a batch returns the whole batch", 4, 1, want[1:2]},
		{"last offset of a batch", 5, size, want[1:2]},
		{"two and a half batches", 0, 2*size + size/2, want[:2]},
		{"everything", 0, 1 << 20, want},
		{"default max bytes", 0, 0, want},
		{"from the middle", 30, 3 * size, want[10:13]},
		{"last batch", 59, 1 << 20, want[19:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("dst")
			buf, err := l.Read(append([]byte(nil), prefix...), tt.offset, ReadOptions{MaxBytes: tt.maxBytes})
			require.NoError(t, err)
			require.Equal(t, prefix, buf[:len(prefix)], "Read appends to dst")
			require.Equal(t, tt.want, splitAll(t, buf[len(prefix):]))
		})
	}

	buf, err := l.Read(nil, 60, ReadOptions{})
	require.NoError(t, err, "reading at the log end is not an error")
	require.Empty(t, buf)
	for _, off := range []int64{61, 1 << 40, -1} {
		_, err := l.Read(nil, off, ReadOptions{})
		require.ErrorIs(t, err, ErrOffsetOutOfRange, "offset %d", off)
		_, err = l.ReadRegion(off, ReadOptions{})
		require.ErrorIs(t, err, ErrOffsetOutOfRange, "offset %d", off)
	}
	require.NoError(t, l.DeleteRecordsBefore(9))
	_, err = l.Read(nil, 8, ReadOptions{})
	require.ErrorIs(t, err, ErrOffsetOutOfRange, "below the log start")
	buf, err = l.Read(nil, 9, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, want[3], buf)
}

// TestReadStaysInOneSegment: a read returns batches from one segment; the
// next read continues in the next.
func TestReadStaysInOneSegment(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 100, 0)
	segs := l.segments()
	require.Greater(t, len(segs), 2)
	second := segs[1].base
	buf, err := l.Read(nil, second-3, ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	got := splitAll(t, buf)
	require.Equal(t, want[second/3-1:second/3], got, "the last batch of the first segment only")
	require.Equal(t, readAllBatches(t, l), want)
}

func TestReadUpToHighWatermark(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 10, 0)
	require.Equal(t, int64(0), l.HighWatermark())
	hw := ReadOptions{MaxBytes: 1 << 20, UpToHighWatermark: true}

	buf, err := l.Read(nil, 0, hw)
	require.NoError(t, err)
	require.Empty(t, buf, "nothing below a zero high watermark")
	// Above the high watermark but within the log: nothing, as in Kafka
	// (a high watermark that moved down after a consumer passed it, a
	// restart, must not send the consumer out of range).
	buf, err = l.Read(nil, 3, hw)
	require.NoError(t, err, "above the high watermark")
	require.Empty(t, buf)
	r, err := l.ReadRegion(29, hw)
	require.NoError(t, err)
	require.Zero(t, r.Length)
	_, err = l.Read(nil, 31, hw)
	require.ErrorIs(t, err, ErrOffsetOutOfRange, "past the log end")
	_, err = l.ReadRegion(31, hw)
	require.ErrorIs(t, err, ErrOffsetOutOfRange, "past the log end")

	l.SetHighWatermark(12)
	require.Equal(t, int64(12), l.HighWatermark())
	buf, err = l.Read(nil, 0, hw)
	require.NoError(t, err)
	require.Equal(t, want[:4], splitAll(t, buf))
	buf, err = l.Read(nil, 12, hw)
	require.NoError(t, err)
	require.Empty(t, buf)
	buf, err = l.Read(nil, 0, ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, want, splitAll(t, buf), "without the option, up to the log end")

	// A batch straddling the high watermark is not visible yet.
	l.SetHighWatermark(14)
	buf, err = l.Read(nil, 0, hw)
	require.NoError(t, err)
	require.Equal(t, want[:4], splitAll(t, buf))
	buf, err = l.Read(nil, 12, hw)
	require.NoError(t, err)
	require.Empty(t, buf)
	r, err = l.ReadRegion(12, hw)
	require.NoError(t, err)
	require.Zero(t, r.Length, "a region never holds a batch above the high watermark")

	// Clamped to [log start, log end].
	l.SetHighWatermark(1000)
	require.Equal(t, int64(30), l.HighWatermark())
	l.SetHighWatermark(-5)
	require.Equal(t, int64(0), l.HighWatermark())
	l.SetHighWatermark(30)

	// It survives a clean reopen, and truncation lowers it.
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, int64(30), l.HighWatermark())
	require.NoError(t, l.TruncateTo(20))
	require.Equal(t, int64(18), l.HighWatermark())
}

// TestReadRegionMatchesRead follows Kafka's testReadFromGap: regions read
// through File.ReadAt hold exactly what Read returns, and NextOffset
// continues correctly across segments and across a follower's offset
// gaps, inside a segment and between segments.
func TestReadRegionMatchesRead(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	var want [][]byte
	next := int64(0)
	for i := 0; i < 200; i++ {
		if i%9 == 4 {
			next += int64(5 + i) // a gap
		}
		b := followerBatch(t, next, 1+i%4, 3)
		_, err := l.AppendAsFollower(b)
		require.NoError(t, err)
		want = append(want, b)
		next = Batch(b).NextOffset()
	}
	// A gap between segments too.
	far := next + 1<<32 // too far for the active segment's relative offsets
	_, err := l.AppendAsFollower(followerBatch(t, far, 1, 3))
	require.NoError(t, err)
	want = append(want, followerBatch(t, far, 1, 3))
	require.Greater(t, len(l.segments()), 3)
	require.Equal(t, far, l.active().base)

	for _, maxBytes := range []int{1, 700, 3000, 1 << 20} {
		var viaRegion, viaRead [][]byte
		for off := int64(0); off < l.LogEndOffset(); {
			r, err := l.ReadRegion(off, ReadOptions{MaxBytes: maxBytes})
			require.NoError(t, err)
			require.Positive(t, r.Length, "offset %d", off)
			buf := make([]byte, r.Length)
			n, err := r.File.ReadAt(buf, r.Position)
			require.NoError(t, err)
			require.Equal(t, int(r.Length), n)
			read, err := l.Read(nil, off, ReadOptions{MaxBytes: maxBytes})
			require.NoError(t, err)
			require.Equal(t, read, buf, "offset %d max %d: region and read agree", off, maxBytes)
			batches := splitAll(t, buf)
			require.Equal(t, Batch(batches[0]).BaseOffset(), r.FirstOffset)
			require.Equal(t, Batch(batches[len(batches)-1]).NextOffset(), r.NextOffset)
			if maxBytes > len(batches[0]) {
				require.LessOrEqual(t, int(r.Length), maxBytes)
			}
			viaRegion = append(viaRegion, batches...)
			viaRead = append(viaRead, splitAll(t, read)...)
			off = r.NextOffset
		}
		require.Equal(t, want, viaRegion, "max %d", maxBytes)
		require.Equal(t, want, viaRead, "max %d", maxBytes)
	}

	// Reading from inside a gap starts at the next batch.
	r, err := l.ReadRegion(Batch(want[4]).NextOffset(), ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, Batch(want[5]).BaseOffset(), r.FirstOffset)
	gapStart := Batch(want[len(want)-2]).NextOffset() + 10
	r, err = l.ReadRegion(gapStart, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, Batch(want[len(want)-1]).BaseOffset(), r.FirstOffset)

	r, err = l.ReadRegion(l.LogEndOffset(), ReadOptions{})
	require.NoError(t, err)
	require.Zero(t, r.Length)
	require.Equal(t, l.LogEndOffset(), r.NextOffset)
}

// TestFindOffsetByTimestamp follows Kafka's testFindOffsetByTimestamp:
// the first record with a timestamp >= the target, across segments, with
// timestamps that go back and forth, and after a reopen.
func TestFindOffsetByTimestamp(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	// Batch i holds 3 records with timestamps base_i, base_i+1, base_i+2;
	// every fifth batch goes back in time.
	var recTS []int64
	for i := 0; i < 120; i++ {
		base := int64(10_000 + i*10)
		if i%5 == 3 {
			base -= 25
		}
		_, err := l.Append(buildBatch(t, 3, 50, base))
		require.NoError(t, err)
		recTS = append(recTS, base, base+1, base+2)
	}
	require.Greater(t, len(l.segments()), 3)
	expect := func(ts int64) (int64, bool) {
		for off, rts := range recTS {
			if rts >= ts {
				return int64(off), true
			}
		}
		return 0, false
	}
	check := func(l *Log) {
		t.Helper()
		for ts := int64(9_990); ts <= 11_220; ts += 3 {
			wantOff, wantOK := expect(ts)
			off, ok, err := l.OffsetForTimestamp(ts)
			require.NoError(t, err)
			require.Equal(t, wantOK, ok, "ts %d", ts)
			if ok {
				require.Equal(t, wantOff, off, "ts %d", ts)
			}
		}
	}
	check(l)
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	check(l)

	// Below the log start, the answer is never an offset that cannot be read.
	require.NoError(t, l.DeleteRecordsBefore(100))
	off, ok, err := l.OffsetForTimestamp(0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(100), off)
}

func TestWaitForData(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	ctx := context.Background()

	// waitInBackground starts a waiter and returns once it is parked (it
	// has taken the wait channel), so that a wake-up after it is tested.
	waitInBackground := func(offset int64, hw bool, ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() { done <- l.WaitForData(ctx, offset, hw) }()
		for l.waiters.ch.Load() == nil {
			select {
			case err := <-done:
				done <- err
				return done
			default:
				runtime.Gosched()
			}
		}
		return done
	}

	done := waitInBackground(0, false, ctx)
	appendN(t, l, 1, 0)
	require.NoError(t, <-done, "woken by an append")
	require.NoError(t, l.WaitForData(ctx, 2, false), "data is already there")

	done = waitInBackground(0, true, ctx)
	appendN(t, l, 1, 0) // the high watermark stays at 0
	l.SetHighWatermark(3)
	require.NoError(t, <-done, "woken by the high watermark")

	cctx, cancel := context.WithCancel(ctx)
	done = waitInBackground(6, false, cctx)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	done = waitInBackground(6, false, ctx)
	require.NoError(t, l.Close())
	require.ErrorIs(t, <-done, ErrClosed)
	require.ErrorIs(t, l.WaitForData(ctx, 0, false), ErrClosed)
}

// TestWaitForDataMany has many tailing readers woken by one append each
// time, with -race.
func TestWaitForDataMany(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	const readers, appends = 8, 30
	errs := make(chan error, readers)
	for r := 0; r < readers; r++ {
		go func() {
			next := int64(0)
			for next < appends {
				if err := l.WaitForData(context.Background(), next, false); err != nil {
					errs <- err
					return
				}
				buf, err := l.Read(nil, next, ReadOptions{})
				if err != nil {
					errs <- err
					return
				}
				for rest := buf; len(rest) > 0; {
					b, r, err := SplitBatch(rest)
					if err != nil {
						errs <- err
						return
					}
					next = b.NextOffset()
					rest = r
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < appends; i++ {
		_, err := l.Append(buildBatch(t, 1, 10, 0))
		require.NoError(t, err)
	}
	for r := 0; r < readers; r++ {
		require.NoError(t, <-errs)
	}
}

// TestReadDetectsCorruption: a byte flipped in a record (covered by the
// CRC only) is reported as ErrCorrupt by Read with VerifyReadCRC and by a
// Reader by default; the batches before it are returned.
func TestReadDetectsCorruption(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs := vfs.NewMem()
	opts := testLogOptions(fs)
	opts.VerifyReadCRC = true
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 5, 0)
	flipRecordByte(t, fs, len(want[0])+len(want[1])+70)

	buf, err := l.Read(nil, 0, ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err, "the good batches before the damage are returned")
	require.Equal(t, want[:2], splitAll(t, buf))
	_, err = l.Read(nil, 6, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	require.True(t, errors.Is(err, ErrCorrupt))
	buf, err = l.Read(nil, 9, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, want[3], buf)

	r := l.NewReader(0, ReaderOptions{})
	for i := range 2 {
		b, err := r.TryNext()
		require.NoError(t, err)
		require.Equal(t, want[i], []byte(b))
	}
	_, err = r.TryNext()
	require.ErrorIs(t, err, ErrCorrupt, "a Reader verifies CRCs by default")
}

// TestReadLeavesCRCToConsumer: by default Read, like Kafka's broker, does
// not recompute CRCs (the consumer does), but it still checks framing and
// offsets; a Reader with SkipCRC does the same.
func TestReadLeavesCRCToConsumer(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs := vfs.NewMem()
	l := openLog(t, "/log", testLogOptions(fs))
	want := appendN(t, l, 5, 0)
	pos := len(want[0]) + len(want[1]) + 70
	flipRecordByte(t, fs, pos)

	buf, err := l.Read(nil, 0, ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	got := splitAll(t, buf)
	require.Len(t, got, 5)
	require.Equal(t, want[:2], got[:2])
	require.NotEqual(t, want[2], got[2], "the stored bytes are returned")
	require.ErrorIs(t, Batch(got[2]).ValidateHeader(), ErrCorrupt, "the consumer's check finds the flip")

	r := l.NewReader(0, ReaderOptions{SkipCRC: true})
	for range 5 {
		_, err := r.TryNext()
		require.NoError(t, err)
	}

	// Damage outside the CRC (the base offset) is still caught.
	flipRecordByte(t, fs, len(want[0])+len(want[1])+3)
	_, err = l.Read(nil, 6, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
}

// flipRecordByte overwrites byte pos of the first segment of /log.
func flipRecordByte(t *testing.T, fs vfs.FS, pos int) {
	t.Helper()
	f, err := fs.OpenFile("/log/"+segmentName(0)+logSuffix, os.O_RDWR, 0)
	require.NoError(t, err)
	var b [1]byte
	_, err = f.ReadAt(b[:], int64(pos))
	require.NoError(t, err)
	b[0] ^= 0xee
	_, err = f.WriteAt(b[:], int64(pos))
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
