package log

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func offsetEntry(rel, pos int32) []byte {
	var e [offsetEntrySize]byte
	binary.BigEndian.PutUint32(e[0:], uint32(rel))
	binary.BigEndian.PutUint32(e[4:], uint32(pos))
	return e[:]
}

func timeEntry(ts int64, rel int32) []byte {
	var e [timeEntrySize]byte
	binary.BigEndian.PutUint64(e[0:], uint64(ts))
	binary.BigEndian.PutUint32(e[8:], uint32(rel))
	return e[:]
}

func newTestOffsetIndex() offsetIndex {
	return offsetIndex{newIndex("/idx/00000000000000000000.index", offsetEntrySize, true)}
}

func newTestTimeIndex() timeIndex {
	return timeIndex{newIndex("/idx/00000000000000000000.timeindex", timeEntrySize, true)}
}

// TestOffsetIndexRandomLookup follows Kafka's OffsetIndexTest.randomLookupTest:
// random sorted entries, every lookup returns the position of the greatest
// entry <= the target (0 below the first entry).
func TestOffsetIndexRandomLookup(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 20; round++ {
		x := newTestOffsetIndex()
		n := rng.IntN(200)
		rels := make([]int32, 0, n)
		pos := int32(0)
		rel := int32(0)
		for i := 0; i < n; i++ {
			rel += 1 + rng.Int32N(50)
			pos += 1 + rng.Int32N(5000)
			x.append(rel, pos)
			rels = append(rels, rel)
		}
		require.Equal(t, n, x.count())
		positions := func(i int) int64 { return int64(binary.BigEndian.Uint32(x.entries[i*8+4:])) }
		for k := 0; k < 300; k++ {
			target := rng.Int32N(rel + 100)
			want := int64(0)
			// Brute force: the last entry with rel <= target.
			for i := range rels {
				if rels[i] <= target {
					want = positions(i)
				}
			}
			require.Equal(t, want, x.lookup(target), "round %d target %d", round, target)
		}
		// Exact hits.
		for i, r := range rels {
			require.Equal(t, positions(i), x.lookup(r))
		}
	}
}

func TestOffsetIndexLookupEdges(t *testing.T) {
	x := newTestOffsetIndex()
	require.Equal(t, int64(0), x.lookup(0), "empty index")
	require.Equal(t, int64(0), x.lookup(1<<30), "empty index")
	x.append(10, 100)
	x.append(20, 250)
	tests := []struct {
		target int32
		want   int64
	}{{-1, 0}, {0, 0}, {9, 0}, {10, 100}, {19, 100}, {20, 250}, {1 << 30, 250}}
	for _, tt := range tests {
		assert.Equal(t, tt.want, x.lookup(tt.target), "target %d", tt.target)
	}
}

func TestOffsetIndexFloorPosition(t *testing.T) {
	x := newTestOffsetIndex()
	require.Equal(t, int64(0), x.floorPosition(1000))
	x.append(5, 100)
	x.append(9, 400)
	x.append(12, 900)
	tests := []struct{ p, want int64 }{
		{0, 0}, {99, 0}, {100, 100}, {399, 100}, {400, 400}, {899, 400}, {900, 900}, {1 << 40, 900},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, x.floorPosition(tt.p), "position %d", tt.p)
	}
}

// TestTimeIndexAppendOutOfOrder follows Kafka's TimeIndexTest.appendOutOfOrder:
// entries whose timestamp does not grow, or whose offset goes backwards,
// are ignored.
func TestTimeIndexAppendOutOfOrder(t *testing.T) {
	x := newTestTimeIndex()
	_, _, ok := x.last()
	require.False(t, ok)
	x.maybeAppend(100, 1)
	x.maybeAppend(100, 2) // same timestamp
	x.maybeAppend(90, 3)  // older
	x.maybeAppend(200, 0) // newer but offset backwards
	require.Equal(t, 1, x.count())
	x.maybeAppend(200, 4)
	x.maybeAppend(300, 4) // same offset, newer: allowed
	require.Equal(t, 3, x.count())
	ts, rel, ok := x.last()
	require.True(t, ok)
	require.Equal(t, int64(300), ts)
	require.Equal(t, int32(4), rel)
	require.NoError(t, validateTimeEntries(x.entries))
}

