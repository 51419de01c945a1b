package compression

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoLimitDoesNotOverflow: MaxDecompressedSize math.MaxInt (the
// natural way to say "no limit") once made every gzip and zstd Decompress
// panic: the window arithmetic (len(dst)+room+1) overflowed. The limit is
// now capped at MaxDecompressedSizeCap.
func TestNoLimitDoesNotOverflow(t *testing.T) {
	body := bytes.Repeat([]byte("replog "), 100)
	for _, c := range []Codec{Gzip, Zstd} {
		t.Run(c.String(), func(t *testing.T) {
			var l0 Local
			z, err := l0.Compress(nil, body, c, DefaultLevel)
			require.NoError(t, err)
			l := NewLocal(Options{MaxDecompressedSize: math.MaxInt})
			var out []byte
			require.NotPanics(t, func() { out, err = l.Decompress(nil, z, c) })
			require.NoError(t, err)
			require.Equal(t, body, out)
		})
	}
}
