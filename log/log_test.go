package log

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testClock is an injectable clock (Options.Now) that moves only when the
// test advances it. Safe for concurrent use (the flusher reads it).
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// memLog returns a fresh in-memory filesystem and options for a log in
// /log on it.
func memLog() (*vfs.MemFS, Options) {
	fs := vfs.NewMem()
	return fs, testLogOptions(fs)
}

func segmentBases(l *Log) []int64 {
	var out []int64
	for _, s := range l.segments() {
		out = append(out, s.base)
	}
	return out
}

// followerBatch builds a batch of n records carrying base offset base and
// leader epoch epoch, as a leader would have stamped it.
func followerBatch(t *testing.T, base int64, n int, epoch int32) []byte {
	t.Helper()
	b := buildBatch(t, n, 16, 1000+base)
	Batch(b).setBaseOffset(base)
	Batch(b).setLeaderEpoch(epoch)
	return b
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// crashCopy copies the log directory as a process crash (not a power
// loss) leaves it: every file with everything written to it, nothing
// closed. Call it while the Log is open.
func crashCopy(t *testing.T, fs vfs.FS) *vfs.MemFS {
	t.Helper()
	if m, ok := fs.(*vfs.MemFS); ok {
		// A consistent snapshot first: the flusher may be writing while
		// the files are copied one by one, which would mix states that no
		// crash leaves (an index read before its write, the checkpoint
		// that follows it read after).
		fs = m.CrashClone(vfs.CrashOptions{Kill: true})
	}
	dst := vfs.NewMem()
	require.NoError(t, dst.MkdirAll("/log", 0o755))
	require.NoError(t, dst.SyncDir("/"))
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)
	for _, n := range names {
		writeFileFS(t, dst, filepath.Join("/log", n), readFileFS(t, fs, filepath.Join("/log", n)))
	}
	require.NoError(t, dst.SyncDir("/log"))
	return dst
}

func fileExists(fs vfs.FS, path string) bool {
	_, err := fs.Stat(path)
	return err == nil
}

func TestSizeBasedLogRoll(t *testing.T) {
	requireNoGoroutineLeak(t)
	size := len(buildBatch(t, 2, 100, 0))
	tests := []struct {
		name         string
		segmentBytes int64
		perSegment   int
	}{
		{"exact fit", int64(5 * size), 5},
		{"room to spare", int64(5*size + size/2), 5},
		{"one per segment", int64(size), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := vfs.NewMem()
			l := openLog(t, "/log", Options{SegmentBytes: tt.segmentBytes, FS: fs})
			const n = 23
			for i := 0; i < n; i++ {
				info, err := l.Append(buildBatch(t, 2, 100, int64(i)))
				require.NoError(t, err)
				require.Equal(t, int64(2*i), info.FirstOffset)
			}
			segs := l.segments()
			require.Len(t, segs, (n+tt.perSegment-1)/tt.perSegment)
			for i, s := range segs {
				require.Equal(t, int64(2*i*tt.perSegment), s.base)
				if i < len(segs)-1 {
					require.Equal(t, int64(tt.perSegment*size), s.size.Load(), "segment %d", i)
				}
				require.LessOrEqual(t, s.size.Load(), tt.segmentBytes)
			}
			require.Equal(t, int64(len(segs)-1), l.Stats().Rolls)
			var want []string
			for _, s := range segs {
				want = append(want, filepath.Join("/log", fmt.Sprintf("%020d.log", s.base)))
			}
			require.Equal(t, want, segmentFiles(t, fs, "/log", logSuffix))
			require.NoError(t, l.Close())
		})
	}
}

func TestTimeBasedLogRoll(t *testing.T) {
	requireNoGoroutineLeak(t)
	clock := newTestClock()
	fs := vfs.NewMem()
	l := openLog(t, "/log", Options{SegmentAge: time.Hour, FS: fs, Now: clock.Now})
	appendOne := func() {
		t.Helper()
		_, err := l.Append(buildBatch(t, 1, 10, clock.Now().UnixMilli()))
		require.NoError(t, err)
	}
	appendOne()
	clock.Advance(time.Hour - time.Millisecond)
	appendOne()
	require.Len(t, l.segments(), 1, "younger than SegmentAge")
	clock.Advance(time.Millisecond)
	appendOne()
	require.Equal(t, []int64{0, 2}, segmentBases(l), "rolled at SegmentAge; the new batch starts the new segment")

	// An idle log does not roll an old segment until something is
	// appended, and an empty segment never rolls by age.
	clock.Advance(5 * time.Hour)
	require.Len(t, l.segments(), 2)
	appendOne()
	require.Equal(t, []int64{0, 2, 3}, segmentBases(l))
	clock.Advance(5 * time.Hour)
	require.NoError(t, l.TruncateTo(3)) // the active segment becomes empty
	appendOne()
	require.Equal(t, []int64{0, 2, 3}, segmentBases(l), "an empty segment is reused, not rolled")
}

