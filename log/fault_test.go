package log

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// Fault tests (RELIABILITY.md S5, S6, S7): a workload runs while the
// filesystem fails one operation, or every write from some point on, and
// behaves like an application would: it keeps appending and syncing,
// reopens the log when it reports ErrSyncFailed, and tracks what was
// acknowledged. Afterwards the log, reopened both as it is (a restart) and
// after a power loss (a crash image keeping only synced data), must pass
// A1-A5.

// nthFault is an Injector that fails operations of kinds (all when 0):
// the n-th such operation, counted from 0 across every ErrorFS sharing
// the injector, or with sticky every one from the n-th on until healed.
// A failing write first writes half of its bytes.
type nthFault struct {
	kinds  vfs.OpKind
	n      int64
	err    error
	sticky bool

	count  atomic.Int64
	hits   atomic.Int64
	healed atomic.Bool
}

func (f *nthFault) Inject(op vfs.Op) vfs.Fault {
	if f.kinds != 0 && op.Kind&f.kinds == 0 {
		return vfs.Fault{}
	}
	i := f.count.Add(1) - 1
	if f.healed.Load() || i < f.n || (!f.sticky && i != f.n) {
		return vfs.Fault{}
	}
	f.hits.Add(1)
	return vfs.Fault{Err: f.err, Written: op.Len / 2}
}

// faultRun drives a log through a workload on failing filesystems,
// carrying on after errors.
type faultRun struct {
	t    *testing.T
	fsys vfs.FS
	opts func(vfs.FS) Options
	l    *Log
	// acked holds the batches acknowledged as durable; appended every
	// batch appended since, plus acked.
	acked, appended [][]byte
	seq             int
	// onError is called after an API call failed, with the log (nil after
	// a failed Open).
	onError func(call string, err error)
	// calls and failures count API calls.
	calls, failures int
}

func (r *faultRun) failed(call string, err error) {
	r.failures++
	if r.onError != nil {
		r.onError(call, err)
	}
}

// open opens the log if it is not open; it reports whether it is.
func (r *faultRun) open() bool {
	if r.l != nil {
		return true
	}
	r.calls++
	l, err := Open(crashDir, r.opts(r.fsys))
	if err != nil {
		r.failed("open", err)
		return false
	}
	r.t.Cleanup(func() { l.Close() })
	r.l = l
	// What was appended but not acknowledged may or may not have survived
	// the restart; only acknowledged batches are expected from now on.
	r.appended = r.acked
	return true
}

// close closes the log; a nil error acknowledges everything appended.
func (r *faultRun) close() {
	if r.l == nil {
		return
	}
	r.calls++
	err := r.l.Close()
	r.l = nil
	if err != nil {
		r.failed("close", err)
		return
	}
	r.acked = r.appended
}

// appendOne appends the next batch. A failed append must leave the log
// end offset as it was.
func (r *faultRun) appendOne() {
	if !r.open() {
		return
	}
	r.calls++
	b := testBatch(r.t, r.seq)
	r.seq++
	leo := r.l.LogEndOffset()
	if _, err := r.l.Append(b); err != nil {
		require.Equal(r.t, leo, r.l.LogEndOffset(), "S6: a failed append moved the log end offset (%v)", err)
		r.failed("append", err)
		r.reopenIfFailed(err)
		return
	}
	r.appended = append(r.appended, b)
}

// sync syncs; a nil error acknowledges everything appended before.
func (r *faultRun) sync() {
	if !r.open() {
		return
	}
	r.calls++
	n := len(r.appended)
	if err := r.l.Sync(); err != nil {
		r.failed("sync", err)
		r.reopenIfFailed(err)
		return
	}
	r.acked = r.appended[:n]
}

// reopenIfFailed closes the log after a sticky failure, as an application
// must; the next call opens it again.
func (r *faultRun) reopenIfFailed(err error) {
	if errors.Is(err, ErrSyncFailed) {
		r.close()
	}
}

