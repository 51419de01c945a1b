package vfs

import (
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// MemOptions configures a MemFS made by NewMemWithOptions.
type MemOptions struct {
	// MkdirAllDurable makes every directory created by MkdirAll durable at
	// once, as if its parent had been synced with SyncDir right after. By
	// default (false) a new directory is durable only once its parent was
	// SyncDir'ed, like on a real filesystem; Kafka fsyncs the parent after
	// creating a log directory, and the strict default checks that replog
	// does the same. Tests that only care about the files inside a directory
	// they made may set it. Only the new directory's own entry is affected:
	// files created in it still need a SyncDir of it.
	MkdirAllDurable bool
}

// MemFS is an in-memory FS that can simulate a power loss (see CrashClone).
//
// Paths are cleaned with filepath.Clean and split on the OS separator (and
// on '/'); a volume name is ignored and relative paths are taken from the
// root, so "/data/x", "data/x" and filepath.Join("/data", "x") all name the
// same file. Errors are *os.PathError or *os.LinkError wrapping fs.ErrNotExist,
// fs.ErrExist, os.ErrClosed or a syscall.Errno, as package os returns them.
// Modification times come from a counter that advances by one second per
// change, starting at 2000-01-01 UTC, so runs are deterministic.
//
// For the crash model, MemFS keeps two states for each file and directory:
// the current one that reads see, and the durable one. File.Sync copies a
// file's current data to its durable data; SyncDir (or Sync on a directory
// handle) copies a directory's current entries to its durable entries.
// Each directory also logs, in order, the entry changes (create, remove,
// rename) made since its last SyncDir, so that a crash can keep a prefix of
// them (CrashOptions.DirOpsPrefix).
//
// Multiple goroutines may invoke methods on a MemFS and on its Files
// simultaneously.
type MemFS struct {
	opts MemOptions
	// clock counts changes; see now.
	clock atomic.Int64

	// mu guards the children and syncedChildren maps of every directory
	// node; it is taken before any node's mu.
	mu   sync.Mutex
	root *memNode
}

// memNode is an inode: a file or a directory. A node may be referenced by
// several directory maps (the current and the durable entries, or by
// several durable entries after unsynced renames).
type memNode struct {
	isDir bool

	// For directories, guarded by MemFS.mu.
	children       map[string]*memNode // current entries
	syncedChildren map[string]*memNode // durable entries, as of the last SyncDir
	// dirOps are the entry changes since the last SyncDir, oldest first:
	// replaying all of them onto syncedChildren gives children.
	dirOps []dirOp

	mu      sync.Mutex
	mode    os.FileMode
	modTime time.Time
	// For files, guarded by mu.
	data   []byte // current contents
	synced []byte // durable contents, as of the last Sync; never aliases data
	// dirty is the lowest offset at which data may differ from synced, or
	// clean when they are equal: data[:dirty] == synced[:dirty] outside the
	// lost spans.
	dirty int64
	// lost lists, sorted and disjoint, the byte ranges of data whose
	// writeback a failed Sync dropped (see loseWriteback): reads see data,
	// but no later Sync makes it durable until it is written again.
	lost []span
}

// span is the byte range [lo, hi) of a file.
type span struct{ lo, hi int64 }

const clean = math.MaxInt64

// entryChange sets a directory entry to node, or removes it if node is nil.
type entryChange struct {
	name string
	node *memNode
}

// dirOp is one change of a directory's entries, kept or lost as a whole by
// a crash: a create, a remove, the two halves of a rename within the
// directory, or one half of a rename across directories.
type dirOp []entryChange

// logDirOp appends an unsynced entry change to dir's log. MemFS.mu must be
// held.
func (dir *memNode) logDirOp(changes ...entryChange) {
	dir.dirOps = append(dir.dirOps, dirOp(changes))
}

// forgetDirOps drops the changes of name from dir's log, once the entry
// name was made durable on its own (MemOptions.MkdirAllDurable): no
// prefix of the log may then change it. MemFS.mu must be held.
func (dir *memNode) forgetDirOps(name string) {
	var ops []dirOp
	for _, op := range dir.dirOps {
		var kept dirOp
		for _, ch := range op {
			if ch.name != name {
				kept = append(kept, ch)
			}
		}
		if len(kept) > 0 {
			ops = append(ops, kept)
		}
	}
	dir.dirOps = ops
}

// markDirSynced makes dir's current entries durable. MemFS.mu must be
// held.
func (dir *memNode) markDirSynced() {
	dir.syncedChildren = cloneEntries(dir.children)
	dir.dirOps = nil
}

// replayDirOps returns a copy of synced with ops applied in order.
func replayDirOps(synced map[string]*memNode, ops []dirOp) map[string]*memNode {
	entries := cloneEntries(synced)
	for _, op := range ops {
		for _, ch := range op {
			if ch.node == nil {
				delete(entries, ch.name)
			} else {
				entries[ch.name] = ch.node
			}
		}
	}
	return entries
}

// memEpoch is the modification time of the first change.
var memEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// NewMem returns an empty in-memory filesystem holding only its root
// directory, with default options.
func NewMem() *MemFS { return NewMemWithOptions(MemOptions{}) }

// NewMemWithOptions returns an empty in-memory filesystem configured by opts.
func NewMemWithOptions(opts MemOptions) *MemFS {
	m := &MemFS{opts: opts}
	m.root = m.newDir(0o755)
	return m
}

var _ FS = (*MemFS)(nil)

// now advances the clock and returns the new time.
func (m *MemFS) now() time.Time {
	return memEpoch.Add(time.Duration(m.clock.Add(1)) * time.Second)
}

func (m *MemFS) newDir(perm os.FileMode) *memNode {
	return &memNode{
		isDir:          true,
		children:       map[string]*memNode{},
		syncedChildren: map[string]*memNode{},
		mode:           fs.ModeDir | perm.Perm(),
		modTime:        m.now(),
		dirty:          clean,
	}
}

func (m *MemFS) newFile(perm os.FileMode) *memNode {
	return &memNode{mode: perm.Perm(), modTime: m.now(), dirty: clean}
}

// splitPath returns the components of a cleaned name, without the volume
// name, "." and "..".
func splitPath(name string) []string {
	name = filepath.Clean(name)
	name = name[len(filepath.VolumeName(name)):]
	name = filepath.ToSlash(name)
	var parts []string
	for _, p := range strings.Split(name, "/") {
		if p != "" && p != "." && p != ".." {
			parts = append(parts, p)
		}
	}
	return parts
}

// walkDir returns the directory node at parts. m.mu must be held.
func (m *MemFS) walkDir(parts []string) (*memNode, error) {
	n := m.root
	for _, p := range parts {
		c, ok := n.children[p]
		if !ok {
			return nil, fs.ErrNotExist
		}
		if !c.isDir {
			return nil, syscall.ENOTDIR
		}
		n = c
	}
	return n, nil
}

// lookup returns the parent directory of name, its base name and the node
// (nil if absent). For the root, parent is nil and base is "". m.mu must be
// held.
func (m *MemFS) lookup(name string) (parent *memNode, base string, n *memNode, err error) {
	parts := splitPath(name)
	if len(parts) == 0 {
		return nil, "", m.root, nil
	}
	parent, err = m.walkDir(parts[:len(parts)-1])
	if err != nil {
		return nil, "", nil, err
	}
	base = parts[len(parts)-1]
	return parent, base, parent.children[base], nil
}

// touch sets a directory's modification time. m.mu must be held.
func (m *MemFS) touch(dir *memNode) {
	t := m.now()
	dir.mu.Lock()
	dir.modTime = t
	dir.mu.Unlock()
}

// OpenFile opens name with the os.O_* flags O_RDONLY, O_WRONLY, O_RDWR,
// O_CREATE, O_EXCL and O_TRUNC; O_APPEND fails with errors.ErrUnsupported.
// A directory may be opened read-only: its handle supports Stat, Close and
// Sync (which acts as SyncDir).
func (m *MemFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if flag&os.O_APPEND != 0 {
		return nil, &os.PathError{Op: "open", Path: name, Err: errors.ErrUnsupported}
	}
	var read, write bool
	switch flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_RDONLY:
		read = true
	case os.O_WRONLY:
		write = true
	case os.O_RDWR:
		read, write = true, true
	default:
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EINVAL}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, n, err := m.lookup(name)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	switch {
	case n == nil && flag&os.O_CREATE == 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case n == nil:
		n = m.newFile(perm)
		parent.children[base] = n
		parent.logDirOp(entryChange{name: base, node: n})
		m.touch(parent)
	case flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		return nil, &os.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case n.isDir && (write || flag&os.O_TRUNC != 0):
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EISDIR}
	case flag&os.O_TRUNC != 0:
		n.mu.Lock()
		n.truncate(0, m.now())
		n.mu.Unlock()
	}
	return &memFile{fs: m, n: n, name: name, read: read, write: write}, nil
}

