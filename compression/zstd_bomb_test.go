package compression

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rleBomb is a zstd frame without a content size (8 MiB window) of n RLE
// blocks of 128 KiB each: 4 bytes of input per 128 KiB of output.
func rleBomb(n int) []byte {
	f := binary.LittleEndian.AppendUint32(nil, zstdMagic)
	f = append(f, 0x00, 13<<3) // frame header descriptor; window descriptor: 8 MiB
	for i := range n {
		bh := uint32(zstdMaxBlock)<<3 | 1<<1 // RLE
		if i == n-1 {
			bh |= 1 // last
		}
		f = append(f, byte(bh), byte(bh>>8), byte(bh>>16), 'z')
	}
	return f
}

// A zstd bomb whose limit lies just above a step of unzstd's fourfold
// growth: each attempt that runs out of room costs its buffer and the
// decoder's reallocation of it (it appends the block that crosses the
// buffer's end before it checks), so the failed attempts must stay small
// against the last for the call to cost about 2.5 times the limit (the
// package doc) rather than 5.
func TestZstdBombNearAGrowthStep(t *testing.T) {
	const limit = 16<<20 + 64<<10
	src := rleBomb(2 * limit / zstdMaxBlock)
	l := NewLocal(Options{MaxDecompressedSize: limit})
	_, err := l.Decompress(nil, rleBomb(1), Zstd) // warm up
	require.NoError(t, err)
	n := allocated(func() { _, err = l.Decompress(nil, src, Zstd) })
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Less(t, n, uint64(3*limit), "%d bytes of input allocated %d bytes (%.2f times the limit)", len(src), n, float64(n)/limit)
}

// A slice Decompress returned is not overwritten by later calls on the
// same Local, on a Local taken back from a Pool, or by failing calls.
func TestDecompressOutputsAreNotAliased(t *testing.T) {
	a := bytes.Repeat([]byte("replog-a "), 50000)
	b := bytes.Repeat([]byte("REPLOG-B!"), 50000)
	p := NewPool(Options{})
	for _, c := range []Codec{Gzip, Snappy, LZ4, Zstd} {
		l := p.Get()
		za, err := l.Compress(nil, a, c, DefaultLevel)
		require.NoError(t, err)
		zb, err := l.Compress(nil, b, c, DefaultLevel)
		require.NoError(t, err)
		outA, err := l.Decompress(nil, za, c)
		require.NoError(t, err, c)
		p.Put(l)
		l2 := p.Get()
		outB, err := l2.Decompress(nil, zb, c)
		require.NoError(t, err, c)
		_, _ = l2.Decompress(nil, zb[:len(zb)/2], c)      // truncated
		_, _ = l2.Decompress(outB[:0], za[:len(za)/2], c) // failing, into outB's array
		require.True(t, bytes.Equal(outA, a), "%s: the first output was overwritten", c)
		p.Put(l2)
	}
}