// faultWorkload runs the standard fault workload on mem: appends with
// periodic Syncs across several rolls, a power loss while the log is open
// (the rest runs on the crash image, so its Open recovers), then a clean
// Close and Open, more appends and a final Close. It returns the
// filesystem the workload ended on.
func (r *faultRun) workload(mem *vfs.MemFS, inj vfs.Injector) *vfs.MemFS {
	r.fsys = vfs.NewErrorFS(mem, inj)
	for i := 0; i < 24; i++ {
		r.appendOne()
		if i%4 == 3 {
			r.sync()
		}
		if i == 17 {
			// A power loss while the log is open: later work runs on the
			// image, whose Open recovers (scans, truncates, syncs).
			img := mem.CrashClone(vfs.CrashOptions{})
			acked := r.acked
			r.close() // on the lost machine: acknowledges nothing on img
			r.acked, r.appended = acked, acked
			mem = img
			r.fsys = vfs.NewErrorFS(mem, inj)
		}
	}
	r.close()
	for i := 0; i < 10; i++ {
		r.appendOne()
		if i%4 == 3 {
			r.sync()
		}
	}
	r.close()
	return mem
}

func faultOptions(fsys vfs.FS) Options {
	o := crashOptions(fsys)
	o.SegmentBytes = 2 << 10
	return o
}

// checkAfterFaults checks A1-A5 on what a fault run left in mem: first
// after a power loss (only synced data: everything acknowledged must have
// been fsynced), then after a plain restart.
func checkAfterFaults(t *testing.T, mem *vfs.MemFS, acked [][]byte, desc string) {
	t.Helper()
	img := mem.CrashClone(vfs.CrashOptions{})
	l, err := openCrashLog(t, crashDir, faultOptions(img))
	require.NoError(t, err, "open after a power loss %s", desc)
	st, err := tryReadState(l)
	require.NoError(t, err, "after a power loss %s", desc)
	checkAcked(t, st, acked)
	checkA4A5(t, l, st)

	l, err = openCrashLog(t, crashDir, faultOptions(mem))
	require.NoError(t, err, "open after a restart %s", desc)
	st, err = tryReadState(l)
	require.NoError(t, err, "after a restart %s", desc)
	checkAcked(t, st, acked)
	checkA4A5(t, l, st)
}

// faultLoop runs check for n = 0, 1, 2, ... until the workload runs
// without reaching the failing operation, as pebble's errorfs tests do.
// The flusher's timing moves the number of operations a little from run
// to run, so the values up to a little past the count of a fault-free run
// run in parallel, and the loop then goes on one by one until margin
// values in a row did not fail anything.
func faultLoop(t *testing.T, kinds vfs.OpKind, check func(t *testing.T, n int64) *nthFault) {
	t.Helper()
	const margin = 16
	counter := &nthFault{kinds: kinds, n: 1 << 62}
	clean := &faultRun{t: t, opts: faultOptions}
	clean.workload(vfs.NewMem(), counter)
	require.Zero(t, clean.failures)
	total := counter.count.Load()
	var lastHit atomic.Int64
	run := func(t *testing.T, n int64) {
		if inj := check(t, n); inj.hits.Load() > 0 {
			for {
				last := lastHit.Load()
				if n <= last || lastHit.CompareAndSwap(last, n) {
					break
				}
			}
		}
	}
	t.Run("n", func(t *testing.T) {
		for n := int64(0); n <= total+margin; n++ {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				t.Parallel()
				run(t, n)
			})
		}
	})
	for n := total + margin + 1; lastHit.Load() > n-margin; n++ {
		require.Less(t, n, 2*total+100, "the workload never stops reaching the failing operation")
		t.Run(fmt.Sprintf("n/%d", n), func(t *testing.T) { run(t, n) })
	}
	t.Logf("a fault at each of %d operations (%d in a fault-free run)", lastHit.Load()+1, total)
}

