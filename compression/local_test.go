package compression

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var allCodecs = []Codec{None, Gzip, Snappy, LZ4, Zstd}

// testLevels are the levels exercised per codec: defaults, ends of the
// ranges, and each lz4 compressor and klauspost zstd speed.
var testLevels = map[Codec][]int{
	None:   {0},
	Gzip:   {-1, 1, 9},
	Snappy: {0},
	LZ4:    {0, 2, 9, 17},
	Zstd:   {-5, 0, 7, 22},
}

type namedInput struct {
	name string
	data []byte
}

// testInputs covers empty and tiny inputs, block and chunk boundaries
// (32 KiB xerial chunks, 64 KiB LZ4 blocks), multi-block inputs, and
// incompressible data (stored LZ4 blocks).
func testInputs() []namedInput {
	json := recordsBody(newRand(1), 140, 1024) // ~145 KiB
	return []namedInput{
		{"empty", nil},
		{"one byte", []byte{'x'}},
		{"small", json[:100]},
		{"batch", recordsBody(newRand(2), 4, 1024)},
		{"32KiB+1", json[:32<<10+1]},
		{"64KiB", json[:64<<10]},
		{"64KiB+1", json[:64<<10+1]},
		{"145KiB", json},
		{"random 100KiB", randomBytes(3, 100<<10)},
		{"zeros 256KiB", make([]byte, 256<<10)},
	}
}

func TestRoundTrip(t *testing.T) {
	inputs := testInputs()
	l := NewLocal(Options{})
	// Every input at the default level (framing: blocks, chunks, stored
	// blocks); a few at the other levels (each compressor).
	levelInputs := map[string]bool{"small": true, "batch": true, "64KiB+1": true}
	for _, c := range allCodecs {
		for _, level := range testLevels[c] {
			for _, in := range inputs {
				if level != DefaultLevel && !levelInputs[in.name] {
					continue
				}
				t.Run(fmt.Sprintf("%s/level=%d/%s", c, level, in.name), func(t *testing.T) {
					src := bytes.Clone(in.data)
					comp, err := l.Compress([]byte("prefix"), src, c, level)
					require.NoError(t, err)
					require.Equal(t, "prefix", string(comp[:6]), "Compress must append")
					comp = comp[6:]
					got, err := l.Decompress([]byte("head"), comp, c)
					require.NoError(t, err)
					require.Equal(t, "head", string(got[:4]), "Decompress must append")
					require.True(t, bytes.Equal(in.data, got[4:]), "round trip differs")
					require.Equal(t, in.data, src, "src modified")
				})
			}
		}
	}
}

func TestCompressErrors(t *testing.T) {
	var l Local
	dst := []byte("keep")
	tests := []struct {
		c       Codec
		level   int
		wantErr error
	}{
		{Gzip, 10, ErrInvalidLevel},
		{LZ4, 18, ErrInvalidLevel},
		{Zstd, 23, ErrInvalidLevel},
		{Snappy, 3, ErrInvalidLevel},
		{None, 1, ErrInvalidLevel},
		{Codec(5), 0, ErrUnknownCodec},
		{Codec(-1), 0, ErrUnknownCodec},
	}
	for _, tt := range tests {
		got, err := l.Compress(dst, []byte("data"), tt.c, tt.level)
		require.ErrorIs(t, err, tt.wantErr, "%s level %d", tt.c, tt.level)
		assert.Equal(t, "keep", string(got))
	}
}

func TestDecompressUnknownCodec(t *testing.T) {
	var l Local
	for _, c := range []Codec{5, 6, 7, -1} {
		got, err := l.Decompress([]byte("keep"), []byte("data"), c)
		require.ErrorIs(t, err, ErrUnknownCodec)
		assert.Equal(t, "keep", string(got))
		_, err = l.Decompress(nil, nil, c) // was ErrCorrupt: empty input
		require.ErrorIs(t, err, ErrUnknownCodec)
	}
}

