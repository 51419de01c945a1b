package vfs_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

var root = filepath.Join(string(filepath.Separator), "data")

func p(elem ...string) string { return filepath.Join(append([]string{root}, elem...)...) }

// writeFile creates or truncates name, writes data and syncs it if sync.
func writeFile(t *testing.T, fsys vfs.FS, name string, data string, sync bool) {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte(data), 0)
	require.NoError(t, err)
	if sync {
		require.NoError(t, f.Sync())
	}
	require.NoError(t, f.Close())
}

// readFile returns the contents of name.
func readFile(t *testing.T, fsys vfs.FS, name string) string {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	fi, err := f.Stat()
	require.NoError(t, err)
	buf := make([]byte, fi.Size())
	n, err := f.ReadAt(buf, 0)
	if len(buf) > 0 {
		require.NoError(t, err)
	}
	require.Equal(t, len(buf), n)
	return string(buf)
}

// newMemDir returns a MemFS with root created and durable.
func newMemDir(t *testing.T) *vfs.MemFS {
	t.Helper()
	m := vfs.NewMem()
	require.NoError(t, m.MkdirAll(root, 0o755))
	require.NoError(t, m.SyncDir(filepath.Dir(root)))
	return m
}

func TestMemOpenFlags(t *testing.T) {
	m := newMemDir(t)
	name := p("f")

	_, err := m.OpenFile(name, os.O_RDONLY, 0)
	require.ErrorIs(t, err, os.ErrNotExist)
	var pe *os.PathError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, name, pe.Path)

	_, err = m.OpenFile(p("missing", "f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.ErrorIs(t, err, os.ErrNotExist)

	writeFile(t, m, name, "hello", false)
	_, err = m.OpenFile(p("f", "g"), os.O_RDWR|os.O_CREATE, 0o644)
	require.ErrorIs(t, err, syscall.ENOTDIR)

	_, err = m.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	require.ErrorIs(t, err, os.ErrExist)

	_, err = m.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
	require.ErrorIs(t, err, errors.ErrUnsupported)

	_, err = m.OpenFile(root, os.O_RDWR, 0)
	require.ErrorIs(t, err, syscall.EISDIR)

	// Read-only handles cannot write or truncate; write-only cannot read.
	ro, err := m.OpenFile(name, os.O_RDONLY, 0)
	require.NoError(t, err)
	_, err = ro.WriteAt([]byte("x"), 0)
	require.ErrorIs(t, err, syscall.EBADF)
	require.Error(t, ro.Truncate(0))
	require.NoError(t, ro.Close())
	wo, err := m.OpenFile(name, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = wo.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, syscall.EBADF)
	require.NoError(t, wo.Close())

	// O_TRUNC empties the file.
	f, err := m.OpenFile(name, os.O_RDWR|os.O_TRUNC, 0)
	require.NoError(t, err)
	fi, err := f.Stat()
	require.NoError(t, err)
	assert.Equal(t, int64(0), fi.Size())
	assert.Equal(t, name, f.Name())
	require.NoError(t, f.Close())
}

func TestMemReadWriteAt(t *testing.T) {
	m := newMemDir(t)
	name := p("f")
	f, err := m.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()

	fi0, err := f.Stat()
	require.NoError(t, err)

	// WriteAt past the end fills the gap with zeros.
	n, err := f.WriteAt([]byte("abc"), 4)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, "\x00\x00\x00\x00abc", readFile(t, m, name))

	// ReadAt past EOF returns the partial count with io.EOF, like os.File.
	buf := make([]byte, 5)
	n, err = f.ReadAt(buf, 4)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, 3, n)
	assert.Equal(t, "abc", string(buf[:n]))
	n, err = f.ReadAt(buf, 100)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, 0, n)
	_, err = f.ReadAt(buf, -1)
	require.Error(t, err)
	_, err = f.WriteAt(buf, -1)
	require.Error(t, err)

	// Overwrite in the middle.
	_, err = f.WriteAt([]byte("XY"), 5)
	require.NoError(t, err)
	assert.Equal(t, "\x00\x00\x00\x00aXY", readFile(t, m, name))

	// Truncate shrinks and grows with zeros.
	require.NoError(t, f.Truncate(5))
	assert.Equal(t, "\x00\x00\x00\x00a", readFile(t, m, name))
	require.NoError(t, f.Truncate(7))
	assert.Equal(t, "\x00\x00\x00\x00a\x00\x00", readFile(t, m, name))
	require.ErrorIs(t, f.Truncate(-1), syscall.EINVAL)

	fi, err := f.Stat()
	require.NoError(t, err)
	assert.Equal(t, "f", fi.Name())
	assert.Equal(t, int64(7), fi.Size())
	assert.False(t, fi.IsDir())
	assert.True(t, fi.ModTime().After(fi0.ModTime()), "the clock advances on writes")

	fi2, err := m.Stat(name)
	require.NoError(t, err)
	assert.Equal(t, fi.Size(), fi2.Size())
	assert.Equal(t, fi.ModTime(), fi2.ModTime())
}

func TestMemDeterministicClock(t *testing.T) {
	run := func() []int64 {
		m := newMemDir(t)
		writeFile(t, m, p("a"), "1", true)
		writeFile(t, m, p("b"), "22", false)
		var ts []int64
		for _, name := range []string{root, p("a"), p("b")} {
			fi, err := m.Stat(name)
			require.NoError(t, err)
			ts = append(ts, fi.ModTime().UnixNano())
		}
		return ts
	}
	assert.Equal(t, run(), run())
}