// TestFaultEveryOperation is S7: an EIO at operation 0, 1, 2, ... of the
// fault workload until the workload runs without reaching the failing
// operation. Every call returns nil or an error, Close stops the
// flusher (checked for leaks), and A1-A5 hold afterwards.
func TestFaultEveryOperation(t *testing.T) {
	requireNoGoroutineLeak(t)
	faultLoop(t, 0, func(t *testing.T, n int64) *nthFault {
		inj := &nthFault{n: n, err: syscall.EIO}
		r := &faultRun{t: t, opts: faultOptions}
		mem := r.workload(vfs.NewMem(), inj)
		// Some errors are rightly absorbed (an unreadable clean-shutdown
		// marker means recovering), so none is required to surface; what
		// was acknowledged must hold regardless.
		checkAfterFaults(t, mem, r.acked, fmt.Sprintf("(EIO at operation %d; %d of %d calls failed)", n, r.failures, r.calls))
		return inj
	})
}

// TestFaultSyncEIO is S5: the n-th fsync (file or directory) fails with
// EIO, for every n. The failure must be reported by a Sync (or the call
// that hit it) with ErrSyncFailed wrapping EIO, must be sticky until the
// log is reopened even once the disk works again, must not advance the
// durable offset, and reopening recovers everything acknowledged before.
func TestFaultSyncEIO(t *testing.T) {
	requireNoGoroutineLeak(t)
	faultLoop(t, vfs.OpSyncs, func(t *testing.T, n int64) *nthFault {
		inj := &nthFault{kinds: vfs.OpSyncs, n: n, err: syscall.EIO}
		r := &faultRun{t: t, opts: faultOptions}
		r.onError = func(call string, err error) {
			require.ErrorIs(t, err, syscall.EIO, "%s: the fsync error is not reported", call)
			if call == "open" || call == "close" || !errors.Is(err, ErrSyncFailed) {
				// A failed Open or Close leaves no log to check; any other
				// call must report the sticky failure.
				require.Contains(t, []string{"open", "close"}, call, "%s: failed fsync not reported as ErrSyncFailed: %v", call, err)
				return
			}
			// The disk works again, yet the log refuses to go on.
			inj.healed.Store(true)
			defer inj.healed.Store(false)
			l := r.l
			durable, leo := l.DurableOffset(), l.LogEndOffset()
			require.ErrorIs(t, l.Sync(), ErrSyncFailed, "S5: Sync after a failed fsync")
			_, err = l.Append(testBatch(t, 999))
			require.ErrorIs(t, err, ErrSyncFailed, "S5: Append after a failed fsync")
			require.ErrorIs(t, l.Sync(), ErrSyncFailed, "S5: second Sync after a failed fsync")
			require.Equal(t, leo, l.LogEndOffset(), "S5: log end offset moved after a failed fsync")
			require.Equal(t, durable, l.DurableOffset(), "S5: durable offset moved after a failed fsync")
			require.True(t, l.Stats().Failed)
		}
		mem := r.workload(vfs.NewMem(), inj)
		desc := fmt.Sprintf("(EIO at fsync %d; %d of %d calls failed)", n, r.failures, r.calls)
		if inj.hits.Load() > 0 {
			require.NotZero(t, r.failures, "a failed fsync went unreported %s", desc)
		}
		checkAfterFaults(t, mem, r.acked, desc)
		return inj
	})
}

