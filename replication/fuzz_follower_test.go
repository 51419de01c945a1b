package replication

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// damageRecords applies ops to records, three bytes per operation: kind,
// a position (taken modulo the length) and a value.
//
//	0: xor the byte at the position with the value (at least 1)
//	1: set the byte at the position to the value
//	2: cut the records at the position
//	3: append value bytes copied from the position
func damageRecords(records []byte, ops []byte) []byte {
	records = bytes.Clone(records)
	for ; len(ops) >= 3; ops = ops[3:] {
		kind, v := ops[0]%4, ops[2]
		pos := int(ops[1])
		if len(records) > 0 {
			pos = int(binary.BigEndian.Uint16([]byte{ops[1], ops[2]})) % len(records)
		}
		switch {
		case kind == 0 && pos < len(records):
			records[pos] ^= v | 1
		case kind == 1 && pos < len(records):
			records[pos] = v
		case kind == 2:
			records = records[:min(pos, len(records))]
		case kind == 3:
			records = append(records, records[min(pos, len(records)):min(pos+int(v), len(records))]...)
		}
	}
	return records
}

// FuzzFollowerApply hands a follower a leader's fetch response whose
// records, high watermark, error and divergence the fuzzer changes. The
// follower must not panic; its log must read back whole with offsets
// that only grow, its high watermark must not pass its log end, and
// unless the response told it to truncate, it keeps what it had. What
// it appends are the leader's batches: their CRC-covered bytes (all but
// base offset, length, leader epoch and magic) are the leader's. Unless
// it stored one at another base offset, fetching on from the real leader
// makes its log the leader's, byte for byte.
func FuzzFollowerApply(f *testing.F) {
	f.Add([]byte{}, int8(0), uint8(0), false, int8(0), int8(0))
	f.Add([]byte{0, 3, 0x40}, int8(0), uint8(0), false, int8(0), int8(0))                 // a flip in the first base offset
	f.Add([]byte{2, 0, 90}, int8(0), uint8(0), false, int8(0), int8(0))                   // a cut batch
	f.Add([]byte{3, 0, 200}, int8(0), uint8(0), false, int8(0), int8(0))                  // the batches again
	f.Add([]byte{0, 20, 1}, int8(5), uint8(0), false, int8(0), int8(0))                   // a bad epoch, a high watermark past the end
	f.Add([]byte{}, int8(0), uint8(0), true, int8(1), int8(2))                            // a divergence
	f.Add([]byte{}, int8(-3), uint8(byte(CodeOffsetOutOfRange)), false, int8(0), int8(0)) // out of range
	f.Fuzz(func(t *testing.T, ops []byte, hwDelta int8, code uint8, diverge bool, divEpoch, divEnd int8) {
		leader, follower := newCaughtUpPair(t)
		kept, err := readAll(follower.log)
		require.NoError(t, err)
		leader.produce(t, 2, AcksLeader)
		req, resp := fetchFrom(t, follower, leader, ntime)

		pr := &resp.Partitions[0]
		sent := pr.Records
		pr.Records = damageRecords(sent, ops)
		pr.HighWatermark += int64(hwDelta)
		if code < 16 {
			pr.Error = ErrorCode(code % 8)
		}
		if diverge {
			pr.Diverging = &EpochEndOffset{Epoch: int32(divEpoch), EndOffset: int64(divEnd)}
		}
		_, _ = follower.node.HandleFetchResponse(0, req, resp, ntime) // errors are fine, panics are not

		l := follower.log
		data, err := readAll(l)
		require.NoError(t, err, "the follower's log does not read back")
		require.LessOrEqual(t, l.HighWatermark(), l.LogEndOffset())
		if pr.Error == CodeOffsetOutOfRange || pr.Diverging != nil {
			require.True(t, bytes.HasPrefix(kept, data), "a truncation left more than a prefix")
		} else {
			require.True(t, bytes.HasPrefix(data, kept), "the follower lost batches it had")
		}
		if checkFromLeader(t, data, sent) {
			// A base offset damaged in transit (outside the CRC) that
			// keeps offsets growing makes a gap a follower cannot tell
			// from a compacted leader's (package doc): it may never
			// converge.
			return
		}

		convergesFromLeader(t, leader, follower)
	})
}

