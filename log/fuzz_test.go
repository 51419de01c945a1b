package log

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"testing"

	"github.com/replog/replog/compression"
	"github.com/replog/replog/internal/vfs"
)

// Fuzz targets for every decoder of on-disk bytes in this package (S17):
// record batches, index files and checkpoint files. CI runs each briefly:
//
//	go test -run='^$' -fuzz=^FuzzBatchDecode$ -fuzztime=10s ./log/

// seedBatches are valid and edge-case batches for the batch fuzzer.
func seedBatches(t testing.TB) [][]byte {
	var seeds [][]byte
	add := func(b []byte) { seeds = append(seeds, b) }
	bb := NewBatchBuilder()
	b, _ := bb.Build(nil)
	add(b) // empty batch
	bb.Add(1_700_000_000_000, []byte("key"), []byte("value"), Header{Key: []byte("h"), Value: []byte("v")}, Header{Key: []byte("n")})
	bb.Add(1_699_999_999_000, nil, nil)
	bb.Add(1_700_000_000_001, []byte{}, bytes.Repeat([]byte("x"), 200))
	b, _ = bb.Build(nil)
	add(b)
	two := append(append([]byte(nil), b...), buildBatch(t, 2, 10, 5)...)
	add(two) // two batches back to back
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: 7, ProducerEpoch: 1, BaseSequence: math.MaxInt32 - 1, Attributes: attrTransactional | attrLogAppendTime})
	bb.Add(5, []byte("k"), []byte("v"))
	bb.Add(6, []byte("k"), []byte("v"))
	b, _ = bb.Build(nil)
	Batch(b).setBaseOffset(1 << 40)
	Batch(b).setLeaderEpoch(9)
	add(b)
	// Compressed bodies, for every codec that compression offers.
	local := compression.NewLocal(compression.Options{})
	for _, c := range []compression.Codec{compression.Gzip, compression.Snappy, compression.LZ4, compression.Zstd} {
		comp, err := CompressWith(local, c, 0)
		if err != nil {
			continue
		}
		bb.Reset(BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence, Compressor: comp})
		bb.Add(10, []byte("compressed"), bytes.Repeat([]byte("abc"), 50))
		bb.Add(11, nil, []byte("second"))
		if b, err := bb.Build(nil); err == nil {
			add(b)
		}
	}
	// Edge cases: hand-made records the builder never writes.
	add(rawBatch(defaultRawHeader(1), rawRecord(recordFields(0, 0, nil, nil))))
	add(rawBatch(defaultRawHeader(1), append(overlong(0, 5), 0)))                               // overlong record length
	add(rawBatch(defaultRawHeader(2), rawRecord(recordFields(0, 0, []byte("k"), []byte("v"))))) // count above records
	add(rawBatch(defaultRawHeader(1), rawRecord(append([]byte{0}, append(overlong(2, 10), 0, 1, 1, 0)...))))
	bad := append([]byte(nil), seeds[1]...)
	bad[len(bad)-1] ^= 1
	add(bad)           // bad CRC
	add(seeds[1][:70]) // truncated
	huge := append([]byte(nil), seeds[1]...)
	binary.BigEndian.PutUint32(huge[offLength:], math.MaxInt32)
	add(huge)             // length far past the end
	add(make([]byte, 61)) // all zeros
	add(nil)
	return seeds
}

// decodedRecord is a record's content, copied out of the iterator.
type decodedRecord struct {
	ts          int64
	offsetDelta int32
	key, value  []byte
	headers     []Header
}

// decodeAll validates and iterates a batch; it returns its records, or the
// first error. Errors must wrap ErrCorrupt, or for a compressed body one
// of the compression sentinels.
func decodeAll(t *testing.T, b Batch, local *compression.Local) ([]decodedRecord, error) {
	if err := b.Validate(); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Validate: %v does not wrap ErrCorrupt", err)
		}
		return nil, err
	}
	var it RecordIterator
	if err := it.ResetBatch(b, local); err != nil {
		if !errors.Is(err, compression.ErrCorrupt) && !errors.Is(err, compression.ErrTooLarge) &&
			!errors.Is(err, compression.ErrUnsupported) && !errors.Is(err, compression.ErrUnknownCodec) {
			t.Fatalf("ResetBatch: unexpected error %v", err)
		}
		return nil, err
	}
	var recs []decodedRecord
	for it.Next() {
		r := it.Record()
		d := decodedRecord{ts: r.Timestamp, offsetDelta: r.OffsetDelta, key: clone(r.Key), value: clone(r.Value)}
		for _, h := range r.Headers {
			d.headers = append(d.headers, Header{Key: clone(h.Key), Value: clone(h.Value)})
		}
		recs = append(recs, d)
	}
	if err := it.Err(); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("iteration: %v does not wrap ErrCorrupt", err)
		}
		return nil, err
	}
	return recs, nil
}