func TestTimeIndexLookup(t *testing.T) {
	x := newTestTimeIndex()
	require.Equal(t, int32(0), x.lookup(500))
	x.maybeAppend(100, 3)
	x.maybeAppend(200, 7)
	x.maybeAppend(300, 12)
	// lookup returns the offset of the newest entry strictly older than ts:
	// no record up to it has a timestamp >= ts.
	tests := []struct {
		ts   int64
		want int32
	}{{-5, 0}, {100, 0}, {101, 3}, {200, 3}, {201, 7}, {300, 7}, {301, 12}, {1 << 50, 12}}
	for _, tt := range tests {
		assert.Equal(t, tt.want, x.lookup(tt.ts), "ts %d", tt.ts)
	}
}

func TestIndexTruncateEntries(t *testing.T) {
	o := newTestOffsetIndex()
	for i := int32(1); i <= 5; i++ {
		o.append(i*10, i*100)
	}
	o.truncateEntries(60, offsetKey) // past the end: nothing
	require.Equal(t, 5, o.count())
	require.False(t, o.dirty)
	o.truncateEntries(30, offsetKey) // drops rel >= 30
	require.Equal(t, 2, o.count())
	require.True(t, o.dirty)
	require.Equal(t, int64(200), o.lookup(1000))
	o.truncateEntries(0, offsetKey)
	require.Equal(t, 0, o.count())

	ti := newTestTimeIndex()
	for i := int32(1); i <= 5; i++ {
		ti.maybeAppend(int64(i)*1000, i*10)
	}
	ti.truncateEntries(25, timeRelOffset)
	require.Equal(t, 2, ti.count())
	ts, rel, ok := ti.last()
	require.True(t, ok)
	require.Equal(t, int64(2000), ts)
	require.Equal(t, int32(20), rel)
}

func TestIndexFlushLoadRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	require.NoError(t, fs.MkdirAll("/idx", 0o755))
	o := newTestOffsetIndex()
	ti := newTestTimeIndex()
	for i := int32(1); i <= 10; i++ {
		o.append(i*3, i*64)
		ti.maybeAppend(int64(i)*7, i*3)
	}
	require.NoError(t, o.flush(fs, true))
	require.NoError(t, ti.flush(fs, false))
	// Incremental flush: only the new entries are written.
	o.append(40, 2000)
	require.NoError(t, o.flush(fs, true))
	require.NoError(t, o.flush(fs, true), "a flush with nothing new is harmless")

	load := func(path string, size int, validate func([]byte) error) *index {
		t.Helper()
		x := newIndex(path, size, false)
		require.NoError(t, x.ensureLoaded(fs, validate))
		return x
	}
	o2 := load(o.path, offsetEntrySize, func(d []byte) error { return validateOffsetEntries(d, 1<<20) })
	require.Equal(t, o.entries, o2.entries)
	t2 := load(ti.path, timeEntrySize, validateTimeEntries)
	require.Equal(t, ti.entries, t2.entries)

	// After a truncation the file is rewritten shorter.
	o.truncateEntries(10, offsetKey)
	require.NoError(t, o.flush(fs, true))
	o3 := load(o.path, offsetEntrySize, func(d []byte) error { return validateOffsetEntries(d, 1<<20) })
	require.Equal(t, o.entries, o3.entries)
	require.Equal(t, 3, len(o3.entries)/offsetEntrySize)

	// An index not yet loaded writes nothing.
	lazy := offsetIndex{newIndex("/idx/lazy.index", offsetEntrySize, false)}
	require.NoError(t, lazy.flush(fs, true))
	_, err := fs.Stat("/idx/lazy.index")
	require.True(t, os.IsNotExist(err))

	// A missing file loads as an empty index.
	missing := newIndex("/idx/missing.index", offsetEntrySize, false)
	require.NoError(t, missing.ensureLoaded(fs, func(d []byte) error { return validateOffsetEntries(d, 100) }))
	require.Equal(t, 0, missing.count())
}

