//go:build !linux

package vfs

// Datasync makes f's data durable; outside Linux it is File.Sync, or the
// file's own Datasync method if it has one (a wrapper).
func Datasync(f File) error {
	if d, ok := f.(interface{ Datasync() error }); ok {
		return d.Datasync()
	}
	return f.Sync()
}