// TestFaultDiskFull is S6: from the n-th write on, for every n, the disk
// is full: writes fail with ENOSPC after writing half their bytes, until
// the application sees an error and frees space. A failed append leaves
// the log end offset unchanged and no partial batch visible; once space
// returns, appends work again at once, or after a reopen if the log
// failed an fsync-path write; A1-A5 hold afterwards.
func TestFaultDiskFull(t *testing.T) {
	requireNoGoroutineLeak(t)
	faultLoop(t, vfs.OpWrite, func(t *testing.T, n int64) *nthFault {
		inj := &nthFault{kinds: vfs.OpWrite, n: n, err: syscall.ENOSPC, sticky: true}
		r := &faultRun{t: t, opts: faultOptions}
		r.onError = func(call string, err error) {
			require.ErrorIs(t, err, syscall.ENOSPC, "%s: the disk-full error is not reported", call)
			if inj.healed.Swap(true) || r.l == nil {
				return
			}
			// No partial batch is visible: the log holds exactly what was
			// appended (and survived earlier restarts).
			st, err := tryReadState(r.l)
			require.NoError(t, err, "S6: after a failed %s", call)
			checkAcked(t, st, r.acked)
			if call == "append" && !r.l.Stats().Failed {
				// Space is back: the next append works.
				b := testBatch(t, r.seq)
				r.seq++
				info, err := r.l.Append(b)
				require.NoError(t, err, "S6: append after space returned")
				require.Equal(t, st.end, info.FirstOffset, "S6: append after space returned")
				r.appended = append(r.appended, b)
			}
		}
		mem := r.workload(vfs.NewMem(), inj)
		desc := fmt.Sprintf("(disk full from write %d; %d of %d calls failed)", n, r.failures, r.calls)
		if inj.hits.Load() > 0 {
			require.NotZero(t, r.failures, "a failed write went unreported %s", desc)
		}
		checkAfterFaults(t, mem, r.acked, desc)
		return inj
	})
}

// TestFaultRecoveryReadError checks that a read error while recovery
// scans segments fails Open instead of being taken for corrupt data:
// before the fix, recovery truncated the log at the unreadable position,
// destroying every acknowledged batch after it.
func TestFaultRecoveryReadError(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	l, err := openCrashLog(t, crashDir, faultOptions(mem))
	require.NoError(t, err)
	var acked [][]byte
	for i := 0; i < 30; i++ {
		b := testBatch(t, i)
		_, err := l.Append(b)
		require.NoError(t, err)
		acked = append(acked, b)
	}
	require.NoError(t, l.Sync())
	img := mem.CrashClone(vfs.CrashOptions{}) // unclean: Open must scan
	require.NoError(t, l.Close())

	for n := int64(0); ; n++ {
		inj := &nthFault{kinds: vfs.OpRead, n: n, err: syscall.EIO}
		fsys := img.CrashClone(vfs.CrashOptions{})
		l, err := openCrashLog(t, crashDir, faultOptions(vfs.NewErrorFS(fsys, inj)))
		if err == nil {
			require.NoError(t, l.Close())
		} else {
			require.ErrorIs(t, err, syscall.EIO, "read %d", n)
		}
		l, err = openCrashLog(t, crashDir, faultOptions(fsys))
		require.NoError(t, err)
		checkA1toA5(t, l, acked...)
		if inj.hits.Load() == 0 {
			break
		}
	}
}

