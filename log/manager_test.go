package log

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// Tests of issue 9: many logs under one Manager.

// noSyncFS is a filesystem with fsyncs turned into no-ops, for tests of
// many logs that are not about durability: on the real filesystem a
// directory fsync costs milliseconds on the CI disk (each new log takes
// two), and on a MemFS SyncDir copies the directory's entries (10,000
// logs in one directory make that quadratic).
type noSyncFS struct{ vfs.FS }

func (f noSyncFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return noSyncFile{file}, nil
}

func (noSyncFS) SyncDir(string) error { return nil }

type noSyncFile struct{ vfs.File }

func (noSyncFile) Sync() error { return nil }

// openFDs returns the number of open descriptors of the process, from
// /proc/self/fd (minus the one used to list it); ok is false where there
// is no /proc.
func openFDs(t testing.TB) (n int, ok bool) {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	return len(entries) - 1, true
}

// requireFDsWithin checks that the process has at most limit descriptors
// more than at base (both from openFDs; skipped without /proc).
func requireFDsWithin(t testing.TB, base, limit int, msg string) {
	t.Helper()
	n, ok := openFDs(t)
	if !ok {
		return
	}
	require.LessOrEqual(t, n-base, limit, "open descriptors beyond the cap %s", msg)
}

// manyLogBatches is the workload of the many-logs tests: log i gets
// 1 + i%2 batches, testBatch(manyLogSeq(i, k)) for k = 0, 1.
func manyLogBatches(i int) int { return 1 + i%2 }

func manyLogSeq(i, k int) int { return (i*3 + k*257) % len(batchTemplates) }

// manyLogExpected returns the batches log i must hold, stamped with their
// offsets as Append stamps them.
func manyLogExpected(t testing.TB, i int) [][]byte {
	t.Helper()
	var out [][]byte
	off := int64(0)
	for k := 0; k < manyLogBatches(i); k++ {
		b := testBatch(t, manyLogSeq(i, k))
		Batch(b).setBaseOffset(off)
		off = Batch(b).NextOffset()
		out = append(out, b)
	}
	return out
}

// manyTestLogs is how many logs TestManagerTenThousandLogs runs.
const manyTestLogs = 10_000

// TestManagerTenThousandLogs creates 10,000 logs under one Manager (in
// memory: see noSyncFS), writes one or two batches to each (segments of
// 1 KiB: about half of the logs roll), closes and reopens the Manager and
// reads every log back. On the way it checks that the Manager's
// goroutines do not depend on the number of logs (the same as with 100
// logs) and that the open segment files stay within MaxOpenFiles.
// TestManagerOpenFilesCap checks the cap on real descriptors.
func TestManagerTenThousandLogs(t *testing.T) {
	requireNoGoroutineLeak(t)
	// The baseline is taken with no Manager open; after each Close the
	// count is let fall back to it, so goroutines still exiting from the
	// closed Manager do not shift the comparison.
	base := runtime.NumGoroutine()
	const maxOpen = 64
	opts := ManagerOptions{
		Log:          Options{FS: noSyncFS{vfs.NewMem()}, SegmentBytes: 1 << 10, IndexIntervalBytes: 256},
		MaxOpenFiles: maxOpen,
	}

	// The Manager's goroutines with 100 logs open, for comparison.
	const small = "/small"
	m, err := OpenManager(small, opts)
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		_, err := m.Create(fmt.Sprintf("small-%d", i))
		require.NoError(t, err)
	}
	require.NoError(t, m.Close())
	g0 := base + settledGoroutines(base, 0)
	m, err = OpenManager(small, opts)
	require.NoError(t, err)
	require.Len(t, m.Names(), 100)
	g100 := settledGoroutines(g0, DefaultManagerWorkers+2)
	require.NoError(t, m.Close())

	const dir = "/data"
	m, err = OpenManager(dir, opts)
	require.NoError(t, err)
	for i := 0; i < manyTestLogs; i++ {
		l, err := m.Create(fmt.Sprintf("topic-%d", i))
		require.NoError(t, err)
		for k := 0; k < manyLogBatches(i); k++ {
			_, err := l.Append(testBatch(t, manyLogSeq(i, k)))
			require.NoError(t, err)
		}
	}
	st := m.Stats()
	require.Equal(t, manyTestLogs, st.Logs)
	require.LessOrEqual(t, st.OpenFiles, maxOpen)
	require.NoError(t, m.Close())

	g0 = base + settledGoroutines(base, 0)
	m, err = OpenManager(dir, opts)
	require.NoError(t, err)
	defer m.Close()
	// Open's recovery workers have called Done but may not have returned
	// yet: wait (briefly) for exiting goroutines before counting.
	g10000 := settledGoroutines(g0, min(g100, DefaultManagerWorkers+2))
	require.LessOrEqual(t, g10000, g100, "the Manager's goroutines grow with its logs: %d with 100 logs, %d with %d", g100, g10000, manyTestLogs)
	require.LessOrEqual(t, g10000, DefaultManagerWorkers+2, "goroutines beyond the workers, the ticker and the checkpointer")
	// Opening reads no segment file: none is open yet.
	require.Zero(t, m.Stats().OpenFiles, "segment files opened by a clean open")

	names := m.Names()
	require.Len(t, names, manyTestLogs)
	rolled := 0
	for i := 0; i < manyTestLogs; i++ {
		name := fmt.Sprintf("topic-%d", i)
		l, ok := m.Get(name)
		require.True(t, ok, name)
		want := manyLogExpected(t, i)
		require.Equal(t, Batch(want[len(want)-1]).NextOffset(), l.LogEndOffset(), "log end offset of %s", name)
		got, err := tryReadState(l)
		require.NoError(t, err, name)
		require.Equal(t, len(want), len(got.batches), "batches of %s", name)
		for k := range want {
			if !bytes.Equal(want[k], got.batches[k]) {
				require.Failf(t, "batch differs", "log %s batch %d", name, k)
			}
		}
		if len(l.segments()) > 1 {
			rolled++
		}
	}
	require.Positive(t, rolled, "no log rolled")
	st = m.Stats()
	require.LessOrEqual(t, st.OpenFiles, maxOpen)
	require.Greater(t, st.FileOpens, int64(maxOpen), "reading every log must have reopened evicted files")
	require.NoError(t, m.Close())
}

