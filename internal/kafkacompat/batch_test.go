package kafkacompat

// Batch-level compatibility between replog's record batch v2 code (package
// log) and franz-go's independent implementation (kmsg.RecordBatch and
// kmsg.Record, the structs franz-go's producer and consumer use on the
// wire):
//
//   - batches built by log.BatchBuilder decode with kmsg field by field, and
//     kmsg re-encodes them to our exact bytes;
//   - batches built with kmsg validate and iterate with ours, and a Log
//     accepts them, stamps offsets and leader epochs, and serves them back
//     with a CRC that still checks out;
//   - the same in both directions for every codec, with franz-go's own
//     compressor and decompressor (kgo.DefaultCompressor and
//     kgo.DefaultDecompressor) plus other encoders (the standard library's
//     gzip, klauspost's xerial framing, pierrec's LZ4 frame writer with
//     several frame options).
//
// The CRC-32C is computed here with hash/crc32 over bytes [21, end) as
// Kafka's DefaultRecordBatch does; kmsg leaves the CRC to its caller.

import (
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"testing"

	"github.com/klauspost/compress/snappy/xerial"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/replog/replog/compression"
	"github.com/replog/replog/log"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// kafkaCRC is the batch CRC as Kafka defines it, computed independently of
// log.Batch.ComputeCRC.
func kafkaCRC(raw []byte) uint32 { return crc32.Checksum(raw[21:], castagnoli) }

// testRecord is a record as a producer hands it over.
type testRecord struct {
	ts         int64
	key, value []byte
	headers    []log.Header
}

// batchCase is a batch to build, with the header fields it should carry.
type batchCase struct {
	name    string
	opts    log.BatchOptions
	records []testRecord
}

func noProducer(attrs int16) log.BatchOptions {
	return log.BatchOptions{
		ProducerID:    log.NoProducerID,
		ProducerEpoch: log.NoProducerEpoch,
		BaseSequence:  log.NoSequence,
		Attributes:    attrs,
	}
}

// pattern returns n bytes that vary with seed and position.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*31 + i*7 + i/13)
	}
	return b
}

