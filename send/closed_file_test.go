package send_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// A closed *os.File, as destination or as a region's source, gives an
// error matching os.ErrClosed, as File.Write's does and whatever path the
// Builder takes: on Linux the raw connection's error ("use of closed
// file", internal to package os) used to come back as is.
func TestClosedFilesGiveErrClosed(t *testing.T) {
	t.Run("destination", func(t *testing.T) {
		out, err := os.Create(filepath.Join(t.TempDir(), "out"))
		require.NoError(t, err)
		require.NoError(t, out.Close())
		var b send.Builder
		b.AddBytes([]byte("hello"))
		n, err := b.WriteTo(out)
		assert.Zero(t, n)
		require.ErrorIs(t, err, os.ErrClosed)
	})
	for _, size := range []int64{1 << 10, 1 << 20} { // read, and sent by sendfile
		t.Run("source", func(t *testing.T) {
			f, _ := tempFile(t, 2<<20, 40)
			client, server := connPair(t, "tcp")
			col := collect(server, false)
			var b send.Builder
			require.NoError(t, b.AddFile(f, 0, size))
			require.NoError(t, f.Close())
			n, err := b.WriteTo(client)
			closeWrite(t, client)
			col.Wait(t)
			assert.Zero(t, n)
			require.ErrorIs(t, err, os.ErrClosed, "region of %d bytes", size)
		})
	}
}
