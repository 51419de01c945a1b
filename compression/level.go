package compression

import "fmt"

// DefaultLevel selects a codec's default compression level (see
// Codec.CheckLevel). It is the only level None and Snappy accept.
const DefaultLevel = 0

// Level ranges accepted by Compress, as Kafka's producer configs define
// them (compression.gzip.level, compression.lz4.level,
// compression.zstd.level, KIP-390).
const (
	MinGzipLevel = -1 // gzip's "default" (like 0)
	MaxGzipLevel = 9
	MinLZ4Level  = 0 // 0 and 1 select the fast block compressor
	MaxLZ4Level  = 17
	MinZstdLevel = -131072
	MaxZstdLevel = 22
)

// CheckLevel reports whether level is valid for c, returning nil or an error
// wrapping ErrInvalidLevel (ErrUnknownCodec for an unknown codec). A batch
// builder can validate its configuration with it once, up front.
//
// Levels, with DefaultLevel (0) selecting each codec's default:
//   - None, Snappy: only 0; snappy has no levels.
//   - Gzip: -1 or 0 for the default (klauspost's level 5), 1 (fastest) to 9
//     (best).
//   - LZ4: 0 or 1 for the fast compressor (the default, as Kafka before 3.8
//     and franz-go use), 2 to 17 for the high-compression compressor: 2 to
//     8 search 2^(level+8) positions deep, 9 and above use the deepest search
//     pierrec/lz4 offers. Kafka 3.8+ defaults to 9; pass 9 to match it.
//   - Zstd: -131072 to 22 as in zstd, 0 meaning zstd's default 3. klauspost's
//     encoder has four speeds, chosen as zstd.EncoderLevelFromZstd does:
//     below 3 fastest, 3-5 default, 6-9 better, 10 and above best.
func (c Codec) CheckLevel(level int) error {
	lo, hi := 0, 0
	switch c {
	case None, Snappy:
	case Gzip:
		lo, hi = MinGzipLevel, MaxGzipLevel
	case LZ4:
		lo, hi = MinLZ4Level, MaxLZ4Level
	case Zstd:
		lo, hi = MinZstdLevel, MaxZstdLevel
	default:
		return fmt.Errorf("%w: id %d", ErrUnknownCodec, int8(c))
	}
	if level < lo || level > hi {
		return fmt.Errorf("%w: %s level %d outside [%d, %d]", ErrInvalidLevel, c, level, lo, hi)
	}
	return nil
}
