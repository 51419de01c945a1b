package send_test

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/send"
)

// A region far past the end of its file, at an offset beyond the largest
// file the file system holds (ext4: 16 TiB), is ErrRegionPastEOF on both
// paths, as the contract says: pread finds the end of the file, and
// sendfile's EOVERFLOW there must agree.
func TestRegionAtAHugeOffsetIsPastEOF(t *testing.T) {
	f, _ := tempFile(t, 4096, 1)
	for _, off := range []int64{1 << 50, math.MaxInt64 - 1<<20} {
		for _, socket := range []bool{false, true} {
			var b send.Builder
			b.AddBytes([]byte("head"))
			require.NoError(t, b.AddFile(f, off, 1<<20)) // over ReadThreshold: sendfile to a socket
			var n int64
			var err error
			if socket {
				client, server := connPair(t, "tcp")
				go func() { _, _ = io.Copy(io.Discard, server) }()
				n, err = b.WriteTo(client)
			} else {
				n, err = b.WriteTo(new(bytes.Buffer))
			}
			require.ErrorIs(t, err, send.ErrRegionPastEOF, "offset %#x, socket %v", off, socket)
			require.Equal(t, int64(4), n, "offset %#x, socket %v", off, socket)
		}
	}
}

// A tmpfs file holds data at offsets past the largest file of ext4 (16 TiB
// less 4 KiB). Sent to a file on ext4 (the temporary directory here),
// sendfile refuses those offsets with EOVERFLOW, also after sending the
// bytes below them, while pread reads them: the response goes out whole.
// Where the temporary directory is not on a file system with a smaller
// limit, this passes either way.
func TestSendfileOverflowFallsBackToReading(t *testing.T) {
	const ext4Max = 0xFFFFFFFF000
	srcPath := filepath.Join("/dev/shm", "replog-send-"+t.Name())
	src, err := os.Create(srcPath)
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	t.Cleanup(func() { src.Close(); os.Remove(srcPath) })
	data := randomBytes(256<<10, 2)
	base := int64(ext4Max - 128<<10)
	if _, err := src.WriteAt(data, base); err != nil {
		t.Skip("/dev/shm does not take the offset:", err)
	}
	for _, tc := range []struct {
		name   string
		off, n int64 // within data
	}{
		{"starts past the ext4 limit", 160 << 10, 64 << 10},
		{"crosses the ext4 limit", 64 << 10, 128 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst, err := os.Create(filepath.Join(t.TempDir(), "out"))
			require.NoError(t, err)
			defer dst.Close()
			var b send.Builder
			b.AddBytes([]byte("head"))
			require.NoError(t, b.AddFile(src, base+tc.off, tc.n))
			n, err := b.WriteTo(dst)
			require.NoError(t, err)
			require.Equal(t, 4+tc.n, n)
			got, err := os.ReadFile(dst.Name())
			require.NoError(t, err)
			require.True(t, bytes.Equal(got, append([]byte("head"), data[tc.off:tc.off+tc.n]...)), "wrong bytes")
		})
	}
}
