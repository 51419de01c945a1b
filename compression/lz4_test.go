package compression

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const lz4FlagVersionBits = 0x40 // FLG version 01

func TestXXH32(t *testing.T) {
	// Reference values of XXH32 with seed 0 (xxHash's test vectors, also
	// what pierrec/lz4 writes as content checksums).
	tests := []struct {
		in   string
		want uint32
	}{
		{"", 0x02CC5D05},
		{"a", 0x550D7456},
		{"abc", 0x32D153FF},
		{"Nobody inspects the spammish repetition", 0xE2293B2F},
		{"0123456789abcdef0123456789abcdefxyz", 0x4F2D26C0},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, xxh32([]byte(tt.in), 0), "%q", tt.in)
	}
}

// TestXXH32MatchesPierrec checks every input length up to 100 and a few
// long ones against the content checksums pierrec's frame writer computes.
func TestXXH32MatchesPierrec(t *testing.T) {
	data := randomBytes(20, 100<<10)
	sizes := []int{1000, 4096, 65537, 100 << 10}
	for n := range 100 {
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		var buf bytes.Buffer
		w := lz4.NewWriter(&buf)
		require.NoError(t, w.Apply(lz4.ChecksumOption(true), lz4.BlockSizeOption(lz4.Block256Kb)))
		_, err := w.Write(data[:n])
		require.NoError(t, err)
		require.NoError(t, w.Close())
		frame := buf.Bytes()
		require.Equal(t, binary.LittleEndian.Uint32(frame[len(frame)-4:]), xxh32(data[:n], 0), "length %d", n)
	}
}

func TestLZ4KafkaHeaderChecksum(t *testing.T) {
	assert.Equal(t, byte(lz4KafkaHC), byte(xxh32([]byte{lz4KafkaFLG, lz4KafkaBD}, 0)>>8))
}

// lz4TestHeader returns a frame header with a correct header checksum.
// contentSize is written when flg asks for it.
func lz4TestHeader(flg, bd byte, contentSize uint64) []byte {
	h := []byte{0x04, 0x22, 0x4D, 0x18, flg, bd}
	if flg&lz4FlagContentSize != 0 {
		h = binary.LittleEndian.AppendUint64(h, contentSize)
	}
	if flg&lz4FlagDictID != 0 {
		h = binary.LittleEndian.AppendUint32(h, 7)
	}
	return append(h, byte(xxh32(h[4:], 0)>>8))
}

// lz4TestBlock returns a data block: its size field, data and, when sum,
// its checksum.
func lz4TestBlock(data []byte, raw, sum bool) []byte {
	size := uint32(len(data))
	if raw {
		size |= lz4Uncompressed
	}
	b := binary.LittleEndian.AppendUint32(nil, size)
	b = append(b, data...)
	if sum {
		b = binary.LittleEndian.AppendUint32(b, xxh32(data, 0))
	}
	return b
}