// clone copies b, keeping nil and empty apart.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

// FuzzBatchDecode feeds arbitrary bytes to SplitBatch, Validate and record
// iteration (decompressing when the batch says so). Nothing may panic and
// every error must be typed. A batch that validates must be consistent
// with its header, and rebuilding it from its records with BatchBuilder
// must give a valid batch with the same records; when the input is in the
// builder's canonical form, the very same bytes.
func FuzzBatchDecode(f *testing.F) {
	for _, s := range seedBatches(f) {
		f.Add(s)
	}
	local := compression.NewLocal(compression.Options{MaxDecompressedSize: 1 << 20})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 0 {
			n := int32(data[0] % 20)
			checkRecordsAgreesWithIterator(t, make(Batch, BatchHeaderSize), data[1:], n, n-1+int32(data[0]/20%4))
		}
		rest := data
		for len(rest) > 0 {
			b, r, err := SplitBatch(rest)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("SplitBatch: %v does not wrap ErrCorrupt", err)
				}
				if len(r) != len(rest) {
					t.Fatalf("SplitBatch consumed input on error")
				}
				return
			}
			if len(b)+len(r) != len(rest) || b.Size() != len(b) {
				t.Fatalf("SplitBatch framed %d + %d bytes of %d, size field %d", len(b), len(r), len(rest), b.Size())
			}
			rest = r
			if len(b) >= BatchHeaderSize {
				checkRecordsAgreesWithIterator(t, b, b.RecordsBody(), b.RecordCount(), b.LastOffsetDelta())
			}
			recs, err := decodeAll(t, b, local)
			if err != nil {
				continue
			}
			checkValidBatch(t, b, recs)
		}
	})
}

// checkRecordsAgreesWithIterator checks that the append path's record
// check accepts body exactly when a RecordIterator walks count records
// of it with offset deltas increasing within [0, lastDelta] and nothing
// left over, and finds the same max timestamp.
func checkRecordsAgreesWithIterator(t *testing.T, b Batch, body []byte, count, lastDelta int32) {
	t.Helper()
	var it RecordIterator
	it.batch, it.body, it.remaining = b, body, count
	walked := int32(0)
	maxTS := NoTimestamp
	prev := int32(-1)
	for it.Next() {
		if od := it.Record().OffsetDelta; od <= prev || od > lastDelta {
			break
		}
		prev = it.Record().OffsetDelta
		maxTS = max(maxTS, it.Record().Timestamp)
		walked++
	}
	iterOK := it.Err() == nil && walked == max(count, 0)
	gotMax, err := checkRecords(body, count, lastDelta, b.BaseTimestamp())
	if err == nil && iterOK && !b.IsLogAppendTime() && gotMax != maxTS {
		t.Fatalf("checkRecords finds a max timestamp of %d, the iterator %d", gotMax, maxTS)
	}
	if err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("checkRecords: %v does not wrap ErrCorrupt", err)
	}
	if (err == nil) != iterOK {
		t.Fatalf("checkRecords says %v, the iterator walked %d of %d records (err %v)", err, walked, count, it.Err())
	}
}

