package log

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// What recovery trusts and refuses: MaxBatchBytes is an append limit, not a
// recovery one; damage followed by valid data is reported, not truncated;
// OffsetForTimestamp stores nothing; an inconsistent clean-shutdown marker
// is not trusted; index and snapshot reads are bounded; a lazy index
// rebuild does not disturb concurrent Readers.

// dirFiles returns the contents of every file in /log.
func dirFiles(t *testing.T, fs vfs.FS) map[string]string {
	t.Helper()
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)
	out := map[string]string{}
	for _, n := range names {
		out[n] = string(readFileFS(t, fs, filepath.Join("/log", n)))
	}
	return out
}

// readerBatches reads the whole log with a Reader and returns its batches.
func readerBatches(t *testing.T, l *Log, o ReaderOptions) [][]byte {
	t.Helper()
	r := l.NewReader(l.LogStartOffset(), o)
	var out [][]byte
	for r.Offset() < l.LogEndOffset() {
		b, err := r.TryNext()
		require.NoError(t, err, "reader at %d", r.Offset())
		require.NotNil(t, b, "reader at %d", r.Offset())
		out = append(out, append([]byte(nil), b...))
	}
	return out
}

// TestRecoveryIgnoresLoweredMaxBatchBytes: batches written under a larger
// MaxBatchBytes stay readable, by recovery and by a Reader, after a crash
// and a reopen with a smaller one, both for batches below scanChunk and
// for batches above it (which are checked against their CRC in chunks).
func TestRecoveryIgnoresLoweredMaxBatchBytes(t *testing.T) {
	for _, tc := range []struct {
		name            string
		records, value  int
		n               int
		lowered, buffer int
	}{
		{"16KiB batches", 4, 4000, 10, 8 << 10, 4 << 10},
		{"1.5MiB batches", 3, 500 << 10, 3, 64 << 10, 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			opts := Options{SegmentBytes: 64 << 20, FS: fs}
			l, err := Open("/log", opts)
			require.NoError(t, err)
			var want [][]byte
			for i := 0; i < tc.n; i++ {
				b := buildBatch(t, tc.records, tc.value, int64(i))
				_, err = l.Append(b)
				require.NoError(t, err)
				want = append(want, b)
			}
			require.NoError(t, l.Sync())
			leo := l.LogEndOffset()
			img := crashCopy(t, fs) // crash: no Close
			require.NoError(t, l.Close())

			opts.FS = img
			opts.MaxBatchBytes = tc.lowered
			l2 := openLog(t, "/log", opts)
			require.Equal(t, leo, l2.LogEndOffset(), "recovery dropped synced batches larger than the new MaxBatchBytes")
			require.Equal(t, want, readAllBatches(t, l2))
			require.Equal(t, want, readerBatches(t, l2, ReaderOptions{BufferBytes: tc.buffer}))
		})
	}
}

// TestRecoveryLargeLengthClaimBoundedAllocation: a damaged length field
// claiming many MiB inside a large segment (so the claim fits in the
// file) is rejected without allocating for the claim, now that the claim
// is no longer bounded by MaxBatchBytes. The claim hides where the next
// batch starts, but recovery finds it past the damage: this is no torn
// tail, and 390 synced batches follow, so Open fails with ErrCorrupt
// instead of dropping them; TruncateAtCorruption truncates there.
func TestRecoveryLargeLengthClaimBoundedAllocation(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{SegmentBytes: 64 << 20, FS: fs}
	l, err := Open("/log", opts)
	require.NoError(t, err)
	b := buildBatch(t, 4, 16<<10, 0)
	for i := 0; i < 400; i++ { // about 26 MiB
		_, err = l.Append(b)
		require.NoError(t, err)
	}
	require.NoError(t, l.Sync())
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())
	seg := "/log/" + segmentName(0) + logSuffix
	data := readFileFS(t, img, seg)
	pos := 10 * len(b)
	claim := uint32(20 << 20)
	data[pos+8], data[pos+9], data[pos+10], data[pos+11] = byte(claim>>24), byte(claim>>16), byte(claim>>8), byte(claim)
	writeFileFS(t, img, seg, data)
	data = nil

	opts.FS = img
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = Open("/log", opts)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrCorrupt, "synced batches follow the damaged length")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8<<20), "recovery allocated for the claim")

	opts.TruncateAtCorruption = true
	l2, err := Open("/log", opts)
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, int64(10*4), l2.LogEndOffset())
}

// flipByte flips one bit of the file at pos.
func flipByte(t *testing.T, fs vfs.FS, path string, pos int64) {
	t.Helper()
	data := readFileFS(t, fs, path)
	data[pos] ^= 0x10
	writeFileFS(t, fs, path, data)
}

