package log

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestFileCacheInFlightWriteIsNotCountedAsSynced: an fsync that runs
// while a write is in flight (Log.Sync runs concurrently with an Append,
// which writes outside any lock Sync takes) does not cover it: the file
// stays dirty, off the list of synced files evicted first, so that an
// error of its writeback is not lost with its descriptor.
func TestFileCacheInFlightWriteIsNotCountedAsSynced(t *testing.T) {
	c := newFileCache(vfs.NewMem(), 8)
	cf, err := c.openFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)

	// An append's WriteAt has acquired the file and is about to write.
	f, err := cf.acquireWrite()
	require.NoError(t, err)
	// Meanwhile a Sync's fsync runs and completes.
	require.NoError(t, cf.Datasync())
	// Now the append's bytes land, after the fsync; the use ends.
	_, err = f.WriteAt([]byte("written after the fsync"), 0)
	require.NoError(t, err)
	cf.release()

	c.mu.Lock()
	onDirty := cf.list == &c.dirty
	c.mu.Unlock()
	require.True(t, onDirty, "a file whose last write no fsync covered is on the synced list")
}
