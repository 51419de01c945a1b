package log

import (
	"fmt"

	"github.com/replog/replog/compression"
)

// localCompressor adapts a compression.Local to the batch builder.
type localCompressor struct {
	local *compression.Local
	codec compression.Codec
	level int
}

func (c localCompressor) CodecID() int8 { return int8(c.codec) }

func (c localCompressor) Compress(dst, src []byte) ([]byte, error) {
	return c.local.Compress(dst, src, c.codec, c.level)
}

// CompressWith returns a Compressor for BatchOptions that compresses the
// records body with codec at level (0: the codec's default), using local's
// reusable buffers. Like local, it is not safe for concurrent use.
func CompressWith(local *compression.Local, codec compression.Codec, level int) (Compressor, error) {
	if !codec.Valid() {
		return nil, fmt.Errorf("%w: codec %d", compression.ErrUnknownCodec, codec)
	}
	if err := codec.CheckLevel(level); err != nil {
		return nil, err
	}
	return localCompressor{local: local, codec: codec, level: level}, nil
}

// ResetBatch makes the iterator walk b's records, decompressing the
// records body with local into the iterator's reusable buffer when b is
// compressed (local may be nil for uncompressed batches). The batch header
// should have been validated (ValidateHeader). Decompression errors wrap
// the compression package's sentinels (corrupt input, output over the
// Local's limit, unknown codec) and leave the iterator empty.
func (it *RecordIterator) ResetBatch(b Batch, local *compression.Local) error {
	if b.CodecID() == 0 {
		it.reset(b, b.RecordsBody())
		return nil
	}
	if local == nil {
		it.reset(b, nil)
		it.err = fmt.Errorf("%w: batch at offset %d is compressed (codec %d) and no compression.Local was given", ErrInvalidRecord, b.BaseOffset(), b.CodecID())
		return it.err
	}
	var err error
	it.decomp, err = local.Decompress(it.decomp[:0], b.RecordsBody(), compression.Codec(b.CodecID()))
	if err != nil {
		it.reset(b, nil)
		it.remaining = 0
		it.err = fmt.Errorf("batch at offset %d: %w", b.BaseOffset(), err)
		return it.err
	}
	it.reset(b, it.decomp)
	return nil
}
