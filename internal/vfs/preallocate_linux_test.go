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

// dirPreallocates reports whether dir's filesystem allocates space ahead
// of a file's size, found with fallocate itself, not with the code under
// test (a Preallocate that does nothing must fail the test, not skip it).
func dirPreallocates(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.CreateTemp(dir, "fallocate-probe")
	require.NoError(t, err)
	defer os.Remove(f.Name())
	defer f.Close()
	const keepSize = 1 // FALLOC_FL_KEEP_SIZE
	if err := syscall.Fallocate(int(f.Fd()), keepSize, 0, 1<<20); err != nil {
		return false // EOPNOTSUPP, ENOSYS...
	}
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	return st.Blocks*512 >= 1<<20
}

// TestPreallocate: the space is allocated and the size kept; writes land
// in it; truncating to the size releases the rest. MemFS files ignore it.
func TestPreallocate(t *testing.T) {
	dir := t.TempDir()
	if !dirPreallocates(t, dir) {
		t.Skip("the temporary directory's filesystem does not preallocate")
	}
	f, err := os.Create(filepath.Join(dir, "f"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, Preallocate(f, 1<<20))
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
