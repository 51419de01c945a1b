package log

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecordIteratorReset(t *testing.T) {
	bb := NewBatchBuilder()
	bb.Add(100, []byte("a"), []byte("1"), Header{Key: []byte("x"), Value: []byte("y")}, Header{Key: []byte("z")})
	bb.Add(101, []byte("b"), []byte("2"))
	first, err := bb.Build(nil)
	require.NoError(t, err)
	bb.Reset(BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence})
	bb.Add(7, nil, []byte("only"))
	second, err := bb.Build(nil)
	require.NoError(t, err)
	Batch(second).setBaseOffset(50)

	var it RecordIterator
	require.False(t, it.Next(), "the zero iterator is empty")
	require.NoError(t, it.Err())

	it.Reset(Batch(first), Batch(first).RecordsBody())
	require.True(t, it.Next())
	require.Len(t, it.Record().Headers, 2)
	require.Nil(t, it.Record().Headers[1].Value)
	require.True(t, it.Next())
	require.Empty(t, it.Record().Headers, "headers are reset per record")
	require.False(t, it.Next())
	require.NoError(t, it.Err())

	// Reset onto another batch after an error clears the error.
	it.Reset(Batch(first), Batch(first).RecordsBody()[:5])
	require.False(t, it.Next())
	require.ErrorIs(t, it.Err(), ErrCorrupt)
	require.False(t, it.Next(), "an iterator stays stopped after an error")

	it.Reset(Batch(second), Batch(second).RecordsBody())
	require.NoError(t, it.Err())
	require.True(t, it.Next())
	r := it.Record()
	assert.Equal(t, int64(50), r.Offset)
	assert.Equal(t, int64(7), r.Timestamp)
	assert.Nil(t, r.Key)
	assert.Equal(t, []byte("only"), r.Value)
	require.False(t, it.Next())
	require.NoError(t, it.Err())
}

// TestRecordIteratorSeparateBody checks Reset with a body that is not the
// batch's own bytes, as for a decompressed batch: offsets, timestamps and
// the count come from the header, the records from the body.
func TestRecordIteratorSeparateBody(t *testing.T) {
	b := Batch(buildBatch(t, 3, 4, 2000))
	b.setBaseOffset(10)
	body := append([]byte(nil), b.RecordsBody()...)
	var it RecordIterator
	it.Reset(b, body)
	n := 0
	for it.Next() {
		r := it.Record()
		require.Equal(t, int64(10+n), r.Offset)
		require.Equal(t, int64(2000+n), r.Timestamp)
		want := make([]byte, 4)
		for j := range want {
			want[j] = byte(n + j)
		}
		require.Equal(t, want, r.Value)
		require.Equal(t, []byte(fmt.Sprintf("k%d", n)), r.Key)
		n++
	}
	require.NoError(t, it.Err())
	require.Equal(t, 3, n)
}

// TestRecordIteratorTruncatedBody cuts a valid body at every length: the
// iterator must report ErrCorrupt (never panic, never succeed).
func TestRecordIteratorTruncatedBody(t *testing.T) {
	bb := NewBatchBuilder()
	bb.Add(1, []byte("key"), []byte("value"), Header{Key: []byte("h"), Value: []byte("v")})
	bb.Add(2, nil, nil)
	raw, err := bb.Build(nil)
	require.NoError(t, err)
	b := Batch(raw)
	body := b.RecordsBody()
	for cut := 0; cut < len(body); cut++ {
		var it RecordIterator
		it.Reset(b, body[:cut])
		for it.Next() {
		}
		require.ErrorIs(t, it.Err(), ErrCorrupt, "body cut at %d of %d", cut, len(body))
	}
}

func TestRecordIteratorDoesNotAllocate(t *testing.T) {
	bb := NewBatchBuilder()
	for i := 0; i < 8; i++ {
		bb.Add(int64(i), []byte("k"), []byte("v"), Header{Key: []byte("a"), Value: []byte("b")}, Header{Key: []byte("c")})
	}
	raw, err := bb.Build(nil)
	require.NoError(t, err)
	b := Batch(raw)
	var it RecordIterator
	it.Reset(b, b.RecordsBody())
	for it.Next() {
	}
	allocs := testing.AllocsPerRun(50, func() {
		it.Reset(b, b.RecordsBody())
		for it.Next() {
		}
	})
	require.Zero(t, allocs, "steady-state iteration reuses the headers slice")
}

