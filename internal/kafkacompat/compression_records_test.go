package kafkacompat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/compression"
)

// Helpers of the compression compatibility tests: a minimal record batch
// v2 encoder and decoder (reference/kafka.md section 1), written here so
// that these tests do not depend on package log.

// compatRecord is a record as the compatibility tests compare it.
type compatRecord struct {
	Key, Value []byte
	Headers    []compatHeader
	TsDelta    int64
}

type compatHeader struct{ Key, Value string }

// compatRecords returns n records with JSON-like values of about size
// bytes, keys and a header, deterministic in seed.
func compatRecords(seed uint64, n, size int) []compatRecord {
	rng := rand.New(rand.NewPCG(seed, 7))
	recs := make([]compatRecord, n)
	for i := range recs {
		var sb strings.Builder
		fmt.Fprintf(&sb, `{"seq":%d,"user":"user-%05d","event":"%s","items":[`, i, rng.IntN(50000), []string{"view", "click", "buy"}[rng.IntN(3)])
		for sb.Len() < size-20 {
			fmt.Fprintf(&sb, `{"sku":%d,"qty":%d},`, rng.IntN(1000), 1+rng.IntN(4))
		}
		sb.WriteString(`{"sku":0,"qty":0}]}`)
		recs[i] = compatRecord{
			Key:     fmt.Appendf(nil, "key-%d", rng.IntN(100)),
			Value:   []byte(sb.String()),
			Headers: []compatHeader{{"trace", fmt.Sprintf("%016x", rng.Uint64())}},
			TsDelta: int64(i),
		}
	}
	return recs
}

// appendCompatRecords appends the records in the v2 record format (zigzag
// varints) to b.
func appendCompatRecords(b []byte, recs []compatRecord) []byte {
	for i, r := range recs {
		var rec []byte
		rec = append(rec, 0) // attributes
		rec = binary.AppendVarint(rec, r.TsDelta)
		rec = binary.AppendVarint(rec, int64(i))
		rec = binary.AppendVarint(rec, int64(len(r.Key)))
		rec = append(rec, r.Key...)
		rec = binary.AppendVarint(rec, int64(len(r.Value)))
		rec = append(rec, r.Value...)
		rec = binary.AppendVarint(rec, int64(len(r.Headers)))
		for _, h := range r.Headers {
			rec = binary.AppendVarint(rec, int64(len(h.Key)))
			rec = append(rec, h.Key...)
			rec = binary.AppendVarint(rec, int64(len(h.Value)))
			rec = append(rec, h.Value...)
		}
		b = binary.AppendVarint(b, int64(len(rec)))
		b = append(b, rec...)
	}
	return b
}

var errCompatRecords = errors.New("malformed records")

// parseCompatRecords parses exactly n v2 records from body.
func parseCompatRecords(body []byte, n int) ([]compatRecord, error) {
	varint := func() (int64, error) {
		v, k := binary.Varint(body)
		if k <= 0 {
			return 0, errCompatRecords
		}
		body = body[k:]
		return v, nil
	}
	bytesOf := func() ([]byte, error) {
		l, err := varint()
		if err != nil || l < -1 || l > int64(len(body)) {
			return nil, errCompatRecords
		}
		if l < 0 {
			return nil, nil
		}
		b := body[:l]
		body = body[l:]
		return b, nil
	}
	recs := make([]compatRecord, 0, n)
	for i := range n {
		l, err := varint()
		if err != nil || l < 1 || l > int64(len(body)) {
			return nil, errCompatRecords
		}
		end := len(body) - int(l)
		body = body[1:] // attributes
		var r compatRecord
		if r.TsDelta, err = varint(); err != nil {
			return nil, err
		}
		if od, err := varint(); err != nil || od != int64(i) {
			return nil, fmt.Errorf("%w: offset delta %d at %d", errCompatRecords, od, i)
		}
		if r.Key, err = bytesOf(); err != nil {
			return nil, err
		}
		if r.Value, err = bytesOf(); err != nil {
			return nil, err
		}
		nh, err := varint()
		if err != nil || nh < 0 {
			return nil, errCompatRecords
		}
		for range nh {
			k, err := bytesOf()
			if err != nil {
				return nil, err
			}
			v, err := bytesOf()
			if err != nil {
				return nil, err
			}
			r.Headers = append(r.Headers, compatHeader{string(k), string(v)})
		}
		if len(body) != end {
			return nil, fmt.Errorf("%w: record %d length", errCompatRecords, i)
		}
		recs = append(recs, r)
	}
	if len(body) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the records", errCompatRecords, len(body))
	}
	return recs, nil
}

const compatHeaderLen = 61 // record batch v2 header

var compatCRC = crc32.MakeTable(crc32.Castagnoli)

// buildCompatBatch returns a v2 record batch holding recs, its records
// compressed by this package with codec c at level.
func buildCompatBatch(t *testing.T, l *compression.Local, recs []compatRecord, c compression.Codec, level int, baseTs int64) []byte {
	t.Helper()
	b := make([]byte, compatHeaderLen)
	b, err := l.Compress(b, appendCompatRecords(nil, recs), c, level)
	require.NoError(t, err)
	be := binary.BigEndian
	be.PutUint64(b[0:], 0)                                                 // baseOffset
	be.PutUint32(b[8:], uint32(len(b)-12))                                 // length
	be.PutUint32(b[12:], 0xFFFFFFFF)                                       // partitionLeaderEpoch -1
	b[16] = 2                                                              // magic
	be.PutUint16(b[21:], uint16(c))                                        // attributes: codec
	be.PutUint32(b[23:], uint32(len(recs)-1))                              // lastOffsetDelta
	be.PutUint64(b[27:], uint64(baseTs))                                   // baseTimestamp
	be.PutUint64(b[35:], uint64(baseTs)+uint64(recs[len(recs)-1].TsDelta)) // maxTimestamp
	be.PutUint64(b[43:], 0xFFFFFFFFFFFFFFFF)                               // producerId -1
	be.PutUint16(b[51:], 0xFFFF)                                           // producerEpoch -1
	be.PutUint32(b[53:], 0xFFFFFFFF)                                       // baseSequence -1
	be.PutUint32(b[57:], uint32(len(recs)))                                // recordsCount
	be.PutUint32(b[17:], crc32.Checksum(b[21:], compatCRC))
	return b
}

// compatBatch is a record batch split into what the tests look at.
type compatBatch struct {
	Codec   compression.Codec
	Count   int
	Records []byte // the (compressed) records
}

// splitCompatBatches splits a partition's record batches, checking their
// length, magic and CRC. A fetch may end with a partial batch; it is
// dropped.
func splitCompatBatches(t *testing.T, b []byte) []compatBatch {
	t.Helper()
	var out []compatBatch
	for len(b) >= compatHeaderLen {
		n := 12 + int(binary.BigEndian.Uint32(b[8:]))
		if n > len(b) {
			break
		}
		batch := b[:n]
		b = b[n:]
		require.EqualValues(t, 2, batch[16], "magic")
		require.Equal(t, binary.BigEndian.Uint32(batch[17:]), crc32.Checksum(batch[21:], compatCRC), "crc")
		c, err := compression.CodecFromID(int(binary.BigEndian.Uint16(batch[21:]) & compression.AttributesMask))
		require.NoError(t, err)
		out = append(out, compatBatch{Codec: c, Count: int(binary.BigEndian.Uint32(batch[57:])), Records: batch[compatHeaderLen:]})
	}
	return out
}
