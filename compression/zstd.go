package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/klauspost/compress/zstd"
)

// zstdWindow is the window of the encoders: 1 MiB, Kafka's default
// maximum message size, so that a typical batch body is one single-segment
// frame and a decoder needs no more memory than the body itself.
const zstdWindow = 1 << 20

// zstdMaxWindow is the largest window a frame may ask for: 128 MiB, zstd's
// and zstd-jni's default decoder limit (ZSTD_WINDOWLOG_LIMIT_DEFAULT 27).
// DecodeAll decodes into the destination and allocates no window, so the
// window does not count against MaxDecompressedSize: Kafka's Java producer
// writes 2 MiB windows whatever the batch size.
const zstdMaxWindow = 1 << 27

// zstdSlack is spare room given to DecodeAll beyond the expected output:
// with it, klauspost's sequence decoder takes its fast path (wide copies)
// also for the last block.
const zstdSlack = 64

// The zstd format (RFC 8878), as far as zstdBound reads it.
const (
	zstdMagic          = 0xFD2FB528
	zstdSkippableMagic = 0x184D2A50 // 0x184D2A50 to 0x184D2A5F
	zstdSkippableMask  = 0xFFFFFFF0
	zstdMaxBlock       = 128 << 10 // Block_Maximum_Size at most
	// zstdMinCompressedBlock is the smallest compressed block: a
	// literals section header and a sequences section header of a byte
	// each.
	zstdMinCompressedBlock = 2
)

// A frame's block headers bound its output only loosely (128 KiB for a
// compressed block of a few bytes), so unzstd first makes room for
// zstdGuessRatio times the input, at least zstdMinGuess, within that
// bound, and grows it zstdGrowth times over each time the decoder needs
// more, decoding again: a bomb, or a corrupt frame that claims much, then
// allocates about what it really decodes to, not the bound.
const (
	zstdMinGuess   = 256 << 10
	zstdGuessRatio = 32
	zstdGrowth     = 4
)

// zstdBound returns an upper bound of the decompressed size of the zstd
// frames in src, read from their headers alone: the sum of zstdFrameBound
// over the frames (skippable frames count nothing). It walks the block
// headers without decoding anything; malformed structure is ErrCorrupt.
func zstdBound(src []byte) (uint64, error) {
	var total uint64
	for len(src) > 0 {
		if len(src) < 4 {
			return 0, fmt.Errorf("%w: zstd: %d trailing bytes", ErrCorrupt, len(src))
		}
		magic := binary.LittleEndian.Uint32(src)
		if magic&zstdSkippableMask == zstdSkippableMagic {
			if len(src) < 8 || uint64(binary.LittleEndian.Uint32(src[4:])) > uint64(len(src)-8) {
				return 0, fmt.Errorf("%w: zstd: truncated skippable frame", ErrCorrupt)
			}
			src = src[8+binary.LittleEndian.Uint32(src[4:]):]
			continue
		}
		if magic != zstdMagic {
			return 0, fmt.Errorf("%w: zstd: bad magic %#08x", ErrCorrupt, magic)
		}
		frame, rest, err := zstdFrameBound(src[4:])
		if err != nil {
			return 0, err
		}
		total += frame // no overflow: frame <= 2^21 * len(src)
		src = rest
	}
	return total, nil
}

// zstdFrameBound returns an upper bound of the decompressed size of the
// zstd frame at the start of src (after the magic number), and the rest of
// src after the frame. The bound is zstdBlocksBound of its blocks, or the
// frame's content size if the header declares a smaller one.
func zstdFrameBound(src []byte) (uint64, []byte, error) {
	fhd, fcs, src, err := zstdFrameHeader(src)
	if err != nil {
		return 0, nil, err
	}
	frame, src, err := zstdBlocksBound(src)
	if err != nil {
		return 0, nil, err
	}
	if fhd&0x04 != 0 { // content checksum
		if len(src) < 4 {
			return 0, nil, fmt.Errorf("%w: zstd: truncated checksum", ErrCorrupt)
		}
		src = src[4:]
	}
	return min(frame, fcs), src, nil
}

