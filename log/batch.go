package log

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Record batch v2 layout: see the package documentation for the diagram.
const (
	// BatchHeaderSize is the size of a v2 record batch header.
	BatchHeaderSize = 61
	// LogOverhead is the size of the fields before the length's coverage:
	// baseOffset (8) and length (4).
	LogOverhead = 12
	// MagicV2 is the only batch format version replog reads and writes.
	MagicV2 = 2

	// NoProducerID, NoProducerEpoch, NoSequence, NoTimestamp and
	// NoLeaderEpoch are Kafka's "absent" values.
	NoProducerID    = int64(-1)
	NoProducerEpoch = int16(-1)
	NoSequence      = int32(-1)
	NoTimestamp     = int64(-1)
	NoLeaderEpoch   = int32(-1)

	offBaseOffset      = 0
	offLength          = 8
	offLeaderEpoch     = 12
	offMagic           = 16
	offCRC             = 17
	offAttributes      = 21
	offLastOffsetDelta = 23
	offBaseTimestamp   = 27
	offMaxTimestamp    = 35
	offProducerID      = 43
	offProducerEpoch   = 51
	offBaseSequence    = 53
	offRecordsCount    = 57

	attrCodecMask     = 0x07
	attrLogAppendTime = 0x08
	attrTransactional = 0x10
	attrControl       = 0x20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Batch is a read-only view over the bytes of exactly one v2 record batch,
// header included. Accessors do not copy; the view is valid as long as the
// underlying bytes are. Use SplitBatch or Validate before trusting the
// accessors on untrusted bytes: they assume at least BatchHeaderSize bytes.
type Batch []byte

func (b Batch) i16(off int) int16 { return int16(binary.BigEndian.Uint16(b[off:])) }
func (b Batch) i32(off int) int32 { return int32(binary.BigEndian.Uint32(b[off:])) }
func (b Batch) i64(off int) int64 { return int64(binary.BigEndian.Uint64(b[off:])) }

// BaseOffset is the offset of the batch's first record.
func (b Batch) BaseOffset() int64 { return b.i64(offBaseOffset) }

// Length is the batch size minus LogOverhead, as stored in the header.
func (b Batch) Length() int32 { return b.i32(offLength) }

// Size is the whole batch size in bytes.
func (b Batch) Size() int { return int(b.Length()) + LogOverhead }

// LeaderEpoch is the partition leader epoch stamped by the leader.
func (b Batch) LeaderEpoch() int32 { return b.i32(offLeaderEpoch) }

// Magic is the format version (2).
func (b Batch) Magic() int8 { return int8(b[offMagic]) }

// CRC is the stored CRC-32C of bytes [21, end).
func (b Batch) CRC() uint32 { return binary.BigEndian.Uint32(b[offCRC:]) }

// Attributes are the batch attribute bits.
func (b Batch) Attributes() int16 { return b.i16(offAttributes) }

// CodecID is the compression codec id in the attributes (0 none, 1 gzip,
// 2 snappy, 3 lz4, 4 zstd).
func (b Batch) CodecID() int8 { return int8(b.Attributes() & attrCodecMask) }

// IsLogAppendTime reports whether timestamps are the broker's append time.
func (b Batch) IsLogAppendTime() bool { return b.Attributes()&attrLogAppendTime != 0 }

// IsTransactional reports the transactional attribute bit.
func (b Batch) IsTransactional() bool { return b.Attributes()&attrTransactional != 0 }

// IsControl reports the control-batch attribute bit.
func (b Batch) IsControl() bool { return b.Attributes()&attrControl != 0 }

// LastOffsetDelta is LastOffset - BaseOffset.
func (b Batch) LastOffsetDelta() int32 { return b.i32(offLastOffsetDelta) }

// LastOffset is the offset of the batch's last record.
func (b Batch) LastOffset() int64 { return b.BaseOffset() + int64(b.LastOffsetDelta()) }

// NextOffset is LastOffset + 1.
func (b Batch) NextOffset() int64 { return b.LastOffset() + 1 }

// BaseTimestamp is the timestamp the record timestamp deltas are relative to.
func (b Batch) BaseTimestamp() int64 { return b.i64(offBaseTimestamp) }

// MaxTimestamp is the largest record timestamp in the batch.
func (b Batch) MaxTimestamp() int64 { return b.i64(offMaxTimestamp) }

// ProducerID is the idempotent producer id, or NoProducerID.
func (b Batch) ProducerID() int64 { return b.i64(offProducerID) }

// hasProducer reports whether the batch carries a producer id: any
// negative id means none, as in Kafka (hasProducerId is id > -1).
func (b Batch) hasProducer() bool { return b.ProducerID() >= 0 }

// ProducerEpoch is the producer epoch, or NoProducerEpoch.
func (b Batch) ProducerEpoch() int16 { return b.i16(offProducerEpoch) }

// BaseSequence is the producer sequence of the first record, or NoSequence.
func (b Batch) BaseSequence() int32 { return b.i32(offBaseSequence) }

// LastSequence is BaseSequence + LastOffsetDelta, wrapping from MaxInt32 to 0
// as Kafka's does; NoSequence when the batch has none.
func (b Batch) LastSequence() int32 {
	base := b.BaseSequence()
	if base == NoSequence {
		return NoSequence
	}
	return int32((int64(base) + int64(b.LastOffsetDelta())) % (1 << 31))
}

// RecordCount is the number of records the header declares.
func (b Batch) RecordCount() int32 { return b.i32(offRecordsCount) }

// RecordsBody returns the records section: plain records, or one
// compressed stream when CodecID is not 0.
func (b Batch) RecordsBody() []byte { return b[BatchHeaderSize:] }

// ComputeCRC computes the CRC-32C of bytes [21, end).
func (b Batch) ComputeCRC() uint32 { return crc32.Checksum(b[offAttributes:], castagnoli) }

// setBaseOffset and setLeaderEpoch rewrite fields outside the CRC's
// coverage, as a leader does when it assigns offsets.
func (b Batch) setBaseOffset(o int64)  { binary.BigEndian.PutUint64(b[offBaseOffset:], uint64(o)) }
func (b Batch) setLeaderEpoch(e int32) { binary.BigEndian.PutUint32(b[offLeaderEpoch:], uint32(e)) }

// SplitBatch returns the first batch in buf and the bytes after it. It
// checks only what is needed to frame the batch safely: enough bytes for a
// header, a length that fits in buf and is at least a header's worth, and
// magic 2. It does not check the CRC; Validate does.
func SplitBatch(buf []byte) (Batch, []byte, error) {
	if len(buf) < BatchHeaderSize {
		return nil, buf, fmt.Errorf("%w: %d bytes, need a %d-byte batch header", ErrCorrupt, len(buf), BatchHeaderSize)
	}
	length := int64(int32(binary.BigEndian.Uint32(buf[offLength:])))
	if length < BatchHeaderSize-LogOverhead {
		return nil, buf, fmt.Errorf("%w: batch length %d below header size", ErrCorrupt, length)
	}
	size := length + LogOverhead
	if size > int64(len(buf)) {
		return nil, buf, fmt.Errorf("%w: batch of %d bytes truncated to %d", ErrCorrupt, size, len(buf))
	}
	if m := int8(buf[offMagic]); m != MagicV2 {
		return nil, buf, fmt.Errorf("%w: magic %d, want %d", ErrCorrupt, m, MagicV2)
	}
	return Batch(buf[:size]), buf[size:], nil
}

// ValidateHeader checks the batch framing and CRC and the header's
// internal consistency, without looking at the records: record count and
// last offset delta not negative, delta at least count-1, offsets that do
// not overflow int64 (NextOffset must be representable), a known codec.
func (b Batch) ValidateHeader() error { return b.validateHeader(true) }

// validateHeader is ValidateHeader, with the CRC computed only if crc is
// set.
func (b Batch) validateHeader(crc bool) error {
	if len(b) < BatchHeaderSize {
		return fmt.Errorf("%w: %d bytes, shorter than a batch header (%d)", ErrCorrupt, len(b), BatchHeaderSize)
	}
	if b.Size() != len(b) {
		return fmt.Errorf("%w: batch length field %d does not match %d bytes", ErrCorrupt, b.Length(), len(b))
	}
	if b.Magic() != MagicV2 {
		return fmt.Errorf("%w: magic %d, want %d", ErrCorrupt, b.Magic(), MagicV2)
	}
	if crc {
		if got, want := b.ComputeCRC(), b.CRC(); got != want {
			return fmt.Errorf("%w: batch at offset %d: crc %08x, stored %08x", ErrCorrupt, b.BaseOffset(), got, want)
		}
	}
	count, delta := b.RecordCount(), b.LastOffsetDelta()
	if count < 0 || delta < 0 {
		return fmt.Errorf("%w: negative record count %d or last offset delta %d", ErrCorrupt, count, delta)
	}
	if count > 0 && delta < count-1 {
		return fmt.Errorf("%w: last offset delta %d with %d records", ErrCorrupt, delta, count)
	}
	if base := b.BaseOffset(); base > math.MaxInt64-1-int64(delta) {
		return fmt.Errorf("%w: base offset %d plus last offset delta %d overflows int64", ErrCorrupt, base, delta)
	}
	if b.CodecID() == 0 && int64(count) > int64(len(b)-BatchHeaderSize)/minRecordSize {
		return fmt.Errorf("%w: %d records cannot fit in %d bytes", ErrCorrupt, count, len(b)-BatchHeaderSize)
	}
	if b.CodecID() > 4 {
		return fmt.Errorf("%w: unknown compression codec %d", ErrCorrupt, b.CodecID())
	}
	return nil
}

// Validate checks the header (ValidateHeader) and, for uncompressed
// batches, every record: lengths, varint bounds, offset deltas that
// increase within [0, LastOffsetDelta] (0..n-1 but where Kafka's
// compaction removed records; a leader append requires 0..n-1), no bytes
// left after the last record. Compressed bodies are checked when their
// records are iterated.
func (b Batch) Validate() error {
	_, err := b.validate()
	return err
}

// validate is Validate, also returning the max timestamp of an
// uncompressed batch's records as checkRecords computes it (NoTimestamp
// for a compressed batch).
func (b Batch) validate() (maxTS int64, err error) {
	if err := b.ValidateHeader(); err != nil {
		return 0, err
	}
	if b.CodecID() != 0 {
		return NoTimestamp, nil
	}
	if maxTS, err = checkRecords(b.RecordsBody(), b.RecordCount(), b.LastOffsetDelta(), b.BaseTimestamp()); err != nil {
		return 0, err
	}
	return maxTS, nil
}

// checkLeaderRules applies the rules Kafka's leader applies to a v2 batch
// from a producer (LogValidator.validateBatch) on top of Validate: at
// least one record, a last offset delta of exactly count-1, for
// compressed batches too, and, with a producer id, an epoch and (but for a
// control batch, a transaction marker) a sequence that are not negative
// (without them the producer-state checks
// would have nothing to compare, and two different batches would look
// like retries of each other). Followers do not apply them: a compacted
// batch may hold fewer records than its offset range, or none.
func (b Batch) checkLeaderRules() error {
	count, delta := b.RecordCount(), b.LastOffsetDelta()
	if count <= 0 {
		return fmt.Errorf("%w: leader batch with %d records", ErrInvalidRecord, count)
	}
	if delta != count-1 {
		return fmt.Errorf("%w: last offset delta %d with %d records", ErrInvalidRecord, delta, count)
	}
	if pid := b.ProducerID(); b.hasProducer() && (b.ProducerEpoch() < 0 || !b.IsControl() && b.BaseSequence() < 0) {
		return fmt.Errorf("%w: producer id %d with sequence %d and epoch %d", ErrInvalidRecord, pid, b.BaseSequence(), b.ProducerEpoch())
	}
	return nil
}

// checkLeaderMaxTimestamp checks, on a leader, that a batch's max
// timestamp is want, its records' largest or NoTimestamp if that is lower
// (from validate or checkCompressed), as Kafka's leader computes it. A
// larger one would send timestamp lookups to a batch without such a
// record and keep it from time retention, with every segment after it; a
// smaller one, or -1, would hide the batch from them. The batch must be a
// create-time one: the log has no LogAppendTime mode, and its max
// timestamp, the append time in such a batch, would be the producer's
// word (Kafka's leader rewrites the type to its topic's, and the CRC with
// it; the log does not rewrite what the CRC covers). Followers keep what
// their leader wrote: a compacted batch keeps its max timestamp when
// records go.
func (b Batch) checkLeaderMaxTimestamp(want int64) error {
	if b.IsLogAppendTime() {
		return fmt.Errorf("%w: LogAppendTime batch from a producer (the log keeps create times)", ErrInvalidRecord)
	}
	if b.MaxTimestamp() != want {
		return fmt.Errorf("%w: max timestamp %d, records up to %d", ErrInvalidRecord, b.MaxTimestamp(), want)
	}
	return nil
}
