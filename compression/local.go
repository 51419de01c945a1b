package compression

import (
	"bytes"
	"fmt"
	"math"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// DefaultMaxDecompressedSize is the limit on the bytes one Decompress call
// may produce when Options leaves MaxDecompressedSize at zero: 64 MiB, far
// above any batch Kafka accepts by default (message.max.bytes is about
// 1 MiB), far below what a decompression bomb would make.
const DefaultMaxDecompressedSize = 64 << 20

// Options configures a Local or a Pool. The zero value selects every
// default.
type Options struct {
	// MaxDecompressedSize bounds the bytes one Decompress call may append
	// to dst. Output beyond it fails with ErrTooLarge, detected while
	// decoding. Zero or a negative value selects
	// DefaultMaxDecompressedSize; a value above MaxDecompressedSizeCap
	// (math.MaxInt for "no limit", say) is lowered to it.
	MaxDecompressedSize int
}

// MaxDecompressedSizeCap is the largest MaxDecompressedSize in effect
// (2^61-1 on 64-bit machines: no limit in practice), so that the decoders'
// window arithmetic never overflows.
const MaxDecompressedSizeCap = math.MaxInt / 4

// maxDecompressed returns the limit with the default filled in.
func (o Options) maxDecompressed() int {
	if o.MaxDecompressedSize <= 0 {
		return DefaultMaxDecompressedSize
	}
	return min(o.MaxDecompressedSize, MaxDecompressedSizeCap)
}

// Local is a caller-owned compression context, the counterpart of Kafka's
// RequestLocal: it keeps the decoders, encoders and scratch state of every
// codec it has used, so that once warmed up, Decompress and Compress into a
// destination with enough capacity allocate nothing. Give each goroutine
// (request handler, fetcher, producer loop) its own Local and pass it down
// the call chain explicitly.
//
// A Local is not safe for concurrent use by multiple goroutines. The zero
// value is ready to use with default Options. A Local holds no goroutines
// or other resources besides memory; it needs no Close and may simply be
// dropped. Codec state is created on first use, so a Local only used for
// LZ4 never pays for a zstd encoder.
type Local struct {
	max int // 0 in a zero Local: DefaultMaxDecompressedSize

	rd  bytes.Reader // input of the gzip reader
	gzr gzip.Reader
	gzw [MaxGzipLevel + 1]*gzip.Writer // by level; index 0 is the default
	out appendWriter                   // output of the gzip writers
	gzp [4096]byte                     // probe for the end of a gzip stream

	zd *zstd.Decoder
	ze [4]*zstd.Encoder // by zstd.EncoderLevel - 1
	zs [4]*zstd.Encoder // the same, single-segment frames (inputs <= zstdWindow)

	lzc  *lz4.Compressor
	lzhc *lz4.CompressorHC
}

// NewLocal returns a Local configured by opts.
func NewLocal(opts Options) *Local {
	return &Local{max: opts.maxDecompressed()}
}

// MaxDecompressedSize returns the limit on the bytes one Decompress call may
// produce.
func (l *Local) MaxDecompressedSize() int {
	if l.max <= 0 {
		return DefaultMaxDecompressedSize
	}
	return l.max
}

// Decompress appends to dst the decompression of src, compressed with c,
// and returns the extended slice. src is a whole compressed stream: a
// record batch's body after its 61-byte header. For None, src is appended
// as it is.
//
// At most MaxDecompressedSize bytes are appended; more fails with an error
// wrapping ErrTooLarge, found while decoding, before the whole output is
// allocated. Malformed input (including an empty src for a compressed
// codec) fails with ErrCorrupt, an LZ4 dictionary id, legacy LZ4 frame or
// zstd dictionary with ErrUnsupported, an unknown codec with
// ErrUnknownCodec. No input makes it panic.
//
// Decompress reuses dst's spare capacity and only allocates when that is too
// small: decompressing into out[:0] of a previously returned slice reaches a
// steady state with no allocations. On error the returned slice holds dst's
// original contents and length; its spare capacity may have been
// overwritten. src is not modified and not retained.
func (l *Local) Decompress(dst, src []byte, c Codec) ([]byte, error) {
	n := len(dst)
	if !c.Valid() {
		return dst, fmt.Errorf("%w: %s", ErrUnknownCodec, c)
	}
	if c != None && len(src) == 0 {
		return dst, fmt.Errorf("%w: %s: empty input", ErrCorrupt, c)
	}
	var out []byte
	var err error
	switch c {
	case None:
		if len(src) > l.MaxDecompressedSize() {
			return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(src), l.MaxDecompressedSize())
		}
		return append(dst, src...), nil
	case Gzip:
		out, err = l.gunzip(dst, src)
	case Snappy:
		out, err = l.unsnappy(dst, src)
	case LZ4:
		out, err = l.unlz4(dst, src)
	case Zstd:
		out, err = l.unzstd(dst, src)
	default:
		return dst, fmt.Errorf("%w: id %d", ErrUnknownCodec, int8(c))
	}
	if err != nil {
		if len(out) < n {
			return dst, err
		}
		return out[:n], err
	}
	return out, nil
}

