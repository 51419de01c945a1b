package log

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// timestampedBatch builds an uncompressed batch whose records carry the given
// timestamps.
func timestampedBatch(t *testing.T, ts ...int64) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	for i, x := range ts {
		bb.Add(x, []byte{byte(i)}, []byte("v"))
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

// TestOffsetForTimestampLogStartInsideBatch: the log start offset
// lies inside an uncompressed batch whose only record >= ts is below the
// log start. Kafka semantics: the answer is the first offset >= log start
// whose timestamp >= ts, here in the next batch (it was reported
// ErrCorrupt).
func TestOffsetForTimestampLogStartInsideBatch(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.Append(timestampedBatch(t, 100, 200, 100, 100, 100)) // offsets 0..4
	require.NoError(t, err)
	_, err = l.Append(timestampedBatch(t, 300)) // offset 5
	require.NoError(t, err)
	require.NoError(t, l.DeleteRecordsBefore(2))

	off, ok, err := l.OffsetForTimestamp(150)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(5), off)
}

// TestOffsetForTimestampMinInt64: every record's timestamp is >=
// math.MinInt64, so the answer is the first offset. The time index
// lookup searched ts-1, which wrapped to MaxInt64 and started the scan
// at the segment's newest time index entry.
func TestOffsetForTimestampMinInt64(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 10, 1000) // one segment, several index entries
	require.Len(t, l.segments(), 1)
	require.Greater(t, l.active().timeIdx.count(), 1)

	off, ok, err := l.OffsetForTimestamp(math.MinInt64)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(0), off)
}

// TestOffsetForTimestampFlippedLastTimeIndexEntry (S4 for the time
// index): one bit flipped in the timestamp of a sealed segment's last
// time index entry (still >= the entry before it, so the file validates)
// made OffsetForTimestamp skip that segment and answer with an offset
// of the next segment. A damaged index must give the right offset or
// ErrCorrupt, never a wrong offset.
func TestOffsetForTimestampFlippedLastTimeIndexEntry(t *testing.T) {
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 100, 1000)
	require.Greater(t, len(l.segments()), 2)
	seg0 := l.segments()[0]
	lastOff := seg0.next.Load() - 1 // last record of segment 0
	wantTS := int64(1000 + (lastOff/3)*10 + lastOff%3)
	require.NoError(t, l.Close())

	name := seg0.path(timeIndexSuffix)
	data := readFileFS(t, fs, name)
	require.GreaterOrEqual(t, len(data), 2*timeEntrySize)
	last := data[len(data)-timeEntrySize:]
	prev := data[len(data)-2*timeEntrySize:]
	lastTS := int64(binary.BigEndian.Uint64(last))
	prevTS := int64(binary.BigEndian.Uint64(prev))
	require.Equal(t, wantTS, lastTS)
	// Clear the lowest set bit of the last timestamp: one bit flip.
	flipped := lastTS & (lastTS - 1)
	require.GreaterOrEqual(t, flipped, prevTS, "the flipped file must still validate")
	binary.BigEndian.PutUint64(last, uint64(flipped))
	writeFileFS(t, fs, name, data)

	l = openLog(t, "/log", opts)
	off, ok, err := l.OffsetForTimestamp(wantTS)
	if err != nil {
		require.ErrorIs(t, err, ErrCorrupt)
		return
	}
	require.True(t, ok)
	require.Equal(t, lastOff, off, "offset of the record stamped %d", wantTS)
}

// TestOffsetForTimestampFlippedMaxTimestamp (S4): one bit flipped
// in the maxTimestamp header field (covered by the CRC) of a batch in a
// sealed segment. OffsetForTimestamp stepped over batches by their header
// without checking the CRC of the batches it skipped, so it silently
// skipped the damaged batch and returned the next batch's offset. It must
// return the right offset or an error wrapping ErrCorrupt.
func TestOffsetForTimestampFlippedMaxTimestamp(t *testing.T) {
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 100, 1000)
	require.Greater(t, len(l.segments()), 2)
	require.NoError(t, l.Close())

	// Batch k (offsets 3k..3k+2, stamped 1000+10k..+2) in segment 0.
	const k = 10
	pos := int64(0)
	for _, b := range want[:k] {
		pos += int64(len(b))
	}
	maxTS := Batch(want[k]).MaxTimestamp()
	target := int64(1000 + 10*k)
	bit := -1
	for i := 2; i < 16; i++ {
		if maxTS&(1<<i) != 0 && maxTS&^(1<<i) < target {
			bit = i
			break
		}
	}
	require.GreaterOrEqual(t, bit, 0)
	// maxTimestamp is big-endian at bytes [35, 43) of the batch.
	flipAt(t, fs, "/log/"+segmentName(0)+logSuffix, pos+zzReadOffMaxTimestamp+7-int64(bit/8), byte(1)<<(bit%8))

	l = openLog(t, "/log", opts)
	off, ok, err := l.OffsetForTimestamp(target)
	if err != nil {
		require.ErrorIs(t, err, ErrCorrupt)
		return
	}
	require.True(t, ok)
	require.Equal(t, Batch(want[k]).BaseOffset(), off, "offset of the first record stamped >= %d", target)
}

const zzReadOffMaxTimestamp = 35

// TestOffsetForTimestampEmptyBatchFromCompaction: a follower copies
// an empty batch (no records) whose header keeps the max timestamp of the
// records compaction removed, as Kafka's log cleaner writes them
// (DefaultRecordBatch.writeEmptyHeader with batch.maxTimestamp()), and
// which AppendAsFollower accepts. Kafka's searchForTimestamp moves on to
// the next batch, and so does OffsetForTimestamp (it reported ErrCorrupt).
func TestOffsetForTimestampEmptyBatchFromCompaction(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	h := defaultRawHeader(0)
	h.lastOffsetDelta = 4 // offsets 0..4, all compacted away
	h.baseTimestamp, h.maxTimestamp = 500, 500
	h.leaderEpoch = 0
	empty := rawBatch(h, nil)
	next := followerBatch(t, 5, 2, 0) // offsets 5, 6, stamped 1005, 1006
	_, err := l.AppendAsFollower(concat(empty, next))
	require.NoError(t, err)

	off, ok, err := l.OffsetForTimestamp(400)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(5), off)
}

// TestOffsetForTimestampBefore1970InTheActiveSegment: records before 1970
// make a batch's max timestamp NoTimestamp (Kafka's rule). A sealed
// segment of them was searched for such times, the active one skipped:
// the same records were found only after a roll.
func TestOffsetForTimestampBefore1970InTheActiveSegment(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.Append(timestampedBatch(t, -500, -400)) // offsets 0, 1
	require.NoError(t, err)
	for q, want := range map[int64]int64{math.MinInt64: 0, -1000: 0, -450: 1} {
		off, ok, err := l.OffsetForTimestamp(q)
		require.NoError(t, err)
		require.True(t, ok, "OffsetForTimestamp(%d) in the active segment", q)
		require.Equal(t, want, off, "OffsetForTimestamp(%d)", q)
	}
	_, ok, err := l.OffsetForTimestamp(0)
	require.NoError(t, err)
	require.False(t, ok, "no record at 0 or later")
}
