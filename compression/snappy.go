package compression

import (
	"encoding/binary"
	"fmt"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/snappy"
)

const (
	// xerialMagic starts a xerial-framed snappy stream.
	xerialMagic = "\x82SNAPPY\x00"
	// xerialHeader is xerialMagic, version 1 and minimum compatible version
	// 1, as snappy-java writes it.
	xerialHeader = xerialMagic + "\x00\x00\x00\x01\x00\x00\x00\x01"
	// xerialChunk is the uncompressed size of the chunks Compress writes:
	// snappy-java's default block size.
	xerialChunk = 32 << 10
	// snappyMaxRatio bounds the bytes one byte of a snappy block decodes to:
	// the best element is a 3-byte copy of 64 bytes.
	snappyMaxRatio = 22
)

// unsnappy appends the decompression of src to dst: xerial-framed when src
// starts with xerialMagic (a raw snappy block cannot start with it usefully:
// every Kafka client decides the same way), a raw snappy block otherwise.
func (l *Local) unsnappy(dst, src []byte) ([]byte, error) {
	limit := l.MaxDecompressedSize()
	start := len(dst)
	if len(src) < len(xerialMagic) || string(src[:len(xerialMagic)]) != xerialMagic {
		return l.snappyBlock(dst, src, limit)
	}
	if len(src) < len(xerialHeader) {
		return dst, fmt.Errorf("%w: snappy: truncated xerial header", ErrCorrupt)
	}
	src = src[len(xerialHeader):]
	for len(src) > 0 {
		if len(src) < 4 {
			return dst, fmt.Errorf("%w: snappy: truncated xerial chunk length", ErrCorrupt)
		}
		n := uint64(binary.BigEndian.Uint32(src))
		src = src[4:]
		if n > uint64(len(src)) {
			return dst, fmt.Errorf("%w: snappy: xerial chunk of %d bytes, %d left", ErrCorrupt, n, len(src))
		}
		var err error
		if dst, err = l.snappyBlock(dst, src[:n], limit-(len(dst)-start)); err != nil {
			return dst, err
		}
		src = src[n:]
	}
	return dst, nil
}

// snappyBlock appends the decoding of the raw snappy block b to dst. The
// block states its decoded length up front, so the limit (room) is checked
// before anything is allocated.
func (l *Local) snappyBlock(dst, b []byte, room int) ([]byte, error) {
	n, err := snappy.DecodedLen(b)
	if err != nil {
		return dst, corrupt(Snappy, err)
	}
	if n > room {
		return dst, l.tooLarge(Snappy)
	}
	if n > len(b)*snappyMaxRatio {
		// Impossible in snappy: no allocation on the word of a forged header.
		return dst, fmt.Errorf("%w: snappy: block of %d bytes declares %d", ErrCorrupt, len(b), n)
	}
	dst = grow(dst, n, room)
	w := dst[len(dst) : len(dst)+n]
	out, err := snappy.Decode(w, b)
	if err != nil {
		return dst, corrupt(Snappy, err)
	}
	if len(out) != n {
		return dst, fmt.Errorf("%w: snappy: decoded %d bytes, header says %d", ErrCorrupt, len(out), n)
	}
	if n > 0 && &out[0] != &w[0] {
		copy(w, out) // not expected: Decode decodes into w, which fits
	}
	return dst[:len(dst)+n], nil
}

// appendXerial appends src to dst as a xerial-framed snappy stream: the
// header, then per 32 KiB of src a big-endian length and a raw snappy
// block.
func appendXerial(dst, src []byte) []byte {
	chunks := (len(src) + xerialChunk - 1) / xerialChunk
	bound := len(xerialHeader) + chunks*(4+s2.MaxEncodedLen(xerialChunk))
	dst = grow(dst, bound, bound)
	dst = append(dst, xerialHeader...)
	for len(src) > 0 {
		chunk := src[:min(len(src), xerialChunk)]
		src = src[len(chunk):]
		p := len(dst)
		w := dst[p+4 : p+4+s2.MaxEncodedLen(len(chunk))]
		enc := s2.EncodeSnappy(w, chunk)
		if len(enc) > 0 && &enc[0] != &w[0] {
			copy(w, enc) // not expected: EncodeSnappy encodes into w, which fits
		}
		binary.BigEndian.PutUint32(dst[p:p+4], uint32(len(enc)))
		dst = dst[:p+4+len(enc)]
	}
	return dst
}