// lz4CompressedBlock returns data as one independent LZ4 block.
func lz4CompressedBlock(t *testing.T, data []byte) []byte {
	t.Helper()
	var c lz4.Compressor
	out := make([]byte, lz4.CompressBlockBound(len(data)))
	n, err := c.CompressBlock(data, out)
	require.NoError(t, err)
	require.Positive(t, n)
	return out[:n]
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestLZ4Frames(t *testing.T) {
	end := []byte{0, 0, 0, 0}
	kafka := byte(lz4FlagVersionBits | lz4FlagIndependent)
	linked := byte(lz4FlagVersionBits)
	text := recordsBody(newRand(21), 4, 1024)
	block := lz4CompressedBlock(t, text)
	sum := binary.LittleEndian.AppendUint32(nil, xxh32(text, 0))

	// Block 2 of a linked frame copies 8 bytes from 16 bytes back, which
	// lies in block 1, then adds the literal "Z": token 0x04 (no literal,
	// match length 4+4), offset 16, token 0x10 (one literal).
	first := []byte("0123456789abcdefghij")
	second := []byte{0x04, 16, 0, 0x10, 'Z'}
	linkedWant := []byte("0123456789abcdefghij456789abZ")

	skippable := cat([]byte{0x5A, 0x2A, 0x4D, 0x18}, binary.LittleEndian.AppendUint32(nil, 3), []byte("abc"))
	badHC := lz4TestHeader(kafka, 0x40, 0)
	badHC[6] ^= 0xFF

	tests := []struct {
		name    string
		limit   int
		frame   []byte
		want    []byte
		wantErr error
	}{
		{name: "kafka frame", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false), end), want: text},
		{name: "empty frame", frame: cat(lz4TestHeader(kafka, 0x40, 0), end), want: []byte{}},
		{name: "stored block", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(text, true, false), end), want: text},
		{name: "empty stored block", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(nil, true, false), end), want: []byte{}},
		{name: "4MiB block size", frame: cat(lz4TestHeader(kafka, 0x70, 0), lz4TestBlock(block, false, false), end), want: text},
		{name: "block checksums", frame: cat(lz4TestHeader(kafka|lz4FlagBlockSum, 0x40, 0), lz4TestBlock(block, false, true), end), want: text},
		{name: "content checksum", frame: cat(lz4TestHeader(kafka|lz4FlagContentSum, 0x40, 0), lz4TestBlock(block, false, false), end, sum), want: text},
		{name: "content size", frame: cat(lz4TestHeader(kafka|lz4FlagContentSize, 0x40, uint64(len(text))), lz4TestBlock(block, false, false), end), want: text},
		{name: "linked blocks", frame: cat(lz4TestHeader(linked, 0x40, 0), lz4TestBlock(first, true, false), lz4TestBlock(second, false, false), end), want: linkedWant},
		{name: "two frames", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false), end, lz4TestHeader(kafka, 0x40, 0), lz4TestBlock([]byte("!"), true, false), end), want: append(bytes.Clone(text), '!')},
		{name: "skippable frames", frame: cat(skippable, lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false), end, skippable), want: text},

		{name: "back reference in an independent block", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(first, true, false), lz4TestBlock(second, false, false), end), wantErr: ErrCorrupt},
		{name: "bad magic", frame: cat([]byte{0x04, 0x22, 0x4D, 0x19}, lz4TestHeader(kafka, 0x40, 0)[4:], end), wantErr: ErrCorrupt},
		{name: "legacy frame", frame: cat([]byte{0x02, 0x21, 0x4C, 0x18}, lz4TestBlock(block, false, false)), wantErr: ErrUnsupported},
		{name: "dictionary id", frame: cat(lz4TestHeader(kafka|lz4FlagDictID, 0x40, 0), end), wantErr: ErrUnsupported},
		{name: "version 0", frame: cat(lz4TestHeader(lz4FlagIndependent, 0x40, 0), end), wantErr: ErrCorrupt},
		{name: "version 2", frame: cat(lz4TestHeader(0x80|lz4FlagIndependent, 0x40, 0), end), wantErr: ErrCorrupt},
		{name: "FLG reserved bit", frame: cat(lz4TestHeader(kafka|lz4FlagReserved, 0x40, 0), end), wantErr: ErrCorrupt},
		{name: "BD reserved bit", frame: cat(lz4TestHeader(kafka, 0x41, 0), end), wantErr: ErrCorrupt},
		{name: "BD block size id 3", frame: cat(lz4TestHeader(kafka, 0x30, 0), end), wantErr: ErrCorrupt},
		{name: "header checksum", frame: cat(badHC, end), wantErr: ErrCorrupt},
		{name: "block over maximum", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(make([]byte, 64<<10+1), true, false), end), wantErr: ErrCorrupt},
		{name: "block checksum", frame: cat(lz4TestHeader(kafka|lz4FlagBlockSum, 0x40, 0), lz4TestBlock(block, false, false), []byte{1, 2, 3, 4}, end), wantErr: ErrCorrupt},
		{name: "content checksum mismatch", frame: cat(lz4TestHeader(kafka|lz4FlagContentSum, 0x40, 0), lz4TestBlock(block, false, false), end, []byte{1, 2, 3, 4}), wantErr: ErrCorrupt},
		{name: "missing content checksum", frame: cat(lz4TestHeader(kafka|lz4FlagContentSum, 0x40, 0), lz4TestBlock(block, false, false), end), wantErr: ErrCorrupt},
		{name: "content size mismatch", frame: cat(lz4TestHeader(kafka|lz4FlagContentSize, 0x40, uint64(len(text)+1)), lz4TestBlock(block, false, false), end), wantErr: ErrCorrupt},
		{name: "missing end mark", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false)), wantErr: ErrCorrupt},
		{name: "truncated skippable frame", frame: skippable[:len(skippable)-1], wantErr: ErrCorrupt},
		{name: "truncated block", frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block[:len(block)-3], false, false), end), wantErr: ErrCorrupt},
		// Under a limit smaller than the block's possible output, a block
		// that fails to decode may be too large or corrupt: it counts as too
		// large, without a second decode to tell.
		{name: "truncated block cut by the limit", limit: 100, frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block[:len(block)-3], false, false), end), wantErr: ErrTooLarge},

		{name: "content size over limit", limit: 100, frame: cat(lz4TestHeader(kafka|lz4FlagContentSize, 0x40, 101), end), wantErr: ErrTooLarge},
		{name: "block over limit", limit: 100, frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false), end), wantErr: ErrTooLarge},
		{name: "stored block over limit", limit: 100, frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(text[:101], true, false), end), wantErr: ErrTooLarge},
		{name: "frames over limit together", limit: len(text) + 1, frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false), end, lz4TestHeader(kafka, 0x40, 0), lz4TestBlock([]byte("!!"), true, false), end), wantErr: ErrTooLarge},
		{name: "exactly the limit", limit: len(text), frame: cat(lz4TestHeader(kafka, 0x40, 0), lz4TestBlock(block, false, false), end), want: text},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLocal(Options{MaxDecompressedSize: tt.limit})
			got, err := l.Decompress([]byte("head"), tt.frame, LZ4)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Equal(t, "head", string(got))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got[4:])
		})
	}
}