func TestDecompressEmptyInput(t *testing.T) {
	var l Local
	for _, c := range allCodecs {
		got, err := l.Decompress([]byte("keep"), nil, c)
		if c == None {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, ErrCorrupt, "%s", c)
		}
		assert.Equal(t, "keep", string(got))
	}
}

func TestLocalOptions(t *testing.T) {
	tests := []struct {
		opts Options
		want int
	}{
		{Options{}, DefaultMaxDecompressedSize},
		{Options{MaxDecompressedSize: -1}, DefaultMaxDecompressedSize},
		{Options{MaxDecompressedSize: 1000}, 1000},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, NewLocal(tt.opts).MaxDecompressedSize())
	}
	var zero Local
	assert.Equal(t, DefaultMaxDecompressedSize, zero.MaxDecompressedSize())
	assert.Equal(t, 64<<20, DefaultMaxDecompressedSize)
}

// compressVariants returns src compressed with c by this package and, where
// another writer produces a different shape, by that writer too (a declared
// content size or not, raw or framed snappy).
func compressVariants(t *testing.T, c Codec, src []byte) []namedInput {
	t.Helper()
	var l Local
	ours, err := l.Compress(nil, src, c, DefaultLevel)
	require.NoError(t, err)
	v := []namedInput{{"ours", ours}}
	switch c {
	case Snappy:
		v = append(v, namedInput{"raw block", snappyRaw(src)})
	case LZ4:
		v = append(v,
			namedInput{"pierrec 4MiB blocks", pierrecLZ4(t, src, pierrecOpts{block: 4 << 20, contentSum: true})},
			namedInput{"pierrec content size", pierrecLZ4(t, src, pierrecOpts{block: 64 << 10, size: true})})
	case Zstd:
		v = append(v, namedInput{"stream, no content size", zstdStream(t, src)})
	}
	return v
}

func TestDecompressLimit(t *testing.T) {
	const limit = 64 << 10
	json := recordsBody(newRand(7), 80, 1024)
	for _, c := range allCodecs {
		for _, size := range []int{limit, limit + 1} {
			for _, v := range compressVariants(t, c, json[:size]) {
				t.Run(fmt.Sprintf("%s/%s/%d", c, v.name, size), func(t *testing.T) {
					l := NewLocal(Options{MaxDecompressedSize: limit})
					got, err := l.Decompress([]byte("head"), v.data, c)
					if size <= limit {
						require.NoError(t, err)
						require.Equal(t, json[:size], got[4:])
						// The limit is per call: dst's length does not count.
						big := make([]byte, limit, 2*limit)
						got, err = l.Decompress(big, v.data, c)
						require.NoError(t, err)
						require.Equal(t, json[:size], got[limit:])
						return
					}
					require.ErrorIs(t, err, ErrTooLarge)
					require.Equal(t, "head", string(got))
				})
			}
		}
	}
}

