package log

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"sync"
)

// rpStore keeps the recovery points of a Manager's logs in one checkpoint
// file in the data directory, Kafka's recovery-point-offset-checkpoint:
//
//	0\n            version
//	<count>\n
//	<log name> <offset>\n   count lines
//
// It also keeps, in files of the same format written by Manager.Close,
// what a standalone Log keeps in files of its own at Close: the high
// watermarks (replication-offset-checkpoint, as Kafka names it) and the
// clean-shutdown markers (clean-shutdown, holding each cleanly closed
// log's end offset). One file for all logs instead of one per log spares
// Close two fsyncs and two directory fsyncs per log, and Open one
// directory fsync per log (the marker is removed once for the whole data
// directory, before any log is opened, instead of once per log).
type rpStore struct {
	m *Manager

	mu      sync.Mutex
	offsets map[string]int64 // by log name
	dirty   bool
	// offsetsLost says the recovery-point file was there but unreadable:
	// a log without an entry may have had one (see Log.loadRecoveryPoint).
	offsetsLost bool
	// hws are the high watermarks read at OpenManager and recorded by
	// clean Closes since.
	hws map[string]int64
	// wasClean holds the log end offsets of the logs the previous Manager
	// closed cleanly; only OpenManager's opening of the logs consults it.
	wasClean map[string]int64
	// closedClean holds the logs closed cleanly since OpenManager.
	closedClean map[string]int64
	// fileLo and fileHi bound what the checkpoint file holds, by log: a
	// log in fileLo is in the file with a recovery point of at least that;
	// a log in fileHi may be in it, with at most that. They differ only
	// after a failed write, which may or may not have replaced the file.
	// Recovery after a crash starts from the file's value, which may be
	// above offsets (after a recovery or a Delete) or below them (a lazy
	// store not yet written).
	fileLo, fileHi map[string]int64

	writeMu sync.Mutex // one file write at a time
}

func newRPStore(m *Manager) rpStore {
	return rpStore{m: m, offsets: map[string]int64{}, hws: map[string]int64{},
		wasClean: map[string]int64{}, closedClean: map[string]int64{},
		fileLo: map[string]int64{}, fileHi: map[string]int64{}}
}

func (s *rpStore) path() string { return filepath.Join(s.m.dir, managerCheckpointFile) }

// load returns the recovery point of the log in dir; lost says it has
// none because the checkpoint file was unreadable.
func (s *rpStore) load(dir string) (rp int64, ok, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rp, ok = s.offsets[filepath.Base(dir)]
	return rp, ok, !ok && s.offsetsLost
}

func (s *rpStore) store(dir string, rp int64, urgent bool) error {
	s.mu.Lock()
	s.offsets[filepath.Base(dir)] = rp
	s.dirty = true
	s.mu.Unlock()
	if urgent {
		return s.write()
	}
	return nil
}

func (s *rpStore) forget(dir string) {
	name := filepath.Base(dir)
	s.mu.Lock()
	delete(s.offsets, name)
	delete(s.hws, name)
	delete(s.closedClean, name)
	s.dirty = true
	s.mu.Unlock()
}

// fileHoldsAtLeast reports whether the checkpoint file certainly holds a
// recovery point of at least min for the log in dir.
func (s *rpStore) fileHoldsAtLeast(dir string, min int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rp, ok := s.fileLo[filepath.Base(dir)]
	return ok && rp >= min
}

// fileMayExceed reports whether the checkpoint file may hold a recovery
// point above off for the log in dir.
func (s *rpStore) fileMayExceed(dir string, off int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rp, ok := s.fileHi[filepath.Base(dir)]
	return ok && rp > off
}

// fileMayHold reports whether the checkpoint file may hold a recovery
// point for the log in dir.
func (s *rpStore) fileMayHold(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.fileHi[filepath.Base(dir)]
	return ok
}

// has reports whether a recovery point is kept for dir.
func (s *rpStore) has(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.offsets[filepath.Base(dir)]
	return ok
}

// loadClean returns the log end offset at which the previous Manager
// closed the log in dir cleanly.
func (s *rpStore) loadClean(dir string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	leo, ok := s.wasClean[filepath.Base(dir)]
	return leo, ok
}

// keepClean records the logs called names as closed cleanly where the
// previous Manager closed them (no Open changed their files).
func (s *rpStore) keepClean(names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		if leo, ok := s.wasClean[name]; ok {
			s.closedClean[name] = leo
		}
	}
}

// storeClean records that the log in dir was closed cleanly at leo with
// high watermark hw; Manager.Close makes it durable.
func (s *rpStore) storeClean(dir string, leo, hw int64) {
	name := filepath.Base(dir)
	s.mu.Lock()
	s.closedClean[name] = leo
	s.hws[name] = hw
	s.mu.Unlock()
}

// loadHighWatermark returns the high watermark recorded for dir at the
// last clean close.
func (s *rpStore) loadHighWatermark(dir string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hw, ok := s.hws[filepath.Base(dir)]
	return hw, ok
}

func (s *rpStore) writeIfDirty() error {
	s.mu.Lock()
	dirty := s.dirty
	s.mu.Unlock()
	if !dirty {
		return nil
	}
	return s.write()
}

