package log

import (
	"bytes"
	"fmt"
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
type rpStore struct {
	m *Manager

	mu      sync.Mutex
	offsets map[string]int64 // by log name
	dirty   bool

	writeMu sync.Mutex // one file write at a time
}

func (s *rpStore) path() string { return filepath.Join(s.m.dir, managerCheckpointFile) }

func (s *rpStore) load(dir string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rp, ok := s.offsets[filepath.Base(dir)]
	return rp, ok
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
	s.mu.Lock()
	delete(s.offsets, filepath.Base(dir))
	s.dirty = true
	s.mu.Unlock()
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
	s.dirty = false
	s.mu.Unlock()
	if err := writeFileAtomic(s.m.opts.Log.FS, s.path(), data); err != nil {
		s.mu.Lock()
		s.dirty = true
		s.mu.Unlock()
		return err
	}
	return nil
}

// read loads the checkpoint file; a missing file is empty, a corrupt one
// is ignored (every log is then recovered from its start).
func (s *rpStore) read() error {
	data, err := readWholeFile(s.m.opts.Log.FS, s.path())
	if err != nil || data == nil {
		return err
	}
	offsets, err := decodeNamedCheckpoint(data)
	if err != nil {
		s.m.opts.Log.Logger.Warn("replog/log: ignoring unreadable recovery-point checkpoint", "dir", s.m.dir, "err", err)
		return nil
	}
	s.offsets = offsets
	return nil
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

// decodeNamedCheckpoint parses the Manager's checkpoint text.
func decodeNamedCheckpoint(data []byte) (map[string]int64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: recovery-point checkpoint: "+format, append([]any{ErrCorrupt}, args...)...)
	}
	if len(data) > maxCheckpointBytes || len(data) == 0 || data[len(data)-1] != '\n' {
		return nil, bad("bad size or missing final newline")
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
