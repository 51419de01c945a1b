package log

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/replog/replog/internal/vfs"
)

// lockFileName is the file a Log locks in its directory, and a Manager in
// its data directory, while open (Kafka's log directories have the same).
const lockFileName = ".lock"

// lockDir locks dir's lock file, or fails with ErrLocked if another Log
// or Manager, in this process or another, holds it.
func lockDir(fs vfs.FS, dir string) (io.Closer, error) {
	c, err := vfs.Lock(fs, filepath.Join(dir, lockFileName))
	switch {
	case errors.Is(err, vfs.ErrLocked):
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	case err != nil:
		return nil, fmt.Errorf("replog/log: lock %s: %w", dir, err)
	}
	return c, nil
}

// noDirLock stands for the lock of a Manager's log, which the Manager's
// lock on its data directory covers.
type noDirLock struct{}

func (noDirLock) Close() error { return nil }
