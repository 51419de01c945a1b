package compression

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPoolConcurrent(t *testing.T) {
	p := NewPool(Options{MaxDecompressedSize: 1 << 20})
	rng := newRand(30)
	bodies := make([][]byte, 8)
	for i := range bodies {
		bodies[i] = recordsBody(rng, 1+i, 512)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(allCodecs))
	for g := range 4 {
		for _, c := range allCodecs {
			wg.Go(func() {
				var z, out []byte
				for i := range 10 {
					body := bodies[(g+i)%len(bodies)]
					var err error
					if z, err = p.Compress(z[:0], body, c, DefaultLevel); err != nil {
						errs <- err
						return
					}
					if out, err = p.Decompress(out[:0], z, c); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(body, out) {
						errs <- fmt.Errorf("%s: round trip differs", c)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestPoolLimit(t *testing.T) {
	p := NewPool(Options{MaxDecompressedSize: 1000})
	var l Local
	z, err := l.Compress(nil, make([]byte, 1001), LZ4, DefaultLevel)
	require.NoError(t, err)
	_, err = p.Decompress(nil, z, LZ4)
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Equal(t, 1000, p.Get().MaxDecompressedSize())
}

func TestPoolZeroValue(t *testing.T) {
	var p Pool
	z, err := p.Compress(nil, []byte("hello"), Zstd, DefaultLevel)
	require.NoError(t, err)
	got, err := p.Decompress(nil, z, Zstd)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	assert.Equal(t, DefaultMaxDecompressedSize, p.Get().MaxDecompressedSize())
}

// TestPoolPutForeign checks that a Local configured differently is not
// handed out by a Pool.
func TestPoolPutForeign(t *testing.T) {
	p := NewPool(Options{MaxDecompressedSize: 100})
	for range 10 {
		p.Put(NewLocal(Options{}))
		p.Put(nil)
	}
	for range 10 {
		assert.Equal(t, 100, p.Get().MaxDecompressedSize())
	}
}
