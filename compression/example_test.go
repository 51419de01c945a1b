package compression_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/replog/replog/compression"
)

// A request handler owns a Local and one output buffer, and decompresses
// every batch of a request into the same buffer: after the first batches,
// nothing is allocated.
func ExampleLocal() {
	l := compression.NewLocal(compression.Options{MaxDecompressedSize: 1 << 20})

	// Batch bodies as a producer would send them.
	var bodies [][]byte
	for i := range 3 {
		body := strings.Repeat(fmt.Sprintf(`{"batch":%d,"event":"click"}`, i), 20)
		z, err := l.Compress(nil, []byte(body), compression.LZ4, compression.DefaultLevel)
		if err != nil {
			panic(err)
		}
		bodies = append(bodies, z)
	}

	var out []byte
	for _, z := range bodies {
		var err error
		if out, err = l.Decompress(out[:0], z, compression.LZ4); err != nil {
			panic(err)
		}
		fmt.Println(len(z) < len(out), string(out[:26]))
	}
	// Output:
	// true {"batch":0,"event":"click"
	// true {"batch":1,"event":"click"
	// true {"batch":2,"event":"click"
}

// A decompression bomb fails with ErrTooLarge, found while decoding.
func ExampleLocal_Decompress_limit() {
	l := compression.NewLocal(compression.Options{MaxDecompressedSize: 1 << 10})
	bomb, err := l.Compress(nil, make([]byte, 1<<20), compression.Zstd, compression.DefaultLevel)
	if err != nil {
		panic(err)
	}
	_, err = l.Decompress(nil, bomb, compression.Zstd)
	fmt.Println(len(bomb) < 1<<20/1000, errors.Is(err, compression.ErrTooLarge))
	// Output:
	// true true
}

// A Pool serves callers that do not own a Local; it is safe for concurrent
// use.
func ExamplePool() {
	pool := compression.NewPool(compression.Options{})
	codec, err := compression.ParseCodec("zstd")
	if err != nil {
		panic(err)
	}
	z, err := pool.Compress(nil, []byte("hello, log"), codec, 3)
	if err != nil {
		panic(err)
	}
	out, err := pool.Decompress(nil, z, codec)
	fmt.Println(codec, int(codec), string(out), err)
	// Output:
	// zstd 4 hello, log <nil>
}

// The codec of a record batch sits in bits 0-2 of its attributes.
func ExampleCodecFromID() {
	attributes := int16(0x0013) // transactional, lz4
	c, err := compression.CodecFromID(int(attributes & compression.AttributesMask))
	fmt.Println(c, err)
	_, err = compression.CodecFromID(6)
	fmt.Println(errors.Is(err, compression.ErrUnknownCodec))
	// Output:
	// lz4 <nil>
	// true
}
