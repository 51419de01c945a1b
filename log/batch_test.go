package log

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"testing"

	"github.com/replog/replog/compression"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Helpers that build batches by hand from the Kafka v2 layout, independent
// of BatchBuilder, so that the builder and the validator are checked
// against the specification rather than against each other.

// kafkaCRC is CRC-32C over bytes [21, end) of a batch.
func kafkaCRC(b []byte) uint32 {
	return crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli))
}

// rawHeader describes the header fields of a hand-made batch.
type rawHeader struct {
	baseOffset      int64
	leaderEpoch     int32
	magic           int8
	attributes      int16
	lastOffsetDelta int32
	baseTimestamp   int64
	maxTimestamp    int64
	producerID      int64
	producerEpoch   int16
	baseSequence    int32
	count           int32
}

// defaultRawHeader is the header of an uncompressed batch without a
// producer, for count records.
func defaultRawHeader(count int32) rawHeader {
	return rawHeader{
		leaderEpoch: -1, magic: 2, lastOffsetDelta: max(count-1, 0),
		baseTimestamp: 1000, maxTimestamp: 1000,
		producerID: -1, producerEpoch: -1, baseSequence: -1, count: count,
	}
}

// rawBatch encodes h and body as a v2 batch with a correct length and CRC.
func rawBatch(h rawHeader, body []byte) []byte {
	be := binary.BigEndian
	b := make([]byte, 61, 61+len(body))
	be.PutUint64(b[0:], uint64(h.baseOffset))
	be.PutUint32(b[8:], uint32(61-12+len(body)))
	be.PutUint32(b[12:], uint32(h.leaderEpoch))
	b[16] = byte(h.magic)
	be.PutUint16(b[21:], uint16(h.attributes))
	be.PutUint32(b[23:], uint32(h.lastOffsetDelta))
	be.PutUint64(b[27:], uint64(h.baseTimestamp))
	be.PutUint64(b[35:], uint64(h.maxTimestamp))
	be.PutUint64(b[43:], uint64(h.producerID))
	be.PutUint16(b[51:], uint16(h.producerEpoch))
	be.PutUint32(b[53:], uint32(h.baseSequence))
	be.PutUint32(b[57:], uint32(h.count))
	b = append(b, body...)
	be.PutUint32(b[17:], kafkaCRC(b))
	return b
}

// fixCRC recomputes the CRC of a batch after a test changed its bytes.
func fixCRC(b []byte) []byte {
	binary.BigEndian.PutUint32(b[17:], kafkaCRC(b))
	return b
}

