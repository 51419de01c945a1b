package log

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerReservedLogNames: Create refuses the names of the Manager's
// own files in the data directory (clean-shutdown,
// recovery-point-offset-checkpoint, replication-offset-checkpoint and
// their ".tmp" files): a log directory there would make checkpoint writes
// fail and the data directory no longer open.
func TestManagerReservedLogNames(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	opts := ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour}
	m, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	_, err = m.Create("ok-0")
	require.NoError(t, err)
	for _, name := range []string{managerCleanShutdownFile, managerCheckpointFile, managerHighWatermarkFile} {
		for _, n := range []string{name, name + tmpSuffix} {
			_, err := m.Create(n)
			require.ErrorIs(t, err, ErrInvalidLogName, "Create(%q)", n)
		}
	}
	require.NoError(t, m.Close())
	m, err = OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// TestManagerIgnoresReservedNameDirectories: OpenManager opened a stray
// directory named like the Manager's temporary files ("x.tmp") as a log,
// writing segment files into it, and Names listed a log that Create
// refuses; one in the place of a checkpoint's temporary file
// ("clean-shutdown.tmp") made every checkpoint write and Close fail, so
// OpenManager now refuses it.
func TestManagerIgnoresReservedNameDirectories(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	opts := ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour}
	require.NoError(t, mem.MkdirAll(mgrCrashDir+"/x.tmp", 0o755))
	m, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	require.Empty(t, m.Names())
	entries, err := mem.ReadDir(mgrCrashDir + "/x.tmp")
	require.NoError(t, err)
	require.Empty(t, entries, "nothing written into the stray directory")
	require.NoError(t, m.Close())

	require.NoError(t, mem.MkdirAll(mgrCrashDir+"/"+managerCleanShutdownFile+tmpSuffix, 0o755))
	_, err = OpenManager(mgrCrashDir, opts)
	require.ErrorContains(t, err, "checkpoint's temporary file")
}

// TestManagerOpenFailsOnAStatError: OpenManager refuses to start when it
// cannot tell whether an entry of the data directory is a log (a Stat
// error other than "does not exist"): skipping the log would hide its
// data, and the next checkpoint would drop its recovery point.
func TestManagerOpenFailsOnAStatError(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	l, err := m.Create("orders-0")
	require.NoError(t, err)
	_, err = l.Append(buildBatch(t, 2, 10, 1000))
	require.NoError(t, err)
	require.NoError(t, m.Close())

	failing := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpStat && filepath.Base(op.Path) == "orders-0" {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	_, err = OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: failing}, CheckpointInterval: time.Hour})
	require.ErrorIs(t, err, syscall.EIO)

	m, err = OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: mem}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	l, ok := m.Get("orders-0")
	require.True(t, ok)
	require.Equal(t, int64(2), l.LogEndOffset())
}

// foldFS is a case-insensitive filesystem (macOS APFS, Windows NTFS by
// default), simulated by folding every path to lower case.
type foldFS struct{ vfs.FS }

func (f foldFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	return f.FS.OpenFile(strings.ToLower(name), flag, perm)
}
func (f foldFS) Remove(name string) error    { return f.FS.Remove(strings.ToLower(name)) }
func (f foldFS) RemoveAll(name string) error { return f.FS.RemoveAll(strings.ToLower(name)) }
func (f foldFS) Rename(a, b string) error    { return f.FS.Rename(strings.ToLower(a), strings.ToLower(b)) }
func (f foldFS) MkdirAll(d string, p os.FileMode) error {
	return f.FS.MkdirAll(strings.ToLower(d), p)
}
func (f foldFS) ReadDir(d string) ([]string, error)    { return f.FS.ReadDir(strings.ToLower(d)) }
func (f foldFS) Stat(name string) (os.FileInfo, error) { return f.FS.Stat(strings.ToLower(name)) }
func (f foldFS) SyncDir(d string) error                { return f.FS.SyncDir(strings.ToLower(d)) }