// allocated returns the bytes fn allocates.
func allocated(fn func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	fn()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// TestDecompressBomb checks that the limit is enforced while decoding: a
// stream of 8 MiB of zeros fails against a 512 KiB limit having allocated
// little more than the limit.
func TestDecompressBomb(t *testing.T) {
	const limit = 512 << 10
	zeros := make([]byte, 8<<20)
	warm := []byte("warm up the Local's codec state")
	for _, c := range allCodecs {
		for _, v := range compressVariants(t, c, zeros) {
			t.Run(fmt.Sprintf("%s/%s", c, v.name), func(t *testing.T) {
				l := NewLocal(Options{MaxDecompressedSize: limit})
				w, err := l.Compress(nil, warm, c, DefaultLevel)
				require.NoError(t, err)
				_, err = l.Decompress(nil, w, c)
				require.NoError(t, err)
				n := allocated(func() {
					_, err = l.Decompress(nil, v.data, c)
				})
				require.ErrorIs(t, err, ErrTooLarge)
				assert.Less(t, n, uint64(3*limit), "allocated %d bytes for a %d byte limit", n, limit)
			})
		}
	}
}

// TestDecompressForgedSize checks that a tiny input declaring a huge output
// allocates nothing like that size.
func TestDecompressForgedSize(t *testing.T) {
	var l Local // 64 MiB limit
	lz4Sized := lz4TestHeader(lz4FlagVersionBits|lz4FlagIndependent|lz4FlagContentSize, 0x40, 60<<20)
	lz4Sized = append(lz4Sized, 6, 0, 0, 0, 0x50, 'h', 'e', 'l', 'l', 'o', 0, 0, 0, 0) // "hello", end mark
	tests := []struct {
		name string
		c    Codec
		src  []byte
	}{
		{"snappy raw 60MiB", Snappy, []byte{0x80, 0x80, 0x80, 0x1E, 0x00, 'x'}},
		{"snappy xerial 60MiB", Snappy, append([]byte(xerialHeader), 0, 0, 0, 6, 0x80, 0x80, 0x80, 0x1E, 0x00, 'x')},
		{"lz4 content size 60MiB", LZ4, lz4Sized},
		{"gzip isize 60MiB", Gzip, forgeGzipISize(t, []byte("hello"), 60<<20)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			n := allocated(func() {
				_, err = l.Decompress(nil, tt.src, tt.c)
			})
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Less(t, n, uint64(1<<20), "allocated %d bytes", n)
		})
	}
}

// zstdBlocksFrame is a zstd frame (1 MiB window, no content size) of n
// compressed blocks holding body each, then a last raw block of one byte.
func zstdBlocksFrame(n int, body []byte) []byte {
	f := binary.LittleEndian.AppendUint32(nil, zstdMagic)
	f = append(f, 0x00, 10<<3)
	for range n {
		bh := uint32(len(body))<<3 | 2<<1
		f = append(f, byte(bh), byte(bh>>8), byte(bh>>16))
		f = append(f, body...)
	}
	return append(f, 1<<3|1, 0, 0, 'x')
}

// TestZstdBlockBoundIsNotAllocated: a frame's block headers count 128 KiB
// for every compressed block, however small, and unzstd allocated that
// bound (up to the 64 MiB limit) before decoding: 1.8 KB of empty blocks
// allocated 64 MiB, and, since the bound was over the limit, the corrupt
// frame was reported ErrTooLarge. Empty compressed blocks are now refused
// from the headers, and a frame of garbage blocks, corrupt at its first,
// allocates about a first guess, not its bound.
func TestZstdBlockBoundIsNotAllocated(t *testing.T) {
	var l Local // 64 MiB limit
	for name, src := range map[string][]byte{
		"600 empty blocks":              zstdBlocksFrame(600, nil),
		"600 blocks of 1 byte":          zstdBlocksFrame(600, []byte{0}),
		"300 corrupt blocks of 5 bytes": zstdBlocksFrame(300, []byte{0, 0, 0, 0, 0}),
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = l.Decompress(nil, src, Zstd) })
			require.ErrorIs(t, err, ErrCorrupt)
			require.NotErrorIs(t, err, ErrTooLarge)
			assert.Less(t, n, uint64(2<<20), "allocated %d bytes for %d of input", n, len(src))
		})
	}
}

// TestZstdChecksumMismatchNearTheLimitIsCorrupt: a stream without content
// size (so its headers' bound passes the limit) that decodes within the
// limit and fails only its checksum was ErrTooLarge when its output ended
// within a block of the room it had: outOfRoom took the failure for one
// of room.
func TestZstdChecksumMismatchNearTheLimitIsCorrupt(t *testing.T) {
	const limit = 1<<20 - 500
	body := recordsBody(newRand(9), 40, 200)
	for _, size := range []int{limit, limit - 1000, limit - 100<<10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			src := make([]byte, size)
			copy(src, body)
			data := zstdStream(t, src) // content checksum, no content size
			data[len(data)-1] ^= 0xff  // the checksum's last byte
			bound, err := zstdBound(data)
			require.NoError(t, err)
			require.Greater(t, bound, uint64(limit))
			l := NewLocal(Options{MaxDecompressedSize: limit})
			_, err = l.Decompress(nil, data, Zstd)
			require.ErrorIs(t, err, ErrCorrupt)
			require.NotErrorIs(t, err, ErrTooLarge)
		})
	}
}