// TestRecoveryRefusesToTruncateMidLog (S4): a bit flip in a synced batch
// of the active segment with valid batches after it makes Open fail with
// ErrCorrupt naming the segment and position, and leaves every file as it
// was, instead of truncating the synced batches after it.
func TestRecoveryRefusesToTruncateMidLog(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{SegmentBytes: 1 << 20, FS: fs}
	l, err := Open("/log", opts)
	require.NoError(t, err)
	for i := 0; i < 50; i++ {
		_, err = l.Append(buildBatch(t, 3, 60, int64(i)))
		require.NoError(t, err)
	}
	require.NoError(t, l.Sync())
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())
	size := int64(len(buildBatch(t, 3, 60, 0)))
	seg := "/log/" + segmentName(0) + logSuffix
	flipByte(t, img, seg, 10*size+100)
	files := dirFiles(t, img)

	opts.FS = img
	l2, err := Open("/log", opts)
	if err == nil {
		l2.Close()
	}
	require.ErrorIs(t, err, ErrCorrupt, "synced batches after the flip silently dropped")
	require.Contains(t, err.Error(), segmentName(0)+logSuffix)
	require.Contains(t, err.Error(), "position")
	require.Equal(t, files, dirFiles(t, img), "a failed Open changed the files")
}

// TestRecoveryRefusesToTruncateAcrossSegments: damage in the last batch of
// a segment past the recovery point, with the next segment continuing the
// offsets, is in the middle of the log too.
func TestRecoveryRefusesToTruncateAcrossSegments(t *testing.T) {
	fs, opts := memLog()
	l, err := Open("/log", opts)
	require.NoError(t, err)
	appendN(t, l, 100, 0) // several 8 KiB segments
	require.NoError(t, l.Close())
	segs := l.segments()
	require.Greater(t, len(segs), 2)
	img := crashCopy(t, fs)
	// Unclean, with no recovery point: everything is scanned.
	require.NoError(t, img.Remove("/log/"+cleanShutdownFile))
	require.NoError(t, img.Remove("/log/"+recoveryPointFile))
	first := "/log/" + segmentName(segs[0].base) + logSuffix
	flipByte(t, img, first, segs[0].size.Load()-20)
	files := dirFiles(t, img)
	opts.FS = img
	l2, err := Open("/log", opts)
	if err == nil {
		l2.Close()
	}
	require.ErrorIs(t, err, ErrCorrupt)
	require.Contains(t, err.Error(), segmentName(segs[0].base)+logSuffix)
	require.Equal(t, files, dirFiles(t, img))
}

// TestRecoveryZeroedSectorStillTorn: a zeroed sector inside a batch (a
// torn write of unsynced data) is truncated even when batches written
// after it survived, as a crash can leave them.
func TestRecoveryZeroedSectorStillTorn(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{SegmentBytes: 1 << 20, FS: fs}
	l, err := Open("/log", opts)
	require.NoError(t, err)
	var infos []AppendInfo
	for i := 0; i < 6; i++ {
		info, err := l.Append(buildBatch(t, 2, 3000, int64(i)))
		require.NoError(t, err)
		infos = append(infos, info)
	}
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())
	seg := "/log/" + segmentName(0) + logSuffix
	data := readFileFS(t, img, seg)
	size := len(data) / 6
	s := (3*size + vfs.SectorSize) / vfs.SectorSize * vfs.SectorSize // inside batch 3
	clear(data[s : s+vfs.SectorSize])
	writeFileFS(t, img, seg, data)
	opts.FS = img
	l2 := openLog(t, "/log", opts)
	require.Equal(t, infos[2].LastOffset+1, l2.LogEndOffset())
}

// TestOffsetForTimestampConcurrentNoRace (run with -race): concurrent
// OffsetForTimestamp calls on a cleanly reopened log, with retention, and
// with appends to an active segment whose max timestamp starts unset,
// store nothing in the segments.
func TestOffsetForTimestampConcurrentNoRace(t *testing.T) {
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 200, 1000)
	require.NoError(t, l.Close())
	l2 := openLog(t, "/log", opts)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off, ok, err := l2.OffsetForTimestamp(1500)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, int64(150), off)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = l2.ApplyRetention()
	}()
	wg.Wait()

	_, opts = memLog()
	l3 := openLog(t, "/log", opts)
	done := make(chan struct{})
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				_, _, err := l3.OffsetForTimestamp(0)
				require.NoError(t, err)
			}
		}()
	}
	for i := 0; i < 50; i++ {
		_, err := l3.Append(buildBatch(t, 1, 10, int64(100+i)))
		require.NoError(t, err)
	}
	close(done)
	wg.Wait()
	off, ok, err := l3.OffsetForTimestamp(149)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(49), off)
}

