package compression

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
)

// gzipMaxRatio bounds how many bytes one byte of deflate output can stand
// for (a 258-byte match costs at least two bits); it caps the size hint
// taken from a gzip trailer.
const gzipMaxRatio = 1032

// gunzip appends the decompression of the gzip stream src (one or more
// members) to dst. Output is read in windows that never reach past the
// limit plus one byte, so a bomb fails with ErrTooLarge after at most the
// limit has been allocated.
func (l *Local) gunzip(dst, src []byte) ([]byte, error) {
	l.rd.Reset(src)
	defer l.rd.Reset(nil)
	if err := l.gzr.Reset(&l.rd); err != nil {
		return dst, corrupt(Gzip, err)
	}
	limit := l.MaxDecompressedSize()
	start := len(dst)
	// The trailer's ISIZE (size mod 2^32 of the last member) is a size hint:
	// usually exact, never trusted beyond the limit or what src can hold.
	if len(src) >= 18 {
		hint := int(min(uint64(binary.LittleEndian.Uint32(src[len(src)-4:])),
			uint64(limit), uint64(len(src))*gzipMaxRatio))
		dst = grow(dst, hint, limit)
	}
	for {
		room := limit - (len(dst) - start) // >= 0: checked below
		var n int
		var err error
		if len(dst) < cap(dst) {
			w := dst[len(dst):min(cap(dst), len(dst)+room+1)]
			n, err = l.gzr.Read(w)
			dst = dst[:len(dst)+n]
		} else {
			// dst is full: probe for more output before growing it, so that an
			// exactly sized dst stays allocation-free.
			p := l.gzp[:min(len(l.gzp), room+1)]
			n, err = l.gzr.Read(p)
			if n > room {
				return dst, l.tooLarge(Gzip)
			}
			if n > 0 {
				dst = append(grow(dst, n, room), p[:n]...)
			}
		}
		if len(dst)-start > limit {
			return dst, l.tooLarge(Gzip)
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, corrupt(Gzip, err)
		}
	}
}

// gzipLevel maps a checked level to the index of Local.gzw and the level of
// klauspost's gzip.
func gzipLevel(level int) (int, int) {
	if level <= 0 {
		return 0, gzip.DefaultCompression
	}
	return level, level
}

// gzip appends one gzip member holding src to dst.
func (l *Local) gzip(dst, src []byte, level int) ([]byte, error) {
	i, lv := gzipLevel(level)
	w := l.gzw[i]
	if w == nil {
		var err error
		if w, err = gzip.NewWriterLevel(&l.out, lv); err != nil {
			return dst, fmt.Errorf("%w: gzip level %d: %w", ErrInvalidLevel, level, err)
		}
		l.gzw[i] = w
	}
	// Deflate stores incompressible input in blocks of at most 64 KiB with a
	// 5-byte header; the gzip header and trailer take 18 bytes more.
	l.out.b = grow(dst, len(src)+5*(len(src)/16384+2)+32, len(src)+5*(len(src)/16384+2)+32)
	w.Reset(&l.out)
	_, err := w.Write(src)
	if err == nil {
		err = w.Close()
	}
	out := l.out.b
	l.out.b = nil
	if err != nil { // appendWriter never fails: an internal error of gzip
		return dst, fmt.Errorf("compression: gzip: %w", err)
	}
	return out, nil
}
