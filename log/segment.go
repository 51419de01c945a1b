package log

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replog/replog/internal/vfs"
)

// File name suffixes, as Kafka names them.
const (
	logSuffix       = ".log"
	indexSuffix     = ".index"
	timeIndexSuffix = ".timeindex"
	deletedSuffix   = ".deleted"
	tmpSuffix       = ".tmp"
)

// segConfig is what every segment of a log shares.
type segConfig struct {
	fs       vfs.FS
	dir      string
	interval int        // index interval bytes
	files    *fileCache // nil: segment files stay open
}

// openFile opens a segment file, through the Manager's file cache when
// the log belongs to one.
func (c segConfig) openFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if c.files != nil {
		return c.files.openFile(name, flag, perm)
	}
	return c.fs.OpenFile(name, flag, perm)
}

// segmentName is the 20-digit, zero-padded base offset Kafka uses.
func segmentName(base int64) string { return fmt.Sprintf("%020d", base) }

// segment is one .log file with its .index and .timeindex. Only the Log's
// appender (holding Log.mu) changes it; readers use the atomic fields and
// the indexes, which are safe for concurrent use.
type segment struct {
	base     int64
	interval int // index interval bytes
	fs       vfs.FS
	dir      string
	file     vfs.File
	size     atomic.Int64 // bytes readers may read: whole, written batches
	next     atomic.Int64 // offset after the last batch
	maxTS    atomic.Int64 // largest batch max timestamp, or NoTimestamp
	durable  atomic.Int64 // bytes known to be fsynced
	syncMu   sync.Mutex   // serializes fsyncs of file (see Log.syncSegment)
	// deleted is set once s is no longer part of the log (its files
	// renamed to *.deleted): a Sync that listed it before skips it, since
	// the flusher may close its file at any time after (under syncMu).
	deleted atomic.Bool
	offIdx  offsetIndex
	timeIdx timeIndex
	// loadMu serializes loading (or rebuilding) the indexes of a segment
	// whose index files are read lazily, by concurrent readers.
	loadMu sync.Mutex
	// loading is set while loadMu's holder loads or rebuilds the indexes:
	// a rebuild marks them loaded before it has refilled them.
	loading atomic.Bool

	// appender-only state
	sinceIndex int           // bytes appended since the last index entry
	relOfMaxTS int32         // relative offset of the batch holding maxTS
	rollBase   time.Time     // when the segment was created (or reopened)
	jitter     time.Duration // subtracted from the roll age
	spareAsked bool          // the next segment's spare file was requested

	// tail is the last batch the appender wrote, for reads at the end.
	tail tailBatch

	// deletedTag goes between a deleted segment's file names and
	// ".deleted" (flusher.renameDeleted), set under the flusher's
	// flushMu.
	deletedTag string
}

func (s *segment) path(suffix string) string {
	return filepath.Join(s.dir, segmentName(s.base)+suffix)
}

// deletedPath is the name of s's file with suffix once s is deleted.
func (s *segment) deletedPath(suffix string) string {
	return s.path(suffix) + s.deletedTag + deletedSuffix
}

func newSegmentValue(c segConfig, base int64, f vfs.File, indexesLoaded bool) *segment {
	s := &segment{base: base, interval: c.interval, fs: c.fs, dir: c.dir, file: f}
	s.offIdx = offsetIndex{newIndex(s.path(indexSuffix), offsetEntrySize, indexesLoaded)}
	s.timeIdx = timeIndex{newIndex(s.path(timeIndexSuffix), timeEntrySize, indexesLoaded)}
	s.next.Store(base)
	s.maxTS.Store(NoTimestamp)
	return s
}

// createSegment creates an empty segment whose first offset is base.
// Stale files of the same name (from a truncation) are replaced.
func createSegment(c segConfig, base int64, now time.Time) (*segment, error) {
	name := filepath.Join(c.dir, segmentName(base)+logSuffix)
	f, err := c.openFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return newEmptySegment(c, base, f, now), nil
}

// newEmptySegment makes the segment for f, an empty file that was just
// given the name of a segment starting at base.
func newEmptySegment(c segConfig, base int64, f vfs.File, now time.Time) *segment {
	s := newSegmentValue(c, base, f, true)
	// Index files of the same name may be left from a truncated segment.
	// Rather than removing them here, on the append path (a directory
	// operation, which waits behind the flusher's directory fsyncs), the
	// indexes' first flush rewrites them from the start: until then the
	// segment lies past the recovery point, so recovery rebuilds them.
	s.offIdx.dirty, s.timeIdx.dirty = true, true
	s.rollBase = now
	return s
}