// TestZstdLimitSweep: streams of random size and compressibility, in
// three encodings (with and without content size, small window with
// checksums), against random limits and spare capacity in dst: output
// within the limit always decodes whole, output over it is ErrTooLarge,
// however many times unzstd grows its room.
func TestZstdLimitSweep(t *testing.T) {
	rng := newRand(77)
	sized, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	require.NoError(t, err)
	windowed, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<15), zstd.WithSingleSegment(false), zstd.WithEncoderCRC(true))
	require.NoError(t, err)
	for i := range 120 {
		size := rng.IntN(3 << 20)
		src := make([]byte, size)
		period := 1 + rng.IntN(5000)
		for j := range src {
			if j%period < 3 {
				src[j] = byte(rng.IntN(256))
			}
		}
		var data []byte
		switch i % 3 {
		case 0:
			data = sized.EncodeAll(src, nil)
		case 1:
			data = windowed.EncodeAll(src, nil)
		default:
			data = zstdStream(t, src)
		}
		limit := max(1, size+rng.IntN(300<<10)-150<<10)
		spare := rng.IntN(size + 1)
		l := NewLocal(Options{MaxDecompressedSize: limit})
		got, err := l.Decompress(make([]byte, 3, 3+spare), data, Zstd)
		if size <= limit {
			require.NoError(t, err, "case %d size %d limit %d spare %d", i, size, limit, spare)
			require.True(t, bytes.Equal(src, got[3:]), "case %d", i)
		} else {
			require.ErrorIs(t, err, ErrTooLarge, "case %d size %d limit %d spare %d", i, size, limit, spare)
		}
	}
}

// TestZstdOutputPastTheFirstGuess: a stream without content size that
// decompresses to far more than unzstd's first guess (zeros: a ratio in
// the thousands) is decoded whole, the room grown as needed.
func TestZstdOutputPastTheFirstGuess(t *testing.T) {
	zeros := make([]byte, 6<<20)
	for _, v := range compressVariants(t, Zstd, zeros) {
		t.Run(v.name, func(t *testing.T) {
			require.Less(t, zstdGuessRatio*len(v.data), len(zeros))
			var l Local
			got, err := l.Decompress([]byte("head"), v.data, Zstd)
			require.NoError(t, err)
			require.Equal(t, "head", string(got[:4]))
			require.Equal(t, zeros, got[4:])
		})
	}
}

func TestDecompressTruncated(t *testing.T) {
	body := recordsBody(newRand(9), 3, 1024) // one xerial chunk, one LZ4 block
	var l Local
	for _, c := range []Codec{Gzip, Snappy, LZ4, Zstd} {
		for _, v := range compressVariants(t, c, body) {
			t.Run(fmt.Sprintf("%s/%s", c, v.name), func(t *testing.T) {
				for n := range len(v.data) {
					if n > 100 && n < len(v.data)-100 && n%13 != 0 {
						continue // every prefix near the ends, a sample between
					}
					if c == Snappy && v.name == "ours" && n == len(xerialHeader) {
						continue // a xerial header alone is an empty stream
					}
					got, err := l.Decompress([]byte("head"), v.data[:n], c)
					require.ErrorIs(t, err, ErrCorrupt, "prefix of %d bytes", n)
					require.Equal(t, "head", string(got))
				}
				got, err := l.Decompress(nil, v.data, c)
				require.NoError(t, err)
				require.Equal(t, body, got)
			})
		}
	}
}