// zz appends v as a zigzag varint using the standard library's encoder
// (encoding/binary's Varint is zigzag, like Kafka's).
func zz(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

// rawRecord encodes one record from already-encoded fields (attributes,
// timestamp delta, offset delta, key, value, headers), prefixing the
// length.
func rawRecord(fields []byte) []byte {
	return append(zz(nil, int64(len(fields))), fields...)
}

// recordFields encodes the fields of a simple record: nil key or value
// are written as length -1.
func recordFields(tsDelta int64, offDelta int32, key, value []byte, headers ...Header) []byte {
	b := []byte{0}
	b = zz(b, tsDelta)
	b = zz(b, int64(offDelta))
	b = rawBytesField(b, key)
	b = rawBytesField(b, value)
	b = zz(b, int64(len(headers)))
	for _, h := range headers {
		b = zz(b, int64(len(h.Key)))
		b = append(b, h.Key...)
		b = rawBytesField(b, h.Value)
	}
	return b
}

func rawBytesField(b, v []byte) []byte {
	if v == nil {
		return zz(b, -1)
	}
	b = zz(b, int64(len(v)))
	return append(b, v...)
}

// overlong encodes v (a non-negative zigzag value) in exactly n bytes,
// padding with continuation bytes.
func overlong(v uint64, n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n-1; i++ {
		b[i] = byte(v&0x7f) | 0x80
		v >>= 7
	}
	b[n-1] = byte(v & 0x7f)
	return b
}

func TestBatchBuilderIsKafkaV2ByteForByte(t *testing.T) {
	type rec struct {
		ts         int64
		key, value []byte
		headers    []Header
	}
	recs := []rec{
		{ts: 1_700_000_000_000, key: []byte("k0"), value: []byte("value-0")},
		{ts: 1_700_000_000_005, key: nil, value: []byte("no key")},
		{ts: 1_699_999_999_990, key: []byte("k2"), value: nil}, // older than the first: negative delta
		{ts: 1_700_000_000_020, key: []byte{}, value: []byte{}, headers: []Header{
			{Key: []byte("h1"), Value: []byte("v1")},
			{Key: []byte(""), Value: nil},
			{Key: []byte("h3"), Value: []byte{}},
		}},
		{ts: 1_700_000_000_003, key: []byte("k4"), value: make([]byte, 300)}, // multi-byte lengths
	}
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: 0x0102030405060708, ProducerEpoch: 0x0a0b, BaseSequence: 0x11223344, Attributes: attrTransactional})
	for _, r := range recs {
		bb.Add(r.ts, r.key, r.value, r.headers...)
	}
	require.Equal(t, len(recs), bb.Len())
	prefix := []byte("prefix")
	out, err := bb.Build(append([]byte(nil), prefix...))
	require.NoError(t, err)
	require.Equal(t, prefix, out[:len(prefix)], "Build must append to dst")
	b := out[len(prefix):]

	// Expected records body, encoded by hand.
	var body []byte
	for i, r := range recs {
		body = append(body, rawRecord(recordFields(r.ts-recs[0].ts, int32(i), r.key, r.value, r.headers...))...)
	}
	require.Equal(t, body, b[61:], "records body")
	require.Equal(t, len(body), bb.BodySize())

	be := binary.BigEndian
	assert.Equal(t, uint64(0), be.Uint64(b[0:]), "baseOffset")
	assert.Equal(t, uint32(len(b)-12), be.Uint32(b[8:]), "length")
	assert.Equal(t, uint32(0xffffffff), be.Uint32(b[12:]), "partitionLeaderEpoch")
	assert.Equal(t, byte(2), b[16], "magic")
	assert.Equal(t, kafkaCRC(b), be.Uint32(b[17:]), "crc")
	assert.Equal(t, uint16(0x10), be.Uint16(b[21:]), "attributes")
	assert.Equal(t, uint32(len(recs)-1), be.Uint32(b[23:]), "lastOffsetDelta")
	assert.Equal(t, uint64(recs[0].ts), be.Uint64(b[27:]), "baseTimestamp")
	assert.Equal(t, uint64(1_700_000_000_020), be.Uint64(b[35:]), "maxTimestamp")
	assert.Equal(t, uint64(0x0102030405060708), be.Uint64(b[43:]), "producerId")
	assert.Equal(t, uint16(0x0a0b), be.Uint16(b[51:]), "producerEpoch")
	assert.Equal(t, uint32(0x11223344), be.Uint32(b[53:]), "baseSequence")
	assert.Equal(t, uint32(len(recs)), be.Uint32(b[57:]), "recordsCount")

	// The whole batch equals the hand-made one.
	h := defaultRawHeader(int32(len(recs)))
	h.attributes = attrTransactional
	h.baseTimestamp, h.maxTimestamp = recs[0].ts, 1_700_000_000_020
	h.producerID, h.producerEpoch, h.baseSequence = 0x0102030405060708, 0x0a0b, 0x11223344
	require.Equal(t, rawBatch(h, body), b)

	// The view's accessors agree.
	v := Batch(b)
	require.NoError(t, v.Validate())
	assert.Equal(t, int64(0), v.BaseOffset())
	assert.Equal(t, len(b), v.Size())
	assert.Equal(t, NoLeaderEpoch, v.LeaderEpoch())
	assert.Equal(t, int8(2), v.Magic())
	assert.Equal(t, v.ComputeCRC(), v.CRC())
	assert.True(t, v.IsTransactional())
	assert.False(t, v.IsControl())
	assert.False(t, v.IsLogAppendTime())
	assert.Equal(t, int8(0), v.CodecID())
	assert.Equal(t, int64(len(recs)-1), v.LastOffset())
	assert.Equal(t, int64(len(recs)), v.NextOffset())
	assert.Equal(t, int32(0x11223344+len(recs)-1), v.LastSequence())
	assert.Equal(t, int32(len(recs)), v.RecordCount())

	// Records decode to what was added.
	it := v.Records()
	for i, r := range recs {
		require.True(t, it.Next(), "record %d: %v", i, it.Err())
		got := it.Record()
		assert.Equal(t, int64(i), got.Offset)
		assert.Equal(t, int32(i), got.OffsetDelta)
		assert.Equal(t, r.ts, got.Timestamp)
		assert.Equal(t, r.key, got.Key)
		assert.Equal(t, r.value, got.Value)
		assert.Equal(t, r.key == nil, got.Key == nil, "record %d: null key", i)
		assert.Equal(t, r.value == nil, got.Value == nil, "record %d: null value", i)
		require.Len(t, got.Headers, len(r.headers))
		for j, hd := range r.headers {
			assert.Equal(t, hd.Key, got.Headers[j].Key)
			assert.Equal(t, hd.Value == nil, got.Headers[j].Value == nil, "header %d null value", j)
			assert.Equal(t, hd.Value, got.Headers[j].Value)
		}
	}
	require.False(t, it.Next())
	require.NoError(t, it.Err())
}

