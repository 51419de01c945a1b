package log

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestReaderSmokeTailAndTruncate(t *testing.T) {
	l, err := Open(t.TempDir(), Options{SegmentBytes: 8 << 10})
	require.NoError(t, err)
	defer l.Close()
	for i := 0; i < 50; i++ {
		_, err := l.Append(buildBatch(t, 3, 100, int64(i)))
		require.NoError(t, err)
	}
	r := l.NewReader(0, ReaderOptions{BufferBytes: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	want := int64(0)
	for want < 150 {
		b, err := r.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, want, b.BaseOffset())
		want = b.NextOffset()
	}
	done := make(chan int64)
	go func() {
		b, err := r.Next(ctx)
		if err != nil {
			done <- -1
			return
		}
		done <- b.BaseOffset()
	}()
	_, err = l.Append(buildBatch(t, 3, 100, 99))
	require.NoError(t, err)
	require.Equal(t, int64(150), <-done)
	require.NoError(t, l.TruncateTo(30))
	_, err = r.TryNext()
	require.ErrorIs(t, err, ErrTruncated)
	require.Equal(t, int64(30), r.Offset())
	_, err = l.Append(buildBatch(t, 3, 100, 100))
	require.NoError(t, err)
	b, err := r.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(30), b.BaseOffset())
}