// TestTimeBasedLogRollJitter follows Kafka's testTimeBasedLogRollJitter:
// each segment rolls at SegmentAge minus its own random jitter.
func TestTimeBasedLogRollJitter(t *testing.T) {
	requireNoGoroutineLeak(t)
	clock := newTestClock()
	const age, jitter = time.Hour, 30 * time.Minute
	l := openLog(t, "/log", Options{SegmentAge: age, SegmentJitter: jitter, FS: vfs.NewMem(), Now: clock.Now})
	seen := map[time.Duration]bool{}
	for round := 0; round < 6; round++ {
		act := l.active()
		j := act.jitter
		require.GreaterOrEqual(t, j, time.Duration(0))
		require.Less(t, j, jitter)
		seen[j] = true
		_, err := l.Append(buildBatch(t, 1, 10, 0))
		require.NoError(t, err)
		segs := len(l.segments())
		// The segment was created (or, for the first, opened) at
		// act.rollBase; it rolls once age - j has passed.
		clock.ns.Store(act.rollBase.Add(age - j - time.Millisecond).UnixNano())
		_, err = l.Append(buildBatch(t, 1, 10, 0))
		require.NoError(t, err)
		require.Len(t, l.segments(), segs, "round %d: rolled before age - jitter (%v)", round, age-j)
		clock.Advance(time.Millisecond)
		_, err = l.Append(buildBatch(t, 1, 10, 0))
		require.NoError(t, err)
		require.Len(t, l.segments(), segs+1, "round %d: not rolled at age - jitter (%v)", round, age-j)
	}
	require.Greater(t, len(seen), 1, "jitter is drawn per segment")
}

// TestRollOnFullIndex rolls a segment before its offset index would
// exceed MaxIndexBytes.
func TestRollOnFullIndex(t *testing.T) {
	requireNoGoroutineLeak(t)
	const maxEntries = 4
	l := openLog(t, "/log", Options{IndexIntervalBytes: 1, MaxIndexBytes: maxEntries * offsetEntrySize, FS: vfs.NewMem()})
	for i := 0; i < 20; i++ {
		_, err := l.Append(buildBatch(t, 1, 10, 0))
		require.NoError(t, err)
	}
	// One append of three batches at once.
	three := concat(buildBatch(t, 1, 10, 0), buildBatch(t, 1, 10, 0), buildBatch(t, 1, 10, 0))
	_, err := l.Append(three)
	require.NoError(t, err)
	segs := l.segments()
	require.Greater(t, len(segs), 5)
	for _, s := range segs {
		require.Less(t, s.offIdx.count(), maxEntries, "segment %d index", s.base)
	}
	require.Equal(t, int64(23), l.LogEndOffset())
	require.Len(t, readAllBatches(t, l), 23)
}

// TestRollOnRelativeOffsetOverflow: offsets in a segment are stored
// relative to its base as int32, so a follower batch too far from the
// base starts a new segment.
func TestRollOnRelativeOffsetOverflow(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	a := followerBatch(t, 0, 3, 1)
	b := followerBatch(t, math.MaxInt32-2, 3, 1) // last offset = base + MaxInt32: fits
	c := followerBatch(t, math.MaxInt32+1, 2, 1) // does not
	for _, x := range [][]byte{a, b, c} {
		_, err := l.AppendAsFollower(x)
		require.NoError(t, err)
	}
	require.Equal(t, []int64{0, math.MaxInt32 + 1}, segmentBases(l))
	require.Equal(t, int64(math.MaxInt32+3), l.LogEndOffset())
	want := [][]byte{a, b, c}
	require.Equal(t, want, readAllBatches(t, l))
	require.NoError(t, l.Close())

	// Clean and unclean reopen keep the layout.
	l = openLog(t, "/log", opts)
	require.Equal(t, want, readAllBatches(t, l))
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())
	opts.FS = img
	l = openLog(t, "/log", opts)
	require.Equal(t, want, readAllBatches(t, l))
	require.Equal(t, int64(math.MaxInt32+3), l.LogEndOffset())

	// A first batch far above an empty log's base moves the segment.
	fs2, opts2 := memLog()
	l2 := openLog(t, "/log", opts2)
	far := followerBatch(t, 1<<40, 2, 3)
	_, err := l2.AppendAsFollower(far)
	require.NoError(t, err)
	require.Equal(t, []int64{1 << 40}, segmentBases(l2))
	require.True(t, fileExists(fs2, "/log/00000001099511627776.log"))
	require.Equal(t, [][]byte{far}, readAllBatches(t, l2))
}

