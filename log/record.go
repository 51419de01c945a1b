package log

import (
	"fmt"
)

// minRecordSize is the smallest encoded record: length, attributes,
// timestamp delta, offset delta, key length, value length and header
// count, one byte each.
const minRecordSize = 7

// Header is a record header. Key and Value alias the batch bytes.
type Header struct {
	// Key is the header's key.
	Key []byte
	// Value is the header's value, nil when absent (length -1).
	Value []byte
}

// Record is one decoded record. Key, Value and the header values alias the
// bytes being iterated and are valid only until the iterator moves on, or
// as long as the underlying batch bytes when the caller owns them.
type Record struct {
	// Offset is the absolute offset (batch base offset + OffsetDelta).
	Offset int64
	// Timestamp is the absolute timestamp (batch base timestamp + delta),
	// or the batch's max timestamp for LogAppendTime batches.
	Timestamp int64
	// OffsetDelta is the record's offset relative to the batch's base.
	OffsetDelta int32
	// Attributes is the record's attribute byte (unused by Kafka: 0).
	Attributes int8
	// Key and Value are nil when absent (length -1).
	Key, Value []byte
	// Headers is reused by the iterator; copy it to keep it.
	Headers []Header
}

// RecordIterator decodes the records of an uncompressed records body. The
// zero value is empty; use Batch.Records, or Reset. It does not allocate
// in steady state (the Headers slice is reused). Not safe for concurrent
// use.
type RecordIterator struct {
	batch     Batch
	body      []byte
	remaining int32
	rec       Record
	err       error
	decomp    []byte // reused decompression buffer (ResetBatch)
}

// Records returns an iterator over an uncompressed batch's records. For a
// compressed batch it yields none and its Err wraps ErrInvalidRecord: use
// ResetBatch with a compression.Local (or decompress RecordsBody and use
// Reset).
func (b Batch) Records() *RecordIterator {
	it := &RecordIterator{}
	_ = it.ResetBatch(b, nil)
	return it
}

// Reset makes the iterator walk body (an uncompressed records section,
// for example a decompressed one) with b's header for offsets, timestamps
// and the record count.
func (it *RecordIterator) Reset(b Batch, body []byte) { it.reset(b, body) }

func (it *RecordIterator) reset(b Batch, body []byte) {
	it.batch, it.body, it.err = b, body, nil
	it.remaining = b.RecordCount()
	it.rec.Headers = it.rec.Headers[:0]
}

// Next decodes the next record. It returns false at the end or on error;
// Err tells which.
func (it *RecordIterator) Next() bool {
	if it.err != nil {
		return false
	}
	if it.remaining <= 0 {
		if len(it.body) != 0 {
			it.err = fmt.Errorf("%w: %d bytes after the last record", ErrCorrupt, len(it.body))
		}
		return false
	}
	if err := it.decode(); err != nil {
		it.err = err
		return false
	}
	it.remaining--
	return true
}

// Record returns the current record; valid until the next call to Next.
func (it *RecordIterator) Record() *Record { return &it.rec }

// Err returns the first decoding error: one wrapping ErrCorrupt for
// damaged records; for a compressed batch, ErrInvalidRecord without a
// compression.Local (see ResetBatch), or the compression package's error
// (compression.ErrCorrupt, ErrTooLarge...) for a stream it cannot decode.
func (it *RecordIterator) Err() error { return it.err }

// decoder reads fields from a bounded byte slice. After the first error
// its slice is empty, so the inlined fast paths, which only look at the
// bytes, fall through to the slow ones, which keep the first error.
type decoder struct {
	b   []byte
	err error
}

// fail records err and empties the slice.
func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

// varint reads a zigzag varint of at most maxLen bytes; one- and
// two-byte encodings take varintShort's inlined path.
func (d *decoder) varint(maxLen int) int64 {
	if v, n := varintShort(d.b, 0); n > 0 {
		d.b = d.b[n:]
		return v
	}
	return d.varintLong(maxLen)
}