// TestCheckRecordsAgreesWithIterator mutates valid uncompressed bodies
// (one to three bytes changed, truncated, extended, record count off by
// one) and checks that the append path's record check accepts exactly
// what the iterator accepts.
func TestCheckRecordsAgreesWithIterator(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var bodies [][]byte
	var counts []int32
	for _, s := range seedBatches(t) {
		b := Batch(s)
		if len(b) < BatchHeaderSize || b.Size() != len(b) || b.CodecID() != 0 {
			continue
		}
		bodies, counts = append(bodies, b.RecordsBody()), append(counts, b.RecordCount())
	}
	require.NotEmpty(t, bodies)
	for i := range 20000 {
		k := i % len(bodies)
		body := append([]byte(nil), bodies[k]...)
		count := counts[k]
		switch rng.IntN(4) {
		case 0:
			for range 1 + rng.IntN(3) {
				if len(body) > 0 {
					body[rng.IntN(len(body))] = byte(rng.Uint32())
				}
			}
		case 1:
			body = body[:rng.IntN(len(body)+1)]
		case 2:
			body = append(body, byte(rng.Uint32()))
		case 3:
			count += int32(rng.IntN(3)) - 1
		}
		checkRecordsAgreesWithIterator(t, make(Batch, BatchHeaderSize), body, count, count-1+int32(rng.IntN(3)))
	}
}

// TestCheckRecordsCases covers each rule of the append path's record
// check with a hand-encoded record, against the iterator's verdict.
func TestCheckRecordsCases(t *testing.T) {
	v := func(x int64) []byte { return appendVarint(nil, x) }
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	record := func(fields ...[]byte) []byte {
		body := cat(fields...)
		return append(v(int64(len(body))), body...)
	}
	attrs := []byte{0}
	ok := record(attrs, v(0), v(0), v(-1), v(1), []byte("v"), v(0))
	cases := []struct {
		name  string
		body  []byte
		count int32
		want  bool
	}{
		{"plain record", ok, 1, true},
		{"two records", cat(ok, record(attrs, v(5), v(1), v(0), v(-1), v(0))), 2, true},
		{"headers with a null value", record(attrs, v(0), v(0), v(1), []byte("k"), v(0), v(2), v(1), []byte("h"), v(-1), v(0), v(0)), 1, true},
		{"a byte left inside the record", record(attrs, v(0), v(0), v(-1), v(1), []byte("v"), v(0), []byte{0}), 1, false},
		{"a byte after the last record", append(ok, 0), 1, false},
		{"offset delta 1 for record 0", record(attrs, v(0), v(1), v(-1), v(1), []byte("v"), v(0)), 1, false},
		{"second record repeats delta 0", cat(ok, ok), 2, false},
		{"null header key", record(attrs, v(0), v(0), v(-1), v(-1), v(1), v(-1), v(0)), 1, false},
		{"header count beyond the bytes", record(attrs, v(0), v(0), v(-1), v(-1), v(3), v(0), v(0)), 1, false},
		{"negative header count", record(attrs, v(0), v(0), v(-1), v(-1), v(-1), v(0), v(0)), 1, false},
		{"key longer than the record", record(attrs, v(0), v(0), v(9), v(-1), v(0)), 1, false},
		{"key length -2", record(attrs, v(0), v(0), v(-2), v(-1), v(0)), 1, false},
		{"timestamp varlong overflowing 64 bits", record(attrs, append(bytes.Repeat([]byte{0x80}, 9), 0x02), v(0), v(-1), v(-1), v(0)), 1, false},
		{"timestamp varlong using bit 63", record(attrs, append(bytes.Repeat([]byte{0xff}, 9), 0x01), v(0), v(-1), v(-1), v(0)), 1, true},
		{"timestamp varint of 11 bytes", record(attrs, bytes.Repeat([]byte{0x80}, 10), []byte{0}, v(0), v(-1), v(-1), v(0)), 1, false},
		{"offset delta over int32", record(attrs, v(0), v(1<<40), v(-1), v(-1), v(0)), 1, false},
		{"record length below the minimum", record(attrs, v(0), v(0), v(-1)), 1, false},
		{"record length past the body", ok[:len(ok)-1], 1, false},
		{"fewer records than counted", ok, 2, false},
		{"no records, no bytes", nil, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := checkRecords(c.body, c.count, c.count-1, 0)
			assert.Equal(t, c.want, err == nil, "checkRecords: %v", err)
			checkRecordsAgreesWithIterator(t, make(Batch, BatchHeaderSize), c.body, c.count, c.count-1)
		})
	}
}
