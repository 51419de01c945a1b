//go:build !linux

package send

import "io"

// fastState is empty where the socket path (writev, sendfile) is not
// implemented.
type fastState struct{}

// writeFast never handles a writer here: every writer takes the portable
// path.
func (b *Builder) writeFast(w io.Writer) (n int64, handled bool, err error) {
	return 0, false, nil
}
