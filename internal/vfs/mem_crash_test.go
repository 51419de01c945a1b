package vfs_test

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
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
	writeAt(t, m, p("f"), "ed", 4)
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

// clampState builds a tree in which every option draws randomness several
// times: directories with unsynced entry changes and files with unsynced
// data, in several places, so that a draw made or skipped by one option
// changes the choices after it.
func clampState(t *testing.T) *vfs.MemFS {
	t.Helper()
	m, _, _ := crashState(t)
	for i := range 4 {
		d := p(fmt.Sprint("x", i))
		require.NoError(t, m.MkdirAll(d, 0o755))
		require.NoError(t, m.SyncDir(root))
		writeFile(t, m, filepath.Join(d, "old"), "O", true)
		f, err := m.OpenFile(filepath.Join(d, "g"), os.O_RDWR|os.O_CREATE, 0o644)
		require.NoError(t, err)
		_, err = f.WriteAt(bytes.Repeat([]byte("s"), 1500), 0)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
		_, err = f.WriteAt(bytes.Repeat([]byte("u"), 2000), 1000)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.NoError(t, m.SyncDir(d))
		writeFile(t, m, filepath.Join(d, "new"), "N", true)
		require.NoError(t, m.Remove(filepath.Join(d, "old")))
	}
	return m
}

func TestCrashOptionsClamped(t *testing.T) {
	m, synced, _ := crashState(t)
	got := readFile(t, m.CrashClone(vfs.CrashOptions{KeepUnsynced: -3}), p("f"))
	assert.Equal(t, string(synced), got)
	got = readFile(t, m.CrashClone(vfs.CrashOptions{KeepUnsynced: math.NaN()}), p("f"))
	assert.Equal(t, string(synced), got, "NaN counts as 0")

	// Out-of-range values give exactly the clone of the clamped value,
	// seed for seed, with the other options set so that randomness is
	// drawn before and after each option's own draws.
	m = clampState(t)
	fields := []struct {
		name string
		set  func(o *vfs.CrashOptions, v float64)
	}{
		{"KeepUnsynced", func(o *vfs.CrashOptions, v float64) { o.KeepUnsynced = v }},
		{"ZeroSectors", func(o *vfs.CrashOptions, v float64) { o.ZeroSectors = v }},
		{"KeepDirOps", func(o *vfs.CrashOptions, v float64) { o.KeepDirOps = v }},
		{"DirOpsPrefix", func(o *vfs.CrashOptions, v float64) { o.DirOpsPrefix = v }},
	}
	for _, f := range fields {
		t.Run(f.name, func(t *testing.T) {
			clone := func(seed int64, v float64) []string {
				o := vfs.CrashOptions{Seed: seed, KeepUnsynced: 0.5, ZeroSectors: 0.5, KeepDirOps: 0.5, DirOpsPrefix: 0.5}
				f.set(&o, v)
				return dump(t, m.CrashClone(o), root)
			}
			differ := false
			for seed := range int64(20) {
				zero, one := clone(seed, 0), clone(seed, 1)
				differ = differ || !assert.ObjectsAreEqual(zero, one)
				for _, tc := range []struct {
					v    float64
					want []string
				}{
					{7, one}, {math.Inf(1), one}, {1.0000001, one},
					{-3, zero}, {math.Inf(-1), zero}, {math.NaN(), zero},
				} {
					require.Equal(t, tc.want, clone(seed, tc.v), "%s = %v, seed %d", f.name, tc.v, seed)
				}
			}
			require.True(t, differ, "%s 0 and 1 give the same clones: the test cannot tell them apart", f.name)
		})
	}
}

// dirOpsSteps are entry changes of one directory, in the order a log's
// deletion and roll make them; the created files' data is synced.
var dirOpsSteps = []struct {
	name string
	do   func(t *testing.T, m *vfs.MemFS)
}{
	{"create a", func(t *testing.T, m *vfs.MemFS) { writeFile(t, m, p("a"), "A", true) }},
	{"rename seg.log", func(t *testing.T, m *vfs.MemFS) {
		require.NoError(t, m.Rename(p("seg.log"), p("seg.log.deleted")))
	}},
	{"rename seg.index", func(t *testing.T, m *vfs.MemFS) {
		require.NoError(t, m.Rename(p("seg.index"), p("seg.index.deleted")))
	}},
	{"create b", func(t *testing.T, m *vfs.MemFS) { writeFile(t, m, p("b"), "B", true) }},
	{"remove a", func(t *testing.T, m *vfs.MemFS) { require.NoError(t, m.Remove(p("a"))) }},
	{"rename b over seg.log.deleted", func(t *testing.T, m *vfs.MemFS) {
		require.NoError(t, m.Rename(p("b"), p("seg.log.deleted")))
	}},
	{"create c", func(t *testing.T, m *vfs.MemFS) { writeFile(t, m, p("c"), "C", true) }},
}

