package log

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// S16 across power loss (RELIABILITY.md S1 crash model): an idempotent
// producers' workload with rolls, producer snapshots, a Close/Open and
// retries of earlier batches runs on an ErrorFS whose Crash injector
// takes the durable image just before operation k. The log reopened on the
// image must hold every acknowledged batch at its offset, each (producer
// id, epoch, sequence) at most once, and a producer state that matches it
// exactly: retrying the workload from the start stores each batch that the
// crash lost once and each batch still present never again.

// idemCrashOptions roll every ~30 batches of the workload.
func idemCrashOptions(fs vfs.FS) Options {
	return Options{
		FS: fs, SegmentBytes: 4 << 10, IndexIntervalBytes: 512,
		// The workload's batch timestamps are in 1970: never expire them.
		ProducerIDExpiration: 100 * 365 * 24 * time.Hour,
	}
}

// idemCrashWorkload is the producers' workload of the crash test.
type idemCrashWorkload struct {
	batches                         [][]byte
	syncEvery, retryEvery, reopenAt int
}

// idemCrashResult is what a run acknowledged before the crash.
type idemCrashResult struct {
	// stamped holds, per workload index, the bytes as appended (with their
	// offsets), for the batches whose Append returned nil.
	stamped [][]byte
	// acked is how many leading workload batches were acknowledged as
	// durable (appended before a Sync or Close that returned nil).
	acked int
	// retries counts retries answered as duplicates during the run.
	retries int
}

// run appends the workload on fs until it ends or the crash makes an
// operation fail. Every error must come from the crash.
func (w *idemCrashWorkload) run(t testing.TB, fs vfs.FS) idemCrashResult {
	t.Helper()
	res := idemCrashResult{stamped: make([][]byte, len(w.batches))}
	crashed := func(err error) bool {
		t.Helper()
		require.ErrorIs(t, err, vfs.ErrCrashed)
		return true
	}
	l, err := Open(idemDir, idemCrashOptions(fs))
	if err != nil {
		crashed(err)
		return res
	}
	defer func() {
		if l != nil {
			_ = l.Close()
		}
	}()
	for i, tmpl := range w.batches {
		b := append([]byte(nil), tmpl...)
		info, err := l.Append(b)
		if err != nil && crashed(err) {
			return res
		}
		require.False(t, info.Duplicate, "batch %d", i)
		res.stamped[i] = b
		if i%w.retryEvery == w.retryEvery-1 {
			// A lost acknowledgement: the producer resends a batch among
			// its last five.
			j := i - 4*(1+i%4)
			if j >= 0 && res.stamped[j] != nil {
				info, err := l.Append(append([]byte(nil), w.batches[j]...))
				switch {
				case err == nil:
					require.True(t, info.Duplicate, "retry of batch %d stored again", j)
					require.Equal(t, Batch(res.stamped[j]).BaseOffset(), info.FirstOffset)
					res.retries++
				case errors.Is(err, ErrProducerFenced): // across the epoch bump
				case crashed(err):
					return res
				}
			}
		}
		if i%w.syncEvery == w.syncEvery-1 {
			if err := l.Sync(); err != nil && crashed(err) {
				return res
			}
			res.acked = i + 1
		}
		if i == w.reopenAt {
			if err := l.Close(); err != nil && crashed(err) {
				return res
			}
			res.acked = i + 1
			if l, err = Open(idemDir, idemCrashOptions(fs)); err != nil && crashed(err) {
				return res
			}
		}
	}
	if err := l.Close(); err != nil && crashed(err) {
		return res
	}
	res.acked = len(w.batches)
	return res
}

