package log

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// Appends concurrent with Sync (RELIABILITY.md A1): every batch appended
// before a Sync that returned nil survives a power loss at its offset with
// its bytes, also when other appends land while that Sync's fsyncs run.
// A Sync must take the offset it declares durable, and the segment size it
// records as fsynced, before its fsync starts: read after, they cover
// bytes the fsync may have missed.

// syncHookFS calls beforeSync and afterSync (those set) on the segment
// files' Syncs, just before the inner fsync starts and just after it
// returned, before the caller sees its result.
type syncHookFS struct {
	vfs.FS
	beforeSync, afterSync func(name string)
}

type syncHookFile struct {
	vfs.File
	fs *syncHookFS
}

func (h *syncHookFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasSuffix(name, logSuffix) {
		return f, err
	}
	return &syncHookFile{File: f, fs: h}, nil
}

func (f *syncHookFile) Sync() error {
	if hook := f.fs.beforeSync; hook != nil {
		hook(f.Name())
	}
	err := f.File.Sync()
	if hook := f.fs.afterSync; hook != nil {
		hook(f.Name())
	}
	return err
}

// TestSyncConcurrentAppendDurable: a batch is appended while a Sync's
// fsync of the segment has completed but the Sync has not yet recorded
// what it made durable. That Sync must not count the new batch as
// durable, and a later Sync must fsync it: after a power loss right after
// the second Sync, both batches are there.
func TestSyncConcurrentAppendDurable(t *testing.T) {
	requireNoGoroutineLeak(t)
	mem := vfs.NewMem()
	target := crashDir + "/" + segmentName(0) + logSuffix
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	h := &syncHookFS{FS: mem, afterSync: func(name string) {
		if name == target && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	}}
	l, err := openCrashLog(t, crashDir, crashOptions(h))
	require.NoError(t, err)

	b0 := testBatch(t, 0)
	_, err = l.Append(b0)
	require.NoError(t, err)
	armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- l.Sync() }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("Sync did not fsync the segment")
	}
	// The fsync is over; the Sync has not returned.
	b1 := testBatch(t, 1)
	_, err = l.Append(b1)
	require.NoError(t, err)
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, l.Sync())

	img := mem.CrashClone(vfs.CrashOptions{})
	l2, err := openCrashLog(t, crashDir, crashOptions(img))
	require.NoError(t, err)
	checkA1toA5(t, l2, b0, b1)
	require.NoError(t, l.Close())
}

// syncCrashImage is a power-loss image taken while the workload ran, and
// the batches acknowledged before it was taken.
type syncCrashImage struct {
	fs    *vfs.MemFS
	acked [][]byte
	desc  string
}

// TestSyncConcurrentCrash: several goroutines each append a batch and
// Sync it, in a loop, on a log with small segments (so Syncs and rolls
// overlap too). A batch counts as acknowledged once its goroutine's Sync
// returned nil. At seeded points right after an acknowledgement, a
// crash image is taken (in each crash model); the log reopened on
// each image must hold every batch acknowledged before the image, at its
// offset with its bytes. The seed (-replog.seed) fixes the batches, the
// crash points and the crash options; the goroutines' interleaving is the
// scheduler's.
func TestSyncConcurrentCrash(t *testing.T) {
	requireNoGoroutineLeak(t)
	const (
		workers   = 4
		perWorker = 50
		imageOdds = 4 // an image after about one acknowledgement in imageOdds
	)
	for _, m := range crashModels {
		t.Run(m.name, func(t *testing.T) {
			seed := *crashSeed
			mem := vfs.NewMem()
			// Pause around each segment fsync: other goroutines' appends
			// then land between a Sync's fsync and its bookkeeping, and a
			// goroutine acknowledged by that Sync takes its image before
			// the next Sync's fsync writes the batch.
			pause := func(string) { time.Sleep(20 * time.Microsecond) }
			h := &syncHookFS{FS: mem, beforeSync: pause, afterSync: pause}
			opts := crashOptions(h)
			opts.SegmentBytes = 4 << 10
			l, err := openCrashLog(t, crashDir, opts)
			require.NoError(t, err)

			var (
				mu     sync.Mutex
				acked  [][]byte
				images []syncCrashImage
				nimg   atomic.Int64
			)
			errs := make(chan error, workers)
			var wg sync.WaitGroup
			for g := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(seed), uint64(g)))
					for i := range perWorker {
						b := testBatch(t, i*workers+g)
						if _, err := l.Append(b); err != nil {
							errs <- fmt.Errorf("worker %d append %d: %w", g, i, err)
							return
						}
						if err := l.Sync(); err != nil {
							errs <- fmt.Errorf("worker %d sync %d: %w", g, i, err)
							return
						}
						mu.Lock()
						acked = append(acked, b)
						snap := acked[:len(acked):len(acked)]
						mu.Unlock()
						if rng.IntN(imageOdds) != 0 {
							continue
						}
						// Everything in snap was acknowledged before the
						// image is taken.
						n := nimg.Add(1)
						o := m.opts(seed*1_000_003 + n)
						img := mem.CrashClone(o)
						mu.Lock()
						images = append(images, syncCrashImage{img, snap,
							fmt.Sprintf("(model %s, image %d by worker %d after its batch %d, options %+v, %d acked)", m.name, n, g, i, o, len(snap))})
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.NoError(t, l.Close())
			require.Len(t, acked, workers*perWorker)
			require.GreaterOrEqual(t, l.Stats().Rolls, int64(3), "the workload must roll several times")
			images = append(images, syncCrashImage{mem.CrashClone(m.opts(seed)), acked, "(after Close)"})
			t.Logf("%d images, %d rolls, seed %d", len(images), l.Stats().Rolls, seed)

			for _, im := range images {
				l, err := openCrashLog(t, crashDir, crashOptions(im.fs))
				require.NoError(t, err, "open after crash %s", im.desc)
				st, err := tryReadState(l)
				require.NoError(t, err, im.desc)
				byBase := make(map[int64][]byte, len(st.batches))
				for _, b := range st.batches {
					byBase[Batch(b).BaseOffset()] = b
				}
				for _, a := range im.acked {
					base := Batch(a).BaseOffset()
					got, ok := byBase[base]
					require.True(t, ok, "A1: acknowledged batch at offset %d lost (log [%d, %d)) %s", base, st.start, st.end, im.desc)
					require.Equal(t, a, got, "A1: acknowledged batch at offset %d changed %s", base, im.desc)
				}
				require.NoError(t, l.Close())
			}
			// A2-A5 on the last image taken while the log was open.
			if len(images) > 1 {
				im := images[len(images)-2]
				l, err := openCrashLog(t, crashDir, crashOptions(im.fs))
				require.NoError(t, err)
				checkA1toA5(t, l, im.acked...)
			}
		})
	}
}