// Remove removes a file or an empty directory. Open handles on a removed
// file keep working.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, n, err := m.lookup(name)
	switch {
	case err != nil:
		return &os.PathError{Op: "remove", Path: name, Err: err}
	case n == nil:
		return &os.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	case parent == nil:
		return &os.PathError{Op: "remove", Path: name, Err: syscall.EBUSY}
	case n.isDir && len(n.children) > 0:
		return &os.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
	}
	delete(parent.children, base)
	parent.logDirOp(entryChange{name: base})
	m.touch(parent)
	return nil
}

// RemoveAll removes name and everything below it; like os.RemoveAll it
// returns nil if name does not exist. RemoveAll of the root empties it.
// Like os.RemoveAll it unlinks one entry at a time, deepest first, so a
// crash before the directories are synced may leave the tree partly
// removed.
func (m *MemFS) RemoveAll(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, n, err := m.lookup(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return &os.PathError{Op: "unlinkat", Path: name, Err: err}
	case n == nil:
		return nil
	case parent == nil:
		m.removeTree(n)
		return nil
	}
	if n.isDir {
		m.removeTree(n)
	}
	delete(parent.children, base)
	parent.logDirOp(entryChange{name: base})
	m.touch(parent)
	return nil
}

// removeTree removes every entry below dir, deepest first, one unlink per
// entry as os.RemoveAll does, so that a crash may keep any prefix of the
// removals of each directory (CrashOptions.DirOpsPrefix). MemFS.mu must
// be held.
func (m *MemFS) removeTree(dir *memNode) {
	for _, name := range sortedNames(dir.children) {
		if child := dir.children[name]; child.isDir {
			m.removeTree(child)
		}
		dir.logDirOp(entryChange{name: name})
	}
	clear(dir.children)
	m.touch(dir)
}