// dirOpsState returns a MemFS with durable seg.log and seg.index after the
// first n of dirOpsSteps, unsynced unless syncEach.
func dirOpsState(t *testing.T, n int, syncEach bool) *vfs.MemFS {
	t.Helper()
	m := newMemDir(t)
	writeFile(t, m, p("seg.log"), "L", true)
	writeFile(t, m, p("seg.index"), "I", true)
	require.NoError(t, m.SyncDir(root))
	for _, step := range dirOpsSteps[:n] {
		step.do(t, m)
		if syncEach {
			require.NoError(t, m.SyncDir(root))
		}
	}
	return m
}

func TestCrashDirOpsPrefix(t *testing.T) {
	// prefixes[k] is the directory after the first k steps.
	var prefixes [][]string
	for k := range len(dirOpsSteps) + 1 {
		prefixes = append(prefixes, dump(t, dirOpsState(t, k, true), root))
	}
	m := dirOpsState(t, len(dirOpsSteps), false)
	seen := map[int]bool{}
	for seed := range int64(300) {
		opts := vfs.CrashOptions{Seed: seed, DirOpsPrefix: 1}
		got := dump(t, m.CrashClone(opts), root)
		require.Equal(t, got, dump(t, m.CrashClone(opts), root), "deterministic for a seed")
		k := slices.IndexFunc(prefixes, func(s []string) bool { return slices.Equal(s, got) })
		require.GreaterOrEqual(t, k, 0, "seed %d: %v is no prefix of the changes", seed, got)
		seen[k] = true
	}
	for k := range prefixes {
		assert.True(t, seen[k], "the prefix of %d changes never came back", k)
	}
	// The original is unchanged and a prefix is what the clone holds
	// durably.
	assert.Equal(t, prefixes[len(dirOpsSteps)], dump(t, m, root))
	c := m.CrashClone(vfs.CrashOptions{Seed: 1, DirOpsPrefix: 1})
	assert.Equal(t, dump(t, c, root), dump(t, c.CrashClone(vfs.CrashOptions{}), root))

	// With DirOpsPrefix 0 the all-or-nothing choice of KeepDirOps is
	// unchanged.
	for seed := range int64(20) {
		got := dump(t, m.CrashClone(vfs.CrashOptions{Seed: seed, KeepDirOps: 0.5}), root)
		assert.Contains(t, [][]string{prefixes[0], prefixes[len(dirOpsSteps)]}, got)
	}

	// A probability below 1 mixes prefixes with KeepDirOps's choice.
	seen = map[int]bool{}
	for seed := range int64(300) {
		got := dump(t, m.CrashClone(vfs.CrashOptions{Seed: seed, DirOpsPrefix: 0.5, KeepDirOps: 1}), root)
		k := slices.IndexFunc(prefixes, func(s []string) bool { return slices.Equal(s, got) })
		require.GreaterOrEqual(t, k, 0)
		seen[k] = true
	}
	assert.Greater(t, len(seen), 3)
}

func TestCrashDirOpsPrefixSyncDirClears(t *testing.T) {
	for _, viaHandle := range []bool{false, true} {
		m := dirOpsState(t, 4, false)
		if viaHandle {
			d, err := m.OpenFile(root, os.O_RDONLY, 0)
			require.NoError(t, err)
			require.NoError(t, d.Sync())
			require.NoError(t, d.Close())
		} else {
			require.NoError(t, m.SyncDir(root))
		}
		synced := dump(t, m, root)
		writeFile(t, m, p("z"), "Z", true)
		all := dump(t, m, root)
		seen := map[string]bool{}
		for seed := range int64(50) {
			got := dump(t, m.CrashClone(vfs.CrashOptions{Seed: seed, DirOpsPrefix: 1}), root)
			require.Contains(t, [][]string{synced, all}, got, "only the change after SyncDir may be lost (seed %d)", seed)
			seen[strings.Join(got, ",")] = true
		}
		assert.Len(t, seen, 2, "via handle %v", viaHandle)
	}
}

