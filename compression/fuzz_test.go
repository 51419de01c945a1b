package compression

import (
	"bytes"
	stdgzip "compress/gzip"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/require"
)

// One fuzz target per decoder. Each checks that Decompress never panics,
// fails only with this package's errors and leaves dst as it was then,
// never exceeds the limit, agrees with an independent decoder where both
// succeed, and that what it decodes survives a Compress/Decompress round
// trip.

// fuzzLimit keeps fuzzing fast and exercises ErrTooLarge.
const fuzzLimit = 1 << 20

// fuzzSeeds returns bodies to compress into seed corpora.
func fuzzSeeds() [][]byte {
	return [][]byte{
		{},
		[]byte("a"),
		recordsBody(newRand(40), 2, 300),
		bytes.Repeat([]byte("replog "), 20000), // several blocks and chunks
		randomBytes(41, 3000),
	}
}

// readLimited reads r up to fuzzLimit+1 bytes.
func readLimited(r io.Reader) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r, fuzzLimit+1))
}

// fuzzDecompress runs the checks shared by all targets with a Local from p
// (inputs may run in parallel). ref, if not nil, is an independent decoder
// of src.
func fuzzDecompress(t *testing.T, p *Pool, c Codec, src []byte, ref func([]byte) ([]byte, error)) {
	t.Helper()
	l := p.Get()
	defer p.Put(l)
	got, err := l.Decompress([]byte("head"), src, c)
	if err != nil {
		require.True(t, errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrUnsupported), "untyped error: %v", err)
		require.Equal(t, "head", string(got))
		return
	}
	require.Equal(t, "head", string(got[:4]))
	out := got[4:]
	require.LessOrEqual(t, len(out), fuzzLimit)
	if ref != nil {
		if want, err := ref(src); err == nil && len(want) <= fuzzLimit {
			require.True(t, bytes.Equal(want, out), "differs from the reference decoder")
		}
	}
	z, err := l.Compress(nil, out, c, DefaultLevel)
	require.NoError(t, err)
	back, err := l.Decompress(nil, z, c)
	require.NoError(t, err)
	require.True(t, bytes.Equal(out, back), "round trip differs")
}

func FuzzDecompressGzip(f *testing.F) {
	var l Local
	for _, body := range fuzzSeeds() {
		for _, level := range []int{1, 9} {
			z, err := l.Compress(nil, body, Gzip, level)
			require.NoError(f, err)
			f.Add(z)
		}
		var buf bytes.Buffer
		w := stdgzip.NewWriter(&buf)
		w.Name = "seed"
		_, _ = w.Write(body)
		require.NoError(f, w.Close())
		f.Add(append(bytes.Clone(buf.Bytes()), buf.Bytes()...)) // two members
	}
	p := NewPool(Options{MaxDecompressedSize: fuzzLimit})
	f.Fuzz(func(t *testing.T, src []byte) {
		fuzzDecompress(t, p, Gzip, src, func(src []byte) ([]byte, error) {
			zr, err := stdgzip.NewReader(bytes.NewReader(src))
			if err != nil {
				return nil, err
			}
			return readLimited(zr)
		})
	})
}

func FuzzDecompressSnappyRaw(f *testing.F) {
	for _, body := range fuzzSeeds() {
		f.Add(snappyRaw(body))
	}
	f.Add([]byte{0})
	p := NewPool(Options{MaxDecompressedSize: fuzzLimit})
	f.Fuzz(func(t *testing.T, src []byte) {
		fuzzDecompress(t, p, Snappy, src, nil)
	})
}

// FuzzDecompressSnappyXerial fuzzes what follows the xerial header.
func FuzzDecompressSnappyXerial(f *testing.F) {
	var l Local
	for _, body := range fuzzSeeds() {
		z, err := l.Compress(nil, body, Snappy, DefaultLevel)
		require.NoError(f, err)
		f.Add(z[len(xerialHeader):])
		f.Add(xerial.Encode(nil, body)[len(xerialHeader):])
	}
	p := NewPool(Options{MaxDecompressedSize: fuzzLimit})
	f.Fuzz(func(t *testing.T, chunks []byte) {
		src := append([]byte(xerialHeader), chunks...)
		fuzzDecompress(t, p, Snappy, src, func(src []byte) ([]byte, error) {
			return xerial.Decode(src)
		})
	})
}

func FuzzDecompressLZ4(f *testing.F) {
	var l Local
	for _, body := range fuzzSeeds() {
		for _, level := range []int{1, 9} {
			z, err := l.Compress(nil, body, LZ4, level)
			require.NoError(f, err)
			f.Add(z)
		}
		f.Add(pierrecLZ4(f, body, pierrecOpts{block: 256 << 10, contentSum: true, blockSum: true, size: true}))
	}
	p := NewPool(Options{MaxDecompressedSize: fuzzLimit})
	f.Fuzz(func(t *testing.T, src []byte) {
		fuzzDecompress(t, p, LZ4, src, func(src []byte) ([]byte, error) {
			return readLimited(lz4.NewReader(bytes.NewReader(src)))
		})
	})
}

func FuzzDecompressZstd(f *testing.F) {
	var l Local
	for _, body := range fuzzSeeds() {
		for _, level := range []int{1, 3, 22} {
			z, err := l.Compress(nil, body, Zstd, level)
			require.NoError(f, err)
			f.Add(z)
		}
		f.Add(zstdStream(f, body))
	}
	p := NewPool(Options{MaxDecompressedSize: fuzzLimit})
	f.Fuzz(func(t *testing.T, src []byte) {
		fuzzDecompress(t, p, Zstd, src, func(src []byte) ([]byte, error) {
			d, err := zstd.NewReader(bytes.NewReader(src), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(4*fuzzLimit))
			if err != nil {
				return nil, err
			}
			defer d.Close()
			return readLimited(d)
		})
	})
}
