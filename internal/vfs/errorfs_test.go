package vfs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// workload touches every kind of operation once or more and returns the
// first error; it closes what it opened whatever happens.
func workload(fsys vfs.FS) (err error) {
	dir := p("w")
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := fsys.SyncDir(root); err != nil {
		return err
	}
	f, err := fsys.OpenFile(filepath.Join(dir, "seg"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	for i := range 3 {
		if _, err := f.WriteAt([]byte("record"), int64(6*i)); err != nil {
			return err
		}
	}
	if err := vfs.Preallocate(f, 64); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	buf := make([]byte, 6)
	if _, err := f.ReadAt(buf, 6); err != nil {
		return err
	}
	if string(buf) != "record" {
		return fmt.Errorf("read %q", buf)
	}
	if err := f.Truncate(12); err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != 12 {
		return fmt.Errorf("size %d", fi.Size())
	}
	if err := atomicReplace(fsys, filepath.Join(dir, "ckpt"), "checkpoint"); err != nil {
		return err
	}
	if _, err := fsys.Stat(filepath.Join(dir, "ckpt")); err != nil {
		return err
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(names) != 2 {
		return fmt.Errorf("entries %v", names)
	}
	if err := fsys.Remove(filepath.Join(dir, "ckpt")); err != nil {
		return err
	}
	return fsys.RemoveAll(filepath.Join(dir, "nothing"))
}

func TestErrorFSCountsAndReset(t *testing.T) {
	efs := vfs.NewErrorFS(newMemDir(t), nil)
	require.NoError(t, workload(efs))
	n := efs.Ops()
	assert.Greater(t, n, int64(20))
	efs.Reset()
	assert.Equal(t, int64(0), efs.Ops())
	require.NoError(t, efs.RemoveAll(root))
	assert.Equal(t, int64(1), efs.Ops())

	// The same workload always takes the same number of operations.
	efs2 := vfs.NewErrorFS(newMemDir(t), nil)
	require.NoError(t, workload(efs2))
	assert.Equal(t, n, efs2.Ops())
}

func TestErrorFSEveryOperation(t *testing.T) {
	for _, sticky := range []bool{false, true} {
		t.Run(fmt.Sprintf("sticky=%v", sticky), func(t *testing.T) {
			for n := int64(0); ; n++ {
				require.Less(t, n, int64(1000), "the workload never passed")
				inj := &vfs.FailAt{N: n, Err: syscall.EIO, Sticky: sticky}
				efs := vfs.NewErrorFS(newMemDir(t), inj)
				err := workload(efs)
				if inj.Injected() == 0 {
					require.NoError(t, err, "n=%d", n)
					assert.Equal(t, n, efs.Ops(), "passes exactly when n reaches the op count")
					break
				}
				require.Error(t, err, "n=%d", n)
				assert.ErrorIs(t, err, vfs.ErrInjected, "n=%d", n)
				assert.ErrorIs(t, err, syscall.EIO, "n=%d", n)
				if !sticky {
					assert.Equal(t, int64(1), inj.Injected())
				}
			}
		})
	}
}

func TestErrorFSKinds(t *testing.T) {
	inj := &vfs.FailAt{Kinds: vfs.OpSyncs, Err: syscall.EIO, Sticky: true}
	m := newMemDir(t)
	efs := vfs.NewErrorFS(m, inj)
	f, err := efs.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("abc"), 0)
	require.NoError(t, err)
	err = f.Sync()
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorIs(t, err, vfs.ErrInjected)
	require.ErrorIs(t, f.Sync(), syscall.EIO, "sticky")
	require.ErrorIs(t, efs.SyncDir(root), syscall.EIO)
	_, err = f.WriteAt([]byte("d"), 3)
	require.NoError(t, err, "writes still work")
	assert.Equal(t, int64(3), inj.Injected())
	require.NoError(t, f.Close())

	// The failed syncs did not run.
	assertMissing(t, m.CrashClone(vfs.CrashOptions{}), p("f"))

	// A later op of a kind: the first sync at or after op 2.
	inj = &vfs.FailAt{N: 2, Kinds: vfs.OpSync}
	efs = vfs.NewErrorFS(newMemDir(t), inj)
	f, err = efs.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644) // op 0
	require.NoError(t, err)
	require.NoError(t, f.Sync()) // op 1
	_, err = f.WriteAt([]byte("x"), 0)
	require.NoError(t, err)                       // op 2
	require.ErrorIs(t, f.Sync(), vfs.ErrInjected) // op 3
	require.NoError(t, f.Sync())                  // not sticky
	require.NoError(t, f.Close())
}

func TestErrorFSPreallocate(t *testing.T) {
	// Preallocate is an operation of its own, counted and failed like
	// the others.
	var ops []vfs.Op
	var mu sync.Mutex
	record := vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		mu.Lock()
		defer mu.Unlock()
		ops = append(ops, op)
		return vfs.Fault{}
	})
	inner := vfs.NewErrorFS(newMemDir(t), record)
	inj := &vfs.FailAt{Kinds: vfs.OpPreallocate, Err: syscall.ENOSPC}
	efs := vfs.NewErrorFS(inner, inj)
	f, err := efs.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	err = vfs.Preallocate(f, 4096)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorIs(t, err, vfs.ErrInjected)
	var pe *os.PathError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "preallocate", pe.Op)
	assert.Equal(t, p("f"), pe.Path)
	assert.Contains(t, err.Error(), "op 1 preallocate")
	assert.Equal(t, int64(2), efs.Ops(), "open and the preallocate")
	assert.Equal(t, int64(1), inner.Ops(), "the failed preallocate did not reach the inner file")

	// Without a fault it is forwarded to the inner file: here another
	// ErrorFS's file, which counts it too.
	require.NoError(t, vfs.Preallocate(f, 8192))
	assert.Equal(t, int64(3), efs.Ops())
	mu.Lock()
	require.Len(t, ops, 2)
	assert.Equal(t, vfs.Op{Index: 1, Kind: vfs.OpPreallocate, Path: p("f"), Off: 8192}, ops[1])
	mu.Unlock()
	fi, err := f.Stat()
	require.NoError(t, err)
	assert.Zero(t, fi.Size(), "the size is kept")
	require.NoError(t, f.Close())

	assert.NotZero(t, vfs.OpMutations&vfs.OpPreallocate)
}

