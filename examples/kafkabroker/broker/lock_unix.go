//go:build unix

package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDataDir takes an exclusive lock on dir/.lock, as Kafka does, so that
// a second broker on the same data directory fails before it opens (and
// recovers, truncating) the logs the first one is writing.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("broker: data directory %s is in use by another broker: %w", dir, err)
	}
	return f, nil
}