// zstdFrameHeader reads the frame header at the start of src (after the
// magic number). It returns the frame header descriptor, the frame content
// size (math.MaxUint64 if not declared), and the rest of src.
func zstdFrameHeader(src []byte) (byte, uint64, []byte, error) {
	if len(src) < 1 {
		return 0, 0, nil, fmt.Errorf("%w: zstd: truncated frame header", ErrCorrupt)
	}
	fhd := src[0]
	src = src[1:]
	single := fhd&0x20 != 0
	skip := [4]int{0, 1, 2, 4}[fhd&3] // dictionary id
	if !single {
		skip++ // window descriptor
	}
	fcsLen := [4]int{0, 2, 4, 8}[fhd>>6]
	if fcsLen == 0 && single {
		fcsLen = 1
	}
	if len(src) < skip+fcsLen {
		return 0, 0, nil, fmt.Errorf("%w: zstd: truncated frame header", ErrCorrupt)
	}
	fcs := uint64(math.MaxUint64)
	switch b := src[skip : skip+fcsLen]; fcsLen {
	case 1:
		fcs = uint64(b[0])
	case 2:
		fcs = uint64(binary.LittleEndian.Uint16(b)) + 256
	case 4:
		fcs = uint64(binary.LittleEndian.Uint32(b))
	case 8:
		fcs = binary.LittleEndian.Uint64(b)
	}
	return fhd, fcs, src[skip+fcsLen:], nil
}

// zstdBlocksBound walks the blocks of a frame at the start of src, up to
// and including the last, and returns the sum of a raw or RLE block's
// size and 128 KiB per compressed block, and the rest of src.
func zstdBlocksBound(src []byte) (uint64, []byte, error) {
	var frame uint64
	for last := false; !last; {
		if len(src) < 3 {
			return 0, nil, fmt.Errorf("%w: zstd: truncated block header", ErrCorrupt)
		}
		bh := uint32(src[0]) | uint32(src[1])<<8 | uint32(src[2])<<16
		src = src[3:]
		last = bh&1 != 0
		size := int(bh >> 3)
		stored := size // bytes of input the block takes
		switch bh >> 1 & 3 {
		case 0: // raw
			frame += uint64(size)
		case 1: // RLE
			frame += uint64(size)
			stored = 1
		case 2: // compressed
			if size < zstdMinCompressedBlock {
				return 0, nil, fmt.Errorf("%w: zstd: compressed block of %d bytes", ErrCorrupt, size)
			}
			frame += zstdMaxBlock
		default:
			return 0, nil, fmt.Errorf("%w: zstd: reserved block type", ErrCorrupt)
		}
		if len(src) < stored {
			return 0, nil, fmt.Errorf("%w: zstd: truncated block", ErrCorrupt)
		}
		src = src[stored:]
	}
	return frame, src, nil
}

// unzstd appends the decompression of the zstd frames in src to dst.
//
// zstdBound tells from the frame and block headers how much output src can
// make at most. The decoder runs with klauspost's cap limit, under which
// DecodeAll never writes past the capacity of the slice it is given
// (ErrDecoderSizeExceeded instead): unzstd gives it dst's spare capacity,
// grown if need be to a first guess within that bound (see zstdMinGuess)
// and then step by step, but never beyond the limit (plus zstdSlack). So
// output is bounded while decoding, and a bomb allocates at most the
// limit, not its output. A frame that needs more than the limit is
// ErrTooLarge; any other failure is ErrCorrupt.
func (l *Local) unzstd(dst, src []byte) ([]byte, error) {
	bound, err := zstdBound(src)
	if err != nil {
		return dst, err
	}
	if l.zd == nil {
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1), // synchronous DecodeAll, no goroutines
			zstd.WithDecodeAllCapLimit(true),
			zstd.WithDecoderMaxWindow(zstdMaxWindow),
		)
		if err != nil {
			return dst, fmt.Errorf("compression: zstd decoder: %w", err)
		}
		l.zd = d
	}
	room := l.MaxDecompressedSize()
	most := int(min(bound, uint64(room))) // output src may need
	want := zstdStep(max(zstdMinGuess, zstdGuessRatio*len(src)), most)
	var w, out []byte
	for {
		dst = grow(dst, want+zstdSlack, want+zstdSlack)
		w = dst[len(dst):len(dst):min(cap(dst), len(dst)+room+zstdSlack)]
		out, err = l.zd.DecodeAll(src, w)
		if err == nil || cap(w) >= most+zstdSlack || !outOfRoom(err, out, w) {
			break
		}
		want = zstdStep(zstdGrowth*cap(w), most) // decode again with more room
	}
	switch {
	case err == nil:
		if len(out) > room {
			return dst, l.tooLarge(Zstd)
		}
		if len(out) > 0 && (cap(w) == 0 || &out[0] != &w[:1][0]) {
			return append(dst, out...), nil // not expected: the cap limit keeps out in w
		}
		return dst[:len(dst)+len(out)], nil
	case errors.Is(err, zstd.ErrWindowSizeExceeded):
		return dst, fmt.Errorf("%w: zstd: window over %d bytes: %w", ErrUnsupported, zstdMaxWindow, err)
	case errors.Is(err, zstd.ErrUnknownDictionary):
		return dst, fmt.Errorf("%w: zstd: %w", ErrUnsupported, err)
	case bound > uint64(room) && outOfRoom(err, out, w):
		// Past the limit (it may be corrupt as well).
		return dst, fmt.Errorf("%w: zstd: %w", l.tooLarge(Zstd), err)
	default:
		return dst, corrupt(Zstd, err)
	}
}

