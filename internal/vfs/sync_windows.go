//go:build windows

package vfs

import "os"

// Windows cannot fsync a directory handle; renames there are made durable by
// the filesystem's own journal, so this is a no-op.
func syncDirFile(d *os.File) error { return nil }