// TestLZ4FrameLayout checks that Compress writes the frame as Kafka does:
// the fixed header, 64 KiB blocks, stored blocks for incompressible data,
// the end mark and nothing after it.
func TestLZ4FrameLayout(t *testing.T) {
	var l Local
	for _, in := range testInputs() {
		t.Run(in.name, func(t *testing.T) {
			z, err := l.Compress(nil, in.data, LZ4, DefaultLevel)
			require.NoError(t, err)
			require.Equal(t, []byte{0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82}, z[:7])
			p, total, blocks := 7, 0, 0
			for {
				size := binary.LittleEndian.Uint32(z[p:])
				p += 4
				if size == 0 {
					break
				}
				n := int(size &^ lz4Uncompressed)
				require.LessOrEqual(t, n, 64<<10)
				var k int
				if size&lz4Uncompressed != 0 {
					k = n
				} else {
					out := make([]byte, 64<<10)
					k, err = lz4.UncompressBlock(z[p:p+n], out)
					require.NoError(t, err)
					require.Less(t, n, k, "a compressed block must be smaller than its data")
				}
				require.Equal(t, min(64<<10, len(in.data)-total), k, "only the last block may be short")
				total += k
				p += n
				blocks++
			}
			require.Equal(t, len(z), p, "bytes after the end mark")
			require.Equal(t, len(in.data), total)
			require.Equal(t, (len(in.data)+64<<10-1)/(64<<10), blocks)
		})
	}
	z, err := l.Compress(nil, randomBytes(22, 1000), LZ4, DefaultLevel)
	require.NoError(t, err)
	assert.Equal(t, uint32(1000)|lz4Uncompressed, binary.LittleEndian.Uint32(z[7:]), "incompressible data is stored")
}

// TestLZ4Levels checks that higher levels use the high-compression
// compressor: they compress JSON better than the fast one.
func TestLZ4Levels(t *testing.T) {
	var l Local
	body := recordsBody(newRand(23), 16, 1024)
	fast, err := l.Compress(nil, body, LZ4, 1)
	require.NoError(t, err)
	def, err := l.Compress(nil, body, LZ4, DefaultLevel)
	require.NoError(t, err)
	assert.Equal(t, fast, def, "the default is the fast compressor")
	hc, err := l.Compress(nil, body, LZ4, 9)
	require.NoError(t, err)
	assert.Less(t, len(hc), len(fast))
}