// Compress appends to dst the compression of src with codec c at the given
// level (DefaultLevel for the codec's default; see Codec.CheckLevel) and
// returns the extended slice. The output is what Kafka's Java producer
// writes, so that every Kafka client reads it:
//   - Gzip: one gzip member.
//   - Snappy: xerial framing with 32 KiB chunks, as the Java producer writes
//     it. Every client must read what the Java producer writes, whereas the
//     raw block that librdkafka and franz-go write reaches Java consumers
//     only through snappy-java's whole-stream fallback.
//   - LZ4: one LZ4 frame, FLG 0x60, BD 0x40 (64 KiB independent blocks), no
//     checksums, as Kafka writes it; see the package doc.
//   - Zstd: one zstd frame with its content size and no checksum.
//   - None: src itself.
//
// Compress grows dst once, to a bound of the output size, when its spare
// capacity is smaller than that bound; compressing into out[:0] of a
// previously returned slice reaches a steady state with no allocations.
// An invalid level fails with ErrInvalidLevel, an unknown codec with
// ErrUnknownCodec; on error dst is returned unchanged. src is not retained.
func (l *Local) Compress(dst, src []byte, c Codec, level int) ([]byte, error) {
	if err := c.CheckLevel(level); err != nil {
		return dst, err
	}
	switch c {
	case None:
		return append(dst, src...), nil
	case Gzip:
		return l.gzip(dst, src, level)
	case Snappy:
		return appendXerial(dst, src), nil
	case LZ4:
		return l.lz4(dst, src, level), nil
	default: // Zstd: CheckLevel rejected the rest.
		return l.zstd(dst, src, level)
	}
}

// corrupt wraps a codec library's error as ErrCorrupt.
func corrupt(c Codec, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrCorrupt, c, err)
}

// tooLarge returns the ErrTooLarge error of a Local.
func (l *Local) tooLarge(c Codec) error {
	return fmt.Errorf("%w: %s output over %d bytes", ErrTooLarge, c, l.MaxDecompressedSize())
}

// grow returns b with room for at least need more bytes. room is how many
// bytes the output may still grow by under the limit (room >= need): a new
// array is at most len(b)+room long, so growth never runs past the limit.
// Growth doubles like append otherwise, so repeated calls amortize.
func grow(b []byte, need, room int) []byte {
	if cap(b)-len(b) >= need {
		return b
	}
	add := min(max(need, cap(b)), room)
	add = max(add, need)
	nb := make([]byte, len(b), len(b)+add)
	copy(nb, b)
	return nb
}

// appendWriter is an io.Writer appending to a byte slice.
type appendWriter struct{ b []byte }

// Write appends p to w.b.
func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}
