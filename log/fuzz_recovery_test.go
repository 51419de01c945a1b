package log

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// recoveryImage is a crashed log directory for FuzzRecovery, with a
// segment whose first batches were fsynced and whose last ones were not.
type recoveryImage struct {
	fs      *vfs.MemFS
	opts    Options
	segment string   // the file FuzzRecovery damages
	synced  [][]byte // the fsynced batches, as stamped
	syncEnd int      // the segment's size at the fsync
	// produced are an idempotent producer's batches, as sent, in the
	// order appended: retried after recovery, each must be stored once.
	produced [][]byte
	// all are every batch the log held at the crash, as stamped.
	all [][]byte
	// leaps says that the batches' offsets leap (a follower's): damage
	// to a base offset that keeps them growing is then no damage recovery
	// can see (package doc).
	leaps bool
}

var (
	recoveryImagesOnce sync.Once
	recoveryImagesVal  []recoveryImage
)

// fuzzRecoveryImages builds the images once, as a killed process leaves
// the files. Both begin with synced batches of several sizes and go on
// with unsynced ones (one spanning sectors, one compressed):
//
//	0: one segment.
//	1: a rolled segment whose roll flush had not run yet (the recovery
//	   point still at its base), then a next segment with two batches:
//	   damage to the rolled one's tail is followed by a continuing segment.
//	2: one segment of idempotent producers' batches.
//	3: one segment of a follower's batches whose offsets leap, by more
//	   than 2^8 and 2^16 too.
func fuzzRecoveryImages(t *testing.T) []recoveryImage {
	recoveryImagesOnce.Do(func() {
		recoveryImagesVal = []recoveryImage{buildRecoveryImage(t, false), buildRecoveryImage(t, true),
			buildProducerImage(t), buildFollowerImage(t)}
	})
	return recoveryImagesVal
}

// imageBuilder writes a one-segment log for a recoveryImage.
type imageBuilder struct {
	fs  *vfs.MemFS
	l   *Log
	img recoveryImage
}

// newImageBuilder opens the log; the caller closes b.l.
func newImageBuilder(t *testing.T) *imageBuilder {
	fs, opts := memLog()
	opts.SegmentBytes = 1 << 20
	l, err := Open("/log", opts)
	require.NoError(t, err)
	return &imageBuilder{fs: fs, l: l, img: recoveryImage{opts: opts, segment: l.active().path(logSuffix)}}
}

// sync fsyncs what was appended: the synced batches of the image.
func (b *imageBuilder) sync(t *testing.T) {
	require.NoError(t, b.l.Sync())
	b.img.synced = readAllBatches(t, b.l)
	b.img.syncEnd = int(b.l.active().size.Load())
}

// crash returns the image: the files as a killed process leaves them.
func (b *imageBuilder) crash(t *testing.T) recoveryImage {
	img := b.img
	img.all = readAllBatches(t, b.l)
	img.fs = b.fs.CrashClone(vfs.CrashOptions{Kill: true})
	img.opts.FS = nil
	return img
}

// buildFollowerImage builds image 3: follower batches with gaps between
// them, the first three synced.
func buildFollowerImage(t *testing.T) recoveryImage {
	b := newImageBuilder(t)
	defer b.l.Close()
	b.img.leaps = true
	for i, p := range []struct {
		base     int64
		n, value int
	}{{0, 2, 16}, {10, 3, 200}, {300, 1, 16}, {301, 2, 16}, {5000, 4, 300}, {70_000, 1, 16}, {70_001, 2, 40}} {
		batch := buildBatch(t, p.n, p.value, 1000+p.base)
		Batch(batch).setBaseOffset(p.base)
		Batch(batch).setLeaderEpoch(1)
		_, err := b.l.AppendAsFollower(batch)
		require.NoError(t, err)
		if i == 2 {
			b.sync(t)
		}
	}
	return b.crash(t)
}

// buildProducerImage builds image 2: batches of three producers, the
// first three synced.
func buildProducerImage(t *testing.T) recoveryImage {
	b := newImageBuilder(t)
	defer b.l.Close()
	for i, p := range []struct {
		pid int64
		seq int32
		n   int
	}{{7, 0, 3}, {8, 0, 2}, {7, 3, 2}, {8, 2, 2}, {7, 5, 40}, {9, 0, 1}} {
		batch := idemBatch(t, p.pid, 0, p.seq, p.n, int64(100*i))
		b.img.produced = append(b.img.produced, batch)
		idemAppend(t, b.l, batch)
		if i == 2 {
			b.sync(t)
		}
	}
	return b.crash(t)
}

