package compression

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSnappyForgedRatio checks the package doc's promise that a snappy
// block declaring more than 22 bytes per input byte is ErrCorrupt with no
// allocation on the forged length, also when the length is well under the
// limit and the block is large (so that a weakened ratio check shows).
func TestSnappyForgedRatio(t *testing.T) {
	body := make([]byte, 50000)
	declared := 22*(len(body)+3) + 1 // just over snappyMaxRatio for the block
	raw := binary.AppendUvarint(nil, uint64(declared))
	raw = append(raw, body...)
	require.Equal(t, len(body)+3, len(raw), "a 3-byte uvarint")
	framed := binary.BigEndian.AppendUint32([]byte(xerialHeader), uint32(len(raw)))
	framed = append(framed, raw...)
	for _, tt := range []struct {
		name string
		src  []byte
	}{{"raw", raw}, {"xerial", framed}} {
		t.Run(tt.name, func(t *testing.T) {
			var l Local                                 // 64 MiB limit: far above declared
			_, _ = l.Decompress(nil, []byte{0}, Snappy) // warm up
			var err error
			var got []byte
			n := allocated(func() {
				got, err = l.Decompress([]byte("head"), tt.src, Snappy)
			})
			require.ErrorIs(t, err, ErrCorrupt)
			require.Equal(t, "head", string(got))
			assert.Less(t, n, uint64(declared/4), "allocated %d bytes for a forged length of %d", n, declared)
		})
	}
}

// TestLZ4HeaderChecksumCoversContentSize checks that a frame header
// with a content size (pierrec's writer and franz-go write one) has its
// header checksum verified: HC covers FLG, BD and the content size.
func TestLZ4HeaderChecksumCoversContentSize(t *testing.T) {
	text := recordsBody(newRand(21), 4, 1024)
	block := lz4CompressedBlock(t, text)
	flg := byte(lz4FlagVersionBits | lz4FlagIndependent | lz4FlagContentSize)
	good := cat(lz4TestHeader(flg, 0x40, uint64(len(text))), lz4TestBlock(block, false, false), []byte{0, 0, 0, 0})
	var l Local
	got, err := l.Decompress(nil, good, LZ4)
	require.NoError(t, err)
	require.Equal(t, text, got)

	bad := cat(good)
	bad[14] ^= 0xFF // HC, after magic, FLG, BD and the 8-byte content size
	got, err = l.Decompress([]byte("head"), bad, LZ4)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Equal(t, "head", string(got))
}

// TestLZ4LinkedBlockStaysInFrame checks that a linked block's matches
// may only reach back into its own frame's output: not into what dst held
// before the call, nor into an earlier frame of the same stream (frames are
// independent). Such a reference is ErrCorrupt, and the output never
// depends on dst's earlier contents.
func TestLZ4LinkedBlockStaysInFrame(t *testing.T) {
	linked := byte(lz4FlagVersionBits)
	kafka := byte(lz4FlagVersionBits | lz4FlagIndependent)
	end := []byte{0, 0, 0, 0}
	// Copy 8 bytes from 16 back, then the literal "Z" (as in TestLZ4Frames).
	backRef := []byte{0x04, 16, 0, 0x10, 'Z'}
	prefix := []byte("0123456789abcdefghij")
	tests := []struct {
		name  string
		dst   []byte
		frame []byte
	}{
		{"into dst", prefix, cat(lz4TestHeader(linked, 0x40, 0), lz4TestBlock(backRef, false, false), end)},
		{"into an earlier frame", []byte("head"), cat(
			lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(prefix, true, false), end,
			lz4TestHeader(linked, 0x40, 0), lz4TestBlock(backRef, false, false), end)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Local
			dst := append([]byte(nil), tt.dst...)
			got, err := l.Decompress(dst, tt.frame, LZ4)
			require.ErrorIs(t, err, ErrCorrupt, "decoded %q", got)
			require.Equal(t, string(tt.dst), string(got))
		})
	}
}

// TestGrowthStaysWithinLimit checks the Limits section of the package
// doc: the output buffer never grows past dst's length plus the limit (plus
// 64 bytes for zstd), also when dst is long and full, so that growing it
// the way append does (doubling) would overshoot.
func TestGrowthStaysWithinLimit(t *testing.T) {
	const limit = 64 << 10
	json := recordsBody(newRand(7), 80, 1024)
	for _, c := range []Codec{Gzip, Snappy, LZ4, Zstd} {
		for _, v := range compressVariants(t, c, json[:limit]) {
			t.Run(fmt.Sprintf("%s/%s", c, v.name), func(t *testing.T) {
				l := NewLocal(Options{MaxDecompressedSize: limit})
				dst := make([]byte, 4*limit) // len == cap: any output grows it
				got, err := l.Decompress(dst, v.data, c)
				require.NoError(t, err)
				require.Equal(t, json[:limit], got[len(dst):])
				assert.LessOrEqual(t, cap(got), len(dst)+limit+zstdSlack, "grew by %d bytes for a %d byte limit", cap(got)-len(dst), limit)
			})
		}
	}
}
