package vfs_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestFailedSyncLosesWriteback checks the fsyncgate model: after an
// injected fsync failure the unsynced bytes stay readable, a later
// successful Sync does not make them durable, and only writing them again
// does, as on Linux, where the failed pages are marked clean.
func TestFailedSyncLosesWriteback(t *testing.T) {
	mem, fsys := failFirstSync(t)
	f, err := fsys.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, fsys.SyncDir("/d"))
	_, err = f.WriteAt([]byte("aaaa"), 0)
	require.NoError(t, err)

	require.ErrorIs(t, f.Sync(), syscall.EIO, "the first Sync fails")
	require.Equal(t, "aaaa", readFile(t, mem, "/d/f"), "the data stays readable")
	_, err = f.WriteAt([]byte("bb"), 4)
	require.NoError(t, err)
	require.NoError(t, f.Sync(), "a later Sync succeeds")

	img := mem.CrashClone(vfs.CrashOptions{})
	require.Equal(t, "\x00\x00\x00\x00bb", readFile(t, img, "/d/f"),
		"the size and the bytes written after the failure are durable, the lost ones are not")
	kept := mem.CrashClone(vfs.CrashOptions{KeepUnsynced: 1})
	require.Equal(t, "\x00\x00\x00\x00bb", readFile(t, kept, "/d/f"), "a crash never keeps lost bytes")

	// A killed process leaves the kernel's state: the pages are still lost.
	killed := mem.CrashClone(vfs.CrashOptions{Kill: true})
	kf, err := killed.OpenFile("/d/f", os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, kf.Sync())
	require.Equal(t, "\x00\x00\x00\x00bb", readFile(t, killed.CrashClone(vfs.CrashOptions{}), "/d/f"))
	// Rewriting part of them makes that part durable.
	_, err = kf.WriteAt([]byte("aa"), 1)
	require.NoError(t, err)
	require.NoError(t, kf.Sync())
	require.Equal(t, "\x00aa\x00bb", readFile(t, killed.CrashClone(vfs.CrashOptions{}), "/d/f"))
	require.NoError(t, kf.Close())

	// Truncating below the lost bytes forgets them; growing again gives zeros.
	require.NoError(t, f.Truncate(2))
	require.NoError(t, f.Truncate(4))
	_, err = f.WriteAt([]byte("c"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.Equal(t, "c\x00\x00\x00", readFile(t, mem.CrashClone(vfs.CrashOptions{}), "/d/f"))
}

// TestFailedSyncKeepsPendingTruncation checks that a truncation pending
// when a Sync fails is still made durable by the next Sync, with the old
// durable bytes kept below the cut.
func TestFailedSyncKeepsPendingTruncation(t *testing.T) {
	mem, fsys := failFirstSync(t)
	f, err := mem.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, mem.SyncDir("/d"))
	_, err = f.WriteAt([]byte("abcdef"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())

	ef, err := fsys.OpenFile("/d/f", os.O_RDWR, 0)
	require.NoError(t, err)
	defer ef.Close()
	require.NoError(t, ef.Truncate(3))
	_, err = ef.WriteAt([]byte("X"), 1)
	require.NoError(t, err)
	require.Error(t, ef.Sync())
	require.NoError(t, ef.Sync())
	require.Equal(t, "abc", readFile(t, mem.CrashClone(vfs.CrashOptions{}), "/d/f"))
}

// failFirstSync returns a MemFS with a durable directory /d, and an
// ErrorFS over it whose first File.Sync fails with EIO.
func failFirstSync(t *testing.T) (*vfs.MemFS, *vfs.ErrorFS) {
	t.Helper()
	mem := vfs.NewMemWithOptions(vfs.MemOptions{MkdirAllDurable: true})
	require.NoError(t, mem.MkdirAll("/d", 0o755))
	return mem, vfs.NewErrorFS(mem, &vfs.FailAt{N: 0, Kinds: vfs.OpSync, Err: syscall.EIO})
}
