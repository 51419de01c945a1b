package log

import (
	"fmt"
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
