//go:build !linux

package vfs

// Datasync makes f's data durable; outside Linux it is File.Sync.
func Datasync(f File) error { return f.Sync() }
