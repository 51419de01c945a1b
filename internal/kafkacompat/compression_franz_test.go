package kafkacompat

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/replog/replog/compression"
)

// franzCodec returns franz-go's codec for ours.
func franzCodec(c compression.Codec) kgo.CompressionCodec {
	switch c {
	case compression.Gzip:
		return kgo.GzipCompression()
	case compression.Snappy:
		return kgo.SnappyCompression()
	case compression.LZ4:
		return kgo.Lz4Compression()
	case compression.Zstd:
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

var compatCodecs = []compression.Codec{compression.Gzip, compression.Snappy, compression.LZ4, compression.Zstd}

// compatBodies returns record bodies from one record to several LZ4 blocks
// and xerial chunks.
func compatBodies() [][]byte {
	return [][]byte{
		appendCompatRecords(nil, compatRecords(1, 1, 100)),
		appendCompatRecords(nil, compatRecords(2, 4, 1024)),
		appendCompatRecords(nil, compatRecords(3, 150, 1024)), // ~155 KiB
	}
}

// TestCompressionFranzCodecs checks franz-go's compressor and
// decompressor, the ones kgo uses on the wire, against ours, for every
// codec and a range of levels.
func TestCompressionFranzCodecs(t *testing.T) {
	var l compression.Local
	dec := kgo.DefaultDecompressor()
	levels := map[compression.Codec][]int{
		compression.Gzip:   {0, 1, 9},
		compression.Snappy: {0},
		compression.LZ4:    {0, 9, 17},
		compression.Zstd:   {0, 1, 22},
	}
	for _, c := range compatCodecs {
		for i, body := range compatBodies() {
			t.Run(fmt.Sprintf("%s/franz->ours/%d", c, i), func(t *testing.T) {
				comp, err := kgo.DefaultCompressor(franzCodec(c))
				require.NoError(t, err)
				z, used := comp.Compress(new(bytes.Buffer), body)
				require.EqualValues(t, c, used, "franz-go's codec id is Kafka's")
				got, err := l.Decompress(nil, z, c)
				require.NoError(t, err)
				require.True(t, bytes.Equal(body, got))
			})
			for _, level := range levels[c] {
				t.Run(fmt.Sprintf("%s/ours->franz/level=%d/%d", c, level, i), func(t *testing.T) {
					z, err := l.Compress(nil, body, c, level)
					require.NoError(t, err)
					got, err := dec.Decompress(z, kgo.CompressionCodecType(c))
					require.NoError(t, err)
					require.True(t, bytes.Equal(body, got))
				})
			}
		}
	}
}
