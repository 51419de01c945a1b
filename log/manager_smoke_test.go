package log

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestManagerSmoke(t *testing.T) {
	dir := t.TempDir()
	before := runtime.NumGoroutine()
	m, err := OpenManager(dir, ManagerOptions{Log: Options{SegmentBytes: 4 << 10}, MaxOpenFiles: 16})
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		l, err := m.Create(fmt.Sprintf("t-%d", i))
		require.NoError(t, err)
		for j := 0; j < 20; j++ {
			_, err := l.Append(buildBatch(t, 2, 100, int64(j)))
			require.NoError(t, err)
		}
	}
	require.LessOrEqual(t, m.Stats().OpenFiles, 16)
	require.Less(t, runtime.NumGoroutine()-before, 16)
	require.NoError(t, m.Close())
	m, err = OpenManager(dir, ManagerOptions{Log: Options{SegmentBytes: 4 << 10}, MaxOpenFiles: 16})
	require.NoError(t, err)
	require.Len(t, m.Names(), 100)
	for _, n := range m.Names() {
		l, ok := m.Get(n)
		require.True(t, ok)
		require.Equal(t, int64(40), l.LogEndOffset())
		r := l.NewReader(0, ReaderOptions{})
		cnt := 0
		for {
			b, err := r.TryNext()
			require.NoError(t, err)
			if b == nil {
				break
			}
			cnt += int(b.RecordCount())
		}
		require.Equal(t, 40, cnt)
	}
	require.NoError(t, m.Delete("t-5"))
	require.Len(t, m.Names(), 99)
	require.NoError(t, m.Close())
}
