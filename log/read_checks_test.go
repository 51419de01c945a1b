package log

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A read ending inside a batch whose own header is damaged (it fails the
// checks a header read from the file gets) returns the batch before it:
// that header says nothing about the last batch's offsets, and the
// damaged batch's own read reports it. Whether the header is taken from
// the bytes read or read from the file.
func TestReadKeepsTheLastBatchBeforeADamagedHeader(t *testing.T) {
	const last, next = 4, 5
	for _, tc := range []struct {
		name   string
		damage func(hdr []byte, lastBase int64)
	}{
		{"base offset below the segment", func(hdr []byte, _ int64) {
			binary.BigEndian.PutUint64(hdr[offBaseOffset:], ^uint64(0)) // -1
		}},
		{"bad magic, overlapping base offset", func(hdr []byte, lastBase int64) {
			hdr[offMagic] = 1
			binary.BigEndian.PutUint64(hdr[offBaseOffset:], uint64(lastBase))
		}},
		{"last offset delta past the segment, overlapping base offset", func(hdr []byte, lastBase int64) {
			binary.BigEndian.PutUint32(hdr[offLastOffsetDelta:], 1<<30)
			binary.BigEndian.PutUint64(hdr[offBaseOffset:], uint64(lastBase))
		}},
	} {
		for _, tail := range []int{BatchHeaderSize + 40, BatchHeaderSize, BatchHeaderSize - 1, 10} {
			name := fmt.Sprintf("%s/tail %d", tc.name, tail)
			fs, opts := memLog()
			l := openLog(t, "/log", opts)
			want := appendN(t, l, 8, 0)
			pos := positionOf(want, next)
			upTo := pos + tail // ends inside the batch after the last one read
			hdr := append([]byte(nil), want[next][:BatchHeaderSize]...)
			tc.damage(hdr, Batch(want[last]).BaseOffset())
			writeSegmentAt(t, fs, int64(pos), hdr)

			buf, err := l.Read(nil, 0, ReadOptions{MaxBytes: upTo})
			require.NoError(t, err, name)
			require.Equal(t, want[:next], splitAll(t, buf), "%s: the batch before the damaged header is returned", name)
			_, err = l.Read(nil, Batch(want[next]).BaseOffset(), ReadOptions{})
			require.ErrorIs(t, err, ErrCorrupt, "%s: the damaged batch's own read reports it", name)
			require.NoError(t, l.Close())
		}
	}
}

// The header after a read's last batch is checked from the bytes read
// when they hold it whole (exactly its 61 bytes, or more), and read from
// the file only when the read ends within it.
func TestReadChecksTheNextHeaderFromTheBytesRead(t *testing.T) {
	l, reads, _ := countLogReads(t)
	want := appendN(t, l, 8, 0)
	pos := positionOf(want, 5)
	count := func(tail int) int64 {
		reads.Store(0)
		buf, err := l.Read(nil, 0, ReadOptions{MaxBytes: pos + tail})
		require.NoError(t, err)
		require.Equal(t, want[:5], splitAll(t, buf), "tail %d", tail)
		return reads.Load()
	}
	inBody := count(BatchHeaderSize + 40)
	require.Equal(t, inBody, count(BatchHeaderSize), "a read holding the next header whole reads no more")
	require.Equal(t, inBody+1, count(BatchHeaderSize-1), "a read ending inside the next header reads it")
}

// emptyFollowerBatch is a batch of no records (as compaction leaves) at
// base, one offset long.
func emptyFollowerBatch(t *testing.T, base int64) []byte {
	t.Helper()
	b, err := NewBatchBuilder().Build(nil)
	require.NoError(t, err)
	require.Len(t, b, BatchHeaderSize)
	Batch(b).setBaseOffset(base)
	Batch(b).setLeaderEpoch(1)
	return b
}

// An empty batch last in the log is no exception to the check of the
// file's header against the one appended.
func TestReadAtLogEndRefusesADamagedEmptyBatch(t *testing.T) {
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	a, e := followerBatch(t, 0, 3, 1), emptyFollowerBatch(t, 3)
	for _, x := range [][]byte{a, e} {
		_, err := l.AppendAsFollower(x)
		require.NoError(t, err)
	}
	buf, err := l.Read(nil, 3, ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, e, buf)
	setBaseOffset(t, fs, int64(len(a)), 2) // overlaps a
	buf, err = l.Read(nil, 3, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	require.Empty(t, buf)
}

// Read at the log end refuses a file header that differs from the one
// appended in any byte, not only the base offset (no CRC verification:
// the comparison is what catches a damaged field the other checks let
// through, such as a smaller record count).
func TestReadAtLogEndComparesTheWholeHeader(t *testing.T) {
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 5, 0)
	last := Batch(want[len(want)-1])
	pos := int64(positionOf(want, len(want)-1))
	for i := range BatchHeaderSize {
		writeSegmentAt(t, fs, pos+int64(i), []byte{last[i] ^ 1})
		buf, err := l.Read(nil, last.BaseOffset(), ReadOptions{})
		require.ErrorIs(t, err, ErrCorrupt, "header byte %d", i)
		require.Empty(t, buf, "header byte %d", i)
		writeSegmentAt(t, fs, pos+int64(i), []byte{last[i]})
	}
	buf, err := l.Read(nil, last.BaseOffset(), ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, []byte(last), buf)
}

// An append of several batches remembers its last one, at its own
// position: a read at the log end then reads no header from the file.
func TestReadAtLogEndAfterAMultiBatchAppend(t *testing.T) {
	l, reads, _ := countLogReads(t)
	appendN(t, l, 3, 0)
	batches := concat(buildBatch(t, 2, 40, 100), buildBatch(t, 3, 40, 200))
	_, err := l.Append(batches)
	require.NoError(t, err)
	split := splitAll(t, batches)
	second := Batch(split[1])
	for off := second.BaseOffset(); off <= second.LastOffset(); off++ {
		reads.Store(0)
		r, err := l.ReadRegion(off, ReadOptions{})
		require.NoError(t, err)
		require.Zero(t, reads.Load(), "ReadRegion(%d) read the file", off)
		require.Equal(t, split[1], regionBytes(t, r))
	}
}
