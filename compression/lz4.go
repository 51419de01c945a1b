package compression

import (
	"encoding/binary"
	"fmt"

	"github.com/pierrec/lz4/v4"
)

// The LZ4 frame format (lz4_Frame_format.md); see the package doc for the
// byte diagram.
const (
	lz4Magic          = 0x184D2204 // little-endian on the wire: 04 22 4D 18
	lz4LegacyMagic    = 0x184C2102
	lz4SkippableMagic = 0x184D2A50 // 0x184D2A50 to 0x184D2A5F
	lz4SkippableMask  = 0xFFFFFFF0

	lz4FlagVersion     = 0xC0 // FLG bits 7-6: must be 01
	lz4FlagIndependent = 0x20 // blocks do not reference earlier blocks
	lz4FlagBlockSum    = 0x10 // xxh32 of each stored block follows it
	lz4FlagContentSize = 0x08 // 8-byte little-endian content size
	lz4FlagContentSum  = 0x04 // xxh32 of the content follows the end mark
	lz4FlagReserved    = 0x02
	lz4FlagDictID      = 0x01 // 4-byte dictionary id
	lz4BDReserved      = 0x8F // BD bit 7 and bits 3-0 must be 0

	lz4Uncompressed = 1 << 31 // block size high bit: stored as is

	// The header Kafka writes: FLG 0x60 (version 01, independent blocks),
	// BD 0x40 (64 KiB blocks), HC = byte 1 of xxh32(FLG, BD).
	lz4KafkaFLG = 0x60
	lz4KafkaBD  = 0x40
	lz4KafkaHC  = 0x82
	lz4Block    = 64 << 10 // the block size Compress writes

	// lz4MaxRatio bounds the bytes one byte of an LZ4 block can decode to: a
	// match length byte of 255 stands for 255 bytes; no sequence does better.
	lz4MaxRatio = 255
	// lz4Window is how far back a match may reach: the dictionary size of
	// linked blocks.
	lz4Window = 64 << 10
)

// lz4BlockMax returns the maximum block size a BD byte declares.
func lz4BlockMax(bd byte) (int, bool) {
	id := int(bd>>4) & 7
	if id < 4 {
		return 0, false
	}
	return 1 << (8 + 2*id), true // 4: 64 KiB, 5: 256 KiB, 6: 1 MiB, 7: 4 MiB
}

// unlz4 appends the decompression of the LZ4 frames in src to dst.
// Concatenated frames and skippable frames are accepted; legacy frames are
// not (Kafka never writes them).
func (l *Local) unlz4(dst, src []byte) ([]byte, error) {
	start := len(dst)
	for len(src) > 0 {
		if len(src) < 4 {
			return dst, fmt.Errorf("%w: lz4: %d trailing bytes", ErrCorrupt, len(src))
		}
		magic := binary.LittleEndian.Uint32(src)
		switch {
		case magic == lz4Magic:
			var err error
			if dst, src, err = l.lz4Frame(dst, src, start); err != nil {
				return dst, err
			}
		case magic&lz4SkippableMask == lz4SkippableMagic:
			if len(src) < 8 || uint64(binary.LittleEndian.Uint32(src[4:])) > uint64(len(src)-8) {
				return dst, fmt.Errorf("%w: lz4: truncated skippable frame", ErrCorrupt)
			}
			src = src[8+binary.LittleEndian.Uint32(src[4:]):]
		case magic == lz4LegacyMagic:
			return dst, fmt.Errorf("%w: lz4: legacy frame", ErrUnsupported)
		default:
			return dst, fmt.Errorf("%w: lz4: bad magic %#08x", ErrCorrupt, magic)
		}
	}
	return dst, nil
}

// lz4Frame appends the content of the LZ4 frame at the start of src to dst
// and returns the rest of src. start is where the output of this
// Decompress call began in dst: the limit applies from there.
//
// Each block is decoded by lz4AppendBlock straight into dst's spare
// capacity, never past what the limit leaves, so a bomb fails after at most
// the limit has been allocated.
func (l *Local) lz4Frame(dst, src []byte, start int) ([]byte, []byte, error) {
	limit := l.MaxDecompressedSize()
	h, err := lz4ParseHeader(src)
	if err != nil {
		return dst, src, err
	}
	frameStart := len(dst)
	contentSize := int64(-1)
	if h.flg&lz4FlagContentSize != 0 {
		cs := binary.LittleEndian.Uint64(src[6:])
		if cs > uint64(limit-(len(dst)-start)) {
			return dst, src, l.tooLarge(LZ4)
		}
		contentSize = int64(cs)
		// Grow once for the whole frame, as far as the input can back it.
		need := int(min(cs, uint64(len(src))*lz4MaxRatio))
		dst = grow(dst, need, limit-(len(dst)-start))
	}
	p := h.size
	for {
		bs, block, next, err := lz4ReadBlock(src, p, h)
		if err != nil {
			return dst, src, err
		}
		p = next
		if bs == 0 {
			break // end mark
		}
		dst, err = l.lz4AppendBlock(dst, block, bs, h, frameStart, limit-(len(dst)-start))
		if err != nil {
			return dst, src, err
		}
	}
	if p, err = lz4CheckContent(dst[frameStart:], src, p, h.flg, contentSize); err != nil {
		return dst, src, err
	}
	return dst, src[p:], nil
}

