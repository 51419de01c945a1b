package compression

import (
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Interoperability with the reference implementations of each format:
// what they write decodes with Decompress, and what Compress writes decodes
// with them.

// snappyRaw returns src as one raw snappy block, as librdkafka and franz-go
// write it.
func snappyRaw(src []byte) []byte { return snappy.Encode(nil, src) }

type pierrecOpts struct {
	block      int  // maximum block size
	contentSum bool // content checksum
	blockSum   bool // block checksums
	size       bool // declare the content size
	level      lz4.CompressionLevel
}

// pierrecLZ4 returns src as an LZ4 frame written by pierrec's frame writer.
func pierrecLZ4(t testing.TB, src []byte, o pierrecOpts) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := lz4.NewWriter(&buf)
	opts := []lz4.Option{
		lz4.BlockSizeOption(lz4.BlockSize(o.block)),
		lz4.ChecksumOption(o.contentSum),
		lz4.BlockChecksumOption(o.blockSum),
		lz4.CompressionLevelOption(o.level),
	}
	if o.size {
		opts = append(opts, lz4.SizeOption(uint64(len(src))))
	}
	require.NoError(t, w.Apply(opts...))
	_, err := w.Write(src)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// zstdStream returns src as a zstd frame written by klauspost's streaming
// encoder: no content size, with a checksum, as zstd-jni's stream writes
// it.
func zstdStream(t testing.TB, src []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(true))
	require.NoError(t, err)
	_, err = w.Write(src)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// forgeGzipISize returns src gzipped, with the trailer's size replaced.
func forgeGzipISize(t testing.TB, src []byte, isize uint32) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := stdgzip.NewWriter(&buf)
	_, err := w.Write(src)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	b := buf.Bytes()
	binary.LittleEndian.PutUint32(b[len(b)-4:], isize)
	return b
}

func TestLZ4FromPierrec(t *testing.T) {
	var l Local
	inputs := testInputs()
	for _, o := range []pierrecOpts{
		{block: 64 << 10},
		{block: 64 << 10, contentSum: true, blockSum: true, size: true},
		{block: 256 << 10, contentSum: true},
		{block: 1 << 20, size: true},
		{block: 4 << 20, contentSum: true}, // pierrec's defaults, as franz-go writes
		{block: 4 << 20, blockSum: true, level: lz4.Level5},
	} {
		for _, in := range inputs {
			name := fmt.Sprintf("block=%d/sum=%t/bsum=%t/size=%t/level=%d/%s", o.block, o.contentSum, o.blockSum, o.size, o.level, in.name)
			t.Run(name, func(t *testing.T) {
				got, err := l.Decompress(nil, pierrecLZ4(t, in.data, o), LZ4)
				require.NoError(t, err)
				require.True(t, bytes.Equal(in.data, got))
			})
		}
	}
}

func TestLZ4ToPierrec(t *testing.T) {
	var l Local
	for _, level := range testLevels[LZ4] {
		for _, in := range testInputs() {
			t.Run(fmt.Sprintf("level=%d/%s", level, in.name), func(t *testing.T) {
				z, err := l.Compress(nil, in.data, LZ4, level)
				require.NoError(t, err)
				got, err := io.ReadAll(lz4.NewReader(bytes.NewReader(z)))
				require.NoError(t, err)
				require.True(t, bytes.Equal(in.data, got))
			})
		}
	}
}