// buildRecoveryImage builds image 0, or with roll image 1.
func buildRecoveryImage(t *testing.T, roll bool) recoveryImage {
	b := newImageBuilder(t)
	l := b.l
	defer l.Close()
	for i, size := range []int{40, 300, 5} {
		_, err := l.Append(buildBatch(t, 1+i, size, int64(1000+i)))
		require.NoError(t, err)
	}
	b.sync(t)
	for i, size := range []int{20, 700, 90} {
		_, err := l.Append(buildBatch(t, 2, size, int64(2000+i)))
		require.NoError(t, err)
	}
	_, err := l.Append(seedBatches(t)[4]) // a compressed batch
	require.NoError(t, err)
	rpPath := filepath.Join("/log", recoveryPointFile)
	rpBefore := readFileFS(t, b.fs, rpPath)
	if roll {
		l.mu.Lock()
		err := l.roll(l.LogEndOffset())
		l.mu.Unlock()
		require.NoError(t, err)
		appendN(t, l, 2, 3000)
		// The same files every time: the roll flush done (which
		// prepared the next spare segment file), no flush running.
		waitRecoveryPoint(t, l)
		l.bg.flushMu.Lock()
		defer l.bg.flushMu.Unlock()
	}
	img := b.crash(t)
	// The crash came before the roll flush could move the recovery point.
	writeFileFS(t, img.fs, rpPath, rpBefore)
	return img
}

// damageTail applies ops to data, only ever changing bytes at or past
// from (the unsynced part), four bytes per operation: kind, a 16-bit
// position (taken modulo what the kind may touch) and a value.
//
//	0: xor the byte at the position with the value (at least 1)
//	1: set the byte at the position to the value
//	2: zero the 512-byte sector holding the position (from `from` on)
//	3: cut the file at the position
//	4: append value*4 bytes copied from the position anywhere in the file
//	   (old batches and parts of them: valid data after damage)
func damageTail(data []byte, from int, ops []byte) []byte {
	for ; len(ops) >= 4; ops = ops[4:] {
		kind, arg, v := ops[0]%5, int(binary.BigEndian.Uint16(ops[1:3])), ops[3]
		pos := from + arg%(len(data)-from+1)
		switch kind {
		case 0, 1:
			if pos == len(data) {
				continue
			}
			if kind == 0 {
				data[pos] ^= v | 1
			} else {
				data[pos] = v
			}
		case 2:
			start := max(pos/zeroSector*zeroSector, from)
			clear(data[start:min(pos/zeroSector*zeroSector+zeroSector, len(data))])
		case 3:
			data = data[:pos]
		case 4:
			src := arg % max(len(data), 1)
			data = append(data, data[src:min(src+int(v)*4, len(data))]...)
		}
	}
	return data
}

// readRecovered reads a recovered log whole: valid batches with dense
// offsets, or growing ones if leaps, where the last batch may leap anyway
// if it is not one of the first synced batches. A flip that raises the base offset (outside the
// CRC) of the last whole batch is damage recovery cannot tell from a
// follower's leap (package doc); earlier ones are refused, as the batches
// after them go backwards.
func readRecovered(t *testing.T, l *Log, synced int, leaps bool) logState {
	t.Helper()
	st := logState{start: l.LogStartOffset(), end: l.LogEndOffset()}
	var buf []byte
	for next := st.start; next < st.end; {
		var err error
		buf, err = l.Read(buf[:0], next, ReadOptions{MaxBytes: 3000})
		require.NoError(t, err, "read at %d", next)
		require.NotEmpty(t, buf, "read at %d below the log end %d", next, st.end)
		for rest := buf; len(rest) > 0; {
			b, r, err := SplitBatch(rest)
			require.NoError(t, err, "read at %d", next)
			require.NoError(t, b.Validate(), "read at %d", next)
			leapOK := leaps || len(st.batches) >= synced && b.NextOffset() == st.end
			if b.BaseOffset() != next && !(leapOK && b.BaseOffset() > next) {
				t.Fatalf("batch %d at offset %d follows one ending at %d (log end %d)", len(st.batches), b.BaseOffset(), next, st.end)
			}
			st.batches = append(st.batches, bytes.Clone(b))
			next, rest = b.NextOffset(), r
		}
	}
	return st
}