func TestErrorFSShortWriteAndSpaceReturns(t *testing.T) {
	m := newMemDir(t)
	inj := &vfs.FailAt{Kinds: vfs.OpWrite, Err: syscall.ENOSPC, Sticky: true, ShortWrite: 3}
	efs := vfs.NewErrorFS(m, inj)
	f, err := efs.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	n, err := f.WriteAt([]byte("abcdef"), 0)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorIs(t, err, vfs.ErrInjected)
	assert.Equal(t, 3, n)
	assert.Equal(t, "abc", readFile(t, m, p("f")), "the prefix was written")
	n, err = f.WriteAt([]byte("x"), 3)
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.Equal(t, 1, n, "ShortWrite is clamped to len(p)")

	efs.SetEnabled(false)
	n, err = f.WriteAt([]byte("defg"), 3)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, "abcdefg", readFile(t, efs, p("f")))
	efs.SetEnabled(true)
	_, err = f.WriteAt([]byte("h"), 7)
	require.ErrorIs(t, err, syscall.ENOSPC)
	efs.SetInjector(nil)
	_, err = f.WriteAt([]byte("h"), 7)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

func TestErrorFSClose(t *testing.T) {
	m := newMemDir(t)
	efs := vfs.NewErrorFS(m, &vfs.FailAt{Kinds: vfs.OpClose})
	f, err := efs.OpenFile(p("f"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	assert.Equal(t, p("f"), f.Name())
	require.ErrorIs(t, f.Close(), vfs.ErrInjected)
	// The inner file was closed anyway.
	require.ErrorIs(t, f.Close(), os.ErrClosed)
}

func TestErrorFSErrorShapes(t *testing.T) {
	efs := vfs.NewErrorFS(newMemDir(t), &vfs.FailAt{Sticky: true})
	err := efs.Rename(p("a"), p("b"))
	var le *os.LinkError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, vfs.ErrInjected)
	assert.Contains(t, err.Error(), "op 0 rename")
	err = efs.Remove(p("a"))
	var pe *os.PathError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, p("a"), pe.Path)
	assert.Contains(t, err.Error(), "op 1 remove")
}