func TestBatchBuilderEmptyBatch(t *testing.T) {
	b, err := NewBatchBuilder().Build(nil)
	require.NoError(t, err)
	require.Len(t, b, BatchHeaderSize)
	h := defaultRawHeader(0)
	h.baseTimestamp, h.maxTimestamp = NoTimestamp, NoTimestamp
	require.Equal(t, rawBatch(h, nil), b)
	v := Batch(b)
	require.NoError(t, v.Validate())
	assert.Equal(t, int32(0), v.RecordCount())
	assert.Equal(t, NoSequence, v.LastSequence())
	it := v.Records()
	assert.False(t, it.Next())
	assert.NoError(t, it.Err())
}

func TestBatchBuilderResetReuse(t *testing.T) {
	bb := NewBatchBuilder()
	bb.Add(5, []byte("a"), []byte("first batch"))
	bb.Add(6, []byte("b"), []byte("first batch"))
	first, err := bb.Build(nil)
	require.NoError(t, err)
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: 9, ProducerEpoch: 1, BaseSequence: 0})
	require.Equal(t, 0, bb.Len())
	bb.Add(100, nil, []byte("x"))
	second, err := bb.Build(nil)
	require.NoError(t, err)

	want := rawBatch(rawHeader{leaderEpoch: -1, magic: 2, baseTimestamp: 100, maxTimestamp: 100,
		producerID: 9, producerEpoch: 1, baseSequence: 0, count: 1},
		rawRecord(recordFields(0, 0, nil, []byte("x"))))
	require.Equal(t, want, second)
	require.NoError(t, Batch(first).Validate(), "the first batch is not changed by reuse")
}