func TestAppendRejectsBatchTooLarge(t *testing.T) {
	requireNoGoroutineLeak(t)
	tests := []struct {
		name    string
		opts    Options
		batches []byte
	}{
		{"batch larger than a segment", Options{SegmentBytes: 4096}, buildBatch(t, 1, 5000, 0)},
		{"batch larger than MaxBatchBytes", Options{MaxBatchBytes: 1000}, buildBatch(t, 1, 1500, 0)},
		{"append larger than a segment", Options{SegmentBytes: 4096}, concat(buildBatch(t, 1, 3000, 0), buildBatch(t, 1, 3000, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.FS = vfs.NewMem()
			l := openLog(t, "/log", tt.opts)
			_, err := l.Append(buildBatch(t, 1, 10, 0))
			require.NoError(t, err)
			before := l.Stats()
			_, err = l.Append(tt.batches)
			require.ErrorIs(t, err, ErrBatchTooLarge)
			after := l.Stats()
			require.Equal(t, before.LogEndOffset, after.LogEndOffset)
			require.Equal(t, before.Bytes, after.Bytes)
			require.Equal(t, before.Segments, after.Segments)
			_, err = l.AppendAsFollower(tt.batches)
			require.ErrorIs(t, err, ErrBatchTooLarge)
		})
	}
}

func TestAppendAsLeaderAssignsOffsetsAndEpoch(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)

	first := buildBatch(t, 3, 20, 100)
	Batch(first).setBaseOffset(999) // whatever the producer sent is replaced
	info, err := l.AppendAsLeader(first, 5)
	require.NoError(t, err)
	require.Equal(t, AppendInfo{FirstOffset: 0, LastOffset: 2, MaxTimestamp: 102, Batches: 1, Records: 3, Bytes: len(first)}, info)

	multi := concat(buildBatch(t, 2, 20, 200), buildBatch(t, 1, 20, 300), buildBatch(t, 4, 20, 250))
	info, err = l.AppendAsLeader(multi, 6)
	require.NoError(t, err)
	require.Equal(t, int64(3), info.FirstOffset)
	require.Equal(t, int64(9), info.LastOffset)
	require.Equal(t, int64(300), info.MaxTimestamp)
	require.Equal(t, 3, info.Batches)
	require.Equal(t, 7, info.Records)

	info, err = l.Append(buildBatch(t, 1, 20, 400))
	require.NoError(t, err)
	require.Equal(t, int64(10), info.FirstOffset)
	require.Equal(t, int64(11), l.LogEndOffset())

	got := readAllBatches(t, l)
	require.Len(t, got, 5)
	wantBase := []int64{0, 3, 5, 6, 10}
	wantEpoch := []int32{5, 6, 6, 6, NoLeaderEpoch}
	for i, raw := range got {
		// Decode the stamped fields by hand.
		require.Equal(t, uint64(wantBase[i]), binary.BigEndian.Uint64(raw[0:]), "batch %d base offset", i)
		require.Equal(t, uint32(wantEpoch[i]), binary.BigEndian.Uint32(raw[12:]), "batch %d leader epoch", i)
		require.NoError(t, Batch(raw).Validate(), "batch %d: the CRC still holds", i)
		it := Batch(raw).Records()
		for k := int64(0); it.Next(); k++ {
			require.Equal(t, wantBase[i]+k, it.Record().Offset)
		}
		require.NoError(t, it.Err())
	}
	// The caller's slices were stamped in place, as documented.
	require.Equal(t, got[0], first)
	require.Equal(t, concat(got[1], got[2], got[3]), multi)
}

func TestAppendAsFollower(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	a, b := followerBatch(t, 0, 3, 2), followerBatch(t, 3, 3, 2)
	info, err := l.AppendAsFollower(concat(a, b))
	require.NoError(t, err)
	require.Equal(t, int64(0), info.FirstOffset)
	require.Equal(t, int64(5), info.LastOffset)
	gap := followerBatch(t, 10, 3, 4) // a gap, as compaction leaves
	_, err = l.AppendAsFollower(gap)
	require.NoError(t, err)
	require.Equal(t, int64(13), l.LogEndOffset())

	rejected := []struct {
		name    string
		batches []byte
	}{
		{"overlaps the end", followerBatch(t, 12, 2, 4)},
		{"far below the end", followerBatch(t, 5, 1, 4)},
		{"batches going backwards", concat(followerBatch(t, 20, 3, 4), followerBatch(t, 15, 3, 4))},
		{"batches overlapping", concat(followerBatch(t, 20, 3, 4), followerBatch(t, 22, 3, 4))},
		{"batches spanning more than a segment", concat(followerBatch(t, 20, 3, 4), followerBatch(t, 21+math.MaxInt32, 1, 4))},
		{"a leader epoch below the last batch's", followerBatch(t, 13, 1, 3)},
		{"leader epochs going down", concat(followerBatch(t, 13, 1, 5), followerBatch(t, 14, 1, 4))},
	}
	for _, r := range rejected {
		_, err := l.AppendAsFollower(r.batches)
		require.ErrorIs(t, err, ErrInvalidRecord, r.name)
		require.Equal(t, int64(13), l.LogEndOffset(), r.name)
	}
	require.Equal(t, [][]byte{a, b, gap}, readAllBatches(t, l), "offsets and epochs kept as given")
	// Leader appends continue after the follower's end.
	info, err = l.Append(buildBatch(t, 1, 5, 0))
	require.NoError(t, err)
	require.Equal(t, int64(13), info.FirstOffset)
}

// TestAppendAsFollowerLeapPastSegmentRange: a follower batch more than
// 2^31 offsets past the active segment's base starts a segment of its
// own, which recovery accepts and truncation removes whole.
func TestAppendAsFollowerLeapPastSegmentRange(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l, err := Open("/log", opts)
	require.NoError(t, err)
	a, far := followerBatch(t, 0, 3, 1), followerBatch(t, 100+math.MaxInt32, 2, 1)
	for _, b := range [][]byte{a, far} {
		_, err := l.AppendAsFollower(b)
		require.NoError(t, err)
	}
	require.Equal(t, []int64{0, 100 + math.MaxInt32}, segmentBases(l))
	require.Equal(t, [][]byte{a, far}, readAllBatches(t, l))

	img := crashCopy(t, fs) // recovery scans both segments
	opts2 := opts
	opts2.FS = img
	l2, err := Open("/log", opts2)
	require.NoError(t, err)
	require.Equal(t, [][]byte{a, far}, readAllBatches(t, l2))
	require.NoError(t, l2.Close())

	require.NoError(t, l.TruncateTo(5)) // in the gap
	require.Equal(t, int64(3), l.LogEndOffset())
	require.Equal(t, []int64{0}, segmentBases(l))
	b := followerBatch(t, 3, 2, 1)
	_, err = l.AppendAsFollower(b)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l3, err := Open("/log", opts)
	require.NoError(t, err)
	defer l3.Close()
	require.Equal(t, [][]byte{a, b}, readAllBatches(t, l3))
}