// lz4Header is what lz4Frame needs of an LZ4 frame header.
type lz4Header struct {
	flg      byte // the FLG byte
	blockMax int  // the maximum block size the BD byte declares
	size     int  // bytes of the header, magic and header checksum included
}

// lz4ParseHeader checks the header of the LZ4 frame at the start of src,
// whose magic number has been read: version, reserved bits, block size
// and header checksum. Dictionary ids are ErrUnsupported.
func lz4ParseHeader(src []byte) (lz4Header, error) {
	if len(src) < 7 {
		return lz4Header{}, fmt.Errorf("%w: lz4: truncated frame header", ErrCorrupt)
	}
	flg, bd := src[4], src[5]
	if flg&lz4FlagVersion != 0x40 {
		return lz4Header{}, fmt.Errorf("%w: lz4: frame version %d", ErrCorrupt, flg>>6)
	}
	if flg&lz4FlagReserved != 0 || bd&lz4BDReserved != 0 {
		return lz4Header{}, fmt.Errorf("%w: lz4: reserved bits set in FLG %#02x BD %#02x", ErrCorrupt, flg, bd)
	}
	if flg&lz4FlagDictID != 0 {
		return lz4Header{}, fmt.Errorf("%w: lz4: dictionary id", ErrUnsupported)
	}
	blockMax, ok := lz4BlockMax(bd)
	if !ok {
		return lz4Header{}, fmt.Errorf("%w: lz4: block size id %d", ErrCorrupt, bd>>4)
	}
	hc := 6 // index of the header checksum
	if flg&lz4FlagContentSize != 0 {
		hc += 8
	}
	if len(src) <= hc {
		return lz4Header{}, fmt.Errorf("%w: lz4: truncated frame header", ErrCorrupt)
	}
	if byte(xxh32(src[4:hc], 0)>>8) != src[hc] {
		return lz4Header{}, fmt.Errorf("%w: lz4: header checksum", ErrCorrupt)
	}
	return lz4Header{flg: flg, blockMax: blockMax, size: hc + 1}, nil
}

// lz4ReadBlock reads the block of frame h at src[p:] and checks its block
// checksum if the frame has them. It returns the block's size field (0 for
// the end mark, lz4Uncompressed set for a stored block), the block's bytes,
// and the index in src after the block and its checksum.
func lz4ReadBlock(src []byte, p int, h lz4Header) (uint32, []byte, int, error) {
	if len(src)-p < 4 {
		return 0, nil, p, fmt.Errorf("%w: lz4: truncated block", ErrCorrupt)
	}
	bs := binary.LittleEndian.Uint32(src[p:])
	p += 4
	if bs == 0 {
		return 0, nil, p, nil // end mark
	}
	n := int(bs &^ lz4Uncompressed)
	if n > h.blockMax || n > len(src)-p {
		return 0, nil, p, fmt.Errorf("%w: lz4: block of %d bytes, maximum %d, %d left", ErrCorrupt, n, h.blockMax, len(src)-p)
	}
	block := src[p : p+n]
	p += n
	if h.flg&lz4FlagBlockSum != 0 {
		if len(src)-p < 4 {
			return 0, nil, p, fmt.Errorf("%w: lz4: truncated block checksum", ErrCorrupt)
		}
		if xxh32(block, 0) != binary.LittleEndian.Uint32(src[p:]) {
			return 0, nil, p, fmt.Errorf("%w: lz4: block checksum", ErrCorrupt)
		}
		p += 4
	}
	return bs, block, p, nil
}

