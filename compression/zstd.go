package compression

import (
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// zstdWindow is the window of the encoders: 1 MiB, Kafka's default
// maximum message size, so that a typical batch body is one single-segment
// frame and a decoder needs no more memory than the body itself.
const zstdWindow = 1 << 20

// unzstd appends the decompression of the zstd frames in src to dst.
// klauspost's DecodeAll enforces the limit while decoding: it rejects a
// declared content size over the limit before allocating, and otherwise
// checks the output after every block (at most 128 KiB).
func (l *Local) unzstd(dst, src []byte) ([]byte, error) {
	if l.zd == nil {
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1), // synchronous DecodeAll, no goroutines
			zstd.WithDecoderMaxMemory(uint64(l.MaxDecompressedSize())),
		)
		if err != nil {
			return dst, fmt.Errorf("compression: zstd decoder: %w", err)
		}
		l.zd = d
	}
	out, err := l.zd.DecodeAll(src, dst)
	switch {
	case err == nil:
		return out, nil
	case errors.Is(err, zstd.ErrDecoderSizeExceeded), errors.Is(err, zstd.ErrWindowSizeExceeded):
		return out, fmt.Errorf("%w: zstd: %w", l.tooLarge(Zstd), err)
	case errors.Is(err, zstd.ErrUnknownDictionary):
		return out, fmt.Errorf("%w: zstd: %w", ErrUnsupported, err)
	default:
		return out, corrupt(Zstd, err)
	}
}

// zstdLevel maps a checked Kafka/zstd level to klauspost's encoder level.
func zstdLevel(level int) zstd.EncoderLevel {
	if level == 0 {
		level = 3 // zstd's default
	}
	return zstd.EncoderLevelFromZstd(level)
}

// zstd appends one zstd frame holding src to dst.
func (l *Local) zstd(dst, src []byte, level int) ([]byte, error) {
	lv := zstdLevel(level)
	e := l.ze[lv-1]
	if e == nil {
		var err error
		e, err = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(lv),
			zstd.WithEncoderConcurrency(1), // synchronous EncodeAll, no goroutines
			zstd.WithWindowSize(zstdWindow),
			zstd.WithEncoderCRC(false), // the batch CRC covers it, as in Kafka
			zstd.WithZeroFrames(true),  // an empty src still makes a frame
		)
		if err != nil {
			return dst, fmt.Errorf("%w: zstd level %d: %w", ErrInvalidLevel, level, err)
		}
		l.ze[lv-1] = e
	}
	// EncodeAll appends; give it the worst case so it never grows dst.
	dst = grow(dst, e.MaxEncodedSize(len(src)), e.MaxEncodedSize(len(src)))
	return e.EncodeAll(src, dst), nil
}