func checkValidBatch(t *testing.T, b Batch, recs []decodedRecord) {
	t.Helper()
	if b.ComputeCRC() != b.CRC() {
		t.Fatalf("a valid batch has a bad CRC")
	}
	if int(b.RecordCount()) != len(recs) {
		t.Fatalf("%d records iterated, header says %d", len(recs), b.RecordCount())
	}
	if len(recs) > 0 && b.LastOffsetDelta() < int32(len(recs)-1) {
		t.Fatalf("last offset delta %d with %d records", b.LastOffsetDelta(), len(recs))
	}
	dense := b.CodecID() != 0 || b.LastOffsetDelta() == int32(len(recs)-1) // compressed: deltas unchecked
	prev := int32(-1)
	for i, r := range recs {
		if b.CodecID() == 0 && (r.offsetDelta <= prev || r.offsetDelta > b.LastOffsetDelta()) {
			t.Fatalf("record %d has offset delta %d after %d, last offset delta %d", i, r.offsetDelta, prev, b.LastOffsetDelta())
		}
		prev = r.offsetDelta
	}

	// Rebuild from the records.
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: b.ProducerID(), ProducerEpoch: b.ProducerEpoch(), BaseSequence: b.BaseSequence(),
		Attributes: b.Attributes() &^ attrCodecMask})
	for _, r := range recs {
		bb.Add(r.ts, r.key, r.value, r.headers...)
	}
	out, err := bb.Build(nil)
	if err != nil {
		t.Fatalf("rebuilding a valid batch: %v", err)
	}
	nb := Batch(out)
	nb.setBaseOffset(b.BaseOffset())
	nb.setLeaderEpoch(b.LeaderEpoch())
	again, err := decodeAll(t, nb, nil)
	if err != nil {
		t.Fatalf("the rebuilt batch does not decode: %v", err)
	}
	if len(again) != len(recs) {
		t.Fatalf("rebuilt batch has %d records, want %d", len(again), len(recs))
	}
	for i := range recs {
		x, y := recs[i], again[i]
		sameTS := x.ts == y.ts || b.IsLogAppendTime()
		if !sameTS || !bytes.Equal(x.key, y.key) || !bytes.Equal(x.value, y.value) ||
			(x.key == nil) != (y.key == nil) || (x.value == nil) != (y.value == nil) || len(x.headers) != len(y.headers) {
			t.Fatalf("record %d differs after rebuilding: %+v vs %+v", i, x, y)
		}
		for j := range x.headers {
			hx, hy := x.headers[j], y.headers[j]
			if !bytes.Equal(hx.Key, hy.Key) || !bytes.Equal(hx.Value, hy.Value) || (hx.Value == nil) != (hy.Value == nil) {
				t.Fatalf("record %d header %d differs after rebuilding", i, j)
			}
		}
	}
	// Canonical input (uncompressed, minimal varints, zero record
	// attributes, the builder's timestamps) comes back byte for byte.
	if dense && b.CodecID() == 0 && bytes.Equal(nb.RecordsBody(), b.RecordsBody()) &&
		nb.BaseTimestamp() == b.BaseTimestamp() && nb.MaxTimestamp() == b.MaxTimestamp() &&
		nb.LastOffsetDelta() == b.LastOffsetDelta() {
		if !bytes.Equal(nb, b) {
			t.Fatalf("canonical batch re-encodes differently:\n%x\n%x", []byte(b), []byte(nb))
		}
	}
}

// FuzzIndexLoad feeds arbitrary bytes to the offset and time index
// validators and, through a file, to the index loader. Nothing may panic;
// errors wrap ErrCorrupt; an index that loads answers lookups like a
// brute-force search over its entries.
func FuzzIndexLoad(f *testing.F) {
	var off, ts []byte
	for i := int32(1); i <= 6; i++ {
		off = append(off, offsetEntry(i*3, i*100)...)
		ts = append(ts, timeEntry(int64(i)*1000, i*3)...)
	}
	f.Add(off, int64(1000))
	f.Add(off, int64(600)) // last position past the log
	f.Add(ts, int64(1000))
	f.Add(off[:12], int64(1000))
	f.Add([]byte{}, int64(0))
	f.Add(append(offsetEntry(5, 10), offsetEntry(5, 20)...), int64(100))
	f.Add(append(timeEntry(-1, 0), timeEntry(math.MaxInt64, math.MaxInt32)...), int64(1))
	f.Add(bytes.Repeat([]byte{0xff}, 24), int64(math.MaxInt64))

	fs := vfs.NewMem()
	if err := fs.MkdirAll("/idx", 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, logSize int64) {
		for _, kind := range []struct {
			size     int
			validate func([]byte) error
		}{
			{offsetEntrySize, func(d []byte) error { return validateOffsetEntries(d, logSize) }},
			{timeEntrySize, validateTimeEntries},
		} {
			verr := kind.validate(data)
			if verr != nil && !errors.Is(verr, ErrCorrupt) {
				t.Fatalf("validate: %v does not wrap ErrCorrupt", verr)
			}
			path := "/idx/00000000000000000000.index"
			file, err := fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := file.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			file.Close()
			x := newIndex(path, kind.size, false)
			lerr := x.ensureLoaded(fs, kind.validate)
			wantOK := verr == nil && len(data)%kind.size == 0
			if (lerr == nil) != wantOK {
				t.Fatalf("ensureLoaded: %v, validate: %v, %d bytes", lerr, verr, len(data))
			}
			if lerr != nil {
				if !errors.Is(lerr, ErrCorrupt) {
					t.Fatalf("ensureLoaded: %v does not wrap ErrCorrupt", lerr)
				}
				continue
			}
			checkLookups(t, x, kind.size)
		}
	})
}

