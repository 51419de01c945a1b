//go:build !unix

package broker

import "os"

// lockDataDir does not lock on this platform.
func lockDataDir(dir string) (*os.File, error) { return nil, nil }