// TestFaultFailedWriteAndTruncate is S6 with a second failure: an append's
// write fails after writing part of the batch, and so does the truncation
// that should remove that part. Later appends, a clean Close and an Open
// must still give a log whose every batch is readable, acknowledged ones
// included, before and after a power loss.
func TestFaultFailedWriteAndTruncate(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	var armed atomic.Int32 // 2: fail the next segment write, 1: then its truncation
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		switch {
		case op.Kind == vfs.OpWrite && strings.HasSuffix(op.Path, logSuffix) && armed.CompareAndSwap(2, 1):
			return vfs.Fault{Err: syscall.ENOSPC, Written: op.Len - 10}
		case op.Kind == vfs.OpTruncate && strings.HasSuffix(op.Path, logSuffix) && armed.CompareAndSwap(1, 0):
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	opts := faultOptions(efs)
	opts.SegmentBytes = 1 << 20 // no roll: the garbage stays in the active segment
	l, err := openCrashLog(t, crashDir, opts)
	require.NoError(t, err)
	var acked [][]byte
	appendOne := func(seq int) {
		t.Helper()
		b := testBatch(t, seq)
		_, err := l.Append(b)
		require.NoError(t, err)
		acked = append(acked, b)
	}
	for i := 0; i < 5; i++ {
		appendOne(i)
	}
	require.NoError(t, l.Sync())
	armed.Store(2)
	leo := l.LogEndOffset()
	_, err = l.Append(testBatch(t, 5)) // 3 records, about 400 bytes
	require.Error(t, err)
	require.Equal(t, leo, l.LogEndOffset())
	require.Zero(t, armed.Load(), "the write and the truncation were not both attempted")
	if l.Stats().Failed {
		_, err = l.Append(testBatch(t, 6))
		require.ErrorIs(t, err, ErrSyncFailed, "append after the failed truncation")
		require.Error(t, l.Close(), "close after the failed truncation")
	} else {
		appendOne(6) // 1 record, shorter than what the failed write left
		require.NoError(t, l.Sync())
		require.NoError(t, l.Close())
	}
	for _, fsys := range []*vfs.MemFS{mem.CrashClone(vfs.CrashOptions{}), mem} {
		l, err := openCrashLog(t, crashDir, faultOptions(fsys))
		require.NoError(t, err)
		checkA1toA5(t, l, acked...)
	}
}

// fsyncgateFS models Linux's handling of a failed fsync of a file that two
// callers fsync at once through one descriptor: the first fsync of target
// after arming fails with EIO and the dirty pages are dropped (marked
// clean, their data never written), the error is reported only once, and
// every later fsync of the file succeeds without writing anything. The
// failing fsync waits a little for a second fsync to overlap it.
type fsyncgateFS struct {
	vfs.FS
	target string
	armed  atomic.Bool
	lost   atomic.Bool
	second chan struct{}
}

type fsyncgateFile struct {
	vfs.File
	fs *fsyncgateFS
}

func (g *fsyncgateFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.FS.OpenFile(name, flag, perm)
	if err != nil || name != g.target {
		return f, err
	}
	return &fsyncgateFile{File: f, fs: g}, nil
}

func (f *fsyncgateFile) Sync() error {
	g := f.fs
	if g.lost.Load() {
		select {
		case g.second <- struct{}{}:
		default:
		}
		return nil // the error was already reported; nothing is written
	}
	if !g.armed.CompareAndSwap(true, false) {
		return f.File.Sync()
	}
	g.lost.Store(true)
	select {
	case <-g.second:
	case <-time.After(200 * time.Millisecond):
	}
	return &os.PathError{Op: "fsync", Path: f.Name(), Err: syscall.EIO}
}

// TestFaultFsyncErrorSeenOnce is S5 with a Sync and the background flusher
// fsyncing the same rolled segment at once, where the kernel reports the
// write-back error to one of them only: neither may go on as if the data
// were durable (Sync returning nil, or the flusher advancing the recovery
// point past the lost data).
func TestFaultFsyncErrorSeenOnce(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	g := &fsyncgateFS{FS: mem, target: crashDir + "/" + segmentName(0) + logSuffix, second: make(chan struct{}, 1)}
	opts := crashOptions(g)
	opts.SegmentBytes = 4 << 10
	l, err := openCrashLog(t, crashDir, opts)
	require.NoError(t, err)
	var acked [][]byte
	seq := 0
	for l.Stats().Segments == 1 && l.active().size.Load() < 3<<10 {
		b := testBatch(t, seq)
		seq++
		_, err := l.Append(b)
		require.NoError(t, err)
		acked = append(acked, b)
	}
	require.NoError(t, l.Sync())
	g.armed.Store(true)
	for l.Stats().Segments == 1 { // fill segment 0 and roll
		_, err := l.Append(testBatch(t, seq))
		seq++
		require.NoError(t, err)
	}
	err = l.Sync()
	require.Error(t, err, "Sync returned nil though the rolled segment's data was lost")
	require.ErrorIs(t, err, ErrSyncFailed)
	require.Error(t, l.Close())

	l, err = openCrashLog(t, crashDir, crashOptions(mem.CrashClone(vfs.CrashOptions{})))
	require.NoError(t, err)
	checkA1toA5(t, l, acked...)
}

// TestFailedAppendCutIsDurable (S6): an append whose write fails part way
// cuts what reached the file, and the cut is fsynced: a Sync that ran
// between the write and the cut (simulated: the injector syncs the file
// when the cut comes) made the part durable, and after a power loss its
// whole batches must not come back as data the append reported failed,
// nor behind a later append at the same offsets.
func TestFailedAppendCutIsDurable(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	var armed atomic.Bool
	inj := vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if !strings.HasSuffix(op.Path, logSuffix) || !armed.Load() {
			return vfs.Fault{}
		}
		switch op.Kind {
		case vfs.OpWrite:
			return vfs.Fault{Err: syscall.ENOSPC, Written: op.Len - 10}
		case vfs.OpTruncate:
			armed.Store(false)
			f, err := mem.OpenFile(op.Path, os.O_RDWR, 0)
			require.NoError(t, err)
			require.NoError(t, f.Sync())
			require.NoError(t, f.Close())
		}
		return vfs.Fault{}
	})
	opts := testLogOptions(vfs.NewErrorFS(mem, inj))
	opts.SegmentBytes = 1 << 20
	l := openLog(t, "/log", opts)
	first := testBatch(t, 0)
	_, err := l.Append(first)
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	armed.Store(true)
	_, err = l.Append(append(testBatch(t, 1), testBatch(t, 2)...))
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.False(t, armed.Load(), "the failed write was not cut")
	_, err = l.Append(testBatch(t, 3)) // same offsets, not synced
	require.NoError(t, err)

	crashed := testLogOptions(mem.CrashClone(vfs.CrashOptions{}))
	crashed.SegmentBytes = opts.SegmentBytes
	l2 := openLog(t, "/log", crashed)
	require.Equal(t, Batch(first).NextOffset(), l2.LogEndOffset(), "the failed append came back")
}