func TestIndexLoadRejectsCorruptFiles(t *testing.T) {
	fs := vfs.NewMem()
	require.NoError(t, fs.MkdirAll("/idx", 0o755))
	cat := func(es ...[]byte) []byte {
		var b []byte
		for _, e := range es {
			b = append(b, e...)
		}
		return b
	}
	const logSize = 10000
	tests := []struct {
		name      string
		entrySize int
		data      []byte
	}{
		{"offset: partial entry", offsetEntrySize, cat(offsetEntry(1, 10), offsetEntry(2, 20))[:12]},
		{"offset: relative offsets not increasing", offsetEntrySize, cat(offsetEntry(5, 10), offsetEntry(5, 20))},
		{"offset: relative offsets decreasing", offsetEntrySize, cat(offsetEntry(5, 10), offsetEntry(4, 20))},
		{"offset: positions not increasing", offsetEntrySize, cat(offsetEntry(1, 10), offsetEntry(2, 10))},
		{"offset: negative relative offset", offsetEntrySize, offsetEntry(-1, 10)},
		{"offset: negative position", offsetEntrySize, offsetEntry(1, -10)},
		{"offset: position past the log", offsetEntrySize, offsetEntry(1, logSize)},
		{"time: partial entry", timeEntrySize, timeEntry(5, 1)[:11]},
		{"time: timestamps decreasing", timeEntrySize, cat(timeEntry(5, 1), timeEntry(4, 2))},
		{"time: offsets decreasing", timeEntrySize, cat(timeEntry(5, 2), timeEntry(6, 1))},
		{"time: negative offset", timeEntrySize, timeEntry(5, -1)},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join("/idx", segmentName(int64(i))+".x")
			f, err := fs.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
			require.NoError(t, err)
			_, err = f.WriteAt(tt.data, 0)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			validate := validateTimeEntries
			if tt.entrySize == offsetEntrySize {
				validate = func(d []byte) error { return validateOffsetEntries(d, logSize) }
			}
			x := newIndex(path, tt.entrySize, false)
			require.ErrorIs(t, x.ensureLoaded(fs, validate), ErrCorrupt)
			require.False(t, x.loaded, "a corrupt file is not taken as loaded")
		})
	}
	require.NoError(t, validateOffsetEntries(nil, 0))
	require.NoError(t, validateTimeEntries(nil))
	require.NoError(t, validateTimeEntries(cat(timeEntry(5, 1), timeEntry(5, 2))), "equal timestamps are allowed")
}

// testLogOptions are small sizes so that a few hundred appends make
// several segments and index entries.
func testLogOptions(fs vfs.FS) Options {
	return Options{SegmentBytes: 8 << 10, IndexIntervalBytes: 512, FS: fs, ProducerIDExpiration: neverExpire}
}

// neverExpire is a ProducerIDExpiration for tests whose batches carry
// timestamps near 1970: with the default (7 days) a reopened log would
// drop their producers as expired.
const neverExpire = 200 * 365 * 24 * time.Hour

