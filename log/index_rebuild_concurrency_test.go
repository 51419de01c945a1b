package log

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestCloseWaitsForALazyIndexRebuild: a sealed segment whose index files
// are missing is rebuilt by the first reader that uses it, holding only
// readMu shared. Close did not wait for that reader before it flushed
// every segment's indexes: it wrote the half-rebuilt entries as the
// segment's index files, then the clean-shutdown marker, and the rest of
// the rebuild never reached the files. The next Open trusted the marker
// and the short time index: the segment's newest timestamp was
// understated, so OffsetForTimestamp skipped records it holds, and age
// retention deleted a segment holding records within the retention
// period.
func TestCloseWaitsForALazyIndexRebuild(t *testing.T) {
	mem := vfs.NewMem()
	clock := newTestClock()
	base := clock.Now().UnixMilli() - 10*60*1000 // ten minutes ago
	o := Options{FS: mem, SegmentBytes: 3 << 20, IndexIntervalBytes: 4096, ProducerIDExpiration: neverExpire, Now: clock.Now}
	l, err := Open("/log", o)
	require.NoError(t, err)
	// Segment 0: 3 MiB of ~1 KiB batches (one record each), timestamps
	// 100 ms apart; then a few batches in segment 1.
	var tsOf []int64 // by offset
	for len(l.segments()) < 2 || l.active().size.Load() < 10<<10 {
		ts := base + int64(len(tsOf))*100
		_, err := l.Append(buildBatch(t, 1, 1000, ts))
		require.NoError(t, err)
		tsOf = append(tsOf, ts)
	}
	seg0End := l.segments()[1].base
	require.NoError(t, l.Close())
	// The sealed segment lost its index files (they are rebuilt when
	// first used, says the package documentation).
	require.NoError(t, mem.Remove("/log/00000000000000000000.index"))
	require.NoError(t, mem.Remove("/log/00000000000000000000.timeindex"))

	// Reopen on a filesystem that holds the rebuild's second chunk read.
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpRead && strings.HasSuffix(op.Path, "00000000000000000000.log") && op.Off >= 1<<20 && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	o2 := o
	o2.FS = efs
	l2, err := Open("/log", o2)
	require.NoError(t, err)
	armed.Store(true)
	readDone := make(chan error, 1)
	go func() {
		_, err := l2.Read(nil, 5, ReadOptions{MaxBytes: 100})
		readDone <- err
	}()
	<-entered // the reader is rebuilding segment 0, half way
	closeDone := make(chan error, 1)
	go func() { closeDone <- l2.Close() }()
	time.Sleep(100 * time.Millisecond)
	markerWhileRebuilding := fileExists(mem, "/log/"+cleanShutdownFile)
	close(release)
	require.NoError(t, <-readDone)
	require.NoError(t, <-closeDone)
	require.False(t, markerWhileRebuilding, "Close wrote the clean-shutdown marker while a reader rebuilt an index")

	st, err := mem.Stat("/log/00000000000000000000.timeindex")
	require.NoError(t, err)
	stIdx, err := mem.Stat("/log/00000000000000000000.index")
	require.NoError(t, err)
	t.Logf("segment 0: offsets [0, %d), %d bytes of .index, %d bytes of .timeindex written by Close", seg0End, stIdx.Size(), st.Size())

	// Reopen cleanly and ask for a record of segment 0's second half.
	l3, err := Open("/log", o)
	require.NoError(t, err)
	defer l3.Close()
	want := seg0End - 10
	got, ok, err := l3.OffsetForTimestamp(tsOf[want])
	require.NoError(t, err)
	require.True(t, ok)
	// Age retention whose cutoff lies after the records of the first
	// half but before the last records of segment 0.
	o3 := o
	o3.RetentionAge = time.Duration(clock.Now().UnixMilli()-tsOf[seg0End-20]) * time.Millisecond
	require.NoError(t, l3.Close())
	l4, err := Open("/log", o3)
	require.NoError(t, err)
	defer l4.Close()
	n, err := l4.ApplyRetention()
	require.NoError(t, err)
	if got != want || n != 0 {
		t.Errorf("after a Close during the rebuild: OffsetForTimestamp(ts of offset %d) = %d; ApplyRetention(RetentionAge %v, segment 0's newest record %v old) deleted %d segments, log start now %d",
			want, got, o3.RetentionAge, time.Duration(clock.Now().UnixMilli()-tsOf[seg0End-1])*time.Millisecond, n, l4.LogStartOffset())
	}
}

// TestConcurrentReadersRebuildAMissingIndexOnce: readers that arrive
// while a sealed segment's missing indexes are being rebuilt wait for the
// rebuild, then use it. They found the index files still missing (a
// rebuild does not write them) and each rebuilt the segment again, one
// after the other: N readers scanned the whole segment N times.
func TestConcurrentReadersRebuildAMissingIndexOnce(t *testing.T) {
	mem := vfs.NewMem()
	o := Options{FS: mem, SegmentBytes: 3 << 20, IndexIntervalBytes: 4096, ProducerIDExpiration: neverExpire}
	l, err := Open("/log", o)
	require.NoError(t, err)
	for len(l.segments()) < 2 {
		_, err := l.Append(buildBatch(t, 1, 1000, 1000))
		require.NoError(t, err)
	}
	require.NoError(t, l.Close())
	require.NoError(t, mem.Remove("/log/00000000000000000000.index"))
	require.NoError(t, mem.Remove("/log/00000000000000000000.timeindex"))

	var scans atomic.Int32
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpRead && strings.HasSuffix(op.Path, "00000000000000000000.log") && op.Off == 0 && op.Len >= 1<<20 {
			scans.Add(1)
			if armed.CompareAndSwap(true, false) {
				close(entered)
				<-release
			}
		}
		return vfs.Fault{}
	}))
	o.FS = efs
	l2, err := Open("/log", o)
	require.NoError(t, err)
	defer l2.Close()
	armed.Store(true)
	const readers = 8
	errs := make(chan error, readers)
	go func() {
		_, err := l2.Read(nil, 5, ReadOptions{MaxBytes: 100})
		errs <- err
	}()
	<-entered // the first reader is rebuilding
	for i := 1; i < readers; i++ {
		go func() {
			_, err := l2.Read(nil, int64(5+i), ReadOptions{MaxBytes: 100})
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond) // the others queue on loadMu
	close(release)
	for i := 0; i < readers; i++ {
		require.NoError(t, <-errs)
	}
	if n := scans.Load(); n != 1 {
		t.Errorf("%d concurrent first reads of a segment with missing index files scanned it %d times", readers, n)
	}
}
