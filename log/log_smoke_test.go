package log

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// buildBatch makes an uncompressed batch of n records with the given
// value size, timestamps starting at ts.
func buildBatch(t testing.TB, n, valueSize int, ts int64) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	for i := 0; i < n; i++ {
		v := make([]byte, valueSize)
		for j := range v {
			v[j] = byte(i + j)
		}
		bb.Add(ts+int64(i), []byte(fmt.Sprintf("k%d", i)), v)
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

func TestSmokeAppendReadReopen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{SegmentBytes: 16 << 10, IndexIntervalBytes: 1024})
	require.NoError(t, err)
	var want [][]byte
	for i := 0; i < 200; i++ {
		b := buildBatch(t, 4, 100, int64(1000+i*10))
		info, err := l.Append(b)
		require.NoError(t, err)
		require.Equal(t, int64(i*4), info.FirstOffset)
		want = append(want, append([]byte(nil), b...))
	}
	require.NoError(t, l.Sync())
	require.Greater(t, l.Stats().Segments, 3)
	check := func(l *Log) {
		t.Helper()
		off := int64(0)
		i := 0
		var buf []byte
		for off < l.LogEndOffset() {
			var err error
			buf, err = l.Read(buf[:0], off, ReadOptions{MaxBytes: 3000})
			require.NoError(t, err)
			require.NotEmpty(t, buf)
			for rest := buf; len(rest) > 0; {
				b, r, err := SplitBatch(rest)
				require.NoError(t, err)
				require.Equal(t, want[i], []byte(b), "batch %d", i)
				i++
				off = b.NextOffset()
				rest = r
			}
		}
		require.Equal(t, 200, i)
		o, ok, err := l.OffsetForTimestamp(1000 + 57*10 + 2)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, int64(57*4+2), o)
	}
	check(l)
	require.NoError(t, l.Close())
	l, err = Open(dir, Options{SegmentBytes: 16 << 10, IndexIntervalBytes: 1024})
	require.NoError(t, err)
	require.Equal(t, int64(800), l.LogEndOffset())
	check(l)
	require.NoError(t, l.TruncateTo(402))
	require.Equal(t, int64(400), l.LogEndOffset())
	info, err := l.Append(buildBatch(t, 4, 100, 5000))
	require.NoError(t, err)
	require.Equal(t, int64(400), info.FirstOffset)
	require.NoError(t, l.Close())
}