// TestTruncateToInAGap: truncating a follower's log to an offset in a
// gap between its batches, or to the batch after the gap, leaves it
// ending where the data before the gap does, not at the batch after the
// gap, which would claim offsets the log does not hold (a leader telling
// its follower to truncate there would then never see it converge).
func TestTruncateToInAGap(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	opts.SegmentBytes = 1 << 20
	l := openLog(t, "/log", opts)
	var before [][]byte
	for base := int64(0); base < 12; base += 3 { // indexed: 512-byte interval
		b := followerBatch(t, base, 3, 1)
		before = append(before, b)
		_, err := l.AppendAsFollower(b)
		require.NoError(t, err)
	}
	_, err := l.AppendAsFollower(concat(followerBatch(t, 1000, 3, 1), followerBatch(t, 1003, 3, 1)))
	require.NoError(t, err)
	require.NoError(t, l.TruncateTo(1003))
	require.Equal(t, int64(1003), l.LogEndOffset())
	// At the batch after the gap, as in it: the log ends before the gap.
	require.NoError(t, l.TruncateTo(1000))
	require.Equal(t, int64(12), l.LogEndOffset())
	require.Equal(t, before, readAllBatches(t, l))
	next := followerBatch(t, 12, 2, 1)
	_, err = l.AppendAsFollower(next)
	require.NoError(t, err)
	require.Equal(t, append(before, next), readAllBatches(t, l))
}

// TestTruncateToAGapBetweenSegments: the batch after a follower's gap
// starts a segment; truncating at it, or in the gap, removes that
// segment, so the log ends before the gap rather than at the removed
// segment's base, and the same after a reopen. Also after a reopen before
// the truncation, when the sealed segment's end is not yet known.
func TestTruncateToAGapBetweenSegments(t *testing.T) {
	for _, c := range []struct {
		name   string
		at     int64
		reopen bool
	}{{"at the batch", 1000, false}, {"in the gap", 500, false}, {"at the batch after a reopen", 1000, true}, {"in the gap after a reopen", 500, true}} {
		t.Run(c.name, func(t *testing.T) {
			requireNoGoroutineLeak(t)
			_, opts := memLog()
			var before [][]byte
			for base := int64(0); base < 12; base += 3 {
				before = append(before, followerBatch(t, base, 3, 1))
			}
			opts.SegmentBytes = int64(len(concat(before...)))
			l := openLog(t, "/log", opts)
			_, err := l.AppendAsFollower(concat(before...))
			require.NoError(t, err)
			_, err = l.AppendAsFollower(concat(followerBatch(t, 1000, 3, 1), followerBatch(t, 1003, 3, 1)))
			require.NoError(t, err)
			require.Equal(t, 2, l.Stats().Segments)
			if c.reopen {
				require.NoError(t, l.Close())
				l = openLog(t, "/log", opts)
			}
			require.NoError(t, l.TruncateTo(c.at))
			require.Equal(t, int64(12), l.LogEndOffset())
			require.Equal(t, before, readAllBatches(t, l))
			require.NoError(t, l.Close())
			l = openLog(t, "/log", opts)
			require.Equal(t, int64(12), l.LogEndOffset())
			next := followerBatch(t, 12, 2, 1)
			_, err = l.AppendAsFollower(next)
			require.NoError(t, err)
			require.Equal(t, append(before, next), readAllBatches(t, l))
		})
	}
}

// TestOpenEndsAtLastBatchAfterAGap: a power loss keeps a follower's roll
// to a segment after a gap (made durable at once) but not the append's
// unsynced batch; Open removes the empty segment, so the log ends where
// its last batch does rather than claiming the gap, and replication goes
// on from there.
func TestOpenEndsAtLastBatchAfterAGap(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	first := followerBatch(t, 0, 3, 1)
	_, err := l.AppendAsFollower(first)
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	base := int64(1<<31 + 10)
	_, err = l.AppendAsFollower(followerBatch(t, base, 3, 1))
	require.NoError(t, err)
	opts.FS = fs.CrashClone(vfs.CrashOptions{}) // only synced data
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, int64(3), l.LogEndOffset())
	require.Equal(t, 1, l.Stats().Segments)
	require.Equal(t, [][]byte{first}, readAllBatches(t, l))
	again := followerBatch(t, base, 3, 1)
	_, err = l.AppendAsFollower(again)
	require.NoError(t, err)
	require.Equal(t, [][]byte{first, again}, readAllBatches(t, l))
}

// TestOpenAfterAGapKeepsTheLogStart: as above, but the log start was moved
// into the gap by DeleteRecordsBefore, above every batch left: the
// reopened log is empty at that start, which a crash never moves down.
func TestOpenAfterAGapKeepsTheLogStart(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, 0, 3, 1))
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	base := int64(1<<31 + 10)
	_, err = l.AppendAsFollower(followerBatch(t, base, 3, 1))
	require.NoError(t, err)
	require.NoError(t, l.DeleteRecordsBefore(base-1)) // durable
	opts.FS = fs.CrashClone(vfs.CrashOptions{})       // the last batch was never synced
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, base-1, l.LogStartOffset())
	require.Equal(t, base-1, l.LogEndOffset())
	require.Empty(t, readAllBatches(t, l))
	again := followerBatch(t, base, 3, 1)
	_, err = l.AppendAsFollower(again)
	require.NoError(t, err)
	require.Equal(t, [][]byte{again}, readAllBatches(t, l))
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, base-1, l.LogStartOffset())
	require.Equal(t, [][]byte{again}, readAllBatches(t, l))
}