func batchCases() []batchCase {
	const t0 = int64(1_700_000_000_000)
	many := make([]testRecord, 1000)
	for i := range many {
		r := testRecord{ts: t0 + int64(i)*17, value: pattern(i, i%300)}
		if i%3 != 0 {
			r.key = pattern(i+1, i%90) // some 0-length, some > 63 bytes (2-byte varints)
		}
		if i%5 == 0 {
			r.headers = []log.Header{{Key: []byte(fmt.Sprintf("h%d", i)), Value: pattern(i, i%70)}}
		}
		many[i] = r
	}
	control := func(typ int16) []byte {
		k := kmsg.ControlRecordKey{Version: 0, Type: kmsg.ControlRecordKeyType(typ)}
		return k.AppendTo(nil)
	}
	marker := (&kmsg.EndTxnMarker{Version: 0, CoordinatorEpoch: 42}).AppendTo(nil)
	return []batchCase{
		{name: "single", opts: noProducer(0), records: []testRecord{
			{ts: t0, key: []byte("k"), value: []byte("v")},
		}},
		{name: "null key and value", opts: noProducer(0), records: []testRecord{
			{ts: t0},
			{ts: t0 + 1, key: []byte("key only")},
			{ts: t0 + 2, value: []byte("value only")},
		}},
		{name: "empty key and value", opts: noProducer(0), records: []testRecord{
			{ts: t0, key: []byte{}, value: []byte{}},
			{ts: t0, key: nil, value: []byte{}},
		}},
		{name: "headers", opts: noProducer(0), records: []testRecord{
			{ts: t0, key: []byte("k"), value: []byte("v"), headers: []log.Header{
				{Key: []byte("content-type"), Value: []byte("application/json")},
				{Key: []byte("null-value"), Value: nil},
				{Key: []byte{}, Value: []byte{}},
				{Key: []byte("dup"), Value: []byte("1")},
				{Key: []byte("dup"), Value: []byte("2")},
			}},
			{ts: t0 + 5, value: []byte("no headers")},
			{ts: t0 + 6, headers: []log.Header{{Key: pattern(9, 200), Value: pattern(8, 20000)}}},
		}},
		{name: "timestamps spread", opts: noProducer(0), records: []testRecord{
			// Out of order (negative deltas), far apart (deltas beyond
			// 32 bits need a long varlong), and one before the epoch.
			{ts: t0, value: []byte("a")},
			{ts: t0 - 86_400_000, value: []byte("b")},
			{ts: t0 + 1<<40, value: []byte("c")},
			{ts: 0, value: []byte("d")},
			{ts: t0 + 1, value: []byte("e")},
		}},
		{name: "large value", opts: noProducer(0), records: []testRecord{
			{ts: t0, key: []byte("big"), value: pattern(3, 300_000)},
		}},
		{name: "many records", opts: noProducer(0), records: many},
		{name: "idempotent producer", opts: log.BatchOptions{
			Idempotent: true, ProducerID: 123_456_789_012, ProducerEpoch: 7, BaseSequence: 41,
		}, records: []testRecord{
			{ts: t0, value: []byte("x")}, {ts: t0 + 1, value: []byte("y")},
		}},
		{name: "sequence near wrap", opts: log.BatchOptions{
			Idempotent: true, ProducerID: 1, ProducerEpoch: math.MaxInt16, BaseSequence: math.MaxInt32 - 1,
		}, records: []testRecord{
			{ts: t0, value: []byte("x")}, {ts: t0, value: []byte("y")}, {ts: t0, value: []byte("z")},
		}},
		{name: "transactional", opts: log.BatchOptions{
			Idempotent: true, ProducerID: 99, ProducerEpoch: 3, BaseSequence: 0, Attributes: 0x10,
		}, records: []testRecord{
			{ts: t0, key: []byte("tx"), value: []byte("1")}, {ts: t0 + 2, key: []byte("tx"), value: []byte("2")},
		}},
		{name: "control commit marker", opts: log.BatchOptions{
			Idempotent: true, ProducerID: 99, ProducerEpoch: 3, BaseSequence: log.NoSequence, Attributes: 0x30,
		}, records: []testRecord{
			{ts: t0 + 3, key: control(1), value: marker},
		}},
		{name: "log append time", opts: noProducer(0x08), records: []testRecord{
			{ts: t0, value: []byte("a")}, {ts: t0 + 9, value: []byte("b")},
		}},
		{name: "empty batch", opts: noProducer(0), records: nil},
	}
}

// build builds c with our builder, optionally compressed.
func build(t *testing.T, c batchCase, comp log.Compressor) []byte {
	t.Helper()
	bb := log.NewBatchBuilder()
	opts := c.opts
	opts.Compressor = comp
	bb.Reset(opts)
	for _, r := range c.records {
		bb.Add(r.ts, r.key, r.value, r.headers...)
	}
	raw, err := bb.Build(nil)
	require.NoError(t, err)
	return raw
}

// expectedHeader is the kmsg view of c's batch header, derived from the
// inputs alone (not from our accessors).
func expectedHeader(c batchCase, raw []byte, codec int16) kmsg.RecordBatch {
	n := int32(len(c.records))
	want := kmsg.RecordBatch{
		FirstOffset:          0,
		Length:               int32(len(raw) - 12),
		PartitionLeaderEpoch: -1,
		Magic:                2,
		CRC:                  int32(kafkaCRC(raw)),
		Attributes:           c.opts.Attributes | codec,
		LastOffsetDelta:      0,
		FirstTimestamp:       -1,
		MaxTimestamp:         -1,
		ProducerID:           c.opts.ProducerID,
		ProducerEpoch:        c.opts.ProducerEpoch,
		FirstSequence:        c.opts.BaseSequence,
		NumRecords:           n,
	}
	if n > 0 {
		want.LastOffsetDelta = n - 1
		want.FirstTimestamp = c.records[0].ts
		for _, r := range c.records {
			want.MaxTimestamp = max(want.MaxTimestamp, r.ts)
		}
	}
	return want
}

