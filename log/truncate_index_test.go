package log

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTruncateDropsIndexEntryAtCut: TruncateTo at the base offset
// of an indexed one-record batch must drop that batch's index entry:
// otherwise the batch appended in its place (with more records) is found
// through a stale entry that disagrees with it, and reads fail.
func TestTruncateDropsIndexEntryAtCut(t *testing.T) {
	_, opts := memLog()
	opts.IndexIntervalBytes = 1 // every batch after the first is indexed
	l := openLog(t, "/log", opts)
	for i := 0; i < 4; i++ {
		_, err := l.Append(buildBatch(t, 1, 16, int64(1000+i)))
		require.NoError(t, err)
	}
	require.NoError(t, l.TruncateTo(2))
	require.Equal(t, int64(2), l.LogEndOffset())
	nb := buildBatch(t, 3, 16, 2000)
	info, err := l.Append(nb)
	require.NoError(t, err)
	require.Equal(t, int64(2), info.FirstOffset)
	for off := int64(0); off < l.LogEndOffset(); off++ {
		buf, err := l.Read(nil, off, ReadOptions{})
		require.NoError(t, err, "read at %d", off)
		require.NotEmpty(t, buf, "read at %d", off)
		if off >= 2 {
			first, _, err := SplitBatch(buf)
			require.NoError(t, err)
			require.Equal(t, nb, []byte(first), "read at %d", off)
		}
	}
}
