package vfs

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkDirOps checks the invariant of the entry-change logs below n:
// replaying all of a directory's changes onto its durable entries gives
// its current entries.
func checkDirOps(t *testing.T, n *memNode, step int) {
	t.Helper()
	got := replayDirOps(n.syncedChildren, n.dirOps)
	require.True(t, maps.Equal(n.children, got), "step %d: replay gives %v, current %v", step, sortedNames(got), sortedNames(n.children))
	for _, c := range n.children {
		if c.isDir {
			checkDirOps(t, c, step)
		}
	}
}

// TestDirOpsReplayInvariant runs random entry changes and syncs and checks
// after each that the log replays to the current entries.
func TestDirOpsReplayInvariant(t *testing.T) {
	for _, durable := range []bool{false, true} {
		for seed := range uint64(20) {
			m := NewMemWithOptions(MemOptions{MkdirAllDurable: durable})
			rng := rand.New(rand.NewPCG(seed, 1))
			dirs := []string{"/", "/d0", "/d1", "/d0/e"}
			name := func() string {
				return fmt.Sprintf("%s/n%d", dirs[rng.IntN(len(dirs))], rng.IntN(4))
			}
			for step := range 300 {
				switch rng.IntN(7) {
				case 0:
					if f, err := m.OpenFile(name(), os.O_RDWR|os.O_CREATE, 0o644); err == nil {
						require.NoError(t, f.Close())
					}
				case 1:
					_ = m.Remove(name())
				case 2:
					_ = m.Rename(name(), name())
				case 3:
					_ = m.MkdirAll(dirs[rng.IntN(len(dirs))], 0o755)
				case 4:
					_ = m.SyncDir(dirs[rng.IntN(len(dirs))])
				case 5:
					_ = m.RemoveAll(dirs[1+rng.IntN(len(dirs)-1)])
				case 6:
					_ = m.MkdirAll(name(), 0o755)
				}
				m.mu.Lock()
				checkDirOps(t, m.root, step)
				m.mu.Unlock()
			}
		}
	}
}

// TestRemoveAllIsOneUnlinkPerEntry: RemoveAll of a directory unlinks its
// entries one by one, as os.RemoveAll does, so a crash can leave it with
// some of them (Manager.Delete and OpenManager's removal of a deleted
// log's directory must cope). It used to be one change in the parent,
// kept or lost with the whole subtree.
func TestRemoveAllIsOneUnlinkPerEntry(t *testing.T) {
	m := NewMem()
	require.NoError(t, m.MkdirAll("/d/sub", 0o755))
	for _, name := range []string{"a", "b", "c"} {
		f, err := m.OpenFile("/d/sub/"+name, os.O_RDWR|os.O_CREATE, 0o644)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
		require.NoError(t, f.Close())
	}
	require.NoError(t, m.SyncDir("/d/sub"))
	require.NoError(t, m.SyncDir("/d"))
	require.NoError(t, m.SyncDir("/"))
	require.NoError(t, m.RemoveAll("/d/sub"))

	seen := map[string]bool{}
	for seed := range int64(200) {
		c := m.CrashClone(CrashOptions{Seed: seed, DirOpsPrefix: 1})
		names, err := c.ReadDir("/d/sub")
		if err != nil {
			seen["(gone)"] = true
			continue
		}
		seen[fmt.Sprint(names)] = true
	}
	partial := false
	for k := range seen {
		if k != "(gone)" && k != "[a b c]" {
			partial = true
		}
	}
	require.True(t, partial, "a crash kept RemoveAll whole or not at all; states seen: %v", seen)
}