// readKmsgBatch decodes exactly one batch with kmsg.
func readKmsgBatch(t *testing.T, raw []byte) kmsg.RecordBatch {
	t.Helper()
	var kb kmsg.RecordBatch
	require.NoError(t, kb.ReadFrom(raw))
	// kmsg reads Length-49 bytes of records; make sure that is the whole
	// slice (ReadFrom does not complain about trailing bytes).
	require.Equal(t, len(raw), int(kb.Length)+12, "batch length field vs bytes")
	return kb
}

// readKmsgRecords decodes n records from an uncompressed records body with
// kmsg.Record, requiring each to consume exactly its length prefix's worth
// of bytes and the body to end with the last one.
func readKmsgRecords(t *testing.T, body []byte, n int32) []kmsg.Record {
	t.Helper()
	var out []kmsg.Record
	for i := int32(0); i < n; i++ {
		var r kmsg.Record
		require.NoError(t, r.ReadFrom(body), "record %d", i)
		size := len(binary.AppendVarint(nil, int64(r.Length))) + int(r.Length)
		require.LessOrEqual(t, size, len(body), "record %d", i)
		// kmsg.Record.ReadFrom stops after the headers without checking
		// the length; re-encoding proves every byte inside was consumed.
		require.Equal(t, body[:size], r.AppendTo(nil), "record %d re-encoded by kmsg", i)
		out = append(out, r)
		body = body[size:]
	}
	require.Empty(t, body, "bytes after the last record")
	return out
}

// requireNullable checks got against want including the null/empty
// distinction (-1 vs 0 length on the wire).
func requireNullable(t *testing.T, want, got []byte, msgAndArgs ...any) {
	t.Helper()
	if want == nil {
		require.Nil(t, got, msgAndArgs...)
		return
	}
	require.NotNil(t, got, msgAndArgs...)
	require.Equal(t, want, got, msgAndArgs...)
}

// requireKmsgRecordsMatch checks kmsg-decoded records against the inputs.
func requireKmsgRecordsMatch(t *testing.T, c batchCase, recs []kmsg.Record) {
	t.Helper()
	require.Len(t, recs, len(c.records))
	for i, r := range recs {
		in := c.records[i]
		msg := fmt.Sprintf("record %d", i)
		assert.Equal(t, int8(0), r.Attributes, msg)
		assert.Equal(t, in.ts-c.records[0].ts, r.TimestampDelta64, msg)
		assert.Equal(t, int32(i), r.OffsetDelta, msg)
		requireNullable(t, in.key, r.Key, msg+" key")
		requireNullable(t, in.value, r.Value, msg+" value")
		require.Len(t, r.Headers, len(in.headers), msg)
		for j, h := range r.Headers {
			assert.Equal(t, string(in.headers[j].Key), h.Key, "%s header %d", msg, j)
			requireNullable(t, in.headers[j].Value, h.Value, fmt.Sprintf("%s header %d", msg, j))
		}
	}
}