func TestMemClosedFile(t *testing.T) {
	m := newMemDir(t)
	f, err := m.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	_, err = f.ReadAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, os.ErrClosed)
	_, err = f.WriteAt([]byte("x"), 0)
	assert.ErrorIs(t, err, os.ErrClosed)
	assert.ErrorIs(t, f.Sync(), os.ErrClosed)
	assert.ErrorIs(t, f.Truncate(0), os.ErrClosed)
	_, err = f.Stat()
	assert.ErrorIs(t, err, os.ErrClosed)
	assert.ErrorIs(t, f.Close(), os.ErrClosed)
}

func TestMemPaths(t *testing.T) {
	m := newMemDir(t)
	writeFile(t, m, p("a", "..", "f"), "x", false)
	assert.Equal(t, "x", readFile(t, m, p("f")))
	assert.Equal(t, "x", readFile(t, m, root+string(filepath.Separator)+"."+string(filepath.Separator)+"f"))
	assert.Equal(t, "x", readFile(t, m, "data/f"), "relative paths start at the root")
	names, err := m.ReadDir(string(filepath.Separator))
	require.NoError(t, err)
	assert.Equal(t, []string{"data"}, names)
}

func TestMemDirectories(t *testing.T) {
	m := newMemDir(t)
	require.NoError(t, m.MkdirAll(p("d", "e"), 0o755))
	require.NoError(t, m.MkdirAll(p("d", "e"), 0o755), "MkdirAll of an existing directory")
	for _, name := range []string{"c", "a", "b"} {
		writeFile(t, m, p("d", name), name, false)
	}
	names, err := m.ReadDir(p("d"))
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "e"}, names)

	fi, err := m.Stat(p("d"))
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
	assert.Equal(t, "d", fi.Name())

	_, err = m.ReadDir(p("nope"))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = m.ReadDir(p("d", "a"))
	require.ErrorIs(t, err, syscall.ENOTDIR)
	require.ErrorIs(t, m.MkdirAll(p("d", "a", "x"), 0o755), syscall.ENOTDIR)
	_, err = m.Stat(p("nope"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorIs(t, m.SyncDir(p("nope")), os.ErrNotExist)

	// Remove: files and empty directories only.
	require.ErrorIs(t, m.Remove(p("d")), syscall.ENOTEMPTY)
	require.ErrorIs(t, m.Remove(p("nope")), os.ErrNotExist)
	require.NoError(t, m.Remove(p("d", "e")))
	require.NoError(t, m.Remove(p("d", "a")))
	names, err = m.ReadDir(p("d"))
	require.NoError(t, err)
	assert.Equal(t, []string{"b", "c"}, names)

	// RemoveAll: whole trees; missing names are fine.
	require.NoError(t, m.RemoveAll(p("d")))
	require.NoError(t, m.RemoveAll(p("d")))
	require.NoError(t, m.RemoveAll(p("nope", "deeper")))
	_, err = m.Stat(p("d"))
	require.ErrorIs(t, err, fs.ErrNotExist)

	// A directory handle: Stat and Sync work, reads do not.
	d, err := m.OpenFile(root, os.O_RDONLY, 0)
	require.NoError(t, err)
	fi, err = d.Stat()
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
	require.NoError(t, d.Sync())
	_, err = d.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, syscall.EISDIR)
	require.NoError(t, d.Close())
}

func TestMemRename(t *testing.T) {
	m := newMemDir(t)
	writeFile(t, m, p("a"), "A", false)
	writeFile(t, m, p("b"), "B", false)

	// A file replaces a file atomically.
	require.NoError(t, m.Rename(p("a"), p("b")))
	assert.Equal(t, "A", readFile(t, m, p("b")))
	_, err := m.Stat(p("a"))
	require.ErrorIs(t, err, os.ErrNotExist)

	err = m.Rename(p("a"), p("c"))
	require.ErrorIs(t, err, os.ErrNotExist)
	var le *os.LinkError
	require.ErrorAs(t, err, &le)

	require.NoError(t, m.Rename(p("b"), p("b")), "rename onto itself")

	// Directories: replace an empty one, not a non-empty one, not a file.
	require.NoError(t, m.MkdirAll(p("d1", "sub"), 0o755))
	writeFile(t, m, p("d1", "f"), "F", false)
	require.NoError(t, m.MkdirAll(p("d2"), 0o755))
	require.NoError(t, m.Rename(p("d1"), p("d2")))
	assert.Equal(t, "F", readFile(t, m, p("d2", "f")))
	require.NoError(t, m.MkdirAll(p("d3", "x"), 0o755))
	require.ErrorIs(t, m.Rename(p("d3"), p("d2")), syscall.ENOTEMPTY)
	require.ErrorIs(t, m.Rename(p("d3"), p("b")), syscall.ENOTDIR)
	require.ErrorIs(t, m.Rename(p("b"), p("d3")), syscall.EISDIR)
	require.ErrorIs(t, m.Rename(p("d2"), p("d2", "sub", "d2")), syscall.EINVAL)

	// Across directories.
	require.NoError(t, m.Rename(p("b"), p("d2", "sub", "b")))
	assert.Equal(t, "A", readFile(t, m, p("d2", "sub", "b")))
}

func TestMemOpenHandleSurvivesRemoveAndRename(t *testing.T) {
	m := newMemDir(t)
	f, err := m.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, m.Rename(p("f"), p("g")))
	_, err = f.WriteAt([]byte("abc"), 0)
	require.NoError(t, err)
	assert.Equal(t, "abc", readFile(t, m, p("g")))
	require.NoError(t, m.Remove(p("g")))
	buf := make([]byte, 3)
	_, err = f.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, "abc", string(buf))
}
