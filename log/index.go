package log

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/replog/replog/internal/vfs"
)

// Index entry sizes (see the package documentation for the layouts).
const (
	offsetEntrySize = 8  // relative offset i32, position i32
	timeEntrySize   = 12 // timestamp i64, relative offset i32
)

// index is a sparse, sorted index of fixed-size entries belonging to one
// segment: the offset index or the time index. Entries are kept in memory
// and written to the file at flush points (roll, Sync of a closed segment,
// Close); after an unclean shutdown the indexes of the segments being
// recovered are rebuilt from the log file, so the file may lag behind.
// The entries of an inactive segment are read from the file on first use.
//
// Safe for concurrent use: the appender adds entries while readers look up.
type index struct {
	mu        sync.RWMutex
	path      string
	entrySize int
	entries   []byte
	loaded    bool // entries reflect the file (or were built in memory)
	written   int  // bytes of entries known to be in the file
	dirty     bool // the file needs rewriting from 0 (after truncation)
	// synced is how many bytes of entries the file is known to hold
	// durably (-1: unknown), so an unchanged index is not fsynced again.
	synced int
}

func newIndex(path string, entrySize int, loaded bool) *index {
	return &index{path: path, entrySize: entrySize, loaded: loaded, synced: -1}
}

// ensureLoaded reads the index file if its entries are not in memory yet.
// Callers hold no lock.
func (x *index) ensureLoaded(fs vfs.FS, validate func([]byte) error) error {
	x.mu.RLock()
	ok := x.loaded
	x.mu.RUnlock()
	if ok {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.loaded {
		return nil
	}
	data, err := readWholeFileMax(fs, x.path, x.maxFileBytes(fs))
	if err != nil {
		return err
	}
	if len(data)%x.entrySize != 0 {
		return fmt.Errorf("%w: index %s has %d bytes, not a multiple of %d", ErrCorrupt, x.path, len(data), x.entrySize)
	}
	if err := validate(data); err != nil {
		return fmt.Errorf("index %s: %w", x.path, err)
	}
	x.entries, x.loaded, x.written = data, true, len(data)
	if data != nil {
		x.synced = len(data)
	}
	return nil
}

// isLoaded reports whether the entries are in memory.
func (x *index) isLoaded() bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.loaded
}

func (x *index) count() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.entries) / x.entrySize
}

// add appends an entry (already encoded in e).
func (x *index) add(e []byte) {
	x.mu.Lock()
	x.entries = append(x.entries, e...)
	x.mu.Unlock()
}

// search returns the index of the last entry whose key (decoded by key)
// is <= target, or -1.
func (x *index) search(target int64, key func([]byte) int64) (int, []byte) {
	n := len(x.entries) / x.entrySize
	i := sort.Search(n, func(i int) bool {
		return key(x.entries[i*x.entrySize:]) > target
	}) - 1
	if i < 0 {
		return -1, nil
	}
	return i, x.entries[i*x.entrySize : (i+1)*x.entrySize]
}

// truncateEntries drops every entry from the first whose key is >= limit.
func (x *index) truncateEntries(limit int64, key func([]byte) int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := len(x.entries) / x.entrySize
	i := sort.Search(n, func(i int) bool { return key(x.entries[i*x.entrySize:]) >= limit })
	if i < n {
		x.entries = x.entries[:i*x.entrySize]
		x.dirty = true
	}
}

// reset drops all entries (before a rebuild).
func (x *index) reset() {
	x.mu.Lock()
	x.entries, x.loaded, x.dirty = x.entries[:0], true, true
	x.mu.Unlock()
}

// unload undoes a reset whose rebuild could not finish: the index is to
// be loaded (or rebuilt) again at its next use, not taken as empty.
func (x *index) unload() {
	x.mu.Lock()
	x.entries, x.loaded, x.dirty = x.entries[:0], false, false
	x.mu.Unlock()
}