// TestOurBatchesDecodeWithKmsg: every header field and every record of a
// batch built by log.BatchBuilder reads back through kmsg as built, and
// kmsg's encoder reproduces our bytes exactly.
func TestOurBatchesDecodeWithKmsg(t *testing.T) {
	for _, c := range batchCases() {
		t.Run(c.name, func(t *testing.T) {
			raw := build(t, c, nil)
			kb := readKmsgBatch(t, raw)
			require.Equal(t, expectedHeader(c, raw, 0), withoutRecords(kb))
			recs := readKmsgRecords(t, kb.Records, kb.NumRecords)
			requireKmsgRecordsMatch(t, c, recs)

			// Re-encoding with kmsg gives our exact bytes, header and
			// records alike.
			require.Equal(t, raw, kb.AppendTo(nil))
			body := []byte{} // kmsg decodes an empty records section as empty, not nil
			for i := range recs {
				body = recs[i].AppendTo(body)
			}
			require.Equal(t, []byte(kb.Records), body)

			if c.opts.Attributes&0x20 != 0 {
				// A control record is Kafka's key/value pair.
				var key kmsg.ControlRecordKey
				require.NoError(t, key.ReadFrom(recs[0].Key))
				assert.Equal(t, kmsg.ControlRecordKeyType(1), key.Type)
				var marker kmsg.EndTxnMarker
				require.NoError(t, marker.ReadFrom(recs[0].Value))
				assert.Equal(t, int32(42), marker.CoordinatorEpoch)
			}
		})
	}
}

func withoutRecords(kb kmsg.RecordBatch) kmsg.RecordBatch {
	kb.Records = nil
	return kb
}

// kmsgBatch builds a batch with kmsg alone, the way a franz-go producer
// lays one out: records encoded with kmsg.Record.AppendTo after computing
// each record's length, the header filled in, the CRC computed over
// [21, end). body, when not nil, replaces the encoded records (a
// compressed body), with codec in the attributes.
func kmsgBatch(t *testing.T, c batchCase, firstOffset int64, epoch int32, transform func([]byte) ([]byte, int16)) ([]byte, []kmsg.Record) {
	t.Helper()
	var recs []kmsg.Record
	var body []byte
	for i, in := range c.records {
		delta := in.ts - c.records[0].ts
		r := kmsg.Record{
			TimestampDelta:   int32(delta), // kmsg's decoder fills in both
			TimestampDelta64: delta,
			OffsetDelta:      int32(i),
			Key:              in.key,
			Value:            in.value,
		}
		for _, h := range in.headers {
			r.Headers = append(r.Headers, kmsg.Header{Key: string(h.Key), Value: h.Value})
		}
		// Length is everything after the length varint: encode with
		// Length 0 (one byte) to measure it.
		r.Length = int32(len(r.AppendTo(nil)) - 1)
		body = r.AppendTo(body)
		recs = append(recs, r)
	}
	var codec int16
	if transform != nil {
		body, codec = transform(body)
	}
	kb := expectedHeader(c, make([]byte, 61+len(body)), codec)
	kb.FirstOffset = firstOffset
	kb.PartitionLeaderEpoch = epoch
	kb.Records = body
	raw := kb.AppendTo(nil)
	kb.CRC = int32(kafkaCRC(raw))
	raw = kb.AppendTo(raw[:0])
	return raw, recs
}

// requireOurView checks our accessors against kmsg's decoding of the same
// bytes.
func requireOurView(t *testing.T, b log.Batch, kb kmsg.RecordBatch) {
	t.Helper()
	assert.Equal(t, kb.FirstOffset, b.BaseOffset())
	assert.Equal(t, kb.Length, b.Length())
	assert.Equal(t, kb.PartitionLeaderEpoch, b.LeaderEpoch())
	assert.Equal(t, kb.Magic, b.Magic())
	assert.Equal(t, uint32(kb.CRC), b.CRC())
	assert.Equal(t, kb.Attributes, b.Attributes())
	assert.Equal(t, int8(kb.Attributes&7), b.CodecID())
	assert.Equal(t, kb.Attributes&0x10 != 0, b.IsTransactional())
	assert.Equal(t, kb.Attributes&0x20 != 0, b.IsControl())
	assert.Equal(t, kb.Attributes&0x08 != 0, b.IsLogAppendTime())
	assert.Equal(t, kb.LastOffsetDelta, b.LastOffsetDelta())
	assert.Equal(t, kb.FirstTimestamp, b.BaseTimestamp())
	assert.Equal(t, kb.MaxTimestamp, b.MaxTimestamp())
	assert.Equal(t, kb.ProducerID, b.ProducerID())
	assert.Equal(t, kb.ProducerEpoch, b.ProducerEpoch())
	assert.Equal(t, kb.FirstSequence, b.BaseSequence())
	assert.Equal(t, kb.NumRecords, b.RecordCount())
	assert.Equal(t, []byte(kb.Records), b.RecordsBody())
}

