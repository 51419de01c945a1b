package log

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/replog/replog/internal/vfs"
)

// Checkpoint files are small versioned text files (see the package
// documentation): a version line, a count line, then count lines of
// space-separated decimal integers.
const (
	checkpointVersion = 0
	// maxCheckpointBytes bounds what a checkpoint read may allocate.
	maxCheckpointBytes = 16 << 20

	recoveryPointFile  = "recovery-point"
	logStartOffsetFile = "log-start-offset"
	cleanShutdownFile  = "clean-shutdown"
)

// EncodeCheckpoint renders rows in the checkpoint text format.
func EncodeCheckpoint(rows [][]int64) []byte {
	var b []byte
	b = strconv.AppendInt(b, checkpointVersion, 10)
	b = append(b, '\n')
	b = strconv.AppendInt(b, int64(len(rows)), 10)
	b = append(b, '\n')
	for _, r := range rows {
		for i, v := range r {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, v, 10)
		}
		b = append(b, '\n')
	}
	return b
}

// DecodeCheckpoint parses checkpoint text whose rows have exactly fields
// integers each (decimal, as strconv.ParseInt reads them, so a sign or
// leading zeros pass, as in Kafka). Anything else is an error wrapping
// ErrCorrupt.
func DecodeCheckpoint(data []byte, fields int) ([][]int64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: checkpoint: "+format, append([]any{ErrCorrupt}, args...)...)
	}
	if len(data) > maxCheckpointBytes {
		return nil, bad("%d bytes, limit %d", len(data), maxCheckpointBytes)
	}
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return nil, bad("missing final newline")
	}
	lines := bytes.Split(data[:len(data)-1], []byte{'\n'})
	if len(lines) < 2 {
		return nil, bad("missing version or count line")
	}
	version, err := strconv.ParseInt(string(lines[0]), 10, 32)
	if err != nil || version != checkpointVersion {
		return nil, bad("unsupported version line %q", lines[0])
	}
	count, err := strconv.ParseInt(string(lines[1]), 10, 32)
	if err != nil || count < 0 || count != int64(len(lines)-2) {
		return nil, bad("count line %q does not match %d entries", lines[1], len(lines)-2)
	}
	rows := make([][]int64, 0, count)
	for i, line := range lines[2:] {
		parts := bytes.Split(line, []byte{' '})
		if len(parts) != fields {
			return nil, bad("line %d has %d fields, want %d", i+3, len(parts), fields)
		}
		row := make([]int64, fields)
		for j, p := range parts {
			if row[j], err = strconv.ParseInt(string(p), 10, 64); err != nil {
				return nil, bad("line %d: %v", i+3, err)
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// writeFileAtomic replaces path with data durably: write a temporary file,
// fsync it, rename it over path, fsync the directory.
func writeFileAtomic(fs vfs.FS, path string, data []byte) error {
	err := replaceFile(fs, path, data)
	if err == nil {
		switch derr := fs.SyncDir(filepath.Dir(path)); {
		case derr == nil:
		case transientOpenError(derr):
			err = derr // the directory could not be opened: no fsync ran
		default:
			err = fmt.Errorf("%w: %w", errDirSync, derr)
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// errDirSync marks a failed writeFileAtomic whose rename was done but
// whose directory fsync failed: which contents the file has after a crash
// is unknown, and a later directory fsync proves nothing (see
// syncDirIfDirty). An earlier failure left the file as it was; a
// directory that could not be opened for want of descriptors
// (transientOpenError) ran no fsync, and is not marked either.
var errDirSync = errors.New("directory fsync failed")

// replaceFile writes data to a temporary file, fsyncs it and renames it
// over path; the caller fsyncs the directory.
func replaceFile(fs vfs.FS, path string, data []byte) error {
	tmp := path + tmpSuffix
	f, err := fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return openErr(err)
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, path)
	}
	return err
}

// writeCheckpoint writes rows to path atomically.
func writeCheckpoint(fs vfs.FS, path string, rows [][]int64) error {
	return writeFileAtomic(fs, path, EncodeCheckpoint(rows))
}

// readCheckpoint reads a checkpoint; ok is false when the file is missing.
func readCheckpoint(fs vfs.FS, path string, fields int) (rows [][]int64, ok bool, err error) {
	st, err := fs.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	if st.Size() > maxCheckpointBytes {
		return nil, false, fmt.Errorf("%w: checkpoint %s has %d bytes", ErrCorrupt, path, st.Size())
	}
	data, err := readWholeFile(fs, path)
	if err != nil {
		return nil, false, err
	}
	rows, err = DecodeCheckpoint(data, fields)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	return rows, true, nil
}

// readOffsetCheckpoint reads a one-offset checkpoint file.
func readOffsetCheckpoint(fs vfs.FS, path string) (int64, bool, error) {
	rows, ok, err := readCheckpoint(fs, path, 1)
	if err != nil || !ok {
		return 0, ok, err
	}
	if len(rows) != 1 {
		return 0, false, fmt.Errorf("%w: %s has %d entries, want 1", ErrCorrupt, path, len(rows))
	}
	return rows[0][0], true, nil
}

// writeOffsetCheckpoint writes a one-offset checkpoint file.
func writeOffsetCheckpoint(fs vfs.FS, path string, off int64) error {
	return writeCheckpoint(fs, path, [][]int64{{off}})
}
