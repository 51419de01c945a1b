package log

import "fmt"

// minRecordSize is the smallest encoded record: length, attributes,
// timestamp delta, offset delta, key length, value length and header
// count, one byte each.
const minRecordSize = 7

// Header is a record header. Key and Value alias the batch bytes.
type Header struct {
	Key   []byte
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
	Timestamp   int64
	OffsetDelta int32
	Attributes  int8
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
// compressed batch, decompress RecordsBody first and use Reset.
func (b Batch) Records() *RecordIterator {
	it := &RecordIterator{}
	it.reset(b, b.RecordsBody())
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

// Err returns the first decoding error, wrapping ErrCorrupt.
func (it *RecordIterator) Err() error { return it.err }

// decoder reads fields from a bounded byte slice.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) varint(maxLen int) int64 {
	if d.err != nil {
		return 0
	}
	v, n, err := readVarint(d.b, maxLen)
	if err != nil {
		d.err = err
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte1() int8 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.err = fmt.Errorf("%w: record truncated", ErrCorrupt)
		return 0
	}
	v := int8(d.b[0])
	d.b = d.b[1:]
	return v
}

// bytes reads a varint length and that many bytes; -1 means nil when
// nullable.
func (d *decoder) bytes(nullable bool) []byte {
	n := d.varint(5)
	if d.err != nil {
		return nil
	}
	if n == -1 && nullable {
		return nil
	}
	if n < 0 || n > int64(len(d.b)) {
		d.err = fmt.Errorf("%w: field length %d with %d bytes left", ErrCorrupt, n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
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