// requireOurRecords iterates b with our RecordIterator (through ResetBatch,
// decompressing with local) and checks every record against kmsg's.
func requireOurRecords(t *testing.T, b log.Batch, kb kmsg.RecordBatch, want []kmsg.Record, local *compression.Local) {
	t.Helper()
	var it log.RecordIterator
	require.NoError(t, it.ResetBatch(b, local))
	i := 0
	for it.Next() {
		require.Less(t, i, len(want), "more records than kmsg built")
		r, w := it.Record(), want[i]
		msg := fmt.Sprintf("record %d", i)
		assert.Equal(t, kb.FirstOffset+int64(w.OffsetDelta), r.Offset, msg)
		assert.Equal(t, w.OffsetDelta, r.OffsetDelta, msg)
		assert.Equal(t, w.Attributes, r.Attributes, msg)
		if kb.Attributes&0x08 != 0 {
			assert.Equal(t, kb.MaxTimestamp, r.Timestamp, msg) // LogAppendTime
		} else {
			assert.Equal(t, kb.FirstTimestamp+w.TimestampDelta64, r.Timestamp, msg)
		}
		requireNullable(t, w.Key, r.Key, msg+" key")
		requireNullable(t, w.Value, r.Value, msg+" value")
		require.Len(t, r.Headers, len(w.Headers), msg)
		for j, h := range r.Headers {
			assert.Equal(t, w.Headers[j].Key, string(h.Key), "%s header %d", msg, j)
			requireNullable(t, w.Headers[j].Value, h.Value, fmt.Sprintf("%s header %d", msg, j))
		}
		i++
	}
	require.NoError(t, it.Err())
	require.Equal(t, len(want), i)
}

// TestKmsgBatchesValidateAndIterate: batches laid out by kmsg pass our
// framing and validation and iterate to kmsg's records; the same with any
// base offset and leader epoch a broker may have stamped.
func TestKmsgBatchesValidateAndIterate(t *testing.T) {
	for _, c := range batchCases() {
		t.Run(c.name, func(t *testing.T) {
			raw, recs := kmsgBatch(t, c, 1<<40+12345, 17, nil)
			kb := readKmsgBatch(t, raw)

			b, rest, err := log.SplitBatch(raw)
			require.NoError(t, err)
			require.Empty(t, rest)
			require.NoError(t, b.ValidateHeader())
			require.NoError(t, b.Validate())
			requireOurView(t, b, kb)
			requireOurRecords(t, b, kb, recs, nil)

			// Both builders agree byte for byte once offset and epoch
			// are the same.
			ours := build(t, c, nil)
			binary.BigEndian.PutUint64(ours[0:], uint64(kb.FirstOffset))
			binary.BigEndian.PutUint32(ours[12:], uint32(kb.PartitionLeaderEpoch))
			require.Equal(t, raw, ours)
		})
	}
}

// TestKmsgBatchBadCRCRejected shows the CRC computed above is what makes
// the kmsg batches valid: left at zero, or with one records byte flipped,
// our validation refuses the batch.
func TestKmsgBatchBadCRCRejected(t *testing.T) {
	c := batchCases()[0]
	raw, _ := kmsgBatch(t, c, 0, -1, nil)
	noCRC := append([]byte(nil), raw...)
	binary.BigEndian.PutUint32(noCRC[17:], 0)
	require.ErrorIs(t, log.Batch(noCRC).Validate(), log.ErrCorrupt)

	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-1] ^= 0x01
	require.ErrorIs(t, log.Batch(flipped).Validate(), log.ErrCorrupt)

	require.NoError(t, log.Batch(raw).Validate())
}

