package vfs

import (
	"bytes"
	"maps"
	"math"
	"math/rand/v2"
)

// SectorSize is the unit in which CrashOptions.ZeroSectors tears unsynced
// data.
const SectorSize = 512

// CrashOptions says which unsynced changes a CrashClone keeps. The zero
// value keeps exactly the durable state. Probabilities are clamped to
// [0, 1]; NaN counts as 0. The same options on the same filesystem state
// give the same clone.
type CrashOptions struct {
	// Seed seeds the random choices below.
	Seed int64

	// KeepUnsynced is the probability that a file with unsynced changes
	// keeps part of them, modelling partial page-cache writeback. The kept
	// part is a uniformly random prefix, in offset order, of the changed
	// range: with synced data S and current data D differing from offset
	// lo on, a cut c is drawn in [lo, len(D)] and the file becomes D[:c]
	// followed by S[c:] (if S is longer than c). c == len(D) keeps D
	// exactly, including a pending truncation. Bytes below lo (unchanged
	// since the last Sync) are never altered. Bytes whose writeback a
	// failed Sync dropped (see ErrorFS) are never kept.
	KeepUnsynced float64

	// ZeroSectors is the probability that each SectorSize-aligned sector
	// of the kept unsynced bytes reads back as zeros instead (a torn or
	// unwritten sector, as XFS and ext4 can show after a crash). Only
	// bytes at or past lo are zeroed, so synced data is never torn.
	ZeroSectors float64

	// KeepDirOps is the probability that a directory whose entries changed
	// since its last SyncDir comes back with its current entries instead
	// of its durable ones (as if SyncDir had run just before the crash).
	// The choice is made per directory, so a rename within one directory
	// is atomic; a rename across directories not followed by SyncDir of
	// both may leave the entry in both places or in neither. Directories
	// that DirOpsPrefix picks are not subject to it.
	KeepDirOps float64

	// DirOpsPrefix is the probability that a directory with entry changes
	// since its last SyncDir comes back with a uniformly random prefix of
	// them (possibly none or all), replayed in order onto its durable
	// entries, as a journaling filesystem keeps a prefix of its metadata
	// operations; otherwise KeepDirOps decides. The changes are each
	// create, remove and rename within the directory (a rename is kept or
	// lost as a whole) and each half of a rename across directories (one
	// per directory, so the entry may be left in both places or in
	// neither), in the order they were made. A later change is never kept
	// without the earlier ones of the same directory; directories are
	// independent. An entry created and removed again is a change too: a
	// prefix may keep it.
	DirOpsPrefix float64

	// Kill makes the clone what the process's death, not a power loss,
	// leaves: the kernel keeps every change, synced or not (the page cache
	// survives), and no more of it is durable than before. The other
	// options are then ignored; a CrashClone of the clone later shows what
	// a power loss would leave of it, so that what a process does after
	// the kill (recovery) can be checked to make durable what it trusts.
	Kill bool
}

func clampProbability(p float64) float64 {
	if math.IsNaN(p) || p < 0 {
		return 0
	}
	return min(p, 1)
}

// crasher holds the state of one CrashClone.
type crasher struct {
	dst  *MemFS
	rng  *rand.Rand
	opts CrashOptions
	// copies maps a node of the source to its copy; a file reachable by
	// several durable names stays one inode (a hard link).
	copies map[*memNode]*memNode
}

// CrashClone returns a new, independent MemFS holding the state m would have
// after a power loss at this instant; m itself is unchanged and stays usable.
//
// With zero options the clone holds exactly the durable state: starting at
// the root, each directory holds the entries it had at its last SyncDir
// (none if it was never synced), and each file holds the data it had at its
// last Sync (empty if never synced). Hence a file is in the clone only if
// every directory on its path was SyncDir'ed after the entry was made (a
// Synced file whose directory was not synced is lost), a rename or a Remove
// not followed by SyncDir of the directory is undone (the old name is back
// with the old inode and that inode's durable data), and a file's unsynced
// writes and truncations are gone. opts can keep some unsynced changes; see
// CrashOptions. With opts.Kill the clone is what a killed process leaves
// instead: every change, with the same durable state as m.
//
// A directory reachable at several durable places (possible only after
// unsynced renames of directories across directories) is kept at the first
// place in depth-first order of sorted names and left out of the others.
//
// CrashClone may be called while other goroutines use m; the clone is a
// consistent snapshot of m between two operations of m.
func (m *MemFS) CrashClone(opts CrashOptions) *MemFS {
	opts.KeepUnsynced = clampProbability(opts.KeepUnsynced)
	opts.ZeroSectors = clampProbability(opts.ZeroSectors)
	opts.KeepDirOps = clampProbability(opts.KeepDirOps)
	opts.DirOpsPrefix = clampProbability(opts.DirOpsPrefix)

	m.mu.Lock()
	defer m.mu.Unlock()
	dst := &MemFS{opts: m.opts}
	dst.clock.Store(m.clock.Load())
	if opts.Kill {
		dst.root = copyExact(m.root, map[*memNode]*memNode{})
		return dst
	}
	c := &crasher{
		dst:    dst,
		rng:    rand.New(rand.NewPCG(uint64(opts.Seed), 0x9e3779b97f4a7c15)),
		opts:   opts,
		copies: map[*memNode]*memNode{},
	}
	dst.root = c.copyDir(m.root)
	return dst
}

