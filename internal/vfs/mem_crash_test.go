package vfs_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// dump returns every file of fsys below dir with its contents, and every
// directory with a trailing separator, sorted.
func dump(t *testing.T, fsys vfs.FS, dir string) []string {
	t.Helper()
	var out []string
	names, err := fsys.ReadDir(dir)
	require.NoError(t, err)
	for _, name := range names {
		full := filepath.Join(dir, name)
		fi, err := fsys.Stat(full)
		require.NoError(t, err)
		if fi.IsDir() {
			out = append(out, full+string(filepath.Separator))
			out = append(out, dump(t, fsys, full)...)
			continue
		}
		out = append(out, full+"="+readFile(t, fsys, full))
	}
	sort.Strings(out)
	return out
}

func assertMissing(t *testing.T, fsys vfs.FS, name string) {
	t.Helper()
	_, err := fsys.Stat(name)
	assert.ErrorIs(t, err, os.ErrNotExist, "%s should not exist", name)
}

func TestCrashFileData(t *testing.T) {
	m := newMemDir(t)
	f, err := m.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	require.NoError(t, m.SyncDir(root))
	_, err = f.WriteAt([]byte("synced"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	_, err = f.WriteAt([]byte("+unsynced"), 6)
	require.NoError(t, err)

	c := m.CrashClone(vfs.CrashOptions{})
	assert.Equal(t, "synced", readFile(t, c, p("f")))
	assert.Equal(t, "synced+unsynced", readFile(t, m, p("f")), "the original is unchanged")

	// Overwrites and truncations are undone too.
	_, err = f.WriteAt([]byte("SY"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(3))
	assert.Equal(t, "synced", readFile(t, m.CrashClone(vfs.CrashOptions{}), p("f")))

	// After Sync they are durable.
	require.NoError(t, f.Sync())
	assert.Equal(t, "SYn", readFile(t, m.CrashClone(vfs.CrashOptions{}), p("f")))
	require.NoError(t, f.Close())
}

func TestCrashCreatedFileNeedsSyncDir(t *testing.T) {
	// S2: a file whose data was synced but whose directory entry was not
	// does not survive.
	m := newMemDir(t)
	writeFile(t, m, p("f"), "data", true)
	assertMissing(t, m.CrashClone(vfs.CrashOptions{}), p("f"))

	require.NoError(t, m.SyncDir(root))
	assert.Equal(t, "data", readFile(t, m.CrashClone(vfs.CrashOptions{}), p("f")))

	// An entry synced before the data: the file is there, empty.
	writeFile(t, m, p("g"), "unsynced data", false)
	require.NoError(t, m.SyncDir(root))
	assert.Equal(t, "", readFile(t, m.CrashClone(vfs.CrashOptions{}), p("g")))
}

func TestCrashRenameUndone(t *testing.T) {
	m := newMemDir(t)
	writeFile(t, m, p("a"), "A", true)
	writeFile(t, m, p("b"), "B", true)
	require.NoError(t, m.SyncDir(root))

	require.NoError(t, m.Rename(p("a"), p("b")))
	c := m.CrashClone(vfs.CrashOptions{})
	assert.Equal(t, "A", readFile(t, c, p("a")), "old name back with the old inode")
	assert.Equal(t, "B", readFile(t, c, p("b")), "replaced target back")

	require.NoError(t, m.SyncDir(root))
	c = m.CrashClone(vfs.CrashOptions{})
	assertMissing(t, c, p("a"))
	assert.Equal(t, "A", readFile(t, c, p("b")))
}

func TestCrashRemoveUndone(t *testing.T) {
	m := newMemDir(t)
	writeFile(t, m, p("f"), "F", true)
	require.NoError(t, m.MkdirAll(p("d"), 0o755))
	require.NoError(t, m.SyncDir(root))
	writeFile(t, m, p("d", "g"), "G", true)
	require.NoError(t, m.SyncDir(p("d")))

	require.NoError(t, m.Remove(p("f")))
	require.NoError(t, m.RemoveAll(p("d")))
	c := m.CrashClone(vfs.CrashOptions{})
	assert.Equal(t, "F", readFile(t, c, p("f")))
	assert.Equal(t, "G", readFile(t, c, p("d", "g")))

	require.NoError(t, m.SyncDir(root))
	c = m.CrashClone(vfs.CrashOptions{})
	assertMissing(t, c, p("f"))
	assertMissing(t, c, p("d"))
}

func TestCrashMkdirAll(t *testing.T) {
	t.Run("strict", func(t *testing.T) {
		m := vfs.NewMem()
		require.NoError(t, m.MkdirAll(p("x", "y"), 0o755))
		assertMissing(t, m.CrashClone(vfs.CrashOptions{}), root)
		require.NoError(t, m.SyncDir(filepath.Dir(root)))
		c := m.CrashClone(vfs.CrashOptions{})
		assertMissing(t, c, p("x"))
		require.NoError(t, m.SyncDir(root))
		c = m.CrashClone(vfs.CrashOptions{})
		assertMissing(t, c, p("x", "y"))
		fi, err := c.Stat(p("x"))
		require.NoError(t, err)
		assert.True(t, fi.IsDir())
	})
	t.Run("durable", func(t *testing.T) {
		m := vfs.NewMemWithOptions(vfs.MemOptions{MkdirAllDurable: true})
		require.NoError(t, m.MkdirAll(p("x", "y"), 0o755))
		writeFile(t, m, p("x", "y", "f"), "F", true)
		c := m.CrashClone(vfs.CrashOptions{})
		_, err := c.Stat(p("x", "y"))
		require.NoError(t, err)
		assertMissing(t, c, p("x", "y", "f"))
		// The option carries over to clones.
		require.NoError(t, c.MkdirAll(p("z"), 0o755))
		_, err = c.CrashClone(vfs.CrashOptions{}).Stat(p("z"))
		require.NoError(t, err)
	})
}

// atomicReplace is the pattern replog uses for snapshots and checkpoints:
// write a temporary file, fsync it, rename it over the target, fsync the
// directory.
func atomicReplace(fsys vfs.FS, name, data string) error {
	tmp := name + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(data), 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fsys.Rename(tmp, name); err != nil {
		return err
	}
	return fsys.SyncDir(filepath.Dir(name))
}

func TestCrashAtomicReplaceSurvives(t *testing.T) {
	m := newMemDir(t)
	require.NoError(t, atomicReplace(m, p("ckpt"), "v1"))
	require.NoError(t, atomicReplace(m, p("ckpt"), "v2"))
	c := m.CrashClone(vfs.CrashOptions{})
	assert.Equal(t, []string{p("ckpt") + "=v2"}, dump(t, c, root))
}

func TestCrashCloneIsIndependent(t *testing.T) {
	m := newMemDir(t)
	writeFile(t, m, p("f"), "orig", true)
	require.NoError(t, m.SyncDir(root))
	c := m.CrashClone(vfs.CrashOptions{})
	writeFile(t, c, p("f"), "clone", true)
	writeFile(t, c, p("new"), "n", true)
	assert.Equal(t, "orig", readFile(t, m, p("f")))
	assertMissing(t, m, p("new"))
	writeFile(t, m, p("f"), "orig2", true)
	assert.Equal(t, "clone", readFile(t, c, p("f")))
	// The clone is durable as a whole: a crash of the clone keeps what
	// the clone was given.
	assert.Equal(t, "orig2", readFile(t, m.CrashClone(vfs.CrashOptions{}).CrashClone(vfs.CrashOptions{}), p("f")))
}

func TestCrashUnsyncedCrossDirectoryRenames(t *testing.T) {
	// Durable entries can form a cycle of directories after unsynced
	// renames; the clone must still terminate.
	m := newMemDir(t)
	require.NoError(t, m.MkdirAll(p("a"), 0o755))
	require.NoError(t, m.MkdirAll(p("b"), 0o755))
	require.NoError(t, m.SyncDir(root))
	require.NoError(t, m.Rename(p("a"), p("b", "a")))
	require.NoError(t, m.SyncDir(p("b")))
	require.NoError(t, m.Rename(p("b", "a"), p("a")))
	require.NoError(t, m.Rename(p("b"), p("a", "b")))
	require.NoError(t, m.SyncDir(p("a")))
	c := m.CrashClone(vfs.CrashOptions{})
	assert.Equal(t, []string{
		p("a") + string(filepath.Separator),
		p("a", "b") + string(filepath.Separator),
	}, dump(t, c, root), "b is kept at its first place in depth-first order")
}

// crashState builds a file with synced and unsynced data, a synced directory
// and an unsynced one.
func crashState(t *testing.T) (m *vfs.MemFS, synced, current []byte) {
	t.Helper()
	m = newMemDir(t)
	synced = bytes.Repeat([]byte("s"), 3000)
	current = bytes.Repeat([]byte("u"), 5000)
	copy(current, synced[:1000]) // bytes 1000.. are rewritten or new
	f, err := m.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	_, err = f.WriteAt(synced, 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	_, err = f.WriteAt(current[1000:], 1000)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, m.SyncDir(root))
	writeFile(t, m, p("unsynced-entry"), "x", true)
	return m, synced, current
}

func TestCrashOptionsKeepUnsynced(t *testing.T) {
	m, synced, current := crashState(t)
	lengths := map[int]bool{}
	for seed := range int64(200) {
		opts := vfs.CrashOptions{Seed: seed, KeepUnsynced: 0.7, ZeroSectors: 0.2}
		got := []byte(readFile(t, m.CrashClone(opts), p("f")))
		require.Equal(t, got, []byte(readFile(t, m.CrashClone(opts), p("f"))), "deterministic for a seed")
		lengths[len(got)] = true

		require.GreaterOrEqual(t, len(got), len(synced), "seed %d", seed)
		require.Equal(t, synced[:1000], got[:1000], "synced bytes never change, seed %d", seed)
		// Past 1000: a prefix of current data (or zeroed sectors), then
		// the synced tail.
		cut := len(got)
		for i := 1000; i < len(got); i++ {
			if i < len(synced) && got[i] == 's' {
				cut = i
				break
			}
		}
		for i := 1000; i < len(got); i++ {
			switch {
			case i >= cut:
				if got[i] != synced[i] {
					require.Failf(t, "synced tail changed", "seed %d offset %d", seed, i)
				}
			case got[i] == 0:
				// A zeroed sector is zero up to its end or the cut.
				s := i / vfs.SectorSize * vfs.SectorSize
				for j := max(s, 1000); j < min(s+vfs.SectorSize, cut); j++ {
					if got[j] != 0 {
						require.Failf(t, "partly zeroed sector", "seed %d offset %d", seed, j)
					}
				}
			case got[i] != current[i]:
				require.Failf(t, "not the current data", "seed %d offset %d", seed, i)
			}
		}
	}
	assert.Greater(t, len(lengths), 10, "cuts vary with the seed")
	assert.True(t, lengths[len(synced)], "some seeds keep nothing past the synced size")
	assert.Len(t, current, 5000)
}

func TestCrashOptionsKeepAll(t *testing.T) {
	// A small unsynced append: with KeepUnsynced 1 every cut is seen.
	m := newMemDir(t)
	writeFile(t, m, p("f"), "sync", true)
	require.NoError(t, m.SyncDir(root))
	f, err := m.OpenFile(p("f"), os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("ed"), 4)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	writeFile(t, m, p("unsynced-entry"), "x", true)

	seen := map[string]bool{}
	for seed := range int64(50) {
		c := m.CrashClone(vfs.CrashOptions{Seed: seed, KeepUnsynced: 1, KeepDirOps: 1})
		seen[readFile(t, c, p("f"))] = true
		assert.Equal(t, "x", readFile(t, c, p("unsynced-entry")), "KeepDirOps 1 keeps current entries")
	}
	assert.Equal(t, map[string]bool{"sync": true, "synce": true, "synced": true}, seen)
}

func TestCrashOptionsKeepDirOps(t *testing.T) {
	m := newMemDir(t)
	for i := range 8 {
		require.NoError(t, m.MkdirAll(p(fmt.Sprint("d", i)), 0o755))
	}
	require.NoError(t, m.SyncDir(root))
	for i := range 8 {
		writeFile(t, m, p(fmt.Sprint("d", i), "f"), "F", true)
	}
	var kept []int
	for seed := range int64(50) {
		c := m.CrashClone(vfs.CrashOptions{Seed: seed, KeepDirOps: 0.5})
		n := 0
		for i := range 8 {
			if _, err := c.Stat(p(fmt.Sprint("d", i), "f")); err == nil {
				n++
			}
		}
		kept = append(kept, n)
	}
	sort.Ints(kept)
	assert.Less(t, kept[0], kept[len(kept)-1], "varies with the seed")
}

func TestCrashOptionsClamped(t *testing.T) {
	m, synced, current := crashState(t)
	got := readFile(t, m.CrashClone(vfs.CrashOptions{KeepUnsynced: -3}), p("f"))
	assert.Equal(t, string(synced), got)
	got = readFile(t, m.CrashClone(vfs.CrashOptions{Seed: 1, KeepUnsynced: 7}), p("f"))
	assert.True(t, strings.HasPrefix(got, string(current[:1000])))
}