func TestCrashDirOpsPrefixCrossDirectory(t *testing.T) {
	// A rename across directories is one change in each: each directory
	// keeps its half or not, independently.
	m := newMemDir(t)
	require.NoError(t, m.MkdirAll(p("x"), 0o755))
	require.NoError(t, m.MkdirAll(p("y"), 0o755))
	require.NoError(t, m.SyncDir(root))
	writeFile(t, m, p("x", "f"), "F", true)
	require.NoError(t, m.SyncDir(p("x")))
	require.NoError(t, m.Rename(p("x", "f"), p("y", "f")))
	seen := map[[2]bool]bool{}
	for seed := range int64(100) {
		c := m.CrashClone(vfs.CrashOptions{Seed: seed, DirOpsPrefix: 1})
		var in [2]bool
		for i, d := range []string{"x", "y"} {
			if _, err := c.Stat(p(d, "f")); err == nil {
				in[i] = true
				assert.Equal(t, "F", readFile(t, c, p(d, "f")))
			}
		}
		seen[in] = true
	}
	assert.Len(t, seen, 4, "in x, in y, in both, in neither")
}

func TestCrashDirOpsPrefixMkdirAllDurable(t *testing.T) {
	// A directory MkdirAll made durable at once is there in every
	// prefix, even where an earlier unsynced change removed its name.
	m := vfs.NewMemWithOptions(vfs.MemOptions{MkdirAllDurable: true})
	require.NoError(t, m.MkdirAll(root, 0o755))
	writeFile(t, m, p("q"), "Q", true)
	require.NoError(t, m.SyncDir(root))
	writeFile(t, m, p("a"), "A", true)
	require.NoError(t, m.Remove(p("q")))
	require.NoError(t, m.MkdirAll(p("q"), 0o755))
	writeFile(t, m, p("b"), "B", true)
	seen := map[string]bool{}
	for seed := range int64(100) {
		c := m.CrashClone(vfs.CrashOptions{Seed: seed, DirOpsPrefix: 1})
		fi, err := c.Stat(p("q"))
		require.NoError(t, err, "seed %d", seed)
		require.True(t, fi.IsDir(), "seed %d", seed)
		got := dump(t, c, root)
		seen[strings.Join(got, ",")] = true
		if slices.Contains(got, p("b")+"=B") {
			require.Contains(t, got, p("a")+"=A", "b kept without a (seed %d)", seed)
		}
	}
	assert.Len(t, seen, 3, "neither, a, a and b")
}

func TestCrashDirOpsPrefixRemoveAllRoot(t *testing.T) {
	// RemoveAll of the root unlinks its entries one by one, in order.
	m := vfs.NewMem()
	for _, name := range []string{"/a", "/b", "/c"} {
		writeFile(t, m, name, name, true)
	}
	require.NoError(t, m.SyncDir("/"))
	require.NoError(t, m.RemoveAll("/"))
	seen := map[string]bool{}
	for seed := range int64(100) {
		names, err := m.CrashClone(vfs.CrashOptions{Seed: seed, DirOpsPrefix: 1}).ReadDir("/")
		require.NoError(t, err)
		seen[strings.Join(names, ",")] = true
	}
	assert.Equal(t, map[string]bool{"a,b,c": true, "b,c": true, "c": true, "": true}, seen)
}

// TestCrashKill: a Kill clone keeps every change, synced or not, with the
// durable state unchanged: a power loss of the clone later leaves what a
// power loss of the original would, until the clone syncs more.
func TestCrashKill(t *testing.T) {
	m := newMemDir(t)
	writeFile(t, m, p("a"), "A", true)
	require.NoError(t, m.SyncDir(root))
	writeAt(t, m, p("a"), "+unsynced", 1)
	writeFile(t, m, p("b"), "B", true)           // entry not synced
	require.NoError(t, m.Rename(p("a"), p("c"))) // nor is this
	require.NoError(t, m.MkdirAll(p("d"), 0o755))
	writeFile(t, m, p("d/e"), "E", false)

	k := m.CrashClone(vfs.CrashOptions{Kill: true, KeepUnsynced: 0.5, Seed: 3})
	require.Equal(t, dump(t, m, root), dump(t, k, root), "the kill keeps every change")
	require.Equal(t, dump(t, m.CrashClone(vfs.CrashOptions{}), root), dump(t, k.CrashClone(vfs.CrashOptions{}), root),
		"and makes nothing more durable")

	// The clone is independent, and syncing it makes its changes durable.
	writeFile(t, k, p("d/e"), "E2", true)
	require.NoError(t, k.SyncDir(p("d")))
	require.NoError(t, k.SyncDir(root))
	require.Equal(t, "E", readFile(t, m, p("d/e")))
	after := k.CrashClone(vfs.CrashOptions{})
	assert.Equal(t, "E2", readFile(t, after, p("d/e")))
	assert.Equal(t, "B", readFile(t, after, p("b")))
	assert.Equal(t, "A", readFile(t, after, p("c")), "the rename is durable, the unsynced write is not")
}

// writeAt writes data at off into the existing file name, without a sync.
func writeAt(t *testing.T, fsys vfs.FS, name, data string, off int64) {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte(data), off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