// TestBatchBuilderZeroOptionsHaveNoProducer: the zero BatchBuilder, and
// Reset with BatchOptions that set only a Compressor, built batches of
// producer 0 at epoch 0 and sequence 0, so that a leader took the second,
// different batch for a retry of the first and dropped its records
// (AppendInfo.Duplicate, no error). Their batches now carry no producer,
// and Build refuses producer fields without Idempotent.
func TestBatchBuilderZeroOptionsHaveNoProducer(t *testing.T) {
	lz4, err := CompressWith(compression.NewLocal(compression.Options{}), compression.LZ4, 0)
	require.NoError(t, err)
	var zero BatchBuilder
	withCodec := NewBatchBuilder()
	withCodec.Reset(BatchOptions{Compressor: lz4})
	for name, bb := range map[string]*BatchBuilder{"zero builder": &zero, "options with only a Compressor": withCodec} {
		t.Run(name, func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			for i := range 3 {
				bb.Add(int64(i), nil, []byte{byte(i)})
				b, err := bb.Build(nil)
				require.NoError(t, err)
				require.Equal(t, int64(NoProducerID), Batch(b).ProducerID())
				require.Equal(t, int16(NoProducerEpoch), Batch(b).ProducerEpoch())
				require.Equal(t, int32(NoSequence), Batch(b).BaseSequence())
				info, err := l.Append(b)
				require.NoError(t, err)
				require.False(t, info.Duplicate, "batch %d taken for a retry", i)
				require.Equal(t, int64(i), info.FirstOffset)
				bb.Reset(bb.opts)
			}
		})
	}
	for _, o := range []BatchOptions{
		{ProducerID: 7, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence},
		{ProducerID: NoProducerID, ProducerEpoch: 1, BaseSequence: NoSequence},
		{BaseSequence: 5},
		// A transaction's batches need a producer: these were built
		// with producer id -1, and a leader appended them.
		{Attributes: attrTransactional},
		{Attributes: attrTransactional | attrControl},
		{Attributes: attrControl},
	} {
		bb := NewBatchBuilder()
		bb.Reset(o)
		bb.Add(1, nil, []byte("x"))
		dst := []byte("kept")
		got, err := bb.Build(dst)
		require.ErrorIs(t, err, ErrInvalidRecord, "%+v", o)
		require.Equal(t, []byte("kept"), got)
	}
}

// TestRecordsOfACompressedBatch: Batch.Records decoded a compressed
// body as records and reported ErrCorrupt, which reads as damaged data;
// it now yields no record and ErrInvalidRecord, pointing to ResetBatch.
func TestRecordsOfACompressedBatch(t *testing.T) {
	gz, err := CompressWith(compression.NewLocal(compression.Options{}), compression.Gzip, 0)
	require.NoError(t, err)
	b := Batch(compressedBatch(t, gz, 3))
	it := b.Records()
	require.False(t, it.Next())
	require.ErrorIs(t, it.Err(), ErrInvalidRecord)
	require.NotErrorIs(t, it.Err(), ErrCorrupt)
	require.NoError(t, it.ResetBatch(b, compression.NewLocal(compression.Options{})))
	n := 0
	for it.Next() {
		n++
	}
	require.NoError(t, it.Err())
	require.Equal(t, 3, n)
}

// TestCompressWithNilLocal: CompressWith(nil, ...) returned a Compressor
// that panicked in BatchBuilder.Build; a nil Local now means one of its
// own.
func TestCompressWithNilLocal(t *testing.T) {
	c, err := CompressWith(nil, compression.LZ4, 0)
	require.NoError(t, err)
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Compressor: c})
	bb.Add(1, nil, []byte("value"))
	b, err := bb.Build(nil)
	require.NoError(t, err)
	var it RecordIterator
	require.NoError(t, it.ResetBatch(Batch(b), compression.NewLocal(compression.Options{})))
	require.True(t, it.Next())
	require.Equal(t, "value", string(it.Record().Value))
}

func TestBatchLogAppendTime(t *testing.T) {
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence, Attributes: attrLogAppendTime})
	bb.Add(10, nil, []byte("a"))
	bb.Add(30, nil, []byte("b"))
	b, err := bb.Build(nil)
	require.NoError(t, err)
	v := Batch(b)
	require.True(t, v.IsLogAppendTime())
	it := v.Records()
	for it.Next() {
		assert.Equal(t, int64(30), it.Record().Timestamp, "LogAppendTime records carry the batch max timestamp")
	}
	require.NoError(t, it.Err())
}