func TestGzipInterop(t *testing.T) {
	var l Local
	for _, in := range testInputs() {
		t.Run(in.name, func(t *testing.T) {
			// Ours, read by the standard library.
			z, err := l.Compress(nil, in.data, Gzip, DefaultLevel)
			require.NoError(t, err)
			zr, err := stdgzip.NewReader(bytes.NewReader(z))
			require.NoError(t, err)
			got, err := io.ReadAll(zr)
			require.NoError(t, err)
			require.True(t, bytes.Equal(in.data, got))

			// The standard library's, with header fields and two members.
			var buf bytes.Buffer
			for _, part := range [][]byte{in.data[:len(in.data)/2], in.data[len(in.data)/2:]} {
				w, err := stdgzip.NewWriterLevel(&buf, stdgzip.BestSpeed)
				require.NoError(t, err)
				w.Name, w.Comment = "batch.json", "two members"
				_, err = w.Write(part)
				require.NoError(t, err)
				require.NoError(t, w.Close())
			}
			got, err = l.Decompress(nil, buf.Bytes(), Gzip)
			require.NoError(t, err)
			require.True(t, bytes.Equal(in.data, got))
		})
	}
	// A bad CRC is corruption.
	z, err := l.Compress(nil, []byte("checksummed"), Gzip, DefaultLevel)
	require.NoError(t, err)
	z[len(z)-8] ^= 1
	_, err = l.Decompress(nil, z, Gzip)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestZstdInterop(t *testing.T) {
	var l Local
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	require.NoError(t, err)
	defer dec.Close()
	for _, in := range testInputs() {
		t.Run(in.name, func(t *testing.T) {
			// Ours, read by klauspost's streaming decoder.
			z, err := l.Compress(nil, in.data, Zstd, DefaultLevel)
			require.NoError(t, err)
			require.NoError(t, dec.Reset(bytes.NewReader(z)))
			got, err := io.ReadAll(dec)
			require.NoError(t, err)
			require.True(t, bytes.Equal(in.data, got))

			// A stream without content size, with a checksum, twice.
			s := zstdStream(t, in.data)
			got, err = l.Decompress(nil, append(bytes.Clone(s), s...), Zstd)
			require.NoError(t, err)
			require.True(t, bytes.Equal(append(bytes.Clone(in.data), in.data...), got))
		})
	}
	// A bad checksum is corruption.
	s := zstdStream(t, []byte("checksummed"))
	s[len(s)-1] ^= 1
	_, err = l.Decompress(nil, s, Zstd)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestSnappyInterop(t *testing.T) {
	var l Local
	for _, in := range testInputs() {
		t.Run(in.name, func(t *testing.T) {
			// Ours, read by klauspost's xerial decoder.
			z, err := l.Compress(nil, in.data, Snappy, DefaultLevel)
			require.NoError(t, err)
			got, err := xerial.Decode(z)
			require.NoError(t, err)
			require.True(t, bytes.Equal(in.data, got))

			// klauspost's xerial framing and a raw block.
			for _, enc := range [][]byte{xerial.Encode(nil, in.data), snappyRaw(in.data)} {
				got, err := l.Decompress(nil, enc, Snappy)
				require.NoError(t, err)
				require.True(t, bytes.Equal(in.data, got))
			}
		})
	}
}

// TestSnappyXerialLayout checks that Compress writes what snappy-java's
// SnappyOutputStream writes: the 16-byte header, then chunks of at most
// 32 KiB of input, each a length and a raw block.
func TestSnappyXerialLayout(t *testing.T) {
	var l Local
	for _, in := range testInputs() {
		t.Run(in.name, func(t *testing.T) {
			z, err := l.Compress(nil, in.data, Snappy, DefaultLevel)
			require.NoError(t, err)
			require.Equal(t, []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1}, z[:16])
			p, total := 16, 0
			for p < len(z) {
				n := int(binary.BigEndian.Uint32(z[p:]))
				p += 4
				k, err := s2.DecodedLen(z[p : p+n])
				require.NoError(t, err)
				require.Equal(t, min(32<<10, len(in.data)-total), k)
				total += k
				p += n
			}
			require.Equal(t, len(z), p)
			require.Equal(t, len(in.data), total)
		})
	}
	got, err := l.Decompress([]byte("head"), []byte(xerialHeader), Snappy)
	require.NoError(t, err)
	assert.Equal(t, "head", string(got), "a header alone is an empty stream")
}
