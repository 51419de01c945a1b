package log

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// syncGate holds the first fsync of a file whose name ends with the suffix
// it was armed with, before the fsync runs, until release is closed.
type syncGate struct {
	suffix           atomic.Pointer[string]
	entered, release chan struct{}
}

func newSyncGate() *syncGate {
	return &syncGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *syncGate) Inject(op vfs.Op) vfs.Fault {
	if p := g.suffix.Load(); op.Kind == vfs.OpSync && p != nil && strings.HasSuffix(op.Path, *p) && g.suffix.CompareAndSwap(p, nil) {
		close(g.entered)
		<-g.release
	}
	return vfs.Fault{}
}

// heldSync arms g with suffix, starts l.Sync and returns once that Sync
// is held in the fsync; its result comes on the channel.
func (g *syncGate) heldSync(t *testing.T, l *Log, suffix string) chan error {
	t.Helper()
	g.suffix.Store(&suffix)
	done := make(chan error, 1)
	go func() { done <- l.Sync() }()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("Sync never fsynced " + suffix)
	}
	return done
}

// TestSyncDuringTruncation: a Sync whose fsyncs overlap a TruncateTo
// and re-appends must not report the offsets it saw before the
// truncation as durable: they now hold new data it did not fsync, and a
// later Sync must still fsync that data.
func TestSyncDuringTruncation(t *testing.T) {
	mem := vfs.NewMem()
	gate := newSyncGate()
	opts := testLogOptions(vfs.NewErrorFS(mem, gate))
	l := openLog(t, "/log", opts)
	for len(l.segments()) < 2 || l.active().size.Load() < 2000 {
		_, err := l.Append(buildBatch(t, 1, 500, 1000))
		require.NoError(t, err)
	}
	waitRecoveryPoint(t, l) // the first segment is durable
	oldEnd := l.LogEndOffset()
	done := gate.heldSync(t, l, segmentName(l.active().base)+logSuffix)
	// While that fsync runs: truncate into the first segment, append anew
	// below the old end.
	require.NoError(t, l.TruncateTo(2))
	var fresh [][]byte
	for i := 0; i < 3; i++ {
		b := buildBatch(t, 1, 32, int64(5000+i))
		_, err := l.Append(b)
		require.NoError(t, err)
		fresh = append(fresh, b)
	}
	require.Less(t, l.LogEndOffset(), oldEnd)
	close(gate.release)
	require.NoError(t, <-done)

	require.NoError(t, l.Sync()) // must make the new batches durable
	img := mem.CrashClone(vfs.CrashOptions{})
	l2, err := Open("/log", testLogOptions(img))
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, int64(5), l2.LogEndOffset(), "synced batches lost")
	got := readAllBatches(t, l2)
	require.Equal(t, fresh, got[2:])
}

// TestSyncOfASegmentDeletedMeanwhile: a Sync fsyncing the active segment
// while TruncateTo deletes it must not fail the log. The flusher used to
// close a deleted segment's file after FileDeleteDelay whatever a Sync
// was doing with it: the fsync then failed on a closed file, and the log
// refused every Append and Sync until reopened, although no fsync had
// failed. The file is now closed only once the fsync is done, and a Sync
// that listed a segment before its deletion skips it.
func TestSyncOfASegmentDeletedMeanwhile(t *testing.T) {
	mem := vfs.NewMem()
	gate := newSyncGate()
	opts := testLogOptions(vfs.NewErrorFS(mem, gate))
	opts.FileDeleteDelay = time.Millisecond
	l := openLog(t, crashDir, opts)
	for i := 0; len(l.segments()) < 3; i++ {
		_, err := l.Append(testBatch(t, i))
		require.NoError(t, err)
	}
	require.NoError(t, l.Sync())
	waitRecoveryPoint(t, l)
	_, err := l.Append(testBatch(t, 400)) // unsynced, in the active segment
	require.NoError(t, err)
	segs := l.segments()
	active := segs[len(segs)-1]
	done := gate.heldSync(t, l, active.path(logSuffix))
	require.NoError(t, l.TruncateTo(segs[len(segs)-2].base+1)) // deletes the active segment
	// Give the flusher time to remove the deleted files (it did, before
	// the fix, within a few ms) before the fsync goes on.
	for start := time.Now(); fileExists(mem, active.deletedPath(logSuffix)) && time.Since(start) < 200*time.Millisecond; {
		time.Sleep(time.Millisecond)
	}
	close(gate.release)
	require.NoError(t, <-done, "Sync concurrent with TruncateTo")
	_, err = l.Append(testBatch(t, 401))
	require.NoError(t, err, "the log refuses appends after a Sync concurrent with TruncateTo")
	require.NoError(t, l.Sync())
	require.Eventually(t, func() bool { return !fileExists(mem, active.deletedPath(logSuffix)) }, 5*time.Second, time.Millisecond,
		"the deleted segment's file is removed once the fsync is done")
}