// TestLogAcceptsKmsgBatches appends batches laid out by kmsg to a Log (as a
// leader: offsets and leader epoch are stamped) and reads them back: kmsg
// sees the assigned offsets and epoch, an unchanged CRC that still matches
// the bytes, and the same records.
func TestLogAcceptsKmsgBatches(t *testing.T) {
	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()

	var cases []batchCase
	for _, c := range batchCases() {
		// An empty batch carries no offset to assign. A control batch
		// is a coordinator's write, which Kafka refuses from clients
		// (LogValidator: "clients are not allowed to write control
		// records"); it is left out here, as is a LogAppendTime batch,
		// whose timestamps a broker sets: the log refuses it from
		// producers (Log.AppendAsLeader).
		if len(c.records) > 0 && c.opts.Attributes&(0x20|0x08) == 0 {
			cases = append(cases, c)
		}
	}
	type sent struct {
		raw  []byte
		recs []kmsg.Record
	}
	var all []sent
	var first, second []byte
	for i, c := range cases {
		// Producers send garbage in the fields the leader owns.
		raw, recs := kmsgBatch(t, c, int64(1000+i), int32(100+i), nil)
		all = append(all, sent{raw: append([]byte(nil), raw...), recs: recs})
		if i < len(cases)/2 {
			first = append(first, raw...)
		} else {
			second = append(second, raw...)
		}
	}
	info1, err := l.Append(first)
	require.NoError(t, err)
	require.Equal(t, int64(0), info1.FirstOffset)
	info2, err := l.AppendAsLeader(second, 9)
	require.NoError(t, err)
	require.Equal(t, info1.LastOffset+1, info2.FirstOffset)

	var got []byte
	for off := int64(0); off < l.LogEndOffset(); {
		before := len(got)
		got, err = l.Read(got, off, log.ReadOptions{MaxBytes: 64 << 10})
		require.NoError(t, err)
		require.Greater(t, len(got), before, "no progress reading at %d", off)
		last := got[before:]
		for len(last) > 0 {
			b, rest, err := log.SplitBatch(last)
			require.NoError(t, err)
			off = b.NextOffset()
			last = rest
		}
	}

	next := int64(0)
	for i, s := range all {
		require.NotEmpty(t, got, "batch %d missing", i)
		var kb kmsg.RecordBatch
		require.NoError(t, kb.ReadFrom(got))
		size := int(kb.Length) + 12
		raw := got[:size]
		got = got[size:]

		wantEpoch := int32(-1)
		if i >= len(cases)/2 {
			wantEpoch = 9
		}
		assert.Equal(t, next, kb.FirstOffset, "batch %d offset", i)
		assert.Equal(t, wantEpoch, kb.PartitionLeaderEpoch, "batch %d epoch", i)
		assert.Equal(t, kafkaCRC(raw), uint32(kb.CRC), "batch %d CRC per Kafka", i)
		// Nothing under the CRC changed.
		require.Equal(t, s.raw[16:], raw[16:], "batch %d", i)
		recs := readKmsgRecords(t, kb.Records, kb.NumRecords)
		require.Equal(t, s.recs, recs, "batch %d records", i)
		requireOurRecords(t, log.Batch(raw), kb, recs, nil)
		next += int64(kb.LastOffsetDelta) + 1
	}
	require.Empty(t, got)
	require.Equal(t, next, l.LogEndOffset())
}

// The codecs, with franz-go's type for each.
// levels are the compression levels our side is tested at (0: default).
var codecs = []struct {
	ours   compression.Codec
	kgo    kgo.CompressionCodec
	levels []int
}{
	{compression.Gzip, kgo.GzipCompression(), []int{0, compression.MaxGzipLevel}},
	{compression.Snappy, kgo.SnappyCompression(), []int{0}},
	{compression.LZ4, kgo.Lz4Compression(), []int{0, 9}},
	{compression.Zstd, kgo.ZstdCompression(), []int{0, 19}},
}