// Rename renames oldname to newname, atomically replacing newname if it
// exists: a file by a file, or an empty directory by a directory.
func (m *MemFS) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	linkErr := func(err error) error {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	oldParent, oldBase, n, err := m.lookup(oldname)
	if err != nil {
		return linkErr(err)
	}
	if n == nil {
		return linkErr(fs.ErrNotExist)
	}
	newParent, newBase, target, err := m.lookup(newname)
	if err != nil {
		return linkErr(err)
	}
	if oldParent == nil || newParent == nil {
		return linkErr(syscall.EBUSY)
	}
	if target == n {
		return nil
	}
	if n.isDir {
		// Refuse to move a directory below itself.
		oldParts, newParts := splitPath(oldname), splitPath(newname)
		if len(newParts) > len(oldParts) && equalParts(newParts[:len(oldParts)], oldParts) {
			return linkErr(syscall.EINVAL)
		}
	}
	if target != nil {
		switch {
		case n.isDir && !target.isDir:
			return linkErr(syscall.ENOTDIR)
		case !n.isDir && target.isDir:
			return linkErr(syscall.EISDIR)
		case target.isDir && len(target.children) > 0:
			return linkErr(syscall.ENOTEMPTY)
		}
	}
	delete(oldParent.children, oldBase)
	newParent.children[newBase] = n
	if newParent == oldParent {
		// Atomic within one directory: both halves or neither.
		oldParent.logDirOp(entryChange{name: oldBase}, entryChange{name: newBase, node: n})
	} else {
		oldParent.logDirOp(entryChange{name: oldBase})
		newParent.logDirOp(entryChange{name: newBase, node: n})
	}
	m.touch(oldParent)
	if newParent != oldParent {
		m.touch(newParent)
	}
	return nil
}