// TestManagerOpenFilesCap checks MaxOpenFiles on real files: 150 logs of
// 2-3 segments, a cap of 16. The Manager's count of open segment files
// and, on Linux, the process's descriptors (/proc/self/fd) stay within it
// (the latter with the evicted files being fsynced in the background)
// while the logs are written, after a clean reopen (which opens no
// segment file) and after every log was read.
func TestManagerOpenFilesCap(t *testing.T) {
	requireNoGoroutineLeak(t)
	const (
		logs    = 150
		maxOpen = 16
		// Descriptors that are not segment files (an index, snapshot or
		// checkpoint file a worker has open at that moment), and dirty
		// segment files evicted and not yet fsynced and closed in the
		// background (at most maxBackgroundCloses).
		slack = 4 + maxBackgroundCloses
	)
	opts := ManagerOptions{
		Log:          Options{FS: noSyncFS{vfs.Default}, SegmentBytes: 1 << 10, IndexIntervalBytes: 256},
		MaxOpenFiles: maxOpen,
	}
	dir := t.TempDir()
	fds0, _ := openFDs(t)
	m, err := OpenManager(dir, opts)
	require.NoError(t, err)
	defer m.Close()
	for i := 0; i < logs; i++ {
		l, err := m.Create(fmt.Sprintf("cap-%d", i))
		require.NoError(t, err)
		for k := 0; k < 6; k++ {
			_, err := l.Append(testBatch(t, i+k))
			require.NoError(t, err)
		}
		if i%30 == 29 {
			require.LessOrEqual(t, m.Stats().OpenFiles, maxOpen)
			requireFDsWithin(t, fds0, maxOpen+slack, fmt.Sprintf("after writing %d logs", i+1))
		}
	}
	require.NoError(t, m.Close())
	requireFDsWithin(t, fds0, 0, "after Close")

	m, err = OpenManager(dir, opts)
	require.NoError(t, err)
	require.Zero(t, m.Stats().OpenFiles)
	requireFDsWithin(t, fds0, slack, "after a clean open")
	segments := 0
	for _, name := range m.Names() {
		l, _ := m.Get(name)
		require.Len(t, readState(t, l).batches, 6, name)
		segments += len(l.segments())
	}
	require.Greater(t, segments, 2*logs)
	st := m.Stats()
	require.Equal(t, maxOpen, st.OpenFiles, "the cache is full after reading every segment")
	require.GreaterOrEqual(t, st.FileOpens, int64(segments), "every segment file was opened to be read")
	requireFDsWithin(t, fds0, maxOpen+slack, "after reading every log")
	require.NoError(t, m.Close())
}

// TestManagerCreateGetDelete covers the catalogue: names, duplicates,
// invalid names, deletion and re-creation, on the real filesystem.
func TestManagerCreateGetDelete(t *testing.T) {
	requireNoGoroutineLeak(t)
	dir := t.TempDir()
	opts := ManagerOptions{Log: Options{SegmentBytes: 1 << 10}}
	m, err := OpenManager(dir, opts)
	require.NoError(t, err)
	for _, name := range []string{"orders-0", "orders-1", "clicks-0"} {
		l, err := m.Create(name)
		require.NoError(t, err)
		for k := 0; k < 8; k++ {
			_, err := l.Append(testBatch(t, k))
			require.NoError(t, err)
		}
	}
	_, err = m.Create("orders-0")
	require.ErrorIs(t, err, ErrLogExists)
	for _, bad := range []string{"", ".", "..", "a/b", "x.deleted", "sp ace"} {
		_, err := m.Create(bad)
		require.Error(t, err, "name %q", bad)
	}
	require.Equal(t, []string{"clicks-0", "orders-0", "orders-1"}, m.Names())
	require.ErrorIs(t, m.Delete("nope"), ErrNoSuchLog)
	// A name Create refuses was ErrNoSuchLog ("no such log: " for "").
	for _, bad := range []string{"", ".", "..", "a/b", "x.deleted"} {
		require.ErrorIs(t, m.Delete(bad), ErrInvalidLogName, "Delete(%q)", bad)
	}

	old, _ := m.Get("orders-1")
	require.NoError(t, m.Delete("orders-1"))
	_, ok := m.Get("orders-1")
	require.False(t, ok)
	require.Equal(t, []string{"clicks-0", "orders-0"}, m.Names())
	_, err = old.Append(testBatch(t, 1))
	require.ErrorIs(t, err, ErrClosed, "the deleted log is closed")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NotContains(t, e.Name(), "orders-1", "the deleted log's directory is gone")
	}

	// A new log of the same name starts empty.
	l, err := m.Create("orders-1")
	require.NoError(t, err)
	require.Zero(t, l.LogEndOffset())
	_, err = l.Append(testBatch(t, 100))
	require.NoError(t, err)
	require.NoError(t, m.Close())
	_, err = m.Create("late")
	require.ErrorIs(t, err, ErrClosed)

	m, err = OpenManager(dir, opts)
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, []string{"clicks-0", "orders-0", "orders-1"}, m.Names())
	l, _ = m.Get("orders-1")
	st := readState(t, l)
	require.Len(t, st.batches, 1)
	want := testBatch(t, 100)
	Batch(want).setBaseOffset(0)
	require.Equal(t, want, st.batches[0])
	l, _ = m.Get("orders-0")
	require.Len(t, readState(t, l).batches, 8)
	require.NoError(t, m.Close())
}

