package compression

import (
	"encoding/binary"
	"math/bits"
)

// XXH32 primes, from the xxHash specification.
const (
	xxPrime1 uint32 = 2654435761
	xxPrime2 uint32 = 2246822519
	xxPrime3 uint32 = 3266489917
	xxPrime4 uint32 = 668265263
	xxPrime5 uint32 = 374761393
)

// xxh32Round mixes one 4-byte lane into an accumulator.
func xxh32Round(acc, lane uint32) uint32 {
	return bits.RotateLeft32(acc+lane*xxPrime2, 13) * xxPrime1
}

// xxh32 returns the 32-bit xxHash of b with the given seed, as the LZ4 frame
// format uses it for its header, block and content checksums (seed 0).
func xxh32(b []byte, seed uint32) uint32 {
	n := len(b)
	var h uint32
	if n >= 16 {
		v1 := seed + xxPrime1 + xxPrime2
		v2 := seed + xxPrime2
		v3 := seed
		v4 := seed - xxPrime1
		for len(b) >= 16 {
			v1 = xxh32Round(v1, binary.LittleEndian.Uint32(b[0:]))
			v2 = xxh32Round(v2, binary.LittleEndian.Uint32(b[4:]))
			v3 = xxh32Round(v3, binary.LittleEndian.Uint32(b[8:]))
			v4 = xxh32Round(v4, binary.LittleEndian.Uint32(b[12:]))
			b = b[16:]
		}
		h = bits.RotateLeft32(v1, 1) + bits.RotateLeft32(v2, 7) +
			bits.RotateLeft32(v3, 12) + bits.RotateLeft32(v4, 18)
	} else {
		h = seed + xxPrime5
	}
	h += uint32(n)
	for len(b) >= 4 {
		h += binary.LittleEndian.Uint32(b) * xxPrime3
		h = bits.RotateLeft32(h, 17) * xxPrime4
		b = b[4:]
	}
	for _, c := range b {
		h += uint32(c) * xxPrime5
		h = bits.RotateLeft32(h, 11) * xxPrime1
	}
	h ^= h >> 15
	h *= xxPrime2
	h ^= h >> 13
	h *= xxPrime3
	h ^= h >> 16
	return h
}
