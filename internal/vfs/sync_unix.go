//go:build !windows

package vfs

import "os"

func syncDirFile(d *os.File) error { return d.Sync() }