// TestManagerHalfDeletedLogRemovedAtOpen: a "<name>.deleted" directory, as
// a crash in the middle of Delete leaves it, is removed by the next
// OpenManager and is not opened as a log.
func TestManagerHalfDeletedLogRemovedAtOpen(t *testing.T) {
	requireNoGoroutineLeak(t)
	dir := t.TempDir()
	m, err := OpenManager(dir, ManagerOptions{})
	require.NoError(t, err)
	for _, name := range []string{"a-0", "b-0"} {
		l, err := m.Create(name)
		require.NoError(t, err)
		_, err = l.Append(testBatch(t, 3))
		require.NoError(t, err)
	}
	require.NoError(t, m.Close())
	// Delete's first step, durably renaming the directory, without the
	// removal.
	require.NoError(t, os.Rename(filepath.Join(dir, "b-0"), filepath.Join(dir, "b-0"+deletedDirSuffix)))

	m, err = OpenManager(dir, ManagerOptions{})
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, []string{"a-0"}, m.Names())
	_, err = os.Stat(filepath.Join(dir, "b-0"+deletedDirSuffix))
	require.ErrorIs(t, err, os.ErrNotExist, "the half-deleted log's directory is still there")
	// Its recovery point left the checkpoint file too, before OpenManager
	// returned: a new "b-0" must not be recovered from it.
	data, err := os.ReadFile(filepath.Join(dir, managerCheckpointFile))
	require.NoError(t, err)
	rps, err := decodeNamedCheckpoint(data)
	require.NoError(t, err)
	require.Contains(t, rps, "a-0")
	require.NotContains(t, rps, "b-0")
	require.NoError(t, m.Close())
}

// TestManagerDeleteCrash crashes (power loss, strict model: only synced
// state survives) before every filesystem operation of a Delete and of
// the Create of the same name after it: the log is then either whole
// (its synced batches all there) or gone, never half there, no
// "<name>.deleted" directory survives the next open, and a re-created log
// holds nothing of the old one.
func TestManagerDeleteCrash(t *testing.T) {
	requireNoGoroutineLeak(t)
	opts := func(fsys vfs.FS) ManagerOptions {
		return ManagerOptions{Log: Options{FS: fsys, SegmentBytes: 1 << 10, IndexIntervalBytes: 256}, CheckpointInterval: time.Hour}
	}
	// Setup: two logs with synced data, the Manager open.
	setup := func(fsys vfs.FS) (*Manager, [][]byte) {
		m, err := OpenManager(mgrCrashDir, opts(fsys))
		require.NoError(t, err)
		var acked [][]byte
		for _, name := range []string{"keep-0", "gone-0"} {
			l, err := m.Create(name)
			require.NoError(t, err)
			for k := 0; k < 12; k++ {
				b := testBatch(t, k)
				_, err := l.Append(b)
				require.NoError(t, err)
				if name == "gone-0" {
					acked = append(acked, b)
				}
			}
			require.NoError(t, l.Sync())
		}
		return m, acked
	}
	counted := 0
	for k := int64(0); ; k++ {
		mem := vfs.NewMem()
		efs := vfs.NewErrorFS(mem, nil)
		m, acked := setup(efs)
		crash := &vfs.Crash{N: efs.Ops() + k, Mem: mem}
		efs.SetInjector(crash)
		deleted := m.Delete("gone-0") == nil
		created := false
		if deleted {
			_, err := m.Create("gone-0")
			created = err == nil
		}
		_ = m.Close()
		img := crash.Clone()
		if img == nil {
			break // the Delete, the Create and the Close all ran
		}
		counted++
		desc := fmt.Sprintf("(crash before operation %d of the Delete; Delete returned %v, Create %v)", k, deleted, created)

		m2, err := OpenManager(mgrCrashDir, opts(img))
		require.NoError(t, err, desc)
		names := m2.Names()
		require.Contains(t, names, "keep-0", desc)
		leftovers, err := img.ReadDir(mgrCrashDir)
		require.NoError(t, err)
		require.NotContains(t, leftovers, "gone-0"+deletedDirSuffix, "half-deleted directory left after open %s", desc)
		if l, ok := m2.Get("gone-0"); ok {
			st, err := tryReadState(l)
			require.NoError(t, err, desc)
			if deleted {
				require.Zero(t, st.end, "the re-created log holds the deleted one's data %s", desc)
			} else {
				// The Delete did not finish: the log is whole or gone.
				checkAcked(t, st, acked)
			}
		}
		if created {
			require.Contains(t, names, "gone-0", "a created log vanished %s", desc)
		}
		require.NoError(t, m2.Close(), desc)
	}
	require.Greater(t, counted, 5, "crash points")
}

// mgrCrashDir is the data directory of the in-memory crash tests.
const mgrCrashDir = "/data"

// mgrCrashOptions: small segments so that a few appends roll, few open
// files so the cache evicts, no timed checkpoint (Close, recovery and
// Create write it), two workers.
func mgrCrashOptions(fsys vfs.FS) ManagerOptions {
	return ManagerOptions{
		Log:                Options{FS: fsys, SegmentBytes: 1 << 10, IndexIntervalBytes: 256},
		Workers:            2,
		RecoveryWorkers:    3,
		MaxOpenFiles:       4,
		CheckpointInterval: time.Hour,
	}
}

// mgrLogModel is what the crash workload did to one log name.
type mgrLogModel struct {
	// attempted holds every batch passed to Append in the current
	// incarnation of the name, stamped (if it got that far).
	attempted [][]byte
	// acked counts the leading batches of attempted known durable: Sync or
	// the Manager's Close returned nil after their Append returned nil.
	acked int
	// appended counts the leading batches whose Append returned nil.
	appended int
	// state is where the name's life stood when the crash came.
	state mgrLogState
}

type mgrLogState int

const (
	mgrCreating mgrLogState = iota // Create called, not returned
	mgrLive                        // Create returned nil
	mgrDeleting                    // Delete called, not returned
	mgrDeleted                     // Delete returned nil
)

// mgrCrashWorkload writes to several logs under one Manager: it creates
// them, appends to each in turn (syncing some after every few appends),
// closes and reopens the Manager, deletes one log and creates it again,
// and goes on appending; it stops at the first error (the power loss).
type mgrCrashWorkload struct {
	logs, rounds1, rounds2 int
}

func (w mgrCrashWorkload) name(i int) string { return fmt.Sprintf("t-%d", i) }

