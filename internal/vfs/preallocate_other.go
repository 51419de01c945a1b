//go:build !linux

package vfs

// Preallocate is a hint that does nothing outside Linux, unless f has its
// own Preallocate method (a wrapper).
func Preallocate(f File, size int64) error {
	if p, ok := f.(interface{ Preallocate(int64) error }); ok {
		return p.Preallocate(size)
	}
	return nil
}