// closedLog appends n batches, closes the log cleanly and returns its
// filesystem, options and batches.
func closedLog(t *testing.T, n int) (*vfs.MemFS, Options, [][]byte) {
	t.Helper()
	fs, opts := memLog()
	l, err := Open("/log", opts)
	require.NoError(t, err)
	batches := appendN(t, l, n, 0)
	require.NoError(t, l.Close())
	return fs, opts, batches
}

// TestCleanMarkerNotTrustedWithoutSegments: a clean-shutdown marker left
// in a directory whose segment files are gone does not make the new log
// start at the marker's offset with no data below it.
func TestCleanMarkerNotTrustedWithoutSegments(t *testing.T) {
	fs, opts, _ := closedLog(t, 10)
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)
	for _, n := range names {
		if strings.HasSuffix(n, logSuffix) {
			require.NoError(t, fs.Remove("/log/"+n))
		}
	}
	l := openLog(t, "/log", opts)
	require.Equal(t, l.LogStartOffset(), l.LogEndOffset(), "an empty log must not end at the marker's offset")
	info, err := l.Append(buildBatch(t, 1, 5, 0))
	require.NoError(t, err)
	buf, err := l.Read(nil, info.FirstOffset, ReadOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, buf)
}

// TestCleanMarkerNotTrustedWhenSegmentDisagrees: a marker whose offset
// contradicts the active segment (found without reading its data: below
// its base, or past the base of an empty segment) is ignored: Open
// recovers and the log ends where the data does.
func TestCleanMarkerNotTrustedWhenSegmentDisagrees(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, fs *vfs.MemFS, act string, batches [][]byte) int
	}{
		{"active segment emptied after Close", func(t *testing.T, fs *vfs.MemFS, act string, batches [][]byte) int {
			data := readFileFS(t, fs, act)
			writeFileFS(t, fs, act, nil)
			n := len(batches)
			for size := 0; size < len(data); n-- {
				size += len(batches[n-1])
			}
			return n
		}},
		{"marker below the active segment", func(t *testing.T, fs *vfs.MemFS, act string, batches [][]byte) int {
			writeOffsetCheckpointForTest(t, fs, "/log/"+cleanShutdownFile, 1)
			return len(batches)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, opts, batches := closedLog(t, 60)
			l := openLog(t, "/log", opts)
			act := l.active().path(logSuffix)
			require.NoError(t, l.Close())
			keep := tc.damage(t, fs, act, batches)
			l2, err := Open("/log", opts)
			require.NoError(t, err)
			defer l2.Close()
			require.Equal(t, Batch(batches[keep-1]).NextOffset(), l2.LogEndOffset())
			require.Equal(t, batches[:keep], readAllBatches(t, l2))
		})
	}
}

// TestLogStartPastEndAfterCleanShutdownIsDamage: a log start offset
// checkpoint past the log end, which a live log never has, made Open
// delete every segment even after a clean shutdown, where no data could
// have been lost: Open restarted the log empty at that start, as after a
// crash that lost data the start had moved past. It now fails with
// ErrCorrupt and changes no file, unless TruncateAtCorruption; after a
// crash it still restarts empty, as Kafka's LogLoader does.
func TestLogStartPastEndAfterCleanShutdownIsDamage(t *testing.T) {
	fs, opts, batches := closedLog(t, 60)
	end := Batch(batches[len(batches)-1]).NextOffset()
	require.NoError(t, writeOffsetCheckpoint(fs, "/log/"+logStartOffsetFile, end+1000))
	before := dirFiles(t, fs)

	_, err := Open("/log", opts)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, logStartOffsetFile)
	require.Equal(t, before, dirFiles(t, fs), "a refused Open changed files")

	restarted := func(t *testing.T, l *Log) {
		t.Helper()
		require.Equal(t, end+1000, l.LogStartOffset())
		require.Equal(t, end+1000, l.LogEndOffset())
		info, err := l.Append(buildBatch(t, 1, 5, 0))
		require.NoError(t, err)
		require.Equal(t, end+1000, info.FirstOffset)
	}
	t.Run("crash", func(t *testing.T) {
		img := crashCopy(t, fs)
		require.NoError(t, img.Remove("/log/"+cleanShutdownFile))
		o := opts
		o.FS = img
		restarted(t, openLog(t, "/log", o))
	})
	t.Run("TruncateAtCorruption", func(t *testing.T) {
		o := opts
		o.FS = crashCopy(t, fs)
		o.TruncateAtCorruption = true
		restarted(t, openLog(t, "/log", o))
	})
}

