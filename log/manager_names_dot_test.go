package log

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// winFS simulates Win32 path normalization (what os.MkdirAll, os.OpenFile
// and os.Rename do on Windows for paths shorter than MAX_PATH): trailing
// dots are stripped from every path component, so "orders-0." names
// "orders-0", and "..." names the directory it is in.
type winFS struct{ vfs.FS }

func winPath(p string) string {
	parts := strings.Split(p, "/")
	out := parts[:0]
	for i, c := range parts {
		if c != "." && c != ".." && c != "" {
			c = strings.TrimRight(c, ".")
			if c == "" {
				continue
			}
		} else if c == "" && i > 0 {
			continue
		}
		out = append(out, c)
	}
	if len(out) == 1 && out[0] == "" {
		return "/"
	}
	return strings.Join(out, "/")
}

func (f winFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	return f.FS.OpenFile(winPath(name), flag, perm)
}
func (f winFS) Remove(name string) error    { return f.FS.Remove(winPath(name)) }
func (f winFS) RemoveAll(name string) error { return f.FS.RemoveAll(winPath(name)) }
func (f winFS) Rename(a, b string) error    { return f.FS.Rename(winPath(a), winPath(b)) }
func (f winFS) MkdirAll(d string, p os.FileMode) error {
	return f.FS.MkdirAll(winPath(d), p)
}
func (f winFS) ReadDir(d string) ([]string, error)    { return f.FS.ReadDir(winPath(d)) }
func (f winFS) Stat(name string) (os.FileInfo, error) { return f.FS.Stat(winPath(name)) }
func (f winFS) SyncDir(d string) error                { return f.FS.SyncDir(winPath(d)) }

// On Windows a path component's trailing dots are dropped, so
// "orders-0." is the directory of log "orders-0" (and "..." the data
// directory itself): Create refuses names ending in a dot, which two
// Logs would otherwise share.
func TestManagerRefusesNamesEndingInADot(t *testing.T) {
	fsys := winFS{vfs.NewMem()}
	m, err := OpenManager("/d", ManagerOptions{Log: Options{FS: fsys}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	a, err := m.Create("orders-0")
	require.NoError(t, err)
	first := testBatch(t, 1)
	_, err = a.Append(first)
	require.NoError(t, err)
	require.NoError(t, a.Sync())

	for i, name := range []string{"orders-0.", "orders-0..", "..."} {
		l, err := m.Create(name)
		if err == nil && i == 0 {
			// Both Logs append and sync: each writes at its own end.
			b := testBatch(t, 2)
			info, err := l.Append(b)
			require.NoError(t, err)
			require.NoError(t, l.Sync())
			_, err = a.Append(testBatch(t, 3))
			require.NoError(t, err)
			require.NoError(t, a.Sync())
			got, err := l.Read(nil, info.FirstOffset, ReadOptions{})
			if err == nil {
				require.Equal(t, b, got, "log %q's synced batch after an append to log orders-0", name)
			}
			require.NoError(t, err, "log %q's synced batch after an append to log orders-0", name)
		}
		require.Error(t, err, "Create(%q) names an existing directory on Windows", name)
	}
}
