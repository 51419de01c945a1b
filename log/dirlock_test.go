package log

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A log directory on the real filesystem is locked while a Log has it
// open: a second Open, here or in another process, fails with ErrLocked
// rather than recover and append under the first. Close, and an Open
// that fails, release it.
func TestOpenLocksTheDirectory(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	require.NoError(t, err)
	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrLocked)
	_, err = l.Append(buildBatch(t, 1, 10, 0))
	require.NoError(t, err)
	require.NoError(t, l.Close())

	// An Open that fails (a directory where a segment file goes) lets go.
	seg := filepath.Join(dir, segmentName(1)+logSuffix)
	require.NoError(t, os.Mkdir(seg, 0o755))
	_, err = Open(dir, Options{})
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrLocked)
	require.NoError(t, os.Remove(seg))
	l, err = Open(dir, Options{})
	require.NoError(t, err)
	require.Equal(t, int64(1), l.LogEndOffset())
	require.NoError(t, l.Close())
}

// A Manager locks its data directory the same way, and refuses a log
// named as the lock file.
func TestOpenManagerLocksTheDirectory(t *testing.T) {
	dir := t.TempDir()
	m, err := OpenManager(dir, ManagerOptions{})
	require.NoError(t, err)
	_, err = OpenManager(dir, ManagerOptions{})
	require.ErrorIs(t, err, ErrLocked)
	_, err = m.Create(lockFileName)
	require.ErrorIs(t, err, ErrInvalidLogName)
	l, err := m.Create("a")
	require.NoError(t, err)
	_, err = l.Append(buildBatch(t, 1, 10, 0))
	require.NoError(t, err)
	require.NoError(t, m.Close())

	m, err = OpenManager(dir, ManagerOptions{})
	require.NoError(t, err)
	l, ok := m.Get("a")
	require.True(t, ok)
	require.Equal(t, int64(1), l.LogEndOffset())
	require.NoError(t, m.Close())
}
