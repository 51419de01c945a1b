package log

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/stretchr/testify/require"
)

// The checks FuzzLogOps runs after each operation (fuzz_ops_test.go).

// check compares the log with the model.
func (r *opsRunner) check() {
	t, l, m := r.t, r.l, &r.m
	require.Equal(t, m.start, l.LogStartOffset(), "log start offset")
	require.Equal(t, m.end, l.LogEndOffset(), "log end offset")
	want := m.epochs
	if want == nil {
		want = []EpochEntry{}
	}
	got := l.LeaderEpochs()
	if got == nil {
		got = []EpochEntry{}
	}
	require.Equal(t, want, got, "leader epochs")
	live := m.live()
	r.requireBatches(live, r.readFrom(m.start, -1), "batches from the log start %d", m.start)
	// From inside batches and gaps: the first batch ending at or after
	// the offset comes first.
	for _, b := range live {
		for _, off := range []int64{Batch(b).LastOffset(), Batch(b).BaseOffset() - 1} {
			if off < m.start {
				continue
			}
			i := 0
			for Batch(live[i]).LastOffset() < off {
				i++
			}
			r.requireBatches(live[i:i+1], r.readFrom(off, 1), "read at offset %d", off)
		}
	}
	r.checkRegion(m.start)
	if len(live) > 0 {
		r.checkRegion(Batch(live[len(live)/2]).LastOffset())
	}
	r.checkTimestamps(live)
	if m.start > 0 {
		_, err := l.Read(nil, m.start-1, ReadOptions{MaxBytes: 1 << 10})
		require.ErrorIs(t, err, ErrOffsetOutOfRange, "read below the log start")
	}
	_, err := l.Read(nil, m.end+1, ReadOptions{MaxBytes: 1 << 10})
	require.True(t, errors.Is(err, ErrOffsetOutOfRange), "read past the log end: %v", err)
}

// requireBatches fails unless got holds the batches of want, byte for
// byte; it names them by offsets rather than dumping them.
func (r *opsRunner) requireBatches(want, got [][]byte, msg string, args ...any) {
	r.t.Helper()
	describe := func(bs [][]byte) []string {
		out := []string{}
		for _, b := range bs {
			out = append(out, fmt.Sprintf("[%d,%d] %d bytes", Batch(b).BaseOffset(), Batch(b).LastOffset(), len(b)))
		}
		return out
	}
	require.Equal(r.t, describe(want), describe(got), append([]any{msg}, args...)...)
	for i := range want {
		require.True(r.t, bytes.Equal(want[i], got[i]), append([]any{msg + ": batch %d differs"}, append(args, i)...)...)
	}
}

// checkRegion compares ReadRegion at off with Read: the same bytes.
func (r *opsRunner) checkRegion(off int64) {
	o := ReadOptions{MaxBytes: 600}
	want, err := r.l.Read(nil, off, o)
	require.NoError(r.t, err)
	reg, err := r.l.ReadRegion(off, o)
	require.NoError(r.t, err)
	require.Equal(r.t, int64(len(want)), reg.Length, "ReadRegion(%d) length", off)
	if len(want) == 0 {
		return
	}
	got := make([]byte, reg.Length)
	_, err = reg.File.ReadAt(got, reg.Position)
	require.NoError(r.t, err)
	require.True(r.t, bytes.Equal(want, got), "ReadRegion(%d) bytes differ from Read's", off)
	first, _, _ := SplitBatch(want)
	require.Equal(r.t, first.BaseOffset(), reg.FirstOffset, "ReadRegion(%d) first offset", off)
	require.Equal(r.t, lastBatchOf(want).NextOffset(), reg.NextOffset, "ReadRegion(%d) next offset", off)
}

// checkTimestamps asks OffsetForTimestamp for a few timestamps: the
// answer is the first record at or after the log start whose timestamp
// is at least that.
func (r *opsRunner) checkTimestamps(live [][]byte) {
	type rec struct{ off, ts int64 }
	var recs []rec
	for _, b := range live {
		it := Batch(b).Records()
		for it.Next() {
			if x := it.Record(); x.Offset >= r.m.start {
				recs = append(recs, rec{x.Offset, x.Timestamp})
			}
		}
		require.NoError(r.t, it.Err())
	}
	targets := []int64{0, math.MaxInt64}
	if len(recs) > 0 {
		targets = append(targets, recs[0].ts, recs[len(recs)/2].ts, recs[len(recs)-1].ts+1)
	}
	for _, ts := range targets {
		want, wantOK := int64(0), false
		for _, x := range recs {
			if x.ts >= ts {
				want, wantOK = x.off, true
				break
			}
		}
		got, ok, err := r.l.OffsetForTimestamp(ts)
		require.NoError(r.t, err)
		require.Equal(r.t, wantOK, ok, "OffsetForTimestamp(%d) found", ts)
		require.Equal(r.t, want, got, "OffsetForTimestamp(%d)", ts)
	}
}

// readFrom reads whole batches from off to the log end, or only the first
// limit of them when limit >= 0, each as a copy.
func (r *opsRunner) readFrom(off int64, limit int) [][]byte {
	out := [][]byte{}
	end := r.l.LogEndOffset()
	for off < end && (limit < 0 || len(out) < limit) {
		buf, err := r.l.Read(nil, off, ReadOptions{MaxBytes: 600})
		require.NoError(r.t, err, "read at %d", off)
		if len(buf) == 0 {
			require.Fail(r.t, fmt.Sprintf("nothing read at offset %d below the log end %d", off, end))
		}
		for rest := buf; len(rest) > 0 && (limit < 0 || len(out) < limit); {
			b, more, err := SplitBatch(rest)
			require.NoError(r.t, err)
			out = append(out, slices.Clone([]byte(b)))
			off = b.NextOffset()
			rest = more
		}
	}
	return out
}