func TestBatchLastSequenceWraps(t *testing.T) {
	tests := []struct {
		base  int32
		count int
		want  int32
	}{
		{base: 0, count: 1, want: 0},
		{base: 10, count: 5, want: 14},
		{base: math.MaxInt32, count: 1, want: math.MaxInt32},
		{base: math.MaxInt32 - 1, count: 3, want: 0},
		{base: math.MaxInt32, count: 4, want: 2},
		{base: NoSequence, count: 3, want: NoSequence},
	}
	for _, tt := range tests {
		bb := NewBatchBuilder()
		bb.Reset(BatchOptions{Idempotent: true, ProducerID: 1, ProducerEpoch: 0, BaseSequence: tt.base})
		for i := 0; i < tt.count; i++ {
			bb.Add(0, nil, nil)
		}
		b, err := bb.Build(nil)
		require.NoError(t, err)
		assert.Equal(t, tt.want, Batch(b).LastSequence(), "base %d count %d", tt.base, tt.count)
	}
}

// TestSetPartitionLeaderEpoch follows Kafka's
// DefaultRecordBatchTest.testSetPartitionLeaderEpoch: base offset and
// leader epoch lie outside the CRC, so rewriting them keeps it valid.
func TestSetPartitionLeaderEpoch(t *testing.T) {
	b := Batch(buildBatch(t, 3, 10, 500))
	crc := b.CRC()
	b.setBaseOffset(1 << 40)
	b.setLeaderEpoch(17)
	require.NoError(t, b.Validate())
	require.Equal(t, crc, b.CRC())
	require.Equal(t, int64(1<<40), b.BaseOffset())
	require.Equal(t, int32(17), b.LeaderEpoch())
	require.Equal(t, int64(1<<40+2), b.LastOffset())
	it := b.Records()
	for i := int64(0); it.Next(); i++ {
		require.Equal(t, int64(1<<40)+i, it.Record().Offset)
	}
	require.NoError(t, it.Err())
}

// TestInvalidCrc follows Kafka's DefaultRecordBatchTest.testInvalidCrc:
// a change to any byte under the CRC is detected.
func TestInvalidCrc(t *testing.T) {
	orig := buildBatch(t, 2, 20, 0)
	for i := 17; i < len(orig); i++ {
		b := append([]byte(nil), orig...)
		b[i] ^= 0x40
		err := Batch(b).Validate()
		require.ErrorIs(t, err, ErrCorrupt, "byte %d", i)
		require.ErrorIs(t, Batch(b).ValidateHeader(), ErrCorrupt, "byte %d", i)
	}
}

type rejectLevel int

const (
	byHeader rejectLevel = iota
	byIterator
	byValidate
)

