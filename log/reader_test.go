package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replog/replog/compression"
	"github.com/stretchr/testify/require"
)

// Tests of issue 10: the Reader and tailing.

// hangGuard bounds a test that would otherwise hang on a lost wake-up. It
// is far above any expected duration and never decides a pass.
const hangGuard = 2 * time.Minute

// seqBatch builds a batch of records records whose values start with seq,
// so that every batch a test appends has its own CRC.
func seqBatch(tb testing.TB, bb *BatchBuilder, seq uint64, records, valueSize int) []byte {
	tb.Helper()
	bb.Reset(noProducer)
	v := make([]byte, max(valueSize, 8))
	binary.BigEndian.PutUint64(v, seq)
	for i := range records {
		v[len(v)-1] = byte(i)
		bb.Add(int64(seq), nil, v)
	}
	b, err := bb.Build(nil)
	require.NoError(tb, err)
	return b
}

// appendSeqBatches appends n one-record batches with sequence numbers
// from, from+1, ... (seqBatch) to l.
func appendSeqBatches(t *testing.T, l *Log, bb *BatchBuilder, from, n int) {
	t.Helper()
	for i := range n {
		_, err := l.Append(seqBatch(t, bb, uint64(from+i), 1, 8))
		require.NoError(t, err)
	}
}

// seqOf returns the sequence number seqBatch put in b's first record.
func seqOf(tb testing.TB, b Batch) uint64 {
	tb.Helper()
	it := b.Records()
	require.True(tb, it.Next(), "batch at %d has no record: %v", b.BaseOffset(), it.Err())
	return binary.BigEndian.Uint64(it.Record().Value)
}

// waitingIn counts the goroutines whose stack holds fn.
func waitingIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}