// TestFollowerLeapIntoAnEmptyLog: a follower's first batch too far past
// an empty log's start for its segment replaces the segment, and the log
// start moves up to it at once, as a reopen finds it.
func TestFollowerLeapIntoAnEmptyLog(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	require.NoError(t, l.TruncateFullyAndStartAt(200))
	base := int64(200 + 1<<31 + 5)
	b := followerBatch(t, base, 3, 1)
	_, err := l.AppendAsFollower(b)
	require.NoError(t, err)
	check := func(l *Log) {
		t.Helper()
		require.Equal(t, base, l.LogStartOffset())
		require.Equal(t, base+3, l.LogEndOffset())
		require.Equal(t, [][]byte{b}, readAllBatches(t, l))
		require.Equal(t, []EpochEntry{{Epoch: 1, StartOffset: base}}, l.LeaderEpochs())
	}
	check(l)
	require.NoError(t, l.Close())
	check(openLog(t, "/log", opts))
}

func TestAppendRejectsInvalidBatches(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.Append(buildBatch(t, 2, 10, 0))
	require.NoError(t, err)
	good := buildBatch(t, 2, 10, 0)
	badCRC := buildBatch(t, 2, 10, 0)
	badCRC[len(badCRC)-1] ^= 1
	tests := []struct {
		name    string
		batches []byte
		want    error
	}{
		{"nothing", nil, ErrInvalidRecord},
		{"bad crc", badCRC, ErrCorrupt},
		{"good then bad", concat(good, badCRC), ErrCorrupt},
		{"trailing bytes", concat(good, []byte{1, 2, 3}), ErrCorrupt},
		{"truncated", good[:len(good)-1], ErrCorrupt},
	}
	for _, tt := range tests {
		before := l.Stats()
		_, err := l.Append(append([]byte(nil), tt.batches...))
		require.ErrorIs(t, err, tt.want, tt.name)
		_, err = l.AppendAsFollower(append([]byte(nil), tt.batches...))
		require.ErrorIs(t, err, tt.want, tt.name)
		after := l.Stats()
		require.Equal(t, before.LogEndOffset, after.LogEndOffset, tt.name)
		require.Equal(t, before.Bytes, after.Bytes, tt.name)
	}
}

// TestConcurrentAppenders: appends from several goroutines (with readers
// and syncs running alongside) get dense, unique offsets, and each batch
// is stored intact at the offsets its append returned. Run with -race.
func TestConcurrentAppenders(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	opts.SegmentBytes = 16 << 10
	l := openLog(t, "/log", opts)
	const writers, perWriter = 4, 40
	type appended struct {
		info  AppendInfo
		batch []byte
	}
	results := make([][]appended, writers)
	errs := make(chan error, writers+2)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				bb := NewBatchBuilder()
				for r := 0; r <= i%3; r++ {
					bb.Add(int64(i), []byte(fmt.Sprintf("w%d", w)), []byte(fmt.Sprintf("w%d-i%d-r%d", w, i, r)))
				}
				b, err := bb.Build(nil)
				if err != nil {
					errs <- err
					return
				}
				info, err := l.Append(b)
				if err != nil {
					errs <- err
					return
				}
				results[w] = append(results[w], appended{info, b})
				if i%10 == 0 {
					if err := l.Sync(); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		// A tailing reader: everything it sees is whole, valid and dense.
		defer close(readerDone)
		next := int64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			buf, err := l.Read(nil, next, ReadOptions{MaxBytes: 4096})
			if err != nil {
				errs <- err
				return
			}
			for rest := buf; len(rest) > 0; {
				b, r, err := SplitBatch(rest)
				if err == nil {
					err = b.Validate()
				}
				if err == nil && b.BaseOffset() != next {
					err = fmt.Errorf("reader expected offset %d, got batch at %d", next, b.BaseOffset())
				}
				if err != nil {
					errs <- err
					return
				}
				next = b.NextOffset()
				rest = r
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-readerDone
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	var all []appended
	for _, r := range results {
		require.Len(t, r, perWriter)
		all = append(all, r...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].info.FirstOffset < all[j].info.FirstOffset })
	next := int64(0)
	for _, a := range all {
		require.Equal(t, next, a.info.FirstOffset, "offsets are dense and unique")
		require.Equal(t, int64(a.info.Records-1), a.info.LastOffset-a.info.FirstOffset)
		next = a.info.LastOffset + 1
	}
	require.Equal(t, next, l.LogEndOffset())
	stored := readAllBatches(t, l)
	require.Len(t, stored, len(all))
	for i, a := range all {
		require.Equal(t, a.batch, stored[i], "batch at offset %d", a.info.FirstOffset)
	}
}

// TestOpenDeletesObsoleteFiles follows Kafka's testOpenDeletesObsoleteFiles:
// temporary, deleted, cleaned and swap files and index files without a
// segment are removed on Open; segments and their indexes stay.
func TestOpenDeletesObsoleteFiles(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 60, 0)
	require.NoError(t, l.Close())
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)

	obsolete := []string{
		"00000000000000000000.log.deleted",
		"00000000000000000000.index.deleted",
		"00000000000000099999.log.deleted",
		"00000000000000000000.log.cleaned",
		"00000000000000000000.log.swap",
		"recovery-point.tmp",
		"00000000000000000000.snapshot.tmp",
		"00000000000000500000.index",
		"00000000000000500000.timeindex",
	}
	for _, n := range obsolete {
		writeFileFS(t, fs, filepath.Join("/log", n), []byte("junk"))
	}
	require.NoError(t, fs.SyncDir("/log"))
	l = openLog(t, "/log", opts)
	for _, n := range obsolete {
		require.False(t, fileExists(fs, filepath.Join("/log", n)), "%s removed", n)
	}
	for _, n := range names {
		if n == cleanShutdownFile {
			continue
		}
		require.True(t, fileExists(fs, filepath.Join("/log", n)), "%s kept", n)
	}
	require.Equal(t, want, readAllBatches(t, l))
}