// checkLookups compares index lookups with a brute-force search.
func checkLookups(t *testing.T, x *index, size int) {
	n := len(x.entries) / size
	be := binary.BigEndian
	for i := -1; i <= n; i++ {
		// Targets at, just below and just above every entry's key.
		var key int64
		if i >= 0 && i < n {
			if size == offsetEntrySize {
				key = int64(int32(be.Uint32(x.entries[i*size:])))
			} else {
				key = int64(be.Uint64(x.entries[i*size:]))
			}
		}
		for _, target := range []int64{key - 1, key, key + 1} {
			if size == offsetEntrySize {
				if target < math.MinInt32 || target > math.MaxInt32 {
					continue
				}
				want := int64(0)
				for j := 0; j < n; j++ {
					if int64(int32(be.Uint32(x.entries[j*size:]))) <= target {
						want = int64(be.Uint32(x.entries[j*size+4:]))
					}
				}
				if got := (offsetIndex{x}).lookup(int32(target)); got != want {
					t.Fatalf("offset lookup(%d) = %d, want %d", target, got, want)
				}
				continue
			}
			if target == math.MinInt64 {
				continue
			}
			want := int32(0)
			for j := 0; j < n; j++ {
				if int64(be.Uint64(x.entries[j*size:])) < target {
					want = int32(be.Uint32(x.entries[j*size+8:]))
				}
			}
			if got := (timeIndex{x}).lookup(target); got != want {
				t.Fatalf("time lookup(%d) = %d, want %d", target, got, want)
			}
		}
	}
}

// FuzzCheckpoint feeds arbitrary text to DecodeCheckpoint. Nothing may
// panic; errors wrap ErrCorrupt; what decodes re-encodes to text that
// decodes to the same rows, and encoding those again gives the same text.
func FuzzCheckpoint(f *testing.F) {
	f.Add([]byte("0\n0\n"), uint8(1))
	f.Add([]byte("0\n1\n42\n"), uint8(1))
	f.Add([]byte("0\n2\n0 0\n3 100\n"), uint8(2))
	f.Add([]byte("0\n1\n-9223372036854775808 9223372036854775807\n"), uint8(2))
	f.Add([]byte("0\n1\n+5\n"), uint8(1))
	f.Add([]byte("0\n1\n007\n"), uint8(1))
	f.Add([]byte("1\n0\n"), uint8(1))
	f.Add([]byte("0\n2\n5\n"), uint8(1))
	f.Add([]byte("0\n1\n5"), uint8(1))
	f.Add([]byte("0\n1\n5 6 7\n"), uint8(3))
	f.Add([]byte("0\n1\n9223372036854775808\n"), uint8(1))
	f.Add([]byte(""), uint8(1))
	f.Add([]byte("\n\n\n"), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, fields uint8) {
		n := int(fields%4) + 1
		rows, err := DecodeCheckpoint(data, n)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%v does not wrap ErrCorrupt", err)
			}
			if rows != nil {
				t.Fatalf("rows returned with an error")
			}
			return
		}
		for _, r := range rows {
			if len(r) != n {
				t.Fatalf("row with %d fields, want %d", len(r), n)
			}
		}
		enc := EncodeCheckpoint(rows)
		again, err := DecodeCheckpoint(enc, n)
		if err != nil {
			t.Fatalf("re-encoded checkpoint does not decode: %v\n%q", err, enc)
		}
		if len(again) != len(rows) {
			t.Fatalf("%d rows after a round trip, want %d", len(again), len(rows))
		}
		for i := range rows {
			for j := range rows[i] {
				if rows[i][j] != again[i][j] {
					t.Fatalf("row %d field %d: %d after a round trip, want %d", i, j, again[i][j], rows[i][j])
				}
			}
		}
		if !bytes.Equal(EncodeCheckpoint(again), enc) {
			t.Fatalf("encoding is not stable")
		}
	})
}