// TestReopenAfterFailedFsyncRewritesLostPages is the fsyncgate case: the
// Log's fsync fails, and Linux marks the pages it failed to write clean,
// so they still read back but no later fsync writes them. The application
// reopens the log in the same boot (recovery reads the data from the page
// cache), appends and syncs again; after a power loss every batch
// acknowledged after the reopen must be there, which needs recovery to
// write the data it trusts back before its fsync.
func TestReopenAfterFailedFsyncRewritesLostPages(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	var failing atomic.Bool
	fsys := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if failing.Load() && op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, ".log") {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	}))
	l, err := Open(crashDir, faultOptions(fsys))
	require.NoError(t, err)
	for i := range 3 {
		_, err := l.Append(testBatch(t, i))
		require.NoError(t, err)
	}
	failing.Store(true)
	require.ErrorIs(t, l.Sync(), ErrSyncFailed)
	failing.Store(false)
	require.Error(t, l.Close(), "Close reports the sticky failure")

	l, err = Open(crashDir, faultOptions(fsys))
	require.NoError(t, err, "the reopen recovers what the page cache holds")
	var acked [][]byte
	for i := 3; i < 5; i++ {
		b := testBatch(t, i)
		_, err := l.Append(b)
		require.NoError(t, err)
		acked = append(acked, b)
	}
	require.NoError(t, l.Sync())
	st, err := tryReadState(l)
	require.NoError(t, err)
	require.Len(t, st.batches, 5, "the reopen kept the three unsynced batches")
	acked = append(st.batches[:3:3], acked...)

	img := mem.CrashClone(vfs.CrashOptions{})
	l2, err := openCrashLog(t, crashDir, faultOptions(img))
	require.NoError(t, err, "open after a power loss")
	st, err = tryReadState(l2)
	require.NoError(t, err)
	checkAcked(t, st, acked)
	require.NoError(t, l.Close())
}