// TestCleanShutdownFile follows Kafka's testCleanShutdownFile: Close
// leaves a marker; an Open that finds it scans nothing and removes it; an
// Open without it recovers.
func TestCleanShutdownFile(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	marker := "/log/" + cleanShutdownFile
	l := openLog(t, "/log", opts)
	require.False(t, fileExists(fs, marker))
	want := appendN(t, l, 80, 0)
	require.NoError(t, l.Close())
	require.True(t, fileExists(fs, marker))

	l = openLog(t, "/log", opts)
	require.False(t, fileExists(fs, marker), "removed by Open: a crash from now on is unclean")
	st := l.Stats()
	require.Zero(t, st.RecoveredSegments, "a clean reopen scans nothing")
	require.Equal(t, int64(240), st.LogEndOffset)
	require.Equal(t, st.LogEndOffset, st.RecoveryPoint)
	require.Equal(t, want, readAllBatches(t, l))

	// The process dies without Close.
	more := appendN(t, l, 5, 10_000)
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())
	require.False(t, fileExists(img, marker))
	opts.FS = img
	l = openLog(t, "/log", opts)
	st = l.Stats()
	require.Positive(t, st.RecoveredSegments, "an unclean reopen recovers")
	require.Zero(t, st.TruncatedBytes)
	require.Equal(t, append(want, more...), readAllBatches(t, l))
}

// waitRecoveryPoint waits for the background flusher to move the recovery
// point to the active segment's base.
func waitRecoveryPoint(t *testing.T, l *Log) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.RecoveryPoint() < l.active().base {
		require.True(t, time.Now().Before(deadline), "the flusher never advanced the recovery point to %d (at %d)", l.active().base, l.RecoveryPoint())
		time.Sleep(time.Millisecond)
	}
}

// TestRecoverOnlyLastSegment follows Kafka's testRecoverOnlyLastSegment:
// after an unclean shutdown only segments from the recovery point on are
// scanned. Damage below the recovery point is proof: a scan would have
// truncated the log there.
func TestRecoverOnlyLastSegment(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	opts.CheckpointInterval = -1 // the checkpoint follows every roll flush
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 100, 0)
	segs := len(l.segments())
	require.Greater(t, segs, 3)
	waitRecoveryPoint(t, l)
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())

	// Flip a byte inside the first batch of the first segment.
	first := "/log/" + segmentName(0) + logSuffix
	data := readFileFS(t, img, first)
	data[BatchHeaderSize+5] ^= 0xff
	writeFileFS(t, img, first, data)

	opts.FS = img
	opts.VerifyReadCRC = true
	l = openLog(t, "/log", opts)
	require.Equal(t, 1, l.Stats().RecoveredSegments)
	require.Equal(t, int64(300), l.LogEndOffset(), "nothing truncated")
	require.Len(t, l.segments(), segs)
	_, err := l.Read(nil, 0, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt, "the damage is reported on read")
	buf, err := l.Read(nil, 3, ReadOptions{MaxBytes: 1})
	require.NoError(t, err)
	require.Equal(t, want[1], buf)
	require.NoError(t, l.Close())

	// Without a recovery point every segment is scanned, and the scan
	// stops at damage. Valid batches follow it, so it is not a torn tail
	// but damage in the middle of the log: Open fails and changes no file
	// (S4: acknowledged data is never silently truncated away).
	img2 := crashCopy(t, fs)
	require.NoError(t, img2.Remove("/log/"+cleanShutdownFile))
	require.NoError(t, img2.Remove("/log/"+recoveryPointFile))
	third := segmentBases(l)[2]
	name := "/log/" + segmentName(third) + logSuffix
	data = readFileFS(t, img2, name)
	data[BatchHeaderSize+5] ^= 0xff
	writeFileFS(t, img2, name, data)
	opts.FS = img2
	before := readFileFS(t, img2, name)
	_, err = Open("/log", opts)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, segmentName(third)+logSuffix)
	require.Equal(t, before, readFileFS(t, img2, name), "the damaged segment is untouched")
	for _, base := range segmentBases(l) {
		_, err := img2.Stat("/log/" + segmentName(base) + logSuffix)
		require.NoError(t, err, "segment %d kept", base)
	}

	// TruncateAtCorruption: the log is truncated before the damaged
	// batch, everything before it intact, as Kafka's recovery does.
	opts.TruncateAtCorruption = true
	l = openLog(t, "/log", opts)
	require.Equal(t, 3, l.Stats().RecoveredSegments, "scanned up to the damage")
	require.Equal(t, third, l.LogEndOffset())
	require.Equal(t, want[:third/3], readAllBatches(t, l))
}

// logSnapshot is everything a reader can observe of a log.
type logSnapshot struct {
	start, end, hw int64
	bases          []int64
	batches        [][]byte
}

