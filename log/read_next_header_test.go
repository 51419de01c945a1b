package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A read ending inside a batch checks its last whole batch against that
// batch's header: a damaged base offset (which no CRC covers) that makes
// the two overlap drops the damaged batch from the read. The header comes
// from the bytes read when they hold it whole, else from the file.
func TestReadChecksLastBatchAgainstTheNextHeader(t *testing.T) {
	for _, tail := range []int{BatchHeaderSize + 40, BatchHeaderSize, BatchHeaderSize - 1, 10} {
		fs, opts := memLog()
		l := openLog(t, "/log", opts)
		want := appendN(t, l, 8, 0)
		const damaged = 4
		pos := positionOf(want, damaged)
		upTo := pos + len(want[damaged]) + tail // ends inside the batch after

		// Shift the batch's base offset by one: its offsets then overlap
		// the next batch's first one.
		setBaseOffset(t, fs, int64(pos), Batch(want[damaged]).BaseOffset()+1)

		buf, err := l.Read(nil, 0, ReadOptions{MaxBytes: upTo})
		require.NoError(t, err, "tail %d", tail)
		require.Equal(t, want[:damaged], splitAll(t, buf), "tail %d: the damaged batch is not returned", tail)

		// Undamaged, the same read returns it.
		setBaseOffset(t, fs, int64(pos), Batch(want[damaged]).BaseOffset())
		buf, err = l.Read(nil, 0, ReadOptions{MaxBytes: upTo})
		require.NoError(t, err)
		require.Equal(t, want[:damaged+1], splitAll(t, buf), "tail %d", tail)
		require.NoError(t, l.Close())
	}
}