func equalParts(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// MkdirAll creates dir and any missing parents. The new directories are
// durable only after a SyncDir of their parents, unless the MemFS was made
// with MemOptions.MkdirAllDurable.
func (m *MemFS) MkdirAll(dir string, perm os.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.root
	for _, p := range splitPath(dir) {
		c, ok := n.children[p]
		if !ok {
			c = m.newDir(perm)
			n.children[p] = c
			if m.opts.MkdirAllDurable {
				n.syncedChildren[p] = c
				n.forgetDirOps(p)
			} else {
				n.logDirOp(entryChange{name: p, node: c})
			}
			m.touch(n)
		} else if !c.isDir {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		n = c
	}
	return nil
}

// ReadDir returns the sorted names of the entries of dir.
func (m *MemFS) ReadDir(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.walkDir(splitPath(dir))
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return sortedNames(n.children), nil
}

func sortedNames(entries map[string]*memNode) []string {
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Stat returns the metadata of name.
func (m *MemFS) Stat(name string) (os.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, base, n, err := m.lookup(name)
	if err == nil && n == nil {
		err = fs.ErrNotExist
	}
	if err != nil {
		return nil, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	if base == "" {
		base = string(filepath.Separator)
	}
	return n.stat(base), nil
}

// SyncDir makes the current entries of dir durable: after a crash, dir holds
// exactly these entries (each of which is a file with its own durable data,
// or a directory with its own durable entries).
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.walkDir(splitPath(dir))
	if err != nil {
		return &os.PathError{Op: "sync", Path: dir, Err: err}
	}
	n.markDirSynced()
	return nil
}

func cloneEntries(entries map[string]*memNode) map[string]*memNode {
	c := make(map[string]*memNode, len(entries))
	for k, v := range entries {
		c[k] = v
	}
	return c
}

// stat returns the node's metadata under the given name.
func (n *memNode) stat(name string) os.FileInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return &memFileInfo{name: name, size: int64(len(n.data)), mode: n.mode, modTime: n.modTime}
}

// truncate sets the size of a file node. n.mu must be held.
func (n *memNode) truncate(size int64, now time.Time) {
	cur := int64(len(n.data))
	switch {
	case size < cur:
		n.data = n.data[:size]
		n.markDirty(size)
		n.clipLost(size)
	case size > cur:
		n.data = append(n.data, make([]byte, size-cur)...)
		n.markDirty(cur)
	}
	n.modTime = now
}

func (n *memNode) markDirty(off int64) {
	n.dirty = min(n.dirty, off)
}

// sync makes the file's current data durable, except the lost spans,
// which keep their durable bytes (zeros past the old durable size). n.mu
// must be held.
func (n *memNode) sync() {
	if n.dirty == clean {
		return
	}
	if len(n.lost) > 0 {
		next := append([]byte(nil), n.data...)
		n.restoreLost(next)
		n.synced, n.dirty = next, clean
		return
	}
	keep := min(n.dirty, int64(len(n.synced)), int64(len(n.data)))
	// synced[:keep] has its own backing array, so this never aliases data.
	n.synced = append(n.synced[:keep], n.data[keep:]...)
	n.dirty = clean
}

// loseWriteback is what a failed fsync does on Linux: the kernel marks the
// pages it failed to write clean, so their data stays readable but is not
// on disk, and a later fsync succeeds without writing it. The unsynced
// bytes become lost spans; a pending truncation stays pending. n.mu must be
// held.
func (n *memNode) loseWriteback() {
	if n.dirty == clean {
		return
	}
	if lo, hi := min(n.dirty, int64(len(n.data))), int64(len(n.data)); lo < hi {
		n.addLost(lo, hi)
	}
	n.dirty = clean
	if len(n.data) < len(n.synced) {
		n.dirty = int64(len(n.data))
	}
}

// restoreLost sets the bytes of img in lost spans to what is durable
// there: synced's bytes, or zeros past its end.
func (n *memNode) restoreLost(img []byte) {
	for _, sp := range n.lost {
		lo, hi := min(sp.lo, int64(len(img))), min(sp.hi, int64(len(img)))
		c := int64(copy(img[lo:hi], n.synced[min(lo, int64(len(n.synced))):]))
		clear(img[lo+c : hi])
	}
}

// addLost adds [lo, hi) to the lost spans, merging overlaps.
func (n *memNode) addLost(lo, hi int64) {
	out := n.lost[:0:0]
	for _, sp := range n.lost {
		if sp.hi < lo || sp.lo > hi {
			out = append(out, sp)
			continue
		}
		lo, hi = min(lo, sp.lo), max(hi, sp.hi)
	}
	out = append(out, span{lo, hi})
	sort.Slice(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	n.lost = out
}

// rewrite removes [lo, hi) from the lost spans: written again, those bytes
// are dirty and a Sync writes them back.
func (n *memNode) rewrite(lo, hi int64) {
	if len(n.lost) == 0 || lo >= hi {
		return
	}
	out := n.lost[:0:0]
	for _, sp := range n.lost {
		if sp.lo < lo {
			out = append(out, span{sp.lo, min(sp.hi, lo)})
		}
		if sp.hi > hi {
			out = append(out, span{max(sp.lo, hi), sp.hi})
		}
	}
	n.lost = out
}

// clipLost drops the lost bytes at or past size (the file was truncated).
func (n *memNode) clipLost(size int64) {
	n.rewrite(size, math.MaxInt64)
}

type memFileInfo struct {
	name    string
	size    int64
	mode    os.FileMode
	modTime time.Time
}

func (fi *memFileInfo) Name() string       { return fi.name }
func (fi *memFileInfo) Size() int64        { return fi.size }
func (fi *memFileInfo) Mode() os.FileMode  { return fi.mode }
func (fi *memFileInfo) ModTime() time.Time { return fi.modTime }
func (fi *memFileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi *memFileInfo) Sys() any           { return nil }

// memFile is an open MemFS file or directory.
type memFile struct {
	fs          *MemFS
	n           *memNode
	name        string
	read, write bool
	closed      atomic.Bool
}

var _ File = (*memFile)(nil)

func (f *memFile) check(op string, need bool, denied error) error {
	switch {
	case f.closed.Load():
		return &os.PathError{Op: op, Path: f.name, Err: os.ErrClosed}
	case f.n.isDir && op != "sync" && op != "stat":
		return &os.PathError{Op: op, Path: f.name, Err: syscall.EISDIR}
	case !need:
		return &os.PathError{Op: op, Path: f.name, Err: denied}
	}
	return nil
}

// ReadAt reads like os.File.ReadAt: fewer than len(p) bytes come with io.EOF.
func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check("read", f.read, syscall.EBADF); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &os.PathError{Op: "readat", Path: f.name, Err: errors.New("negative offset")}
	}
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	if off >= int64(len(f.n.data)) {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := copy(p, f.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off, filling any gap past the end with zeros.
func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check("write", f.write, syscall.EBADF); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &os.PathError{Op: "writeat", Path: f.name, Err: errors.New("negative offset")}
	}
	now := f.fs.now()
	n := f.n
	n.mu.Lock()
	defer n.mu.Unlock()
	end := off + int64(len(p))
	if cur := int64(len(n.data)); end > cur {
		n.markDirty(min(cur, off))
		n.data = append(n.data, make([]byte, end-cur)...)
	}
	if len(p) > 0 {
		n.markDirty(off)
		n.rewrite(off, end)
	}
	copy(n.data[off:], p)
	n.modTime = now
	return len(p), nil
}

// Sync makes the file's data durable, or for a directory handle its entries.
func (f *memFile) Sync() error {
	if err := f.check("sync", true, nil); err != nil {
		return err
	}
	if f.n.isDir {
		f.fs.mu.Lock()
		f.n.markDirSynced()
		f.fs.mu.Unlock()
		return nil
	}
	f.n.mu.Lock()
	f.n.sync()
	f.n.mu.Unlock()
	return nil
}

// loseWriteback drops the writeback of the file's unsynced data, as a
// failed fsync does on Linux (see memNode.loseWriteback); ErrorFS calls it
// when it fails a Sync.
func (f *memFile) loseWriteback() {
	if f.n.isDir {
		return
	}
	f.n.mu.Lock()
	f.n.loseWriteback()
	f.n.mu.Unlock()
}

// Truncate changes the file's size, filling with zeros when it grows.
func (f *memFile) Truncate(size int64) error {
	if err := f.check("truncate", f.write, syscall.EINVAL); err != nil {
		return err
	}
	if size < 0 {
		return &os.PathError{Op: "truncate", Path: f.name, Err: syscall.EINVAL}
	}
	now := f.fs.now()
	f.n.mu.Lock()
	f.n.truncate(size, now)
	f.n.mu.Unlock()
	return nil
}

// Stat returns the file's metadata; Name is the base of the opened name.
func (f *memFile) Stat() (os.FileInfo, error) {
	if err := f.check("stat", true, nil); err != nil {
		return nil, err
	}
	return f.n.stat(filepath.Base(f.name)), nil
}

// Name returns the name the file was opened with.
func (f *memFile) Name() string { return f.name }

// Close closes the handle; a second Close returns os.ErrClosed.
func (f *memFile) Close() error {
	if f.closed.Swap(true) {
		return &os.PathError{Op: "close", Path: f.name, Err: os.ErrClosed}
	}
	return nil
}