func TestOpKindString(t *testing.T) {
	assert.Equal(t, "write", vfs.OpWrite.String())
	assert.Equal(t, "syncdir|sync", vfs.OpSyncs.String())
	assert.Equal(t, "OpKind(0x0)", vfs.OpKind(0).String())
	assert.Equal(t, "close|preallocate", (vfs.OpClose | vfs.OpPreallocate).String())
	assert.Equal(t, "preallocate|OpKind(0x8000)", (vfs.OpPreallocate<<1 | vfs.OpPreallocate).String())
}

func TestErrorFSOverRealFS(t *testing.T) {
	dir := t.TempDir()
	efs := vfs.NewErrorFS(vfs.Default, &vfs.FailAt{N: 3, Err: syscall.EIO})
	name := filepath.Join(dir, "f")
	f, err := efs.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644) // op 0
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("abc"), 0) // op 1
	require.NoError(t, err)
	require.NoError(t, f.Sync())                // op 2
	require.ErrorIs(t, f.Sync(), syscall.EIO)   // op 3
	require.NoError(t, vfs.Datasync(f))         // op 4: Sync on the wrapper
	require.NoError(t, efs.SyncDir(dir))        // op 5
	require.NoError(t, f.Close())               // op 6
	require.ErrorIs(t, f.Close(), os.ErrClosed) // op 7
	assert.Equal(t, int64(8), efs.Ops())
}

