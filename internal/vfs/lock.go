package vfs

import (
	"errors"
	"io"
	"os"
)

// ErrLocked is returned by Lock when another process, or another open in
// this one, holds the lock.
var ErrLocked = errors.New("vfs: locked by another user")

// Locker is an FS that can lock a file for as long as the Closer it
// returns stays open, against other processes and other locks of the
// same file in this one.
type Locker interface {
	Lock(name string) (io.Closer, error)
}

// Lock locks name (creating it if missing) through fs when fs is a
// Locker. Other filesystems (the in-memory one, which no other process
// sees) lock nothing: the Closer they get does nothing.
func Lock(fs FS, name string) (io.Closer, error) {
	if l, ok := fs.(Locker); ok {
		return l.Lock(name)
	}
	return noLock{}, nil
}

type noLock struct{}

func (noLock) Close() error { return nil }

// Lock takes an exclusive lock on name, failing at once with ErrLocked
// if another holds it (flock on Unix, LockFileEx on Windows; nothing
// elsewhere). The lock goes with the file's descriptor: closing it, or
// the process ending, releases it.
func (osFS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := lockFile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// Lock locks name through the wrapped FS, without fault injection.
func (e *ErrorFS) Lock(name string) (io.Closer, error) { return Lock(e.inner, name) }