func TestBatchValidateRejects(t *testing.T) {
	okRec := func(i int32) []byte { return rawRecord(recordFields(0, i, []byte("k"), []byte("v"))) }
	twoRecs := append(okRec(0), okRec(1)...)
	header := func(count int32) rawHeader { return defaultRawHeader(count) }

	tests := []struct {
		name  string
		batch func() []byte
		// level says which check must catch it: the header (ValidateHeader),
		// record iteration, or only Validate's cross-checks of the
		// records against the header.
		level rejectLevel
	}{
		{"crc mismatch", func() []byte {
			b := rawBatch(header(2), twoRecs)
			b[len(b)-1] ^= 1
			return b
		}, byHeader},
		{"crc field changed", func() []byte {
			b := rawBatch(header(2), twoRecs)
			b[17] ^= 0x80
			return b
		}, byHeader},
		{"magic 1", func() []byte {
			h := header(2)
			h.magic = 1
			return rawBatch(h, twoRecs)
		}, byHeader},
		{"magic 3", func() []byte {
			h := header(2)
			h.magic = 3
			return rawBatch(h, twoRecs)
		}, byHeader},
		{"length too small", func() []byte {
			b := rawBatch(header(2), twoRecs)
			binary.BigEndian.PutUint32(b[8:], uint32(len(b)-13))
			return b
		}, byHeader},
		{"length too large", func() []byte {
			b := rawBatch(header(2), twoRecs)
			binary.BigEndian.PutUint32(b[8:], uint32(len(b)-11))
			return b
		}, byHeader},
		{"negative length", func() []byte {
			b := rawBatch(header(2), twoRecs)
			binary.BigEndian.PutUint32(b[8:], 0xfffffff0)
			return b
		}, byHeader},
		{"shorter than a header", func() []byte { return rawBatch(header(0), nil)[:60] }, byHeader},
		{"negative record count", func() []byte { return rawBatch(rawHeader{magic: 2, count: -1}, twoRecs) }, byHeader},
		{"negative last offset delta", func() []byte {
			h := header(2)
			h.lastOffsetDelta = -1
			return rawBatch(h, twoRecs)
		}, byHeader},
		{"last offset delta below count-1", func() []byte {
			h := header(2)
			h.lastOffsetDelta = 0
			return rawBatch(h, twoRecs)
		}, byHeader},
		{"record offset deltas not increasing", func() []byte {
			h := header(2)
			h.lastOffsetDelta = 3
			return rawBatch(h, append(okRec(1), okRec(1)...))
		}, byValidate},
		{"count larger than the bytes allow", func() []byte {
			h := header(1000)
			return rawBatch(h, twoRecs)
		}, byHeader},
		{"count larger than records present", func() []byte {
			h := header(2)
			return rawBatch(h, rawRecord(recordFields(0, 0, nil, make([]byte, 20))))
		}, byIterator},
		{"bytes after the last record", func() []byte {
			return rawBatch(header(2), append(append([]byte(nil), twoRecs...), 0))
		}, byIterator},
		{"count smaller than records present", func() []byte {
			return rawBatch(header(1), twoRecs)
		}, byIterator},
		{"unknown codec", func() []byte {
			h := header(2)
			h.attributes = 5
			return rawBatch(h, twoRecs)
		}, byHeader},
		{"record offset delta past the last offset delta", func() []byte {
			h := header(2)
			h.lastOffsetDelta = 2
			return rawBatch(h, append(okRec(0), okRec(3)...))
		}, byValidate},
		{"record offset delta negative", func() []byte {
			return rawBatch(header(1), okRec(-1))
		}, byValidate},
		{"record length past the body", func() []byte {
			r := okRec(0)
			r[0] += 2 // zigzag: length + 1
			return rawBatch(header(1), r)
		}, byIterator},
		{"record length shorter than its fields", func() []byte {
			f := recordFields(0, 0, []byte("k"), []byte("v"))
			r := append(zz(nil, int64(len(f)-1)), f...)
			return rawBatch(header(1), r)
		}, byIterator},
		{"record length longer than its fields", func() []byte {
			f := append(recordFields(0, 0, []byte("k"), []byte("v")), 0)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"record length negative", func() []byte {
			return rawBatch(header(1), zz(nil, -5))
		}, byHeader},
		{"key length below -1", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 0)
			f = zz(f, -2)
			f = append(zz(f, -1), 0)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"value length past the record", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 0)
			f = zz(f, -1)
			f = zz(f, 50)
			f = append(f, "short"...)
			f = zz(f, 0)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"header count larger than bytes remaining", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 0)
			f = zz(f, -1)
			f = zz(f, -1)
			f = zz(f, 100)
			f = append(f, 0, 0, 0, 0) // two empty headers' worth of bytes
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"negative header count", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 0)
			f = zz(f, -1)
			f = zz(f, -1)
			f = zz(f, -1)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"null header key", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 0)
			f = zz(f, -1)
			f = zz(f, -1)
			f = zz(f, 1)
			f = zz(f, -1) // header key length -1
			f = zz(f, -1)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"varint (offset delta) longer than 5 bytes", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = append(f, overlong(0, 6)...)
			f = zz(f, -1)
			f = zz(f, -1)
			f = zz(f, 0)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"varint (record length) longer than 5 bytes", func() []byte {
			f := recordFields(0, 0, nil, nil)
			r := append(overlong(uint64(len(f))<<1, 6), f...)
			return rawBatch(header(1), r)
		}, byIterator},
		{"varint overflowing int32 in 5 bytes", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 1<<33) // 5 bytes, beyond int32
			f = zz(f, -1)
			f = zz(f, -1)
			f = zz(f, 0)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"varlong (timestamp delta) longer than 10 bytes", func() []byte {
			f := []byte{0}
			f = append(f, overlong(0, 11)...)
			f = zz(f, 0)
			f = zz(f, -1)
			f = zz(f, -1)
			f = zz(f, 0)
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"truncated varint at the end of the record", func() []byte {
			f := []byte{0}
			f = zz(f, 0)
			f = zz(f, 0)
			f = zz(f, -1)
			f = zz(f, -1)
			f = append(f, 0x80) // header count cut short
			return rawBatch(header(1), rawRecord(f))
		}, byIterator},
		{"missing record attributes", func() []byte {
			return rawBatch(header(1), append(append(zz(nil, 0), 0, 0, 0, 0, 0, 0), 0))
		}, byIterator},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Batch(tt.batch())
			err := b.Validate()
			require.ErrorIs(t, err, ErrCorrupt)
			if tt.level == byHeader {
				require.ErrorIs(t, b.ValidateHeader(), ErrCorrupt)
				return
			}
			require.NoError(t, b.ValidateHeader(), "the header alone is valid; only the records are not")
			it := b.Records()
			for it.Next() {
			}
			if tt.level == byIterator {
				require.ErrorIs(t, it.Err(), ErrCorrupt, "iteration reports the damage too")
			} else {
				require.NoError(t, it.Err())
			}
		})
	}
}