// verify reopens the crash image and checks A1, S16 and the rebuilt state
// by retrying the whole workload. It reports whether the image held
// producer snapshots.
func (w *idemCrashWorkload) verify(t testing.TB, image vfs.FS, res idemCrashResult) bool {
	t.Helper()
	hadSnapshots := false
	if names, err := image.ReadDir(idemDir); err == nil {
		for _, n := range names {
			_, ok := parseSegmentName(n, snapshotSuffix)
			hadSnapshots = hadSnapshots || ok
		}
	}
	l, err := Open(idemDir, idemCrashOptions(image))
	require.NoError(t, err, "reopening the crash image")
	defer func() { require.NoError(t, l.Close()) }()
	got := idemBatches(t, l)
	present := idemRequireUnique(t, got)

	// A1: every acknowledged batch at its offset with its bytes.
	byBase := make(map[int64]Batch, len(got))
	for _, b := range got {
		byBase[b.BaseOffset()] = b
	}
	for i := range res.acked {
		want := res.stamped[i]
		b, ok := byBase[Batch(want).BaseOffset()]
		require.True(t, ok, "acknowledged batch %d at offset %d lost", i, Batch(want).BaseOffset())
		require.True(t, bytes.Equal(want, b), "acknowledged batch %d changed", i)
	}

	// Retry everything in order: a batch in the log is never stored again,
	// one the crash lost is accepted, continuing its producer's sequence.
	leo := l.LogEndOffset()
	for i, tmpl := range w.batches {
		b := Batch(tmpl)
		at, in := present[idemSeqKey{b.ProducerID(), b.ProducerEpoch(), b.BaseSequence()}]
		info, err := l.Append(append([]byte(nil), tmpl...))
		if in {
			idemRequireNotStoredAgain(t, info, err)
			if err == nil {
				require.Equal(t, at, info.FirstOffset, "retry of batch %d", i)
			}
			require.Equal(t, leo, l.LogEndOffset(), "retry of batch %d", i)
			continue
		}
		require.NoError(t, err, "batch %d, lost in the crash, is not accepted again", i)
		require.False(t, info.Duplicate, "batch %d, lost in the crash, is taken for a duplicate", i)
		require.Equal(t, leo, info.FirstOffset)
		leo = l.LogEndOffset()
	}
	all := idemBatches(t, l)
	require.Len(t, all, len(w.batches))
	require.Len(t, idemRequireUnique(t, all), 2*len(w.batches))
	return hadSnapshots
}

// TestProducerRetriesAcrossCrashes runs the workload with a crash before
// every filesystem operation (every k-th with -short), taking turns with
// the crash models: strict (only synced data and directory entries
// survive), partial (a seeded part of the unsynced changes survives too)
// and kill (every change survives, no more of it durable). No goroutine of
// the crashed logs may be left behind.
func TestProducerRetriesAcrossCrashes(t *testing.T) {
	requireNoGoroutineLeak(t)
	w := &idemCrashWorkload{
		batches:   newIdemWorkload(t, 200, 4, 2).batches,
		syncEvery: 7, retryEvery: 3, reopenAt: 120,
	}
	// A run without crash: the workload rolls and snapshots.
	efs := vfs.NewErrorFS(idemMem(), nil)
	res := w.run(t, efs)
	require.Equal(t, len(w.batches), res.acked)
	require.Greater(t, res.retries, 30)
	total := efs.Ops()
	{
		l, err := Open(idemDir, idemCrashOptions(efs.Inner()))
		require.NoError(t, err)
		st := l.Stats()
		require.NoError(t, l.Close())
		require.GreaterOrEqual(t, st.Segments, 4, "the workload must roll at least 3 times")
		require.GreaterOrEqual(t, st.Snapshots, 4)
	}

	step := int64(1)
	if testing.Short() {
		step = max(1, total/40)
	}
	withSnapshots, points := 0, 0
	for n := int64(0); ; n += step {
		mem := idemMem()
		var opts vfs.CrashOptions
		switch points % 3 {
		case 1:
			opts = vfs.CrashOptions{Seed: n, KeepUnsynced: 0.5, ZeroSectors: 0.1, KeepDirOps: 0.5, DirOpsPrefix: 0.5}
		case 2:
			opts = vfs.CrashOptions{Kill: true}
		}
		crash := &vfs.Crash{N: n, Mem: mem, Opts: opts}
		res := w.run(t, vfs.NewErrorFS(mem, crash))
		image := crash.Clone()
		if image == nil {
			break // the workload ran to its end before operation n
		}
		points++
		ok := t.Run(fmt.Sprintf("crash before op %d", n), func(t *testing.T) {
			if w.verify(t, image, res) {
				withSnapshots++
			}
		})
		if !ok {
			break
		}
	}
	t.Logf("%d crash points every %d of ~%d operations, %d images with snapshots", points, step, total, withSnapshots)
	// The operation count varies a little from run to run with the
	// background flusher's timing.
	require.GreaterOrEqual(t, int64(points)*step, total*9/10, "crash points cover the workload")
	require.Positive(t, withSnapshots, "some crash images must hold producer snapshots")
}