// run runs the workload on fsys and returns the model of every name.
func (w mgrCrashWorkload) run(t testing.TB, fsys vfs.FS) map[string]*mgrLogModel {
	t.Helper()
	model := map[string]*mgrLogModel{}
	seq := 0
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(fsys))
	if err != nil {
		return model
	}
	defer func() {
		if m != nil {
			_ = m.Close()
		}
	}()
	logs := make([]*Log, w.logs)
	for i := range logs {
		lm := &mgrLogModel{state: mgrCreating}
		model[w.name(i)] = lm
		if logs[i], err = m.Create(w.name(i)); err != nil {
			return model
		}
		lm.state = mgrLive
	}
	appendRounds := func(rounds int) bool {
		for r := 0; r < rounds; r++ {
			for i, l := range logs {
				lm := model[w.name(i)]
				b := testBatch(t, seq%len(batchTemplates))
				seq++
				lm.attempted = append(lm.attempted, b)
				if _, err := l.Append(b); err != nil {
					return false
				}
				lm.appended++
				if (r+i)%3 == 2 {
					n := lm.appended
					if err := l.Sync(); err != nil {
						return false
					}
					lm.acked = n
				}
			}
		}
		return true
	}
	if !appendRounds(w.rounds1) {
		return model
	}
	err = m.Close()
	if err != nil {
		return model
	}
	for _, lm := range model {
		lm.acked = lm.appended
	}
	if m, err = OpenManager(mgrCrashDir, mgrCrashOptions(fsys)); err != nil {
		return model
	}
	for i := range logs {
		var ok bool
		if logs[i], ok = m.Get(w.name(i)); !ok {
			t.Fatalf("log %s missing after a clean reopen", w.name(i))
		}
	}
	// Delete log 1 and create it again: the new log must never show the
	// old one's data (or trust its recovery point).
	del := model[w.name(1)]
	del.state = mgrDeleting
	if err := m.Delete(w.name(1)); err != nil {
		return model
	}
	model[w.name(1)] = &mgrLogModel{state: mgrCreating}
	if logs[1], err = m.Create(w.name(1)); err != nil {
		return model
	}
	model[w.name(1)].state = mgrLive
	if !appendRounds(w.rounds2) {
		return model
	}
	if err := m.Close(); err == nil {
		for _, lm := range model {
			lm.acked = lm.appended
		}
	}
	return model
}

// mgrState reads every log of m (checking A2 and A3).
func mgrState(t testing.TB, m *Manager, desc string) map[string]logState {
	t.Helper()
	out := map[string]logState{}
	for _, name := range m.Names() {
		l, _ := m.Get(name)
		st, err := tryReadState(l)
		require.NoError(t, err, "log %s %s", name, desc)
		out[name] = st
	}
	return out
}

// checkMgrModel checks A1 for every log against the model: a live log is
// there with its acknowledged batches; every batch found is one the
// workload appended to that incarnation at that offset; a log whose
// creation or deletion the crash interrupted may be missing.
func checkMgrModel(t testing.TB, states map[string]logState, model map[string]*mgrLogModel, desc string) {
	t.Helper()
	for name := range states {
		require.Contains(t, model, name, "unknown log %s %s", name, desc)
	}
	for name, lm := range model {
		st, ok := states[name]
		if !ok {
			require.NotEqual(t, mgrLive, lm.state, "A1: log %s lost %s", name, desc)
			continue
		}
		byBase := map[int64][]byte{}
		for _, b := range lm.attempted {
			// The first wins: a failed last attempt may not have been
			// stamped and still carry base offset 0.
			if _, ok := byBase[Batch(b).BaseOffset()]; !ok {
				byBase[Batch(b).BaseOffset()] = b
			}
		}
		for _, b := range st.batches {
			if want, ok := byBase[Batch(b).BaseOffset()]; !ok || !bytes.Equal(want, b) {
				require.Failf(t, "a batch the workload did not append there", "log %s offset %d %s", name, Batch(b).BaseOffset(), desc)
			}
		}
		checkAcked(t, st, lm.attempted[:lm.acked])
	}
}

// checkMgrA4A5 closes m and checks A4 (reopening gives the same logs in
// the same state) and A5 (each log's next append gets its log end offset
// and reads back after Sync).
func checkMgrA4A5(t testing.TB, m *Manager, fsys vfs.FS, states map[string]logState, desc string) {
	t.Helper()
	require.NoError(t, m.Close(), "closing the recovered Manager %s", desc)
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(fsys))
	require.NoError(t, err, "A4: reopening %s", desc)
	defer m.Close()
	again := mgrState(t, m, desc)
	require.Len(t, again, len(states), "A4: logs differ %s", desc)
	for name, st := range states {
		requireSameState(t, st, again[name], "in log "+name+" "+desc)
		l, _ := m.Get(name)
		b := testBatch(t, int(st.end)%len(batchTemplates))
		info, err := l.Append(b)
		require.NoError(t, err, "A5: append to %s %s", name, desc)
		require.Equal(t, st.end, info.FirstOffset, "A5: log %s %s", name, desc)
		require.NoError(t, l.Sync())
		got, err := l.Read(nil, st.end, ReadOptions{})
		require.NoError(t, err)
		require.Equal(t, b, got, "A5: log %s %s", name, desc)
	}
	require.NoError(t, m.Close())
}