func (d *decoder) varintLong(maxLen int) int64 {
	if d.err != nil {
		return 0
	}
	v, n, err := readVarint(d.b, maxLen)
	if err != nil {
		d.fail(err)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte1() int8 {
	if b := d.b; len(b) > 0 {
		d.b = b[1:]
		return int8(b[0])
	}
	d.fail(errRecordTruncated)
	return 0
}

var errRecordTruncated = fmt.Errorf("%w: record truncated", ErrCorrupt)

// bytes reads a varint length and that many bytes; -1 means nil when
// nullable.
func (d *decoder) bytes(nullable bool) []byte {
	n := d.varint(5)
	if b := d.b; n >= 0 && n <= int64(len(b)) {
		d.b = b[n:]
		return b[:n:n]
	}
	if !(n == -1 && nullable) {
		d.badLength(n)
	}
	return nil
}

// badLength records a field length that does not fit the record.
func (d *decoder) badLength(n int64) {
	if d.err == nil {
		d.fail(fmt.Errorf("%w: field length %d with %d bytes left", ErrCorrupt, n, len(d.b)))
	}
}

func (it *RecordIterator) decode() error {
	length, n, err := readVarint(it.body, 5)
	if err != nil {
		return err
	}
	if length < minRecordSize-1 || length > int64(len(it.body)-n) {
		return fmt.Errorf("%w: record length %d with %d bytes left", ErrCorrupt, length, len(it.body)-n)
	}
	d := decoder{b: it.body[n : n+int(length)]}
	it.body = it.body[n+int(length):]
	r := &it.rec
	r.Attributes = d.byte1()
	tsDelta := d.varint(10)
	r.OffsetDelta = int32(d.varint(5))
	r.Key = d.bytes(true)
	r.Value = d.bytes(true)
	hc := d.varint(5)
	if d.err != nil {
		return d.err
	}
	// Each header takes at least two bytes (two one-byte lengths).
	if hc < 0 || hc > int64(len(d.b))/2 {
		return fmt.Errorf("%w: header count %d with %d bytes left", ErrCorrupt, hc, len(d.b))
	}
	r.Headers = r.Headers[:0]
	for i := int64(0); i < hc; i++ {
		k := d.bytes(false)
		v := d.bytes(true)
		if d.err != nil {
			return d.err
		}
		r.Headers = append(r.Headers, Header{Key: k, Value: v})
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: %d bytes left inside record", ErrCorrupt, len(d.b))
	}
	b := it.batch
	r.Offset = b.BaseOffset() + int64(r.OffsetDelta)
	if b.IsLogAppendTime() {
		r.Timestamp = b.MaxTimestamp()
	} else {
		r.Timestamp = b.BaseTimestamp() + tsDelta
	}
	return nil
}

// checkRecords validates an uncompressed records body the way a
// RecordIterator walk does, without decoding into a Record: each record's
// framing, varint bounds, key, value and header lengths, offset deltas
// that increase within [0, lastDelta] (0..count-1 when lastDelta is
// count-1; Kafka's compaction leaves gaps), and no bytes after the last
// record. It accepts exactly the bodies that walk accepts with that
// delta rule (FuzzBatchDecode checks that), at a fraction of the cost,
// which matters on the append path. It returns the largest of the
// records' timestamps, baseTS plus each delta (wrapping as the records'
// decoding does: the largest delta is not the largest timestamp when a
// delta wraps), or NoTimestamp if that is lower or there is no record, as
// Kafka's leader computes a batch's max timestamp.
func checkRecords(body []byte, count, lastDelta int32, baseTS int64) (maxTS int64, err error) {
	maxTS = NoTimestamp
	prev := int64(-1)
	for i := int32(0); i < count; i++ {
		length, n := varintShort(body, 0)
		if n < 0 || length < minRecordSize-1 || length > int64(len(body)-n) {
			if length, n, err = readVarint(body, 5); err != nil {
				return 0, err
			}
			if length < minRecordSize-1 || length > int64(len(body)-n) {
				return 0, fmt.Errorf("%w: record length %d with %d bytes left", ErrCorrupt, length, len(body)-n)
			}
		}
		r := body[n : n+int(length)]
		tsDelta, od, ok := recordLooksValid(r)
		if !ok {
			if tsDelta, od, err = checkRecord(r); err != nil {
				return 0, err
			}
		}
		if od <= prev || od > int64(lastDelta) {
			return 0, fmt.Errorf("%w: record %d has offset delta %d (previous %d, last offset delta %d)", ErrCorrupt, i, od, prev, lastDelta)
		}
		prev = od
		maxTS = max(maxTS, baseTS+tsDelta)
		body = body[n+int(length):]
	}
	if len(body) != 0 {
		return 0, fmt.Errorf("%w: %d bytes after the last record", ErrCorrupt, len(body))
	}
	return maxTS, nil
}

// recordLooksValid is checkRecord's fast path, for records whose
// varints all take one or two bytes (most do): ok means valid, with its
// timestamp and offset deltas; false means checkRecord must decide.
// varintShort is inlined.
func recordLooksValid(r []byte) (tsDelta, offsetDelta int64, ok bool) {
	tsDelta, p := varintShort(r, 1) // after the attributes
	od, p := varintShort(r, p)
	p = skipShort(r, p, 2, -1) // key and value, nullable
	hc, p := varintShort(r, p)
	for ; hc > 0 && p >= 0; hc-- {
		p = skipShort(r, p, 1, 0)  // header key
		p = skipShort(r, p, 1, -1) // header value, nullable
	}
	return tsDelta, od, hc == 0 && p == len(r)
}

// varintShort decodes a zigzag varint of one or two bytes at r[p:] and
// returns it with the position after it, or position -1 if there is
// none (p negative, too few bytes, a longer encoding).
func varintShort(r []byte, p int) (int64, int) {
	if p < 0 || p >= len(r) {
		return 0, -1
	}
	u := uint64(r[p])
	if u >= 0x80 {
		if p+1 >= len(r) || r[p+1] >= 0x80 {
			return 0, -1
		}
		u = u&0x7f | uint64(r[p+1])<<7
		p++
	}
	return int64(u>>1) ^ -int64(u&1), p + 1
}

// skipShort skips n length-prefixed fields at r[p:] whose lengths take
// one or two bytes and are at least minLen (-1: nullable); it returns
// the position after them, or -1 where checkRecord must decide.
func skipShort(r []byte, p, n int, minLen int64) int {
	for range n {
		l, q := varintShort(r, p)
		if q < 0 || l < minLen || l > int64(len(r)-q) {
			return -1
		}
		p = q + int(max(l, 0))
	}
	return p
}

// checkRecord validates the fields of a record (r holds at least
// minRecordSize-1 bytes, everything after the length varint) and returns
// its timestamp and offset deltas.
func checkRecord(r []byte) (tsDelta, offsetDelta int64, err error) {
	// Skip the attributes byte; read the timestamp delta.
	p := 1
	tsDelta, n, err := readVarint(r[p:], 10)
	if err != nil {
		return 0, 0, err
	}
	p += n
	od, n, err := readVarint(r[p:], 5)
	if err != nil {
		return 0, 0, err
	}
	p += n
	if p, err = skipField(r, p, true); err != nil { // key
		return 0, 0, err
	}
	if p, err = skipField(r, p, true); err != nil { // value
		return 0, 0, err
	}
	hc, n, err := readVarint(r[p:], 5)
	if err != nil {
		return 0, 0, err
	}
	p += n
	if hc < 0 || hc > int64(len(r)-p)/2 {
		return 0, 0, fmt.Errorf("%w: header count %d with %d bytes left", ErrCorrupt, hc, len(r)-p)
	}
	for range hc {
		if p, err = skipField(r, p, false); err != nil {
			return 0, 0, err
		}
		if p, err = skipField(r, p, true); err != nil {
			return 0, 0, err
		}
	}
	if p != len(r) {
		return 0, 0, fmt.Errorf("%w: %d bytes left inside record", ErrCorrupt, len(r)-p)
	}
	return tsDelta, od, nil
}

// skipField skips the length-prefixed bytes at r[p:] and returns the
// position after them; length -1 (null) is allowed when nullable.
func skipField(r []byte, p int, nullable bool) (int, error) {
	l, n, err := readVarint(r[p:], 5)
	if err != nil {
		return 0, err
	}
	p += n
	if l == -1 && nullable {
		return p, nil
	}
	if l < 0 || l > int64(len(r)-p) {
		return 0, fmt.Errorf("%w: field length %d with %d bytes left", ErrCorrupt, l, len(r)-p)
	}
	return p + int(l), nil
}
