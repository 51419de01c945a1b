package compression

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/require"
)

// Benchmark shapes from issue 5.
const (
	benchBatches     = 1000    // batches in one produce request
	benchRecords     = 4       // records per batch
	benchValueSize   = 1 << 10 // bytes per record value
	benchCompressLen = 16 << 10
)

var benchCodecs = []Codec{Gzip, Snappy, LZ4, Zstd}

// benchRequest is a produce request's worth of compressed batch bodies.
type benchRequest struct {
	bodies [][]byte // uncompressed
	comp   [][]byte // compressed with the codec, as Compress writes it
	blocks [][]byte // LZ4 only: the single LZ4 block of each frame
	total  int      // uncompressed bytes
}

// newBenchRequest builds benchBatches bodies of benchRecords JSON records
// each, compressed with c by this package.
func newBenchRequest(tb testing.TB, c Codec) *benchRequest {
	tb.Helper()
	rng := newRand(5)
	var l Local
	r := &benchRequest{}
	for range benchBatches {
		body := recordsBody(rng, benchRecords, benchValueSize)
		comp, err := l.Compress(nil, body, c, DefaultLevel)
		require.NoError(tb, err)
		r.bodies = append(r.bodies, body)
		r.comp = append(r.comp, comp)
		r.total += len(body)
		if c == LZ4 {
			r.blocks = append(r.blocks, singleLZ4Block(tb, comp))
		}
	}
	return r
}

// singleLZ4Block returns the one compressed block of a Kafka LZ4 frame.
func singleLZ4Block(tb testing.TB, frame []byte) []byte {
	tb.Helper()
	require.Equal(tb, []byte{0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82}, frame[:7])
	n := binary.LittleEndian.Uint32(frame[7:])
	require.Zero(tb, n&lz4Uncompressed, "block stored uncompressed")
	require.Equal(tb, []byte{0, 0, 0, 0}, frame[11+n:], "not a single-block frame")
	return frame[11 : 11+n]
}

// naiveDecompress decodes src the way code without a Local does: a new
// decoder or reader and a fresh output buffer for every batch.
func naiveDecompress(src []byte, c Codec) ([]byte, error) {
	switch c {
	case Gzip:
		zr, err := gzip.NewReader(bytes.NewReader(src))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case Snappy:
		return xerial.Decode(src)
	case LZ4:
		return io.ReadAll(lz4.NewReader(bytes.NewReader(src)))
	case Zstd:
		d, err := zstd.NewReader(nil)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return d.DecodeAll(src, nil)
	}
	return nil, fmt.Errorf("naive: codec %s", c)
}

// naiveCompress encodes src the way code without a Local does: a new
// writer or encoder and a fresh output buffer for every batch, writing the
// same format as Compress.
func naiveCompress(src []byte, c Codec) ([]byte, error) {
	var buf bytes.Buffer
	switch c {
	case Gzip:
		w := gzip.NewWriter(&buf)
		if _, err := w.Write(src); err != nil {
			return nil, err
		}
		err := w.Close()
		return buf.Bytes(), err
	case Snappy:
		return xerial.Encode(nil, src), nil
	case LZ4:
		w := lz4.NewWriter(&buf)
		if err := w.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false)); err != nil {
			return nil, err
		}
		if _, err := w.Write(src); err != nil {
			return nil, err
		}
		err := w.Close()
		return buf.Bytes(), err
	case Zstd:
		e, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
		if err != nil {
			return nil, err
		}
		defer e.Close()
		return e.EncodeAll(src, nil), nil
	}
	return nil, fmt.Errorf("naive: codec %s", c)
}

// pairedRatio runs base and impl alternately, reps times, and returns the
// median of impl's time over base's. Pairing makes the ratio hold on a
// noisy machine, where two separately timed sub-benchmarks may see
// different loads.
func pairedRatio(reps int, base, impl func()) float64 {
	r := make([]float64, reps)
	for i := range r {
		t0 := time.Now()
		base()
		t1 := time.Now()
		impl()
		t2 := time.Now()
		r[i] = float64(t2.Sub(t1)) / float64(max(t1.Sub(t0), 1))
	}
	slices.Sort(r)
	return r[reps/2]
}

// Reported ratios (b.ReportMetric), each the median of paired runs against
// its baseline, measured once per sub-benchmark outside the timed loop:
//   - x-block, by codec=lz4/impl=pooled: its time over impl=block's (goal <= 1.3).
//   - x-pooled, by impl=naive: its time over impl=pooled's (decompression
//     goals: >= 2.5 for lz4, >= 2 for zstd).

