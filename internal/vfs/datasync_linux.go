package vfs

import (
	"os"

	"golang.org/x/sys/unix"
)

// Datasync makes f's data durable. On Linux a real file uses fdatasync,
// which skips metadata that reads do not need (timestamps). A File with
// its own Datasync method (a wrapper) is asked to do it.
func Datasync(f File) error {
	if d, ok := f.(interface{ Datasync() error }); ok {
		return d.Datasync()
	}
	if of, ok := f.(*os.File); ok {
		for {
			err := unix.Fdatasync(int(of.Fd()))
			if err != unix.EINTR {
				if err != nil {
					return &os.PathError{Op: "fdatasync", Path: of.Name(), Err: err}
				}
				return nil
			}
		}
	}
	return f.Sync()
}