// copyExact copies n with its current and durable state alike, sharing
// copies where the source shares nodes (copies maps a source node to its
// copy). The source MemFS's mu is held.
func copyExact(n *memNode, copies map[*memNode]*memNode) *memNode {
	if n == nil {
		return nil
	}
	if c, ok := copies[n]; ok {
		return c
	}
	n.mu.Lock()
	c := &memNode{isDir: n.isDir, mode: n.mode, modTime: n.modTime, dirty: n.dirty,
		data: bytes.Clone(n.data), synced: bytes.Clone(n.synced), lost: append([]span(nil), n.lost...)}
	n.mu.Unlock()
	copies[n] = c
	if !n.isDir {
		return c
	}
	copyEntries := func(entries map[string]*memNode) map[string]*memNode {
		if entries == nil {
			return nil
		}
		out := make(map[string]*memNode, len(entries))
		for name, child := range entries {
			out[name] = copyExact(child, copies)
		}
		return out
	}
	c.children, c.syncedChildren = copyEntries(n.children), copyEntries(n.syncedChildren)
	for _, op := range n.dirOps {
		cop := make(dirOp, len(op))
		for i, ch := range op {
			cop[i] = entryChange{name: ch.name, node: copyExact(ch.node, copies)}
		}
		c.dirOps = append(c.dirOps, cop)
	}
	return c
}

// chance reports true with probability p, drawing nothing when p is 0 or 1
// so that the zero options never consume randomness.
func (c *crasher) chance(p float64) bool {
	switch p {
	case 0:
		return false
	case 1:
		return true
	}
	return c.rng.Float64() < p
}

// copyDir copies a directory node with the entries that survive. The source
// MemFS's mu is held.
func (c *crasher) copyDir(n *memNode) *memNode {
	n.mu.Lock()
	d := &memNode{isDir: true, mode: n.mode, modTime: n.modTime, dirty: clean}
	n.mu.Unlock()
	c.copies[n] = d

	entries := n.syncedChildren
	switch {
	case len(n.dirOps) > 0 && c.chance(c.opts.DirOpsPrefix):
		entries = replayDirOps(n.syncedChildren, n.dirOps[:c.rng.IntN(len(n.dirOps)+1)])
	case !maps.Equal(n.children, n.syncedChildren) && c.chance(c.opts.KeepDirOps):
		entries = n.children
	}
	d.children = make(map[string]*memNode, len(entries))
	for _, name := range sortedNames(entries) {
		child := entries[name]
		if cp, ok := c.copies[child]; ok {
			if !child.isDir {
				d.children[name] = cp
			}
			continue
		}
		if child.isDir {
			d.children[name] = c.copyDir(child)
		} else {
			d.children[name] = c.copyFile(child)
		}
	}
	d.syncedChildren = cloneEntries(d.children)
	return d
}

// copyFile copies a file node with the data that survives.
func (c *crasher) copyFile(n *memNode) *memNode {
	n.mu.Lock()
	defer n.mu.Unlock()
	img := c.crashImage(n)
	f := &memNode{
		mode:    n.mode,
		modTime: n.modTime,
		data:    img,
		synced:  append([]byte(nil), img...),
		dirty:   clean,
	}
	c.copies[n] = f
	return f
}

// crashImage returns a fresh copy of the file's contents after a crash. n.mu
// is held.
func (c *crasher) crashImage(n *memNode) []byte {
	synced, data := n.synced, n.data
	if n.dirty == clean || !c.chance(c.opts.KeepUnsynced) {
		return append([]byte(nil), synced...)
	}
	lo := min(n.dirty, int64(len(synced)), int64(len(data)))
	hi := int64(len(data))
	cut := lo + c.rng.Int64N(hi-lo+1)
	var img []byte
	if cut == hi {
		img = append([]byte(nil), data...)
	} else {
		img = make([]byte, max(cut, int64(len(synced))))
		copy(img, data[:cut])
		if cut < int64(len(synced)) {
			copy(img[cut:], synced[cut:])
		}
	}
	if c.opts.ZeroSectors > 0 {
		for s := lo / SectorSize * SectorSize; s < cut; s += SectorSize {
			if c.chance(c.opts.ZeroSectors) {
				clear(img[max(s, lo):min(s+SectorSize, cut)])
			}
		}
	}
	// A kept prefix never holds bytes whose writeback a failed Sync
	// dropped: the kernel no longer means to write them.
	n.restoreLost(img)
	return img
}