// BenchmarkDecompressRequest decompresses a produce request of 1,000
// batches of four 1 KiB JSON records. impl=pooled uses one Local and one
// output buffer throughout; impl=naive a new decoder and output per batch;
// codec=lz4/impl=block decodes the same LZ4 blocks with lz4.UncompressBlock
// into a reused buffer, without any frame handling (the speed limit).
func BenchmarkDecompressRequest(b *testing.B) {
	for _, c := range benchCodecs {
		req := newBenchRequest(b, c)
		var l Local
		var out []byte
		pooled := func() {
			for j, src := range req.comp {
				var err error
				out, err = l.Decompress(out[:0], src, c)
				if err != nil || len(out) != len(req.bodies[j]) {
					b.Fatalf("%s batch %d: %d bytes, %v", c, j, len(out), err)
				}
			}
		}
		naive := func() {
			for j, src := range req.comp {
				out, err := naiveDecompress(src, c)
				if err != nil || len(out) != len(req.bodies[j]) {
					b.Fatalf("%s batch %d: %d bytes, %v", c, j, len(out), err)
				}
			}
		}
		buf := make([]byte, lz4Block)
		block := func() {
			for j, blk := range req.blocks {
				n, err := lz4.UncompressBlock(blk, buf)
				if err != nil || n != len(req.bodies[j]) {
					b.Fatalf("batch %d: %d bytes, %v", j, n, err)
				}
			}
		}
		// Check every implementation's output once, and warm up the Local.
		for j, src := range req.comp {
			got, err := l.Decompress(nil, src, c)
			require.NoError(b, err)
			require.Equal(b, req.bodies[j], got)
			got, err = naiveDecompress(src, c)
			require.NoError(b, err)
			require.Equal(b, req.bodies[j], got)
			if c == LZ4 {
				n, err := lz4.UncompressBlock(req.blocks[j], buf)
				require.NoError(b, err)
				require.Equal(b, req.bodies[j], buf[:n])
			}
		}
		pooled()

		run := func(name string, fn func(), ratio func() float64, unit string) {
			var x float64
			b.Run(fmt.Sprintf("codec=%s/impl=%s", c, name), func(b *testing.B) {
				// Warm up after the GC the framework runs before each round:
				// it empties the sync.Pools inside klauspost/compress.
				fn()
				b.ReportAllocs()
				b.SetBytes(int64(req.total))
				b.ResetTimer()
				for range b.N {
					fn()
				}
				b.StopTimer()
				if ratio != nil {
					if x == 0 {
						x = ratio()
					}
					b.ReportMetric(x, unit)
				}
			})
		}
		if c == LZ4 {
			run("block", block, nil, "")
			run("pooled", pooled, func() float64 { return pairedRatio(41, block, pooled) }, "x-block")
		} else {
			run("pooled", pooled, nil, "")
		}
		run("naive", naive, func() float64 { return pairedRatio(9, pooled, naive) }, "x-pooled")
	}
}

// BenchmarkCompressBatch compresses one 16 KiB batch body of JSON records.
// impl=pooled uses one Local and one output buffer throughout; impl=naive
// a new encoder and output per batch; codec=lz4/impl=block compresses the
// body as one block with a reused lz4.Compressor, without any framing.
func BenchmarkCompressBatch(b *testing.B) {
	// 16 records of 1 KiB values, cut to 16 KiB.
	body := recordsBody(newRand(16), benchCompressLen/benchValueSize, benchValueSize)[:benchCompressLen]
	const perSample = 20 // compressions per sample of pairedRatio
	for _, c := range benchCodecs {
		var l Local
		var out []byte
		pooled := func() {
			var err error
			out, err = l.Compress(out[:0], body, c, DefaultLevel)
			if err != nil || len(out) == 0 {
				b.Fatalf("%s: %d bytes, %v", c, len(out), err)
			}
		}
		naive := func() {
			out, err := naiveCompress(body, c)
			if err != nil || len(out) == 0 {
				b.Fatalf("%s: %d bytes, %v", c, len(out), err)
			}
		}
		var lc lz4.Compressor
		buf := make([]byte, lz4.CompressBlockBound(len(body)))
		block := func() {
			n, err := lc.CompressBlock(body, buf)
			if err != nil || n == 0 {
				b.Fatalf("%d bytes, %v", n, err)
			}
		}
		times := func(fn func()) func() {
			return func() {
				for range perSample {
					fn()
				}
			}
		}
		// Check that both implementations' output decodes, and warm up.
		for _, comp := range []func() ([]byte, error){
			func() ([]byte, error) { return l.Compress(nil, body, c, DefaultLevel) },
			func() ([]byte, error) { return naiveCompress(body, c) },
		} {
			z, err := comp()
			require.NoError(b, err)
			got, err := l.Decompress(nil, z, c)
			require.NoError(b, err)
			require.Equal(b, body, got)
		}
		pooled()

		run := func(name string, fn func(), ratio func() float64, unit string) {
			var x float64
			b.Run(fmt.Sprintf("codec=%s/impl=%s", c, name), func(b *testing.B) {
				// Warm up after the GC the framework runs before each round:
				// it empties the sync.Pools inside klauspost/compress.
				fn()
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				b.ResetTimer()
				for range b.N {
					fn()
				}
				b.StopTimer()
				if ratio != nil {
					if x == 0 {
						x = ratio()
					}
					b.ReportMetric(x, unit)
				}
			})
		}
		if c == LZ4 {
			run("block", block, nil, "")
			run("pooled", pooled, func() float64 { return pairedRatio(41, times(block), times(pooled)) }, "x-block")
		} else {
			run("pooled", pooled, nil, "")
		}
		run("naive", naive, func() float64 { return pairedRatio(21, times(pooled), times(naive)) }, "x-pooled")
	}
}