// TestManagerCrash is S1 for a Manager: a power loss at about 50
// points spread over a workload writing to 6 logs (rolls, Syncs, a clean
// Close and reopen, a Delete and Create), alternately in the strict model
// (only synced data and directory entries survive) and a partial one
// (seeded parts of the unsynced changes survive too). After each, the
// Manager reopened on the image must show every log satisfying A1-A5, and
// recovery must leave a durable state (a second power loss right after
// OpenManager changes nothing).
func TestManagerCrash(t *testing.T) {
	requireNoGoroutineLeak(t)
	w := mgrCrashWorkload{logs: 6, rounds1: 9, rounds2: 9}
	efs := vfs.NewErrorFS(vfs.NewMem(), nil)
	model := w.run(t, efs)
	total := efs.Ops()
	for name, lm := range model {
		require.Equal(t, mgrLive, lm.state, name)
		require.Equal(t, len(lm.attempted), lm.acked, "the workload without crash acknowledges everything (%s)", name)
	}
	points := 50
	if testing.Short() {
		points = 20
	}
	step := max(1, total/int64(points))
	t.Logf("workload: %d filesystem operations, a crash every %d, seed %d", total, step, *crashSeed)
	crashes := 0
	for n, i := int64(0), 0; ; n, i = n+step, i+1 {
		mem := vfs.NewMem()
		seed := *crashSeed*1_000_003 + n
		opts := vfs.CrashOptions{}
		if i%2 == 1 {
			opts = vfs.CrashOptions{Seed: seed, KeepUnsynced: 0.6, ZeroSectors: 0.05, KeepDirOps: 0.5}
		}
		crash := &vfs.Crash{N: n, Mem: mem, Opts: opts}
		model := w.run(t, vfs.NewErrorFS(mem, crash))
		img := crash.Clone()
		if img == nil {
			break
		}
		crashes++
		desc := fmt.Sprintf("(crash before op %d, partial %v, seed %d)", n, i%2 == 1, seed)
		m, err := OpenManager(mgrCrashDir, mgrCrashOptions(img))
		require.NoError(t, err, "open after the crash %s", desc)
		states := mgrState(t, m, desc)
		checkMgrModel(t, states, model, desc)
		if i%3 == 0 {
			m2, err := OpenManager(mgrCrashDir, mgrCrashOptions(img.CrashClone(vfs.CrashOptions{})))
			require.NoError(t, err, "open after a crash right after recovery %s", desc)
			again := mgrState(t, m2, desc)
			require.Len(t, again, len(states), desc)
			for name, st := range states {
				requireSameState(t, st, again[name], "after a crash right after recovery, log "+name+" "+desc)
			}
			require.NoError(t, m2.Close())
		}
		checkMgrA4A5(t, m, img, states, desc)
	}
	require.GreaterOrEqual(t, int64(crashes)*step, total*9/10, "crash points cover the workload")
}

// TestManagerCheckpointFile checks the Manager's checkpoint format: a
// round trip, and every malformed file rejected as ErrCorrupt.
func TestManagerCheckpointFile(t *testing.T) {
	in := map[string]int64{"orders-0": 0, "orders-1": 1234567890123, "a.b_c-9": 42}
	out, err := decodeNamedCheckpoint(encodeNamedCheckpoint(in))
	require.NoError(t, err)
	require.Equal(t, in, out)
	empty, err := decodeNamedCheckpoint(encodeNamedCheckpoint(nil))
	require.NoError(t, err)
	require.Empty(t, empty)
	// 70,000 logs with 250-byte names take 18 MB, which the reader used to
	// refuse (16 MiB) although the writer wrote it.
	many := make(map[string]int64, 70000)
	prefix := strings.Repeat("t", 240)
	for i := range 70000 {
		many[fmt.Sprintf("%s-%09d", prefix, i)] = int64(i)
	}
	data := encodeNamedCheckpoint(many)
	require.Greater(t, len(data), 16<<20)
	out, err = decodeNamedCheckpoint(data)
	require.NoError(t, err)
	require.Equal(t, many, out)

	for _, bad := range []string{
		"",
		"0\n1\norders-0 5",                      // no final newline
		"1\n1\norders-0 5\n",                    // version
		"0\n2\norders-0 5\n",                    // count
		"0\nx\n",                                // count
		"0\n1\norders-0\n",                      // no offset
		"0\n1\norders-0 -1\n",                   // negative
		"0\n1\norders-0 1x\n",                   // not a number
		"0\n1\n../etc 5\n",                      // not a log name
		"0\n1\n 5\n",                            // empty name
		"0\n1\norders-0  5\n",                   // two spaces
		"0\n2\na 1\n\n",                         // empty line
		"0\n1\norders-0 5 6\n",                  // extra field
		"0\n1\norders-0 99999999999999999999\n", // overflow
	} {
		_, err := decodeNamedCheckpoint([]byte(bad))
		require.ErrorIs(t, err, ErrCorrupt, "%q", bad)
	}
}

// mgrWriteAll appends batches to logs named log-0.. of a fresh Manager on
// mem and syncs them; it returns the Manager (open) and what each log
// holds.
func mgrWriteAll(t *testing.T, fsys vfs.FS, logs, batches int) (*Manager, map[string][][]byte) {
	t.Helper()
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(fsys))
	require.NoError(t, err)
	want := map[string][][]byte{}
	for i := 0; i < logs; i++ {
		name := fmt.Sprintf("log-%d", i)
		l, err := m.Create(name)
		require.NoError(t, err)
		for k := 0; k < batches; k++ {
			b := testBatch(t, i*batches+k)
			_, err := l.Append(b)
			require.NoError(t, err)
			want[name] = append(want[name], b)
		}
		require.NoError(t, l.Sync())
	}
	return m, want
}

// requireMgrHolds checks that m holds exactly the logs of want with
// their batches.
func requireMgrHolds(t *testing.T, m *Manager, want map[string][][]byte) {
	t.Helper()
	require.Len(t, m.Names(), len(want))
	for name, batches := range want {
		l, ok := m.Get(name)
		require.True(t, ok, name)
		st := readState(t, l)
		require.Len(t, st.batches, len(batches), name)
		for k := range batches {
			require.Equal(t, batches[k], st.batches[k], "log %s batch %d", name, k)
		}
	}
}