// flush writes entries not yet in the file and, if sync, fsyncs it. The
// file is created if missing.
func (x *index) flush(fs vfs.FS, sync bool) error {
	x.mu.RLock()
	if !x.loaded {
		x.mu.RUnlock()
		return nil
	}
	from := x.written
	if x.dirty {
		from = 0
	}
	data := x.entries[from:len(x.entries):len(x.entries)]
	end := len(x.entries)
	dirty := x.dirty
	unchanged := !dirty && from == end && x.synced == end
	x.mu.RUnlock()
	if unchanged {
		return nil // the file already holds exactly these entries, durably
	}

	f, err := fs.OpenFile(x.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return openErr(err)
	}
	_, err = f.WriteAt(data, int64(from))
	if err == nil && dirty {
		err = f.Truncate(int64(end))
	}
	if err == nil && sync {
		err = vfs.Datasync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	x.mu.Lock()
	if len(x.entries) >= end {
		x.written = end
		if dirty {
			x.dirty = false
		}
		if sync {
			x.synced = end
		}
	}
	x.mu.Unlock()
	return nil
}

// offsetIndex maps relative offsets to file positions.
type offsetIndex struct{ *index }

func offsetKey(e []byte) int64 { return int64(int32(binary.BigEndian.Uint32(e))) }

func (x offsetIndex) append(rel, pos int32) {
	var e [offsetEntrySize]byte
	binary.BigEndian.PutUint32(e[0:], uint32(rel))
	binary.BigEndian.PutUint32(e[4:], uint32(pos))
	x.add(e[:])
}

// lookup returns the file position to start scanning from to find rel:
// that of the greatest entry <= rel, or 0.
func (x offsetIndex) lookup(rel int32) int64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, e := x.search(int64(rel), offsetKey)
	if e == nil {
		return 0
	}
	return int64(binary.BigEndian.Uint32(e[4:]))
}

// lookupEntry is lookup returning the entry found: the relative last
// offset of the batch at pos, or ok=false (pos 0) when no entry is <= rel.
func (x offsetIndex) lookupEntry(rel int32) (entryRel int32, pos int64, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, e := x.search(int64(rel), offsetKey)
	if e == nil {
		return 0, 0, false
	}
	return int32(binary.BigEndian.Uint32(e)), int64(binary.BigEndian.Uint32(e[4:])), true
}

// validateOffsetEntries checks that relative offsets and positions both
// increase strictly and that positions lie within the log file.
func validateOffsetEntries(data []byte, logSize int64) error {
	prevRel, prevPos := int64(-1), int64(-1)
	for i := 0; i+offsetEntrySize <= len(data); i += offsetEntrySize {
		rel := int64(int32(binary.BigEndian.Uint32(data[i:])))
		pos := int64(int32(binary.BigEndian.Uint32(data[i+4:])))
		if rel <= prevRel || pos <= prevPos || pos >= logSize || rel < 0 {
			return fmt.Errorf("%w: offset index entry %d (%d, %d) out of order or past the log", ErrCorrupt, i/offsetEntrySize, rel, pos)
		}
		prevRel, prevPos = rel, pos
	}
	return nil
}

// timeIndex maps timestamps to relative offsets.
type timeIndex struct{ *index }

func timeKey(e []byte) int64 { return int64(binary.BigEndian.Uint64(e)) }

func timeRelOffset(e []byte) int64 { return int64(int32(binary.BigEndian.Uint32(e[8:]))) }

// lastTimestamp returns the newest entry's timestamp, or NoTimestamp.
func (x timeIndex) last() (ts int64, rel int32, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if len(x.entries) < timeEntrySize {
		return NoTimestamp, 0, false
	}
	e := x.entries[len(x.entries)-timeEntrySize:]
	return timeKey(e), int32(timeRelOffset(e)), true
}

// maybeAppend adds (ts, rel) if ts is newer than the last entry.
func (x timeIndex) maybeAppend(ts int64, rel int32) {
	if last, lastRel, ok := x.last(); ok && (ts <= last || rel < lastRel) {
		return
	}
	var e [timeEntrySize]byte
	binary.BigEndian.PutUint64(e[0:], uint64(ts))
	binary.BigEndian.PutUint32(e[8:], uint32(rel))
	x.add(e[:])
}