func snapshotLog(t *testing.T, l *Log) logSnapshot {
	t.Helper()
	return logSnapshot{l.LogStartOffset(), l.LogEndOffset(), l.HighWatermark(), segmentBases(l), readAllBatches(t, l)}
}

// TestReopenGivesSameState checks A4: opening the same directory twice,
// after a crash that tore the unsynced tail, gives the same state, and so
// does a clean reopen afterwards.
func TestReopenGivesSameState(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 40, 0)
	require.NoError(t, l.Sync())
	appendN(t, l, 40, 1000)
	l.SetHighWatermark(150)
	crash := vfs.CrashOptions{Seed: 7, KeepUnsynced: 1, ZeroSectors: 0.3, KeepDirOps: 0.5}
	imgA, imgB := fs.CrashClone(crash), fs.CrashClone(crash)
	require.NoError(t, l.Close())

	optsA, optsB := opts, opts
	optsA.FS, optsB.FS = imgA, imgB
	la := openLog(t, "/log", optsA)
	first := snapshotLog(t, la)
	require.GreaterOrEqual(t, first.end, int64(120), "synced data survives")
	require.NoError(t, la.Close())
	la = openLog(t, "/log", optsA)
	require.Equal(t, first, snapshotLog(t, la), "recovered then reopened cleanly")
	require.NoError(t, la.Close())
	lb := openLog(t, "/log", optsB)
	require.Equal(t, first, snapshotLog(t, lb), "the same crash image recovers the same way")
	require.NoError(t, lb.Close())
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 3, 0)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	// Close fsynced everything: DurableOffset says so (it used to keep
	// the last Sync's figure).
	require.Equal(t, l.LogEndOffset(), l.DurableOffset())

	calls := map[string]func() error{
		"Append":           func() error { _, err := l.Append(buildBatch(t, 1, 1, 0)); return err },
		"AppendAsFollower": func() error { _, err := l.AppendAsFollower(followerBatch(t, 100, 1, 0)); return err },
		"Read":             func() error { _, err := l.Read(nil, 0, ReadOptions{}); return err },
		"ReadRegion":       func() error { _, err := l.ReadRegion(0, ReadOptions{}); return err },
		"OffsetForTimestamp": func() error {
			_, _, err := l.OffsetForTimestamp(0)
			return err
		},
		"Sync":                    l.Sync,
		"TruncateTo":              func() error { return l.TruncateTo(1) },
		"TruncateFullyAndStartAt": func() error { return l.TruncateFullyAndStartAt(50) },
		"DeleteRecordsBefore":     func() error { return l.DeleteRecordsBefore(1) },
		"ApplyRetention":          func() error { _, err := l.ApplyRetention(); return err },
		"WaitForData": func() error {
			return l.WaitForData(context.Background(), 100, false)
		},
	}
	for name, call := range calls {
		require.ErrorIs(t, call(), ErrClosed, name)
	}
	assert.NotPanics(t, func() { _ = l.Stats() })
}