// awaitWaiting returns once n goroutines are parked in WaitForData.
func awaitWaiting(tb testing.TB, n int) {
	tb.Helper()
	deadline := time.Now().Add(hangGuard)
	for waitingIn("log.(*Log).waitForData(") < n {
		if time.Now().After(deadline) {
			tb.Fatalf("fewer than %d goroutines ever waited in WaitForData", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// crcSet records the CRCs of the batches a test appended.
type crcSet struct {
	mu   sync.Mutex
	crcs map[uint32]bool
}

func (s *crcSet) add(b Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.crcs == nil {
		s.crcs = make(map[uint32]bool)
	}
	s.crcs[b.CRC()] = true
}

func (s *crcSet) has(b Batch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crcs[b.CRC()]
}

// checkReadBatch checks a batch returned to a reader that expects offset
// want next: complete, valid, one the test appended, and starting exactly
// at want (appends leave no offset gaps, truncation cuts at batch
// boundaries).
func checkReadBatch(b Batch, want int64, appended *crcSet) error {
	if err := b.Validate(); err != nil {
		return fmt.Errorf("batch at %d: %w", want, err)
	}
	if !appended.has(b) {
		return fmt.Errorf("batch [%d, %d] was never appended", b.BaseOffset(), b.LastOffset())
	}
	if b.BaseOffset() != want {
		return fmt.Errorf("batch [%d, %d] returned to a reader at %d", b.BaseOffset(), b.LastOffset(), want)
	}
	return nil
}

// stressConsumer follows the log through a Reader until it reaches the
// offset published in final, checking every batch.
func stressConsumer(ctx context.Context, l *Log, o ReaderOptions, appended *crcSet, maxHW, final *atomic.Int64) (batches, resets int, err error) {
	r := l.NewReader(0, o)
	want := int64(0)
	for f := final.Load(); f == 0 || want < f; f = final.Load() {
		b, err := r.Next(ctx)
		var oor *OutOfRangeError
		switch {
		case errors.Is(err, ErrTruncated):
			if r.Offset() >= want {
				return batches, resets, fmt.Errorf("truncation reported at %d moved the reader from %d to %d", want, want, r.Offset())
			}
			want = r.Offset()
			resets++
			continue
		case errors.As(err, &oor):
			if !errors.Is(err, ErrOffsetOutOfRange) || oor.Offset != want || oor.LogStartOffset <= want {
				return batches, resets, fmt.Errorf("reader at %d: %w (%+v)", want, err, *oor)
			}
			r.SetOffset(oor.LogStartOffset)
			want = oor.LogStartOffset
			resets++
			continue
		case err != nil:
			return batches, resets, fmt.Errorf("reader at %d: %w", want, err)
		}
		if err := checkReadBatch(b, want, appended); err != nil {
			return batches, resets, err
		}
		if o.UpToHighWatermark && b.NextOffset() > maxHW.Load() {
			return batches, resets, fmt.Errorf("batch [%d, %d] returned above every high watermark set (%d)", b.BaseOffset(), b.LastOffset(), maxHW.Load())
		}
		want = b.NextOffset()
		if r.Offset() != want {
			return batches, resets, fmt.Errorf("reader offset %d after batch ending at %d", r.Offset(), want)
		}
		batches++
	}
	return batches, resets, nil
}

// stressReadConsumer follows the log through Log.Read, which reports a
// deleted position as ErrOffsetOutOfRange (and truncation not at all).
func stressReadConsumer(ctx context.Context, l *Log, appended *crcSet, final *atomic.Int64) (batches int, err error) {
	var buf []byte
	off := int64(0)
	for f := final.Load(); f == 0 || off < f; f = final.Load() {
		buf, err = l.Read(buf[:0], off, ReadOptions{MaxBytes: 3000})
		if errors.Is(err, ErrOffsetOutOfRange) {
			if start, end := l.LogStartOffset(), l.LogEndOffset(); off < start {
				off = start
			} else if off > end {
				off = end // truncated below off
			}
			continue
		}
		if err != nil {
			return batches, fmt.Errorf("Read(%d): %w", off, err)
		}
		if len(buf) == 0 {
			if err := l.WaitForData(ctx, off, false); err != nil {
				return batches, err
			}
			continue
		}
		for rest, first := buf, true; len(rest) > 0; first = false {
			b, r, err := SplitBatch(rest)
			if err != nil {
				return batches, fmt.Errorf("Read(%d) returned a partial batch: %w", off, err)
			}
			want := off
			if first && b.BaseOffset() <= off && off <= b.LastOffset() {
				// Read does not report truncation: after one, off may
				// lie inside a batch appended since.
				want = b.BaseOffset()
			}
			if err := checkReadBatch(b, want, appended); err != nil {
				return batches, fmt.Errorf("Read(%d): %w", off, err)
			}
			off, rest = b.NextOffset(), r
			batches++
		}
	}
	return batches, nil
}

func TestReaderConcurrentWithAppendsRollsRetentionAndTruncation(t *testing.T) {
	const appends = 1000
	l, err := Open(t.TempDir(), Options{SegmentBytes: 32 << 10, IndexIntervalBytes: 512, RetentionBytes: 80 << 10})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()

	var appended crcSet
	var maxHW, final atomic.Int64
	type result struct {
		name            string
		batches, resets int
		err             error
	}
	consumers := []struct {
		name string
		o    ReaderOptions
	}{
		{"default buffer", ReaderOptions{}},
		{"4 KiB buffer", ReaderOptions{BufferBytes: 4 << 10}},
		{"buffer below a batch", ReaderOptions{BufferBytes: 100}},
		{"up to the high watermark", ReaderOptions{BufferBytes: 2 << 10, UpToHighWatermark: true}},
	}
	results := make(chan result, len(consumers)+1)
	for _, c := range consumers {
		go func() {
			n, resets, err := stressConsumer(ctx, l, c.o, &appended, &maxHW, &final)
			results <- result{c.name, n, resets, err}
		}()
	}
	go func() {
		n, err := stressReadConsumer(ctx, l, &appended, &final)
		results <- result{"Log.Read", n, 0, err}
	}()

	bb := NewBatchBuilder()
	truncations, deleted := 0, 0
	for i := range appends {
		b := seqBatch(t, bb, uint64(i), 1+i%5, 100+(i*37)%400)
		appended.add(b)
		_, err := l.Append(b)
		require.NoError(t, err)
		leo := l.LogEndOffset()
		hw := leo - int64(i%7)
		if i%3 == 0 {
			hw = leo
		}
		// Published before it is set, so that no reader sees a high
		// watermark above it (the log raises hw to its start if below).
		maxHW.Store(max(maxHW.Load(), hw, l.LogStartOffset()))
		l.SetHighWatermark(hw)
		switch {
		case i%53 == 52:
			// Cut back a few batches: to the base offset of a batch
			// appended a little earlier.
			to := max(leo-int64(5+i%40), l.LogStartOffset())
			require.NoError(t, l.TruncateTo(to))
			truncations++
		case i%11 == 10:
			n, err := l.ApplyRetention()
			require.NoError(t, err)
			deleted += n
		}
		if i%50 == 0 {
			runtime.Gosched()
		}
	}
	// One last batch, which every consumer ends on.
	last := seqBatch(t, bb, appends, 1, 10)
	appended.add(last)
	final.Store(l.LogEndOffset() + 1)
	_, err = l.Append(last)
	require.NoError(t, err)
	maxHW.Store(l.LogEndOffset())
	l.SetHighWatermark(l.LogEndOffset())
	for range len(consumers) + 1 {
		r := <-results
		require.NoError(t, r.err, r.name)
		require.Positive(t, r.batches, r.name)
		t.Logf("%s: %d batches, %d repositionings", r.name, r.batches, r.resets)
	}
	require.Positive(t, truncations)
	require.Positive(t, deleted, "retention never deleted a segment")
	require.Greater(t, l.LogStartOffset(), int64(0))
}

func TestReaderTailSeesEveryAppendOnce(t *testing.T) {
	const appends = 10_000
	l, err := Open(t.TempDir(), Options{SegmentBytes: 64 << 10})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()

	caughtUp := make(chan struct{})
	done := make(chan error, 1)
	seen := make([]int, appends)
	go func() {
		done <- func() error {
			r := l.NewReader(0, ReaderOptions{})
			for n := 0; n < appends; n++ {
				b, err := r.Next(ctx)
				if err != nil {
					return err
				}
				if err := b.Validate(); err != nil {
					return err
				}
				it, err := r.Records(nil)
				if err != nil {
					return err
				}
				for it.Next() {
					rec := it.Record()
					seq := binary.BigEndian.Uint64(rec.Value)
					if seq >= appends || int64(seq) != rec.Offset {
						return fmt.Errorf("record %d at offset %d", seq, rec.Offset)
					}
					seen[seq]++
				}
				if err := it.Err(); err != nil {
					return err
				}
				if n%10 == 9 {
					caughtUp <- struct{}{}
				}
			}
			return nil
		}()
	}()
	bb := NewBatchBuilder()
	for i := range appends {
		_, err := l.Append(seqBatch(t, bb, uint64(i), 1, 16))
		require.NoError(t, err)
		if i%10 == 9 {
			// Let the reader catch up and wait, so that appends also
			// find it parked in Next.
			select {
			case <-caughtUp:
			case err := <-done:
				require.NoError(t, err)
				t.Fatal("reader stopped early")
			}
		}
	}
	require.NoError(t, <-done)
	for i, n := range seen {
		require.Equal(t, 1, n, "append %d seen %d times", i, n)
	}
	require.Greater(t, l.Stats().Segments, 3, "the reader should have crossed rolls")
}

func TestReaderThousandWaitersWakeOnOneAppend(t *testing.T) {
	const waiters = 1000
	for _, tc := range []struct {
		name string
		hw   bool // wait up to the high watermark
		wait func(ctx context.Context, l *Log, from int64) (int64, error)
	}{
		{"Reader.Next", false, func(ctx context.Context, l *Log, from int64) (int64, error) {
			b, err := l.NewReader(from, ReaderOptions{}).Next(ctx)
			if err != nil {
				return 0, err
			}
			return b.BaseOffset(), nil
		}},
		{"WaitForData", false, func(ctx context.Context, l *Log, from int64) (int64, error) {
			err := l.WaitForData(ctx, from, false)
			if err == nil && l.LogEndOffset() <= from {
				err = fmt.Errorf("woke with the log end offset at %d", l.LogEndOffset())
			}
			return from, err
		}},
		{"Reader.Next/UpToHighWatermark", true, func(ctx context.Context, l *Log, from int64) (int64, error) {
			b, err := l.NewReader(from, ReaderOptions{UpToHighWatermark: true}).Next(ctx)
			if err != nil {
				return 0, err
			}
			return b.BaseOffset(), nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Open(t.TempDir(), Options{})
			require.NoError(t, err)
			defer l.Close()
			bb := NewBatchBuilder()
			_, err = l.Append(seqBatch(t, bb, 0, 2, 8))
			require.NoError(t, err)
			l.SetHighWatermark(2)
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()

			before := runtime.NumGoroutine()
			var returned atomic.Int64
			got := make(chan error, waiters)
			for range waiters {
				go func() {
					off, err := tc.wait(ctx, l, 2)
					returned.Add(1)
					if err == nil && off != 2 {
						err = fmt.Errorf("woke with offset %d, want 2", off)
					}
					got <- err
				}()
			}
			awaitWaiting(t, waiters)
			// The waiters are the only goroutines added: waiting starts
			// none of its own. (Slack for the runtime's and the log's.)
			require.LessOrEqual(t, runtime.NumGoroutine()-before, waiters+4)

			_, err = l.Append(seqBatch(t, bb, 1, 3, 8))
			require.NoError(t, err)
			if tc.hw {
				// The append woke them; with the high watermark still at
				// 2 they must all wait again, and none may return.
				awaitWaiting(t, waiters)
				require.Zero(t, returned.Load())
				l.SetHighWatermark(l.LogEndOffset())
			}
			for i := range waiters {
				require.NoError(t, <-got, "waiter %d", i)
			}
			require.EqualValues(t, waiters, returned.Load())
		})
	}
}

func TestReaderUpToHighWatermarkWaitsForSetHighWatermark(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	for i := range 3 { // batches [0, 2], [3, 5], [6, 8]
		_, err := l.Append(seqBatch(t, bb, uint64(i), 3, 8))
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()

	r := l.NewReader(0, ReaderOptions{UpToHighWatermark: true})
	b, err := r.TryNext()
	require.NoError(t, err)
	require.Nil(t, b, "nothing is below the high watermark yet")

	got := make(chan int64, 1)
	go func() {
		b, err := r.Next(ctx)
		if err != nil {
			got <- -1
			return
		}
		got <- b.BaseOffset()
	}()
	awaitWaiting(t, 1)
	_, err = l.Append(seqBatch(t, bb, 3, 3, 8)) // [9, 11]: wakes the reader, which waits again
	require.NoError(t, err)
	awaitWaiting(t, 1)
	select {
	case off := <-got:
		t.Fatalf("reader returned batch %d before the high watermark moved", off)
	default:
	}
	l.SetHighWatermark(3)
	require.Equal(t, int64(0), <-got)
	b, err = r.TryNext()
	require.NoError(t, err)
	require.Nil(t, b, "[3, 5] is above the high watermark")

	// A high watermark inside a batch does not expose it, as for Read.
	l.SetHighWatermark(7)
	b, err = r.TryNext()
	require.NoError(t, err)
	require.NotNil(t, b)
	require.Equal(t, int64(3), b.BaseOffset())
	b, err = r.TryNext()
	require.NoError(t, err)
	require.Nil(t, b, "[6, 8] straddles the high watermark 7")
	read, err := l.Read(nil, 6, ReadOptions{UpToHighWatermark: true})
	require.NoError(t, err)
	require.Empty(t, read, "Read agrees")

	go func() {
		b, err := r.Next(ctx)
		if err != nil {
			got <- -1
			return
		}
		got <- b.BaseOffset()
	}()
	awaitWaiting(t, 1)
	l.SetHighWatermark(9)
	require.Equal(t, int64(6), <-got)

	// Without the option the same reader position reads up to the end.
	all := l.NewReader(6, ReaderOptions{})
	for _, want := range []int64{6, 9} {
		b, err := all.TryNext()
		require.NoError(t, err)
		require.NotNil(t, b)
		require.Equal(t, want, b.BaseOffset())
	}
}

func TestReaderRecordsCompressed(t *testing.T) {
	l, err := Open(t.TempDir(), Options{SegmentBytes: 8 << 10})
	require.NoError(t, err)
	defer l.Close()
	local := compression.NewLocal(compression.Options{})
	codecs := []compression.Codec{compression.None, compression.Gzip, compression.Snappy, compression.LZ4, compression.Zstd}
	const records = 40
	bb := NewBatchBuilder()
	for round := range 2 {
		for _, c := range codecs {
			opts := noProducer
			if c != compression.None {
				comp, err := CompressWith(local, c, 0)
				require.NoError(t, err)
				opts.Compressor = comp
			}
			bb.Reset(opts)
			for i := range records {
				bb.Add(int64(i), fmt.Appendf(nil, "%s-%d-k%d", c, round, i), bytes.Repeat([]byte{byte(i)}, 100+i))
			}
			b, err := bb.Build(nil)
			require.NoError(t, err)
			_, err = l.Append(b)
			require.NoError(t, err)
		}
	}

	r := l.NewReader(0, ReaderOptions{BufferBytes: 1 << 10})
	_, err = r.Records(local)
	require.ErrorIs(t, err, ErrInvalidRecord, "no batch yet")
	want := int64(0)
	for round := range 2 {
		for _, c := range codecs {
			b, err := r.TryNext()
			require.NoError(t, err)
			require.NotNil(t, b)
			require.Equal(t, int8(c), b.CodecID())
			if c != compression.None {
				_, err := r.Records(nil)
				require.ErrorIs(t, err, ErrInvalidRecord, "compressed batch without a Local")
			}
			it, err := r.Records(local)
			require.NoError(t, err)
			n := 0
			for it.Next() {
				rec := it.Record()
				require.Equal(t, want, rec.Offset)
				require.Equal(t, fmt.Sprintf("%s-%d-k%d", c, round, n), string(rec.Key))
				require.Equal(t, bytes.Repeat([]byte{byte(n)}, 100+n), rec.Value)
				n++
				want++
			}
			require.NoError(t, it.Err())
			require.Equal(t, records, n, "%s batch", c)
		}
	}
	b, err := r.TryNext()
	require.NoError(t, err)
	require.Nil(t, b)
	require.Greater(t, l.Stats().Segments, 1)
}

func TestReaderReadsSameBytesAsAppended(t *testing.T) {
	l, err := Open(t.TempDir(), Options{SegmentBytes: 8 << 10, IndexIntervalBytes: 1 << 10})
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	var want [][]byte
	for i := range 120 {
		b := seqBatch(t, bb, uint64(i), 1+i%4, 50+(i*53)%700)
		_, err := l.Append(b)
		require.NoError(t, err)
		want = append(want, b) // Append stamped the base offset in place
	}
	require.Greater(t, l.Stats().Segments, 5)
	for _, size := range []int{0, 100, 1000, 3000, 64 << 10} {
		t.Run(fmt.Sprintf("buffer=%d", size), func(t *testing.T) {
			r := l.NewReader(0, ReaderOptions{BufferBytes: size})
			for i, w := range want {
				b, err := r.TryNext()
				require.NoError(t, err)
				require.Equal(t, w, []byte(b), "batch %d", i)
			}
			b, err := r.TryNext()
			require.NoError(t, err)
			require.Nil(t, b)

			// An offset inside a batch returns that whole batch first.
			w := Batch(want[57])
			require.Positive(t, w.LastOffsetDelta())
			r.SetOffset(w.BaseOffset() + 1)
			b, err = r.TryNext()
			require.NoError(t, err)
			require.Equal(t, want[57], []byte(b))
			require.Equal(t, w.NextOffset(), r.Offset())
		})
	}
}

func TestReaderTruncationDropsBufferedBatches(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	for i := range 10 { // batches of 2: [0, 1], [2, 3], ...
		_, err := l.Append(seqBatch(t, bb, uint64(i), 2, 20))
		require.NoError(t, err)
	}
	r := l.NewReader(0, ReaderOptions{})
	b, err := r.TryNext() // the rest is now buffered
	require.NoError(t, err)
	require.Equal(t, uint64(0), seqOf(t, b))

	// Above the reader: it keeps going, and sees the new batches, never
	// the buffered ones that were cut.
	require.NoError(t, l.TruncateTo(6))
	for i := range 3 {
		_, err := l.Append(seqBatch(t, bb, uint64(100+i), 2, 20))
		require.NoError(t, err)
	}
	for _, want := range []uint64{1, 2, 100, 101, 102} {
		b, err := r.TryNext()
		require.NoError(t, err)
		require.NotNil(t, b)
		require.Equal(t, want, seqOf(t, b))
	}
	require.Equal(t, int64(12), r.Offset())

	// Below the reader: an error, then the batches written since.
	require.NoError(t, l.TruncateTo(8))
	_, err = l.Append(seqBatch(t, bb, 200, 2, 20))
	require.NoError(t, err)
	_, err = r.TryNext()
	require.ErrorIs(t, err, ErrTruncated)
	require.Equal(t, int64(8), r.Offset())
	b, err = r.TryNext()
	require.NoError(t, err)
	require.Equal(t, uint64(200), seqOf(t, b))
}

func TestReaderTruncatedBelowThenRegrown(t *testing.T) {
	// The log is truncated below the reader and grows past it again
	// before the reader looks: the offsets it would continue from now
	// hold other data, so it must still be told.
	l, err := Open(t.TempDir(), Options{SegmentBytes: 4 << 10})
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	for i := range 30 {
		_, err := l.Append(seqBatch(t, bb, uint64(i), 2, 100))
		require.NoError(t, err)
	}
	r := l.NewReader(0, ReaderOptions{BufferBytes: 1 << 10})
	for range 20 {
		_, err := r.TryNext()
		require.NoError(t, err)
	}
	require.Equal(t, int64(40), r.Offset())
	require.NoError(t, l.TruncateTo(10))
	for i := range 15 { // [10, 12], [13, 15], ...: other boundaries
		_, err := l.Append(seqBatch(t, bb, uint64(100+i), 3, 100))
		require.NoError(t, err)
	}
	require.NoError(t, l.TruncateTo(31)) // a later, higher truncation
	for i := range 10 {
		_, err := l.Append(seqBatch(t, bb, uint64(200+i), 3, 100))
		require.NoError(t, err)
	}
	require.Greater(t, l.LogEndOffset(), int64(40))
	_, err = r.TryNext()
	require.ErrorIs(t, err, ErrTruncated)
	require.Equal(t, int64(10), r.Offset(), "the reader resumes where the truncation cut")
	b, err := r.TryNext()
	require.NoError(t, err)
	require.Equal(t, int64(10), b.BaseOffset())
	require.Equal(t, uint64(100), seqOf(t, b))
}

func TestReaderOutOfRangeAfterRetention(t *testing.T) {
	l, err := Open(t.TempDir(), Options{SegmentBytes: 4 << 10, RetentionBytes: 8 << 10})
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	for i := range 60 {
		_, err := l.Append(seqBatch(t, bb, uint64(i), 2, 200))
		require.NoError(t, err)
	}
	r := l.NewReader(0, ReaderOptions{})
	_, err = r.TryNext()
	require.NoError(t, err)
	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	start := l.LogStartOffset()
	require.Greater(t, start, int64(2))

	_, err = r.TryNext()
	require.ErrorIs(t, err, ErrOffsetOutOfRange)
	var oor *OutOfRangeError
	require.ErrorAs(t, err, &oor)
	require.Equal(t, OutOfRangeError{Offset: 2, LogStartOffset: start}, *oor)
	require.Equal(t, int64(2), r.Offset(), "the reader stays put")
	r.SetOffset(oor.LogStartOffset)
	b, err := r.TryNext()
	require.NoError(t, err)
	require.Equal(t, start, b.BaseOffset())

	// DeleteRecordsBefore inside a segment.
	require.NoError(t, l.DeleteRecordsBefore(start+10))
	_, err = r.TryNext()
	require.ErrorAs(t, err, &oor)
	require.Equal(t, start+10, oor.LogStartOffset)
}

func TestReaderCloseWakesWaiter(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	r := l.NewReader(0, ReaderOptions{})
	got := make(chan error, 1)
	go func() {
		_, err := r.Next(ctx)
		got <- err
	}()
	awaitWaiting(t, 1)
	require.NoError(t, l.Close())
	require.ErrorIs(t, <-got, ErrClosed)
	_, err = r.TryNext()
	require.ErrorIs(t, err, ErrClosed)

	// A cancelled context ends a wait too.
	l2, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	defer l2.Close()
	cctx, ccancel := context.WithCancel(ctx)
	go func() {
		_, err := l2.NewReader(0, ReaderOptions{}).Next(cctx)
		got <- err
	}()
	awaitWaiting(t, 1)
	ccancel()
	require.ErrorIs(t, <-got, context.Canceled)
}

// raceEnabled reports a -race build, where sync.Pool drops items at
// random and allocation counts mean nothing.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func TestReaderSequentialReadsDoNotAllocate(t *testing.T) {
	if raceEnabled() {
		t.Skip("allocation counts are meaningless under -race")
	}
	l, err := Open(t.TempDir(), Options{SegmentBytes: 256 << 10, VerifyReadCRC: true})
	require.NoError(t, err)
	defer l.Close()
	bb := NewBatchBuilder()
	for i := range 100 {
		_, err := l.Append(seqBatch(t, bb, uint64(i), 8, 1000))
		require.NoError(t, err)
	}
	require.Greater(t, l.Stats().Segments, 2)
	end := l.LogEndOffset()

	buf := make([]byte, 0, 64<<10)
	read := func() {
		for off := int64(0); off < end; {
			buf, err = l.Read(buf[:0], off, ReadOptions{MaxBytes: 30 << 10})
			if err != nil || len(buf) == 0 {
				t.Fatalf("Read(%d): %d bytes, %v", off, len(buf), err)
			}
			for rest := buf; len(rest) > 0; {
				var b Batch
				b, rest, _ = SplitBatch(rest)
				off = b.NextOffset()
			}
		}
	}
	region := func() {
		for off := int64(0); off < end; {
			rg, err := l.ReadRegion(off, ReadOptions{MaxBytes: 30 << 10})
			if err != nil || rg.Length == 0 {
				t.Fatalf("ReadRegion(%d): %+v, %v", off, rg, err)
			}
			off = rg.NextOffset
		}
	}
	r := l.NewReader(0, ReaderOptions{BufferBytes: 30 << 10})
	reader := func() {
		r.SetOffset(0)
		for r.Offset() < end {
			if b, err := r.TryNext(); err != nil || b == nil {
				t.Fatalf("TryNext at %d: %v", r.Offset(), err)
			}
		}
	}
	// The background flusher allocates too: let it finish the rolls
	// before counting.
	waitRecoveryPoint(t, l)
	require.Zero(t, testing.AllocsPerRun(5, read), "Log.Read")
	require.Zero(t, testing.AllocsPerRun(5, region), "Log.ReadRegion")
	require.Zero(t, testing.AllocsPerRun(5, reader), "Reader")
}

// TestReaderWaitsInATailGap: should a log end in a follower's gap (Open
// removes such tails, so the test makes one by hand), a Reader inside it
// waits for the next batch instead of spinning past its context.
func TestReaderWaitsInATailGap(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 3, 1))
	require.NoError(t, err)
	const gapEnd = 100
	l.mu.Lock()
	require.NoError(t, l.roll(gapEnd))
	l.leo.Store(gapEnd)
	l.mu.Unlock()

	r := l.NewReader(3, ReaderOptions{})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := r.Next(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("Next in a tail gap did not return when its context ended")
	}
	next := followerBatch(t, gapEnd, 2, 1)
	_, err = l.AppendAsFollower(next)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := r.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, next, []byte(b))
}

// logOfOneRecordBatches opens a log in a new directory and appends n
// batches of one record, seqBatch 0 to n-1, at offsets 0 to n-1.
func logOfOneRecordBatches(t *testing.T, n int) (*Log, *BatchBuilder) {
	t.Helper()
	l, err := Open(t.TempDir(), Options{})
	require.NoError(t, err)
	bb := NewBatchBuilder()
	for i := range n {
		_, err := l.Append(seqBatch(t, bb, uint64(i), 1, 8))
		require.NoError(t, err)
	}
	return l, bb
}

// A Reader waiting past the log end learns of a truncation below its
// position at once, and goes on from the cut, even if the log never grows
// back to where it waited.
func TestReaderWaitingIsToldOfATruncation(t *testing.T) {
	l, bb := logOfOneRecordBatches(t, 10)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	r := l.NewReader(10, ReaderOptions{})
	got := make(chan error, 1)
	go func() {
		_, err := r.Next(ctx)
		got <- err
	}()
	awaitWaiting(t, 1)
	require.NoError(t, l.TruncateTo(5))
	require.ErrorIs(t, <-got, ErrTruncated)
	require.Equal(t, int64(5), r.Offset())
	_, err := l.Append(seqBatch(t, bb, 100, 1, 16))
	require.NoError(t, err)
	b, err := r.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), b.BaseOffset())
	require.Equal(t, uint64(100), seqOf(t, b))
}

// Raising the log start raises the high watermark with it, which wakes
// whoever waits for the high watermark to pass an offset below it.
func TestWaitForDataWokenByTheLogStartRaisingTheHighWatermark(t *testing.T) {
	l, _ := logOfOneRecordBatches(t, 10)
	defer l.Close()
	l.SetHighWatermark(5)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- l.WaitForData(ctx, 5, true) }()
	awaitWaiting(t, 1)
	require.NoError(t, l.DeleteRecordsBefore(8))
	require.Equal(t, int64(8), l.HighWatermark())
	require.NoError(t, <-got)
}

// A Reader that finds the log closed between its checks and its read of
// the files reports ErrClosed, not the closed file's error.
func TestReaderFillAfterCloseIsErrClosed(t *testing.T) {
	l, _ := logOfOneRecordBatches(t, 3)
	r := l.NewReader(0, ReaderOptions{})
	require.NoError(t, l.Close())
	_, err := r.fill(3) // as if Close came right after tryNext's check
	require.ErrorIs(t, err, ErrClosed)
}
