package log

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Producer-state snapshot file, <offset>.snapshot, where offset is the
// log end offset the state reflects (see the package documentation for
// the layout).
const (
	snapshotSuffix     = ".snapshot"
	snapshotVersion    = 1
	snapshotHeaderSize = 10 // version i16, crc u32, count i32
	snapshotEntrySize  = 19 // pid i64, epoch i16, lastTimestamp i64, batches i8
	snapshotBatchSize  = 28 // firstSeq i32, lastSeq i32, lastOffset i64, offsetDelta i32, timestamp i64
)

// encodeSnapshot serialises the producer state.
func encodeSnapshot(dst []byte, ps *producerState) []byte {
	be := binary.BigEndian
	need := snapshotHeaderSize
	for i := range ps.entries {
		need += snapshotEntrySize + int(ps.entries[i].n)*snapshotBatchSize
	}
	if cap(dst)-len(dst) < need {
		// Room for twice as much: the buffer comes back for the next
		// roll (flusher.snapBuf), and a state that grows from roll to
		// roll then does not need a new one every time.
		dst = slices.Grow(dst, 2*need)
	}
	start := len(dst)
	dst = be.AppendUint16(dst, snapshotVersion)
	dst = be.AppendUint32(dst, 0) // crc, set below
	dst = be.AppendUint32(dst, uint32(ps.count()))
	for i := range ps.entries {
		pid, e := ps.entries[i].pid, &ps.entries[i].producerEntry
		dst = be.AppendUint64(dst, uint64(pid))
		dst = be.AppendUint16(dst, uint16(e.epoch))
		dst = be.AppendUint64(dst, uint64(e.lastTimestamp))
		dst = append(dst, byte(e.n))
		for _, m := range e.batches[:e.n] {
			dst = be.AppendUint32(dst, uint32(m.firstSeq))
			dst = be.AppendUint32(dst, uint32(m.lastSeq))
			dst = be.AppendUint64(dst, uint64(m.lastOffset))
			dst = be.AppendUint32(dst, uint32(m.offsetDelta))
			dst = be.AppendUint64(dst, uint64(m.timestamp))
		}
	}
	snap := dst[start:]
	be.PutUint32(snap[2:], crc32.Checksum(snap[6:], castagnoli))
	return dst
}

// DecodeSnapshot parses a producer-state snapshot, checking version, CRC
// and every count against the bytes present. It returns the number of
// producers; errors wrap ErrCorrupt.
func DecodeSnapshot(data []byte) (int, error) {
	ps, err := decodeSnapshot(data)
	return len(ps), err
}

func decodeSnapshot(data []byte) (map[int64]*producerEntry, error) {
	be := binary.BigEndian
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: producer snapshot: "+format, append([]any{ErrCorrupt}, args...)...)
	}
	if len(data) < snapshotHeaderSize {
		return nil, bad("%d bytes", len(data))
	}
	if v := be.Uint16(data); v != snapshotVersion {
		return nil, bad("version %d", v)
	}
	if got, want := crc32.Checksum(data[6:], castagnoli), be.Uint32(data[2:]); got != want {
		return nil, bad("crc %08x, stored %08x", got, want)
	}
	count := int64(be.Uint32(data[6:]))
	body := data[snapshotHeaderSize:]
	if count > int64(len(body)/snapshotEntrySize) {
		return nil, bad("%d producers in %d bytes", count, len(body))
	}
	out := make(map[int64]*producerEntry, count)
	for i := int64(0); i < count; i++ {
		if len(body) < snapshotEntrySize {
			return nil, bad("truncated entry %d", i)
		}
		pid := int64(be.Uint64(body))
		e := &producerEntry{epoch: int16(be.Uint16(body[8:])), lastTimestamp: int64(be.Uint64(body[10:])), n: int(body[18])}
		body = body[snapshotEntrySize:]
		if e.n > producerBatchesKept || len(body) < e.n*snapshotBatchSize {
			return nil, bad("entry %d has %d batches", i, e.n)
		}
		for j := 0; j < e.n; j++ {
			b := body[j*snapshotBatchSize:]
			e.batches[j] = batchMeta{
				firstSeq: int32(be.Uint32(b)), lastSeq: int32(be.Uint32(b[4:])),
				lastOffset: int64(be.Uint64(b[8:])), offsetDelta: int32(be.Uint32(b[16:])),
				timestamp: int64(be.Uint64(b[20:])),
			}
		}
		body = body[e.n*snapshotBatchSize:]
		if _, dup := out[pid]; dup {
			return nil, bad("producer %d twice", pid)
		}
		out[pid] = e
	}
	if len(body) != 0 {
		return nil, bad("%d bytes after the last entry", len(body))
	}
	return out, nil
}

// snapshotFiles tracks the snapshot files of a log directory.
type snapshotFiles struct {
	mu      sync.Mutex
	offsets []int64 // sorted
}

func (sf *snapshotFiles) add(off int64) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	i := sort.Search(len(sf.offsets), func(i int) bool { return sf.offsets[i] >= off })
	if i < len(sf.offsets) && sf.offsets[i] == off {
		return
	}
	sf.offsets = append(sf.offsets, 0)
	copy(sf.offsets[i+1:], sf.offsets[i:])
	sf.offsets[i] = off
}

func (sf *snapshotFiles) remove(off int64) bool {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	for i, o := range sf.offsets {
		if o == off {
			sf.offsets = append(sf.offsets[:i], sf.offsets[i+1:]...)
			return true
		}
	}
	return false
}

func (sf *snapshotFiles) list() []int64 {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return append([]int64(nil), sf.offsets...)
}

func (l *Log) snapshotPath(off int64) string {
	return filepath.Join(l.dir, segmentName(off)+snapshotSuffix)
}

// writeSnapshot writes data as the snapshot for offset off: temporary
// file, fsync, rename. The caller fsyncs the directory.
func (l *Log) writeSnapshot(off int64, data []byte) error {
	path := l.snapshotPath(off)
	start := time.Now()
	if err := replaceFile(l.opts.FS, path, data); err != nil {
		return fmt.Errorf("write producer snapshot %s: %w", path, err)
	}
	l.stats.snapshotNanos.Add(int64(time.Since(start)))
	l.snapshots.add(off)
	l.dirDirty.Store(true)
	l.stats.snapshotsWritten.Add(1)
	return nil
}

// deleteSnapshot removes the snapshot file for off, if any.
func (l *Log) deleteSnapshot(off int64) error {
	if !l.snapshots.remove(off) {
		return nil
	}
	if err := l.opts.FS.Remove(l.snapshotPath(off)); err != nil && !os.IsNotExist(err) {
		return err
	}
	l.dirDirty.Store(true)
	return nil
}

// scanSnapshots lists the snapshot files in the directory.
func (l *Log) scanSnapshots(names []string) {
	for _, n := range names {
		if off, ok := parseSegmentName(n, snapshotSuffix); ok && !strings.HasSuffix(n, tmpSuffix) {
			l.snapshots.add(off)
		}
	}
}