// checkRetriesStoredOnce retries every batch an idempotent producer sent:
// recovery kept each one or forgot it with its producer state, so each
// retry succeeds and, in the end, every record is in l exactly once.
func checkRetriesStoredOnce(t *testing.T, l *Log, produced [][]byte) {
	t.Helper()
	for i, b := range produced {
		_, err := l.Append(bytes.Clone(b))
		require.NoError(t, err, "retry of batch %d", i)
	}
	keys := idemRequireUnique(t, idemBatches(t, l))
	for i, b := range produced {
		b := Batch(b)
		for d := range b.LastOffsetDelta() + 1 {
			_, ok := keys[idemSeqKey{b.ProducerID(), b.ProducerEpoch(), b.BaseSequence() + d}]
			require.True(t, ok, "record %d of batch %d missing after its retry", d, i)
		}
	}
}

// onlyOriginal reports whether every batch of got is one of all.
func onlyOriginal(got, all [][]byte) bool {
	for _, b := range got {
		if !slices.ContainsFunc(all, func(a []byte) bool { return bytes.Equal(a, b) }) {
			return false
		}
	}
	return true
}

// FuzzRecovery damages the unsynced tail of a crashed log's segment (in
// one of fuzzRecoveryImages, picked by the first byte) in arbitrary ways
// (flipped and overwritten bytes, zeroed sectors, a cut, copies of old
// batches appended) and opens it (S1, S3, S4). Nothing may panic. Open
// either refuses with ErrCorrupt, changing no file, or recovers a log
// that holds every fsynced batch unchanged, reads back whole and dense
// (but see readRecovered), takes an append and reopens the same.
func FuzzRecovery(f *testing.F) {
	f.Add([]byte{})
	for image := range byte(4) { // the first byte picks the image
		f.Add([]byte{image, 0, 0, 30, 0x80})            // a flip in the first unsynced batch
		f.Add([]byte{image, 2, 0, 200, 0})              // a zeroed sector
		f.Add([]byte{image, 3, 0, 100, 0})              // a cut batch
		f.Add([]byte{image, 4, 0, 0, 60})               // the synced batches again, after the tail
		f.Add([]byte{image, 2, 0, 0, 0, 4, 0, 0, 200})  // a torn sector, then old data
		f.Add([]byte{image, 1, 0, 8, 0xff, 3, 3, 0, 0}) // a header's length, then a cut
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		images := fuzzRecoveryImages(t)
		img := images[0]
		if len(ops) > 0 {
			img, ops = images[int(ops[0])%len(images)], ops[1:]
		}
		fs := img.fs.CrashClone(vfs.CrashOptions{Kill: true})
		data := damageTail(readFileFS(t, fs, img.segment), img.syncEnd, ops)
		writeFileFS(t, fs, img.segment, data)
		before := dirFiles(t, fs)
		opts := img.opts
		opts.FS = fs
		l, err := Open("/log", opts)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			require.Equal(t, before, dirFiles(t, fs), "a refused Open changed files")
			return
		}
		st := readRecovered(t, l, len(img.synced), img.leaps)
		checkAcked(t, st, img.synced)
		extra := buildBatch(t, 2, 10, 9000)
		_, err = l.Append(extra)
		require.NoError(t, err)
		require.NoError(t, l.Close())
		l2, err := Open("/log", opts)
		require.NoError(t, err, "reopen after recovery")
		defer l2.Close()
		got := readAllBatches(t, l2)
		require.Len(t, got, len(st.batches)+1)
		for i, b := range st.batches {
			require.True(t, bytes.Equal(b, got[i]), "batch %d changed by the reopen", i)
		}
		require.Equal(t, st.end, Batch(got[len(st.batches)]).BaseOffset())
		// Damage can pass for a batch: a header (whose first 17 bytes
		// the CRC does not cover) on another batch's body, which then
		// counts in the producer state, a duplicate or out of order.
		if img.produced != nil && onlyOriginal(st.batches, img.all) {
			checkRetriesStoredOnce(t, l2, img.produced)
		}
	})
}