// TestBatchValidateShort: Validate and ValidateHeader of fewer than 12
// bytes panicked (their error message read the length field); every
// prefix of a batch is now ErrCorrupt.
func TestBatchValidateShort(t *testing.T) {
	b := Batch(buildBatch(t, 2, 10, 0))
	require.NoError(t, b.Validate())
	for n := range len(b) {
		require.ErrorIs(t, b[:n].Validate(), ErrCorrupt, "%d bytes", n)
		require.ErrorIs(t, b[:n].ValidateHeader(), ErrCorrupt, "%d bytes", n)
	}
}

func TestBatchValidateAcceptsHandMade(t *testing.T) {
	recs := rawRecord(recordFields(0, 0, nil, nil))
	recs = append(recs, rawRecord(recordFields(-7, 1, []byte("k"), nil, Header{Key: []byte("h"), Value: nil}))...)
	b := Batch(rawBatch(defaultRawHeader(2), recs))
	require.NoError(t, b.Validate())
	it := b.Records()
	require.True(t, it.Next())
	require.True(t, it.Next())
	require.Equal(t, int64(1000-7), it.Record().Timestamp)
	require.Nil(t, it.Record().Headers[0].Value)
	require.False(t, it.Next())
	require.NoError(t, it.Err())
}

func TestSplitBatch(t *testing.T) {
	a := buildBatch(t, 2, 10, 0)
	b := buildBatch(t, 3, 5, 0)
	both := append(append([]byte(nil), a...), b...)

	first, rest, err := SplitBatch(both)
	require.NoError(t, err)
	require.Equal(t, a, []byte(first))
	second, rest, err := SplitBatch(rest)
	require.NoError(t, err)
	require.Equal(t, b, []byte(second))
	require.Empty(t, rest)

	tests := []struct {
		name string
		buf  []byte
	}{
		{"empty", nil},
		{"partial header", a[:BatchHeaderSize-1]},
		{"truncated batch", a[:len(a)-1]},
		{"length below header", func() []byte {
			c := append([]byte(nil), a...)
			binary.BigEndian.PutUint32(c[8:], BatchHeaderSize-LogOverhead-1)
			return c
		}()},
		{"negative length", func() []byte {
			c := append([]byte(nil), a...)
			binary.BigEndian.PutUint32(c[8:], 0x80000000)
			return c
		}()},
		{"bad magic", func() []byte {
			c := append([]byte(nil), a...)
			c[16] = 1
			return c
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, rest, err := SplitBatch(tt.buf)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Nil(t, got)
			require.Equal(t, tt.buf, rest, "the input is returned unconsumed")
		})
	}
}