// openLog opens a Log and makes sure it is closed when the test ends,
// even if it fails early (Close is idempotent).
func openLog(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// appendN appends n batches of 3 records each with timestamps growing by
// 10 ms per batch starting at ts0, and returns copies of the batches as
// stored (offsets assigned).
func appendN(t *testing.T, l *Log, n int, ts0 int64) [][]byte {
	t.Helper()
	var out [][]byte
	for i := 0; i < n; i++ {
		b := buildBatch(t, 3, 60, ts0+int64(i)*10)
		_, err := l.Append(b)
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}

// readAllBatches reads the whole log from its start and returns each
// batch as a separate copy.
func readAllBatches(t *testing.T, l *Log) [][]byte {
	t.Helper()
	out := [][]byte{}
	off := l.LogStartOffset()
	for off < l.LogEndOffset() {
		buf, err := l.Read(nil, off, ReadOptions{MaxBytes: 1500})
		require.NoError(t, err, "read at %d", off)
		require.NotEmpty(t, buf, "read at %d", off)
		for rest := buf; len(rest) > 0; {
			b, r, err := SplitBatch(rest)
			require.NoError(t, err)
			out = append(out, append([]byte(nil), b...))
			off = b.NextOffset()
			rest = r
		}
	}
	return out
}

func segmentFiles(t *testing.T, fs vfs.FS, dir, suffix string) []string {
	t.Helper()
	names, err := fs.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, n := range names {
		if _, ok := parseSegmentName(n, suffix); ok {
			out = append(out, filepath.Join(dir, n))
		}
	}
	sort.Strings(out)
	return out
}

func readFileFS(t *testing.T, fs vfs.FS, path string) []byte {
	t.Helper()
	data, err := readWholeFile(fs, path)
	require.NoError(t, err)
	return data
}

func writeFileFS(t *testing.T, fs vfs.FS, path string, data []byte) {
	t.Helper()
	f, err := fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	_, err = f.WriteAt(data, 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

// TestCorruptIndexRebuild follows Kafka's LogLoaderTest.testCorruptIndexRebuild
// (and the missing-index case): after a clean shutdown, index files that
// are garbage, truncated, out of order or missing are rebuilt from the
// log, and reads and timestamp lookups give the same answers.
func TestCorruptIndexRebuild(t *testing.T) {
	damages := []struct {
		name   string
		damage func(t *testing.T, fs vfs.FS, path string, data []byte)
	}{
		{"garbage", func(t *testing.T, fs vfs.FS, path string, data []byte) {
			g := make([]byte, len(data)+24)
			for i := range g {
				g[i] = byte(i*7 + 3)
			}
			writeFileFS(t, fs, path, g)
		}},
		{"partial entry", func(t *testing.T, fs vfs.FS, path string, data []byte) {
			writeFileFS(t, fs, path, data[:len(data)-3])
		}},
		{"entries swapped", func(t *testing.T, fs vfs.FS, path string, data []byte) {
			d := append([]byte(nil), data...)
			n := len(d)
			if filepath.Ext(path) == indexSuffix {
				copy(d[n-16:], append(append([]byte(nil), data[n-8:]...), data[n-16:n-8]...))
			} else {
				copy(d[n-24:], append(append([]byte(nil), data[n-12:]...), data[n-24:n-12]...))
			}
			writeFileFS(t, fs, path, d)
		}},
		{"missing", func(t *testing.T, fs vfs.FS, path string, data []byte) {
			require.NoError(t, fs.Remove(path))
		}},
	}
	for _, dm := range damages {
		t.Run(dm.name, func(t *testing.T) {
			requireNoGoroutineLeak(t)
			fs := vfs.NewMem()
			opts := testLogOptions(fs)
			l := openLog(t, "/log", opts)
			want := appendN(t, l, 150, 1_000_000)
			require.Greater(t, len(l.segments()), 3)
			require.NoError(t, l.Close())

			idx := append(segmentFiles(t, fs, "/log", indexSuffix), segmentFiles(t, fs, "/log", timeIndexSuffix)...)
			origIndex := map[string][]byte{}
			for _, p := range idx {
				data := readFileFS(t, fs, p)
				origIndex[p] = data
				require.GreaterOrEqual(t, len(data), 24, "%s has entries to damage", p)
				dm.damage(t, fs, p, data)
			}

			l = openLog(t, "/log", opts)
			require.Equal(t, int64(450), l.LogEndOffset())
			require.Equal(t, want, readAllBatches(t, l))
			for i := 0; i < 150; i += 7 {
				off, ok, err := l.OffsetForTimestamp(1_000_000 + int64(i)*10 + 1)
				require.NoError(t, err)
				require.True(t, ok, "timestamp of batch %d", i)
				require.Equal(t, int64(i*3+1), off, "timestamp of batch %d", i)
			}
			require.NoError(t, l.Close())

			// The rebuilt offset indexes were written back, identical to the
			// originals; time indexes are valid.
			for _, p := range idx {
				data := readFileFS(t, fs, p)
				if filepath.Ext(p) == indexSuffix {
					assert.Equal(t, origIndex[p], data, "%s rebuilt", p)
				} else {
					assert.NoError(t, validateTimeEntries(data), "%s rebuilt", p)
					assert.NotEmpty(t, data, "%s rebuilt", p)
				}
			}
		})
	}
}

// TestRecoveryFixesCorruptIndex follows Kafka's
// LogSegmentTest.testRecoveryFixesCorruptIndex: after an unclean shutdown
// the recovered segments' indexes are rebuilt from the data whatever the
// index files hold.
func TestRecoveryFixesCorruptIndex(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs := vfs.NewMem()
	opts := testLogOptions(fs)
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 100, 5000)
	require.NoError(t, l.Close())
	for _, p := range segmentFiles(t, fs, "/log", indexSuffix) {
		// Valid-looking but wrong: positions that are not batch starts.
		var bad []byte
		for i := int32(1); i <= 4; i++ {
			bad = append(bad, offsetEntry(i*3, i*97)...)
		}
		writeFileFS(t, fs, p, bad)
	}
	require.NoError(t, fs.Remove("/log/"+cleanShutdownFile))
	writeFileFS(t, fs, "/log/"+recoveryPointFile, EncodeCheckpoint([][]int64{{0}}))

	l = openLog(t, "/log", opts)
	require.Equal(t, len(l.segments()), l.Stats().RecoveredSegments, "every segment was scanned")
	require.Equal(t, want, readAllBatches(t, l))
	for i := 0; i < 100; i++ {
		buf, err := l.Read(nil, int64(i*3+2), ReadOptions{MaxBytes: 1})
		require.NoError(t, err)
		b, _, err := SplitBatch(buf)
		require.NoError(t, err)
		require.Equal(t, want[i], []byte(b), "batch %d found through the rebuilt index", i)
	}
	require.NoError(t, l.Close())
}

// TestCorruptIndexConcurrentRebuild has several readers hit the lazily
// loaded, corrupt indexes of a cleanly closed log at once: the rebuild
// must happen once per segment, without races (run with -race), and every
// reader must see the right batches.
func TestCorruptIndexConcurrentRebuild(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs := vfs.NewMem()
	opts := testLogOptions(fs)
	l := openLog(t, "/log", opts)
	want := appendN(t, l, 120, 0)
	require.NoError(t, l.Close())
	orig := map[int64][]byte{}
	for _, p := range segmentFiles(t, fs, "/log", indexSuffix) {
		base, _ := parseSegmentName(filepath.Base(p), indexSuffix)
		orig[base] = readFileFS(t, fs, p)
		writeFileFS(t, fs, p, []byte("not an index"))
	}
	l = openLog(t, "/log", opts)
	const readers = 4
	errs := make(chan error, readers)
	start := make(chan struct{})
	for r := 0; r < readers; r++ {
		go func() {
			<-start
			i := 0
			for off := int64(0); off < l.LogEndOffset(); {
				buf, err := l.Read(nil, off, ReadOptions{MaxBytes: 1})
				if err != nil {
					errs <- err
					return
				}
				b, _, err := SplitBatch(buf)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(want[i], b) {
					errs <- fmt.Errorf("batch %d at offset %d differs", i, off)
					return
				}
				off = b.NextOffset()
				i++
			}
			errs <- nil
		}()
	}
	close(start)
	for r := 0; r < readers; r++ {
		require.NoError(t, <-errs)
	}
	for _, s := range l.segments() {
		s.offIdx.mu.RLock()
		got := append([]byte(nil), s.offIdx.entries...)
		s.offIdx.mu.RUnlock()
		require.Equal(t, orig[s.base], got, "segment %d: the index rebuilt once, in order", s.base)
	}
}

// TestOffsetForTimestampInRecoveredSmallSegment: recovery rebuilds the
// indexes of a sealed segment smaller than the index interval; its time
// index must still end with the segment's newest timestamp, which is what
// OffsetForTimestamp reads for a sealed segment after the next reopen.
func TestOffsetForTimestampInRecoveredSmallSegment(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	first := buildBatch(t, 2, 10, 1000)
	opts.SegmentBytes = int64(len(first)) + 1 // the second append rolls
	opts.IndexIntervalBytes = 4096
	l := openLog(t, "/log", opts)
	_, err := l.Append(first)
	require.NoError(t, err)
	_, err = l.Append(buildBatch(t, 2, 10, 2000))
	require.NoError(t, err)
	image := crashCopy(t, fs)
	require.NoError(t, l.Close())
	// As if the crash came before the roll flush checkpointed a recovery
	// point (the file may not be written yet): recovery scans both
	// segments.
	_ = image.Remove("/log/" + recoveryPointFile)
	opts.FS = image
	l = openLog(t, "/log", opts)
	require.Equal(t, 2, l.Stats().RecoveredSegments)
	require.NoError(t, l.Close())
	l = openLog(t, "/log", opts)
	require.Equal(t, 2, l.Stats().Segments)
	for ts, want := range map[int64]int64{0: 0, 1001: 1, 1500: 2, 2001: 3} {
		off, ok, err := l.OffsetForTimestamp(ts)
		require.NoError(t, err)
		require.True(t, ok, "timestamp %d", ts)
		require.Equal(t, want, off, "timestamp %d", ts)
	}
}
