package log

import (
	"errors"
	"fmt"
	"sync"

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
// reusable buffers (a nil local: a Local of its own). Like local, it is
// not safe for concurrent use.
func CompressWith(local *compression.Local, codec compression.Codec, level int) (Compressor, error) {
	if local == nil {
		local = compression.NewLocal(compression.Options{})
	}
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

// maxRetainedScratch is the largest decompression buffer a
// leaderScratch keeps for reuse; a larger one, made for an unusually big
// batch, is dropped rather than pinned in the pool.
const maxRetainedScratch = 4 << 20

// leaderScratch is the per-call decompression context of a leader append
// that carries compressed batches: a compression.Local (zero value: the
// default decompressed-size limit) and a reusable output buffer. It comes
// from leaderScratchPool, so that steady-state appends do not allocate
// decoders or buffers (DESIGN lesson 3).
type leaderScratch struct {
	local compression.Local
	buf   []byte
}

// leaderScratchPool holds leaderScratch values between leader appends.
// Like headerPool it is a cache, not state: any value in it is as good
// as a new one.
var leaderScratchPool = sync.Pool{New: func() any { return new(leaderScratch) }}

// getLeaderScratch takes a leaderScratch from the pool; hand it back with
// release.
func getLeaderScratch() *leaderScratch { return leaderScratchPool.Get().(*leaderScratch) }

// release returns s to the pool; s may be nil.
func (s *leaderScratch) release() {
	if s == nil {
		return
	}
	if cap(s.buf) > maxRetainedScratch {
		s.buf = nil
	}
	leaderScratchPool.Put(s)
}

// checkCompressed decompresses the records body of the compressed batch b
// (whose header is valid) and checks the records as Validate checks an
// uncompressed body (checkRecords), as Kafka's leader does before it
// accepts a compressed batch. Errors wrap ErrCorrupt (a corrupt stream or
// records), ErrBatchTooLarge (output over the decompressed-size limit) or
// ErrInvalidRecord (a stream feature compression does not implement),
// together with the compression package's sentinel when it found the
// problem. It returns the records' max timestamp (see checkRecords).
func (s *leaderScratch) checkCompressed(b Batch) (maxTS int64, err error) {
	s.buf, err = s.local.Decompress(s.buf[:0], b.RecordsBody(), compression.Codec(b.CodecID()))
	if err != nil {
		kind := ErrCorrupt
		switch {
		case errors.Is(err, compression.ErrTooLarge):
			kind = ErrBatchTooLarge
		case errors.Is(err, compression.ErrUnsupported), errors.Is(err, compression.ErrUnknownCodec):
			kind = ErrInvalidRecord
		}
		return 0, fmt.Errorf("%w: compressed batch (codec %d): %w", kind, b.CodecID(), err)
	}
	if maxTS, err = checkRecords(s.buf, b.RecordCount(), b.LastOffsetDelta(), b.BaseTimestamp()); err != nil {
		return 0, fmt.Errorf("compressed batch (codec %d): %w", b.CodecID(), err)
	}
	return maxTS, nil
}
