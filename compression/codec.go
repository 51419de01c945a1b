package compression

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error returned by this package wraps one of them
// (with %w), so callers match with errors.Is. The error of a corrupt stream
// may also wrap the underlying library's error.
var (
	// ErrUnknownCodec is returned for a codec id or name that is not one of
	// None, Gzip, Snappy, LZ4 or Zstd.
	ErrUnknownCodec = errors.New("compression: unknown codec")
	// ErrCorrupt is returned when compressed input is malformed, truncated,
	// fails a checksum or has bytes after its end.
	ErrCorrupt = errors.New("compression: corrupt input")
	// ErrTooLarge is returned when decompressed output would exceed the
	// Local's MaxDecompressedSize (a decompression bomb, or a limit set too
	// small). It is detected while decoding, before the output buffer grows
	// past the limit; see the package doc.
	ErrTooLarge = errors.New("compression: decompressed size exceeds limit")
	// ErrInvalidLevel is returned by Compress and Codec.CheckLevel for a
	// level outside the codec's range.
	ErrInvalidLevel = errors.New("compression: invalid compression level")
	// ErrUnsupported is returned for valid input that uses a format feature
	// Kafka never writes and this package does not implement (an LZ4
	// dictionary id or legacy LZ4 frame, a zstd dictionary).
	ErrUnsupported = errors.New("compression: unsupported format feature")
)

// Codec identifies a compression codec by the id Kafka stores in bits 0-2
// of a record batch's attributes. It is a plain value, safe for concurrent
// use.
type Codec int8

// The codecs, numbered as in Kafka's record batch attributes.
const (
	None   Codec = 0 // no compression
	Gzip   Codec = 1 // gzip (RFC 1952)
	Snappy Codec = 2 // snappy, xerial-framed or a raw block
	LZ4    Codec = 3 // LZ4 frame
	Zstd   Codec = 4 // zstandard frame
)

// AttributesMask selects the codec bits of a record batch's attributes:
// CodecFromID(int(attributes & AttributesMask)).
const AttributesMask = 0x07

var codecNames = [...]string{None: "none", Gzip: "gzip", Snappy: "snappy", LZ4: "lz4", Zstd: "zstd"}

// String returns the codec's name as Kafka's compression.type spells it
// ("none", "gzip", "snappy", "lz4", "zstd"), or "codec(N)" for an unknown id.
func (c Codec) String() string {
	if c.Valid() {
		return codecNames[c]
	}
	return fmt.Sprintf("codec(%d)", int8(c))
}

// Valid reports whether c is one of the five known codecs.
func (c Codec) Valid() bool { return c >= None && c <= Zstd }

// CodecFromID returns the codec with the given Kafka id, or an error
// wrapping ErrUnknownCodec.
func CodecFromID(id int) (Codec, error) {
	if id < int(None) || id > int(Zstd) {
		return None, fmt.Errorf("%w: id %d", ErrUnknownCodec, id)
	}
	return Codec(id), nil
}

// ParseCodec returns the codec named name, case-insensitively, as String
// spells it; "uncompressed" (Kafka's topic-level name) is accepted for
// None. Other names give an error wrapping ErrUnknownCodec.
func ParseCodec(name string) (Codec, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == "uncompressed" {
		return None, nil
	}
	for c, s := range codecNames {
		if n == s {
			return Codec(c), nil
		}
	}
	return None, fmt.Errorf("%w: %q", ErrUnknownCodec, name)
}

// MarshalText implements encoding.TextMarshaler with the codec's name, so
// a Codec reads well in JSON and flag configuration.
func (c Codec) MarshalText() ([]byte, error) {
	if !c.Valid() {
		return nil, fmt.Errorf("%w: id %d", ErrUnknownCodec, int8(c))
	}
	return []byte(codecNames[c]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseCodec.
func (c *Codec) UnmarshalText(text []byte) error {
	v, err := ParseCodec(string(text))
	if err != nil {
		return err
	}
	*c = v
	return nil
}