// lz4AppendBlock appends the content of one block of frame h, whose size
// field is bs, to dst. frameStart is where the frame's content began in
// dst (linked blocks take their dictionary from there on); room is what
// the limit leaves.
//
// A compressed block is decoded by lz4.UncompressBlock straight into dst's
// spare capacity. The window handed to the block decoder is never longer
// than the block maximum, lz4MaxRatio times the block's stored size, or
// room. A block that does not decode into room, though it might into a
// full window, fails with ErrTooLarge (it may be corrupt as well).
func (l *Local) lz4AppendBlock(dst, block []byte, bs uint32, h lz4Header, frameStart, room int) ([]byte, error) {
	n := len(block)
	if bs&lz4Uncompressed != 0 {
		if n > room {
			return dst, l.tooLarge(LZ4)
		}
		return append(grow(dst, n, room), block...), nil
	}
	bound := min(h.blockMax, n*lz4MaxRatio)
	w := min(bound, room)
	dst = grow(dst, w, room)
	out := dst[len(dst) : len(dst)+w]
	var k int
	var err error
	if h.flg&lz4FlagIndependent != 0 {
		k, err = lz4.UncompressBlock(block, out)
	} else {
		dict := dst[max(frameStart, len(dst)-lz4Window):]
		k, err = lz4.UncompressBlockWithDict(block, out, dict)
	}
	if err != nil {
		if w < bound {
			// The block may decode to more than the limit leaves: whether
			// it is also corrupt is not worth another decode to find out.
			return dst, fmt.Errorf("%w: lz4: block does not decode within the limit: %w", l.tooLarge(LZ4), err)
		}
		return dst, corrupt(LZ4, err)
	}
	return dst[:len(dst)+k], nil
}

// lz4CheckContent checks a frame's decoded content against the content
// checksum at src[p:], if flg declares one, and against contentSize, if
// the header declared it (not negative). It returns the index in src after
// the frame.
func lz4CheckContent(content, src []byte, p int, flg byte, contentSize int64) (int, error) {
	if flg&lz4FlagContentSum != 0 {
		if len(src)-p < 4 {
			return p, fmt.Errorf("%w: lz4: truncated content checksum", ErrCorrupt)
		}
		if xxh32(content, 0) != binary.LittleEndian.Uint32(src[p:]) {
			return p, fmt.Errorf("%w: lz4: content checksum", ErrCorrupt)
		}
		p += 4
	}
	if contentSize >= 0 && int64(len(content)) != contentSize {
		return p, fmt.Errorf("%w: lz4: content size %d, frame declares %d", ErrCorrupt, len(content), contentSize)
	}
	return p, nil
}

// lz4 appends src to dst as one LZ4 frame as Kafka writes it: the header
// 04 22 4D 18 60 40 82, 64 KiB blocks (stored uncompressed, size high bit
// set, when compression does not make them smaller), the end mark, no
// checksums. level is a checked LZ4 level.
func (l *Local) lz4(dst, src []byte, level int) []byte {
	blocks := (len(src) + lz4Block - 1) / lz4Block
	bound := 7 + blocks*(4+lz4.CompressBlockBound(lz4Block)) + 4
	dst = grow(dst, bound, bound)
	dst = append(dst, 0x04, 0x22, 0x4D, 0x18, lz4KafkaFLG, lz4KafkaBD, lz4KafkaHC)
	for len(src) > 0 {
		chunk := src[:min(len(src), lz4Block)]
		src = src[len(chunk):]
		p := len(dst)
		w := dst[p+4 : p+4+lz4.CompressBlockBound(len(chunk))]
		n, err := l.compressBlock(chunk, w, level)
		if err != nil || n <= 0 || n >= len(chunk) {
			n = copy(w, chunk)
			binary.LittleEndian.PutUint32(dst[p:p+4], uint32(n)|lz4Uncompressed)
		} else {
			binary.LittleEndian.PutUint32(dst[p:p+4], uint32(n))
		}
		dst = dst[:p+4+n]
	}
	return append(dst, 0, 0, 0, 0)
}

// compressBlock compresses one block with the compressor of level, created
// on first use and reused after.
func (l *Local) compressBlock(src, dst []byte, level int) (int, error) {
	if level <= 1 {
		if l.lzc == nil {
			l.lzc = new(lz4.Compressor)
		}
		return l.lzc.CompressBlock(src, dst)
	}
	if l.lzhc == nil {
		l.lzhc = new(lz4.CompressorHC)
	}
	l.lzhc.Level = lz4.Level9
	if level < 9 {
		l.lzhc.Level = lz4.CompressionLevel(1 << (8 + level)) // lz4.Level2 to lz4.Level8
	}
	return l.lzhc.CompressBlock(src, dst)
}