// lookup returns the relative offset to start from for timestamp ts: that
// of the greatest entry whose timestamp is <= ts... minus nothing; callers
// scan forward from the returned offset.
func (x timeIndex) lookup(ts int64) int32 {
	if ts == math.MinInt64 {
		return 0 // every record is at least that new (and ts-1 would wrap)
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	// The entry with the greatest timestamp strictly below ts marks a point
	// before which no record has a timestamp >= ts.
	_, e := x.search(ts-1, timeKey)
	if e == nil {
		return 0
	}
	return int32(timeRelOffset(e))
}

// lookupEntry is lookup returning the entry found: its timestamp and
// relative offset, or ok=false when no entry is older than ts.
func (x timeIndex) lookupEntry(ts int64) (entryTS int64, rel int32, ok bool) {
	if ts == math.MinInt64 {
		return NoTimestamp, 0, false // no entry is older (and ts-1 would wrap)
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, e := x.search(ts-1, timeKey)
	if e == nil {
		return NoTimestamp, 0, false
	}
	return timeKey(e), int32(timeRelOffset(e)), true
}

// validateTimeEntries checks that timestamps and offsets do not decrease.
func validateTimeEntries(data []byte) error {
	prevTS, prevRel := int64(-1<<63), int64(-1)
	for i := 0; i+timeEntrySize <= len(data); i += timeEntrySize {
		ts, rel := timeKey(data[i:]), timeRelOffset(data[i:])
		if ts < prevTS || rel < prevRel || rel < 0 {
			return fmt.Errorf("%w: time index entry %d out of order", ErrCorrupt, i/timeEntrySize)
		}
		prevTS, prevRel = ts, rel
	}
	return nil
}

// maxFileBytes bounds the size of a valid index file from the size of
// its segment's .log file: every entry names a distinct batch (the time
// index adds at most one entry, at roll or Close, and an initial one per
// segment), and a batch takes at least BatchHeaderSize bytes. This holds
// whatever Options.MaxIndexBytes was when the file was written, and
// keeps a damaged or sparse file from making a load allocate more.
func (x *index) maxFileBytes(fs vfs.FS) int64 {
	stem := strings.TrimSuffix(strings.TrimSuffix(x.path, indexSuffix), timeIndexSuffix)
	st, err := fs.Stat(stem + logSuffix)
	if err != nil {
		return maxSnapshotBytes // unknown: a generous bound still
	}
	return (st.Size()/BatchHeaderSize + 2) * int64(x.entrySize)
}

// maxSnapshotBytes bounds what readWholeFile reads: checkpoint files,
// and index files whose segment is unknown. A larger file is reported as
// corrupt instead of being allocated for.
const maxSnapshotBytes = 64 << 20

// maxProducerSnapshotBytes bounds a producer-state snapshot that Open or
// TruncateTo reads: a 10-byte header and at most 159 bytes per producer
// id, so about 6.7 million producer ids, whose state in memory takes more
// than that. The encoder has no bound, and a larger snapshot is taken for
// a corrupt one and deleted (the state is then rebuilt from the log).
const maxProducerSnapshotBytes = 1 << 30

// readWholeFile reads a small file completely; a missing file is empty. A
// file of more than maxSnapshotBytes is not read: the error wraps
// ErrCorrupt.
func readWholeFile(fs vfs.FS, path string) ([]byte, error) {
	return readWholeFileMax(fs, path, maxSnapshotBytes)
}

// readWholeFileMax is readWholeFile for a file of at most limit bytes.
func readWholeFileMax(fs vfs.FS, path string, limit int64) ([]byte, error) {
	f, err := fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%w: %s has %d bytes, more than the %d it can validly hold", ErrCorrupt, path, st.Size(), limit)
	}
	data := make([]byte, st.Size())
	n, err := f.ReadAt(data, 0)
	if err != nil && err != io.EOF {
		return nil, err
	}
	return data[:n], nil
}

// floorPosition returns the greatest indexed batch position <= p, or 0.
func (x offsetIndex) floorPosition(p int64) int64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := len(x.entries) / offsetEntrySize
	i := sort.Search(n, func(i int) bool {
		return int64(binary.BigEndian.Uint32(x.entries[i*offsetEntrySize+4:])) > p
	}) - 1
	if i < 0 {
		return 0
	}
	return int64(binary.BigEndian.Uint32(x.entries[i*offsetEntrySize+4:]))
}
