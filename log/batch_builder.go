package log

import (
	"encoding/binary"
	"fmt"
	"math"
)

// BatchOptions are the header fields of a batch being built. The zero
// value builds an uncompressed batch without a producer.
type BatchOptions struct {
	// Idempotent makes the batch an idempotent (or transactional)
	// producer's, control batches included: ProducerID, ProducerEpoch and
	// BaseSequence are written into its header as given, and a leader's
	// log takes a batch with the same ones as a retry (see
	// Log.AppendAsLeader). Without it the batch has no producer
	// (NoProducerID, NoProducerEpoch, NoSequence), and Build refuses
	// (ErrInvalidRecord) any of the three set to other than zero or that
	// value, and the transactional and control attributes, which need a
	// producer. Producer id 0, epoch 0, sequence 0 cannot be told from
	// unset fields: it too needs Idempotent.
	Idempotent bool
	// ProducerID, ProducerEpoch and BaseSequence identify an idempotent
	// producer's batch (see Idempotent).
	ProducerID    int64
	ProducerEpoch int16 // see ProducerID
	BaseSequence  int32 // see ProducerID
	// Attributes other than the codec (transactional, control,
	// LogAppendTime).
	Attributes int16
	// Compressor, when set, compresses the records body; Codec is then
	// written into the attributes. Nil means uncompressed.
	Compressor Compressor
}

// Compressor compresses a records body for the batch builder; package
// compression's Local satisfies it through log.CompressWith.
type Compressor interface {
	// CodecID is the codec id written into the batch attributes.
	CodecID() int8
	// Compress appends the compressed form of src to dst.
	Compress(dst, src []byte) ([]byte, error)
}

// BatchBuilder builds one v2 record batch at a time. Reuse it with Reset:
// its buffers are kept. Its zero value, like NewBatchBuilder, builds
// batches with the zero BatchOptions. Not safe for concurrent use.
type BatchBuilder struct {
	opts     BatchOptions
	body     []byte
	count    int32
	baseTS   int64
	maxTS    int64
	compBody []byte
}

// NewBatchBuilder returns a builder for a batch without a producer id
// (the zero BatchOptions).
func NewBatchBuilder() *BatchBuilder { return &BatchBuilder{} }

// Reset starts a new batch with the given header fields, keeping buffers.
func (bb *BatchBuilder) Reset(opts BatchOptions) {
	bb.opts = opts
	bb.body = bb.body[:0]
	bb.count = 0
	bb.maxTS = NoTimestamp
}

// Len is the number of records added since Reset.
func (bb *BatchBuilder) Len() int { return int(bb.count) }

// BodySize is the size of the uncompressed records added so far.
func (bb *BatchBuilder) BodySize() int { return len(bb.body) }

// Add appends a record with the given timestamp (milliseconds), key,
// value (nil for null) and headers.
func (bb *BatchBuilder) Add(timestamp int64, key, value []byte, headers ...Header) {
	if bb.count == 0 {
		bb.baseTS, bb.maxTS = timestamp, NoTimestamp
	}
	if timestamp > bb.maxTS {
		bb.maxTS = timestamp
	}
	tsDelta := timestamp - bb.baseTS
	offDelta := int64(bb.count)
	size := 1 + varintLen(tsDelta) + varintLen(offDelta) +
		bytesLen(key) + bytesLen(value) + varintLen(int64(len(headers)))
	for _, h := range headers {
		size += varintLen(int64(len(h.Key))) + len(h.Key) + bytesLen(h.Value)
	}
	b := appendVarint(bb.body, int64(size))
	b = append(b, 0) // record attributes
	b = appendVarint(b, tsDelta)
	b = appendVarint(b, offDelta)
	b = appendBytes(b, key)
	b = appendBytes(b, value)
	b = appendVarint(b, int64(len(headers)))
	for _, h := range headers {
		b = appendVarint(b, int64(len(h.Key)))
		b = append(b, h.Key...)
		b = appendBytes(b, h.Value)
	}
	bb.body = b
	bb.count++
}