// TestManagerCheckpointRoundTrip: Close writes the recovery points, high
// watermarks and clean-shutdown markers of every log in the data
// directory's files; a clean reopen trusts them (no log recovered, high
// watermarks back); after a crash (no markers) every log is recovered
// from its recovery point on only.
func TestManagerCheckpointRoundTrip(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	m, want := mgrWriteAll(t, mem, 5, 12)
	for i, name := range m.Names() {
		l, _ := m.Get(name)
		l.SetHighWatermark(int64(i + 3))
	}
	require.NoError(t, m.Close())

	rps, _, err := readNamed(mem, managerCheckpointFile)
	require.NoError(t, err)
	hws, _, err := readNamed(mem, managerHighWatermarkFile)
	require.NoError(t, err)
	clean, ok, err := readNamed(mem, managerCleanShutdownFile)
	require.NoError(t, err)
	require.True(t, ok, "no clean-shutdown file after Close")
	for i, name := range sortedKeys(want) {
		end := Batch(want[name][len(want[name])-1]).NextOffset()
		require.Equal(t, end, rps[name], "recovery point of %s", name)
		require.Equal(t, end, clean[name], "clean-shutdown marker of %s", name)
		require.Equal(t, int64(i+3), hws[name], "high watermark of %s", name)
	}

	m, err = OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.NoError(t, err)
	requireMgrHolds(t, m, want)
	segments := 0
	for i, name := range m.Names() {
		l, _ := m.Get(name)
		require.Zero(t, l.Stats().RecoveredSegments, "log %s recovered after a clean close", name)
		require.Equal(t, int64(i+3), l.HighWatermark(), "high watermark of %s", name)
		segments += len(l.segments())
	}
	require.Greater(t, segments, 2*len(want), "the logs must have rolled")
	_, ok, err = readNamed(mem, managerCleanShutdownFile)
	require.NoError(t, err)
	require.False(t, ok, "the clean-shutdown file survives OpenManager")

	// A power loss now: no marker, every log recovers, from its recovery
	// point (its active segment) only.
	img := mem.CrashClone(vfs.CrashOptions{})
	require.NoError(t, m.Close())
	m, err = OpenManager(mgrCrashDir, mgrCrashOptions(img))
	require.NoError(t, err)
	defer m.Close()
	requireMgrHolds(t, m, want)
	for _, name := range m.Names() {
		l, _ := m.Get(name)
		require.Equal(t, 1, l.Stats().RecoveredSegments, "log %s not recovered from its recovery point", name)
	}
	require.NoError(t, m.Close())
}

// TestManagerCorruptCheckpointsIgnored: unreadable checkpoint files are
// ignored, and then every log is recovered from its first segment, with
// all its data.
func TestManagerCorruptCheckpointsIgnored(t *testing.T) {
	requireNoGoroutineLeak(t)
	for _, file := range []string{managerCheckpointFile, managerCleanShutdownFile, managerHighWatermarkFile} {
		t.Run(file, func(t *testing.T) {
			mem := vfs.NewMem()
			m, want := mgrWriteAll(t, mem, 4, 12)
			var img *vfs.MemFS
			if file == managerCleanShutdownFile {
				require.NoError(t, m.Close())
				img = mem
			} else {
				// Unclean: the crash image of the synced logs.
				img = mem.CrashClone(vfs.CrashOptions{})
				require.NoError(t, m.Close())
			}
			path := filepath.Join(mgrCrashDir, file)
			for _, garbage := range []string{"0\n3\nlog-0 5\n", "\x00\x01garbage", "0\n1\nlog-0 -7\n"} {
				f, err := img.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
				require.NoError(t, err)
				_, err = f.WriteAt([]byte(garbage), 0)
				require.NoError(t, err)
				require.NoError(t, f.Close())
				fsys := img.CrashClone(vfs.CrashOptions{KeepUnsynced: 1, KeepDirOps: 1})

				m, err := OpenManager(mgrCrashDir, mgrCrashOptions(fsys))
				require.NoError(t, err, "%q", garbage)
				requireMgrHolds(t, m, want)
				for _, name := range m.Names() {
					l, _ := m.Get(name)
					require.Greater(t, len(l.segments()), 1)
					switch file {
					case managerCheckpointFile: // no recovery point: from the start
						require.Equal(t, len(l.segments()), l.Stats().RecoveredSegments, "log %s not recovered from its start", name)
					case managerCleanShutdownFile: // no marker: from the recovery point
						require.Positive(t, l.Stats().RecoveredSegments, "log %s not recovered", name)
					case managerHighWatermarkFile:
						require.Zero(t, l.HighWatermark(), "log %s", name)
					}
				}
				require.NoError(t, m.Close())
			}
		})
	}
}