func TestVarintRoundTrip(t *testing.T) {
	values := []int64{
		0, 1, -1, 2, -2, 63, -64, 64, -65, 8191, -8192, 8192, -8193,
		1<<20 - 1, 1 << 20, -(1 << 20), 1<<27 - 1, 1 << 27,
		math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MinInt32 - 1,
		1 << 34, -(1 << 34), 1 << 55, math.MaxInt64 - 1, math.MaxInt64, math.MinInt64, math.MinInt64 + 1,
	}
	for _, v := range values {
		enc := appendVarint([]byte{0xee}, v)
		require.Equal(t, byte(0xee), enc[0], "appends")
		enc = enc[1:]
		require.Equal(t, binary.AppendVarint(nil, v), enc, "value %d: zigzag encoding", v)
		require.Len(t, enc, varintLen(v), "value %d", v)
		require.LessOrEqual(t, len(enc), 10)

		got, n, err := readVarint(append(enc, 0x55), 10)
		require.NoError(t, err, "value %d", v)
		require.Equal(t, v, got)
		require.Equal(t, len(enc), n, "stops after the varint")

		got, n, err = readVarint(enc, 5)
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			require.NoError(t, err, "value %d as varint", v)
			require.Equal(t, v, got)
			require.Equal(t, len(enc), n)
			require.LessOrEqual(t, len(enc), 5)
		} else {
			require.ErrorIs(t, err, ErrCorrupt, "value %d does not fit a varint", v)
		}

		for cut := 0; cut < len(enc); cut++ {
			_, _, err := readVarint(enc[:cut], 10)
			require.ErrorIs(t, err, ErrCorrupt, "value %d cut at %d", v, cut)
		}
	}
}

func TestReadVarintLengthLimits(t *testing.T) {
	tests := []struct {
		name   string
		b      []byte
		maxLen int
		want   int64
		ok     bool
	}{
		{"5-byte varint at the limit", overlong(0, 5), 5, 0, true},
		{"6-byte varint", overlong(0, 6), 5, 0, false},
		{"10-byte varlong at the limit", overlong(0, 10), 10, 0, true},
		{"11-byte varlong", overlong(0, 11), 10, 0, false},
		{"all continuation bytes", []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80}, 10, 0, false},
		{"max int32", zz(nil, math.MaxInt32), 5, math.MaxInt32, true},
		{"min int32", zz(nil, math.MinInt32), 5, math.MinInt32, true},
		{"max int32 + 1", zz(nil, math.MaxInt32+1), 5, 0, false},
		{"max int64", zz(nil, math.MaxInt64), 10, math.MaxInt64, true},
		{"min int64", zz(nil, math.MinInt64), 10, math.MinInt64, true},
		{"10th byte 1 (bit 63)", append(bytes.Repeat([]byte{0xff}, 9), 0x01), 10, math.MinInt64, true},
		{"10th byte 2 overflows", append(bytes.Repeat([]byte{0xff}, 9), 0x02), 10, 0, false},
		{"10th byte 0x7f overflows", append(bytes.Repeat([]byte{0x80}, 9), 0x7f), 10, 0, false},
		{"overlong zero with 10th byte 2", append(bytes.Repeat([]byte{0x80}, 9), 0x02), 10, 0, false},
		{"empty", nil, 5, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, n, err := readVarint(tt.b, tt.maxLen)
			if !tt.ok {
				require.ErrorIs(t, err, ErrCorrupt)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, v)
			require.Equal(t, len(tt.b), n)
		})
	}
}