func bytesLen(v []byte) int {
	if v == nil {
		return 1
	}
	return varintLen(int64(len(v))) + len(v)
}

func appendBytes(b, v []byte) []byte {
	if v == nil {
		return appendVarint(b, -1)
	}
	b = appendVarint(b, int64(len(v)))
	return append(b, v...)
}

// producer returns the producer fields a batch built with o carries.
func (o BatchOptions) producer() (int64, int16, int32, error) {
	if o.Idempotent {
		return o.ProducerID, o.ProducerEpoch, o.BaseSequence, nil
	}
	if o.Attributes&(attrTransactional|attrControl) != 0 {
		return 0, 0, 0, fmt.Errorf("%w: transactional or control attributes %#x without BatchOptions.Idempotent", ErrInvalidRecord, o.Attributes)
	}
	if o.ProducerID != 0 && o.ProducerID != NoProducerID ||
		o.ProducerEpoch != 0 && o.ProducerEpoch != NoProducerEpoch ||
		o.BaseSequence != 0 && o.BaseSequence != NoSequence {
		return 0, 0, 0, fmt.Errorf("%w: producer id %d, epoch %d, sequence %d without BatchOptions.Idempotent",
			ErrInvalidRecord, o.ProducerID, o.ProducerEpoch, o.BaseSequence)
	}
	return NoProducerID, NoProducerEpoch, NoSequence, nil
}

// Build appends the finished batch to dst and returns it. The batch's
// base offset is 0 and its leader epoch NoLeaderEpoch: the log assigns
// both on append. The builder may be Reset and reused afterwards. On an
// error (producer fields, or the transactional or control attribute,
// without BatchOptions.Idempotent; a batch over 2 GiB; the Compressor's)
// it returns dst unchanged.
func (bb *BatchBuilder) Build(dst []byte) ([]byte, error) {
	pid, epoch, seq, err := bb.opts.producer()
	if err != nil {
		return dst, err
	}
	body := bb.body
	attrs := bb.opts.Attributes &^ attrCodecMask
	if c := bb.opts.Compressor; c != nil && c.CodecID() != 0 {
		var err error
		bb.compBody, err = c.Compress(bb.compBody[:0], bb.body)
		if err != nil {
			return dst, err
		}
		body = bb.compBody
		attrs |= int16(c.CodecID()) & attrCodecMask
	}
	size := BatchHeaderSize + len(body)
	if size-LogOverhead > math.MaxInt32 {
		return dst, ErrBatchTooLarge
	}
	start := len(dst)
	dst = append(dst, make([]byte, BatchHeaderSize)...)
	h := dst[start:]
	be := binary.BigEndian
	be.PutUint64(h[offBaseOffset:], 0)
	be.PutUint32(h[offLength:], uint32(size-LogOverhead))
	Batch(h).setLeaderEpoch(NoLeaderEpoch)
	h[offMagic] = MagicV2
	be.PutUint16(h[offAttributes:], uint16(attrs))
	lastDelta := bb.count - 1
	if bb.count == 0 {
		lastDelta = 0
	}
	be.PutUint32(h[offLastOffsetDelta:], uint32(lastDelta))
	baseTS, maxTS := bb.baseTS, bb.maxTS
	if bb.count == 0 {
		baseTS, maxTS = NoTimestamp, NoTimestamp
	}
	be.PutUint64(h[offBaseTimestamp:], uint64(baseTS))
	be.PutUint64(h[offMaxTimestamp:], uint64(maxTS))
	be.PutUint64(h[offProducerID:], uint64(pid))
	be.PutUint16(h[offProducerEpoch:], uint16(epoch))
	be.PutUint32(h[offBaseSequence:], uint32(seq))
	be.PutUint32(h[offRecordsCount:], uint32(bb.count))
	dst = append(dst, body...)
	batch := Batch(dst[start:])
	be.PutUint32(batch[offCRC:], batch.ComputeCRC())
	return dst, nil
}