// write replaces the checkpoint file atomically with the current offsets.
func (s *rpStore) write() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	data := encodeNamedCheckpoint(s.offsets)
	written := maps.Clone(s.offsets)
	s.dirty = false
	s.mu.Unlock()
	err := writeFileAtomic(s.m.opts.Log.FS, s.path(), data)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.fileLo, s.fileHi = written, maps.Clone(written)
		return nil
	}
	s.dirty = true
	// The file holds the old offsets or the new ones.
	for name, lo := range s.fileLo {
		if rp, ok := written[name]; ok {
			s.fileLo[name] = min(lo, rp)
		} else {
			delete(s.fileLo, name)
		}
	}
	for name, rp := range written {
		if hi, ok := s.fileHi[name]; !ok || rp > hi {
			s.fileHi[name] = rp
		}
	}
	return err
}

// read loads the checkpoint files; a missing file is empty, a corrupt
// one is ignored (every log is then recovered from its start, or has no
// high watermark). It returns whether the clean-shutdown file exists.
func (s *rpStore) read() (cleanFile bool, err error) {
	if s.offsets, _, err = s.readFile(managerCheckpointFile, &s.offsetsLost); err != nil {
		return false, err
	}
	s.fileLo, s.fileHi = maps.Clone(s.offsets), maps.Clone(s.offsets)
	if s.hws, _, err = s.readFile(managerHighWatermarkFile, nil); err != nil {
		return false, err
	}
	s.wasClean, cleanFile, err = s.readFile(managerCleanShutdownFile, nil)
	return cleanFile, err
}

// readFile reads one of the named checkpoint files; exists is false when
// it is missing. An unreadable one reads as empty, and sets *unreadable
// if given.
func (s *rpStore) readFile(name string, unreadable *bool) (offsets map[string]int64, exists bool, err error) {
	path := filepath.Join(s.m.dir, name)
	data, err := readWholeFile(s.m.opts.Log.FS, path)
	if err != nil && !errors.Is(err, ErrCorrupt) { // too large to be one: corrupt
		return nil, false, err
	}
	if err == nil && data == nil {
		return map[string]int64{}, false, nil
	}
	if err == nil {
		offsets, err = decodeNamedCheckpoint(data)
	}
	if err != nil {
		s.m.opts.Log.Logger.Warn("replog/log: ignoring unreadable checkpoint", "file", path, "err", err)
		if unreadable != nil {
			*unreadable = true
		}
		return map[string]int64{}, true, nil
	}
	return offsets, true, nil
}

// prune drops the entries of logs that are not in names (a Delete cut
// short by a crash after its rename) and reports whether it dropped any.
func (s *rpStore) prune(names []string) bool {
	live := make(map[string]bool, len(names))
	for _, n := range names {
		live[n] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pruned := false
	for _, m := range []map[string]int64{s.offsets, s.hws} {
		for n := range m {
			if !live[n] {
				delete(m, n)
				pruned = true
			}
		}
	}
	s.dirty = s.dirty || pruned
	return pruned
}

// opened ends the use of the previous Manager's clean-shutdown markers:
// logs opened from now on (created ones) are recovered unless a clean
// close of this Manager is recorded for them.
func (s *rpStore) opened() {
	s.mu.Lock()
	s.wasClean, s.offsetsLost = nil, false
	s.mu.Unlock()
}

// writeClosed writes the high watermarks and then the clean-shutdown
// markers of the logs closed cleanly, at Manager.Close, after every log
// was closed.
func (s *rpStore) writeClosed() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	hws := encodeNamedCheckpoint(s.hws)
	clean := encodeNamedCheckpoint(s.closedClean)
	s.mu.Unlock()
	fs := s.m.opts.Log.FS
	if err := writeFileAtomic(fs, filepath.Join(s.m.dir, managerHighWatermarkFile), hws); err != nil {
		return err
	}
	return writeFileAtomic(fs, filepath.Join(s.m.dir, managerCleanShutdownFile), clean)
}

func encodeNamedCheckpoint(offsets map[string]int64) []byte {
	b := []byte("0\n")
	b = strconv.AppendInt(b, int64(len(offsets)), 10)
	b = append(b, '\n')
	for name, off := range offsets {
		b = append(b, name...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, off, 10)
		b = append(b, '\n')
	}
	return b
}

// decodeNamedCheckpoint parses the Manager's checkpoint text. Its size is
// bounded only by readWholeFile's limit (64 MiB: over 240,000 logs with
// 255-byte names), not by the smaller one of a log's checkpoints: a
// Manager of tens of thousands of logs with long names writes more than
// that, and ignoring its checkpoints would make every log recover.
func decodeNamedCheckpoint(data []byte) (map[string]int64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: recovery-point checkpoint: "+format, append([]any{ErrCorrupt}, args...)...)
	}
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return nil, bad("missing final newline")
	}
	lines := bytes.Split(data[:len(data)-1], []byte{'\n'})
	if len(lines) < 2 || string(lines[0]) != "0" {
		return nil, bad("unsupported version")
	}
	count, err := strconv.Atoi(string(lines[1]))
	if err != nil || count != len(lines)-2 {
		return nil, bad("count %q does not match %d lines", lines[1], len(lines)-2)
	}
	out := make(map[string]int64, count)
	for i, line := range lines[2:] {
		name, off, ok := bytes.Cut(line, []byte{' '})
		v, err := strconv.ParseInt(string(off), 10, 64)
		if !ok || err != nil || v < 0 || !validLogName(string(name)) {
			return nil, bad("line %d", i+3)
		}
		out[string(name)] = v
	}
	return out, nil
}