// On a case-insensitive filesystem "Orders-0" and "orders-0" are one
// directory: Create took both, and two Logs wrote the same segment file,
// overwriting synced batches. "a.Deleted" was a valid name, whose
// directory Delete("a") removed (it clears "a.deleted" first).
func TestManagerNamesDifferingInCaseOnly(t *testing.T) {
	fsys := foldFS{vfs.NewMem()}
	m, err := OpenManager("/d", ManagerOptions{Log: Options{FS: fsys}})
	require.NoError(t, err)
	up, err := m.Create("Orders-0")
	require.NoError(t, err)
	_, err = up.Append(testBatch(t, 1))
	require.NoError(t, err)
	_, err = m.Create("orders-0")
	require.ErrorIs(t, err, ErrLogExists)
	for _, name := range []string{"a.Deleted", "A.DELETED", "Clean-Shutdown"} {
		_, err = m.Create(name)
		require.ErrorIs(t, err, ErrInvalidLogName, name)
	}
	require.NoError(t, m.Delete("Orders-0"))
	_, err = m.Create("orders-0")
	require.NoError(t, err, "the name is free once the log is deleted")
	require.NoError(t, m.Close())
}

// Delete renames a log's directory to "<name>.deleted", 8 bytes longer,
// which a name of 248 to 255 bytes cannot take (NAME_MAX 255): Create took
// such a name, and its log could never be deleted.
func TestManagerRefusesNamesTooLongToDelete(t *testing.T) {
	m, err := OpenManager(t.TempDir(), ManagerOptions{Log: Options{FS: noSyncFS{vfs.Default}}})
	require.NoError(t, err)
	_, err = m.Create(strings.Repeat("n", 248))
	require.ErrorIs(t, err, ErrInvalidLogName)
	name := strings.Repeat("n", 247)
	l, err := m.Create(name)
	require.NoError(t, err)
	_, err = l.Append(testBatch(t, 0))
	require.NoError(t, err)
	require.NoError(t, m.Delete(name))
	_, err = m.Create(name)
	require.NoError(t, err, "the name is free again after Delete")
	require.NoError(t, m.Close())
}