func TestDecompressTrailingGarbage(t *testing.T) {
	body := recordsBody(newRand(10), 2, 1024)
	var l Local
	for _, c := range []Codec{Gzip, Snappy, LZ4, Zstd} {
		for _, v := range compressVariants(t, c, body) {
			for _, junk := range [][]byte{{0}, []byte("junk"), []byte("more junk than a header")} {
				src := append(bytes.Clone(v.data), junk...)
				_, err := l.Decompress(nil, src, c)
				require.ErrorIs(t, err, ErrCorrupt, "%s %s + %q", c, v.name, junk)
			}
		}
	}
}

func TestDecompressGarbage(t *testing.T) {
	var l Local
	// (A lone 0 byte is a valid empty snappy block, so it is not here.)
	inputs := [][]byte{{1}, []byte("not compressed at all"), randomBytes(11, 1000), make([]byte, 64)}
	for _, c := range []Codec{Gzip, Snappy, LZ4, Zstd} {
		for _, in := range inputs {
			got, err := l.Decompress([]byte("head"), in, c)
			require.ErrorIs(t, err, ErrCorrupt, "%s: %x", c, in)
			require.Equal(t, "head", string(got))
		}
	}
}

// TestSteadyStateAllocs checks the contract the Local exists for:
// decompressing a request into a reused buffer, and compressing a batch
// into one, allocate nothing once warmed up.
func TestSteadyStateAllocs(t *testing.T) {
	rng := newRand(12)
	bodies := make([][]byte, 50)
	for i := range bodies {
		bodies[i] = recordsBody(rng, 4, 1024)
	}
	big := recordsBody(rng, 100, 1024) // several LZ4 blocks and xerial chunks
	for _, c := range allCodecs {
		t.Run(c.String(), func(t *testing.T) {
			// zstd's decoder tables and s2's (snappy's) encoder tables come
			// from package-level sync.Pools in klauspost/compress, which the
			// race detector drains at random (and a GC empties).
			poolDecode := raceEnabled && c == Zstd
			poolEncode := raceEnabled && (c == Zstd || c == Snappy)
			var l Local
			comp := make([][]byte, len(bodies))
			for i, b := range bodies {
				var err error
				comp[i], err = l.Compress(nil, b, c, DefaultLevel)
				require.NoError(t, err)
			}
			var out []byte
			decompress := func() {
				for i, src := range comp {
					var err error
					out, err = l.Decompress(out[:0], src, c)
					if err != nil || len(out) != len(bodies[i]) {
						t.Fatalf("batch %d: %v", i, err)
					}
				}
			}
			decompress()
			if !poolDecode {
				assert.Zero(t, testing.AllocsPerRun(5, decompress), "Decompress allocates")
			}

			var z []byte
			compress := func() {
				var err error
				for _, b := range [][]byte{big, bodies[0]} {
					z, err = l.Compress(z[:0], b, c, DefaultLevel)
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			compress()
			if !poolEncode {
				assert.Zero(t, testing.AllocsPerRun(5, compress), "Compress allocates")
			}
		})
	}
}

// TestLocalStartsNoGoroutines checks that a Local can be dropped without a
// Close: no codec it uses leaves a goroutine behind.
func TestLocalStartsNoGoroutines(t *testing.T) {
	before := settledGoroutines()
	l := NewLocal(Options{})
	body := recordsBody(newRand(13), 4, 1024)
	for _, c := range allCodecs {
		for _, level := range testLevels[c] {
			z, err := l.Compress(nil, body, c, level)
			require.NoError(t, err)
			got, err := l.Decompress(nil, z, c)
			require.NoError(t, err)
			require.Equal(t, body, got)
		}
	}
	assert.Equal(t, before, settledGoroutines())
}

// settledGoroutines returns the number of goroutines once it has stopped
// changing, so that goroutines of earlier tests that are still exiting do
// not count.
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 200 {
		time.Sleep(5 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}
