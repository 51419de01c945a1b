//go:build !unix && !windows

package vfs

import "os"

// lockFile locks nothing where the platform has no file locks Go reaches.
func lockFile(*os.File) error { return nil }
