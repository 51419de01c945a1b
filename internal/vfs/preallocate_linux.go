package vfs

import (
	"os"

	"golang.org/x/sys/unix"
)

// Preallocate allocates disk space for the first size bytes of f without
// changing its size (fallocate with FALLOC_FL_KEEP_SIZE), so that later
// writes there do not allocate blocks one page at a time. It is a hint:
// files of other filesystems (MemFS), and filesystems that cannot do it,
// are left as they are and nil is returned. A File with its own
// Preallocate method (a wrapper) is asked to do it. Truncating the file
// to its size releases what was allocated past it.
func Preallocate(f File, size int64) error {
	if p, ok := f.(interface{ Preallocate(int64) error }); ok {
		return p.Preallocate(size)
	}
	of, ok := f.(*os.File)
	if !ok || size <= 0 {
		return nil
	}
	for {
		err := unix.Fallocate(int(of.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, size)
		switch err {
		case nil, unix.EOPNOTSUPP, unix.ENOSYS:
			return nil
		case unix.EINTR:
			continue
		}
		return &os.PathError{Op: "fallocate", Path: of.Name(), Err: err}
	}
}