func readNamed(fsys vfs.FS, name string) (map[string]int64, bool, error) {
	data, err := readWholeFile(fsys, filepath.Join(mgrCrashDir, name))
	if err != nil || data == nil {
		return nil, false, err
	}
	offsets, err := decodeNamedCheckpoint(data)
	return offsets, true, err
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestManagerReadWhileEvicting reads many logs with Readers and Read
// while they are appended to, roll, and the file cache (4 files for 12
// logs) keeps closing and reopening their segment files, on real files:
// every reader sees exactly the appended batches, in order, and the
// process never holds more segment descriptors than the cap. Run with
// -race.
func TestManagerReadWhileEvicting(t *testing.T) {
	requireNoGoroutineLeak(t)
	const (
		logs    = 12
		batches = 40
		maxOpen = 4
	)
	fds0, _ := openFDs(t)
	m, err := OpenManager(t.TempDir(), ManagerOptions{
		Log:          Options{FS: noSyncFS{vfs.Default}, SegmentBytes: 2 << 10, IndexIntervalBytes: 256},
		MaxOpenFiles: maxOpen,
	})
	require.NoError(t, err)
	defer m.Close()
	all := make([]*Log, logs)
	want := make([][][]byte, logs) // stamped, per log
	for i := range all {
		all[i], err = m.Create(fmt.Sprintf("r-%d", i))
		require.NoError(t, err)
		off := int64(0)
		for k := 0; k < batches; k++ {
			b := testBatch(t, i*batches+k)
			Batch(b).setBaseOffset(off)
			off = Batch(b).NextOffset()
			want[i] = append(want[i], b)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3*logs)
	fail := func(err error) {
		errs <- err
		cancel() // no reader waits forever for an append that failed
	}
	var wg sync.WaitGroup
	for i, l := range all {
		wg.Add(3)
		go func() { // appender
			defer wg.Done()
			for k := 0; k < batches; k++ {
				if _, err := l.Append(testBatch(t, i*batches+k)); err != nil {
					fail(err)
					return
				}
			}
		}()
		go func() { // tailing Reader
			defer wg.Done()
			r := l.NewReader(0, ReaderOptions{BufferBytes: 512})
			for k := 0; k < batches; k++ {
				b, err := r.Next(ctx)
				if err != nil {
					fail(fmt.Errorf("reader of log %d, batch %d: %w", i, k, err))
					return
				}
				if !bytes.Equal(b, want[i][k]) {
					fail(fmt.Errorf("reader of log %d: batch %d differs", i, k))
					return
				}
			}
		}()
		go func() { // Read at the start of every batch, once it is there
			defer wg.Done()
			for k := 0; k < batches; k++ {
				off := Batch(want[i][k]).BaseOffset()
				if err := l.WaitForData(ctx, off, false); err != nil {
					fail(err)
					return
				}
				got, err := l.Read(nil, off, ReadOptions{MaxBytes: 1})
				if err != nil {
					fail(fmt.Errorf("Read of log %d at %d: %w", i, off, err))
					return
				}
				if b, _, err := SplitBatch(got); err != nil || !bytes.Equal(b, want[i][k]) {
					fail(fmt.Errorf("Read of log %d at %d: wrong batch (%v)", i, off, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := m.Stats()
	require.LessOrEqual(t, st.OpenFiles, maxOpen)
	require.Greater(t, st.FileOpens, int64(2*logs), "the files were not evicted and reopened")
	// Evicted files with unsynced writes close once fsynced in the
	// background (at most maxBackgroundCloses in flight).
	requireFDsWithin(t, fds0, maxOpen+4+maxBackgroundCloses, "after the readers")
	for i, l := range all {
		require.Greater(t, len(l.segments()), 2, "log %d must have rolled", i)
	}
	require.NoError(t, m.Close())
}

// TestManagerBackgroundWork: a Manager's logs get their interval syncs
// and retention from the shared workers (no goroutine per log).
func TestManagerBackgroundWork(t *testing.T) {
	requireNoGoroutineLeak(t)
	const logs = 30
	opts := ManagerOptions{
		Log: Options{
			FS:                     vfs.NewMem(),
			SegmentBytes:           1 << 10,
			SyncInterval:           5 * time.Millisecond,
			RetentionBytes:         2 << 10,
			RetentionCheckInterval: 5 * time.Millisecond,
			FileDeleteDelay:        time.Millisecond,
		},
		Workers: 2,
	}
	g0 := runtime.NumGoroutine()
	m, err := OpenManager(mgrCrashDir, opts)
	require.NoError(t, err)
	defer m.Close()
	all := make([]*Log, logs)
	for i := range all {
		all[i], err = m.Create(fmt.Sprintf("bg-%d", i))
		require.NoError(t, err)
		for k := 0; k < 30; k++ {
			_, err := all[i].Append(testBatch(t, k))
			require.NoError(t, err)
		}
	}
	require.LessOrEqual(t, runtime.NumGoroutine()-g0, opts.Workers+2, "goroutines per log")
	// Wait (no deadline: the test's timeout is the limit) for the
	// workers: every log synced in the background up to its end (nobody
	// calls Sync, and the active segment is never flushed by a roll), and
	// its oldest segments deleted by retention down to RetentionBytes plus
	// at most one segment.
	for _, l := range all {
		for l.DurableOffset() < l.LogEndOffset() || l.LogStartOffset() == 0 ||
			l.Stats().Bytes > opts.Log.RetentionBytes+opts.Log.SegmentBytes {
			time.Sleep(time.Millisecond)
		}
	}
	require.NoError(t, m.Close())
}

// TestManagerConcurrentCreate: Creates, Gets and Deletes from many
// goroutines; each name is created once.
func TestManagerConcurrentCreate(t *testing.T) {
	requireNoGoroutineLeak(t)
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: vfs.NewMem()}})
	require.NoError(t, err)
	defer m.Close()
	const goroutines, names = 8, 20
	var wg sync.WaitGroup
	created := make([]int, names)
	var mu sync.Mutex
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < names; i++ {
				name := fmt.Sprintf("c-%d", i)
				l, err := m.Create(name)
				switch {
				case err == nil:
					mu.Lock()
					created[i]++
					mu.Unlock()
					if _, err := l.Append(testBatch(t, i)); err != nil {
						t.Error(err)
					}
				case !errors.Is(err, ErrLogExists):
					t.Error(err)
				}
				_, _ = m.Get(name)
				_ = m.Stats()
			}
		}()
	}
	wg.Wait()
	for i, n := range created {
		require.Equal(t, 1, n, "log c-%d created %d times", i, n)
	}
	require.Len(t, m.Names(), names)
	for _, name := range m.Names() {
		l, _ := m.Get(name)
		require.Len(t, readState(t, l).batches, 1, name)
	}
	require.NoError(t, m.Close())
}

// openHookFS calls beforeOpen (if set) before each OpenFile.
type openHookFS struct {
	vfs.FS
	beforeOpen func(name string)
}

func (h *openHookFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if h.beforeOpen != nil {
		h.beforeOpen(name)
	}
	return h.FS.OpenFile(name, flag, perm)
}

// TestFileCacheKeepsUnsyncedFilesOpen: the cache closes idle files
// written since their last fsync only when no synced idle file is left
// (a closed descriptor can lose a failed writeback's error), and the cap
// still holds when every idle file is unsynced.
func TestFileCacheKeepsUnsyncedFilesOpen(t *testing.T) {
	c := newFileCache(vfs.NewMem(), 2)
	open := func(name string) *cachedFile {
		cf, err := c.openFile(name, os.O_RDWR|os.O_CREATE, 0o644)
		require.NoError(t, err)
		return cf
	}
	isOpen := func(cf *cachedFile) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return cf.f != nil
	}
	a, b := open("/a"), open("/b")
	_, err := a.WriteAt([]byte("unsynced"), 0)
	require.NoError(t, err)
	_, err = b.WriteAt([]byte("synced"), 0)
	require.NoError(t, err)
	require.NoError(t, b.Datasync())
	open("/c") // /a is the least recently used, but unsynced
	require.True(t, isOpen(a), "the unsynced file was closed")
	require.False(t, isOpen(b))
	require.Equal(t, 2, c.openFiles())

	require.NoError(t, a.Sync())
	d := open("/d")
	_, err = d.WriteAt([]byte("unsynced"), 0)
	require.NoError(t, err)
	open("/e") // the idle files: /a and /c synced, /d not
	require.True(t, isOpen(d))
	require.Equal(t, 2, c.openFiles())

	cap1 := newFileCache(vfs.NewMem(), 1)
	for _, name := range []string{"/x", "/y", "/z"} {
		cf, err := cap1.openFile(name, os.O_RDWR|os.O_CREATE, 0o644)
		require.NoError(t, err)
		_, err = cf.WriteAt([]byte("unsynced"), 0)
		require.NoError(t, err)
	}
	require.Equal(t, 1, cap1.openFiles(), "unsynced files still count toward the cap")
}

// TestFileCacheReopenAfterRename: a segment file closed by the cache is
// renamed (a deleted segment becomes *.deleted) between the moment a
// reader's reopen takes its name and the open itself; the reopen finds
// the file under its new name instead of failing. With a newcomer,
// another file is also created under the old name before the open (after
// a truncation, a new segment at the same base offset): the reopen must
// not take it.
func TestFileCacheReopenAfterRename(t *testing.T) {
	for _, newcomer := range []bool{false, true} {
		t.Run(fmt.Sprintf("newcomer=%v", newcomer), func(t *testing.T) {
			mem := vfs.NewMem()
			hook := &openHookFS{FS: mem}
			c := newFileCache(hook, 1)
			cf, err := c.openFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
			require.NoError(t, err)
			_, err = cf.WriteAt([]byte("segment data"), 0)
			require.NoError(t, err)
			require.NoError(t, cf.Sync()) // else the cache keeps it open
			other, err := c.openFile("/b", os.O_RDWR|os.O_CREATE, 0o644)
			require.NoError(t, err)
			require.Equal(t, 1, c.openFiles(), "the cap of one file evicts /a")

			renamed := false
			hook.beforeOpen = func(name string) {
				if name != "/a" || renamed {
					return
				}
				renamed = true
				require.NoError(t, cf.renameFile(mem, "/a"+deletedSuffix))
				if newcomer {
					f, err := mem.OpenFile("/a", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
					require.NoError(t, err)
					_, err = f.WriteAt([]byte("a newcomer!!"), 0)
					require.NoError(t, err)
					require.NoError(t, f.Close())
				}
			}
			buf := make([]byte, 12)
			n, err := cf.ReadAt(buf, 0)
			require.NoError(t, err)
			require.True(t, renamed, "the rename did not happen during the reopen")
			require.Equal(t, "segment data", string(buf[:n]))
			require.Equal(t, "/a"+deletedSuffix, cf.Name())
			require.LessOrEqual(t, c.openFiles(), 1)
			require.NoError(t, cf.Close())
			require.NoError(t, other.Close())
			require.Zero(t, c.openFiles())
		})
	}
}

// settledGoroutines returns the goroutines above base, waiting up to ten
// seconds for goroutines that are exiting to be gone when the count is
// above limit (under -race with other packages' tests running, exiting
// goroutines took more than two seconds once).
func settledGoroutines(base, limit int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine() - base
		if n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(time.Millisecond)
	}
}

// TestManagerRegionOfASegmentDeletedTwice: a follower truncates a segment
// away, the log rolls at the same base offset again, and that segment is
// truncated away too, within FileDeleteDelay. The two deleted segments'
// files keep names of their own, so a Region of the first still reads its
// own bytes when the Manager's file cache reopens its file by name.
func TestManagerRegionOfASegmentDeletedTwice(t *testing.T) {
	bb := NewBatchBuilder()
	one := seqBatch(t, bb, 0, 1, 8)
	dir := t.TempDir()
	m, err := OpenManager(dir, ManagerOptions{
		Log:          Options{SegmentBytes: int64(len(one))}, // a batch per segment
		MaxOpenFiles: 1,
	})
	require.NoError(t, err)
	defer m.Close()
	l, err := m.Create("a")
	require.NoError(t, err)
	appendSeqBatches(t, l, bb, 0, 3) // segments 0, 1, 2
	require.Len(t, l.segments(), 3)
	reg, err := l.ReadRegion(2, ReadOptions{})
	require.NoError(t, err)
	want := make([]byte, reg.Length)
	_, err = reg.File.ReadAt(want, reg.Position)
	require.NoError(t, err)

	require.NoError(t, l.TruncateTo(1)) // deletes segment 2
	appendSeqBatches(t, l, bb, 1000, 2) // a new segment 2, other bytes
	require.Len(t, l.segments(), 3)
	require.NoError(t, l.TruncateTo(1))    // deletes the new segment 2
	_, err = l.Read(nil, 0, ReadOptions{}) // the cache closes the old file
	require.NoError(t, err)

	got := make([]byte, reg.Length)
	_, err = reg.File.ReadAt(got, reg.Position)
	require.NoError(t, err)
	require.Equal(t, want, got, "the Region reads the batches it was returned for")
	deleted, err := filepath.Glob(filepath.Join(dir, "a", segmentName(2)+logSuffix+"*"+deletedSuffix))
	require.NoError(t, err)
	require.Len(t, deleted, 2, "both deleted data files wait for FileDeleteDelay: %v", deleted)
}

// TestManagerSchedulerDoesNotPileWorkersOnOneLog: a log kicked while a
// worker steps it (a roll during its slow roll flush) is stepped again by
// that worker afterwards, not by a second worker, which would only wait
// for the first and leave other logs' flushes to the remaining workers
// (here: none).
func TestManagerSchedulerDoesNotPileWorkersOnOneLog(t *testing.T) {
	requireNoGoroutineLeak(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	fs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && strings.Contains(op.Path, "/slow/") && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: fs, SegmentBytes: 1 << 10}, Workers: 2})
	require.NoError(t, err)
	defer m.Close()
	slow, err := m.Create("slow")
	require.NoError(t, err)
	fast, err := m.Create("fast")
	require.NoError(t, err)
	rollOnce := func(l *Log) {
		for n := len(l.segments()); len(l.segments()) == n; {
			_, err := l.Append(testBatch(t, 1))
			require.NoError(t, err)
		}
	}
	armed.Store(true)
	rollOnce(slow)
	<-entered // a worker is stuck in slow's roll flush
	rollOnce(slow)
	rollOnce(slow) // kicks while it is being stepped
	rollOnce(fast)
	defer close(release)
	require.Eventually(t, func() bool { return fast.RecoveryPoint() >= fast.active().base }, 5*time.Second, time.Millisecond,
		"the other worker must flush fast's roll while slow's flush is stuck")
}
