// Package vfs is the filesystem seam of replog: the small set of operations
// the log needs, with a real implementation (Default, backed by package os)
// and test implementations that can crash (dropping unsynced data) or fail
// on demand (see NewMem, NewErrorFS).
//
// Contract relied upon by the log:
//   - Data written to a File is durable only after File.Sync returned nil.
//   - A created, renamed or removed directory entry is durable only after
//     SyncDir on its directory returned nil.
//   - Rename replaces the target atomically.
//
// Test filesystems: NewMem returns a MemFS, an in-memory FS that enforces
// exactly this contract. It remembers, for every file, its data as of the
// last Sync and, for every directory, its entries as of the last SyncDir;
// MemFS.CrashClone returns a new MemFS holding only that durable state, as
// after a power loss, optionally keeping a seeded random part of what was not
// synced (CrashOptions). NewErrorFS wraps any FS, numbers every FS and File
// operation from 0 and asks an Injector before each whether it fails: FailAt
// fails the n-th operation (once or from then on, for all kinds or some, with
// short writes), Crash fails the n-th operation and everything after it
// and gives the CrashClone of that moment once the workload stopped. Injected errors wrap ErrInjected and their cause
// (syscall.EIO, syscall.ENOSPC, ErrCrashed), so errors.Is matches both.
// A failed File.Sync of a MemFS file behaves as on Linux ("fsyncgate"):
// the unsynced data stays readable, but no later Sync makes it durable
// until it is written again.
package vfs

import (
	"io"
	"os"
)

// File is an open file. *os.File satisfies it, so the real filesystem hands
// out *os.File values and callers may type-assert to reach sendfile.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	// Sync makes the file's data durable.
	Sync() error
	// Truncate changes the file's size.
	Truncate(size int64) error
	// Stat returns the file's metadata; only Size is relied upon.
	Stat() (os.FileInfo, error)
	// Name returns the name the file was opened with.
	Name() string
}

// FS is a filesystem. Implementations are safe for concurrent use.
type FS interface {
	// OpenFile opens name with os.O_* flags, like os.OpenFile.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// Remove removes a file or an empty directory.
	Remove(name string) error
	// RemoveAll removes a directory tree.
	RemoveAll(name string) error
	// Rename renames oldname to newname, replacing newname if it exists.
	Rename(oldname, newname string) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(dir string, perm os.FileMode) error
	// ReadDir returns the names of the entries of dir, sorted.
	ReadDir(dir string) ([]string, error)
	// Stat returns a file's metadata.
	Stat(name string) (os.FileInfo, error)
	// SyncDir makes the directory's entries durable.
	SyncDir(dir string) error
}

// Default is the real filesystem.
var Default FS = osFS{}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                 { return os.RemoveAll(name) }
func (osFS) Rename(oldname, newname string) error        { return os.Rename(oldname, newname) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFS) Stat(name string) (os.FileInfo, error)       { return os.Stat(name) }

func (osFS) ReadDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = syncDirFile(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