// convergesFromLeader checks that the follower, fetching on from the
// real leader, ends up with the leader's log.
func convergesFromLeader(t *testing.T, leader, follower *testReplica) {
	t.Helper()
	now := ntime
	for range 8 {
		now = now.Add(time.Minute) // past any backoff
		req := follower.node.BuildFetch(0, now)
		require.NotNil(t, req)
		resp, err := leader.node.HandleFetch(req, now)
		require.NoError(t, err)
		require.NoError(t, resp.Materialize())
		_, _ = follower.node.HandleFetchResponse(0, req, resp, now)
	}
	requireSameLog(t, leader.log, follower.log)
}

// crcStart is where a batch's CRC-covered bytes begin: its attributes.
const crcStart = 21

// checkFromLeader checks that every batch of data is valid, that offsets
// only grow, and that each batch's CRC-covered bytes are those of one of
// the leader's batches (the follower's own, kept ones included). It
// reports whether one of them was stored at a base offset other than the
// leader's.
func checkFromLeader(t *testing.T, data, sent []byte) (movedBase bool) {
	t.Helper()
	leaderBases := map[string]int64{}
	for rest := sent; len(rest) > 0; {
		b, r, err := log.SplitBatch(rest)
		require.NoError(t, err)
		leaderBases[string(b[crcStart:])] = b.BaseOffset()
		rest = r
	}
	next := int64(-1)
	for i, rest := 0, data; len(rest) > 0; i++ {
		b, r, err := log.SplitBatch(rest)
		require.NoError(t, err)
		require.NoError(t, b.Validate(), "batch %d", i)
		require.Greater(t, b.BaseOffset(), next-1, "batch %d goes back in offsets", i)
		next = b.NextOffset()
		if i >= 3 { // the three the follower had, from the leader too
			base, ok := leaderBases[string(b[crcStart:])]
			require.True(t, ok, "batch %d at offset %d is not the leader's", i, b.BaseOffset())
			movedBase = movedBase || base != b.BaseOffset()
		}
		rest = r
	}
	return movedBase
}

// applyInPieces hands resp to a as streamFetchResponse does when the
// body arrives in pieces: each partition's records in leading whole
// batches of what arrived, at the arrival points cuts gives (byte
// offsets into the records, as 256ths of their length).
func applyInPieces(a *responseApplier, resp *FetchResponse, cuts []byte) {
	for i := range resp.Partitions {
		pr := resp.Partitions[i]
		recs := pr.Records
		pr.Records = nil
		a.beginPartition(i, &pr)
		var arrivals []int
		for _, c := range cuts {
			if len(recs) > 0 {
				arrivals = append(arrivals, int(c)*len(recs)/256)
			}
		}
		arrivals = append(arrivals, len(recs))
		pos := 0
		for _, avail := range arrivals {
			for pos < avail {
				k := wholeBatches(recs[pos:avail])
				if k == 0 && avail < len(recs) {
					break
				}
				if k == 0 {
					k = avail - pos
				}
				a.records(recs[pos : pos+k : pos+k])
				pos += k
			}
		}
		a.endPartition()
	}
}

// FuzzFollowerApplyPieces is FuzzFollowerApply with the records
// applied in pieces, as a large response over TCP is.
func FuzzFollowerApplyPieces(f *testing.F) {
	f.Add([]byte{}, []byte{128}, int8(0))
	f.Add([]byte{0, 3, 0x40}, []byte{64, 128, 200}, int8(0))
	f.Add([]byte{2, 0, 90}, []byte{10, 100}, int8(0))
	f.Add([]byte{3, 0, 200}, []byte{85, 170}, int8(0))
	f.Add([]byte{0, 20, 1}, []byte{1, 2, 3, 250}, int8(5))
	f.Fuzz(func(t *testing.T, ops []byte, cuts []byte, hwDelta int8) {
		if len(cuts) > 16 {
			cuts = cuts[:16]
		}
		leader, follower := newCaughtUpPair(t)
		kept, err := readAll(follower.log)
		require.NoError(t, err)
		leader.produce(t, 4, AcksLeader)
		req, resp := fetchFrom(t, follower, leader, ntime)
		pr := &resp.Partitions[0]
		sent := pr.Records
		pr.Records = damageRecords(sent, ops)
		pr.HighWatermark += int64(hwDelta)
		a := follower.node.newResponseApplier(0, req, func() time.Time { return ntime })
		applyInPieces(a, resp, cuts)
		_, _ = a.finish(true)

		l := follower.log
		data, err := readAll(l)
		require.NoError(t, err, "the follower's log does not read back")
		require.LessOrEqual(t, l.HighWatermark(), l.LogEndOffset())
		require.True(t, bytes.HasPrefix(data, kept), "the follower lost batches it had")
		if checkFromLeader(t, data, sent) {
			return
		}
		convergesFromLeader(t, leader, follower)
	})
}