// compressedCases are the batch cases worth compressing: a few small ones
// and the large ones that span several LZ4 blocks and xerial chunks.
func compressedCases() []batchCase {
	var out []batchCase
	for _, c := range batchCases() {
		switch c.name {
		case "headers", "null key and value", "transactional", "timestamps spread", "large value", "many records":
			out = append(out, c)
		}
	}
	return out
}

// TestOurCompressedBatchesDecodeWithFranzGo: batches compressed by our
// builder (log.CompressWith) decode with kmsg and franz-go's consumer-side
// decompressor. kgo's decompressor is built on the same codec libraries as
// package compression (klauspost/compress for gzip and zstd, pierrec/lz4's
// frame reader); what it checks independently is the batch layout, the
// LZ4 frame (which package compression writes itself) and the xerial
// snappy framing (ditto, decoded by kgo's own xerial code).
func TestOurCompressedBatchesDecodeWithFranzGo(t *testing.T) {
	local := compression.NewLocal(compression.Options{})
	dec := kgo.DefaultDecompressor()
	for _, codec := range codecs {
		for _, level := range codec.levels {
			comp, err := log.CompressWith(local, codec.ours, level)
			require.NoError(t, err)
			for _, c := range compressedCases() {
				t.Run(fmt.Sprintf("%s/level=%d/%s", codec.ours, level, c.name), func(t *testing.T) {
					raw := build(t, c, comp)
					kb := readKmsgBatch(t, raw)
					require.Equal(t, expectedHeader(c, raw, int16(codec.ours)), withoutRecords(kb))
					require.Equal(t, raw, kb.AppendTo(nil))

					body, err := dec.Decompress(kb.Records, kgo.CompressionCodecType(kb.Attributes&7))
					require.NoError(t, err)
					recs := readKmsgRecords(t, body, kb.NumRecords)
					requireKmsgRecordsMatch(t, c, recs)

					// Our reader agrees with our writer too.
					b := log.Batch(raw)
					require.NoError(t, b.Validate())
					requireOurRecords(t, b, kb, recs, local)
				})
			}
		}
	}
}

// otherEncoder compresses a records body as some other Kafka client does.
type otherEncoder struct {
	name   string
	codec  compression.Codec
	encode func(t *testing.T, src []byte) []byte
}