func TestCrashInjector(t *testing.T) {
	// Crash before every operation of a workload that replaces a
	// checkpoint several times; every acknowledged version must survive,
	// and the checkpoint is never partial.
	versions := []string{"version-1", "version-22", "version-333", "version-4444"}
	run := func(fsys vfs.FS) (acked int) {
		for i, v := range versions {
			if err := atomicReplace(fsys, p("ckpt"), v); err != nil {
				return i
			}
		}
		return len(versions)
	}
	total := func() int64 {
		efs := vfs.NewErrorFS(newMemDir(t), nil)
		require.Equal(t, len(versions), run(efs))
		return efs.Ops()
	}()

	for _, opts := range []vfs.CrashOptions{
		{},
		{Seed: 1, KeepUnsynced: 0.5, ZeroSectors: 0.5, KeepDirOps: 0.5},
		{Seed: 2, KeepUnsynced: 1, KeepDirOps: 1},
	} {
		for n := range total + 1 {
			m := newMemDir(t)
			crash := &vfs.Crash{N: n, Mem: m, Opts: opts}
			efs := vfs.NewErrorFS(m, crash)
			acked := run(efs)
			c := crash.Clone()
			if n == total {
				require.Nil(t, c, "no crash after the last operation")
				continue
			}
			require.NotNil(t, c)
			_, err := efs.Stat(root)
			require.ErrorIs(t, err, vfs.ErrCrashed, "everything fails after the crash")

			got, err := c.Stat(p("ckpt"))
			if acked == 0 && errors.Is(err, os.ErrNotExist) {
				continue
			}
			require.NoError(t, err, "n=%d acked=%d opts=%+v", n, acked, opts)
			data := readFile(t, c, p("ckpt"))
			idx := -1
			for i, v := range versions {
				if v == data {
					idx = i
				}
			}
			require.GreaterOrEqual(t, idx, 0, "n=%d: partial checkpoint %q", n, data)
			require.GreaterOrEqual(t, idx+1, acked, "n=%d: acknowledged version lost", n)
			assert.Equal(t, int64(len(data)), got.Size())
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	m := newMemDir(t)
	efs := vfs.NewErrorFS(m, &vfs.FailAt{N: 1 << 40})
	const writers, records = 4, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := p(fmt.Sprint("seg", w))
			f, err := efs.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
			if !assert.NoError(t, err) {
				return
			}
			defer f.Close()
			rec := []byte(fmt.Sprintf("%08d", w))
			for i := range records {
				_, err := f.WriteAt(rec, int64(i*len(rec)))
				assert.NoError(t, err)
				if i%10 == 0 {
					assert.NoError(t, f.Sync())
					assert.NoError(t, efs.SyncDir(root))
				}
			}
			assert.NoError(t, f.Sync())
		}()
	}
	// A reader and a crash-cloner run alongside.
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			names, err := efs.ReadDir(root)
			assert.NoError(t, err)
			for _, name := range names {
				f, err := efs.OpenFile(p(name), os.O_RDONLY, 0)
				if !assert.NoError(t, err) {
					continue
				}
				buf := make([]byte, 64)
				_, _ = f.ReadAt(buf, 0)
				_, err = f.Stat()
				assert.NoError(t, err)
				assert.NoError(t, f.Close())
			}
		}
	}()
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := m.CrashClone(vfs.CrashOptions{Seed: 7, KeepUnsynced: 0.5, ZeroSectors: 0.1, KeepDirOps: 0.5})
			_, err := c.ReadDir(root)
			assert.NoError(t, err)
		}
	}()
	wg.Wait()
	close(stop)
	bg.Wait()

	require.NoError(t, m.SyncDir(root))
	c := m.CrashClone(vfs.CrashOptions{})
	for w := range writers {
		data := readFile(t, c, p(fmt.Sprint("seg", w)))
		require.Len(t, data, records*8)
		assert.Equal(t, fmt.Sprintf("%08d", w), data[len(data)-8:])
	}
}

// TestErrorFSNamesOpenFilesByTheirCurrentName: after FS.Rename, operations
// on a file opened before it are reported under its new name, as the
// kernel names an open file (/proc/self/fd). The spare segment is opened
// as next-segment.log.tmp and renamed to a segment, then written and
// fsynced through the same handle: injectors that select segments by
// their ".log" suffix never failed those before.
func TestErrorFSNamesOpenFilesByTheirCurrentName(t *testing.T) {
	var mu sync.Mutex
	var ops []vfs.Op
	efs := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
		return vfs.Fault{}
	}))
	require.NoError(t, efs.MkdirAll("/d", 0o755))
	f, err := efs.OpenFile("/d/next-segment.log.tmp", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	require.NoError(t, efs.Rename("/d/next-segment.log.tmp", "/d/00000000000000000000.log"))
	_, err = f.WriteAt([]byte("batch"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())

	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, op := range ops {
		if op.Kind == vfs.OpWrite || op.Kind == vfs.OpSync {
			got = append(got, op.Kind.String()+" "+op.Path)
		}
	}
	require.Equal(t, []string{
		"write /d/00000000000000000000.log",
		"sync /d/00000000000000000000.log",
	}, got, "ops on an open file after its rename are reported under its old name")
	ops = nil
	mu.Unlock()

	// A rename of its directory renames it too.
	require.NoError(t, efs.Rename("/d", "/e"))
	require.NoError(t, f.Sync())
	require.Equal(t, "/d/next-segment.log.tmp", f.Name(), "Name keeps the opened name, as os.File.Name does")
	require.NoError(t, f.Close())
	mu.Lock()
	require.Len(t, ops, 3)
	require.Equal(t, "/e/00000000000000000000.log", ops[1].Path)
	require.Equal(t, "/e/00000000000000000000.log", ops[2].Path)
}
