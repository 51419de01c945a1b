package log

import (
	"encoding/binary"
	"hash/crc32"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Tests of the producer-state snapshot format (issue 3) and its fuzz
// target (S17).

// snapFixCRC recomputes the CRC of a snapshot after a test edited it.
func snapFixCRC(data []byte) []byte {
	binary.BigEndian.PutUint32(data[2:], crc32.Checksum(data[6:], castagnoli))
	return data
}

// snapEntry makes a producer entry holding the given batches.
func snapEntry(epoch int16, lastTS int64, batches ...batchMeta) *producerEntry {
	e := &producerEntry{epoch: epoch, lastTimestamp: lastTS, n: len(batches)}
	copy(e.batches[:], batches)
	return e
}

// snapStates are producer states used by several tests.
func snapStates() map[string]map[int64]*producerEntry {
	full := snapEntry(3, 9_000)
	for i := range producerBatchesKept {
		full.batches[i] = batchMeta{firstSeq: int32(i * 10), lastSeq: int32(i*10 + 9), lastOffset: int64(100 + i*10), offsetDelta: 9, timestamp: int64(8_000 + i)}
	}
	full.n = producerBatchesKept
	many := map[int64]*producerEntry{}
	for pid := range int64(300) {
		many[pid*7919] = snapEntry(int16(pid%5), pid, batchMeta{firstSeq: int32(pid), lastSeq: int32(pid), lastOffset: pid, timestamp: pid})
	}
	return map[string]map[int64]*producerEntry{
		"empty":                    {},
		"producer without batches": {42: snapEntry(0, NoTimestamp)},
		"five batches":             {1: full},
		"extreme values": {
			math.MaxInt64: snapEntry(math.MaxInt16, math.MaxInt64,
				batchMeta{firstSeq: math.MaxInt32, lastSeq: 1, lastOffset: math.MaxInt64, offsetDelta: math.MaxInt32, timestamp: math.MinInt64}),
			0:             snapEntry(math.MinInt16, math.MinInt64, batchMeta{firstSeq: math.MinInt32, lastSeq: -1, lastOffset: -1, offsetDelta: -1, timestamp: -1}),
			math.MinInt64: snapEntry(-1, -1),
		},
		"300 producers": many,
	}
}

// TestSnapshotLayout pins the documented byte layout: version i16, CRC-32C
// u32 over the bytes after it, count i32, then per producer pid i64, epoch
// i16, lastTimestamp i64, batches i8, and per batch firstSeq i32, lastSeq
// i32, lastOffset i64, offsetDelta i32, timestamp i64, all big-endian.
func TestSnapshotLayout(t *testing.T) {
	got := encodeMap(nil, map[int64]*producerEntry{
		0x0102030405060708: snapEntry(0x090a, 0x0b0c0d0e0f101112,
			batchMeta{firstSeq: 1, lastSeq: 2, lastOffset: 3, offsetDelta: 4, timestamp: 5},
			batchMeta{firstSeq: -6, lastSeq: 7, lastOffset: 8, offsetDelta: 9, timestamp: -10}),
	})
	want := []byte{
		0, 1, // version
		0, 0, 0, 0, // crc, below
		0, 0, 0, 1, // count
		1, 2, 3, 4, 5, 6, 7, 8, // pid
		9, 10, // epoch
		0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, // lastTimestamp
		2,          // batches
		0, 0, 0, 1, // firstSeq
		0, 0, 0, 2, // lastSeq
		0, 0, 0, 0, 0, 0, 0, 3, // lastOffset
		0, 0, 0, 4, // offsetDelta
		0, 0, 0, 0, 0, 0, 0, 5, // timestamp
		0xff, 0xff, 0xff, 0xfa,
		0, 0, 0, 7,
		0, 0, 0, 0, 0, 0, 0, 8,
		0, 0, 0, 9,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf6,
	}
	binary.BigEndian.PutUint32(want[2:], crc32.Checksum(want[6:], crc32.MakeTable(crc32.Castagnoli)))
	require.Equal(t, want, got)
	require.Len(t, got, snapshotHeaderSize+snapshotEntrySize+2*snapshotBatchSize)
}

// TestSnapshotRoundTrip checks that decoding an encoded state gives it
// back, whatever the map order the encoder used, and that encoding
// appends to dst.
func TestSnapshotRoundTrip(t *testing.T) {
	for name, state := range snapStates() {
		t.Run(name, func(t *testing.T) {
			prefix := []byte("prefix")
			data := encodeMap(append([]byte(nil), prefix...), state)
			require.Equal(t, prefix, data[:len(prefix)])
			data = data[len(prefix):]
			n, err := DecodeSnapshot(data)
			require.NoError(t, err)
			require.Equal(t, len(state), n)
			got, err := decodeSnapshot(data)
			require.NoError(t, err)
			require.Equal(t, idemEntries(state), idemEntries(got))
		})
	}
}

// TestSnapshotDecodeRejects checks that every kind of damage is reported
// as ErrCorrupt, including damage made consistent with the CRC (a buggy
// writer, or a matching CRC by chance).
func TestSnapshotDecodeRejects(t *testing.T) {
	valid := func() []byte {
		return encodeMap(nil, map[int64]*producerEntry{
			1: snapEntry(0, 5, batchMeta{firstSeq: 0, lastSeq: 1, lastOffset: 1, offsetDelta: 1, timestamp: 5}),
			2: snapEntry(0, 6, batchMeta{firstSeq: 0, lastSeq: 0, lastOffset: 2, timestamp: 6}),
		})
	}
	entry0 := snapshotHeaderSize
	tests := []struct {
		name   string
		damage func(d []byte) []byte
	}{
		{name: "nil", damage: func([]byte) []byte { return nil }},
		{name: "header only partly", damage: func(d []byte) []byte { return d[:snapshotHeaderSize-1] }},
		{name: "unknown version", damage: func(d []byte) []byte { d[1] = 2; return d }},
		{name: "version 0", damage: func(d []byte) []byte { d[1] = 0; return d }},
		{name: "bad crc", damage: func(d []byte) []byte { d[5] ^= 1; return d }},
		{name: "flipped body bit", damage: func(d []byte) []byte { d[len(d)-1] ^= 0x80; return d }},
		{name: "truncated by one byte", damage: func(d []byte) []byte { return d[:len(d)-1] }},
		{name: "truncated, crc fixed", damage: func(d []byte) []byte { return snapFixCRC(d[:len(d)-3]) }},
		{name: "trailing byte, crc fixed", damage: func(d []byte) []byte { return snapFixCRC(append(d, 0)) }},
		{name: "count too large, crc fixed", damage: func(d []byte) []byte {
			binary.BigEndian.PutUint32(d[6:], 3)
			return snapFixCRC(d)
		}},
		{name: "count of 2^32-1, crc fixed", damage: func(d []byte) []byte {
			binary.BigEndian.PutUint32(d[6:], math.MaxUint32)
			return snapFixCRC(d)
		}},
		{name: "count too small, crc fixed", damage: func(d []byte) []byte {
			binary.BigEndian.PutUint32(d[6:], 1)
			return snapFixCRC(d)
		}},
		{name: "six batches, crc fixed", damage: func(d []byte) []byte {
			d[entry0+18] = producerBatchesKept + 1
			return snapFixCRC(d)
		}},
		{name: "255 batches, crc fixed", damage: func(d []byte) []byte {
			d[entry0+18] = 255
			return snapFixCRC(d)
		}},
		{name: "batch count past the end, crc fixed", damage: func(d []byte) []byte {
			d[len(d)-snapshotBatchSize-1] = 2
			return snapFixCRC(d)
		}},
		{name: "same producer twice, crc fixed", damage: func(d []byte) []byte {
			second := entry0 + snapshotEntrySize + snapshotBatchSize
			copy(d[second:second+8], d[entry0:entry0+8])
			return snapFixCRC(d)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.damage(valid())
			n, err := DecodeSnapshot(d)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Zero(t, n)
		})
	}
	_, err := DecodeSnapshot(valid())
	require.NoError(t, err, "the undamaged snapshot must decode")
}

// FuzzSnapshotDecode (S17): arbitrary bytes never panic and are either a
// snapshot or an error wrapping ErrCorrupt; what decodes re-encodes to a
// snapshot that decodes to the same state.
//
//	go test -run='^$' -fuzz=FuzzSnapshotDecode -fuzztime=60s ./log/
func FuzzSnapshotDecode(f *testing.F) {
	for _, state := range snapStates() {
		data := encodeMap(nil, state)
		f.Add(data)
		if len(data) > snapshotHeaderSize {
			f.Add(data[:len(data)-1])
		}
		if len(data) >= snapshotHeaderSize+snapshotBatchSize {
			f.Add(snapFixCRC(append([]byte(nil), data[:len(data)-snapshotBatchSize]...)))
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := DecodeSnapshot(data)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			require.Zero(t, n)
			return
		}
		state, err := decodeSnapshot(data)
		require.NoError(t, err)
		require.Len(t, state, n)
		for _, e := range state {
			require.LessOrEqual(t, e.n, producerBatchesKept)
		}
		again := encodeMap(nil, state)
		require.Len(t, again, len(data), "a valid snapshot has exactly the encoded size")
		back, err := decodeSnapshot(again)
		require.NoError(t, err)
		require.Equal(t, idemEntries(state), idemEntries(back))
	})
}

// encodeMap encodes the producer state held in m.
func encodeMap(dst []byte, m map[int64]*producerEntry) []byte {
	return encodeSnapshot(dst, producerStateOf(m))
}

// asMap returns the producer state as a map of copies.
func (ps *producerState) asMap() map[int64]*producerEntry {
	m := make(map[int64]*producerEntry, ps.count())
	for i := range ps.entries {
		e := ps.entries[i].producerEntry
		m[ps.entries[i].pid] = &e
	}
	return m
}
