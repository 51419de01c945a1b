package log

import "fmt"

// Kafka encodes record fields as zigzag varints: at most 5 bytes for a
// varint (int32) and 10 for a varlong (int64). Longer encodings, values
// that overflow the type (a 10th byte above 1, a varint outside int32),
// and truncated ones, are corrupt.

// appendVarint appends v as a zigzag varint.
func appendVarint(b []byte, v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// varintLen returns the encoded length of v as a zigzag varint.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// readVarint decodes a zigzag varint of at most maxLen bytes from b,
// returning the value and the number of bytes read. One- and two-byte
// encodings, most of a record's fields, take varintShort's path.
func readVarint(b []byte, maxLen int) (int64, int, error) {
	if v, n := varintShort(b, 0); n > 0 {
		return v, n, nil
	}
	return readVarintLong(b, maxLen)
}

// readVarintLong is readVarint for encodings of three or more bytes, and
// for short or corrupt input.
func readVarintLong(b []byte, maxLen int) (int64, int, error) {
	var u uint64
	for i := 0; i < len(b); i++ {
		if i >= maxLen {
			return 0, 0, fmt.Errorf("%w: varint longer than %d bytes", ErrCorrupt, maxLen)
		}
		c := b[i]
		if i == 9 && c > 1 {
			// The 10th byte holds bit 63 only: anything more overflows
			// 64 bits (binary.Uvarint rejects it the same way).
			return 0, 0, fmt.Errorf("%w: varint overflows 64 bits", ErrCorrupt)
		}
		u |= uint64(c&0x7f) << (7 * uint(i))
		if c < 0x80 {
			v := int64(u>>1) ^ -int64(u&1)
			if maxLen == 5 && (v > 1<<31-1 || v < -1<<31) {
				return 0, 0, fmt.Errorf("%w: varint overflows int32", ErrCorrupt)
			}
			return v, i + 1, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: truncated varint", ErrCorrupt)
}