func otherEncoders() []otherEncoder {
	kgoEncoder := func(c kgo.CompressionCodec, id compression.Codec) func(*testing.T, []byte) []byte {
		return func(t *testing.T, src []byte) []byte {
			t.Helper()
			comp, err := kgo.DefaultCompressor(c)
			require.NoError(t, err)
			out, used := comp.Compress(new(bytes.Buffer), src)
			require.Equal(t, kgo.CompressionCodecType(id), used)
			return append([]byte(nil), out...)
		}
	}
	lz4With := func(opts ...lz4.Option) func(*testing.T, []byte) []byte {
		return func(t *testing.T, src []byte) []byte {
			t.Helper()
			var buf bytes.Buffer
			w := lz4.NewWriter(&buf)
			require.NoError(t, w.Apply(opts...))
			_, err := w.Write(src)
			require.NoError(t, err)
			require.NoError(t, w.Close())
			return buf.Bytes()
		}
	}
	var encs []otherEncoder
	for _, c := range codecs {
		// franz-go's producer compressor: klauspost gzip, a raw snappy
		// block (s2.EncodeSnappy), pierrec's LZ4 frame writer with its
		// defaults (4 MiB blocks, content checksum), klauspost zstd.
		encs = append(encs, otherEncoder{name: "kgo", codec: c.ours, encode: kgoEncoder(c.kgo, c.ours)})
	}
	return append(encs,
		otherEncoder{name: "stdlib", codec: compression.Gzip, encode: func(t *testing.T, src []byte) []byte {
			var buf bytes.Buffer
			w, err := stdgzip.NewWriterLevel(&buf, stdgzip.BestCompression)
			require.NoError(t, err)
			_, err = w.Write(src)
			require.NoError(t, err)
			require.NoError(t, w.Close())
			return buf.Bytes()
		}},
		// snappy-java's framing, as the Java client writes it.
		otherEncoder{name: "xerial", codec: compression.Snappy, encode: func(_ *testing.T, src []byte) []byte {
			return xerial.Encode(nil, src)
		}},
		// The Java client's frame: 64 KiB independent blocks, no content
		// checksum.
		otherEncoder{name: "java-like", codec: compression.LZ4, encode: lz4With(
			lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false), lz4.ConcurrencyOption(1))},
		// Optional frame features a reader must skip or check: block
		// checksums and the content size field.
		otherEncoder{name: "block-checksum", codec: compression.LZ4, encode: lz4With(
			lz4.BlockSizeOption(lz4.Block256Kb), lz4.BlockChecksumOption(true), lz4.ConcurrencyOption(1))},
		otherEncoder{name: "content-size", codec: compression.LZ4, encode: func(t *testing.T, src []byte) []byte {
			return lz4With(lz4.BlockSizeOption(lz4.Block1Mb), lz4.SizeOption(uint64(len(src))), lz4.ConcurrencyOption(1))(t, src)
		}},
		otherEncoder{name: "stream", codec: compression.Zstd, encode: func(t *testing.T, src []byte) []byte {
			var buf bytes.Buffer
			w, err := zstd.NewWriter(&buf, zstd.WithEncoderCRC(true), zstd.WithEncoderConcurrency(1))
			require.NoError(t, err)
			_, err = w.Write(src)
			require.NoError(t, err)
			require.NoError(t, w.Close())
			return buf.Bytes()
		}},
	)
}

// TestForeignCompressedBatchesIterate: batches laid out by kmsg whose
// records body was compressed by other clients' encoders pass our
// validation, iterate with ResetBatch to the records kmsg encoded, and are
// accepted by a Log and read back intact.
func TestForeignCompressedBatchesIterate(t *testing.T) {
	local := compression.NewLocal(compression.Options{})
	for _, enc := range otherEncoders() {
		for _, c := range compressedCases() {
			t.Run(fmt.Sprintf("%s/%s/%s", enc.codec, enc.name, c.name), func(t *testing.T) {
				// A fresh log each time: the same producer's batch sent
				// again would be (rightly) treated as a retry.
				l, err := log.Open(t.TempDir(), log.Options{})
				require.NoError(t, err)
				defer func() { require.NoError(t, l.Close()) }()

				raw, recs := kmsgBatch(t, c, 0, -1, func(body []byte) ([]byte, int16) {
					return enc.encode(t, body), int16(enc.codec)
				})
				kb := readKmsgBatch(t, raw)
				b := log.Batch(raw)
				require.NoError(t, b.Validate())
				requireOurView(t, b, kb)
				requireOurRecords(t, b, kb, recs, local)

				info, err := l.Append(append([]byte(nil), raw...))
				require.NoError(t, err)
				got, err := l.Read(nil, info.FirstOffset, log.ReadOptions{MaxBytes: 1})
				require.NoError(t, err)
				var back kmsg.RecordBatch
				require.NoError(t, back.ReadFrom(got))
				require.Equal(t, len(raw), int(back.Length)+12)
				assert.Equal(t, info.FirstOffset, back.FirstOffset)
				assert.Equal(t, kafkaCRC(got), uint32(back.CRC))
				require.Equal(t, raw[16:], got[16:])
				kb.FirstOffset = info.FirstOffset
				requireOurRecords(t, log.Batch(got), kb, recs, local)
			})
		}
	}
}