// TestCloseWaitsForConcurrentCalls closes a log while appends, reads and
// syncs run: every call returns nil or ErrClosed (or an error wrapping
// it), nothing panics, and no goroutine is left.
func TestCloseWaitsForConcurrentCalls(t *testing.T) {
	requireNoGoroutineLeak(t)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 5, 0)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				var err error
				switch (g + i) % 3 {
				case 0:
					b := NewBatchBuilder()
					b.Add(0, nil, []byte("x"))
					raw, _ := b.Build(nil)
					_, err = l.Append(raw)
				case 1:
					_, err = l.Read(nil, 0, ReadOptions{MaxBytes: 100})
				case 2:
					err = l.Sync()
				}
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						errs <- err
					}
					return
				}
			}
		}()
	}
	time.Sleep(10 * time.Millisecond) // let the calls overlap Close
	require.NoError(t, l.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestSecondCloseWaitsForTheFirst: a Close racing another returns only
// once the first has finished (the clean-shutdown marker written, the
// files closed), so a caller may reopen or remove the directory after it.
func TestSecondCloseWaitsForTheFirst(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var armed, released atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	l := openLog(t, "/log", testLogOptions(fs))
	armed.Store(true)
	for len(l.segments()) < 2 {
		appendN(t, l, 1, 0)
	}
	<-entered // the flusher is blocked in the rolled segment's fsync
	first := make(chan error, 1)
	go func() { first <- l.Close() }() // waits for the flusher
	time.Sleep(20 * time.Millisecond)
	second := make(chan bool, 1)
	go func() {
		_ = l.Close()
		second <- released.Load()
	}()
	time.Sleep(50 * time.Millisecond)
	released.Store(true)
	close(release)
	require.NoError(t, <-first)
	require.True(t, <-second, "the second Close returned while the first was still closing")
}

// A log opened in directories that did not exist keeps its synced data
// across a power loss: every directory Open created has a durable entry,
// not only the log's own. So does a Manager's data directory.
func TestOpenMakesEveryCreatedDirectoryDurable(t *testing.T) {
	mem := vfs.NewMem()
	l, err := Open("/data/topics/p0", Options{FS: mem})
	require.NoError(t, err)
	_, err = l.Append(buildBatch(t, 2, 10, 1000))
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	require.NoError(t, l.Close())
	m, err := OpenManager("/srv/replog/data", ManagerOptions{Log: Options{FS: mem}})
	require.NoError(t, err)
	ml, err := m.Create("a")
	require.NoError(t, err)
	_, err = ml.Append(buildBatch(t, 3, 10, 1000))
	require.NoError(t, err)
	require.NoError(t, ml.Sync())
	require.NoError(t, m.Close())

	img := mem.CrashClone(vfs.CrashOptions{})
	l, err = Open("/data/topics/p0", Options{FS: img})
	require.NoError(t, err)
	require.Equal(t, int64(2), l.LogEndOffset(), "the synced batch survives")
	require.NoError(t, l.Close())
	m, err = OpenManager("/srv/replog/data", ManagerOptions{Log: Options{FS: img}})
	require.NoError(t, err)
	ml, ok := m.Get("a")
	require.True(t, ok)
	require.Equal(t, int64(3), ml.LogEndOffset())
	require.NoError(t, m.Close())
}

// TestOpenRejectsBadOptions: every field out of range is refused with
// ErrInvalidOptions naming it (most were "negative option" or "invalid
// index or batch size options", naming none).
func TestOpenRejectsBadOptions(t *testing.T) {
	requireNoGoroutineLeak(t)
	bad := []struct {
		field string
		o     Options
	}{
		{"SegmentBytes", Options{SegmentBytes: 10}},
		{"SegmentBytes", Options{SegmentBytes: 1 << 32}},
		{"MaxIndexBytes", Options{MaxIndexBytes: 8}},
		{"MaxBatchBytes", Options{MaxBatchBytes: -1}},
		{"IndexIntervalBytes", Options{IndexIntervalBytes: -1}},
		{"SyncEveryMessages", Options{SyncEveryMessages: -1}},
		{"SyncInterval", Options{SyncInterval: -time.Second}},
		{"RetentionBytes", Options{RetentionBytes: -1}},
		{"RetentionAge", Options{RetentionAge: -time.Second}},
		{"RetentionCheckInterval", Options{RetentionCheckInterval: -time.Second}},
		{"FileDeleteDelay", Options{FileDeleteDelay: -time.Second}},
		{"SegmentJitter", Options{SegmentJitter: -time.Second}},
		{"ProducerIDExpiration", Options{ProducerIDExpiration: -time.Hour}},
		{"ProducerExpiryCheckInterval", Options{ProducerExpiryCheckInterval: -time.Second}},
	}
	for _, b := range bad {
		b.o.FS = vfs.NewMem()
		_, err := Open("/log", b.o)
		require.ErrorIs(t, err, ErrInvalidOptions, "%+v", b.o)
		require.ErrorContains(t, err, "Options."+b.field+" ")
	}
}

// TestSegmentJitterCappedAtSegmentAge: a jitter above the age would make
// every append roll.
func TestSegmentJitterCappedAtSegmentAge(t *testing.T) {
	var ms atomic.Int64
	clock := func() time.Time { return time.Unix(1_700_000_000, ms.Load()*int64(time.Millisecond)) }
	l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem(), SegmentAge: time.Hour, SegmentJitter: 100 * time.Hour, Now: clock})
	for range 20 {
		ms.Add(1)
		_, err := l.Append(buildBatch(t, 1, 10, 1000))
		require.NoError(t, err)
	}
	require.Len(t, l.segments(), 1)
}

// TestCheckpointIntervalDefersRecoveryPointFile: within CheckpointInterval
// roll flushes advance the recovery point in memory only; a crash then
// recovers from the older checkpoint, scanning more segments and losing
// nothing synced; once the interval has passed the flusher writes the
// checkpoint without another roll.
func TestCheckpointIntervalDefersRecoveryPointFile(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	opts.Now = func() time.Time { return time.Unix(0, now.Load()) }
	opts.CheckpointInterval = time.Minute
	l := openLog(t, "/log", opts)
	path := "/log/" + recoveryPointFile

	want := appendN(t, l, 40, 0) // the first roll flush writes the file
	waitRecoveryPoint(t, l)
	first, ok, err := readOffsetCheckpoint(fs, path)
	require.NoError(t, err)
	require.True(t, ok)
	want = append(want, appendN(t, l, 60, 400)...) // a minute has not passed
	waitRecoveryPoint(t, l)
	require.NoError(t, l.Sync())
	onDisk, _, err := readOffsetCheckpoint(fs, path)
	require.NoError(t, err)
	require.Equal(t, first, onDisk, "the checkpoint waits for the interval")
	require.Less(t, onDisk, l.RecoveryPoint())

	img := crashCopy(t, fs)
	crashed := opts
	crashed.FS = img
	l2 := openLog(t, "/log", crashed)
	require.Greater(t, l2.Stats().RecoveredSegments, 1, "recovery scans from the older checkpoint")
	buf, err := l2.Read(nil, 0, ReadOptions{MaxBytes: 1 << 30})
	require.NoError(t, err)
	got := splitAll(t, buf)
	for off := int64(len(got)) * 3; off < l2.LogEndOffset(); off = int64(len(got)) * 3 {
		buf, err = l2.Read(nil, off, ReadOptions{MaxBytes: 1 << 30})
		require.NoError(t, err)
		got = append(got, splitAll(t, buf)...)
	}
	require.Equal(t, len(want), len(got), "nothing synced is lost")
	require.NoError(t, l2.Close())

	now.Add(int64(time.Minute))
	l.bg.wake()
	require.Eventually(t, func() bool {
		v, _, err := readOffsetCheckpoint(fs, path)
		return err == nil && v == l.RecoveryPoint()
	}, 10*time.Second, time.Millisecond, "the flusher writes the late checkpoint")
}
