package compression

import (
	"bytes"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestZstdSmallBodyCarriesItsContentSize: Compress promises a zstd frame
// with its content size. For bodies under 256 bytes klauspost wrote
// multi-segment frames without one, and Decompress into a nil dst then
// sized its output for a whole 128 KiB block: per small batch, the
// allocation DESIGN.md lesson 3 is about.
func TestZstdSmallBodyCarriesItsContentSize(t *testing.T) {
	var l Local
	for _, n := range []int{1, 100, 255} {
		body := bytes.Repeat([]byte("abcdefgh"), n/8+1)[:n]
		z, err := l.Compress(nil, body, Zstd, DefaultLevel)
		require.NoError(t, err)
		var h zstd.Header
		require.NoError(t, h.Decode(z))
		assert.True(t, h.HasFCS, "%d-byte body: frame header has no content size", n)
		out, err := l.Decompress(nil, z, Zstd)
		require.NoError(t, err)
		require.Equal(t, body, out)
		assert.LessOrEqual(t, cap(out), 4096, "%d-byte body decompressed into a %d-byte buffer", n, cap(out))
	}
}