// A Create whose Open failed left the new directory, which the next
// OpenManager opened as a log.
func TestFailedCreateLeavesNoLog(t *testing.T) {
	var on atomic.Bool
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if on.Load() && op.Kind == vfs.OpOpen && strings.HasPrefix(op.Path, "/d/ghost/") {
			return vfs.Fault{Err: syscall.EMFILE}
		}
		return vfs.Fault{}
	}))
	o := ManagerOptions{Log: Options{FS: efs}}
	m, err := OpenManager("/d", o)
	require.NoError(t, err)
	on.Store(true)
	_, err = m.Create("ghost")
	require.ErrorIs(t, err, syscall.EMFILE)
	on.Store(false)
	require.Empty(t, m.Names())
	require.NoError(t, m.Close())
	m, err = OpenManager("/d", o)
	require.NoError(t, err)
	require.Empty(t, m.Names(), "a log whose Create failed")
	_, err = m.Create("ghost")
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// Names Create refuses are ErrInvalidLogName for Delete too, as its doc
// says (they were ErrNoSuchLog).
func TestManagerDeleteRefusesWhatCreateRefuses(t *testing.T) {
	m, err := OpenManager("/d", ManagerOptions{Log: Options{FS: vfs.NewMem()}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	for _, name := range []string{strings.Repeat("y", 250), "a.DELETED", "Clean-Shutdown"} {
		_, err := m.Create(name)
		require.ErrorIs(t, err, ErrInvalidLogName, name)
		require.ErrorIs(t, m.Delete(name), ErrInvalidLogName, name)
	}
}

// A log of 248 to 255 bytes, made before Create refused such names, could
// not be deleted (its deleted directory's name is too long), and Delete
// had closed it first, taking it offline until a restart. Delete now
// refuses it up front, and the log stays open.
func TestManagerDeleteRefusesALegacyLongNameUpFront(t *testing.T) {
	dir := t.TempDir()
	name := strings.Repeat("x", 250)
	l, err := Open(filepath.Join(dir, name), Options{})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	m, err := OpenManager(dir, ManagerOptions{CheckpointInterval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	require.ErrorIs(t, m.Delete(name), ErrInvalidLogName)
	l, ok := m.Get(name)
	require.True(t, ok, "the log stays")
	_, err = l.Append(testBatch(t, 1))
	require.NoError(t, err)
}

// On a case-insensitive filesystem, Delete("a") clears a leftover
// "a.deleted" first, which is the directory of a log "a.Deleted" made
// before Create refused such names: Delete destroyed that live log.
// Delete now refuses "a" while such a log exists.
func TestManagerDeleteKeepsALogNamedLikeItsDeletedDirectory(t *testing.T) {
	fsys := &presFS{FS: vfs.NewMem(), names: map[string]string{}}
	for _, n := range []string{"a", "a.Deleted"} { // made by an older version
		l, err := Open("/m/"+n, Options{FS: fsys})
		require.NoError(t, err)
		_, err = l.Append(testBatch(t, 1))
		require.NoError(t, err)
		require.NoError(t, l.Close())
	}
	m, err := OpenManager("/m", ManagerOptions{Log: Options{FS: fsys}, CheckpointInterval: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "a.Deleted"}, m.Names())
	require.ErrorIs(t, m.Delete("a"), ErrInvalidLogName)
	require.Equal(t, []string{"a", "a.Deleted"}, m.Names())
	_, err = fsys.Stat("/m/a.Deleted/" + segmentName(0) + logSuffix)
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// presFS is a case-insensitive, case-preserving filesystem (macOS APFS,
// Windows NTFS): paths are folded to lower case, but ReadDir returns the
// names as first created.
type presFS struct {
	vfs.FS
	mu    sync.Mutex
	names map[string]string // folded path -> name as created
}

func (f *presFS) note(p string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := strings.ToLower(p)
	if _, ok := f.names[k]; !ok {
		f.names[k] = filepath.Base(p)
	}
}
func (f *presFS) forget(p string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := strings.ToLower(p)
	for n := range f.names {
		if n == k || strings.HasPrefix(n, k+"/") {
			delete(f.names, n)
		}
	}
}
func (f *presFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	fl, err := f.FS.OpenFile(strings.ToLower(name), flag, perm)
	if err == nil {
		f.note(name)
	}
	return fl, err
}
func (f *presFS) Remove(name string) error {
	f.forget(name)
	return f.FS.Remove(strings.ToLower(name))
}
func (f *presFS) RemoveAll(name string) error {
	f.forget(name)
	return f.FS.RemoveAll(strings.ToLower(name))
}
func (f *presFS) Rename(a, b string) error {
	err := f.FS.Rename(strings.ToLower(a), strings.ToLower(b))
	if err == nil {
		f.forget(a)
		f.note(b)
	}
	return err
}
func (f *presFS) MkdirAll(d string, p os.FileMode) error {
	err := f.FS.MkdirAll(strings.ToLower(d), p)
	if err == nil {
		for q := d; q != "/" && q != "."; q = filepath.Dir(q) {
			f.note(q)
		}
	}
	return err
}
func (f *presFS) ReadDir(d string) ([]string, error) {
	ns, err := f.FS.ReadDir(strings.ToLower(d))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, n := range ns {
		if c, ok := f.names[strings.ToLower(filepath.Join(d, n))]; ok {
			ns[i] = c
		}
	}
	return ns, err
}
func (f *presFS) Stat(name string) (os.FileInfo, error) { return f.FS.Stat(strings.ToLower(name)) }
func (f *presFS) SyncDir(d string) error                { return f.FS.SyncDir(strings.ToLower(d)) }
