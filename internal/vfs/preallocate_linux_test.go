package vfs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// allocated returns the bytes of disk space f holds.
func allocated(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	return st.Blocks * 512
}

// TestPreallocate: the space is allocated and the size kept; writes land
// in it; truncating to the size releases the rest. MemFS files ignore it.
func TestPreallocate(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, Preallocate(f, 1<<20))
	if allocated(t, f) == 0 {
		t.Skip("the temporary directory's filesystem does not preallocate")
	}
	require.GreaterOrEqual(t, allocated(t, f), int64(1<<20))
	st, err := f.Stat()
	require.NoError(t, err)
	require.Zero(t, st.Size(), "the size is kept")

	_, err = f.WriteAt([]byte("data"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(4))
	require.Less(t, allocated(t, f), int64(64<<10), "truncating to the size releases the rest")

	mem := NewMem()
	mf, err := mem.OpenFile("/m", os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, Preallocate(mf, 1<<20))
	st, err = mf.Stat()
	require.NoError(t, err)
	require.Zero(t, st.Size())
}