// openSegment opens an existing segment file; its indexes load lazily.
func openSegment(c segConfig, base int64) (*segment, error) {
	f, err := c.openFile(filepath.Join(c.dir, segmentName(base)+logSuffix), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	s := newSegmentValue(c, base, f, false)
	s.size.Store(st.Size())
	s.durable.Store(st.Size())
	return s, nil
}

// indexBatch records index entries for a batch written at pos.
func (s *segment) indexBatch(b Batch, pos int64) {
	if s.sinceIndex >= s.interval {
		rel := int32(b.LastOffset() - s.base)
		s.offIdx.append(rel, int32(pos))
		s.timeIdx.maybeAppend(s.maxTS.Load(), s.relOfMaxTS)
		s.sinceIndex = 0
	}
	s.sinceIndex += len(b)
}

// loadIndexes makes sure the segment's index entries are in memory,
// rebuilding them from the log file when the index files are missing or
// invalid.
func (s *segment) loadIndexes(maxBatch int) error {
	if s.offIdx.isLoaded() && s.timeIdx.isLoaded() && !s.loading.Load() {
		return nil
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if s.offIdx.isLoaded() && s.timeIdx.isLoaded() {
		// Loaded (or rebuilt) while this call waited for loadMu: a
		// rebuild that failed to read unloads them, so they are whole.
		return nil
	}
	s.loading.Store(true)
	defer s.loading.Store(false)
	size := s.size.Load()
	if size > 0 && (!s.indexFileExists(s.offIdx.path) || !s.indexFileExists(s.timeIdx.path)) {
		return s.rebuild(maxBatch).err
	}
	errO := s.offIdx.ensureLoaded(s.fs, func(d []byte) error { return validateOffsetEntries(d, size) })
	errT := s.timeIdx.ensureLoaded(s.fs, validateTimeEntries)
	if errO == nil && errT == nil {
		return nil
	}
	if !errors.Is(errO, ErrCorrupt) && errO != nil {
		return errO
	}
	if !errors.Is(errT, ErrCorrupt) && errT != nil {
		return errT
	}
	return s.rebuild(maxBatch).err
}

// indexFileExists reports whether an index file is present. A missing
// index of a non-empty segment is rebuilt, not taken as empty: an empty
// time index would hide the segment from timestamp lookups and retention.
func (s *segment) indexFileExists(path string) bool {
	_, err := s.fs.Stat(path)
	return !os.IsNotExist(err)
}

// readAt reads committed bytes at pos into p, stopping at the committed
// size. It returns the number of bytes read.
func (s *segment) readAt(p []byte, pos int64) (int, error) {
	size := s.size.Load()
	if pos >= size {
		return 0, nil
	}
	if int64(len(p)) > size-pos {
		p = p[:size-pos]
	}
	n, err := s.file.ReadAt(p, pos)
	if err == io.EOF && n == len(p) {
		err = nil
	}
	if err == io.EOF {
		err = fmt.Errorf("%w: segment %s ends at %d, before its size %d", ErrCorrupt, s.path(logSuffix), pos+int64(n), size)
	}
	return n, err
}

// batchHeaderAt reads the header of the batch at pos and checks the fields
// needed to step over it.
func (s *segment) batchHeaderAt(pos int64, hdr *[BatchHeaderSize]byte) (Batch, error) {
	n, err := s.readAt(hdr[:], pos)
	if err != nil {
		return nil, err
	}
	if n < BatchHeaderSize {
		return nil, fmt.Errorf("%w: partial batch header at position %d of %s", ErrCorrupt, pos, s.path(logSuffix))
	}
	b := Batch(hdr[:])
	return b, s.checkHeaderAt(b, pos)
}

// checkHeaderAt checks the fields of the header b, of the batch at pos,
// that readers step over batches by.
func (s *segment) checkHeaderAt(b Batch, pos int64) error {
	if b.Magic() != MagicV2 || b.Length() < BatchHeaderSize-LogOverhead || pos+int64(b.Size()) > s.size.Load() {
		return fmt.Errorf("%w: bad batch header at position %d of %s", ErrCorrupt, pos, s.path(logSuffix))
	}
	// The header is not verified by its CRC here (that needs the whole
	// batch), yet readers step over batches by it: a damaged last offset
	// delta or base offset would make them skip data or stop early. The
	// offsets must lie in the segment's range [base, next).
	if base, next := b.BaseOffset(), s.next.Load(); base < s.base || base >= next ||
		b.LastOffsetDelta() < 0 || int64(b.LastOffsetDelta()) >= next-base {
		return fmt.Errorf("%w: batch at position %d of %s has offsets [%d, %d] outside the segment's [%d, %d)",
			ErrCorrupt, pos, s.path(logSuffix), base, b.LastOffset(), s.base, next)
	}
	return nil
}

// headerPool holds buffers for batch headers. A buffer passed to a
// file's ReadAt escapes to the heap: taking it from the pool keeps reads
// free of allocations.
var headerPool = sync.Pool{New: func() any { return new([BatchHeaderSize]byte) }}

// find returns the position of the first batch whose last offset is >=
// offset, with its header in hdr, or ok=false when there is none in this
// segment.
func (s *segment) find(offset int64, maxBatch int, hdr *[BatchHeaderSize]byte) (pos int64, ok bool, err error) {
	pos, _, ok, err = s.findAfter(offset, maxBatch, hdr, false)
	return pos, ok, err
}

// findRemembered is find that answers from the remembered last batch
// (tailBatch) when offset falls in it, without reading the file. The
// header it gives is the one appended, not the file's: a caller that
// reads the batch must check that the file holds that header, since a
// base offset damaged on disk (it is outside the CRC) would go unseen.
func (s *segment) findRemembered(offset int64, maxBatch int, hdr *[BatchHeaderSize]byte) (pos int64, ok bool, err error) {
	if pos, ok := s.tail.find(offset, s.size.Load(), hdr); ok {
		return pos, true, nil
	}
	return s.find(offset, maxBatch, hdr)
}

// findAfter is find that also returns where the batch before the one
// found ends in the segment (its base if there is none), exactly if
// exactPrev, which may cost a header read more: a gap of a follower's may
// lie between the two. When none is found, prevNext is where the
// segment's last batch ends, from its data rather than its next offset,
// which for a sealed segment not yet scanned is the next one's base.
func (s *segment) findAfter(offset int64, maxBatch int, hdr *[BatchHeaderSize]byte, exactPrev bool) (pos, prevNext int64, ok bool, err error) {
	if err := s.loadIndexes(maxBatch); err != nil {
		return 0, 0, false, err
	}
	rel := offset - s.base
	if exactPrev {
		// From an entry whose batch ends below offset, so the scan passes
		// the batch before the one found.
		rel--
	}
	if rel > math.MaxInt32 {
		rel = math.MaxInt32
	}
	if rel < 0 {
		rel = 0
	}
	entryRel, pos, indexed := s.offIdx.lookupEntry(int32(rel))
	size := s.size.Load()
	prevNext = s.base
	for pos < size {
		b, err := s.batchHeaderAt(pos, hdr)
		if err != nil {
			return 0, 0, false, err
		}
		if indexed && b.LastOffset() != s.base+int64(entryRel) {
			// An index entry holds the last offset of the batch at its
			// position: a header that disagrees is damaged (or the index).
			return 0, 0, false, fmt.Errorf("%w: batch at position %d of %s ends at offset %d, its index entry says %d",
				ErrCorrupt, pos, s.path(logSuffix), b.LastOffset(), s.base+int64(entryRel))
		}
		indexed = false
		if b.BaseOffset() < prevNext {
			return 0, 0, false, fmt.Errorf("%w: batch at position %d of %s starts at offset %d, before the previous batch ends (%d)",
				ErrCorrupt, pos, s.path(logSuffix), b.BaseOffset(), prevNext)
		}
		if b.LastOffset() >= offset {
			return pos, prevNext, true, nil
		}
		prevNext = b.NextOffset()
		pos += int64(b.Size())
	}
	return 0, prevNext, false, nil
}

// dataEnd is where the segment's last batch ends, read from its data: a
// sealed segment not yet scanned has the next segment's base as its next
// offset, which a follower's gap may lie before.
func (s *segment) dataEnd(maxBatch int) (int64, error) {
	var hdr [BatchHeaderSize]byte
	_, end, _, err := s.findAfter(math.MaxInt64, maxBatch, &hdr, true)
	return end, err
}

// rewriteData writes the segment's committed bytes back in place, read
// through buf, so that the next fsync writes them to disk. A failed fsync
// on Linux marks the pages it could not write clean: they still read back
// but no later fsync writes them ("fsyncgate"). Recovery cannot tell
// whether a process before it hit that, so it rewrites what it trusts.
func (s *segment) rewriteData(buf []byte) error {
	size := s.size.Load()
	for pos := int64(0); pos < size; {
		n, err := s.readAt(buf, pos)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrNoProgress
		}
		if _, err := s.file.WriteAt(buf[:n], pos); err != nil {
			return err
		}
		pos += int64(n)
	}
	return nil
}

// close closes the segment's file.
func (s *segment) close() error { return s.file.Close() }

// flushIndexes writes the index files and optionally fsyncs them.
func (s *segment) flushIndexes(sync bool) error {
	if err := s.offIdx.flush(s.fs, sync); err != nil {
		return err
	}
	return s.timeIdx.flush(s.fs, sync)
}