// TestManagerRefusesALogStartPastEndAgain: OpenManager removed the
// Manager's clean-shutdown file before opening any log, so after it
// refused a log whose log start lies past its end, the next OpenManager,
// the obvious retry, took that log for crashed and restarted it empty,
// deleting what the refusal meant to keep. A failed OpenManager now
// writes the checkpoints back as Close would, the refused log keeping its
// marker; once the checkpoint is mended, everything is there.
func TestManagerRefusesALogStartPastEndAgain(t *testing.T) {
	mem := vfs.NewMem()
	m, want := mgrWriteAll(t, mem, 2, 6)
	require.NoError(t, m.Close())
	name := "log-0"
	end := Batch(want[name][len(want[name])-1]).NextOffset()
	startFile := filepath.Join(mgrCrashDir, name, logStartOffsetFile)
	require.NoError(t, writeOffsetCheckpoint(mem, startFile, end+1000))
	for i := range 2 {
		_, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
		require.ErrorIs(t, err, ErrCorrupt, "OpenManager %d", i)
	}
	require.NoError(t, writeOffsetCheckpoint(mem, startFile, 0))
	m, err := OpenManager(mgrCrashDir, mgrCrashOptions(mem))
	require.NoError(t, err)
	defer m.Close()
	for n, batches := range want {
		l, ok := m.Get(n)
		require.True(t, ok, n)
		require.Equal(t, batches, readAllBatches(t, l), n)
	}
}

// writeOffsetCheckpointForTest replaces a one-offset checkpoint file with
// one holding off, in the format the log writes.
func writeOffsetCheckpointForTest(t *testing.T, fs vfs.FS, path string, off int64) {
	t.Helper()
	data := readFileFS(t, fs, path)
	got, ok, err := readOffsetCheckpoint(fs, path)
	require.NoError(t, err)
	require.True(t, ok)
	old := []byte(itoa(got))
	i := strings.LastIndex(string(data), string(old))
	require.GreaterOrEqual(t, i, 0)
	data = append(append(append([]byte(nil), data[:i]...), itoa(off)...), data[i+len(old):]...)
	writeFileFS(t, fs, path, data)
	v, ok, err := readOffsetCheckpoint(fs, path)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, off, v)
}

func itoa(v int64) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}

// bigStatFS reports a huge size for files whose name has suffix, as a
// damaged or sparse file would, without holding the bytes.
type bigStatFS struct {
	vfs.FS
	suffix string
	size   int64
}

type bigStatFile struct {
	vfs.File
	size int64
}

type bigStatInfo struct {
	os.FileInfo
	size int64
}

func (i bigStatInfo) Size() int64 { return i.size }

func (f bigStatFile) Stat() (os.FileInfo, error) {
	st, err := f.File.Stat()
	if err != nil {
		return nil, err
	}
	return bigStatInfo{st, f.size}, nil
}

func (fs bigStatFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := fs.FS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasSuffix(name, fs.suffix) {
		return f, err
	}
	return bigStatFile{f, fs.size}, nil
}

// TestIndexLoadBoundedBySegment: an index file larger than its segment
// could need is taken as corrupt and rebuilt, without allocating its
// size; an oversize snapshot is reported as corrupt without reading it.
func TestIndexLoadBoundedBySegment(t *testing.T) {
	fs, opts, batches := closedLog(t, 60)
	const fake = 256 << 20
	opts.FS = bigStatFS{FS: fs, suffix: indexSuffix, size: fake}
	l := openLog(t, "/log", opts)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got := readAllBatches(t, l)
	runtime.ReadMemStats(&after)
	require.Equal(t, batches, got)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(fake/4), "an index load allocated the file's claimed size")

	snap := "/log/x" + snapshotSuffix
	writeFileFS(t, fs, snap, []byte("0123456789"))
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := readWholeFile(bigStatFS{FS: fs, suffix: snapshotSuffix, size: fake}, snap)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(fake/4))
}

// TestLazyIndexRebuildDoesNotDisturbReaders: while a reader's lookup
// rebuilds the missing indexes of a sealed segment, Readers stepping into
// that segment from the one before see no spurious corruption.
func TestLazyIndexRebuildDoesNotDisturbReaders(t *testing.T) {
	fs, opts, batches := closedLog(t, 120)
	l0 := openLog(t, "/log", opts)
	segs := l0.segments()
	require.Greater(t, len(segs), 3)
	target := segs[1]
	require.NoError(t, l0.Close())
	deadline := time.Now().Add(3 * time.Second)
	for iter := 0; iter < 200 && time.Now().Before(deadline); iter++ {
		require.NoError(t, fs.Remove(target.path(indexSuffix)))
		require.NoError(t, fs.Remove(target.path(timeIndexSuffix)))
		l, err := Open("/log", opts)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := l.NewReader(0, ReaderOptions{BufferBytes: 256})
				for r.Offset() < l.LogEndOffset() {
					b, err := r.TryNext()
					if err != nil {
						errs <- err
						return
					}
					if b == nil {
						errs <- errors.New("reader stopped early")
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.Read(nil, target.base+3, ReadOptions{}); err != nil {
				errs <- err
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "iteration %d", iter)
		}
		require.Equal(t, batches, readAllBatches(t, l))
		require.NoError(t, l.Close())
	}
}