// zstdStep returns the room of the next DecodeAll: want, or most once want
// is over an eighth of it. A decode that fails for want of room costs its
// buffer and, when the block that crosses the cap is appended before the
// decoder checks it, a reallocation of about 1.25 times that buffer; with
// attempts short of most kept under most/8, all of them together cost
// under a sixth of the last.
func zstdStep(want, most int) int {
	if want > most/8 {
		return most
	}
	return want
}

// outOfRoom reports whether DecodeAll may have failed with err for want
// of room in w, where it decoded out: the decoder said so, or the block it
// failed in could have reached w's capacity (a block that would pass it
// fails with an error of its own, as a corrupt one does). Failures found
// only once a frame was decoded whole (its checksum, its content size) are
// never for want of room.
func outOfRoom(err error, out, w []byte) bool {
	switch {
	case errors.Is(err, zstd.ErrCRCMismatch), errors.Is(err, zstd.ErrFrameSizeMismatch), errors.Is(err, zstd.ErrFrameSizeExceeded):
		return false
	}
	return errors.Is(err, zstd.ErrDecoderSizeExceeded) || len(out)+zstdMaxBlock+zstdSlack >= cap(w)
}

// zstdLevel maps a checked Kafka/zstd level to klauspost's encoder level.
func zstdLevel(level int) zstd.EncoderLevel {
	if level == 0 {
		level = 3 // zstd's default
	}
	return zstd.EncoderLevelFromZstd(level)
}

// zstd appends one zstd frame holding src to dst. A src of at most
// zstdWindow bytes goes in a single-segment frame, whose header always
// holds the content size (klauspost writes no content size in other frames
// under 256 bytes, and Decompress would then size its output for a whole
// 128 KiB block); larger ones in frames with a zstdWindow window.
func (l *Local) zstd(dst, src []byte, level int) ([]byte, error) {
	lv := zstdLevel(level)
	single := len(src) <= zstdWindow
	encoders := &l.ze
	if single {
		encoders = &l.zs
	}
	e := encoders[lv-1]
	if e == nil {
		var err error
		e, err = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(lv),
			zstd.WithEncoderConcurrency(1), // synchronous EncodeAll, no goroutines
			zstd.WithWindowSize(zstdWindow),
			zstd.WithSingleSegment(single),
			zstd.WithEncoderCRC(false), // the batch CRC covers it, as in Kafka
			zstd.WithZeroFrames(true),  // an empty src still makes a frame
		)
		if err != nil {
			return dst, fmt.Errorf("%w: zstd level %d: %w", ErrInvalidLevel, level, err)
		}
		encoders[lv-1] = e
	}
	// EncodeAll appends; give it the worst case so it never grows dst.
	dst = grow(dst, e.MaxEncodedSize(len(src)), e.MaxEncodedSize(len(src)))
	return e.EncodeAll(src, dst), nil
}
