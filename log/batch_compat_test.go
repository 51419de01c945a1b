package log

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/compression"
)

// TestFollowerAcceptsCompactedPlainBatch: Kafka's log cleaner
// (MemoryRecords.filterTo -> buildRetainedRecordsInto) rebuilds a v2
// batch that lost some records with the original base offset, each kept
// record at its original offset delta, and overrideLastOffset(original
// last offset): for an uncompressed batch too. Here records at deltas 0
// and 3 survive of a batch covering deltas 0..4: count 2, lastOffsetDelta
// 4. AppendAsFollower promises to take "what its leader wrote, including
// batches that compaction left with fewer records than offsets" and does
// so for the compressed form of exactly this batch, but refused the plain
// one as ErrCorrupt ("record 1 has offset delta 3"): a replica fed a
// compacted partition stalled on the first such batch. A leader still
// requires deltas 0..n-1.
func TestFollowerAcceptsCompactedPlainBatch(t *testing.T) {
	body := append(rawRecord(recordFields(0, 0, []byte("a"), []byte("1"))),
		rawRecord(recordFields(3, 3, []byte("b"), []byte("2")))...)
	h := defaultRawHeader(2)
	h.lastOffsetDelta = 4
	h.maxTimestamp = h.baseTimestamp + 3
	h.leaderEpoch = 0

	// Control: the same batch, gzip-compressed, is accepted.
	gz, err := compression.NewLocal(compression.Options{}).Compress(nil, body, compression.Gzip, 0)
	require.NoError(t, err)
	hc := h
	hc.attributes = int16(compression.Gzip)
	_, opts := memLog()
	lc := openLog(t, "/log", opts)
	_, err = lc.AppendAsFollower(rawBatch(hc, gz))
	require.NoError(t, err, "compressed compacted batch")
	require.Equal(t, int64(5), lc.LogEndOffset())

	_, opts = memLog()
	l := openLog(t, "/log", opts)
	info, err := l.AppendAsFollower(rawBatch(h, body))
	require.NoError(t, err, "uncompressed compacted batch, as Kafka's cleaner writes it")
	require.Equal(t, int64(4), info.LastOffset)
	require.Equal(t, int64(5), l.LogEndOffset())

	_, err = l.Append(rawBatch(h, body))
	require.ErrorIs(t, err, ErrInvalidRecord, "a leader takes only batches with deltas 0..n-1")
}

// TestNegativeProducerIDIsNoProducer: Kafka's
// RecordBatch.hasProducerId is NO_PRODUCER_ID < producerId, so any
// negative producer id means "no producer": no sequence checks, no
// de-duplication. replog treated only exactly -1 that way, so two
// different batches with producer id -2, epoch 0, sequence 0 were taken
// for a retry and the second silently dropped (Append returned Duplicate
// with the first batch's offsets), and a batch with producer id -2 and no
// epoch or sequence was refused, where Kafka appends both.
func TestNegativeProducerIDIsNoProducer(t *testing.T) {
	mk := func(pid int64, epoch int16, seq int32, v string) []byte {
		bb := NewBatchBuilder()
		bb.Reset(BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: epoch, BaseSequence: seq})
		bb.Add(1000, nil, []byte(v))
		b, err := bb.Build(nil)
		require.NoError(t, err)
		return b
	}
	t.Run("different batches are not retries", func(t *testing.T) {
		_, opts := memLog()
		l := openLog(t, "/log", opts)
		_, err := l.Append(mk(-2, 0, 0, "a"))
		require.NoError(t, err)
		info, err := l.Append(mk(-2, 0, 0, "b"))
		require.NoError(t, err)
		require.False(t, info.Duplicate, "record b was dropped as a retry of record a")
		require.Equal(t, int64(2), l.LogEndOffset())
	})
	t.Run("no epoch or sequence", func(t *testing.T) {
		_, opts := memLog()
		l := openLog(t, "/log", opts)
		_, err := l.Append(mk(-2, NoProducerEpoch, NoSequence, "a"))
		require.NoError(t, err)
	})
}

// TestLeaderMaxTimestampCheckedForAnyRecordDelta: validate and
// checkCompressed return the largest record timestamp delta, with
// math.MinInt64 meaning "no records". A record's timestamp delta is a
// varlong and may itself be math.MinInt64; a batch whose only record had
// that delta skipped checkLeaderMaxTimestamp, so the leader accepted any
// max timestamp (here 1<<50, far in the future, which pins the batch
// against time retention and attracts timestamp lookups), while the same
// batch with delta MinInt64+1 was refused as the rule intends.
func TestLeaderMaxTimestampCheckedForAnyRecordDelta(t *testing.T) {
	mk := func(delta int64) []byte {
		h := defaultRawHeader(1)
		h.baseTimestamp = 0
		h.maxTimestamp = 1 << 50 // records are all at ~MinInt64: Kafka's max is -1
		return rawBatch(h, rawRecord(recordFields(delta, 0, nil, []byte("v"))))
	}
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.Append(mk(math.MinInt64 + 1))
	require.ErrorIs(t, err, ErrInvalidRecord, "control: max timestamp not the records'")
	_, err = l.Append(mk(math.MinInt64))
	require.ErrorIs(t, err, ErrInvalidRecord, "max timestamp 1<<50 with one record at MinInt64 accepted")
}

// TestLeaderAcceptsExtremeTimestamps: a batch of the package's own
// BatchBuilder whose records' timestamp deltas wrap int64 (MinInt64 and
// 1000, say) was refused by a leader: it took the base timestamp plus the
// largest delta for the records' largest timestamp, which a wrapped delta
// makes wrong. It now takes the largest record timestamp, as Kafka does.
func TestLeaderAcceptsExtremeTimestamps(t *testing.T) {
	for _, tss := range [][]int64{{math.MinInt64, 1000}, {-5, math.MaxInt64}, {math.MaxInt64, math.MinInt64}} {
		_, opts := memLog()
		l := openLog(t, "/log", opts)
		b := timestampedBatch(t, tss...)
		var got []int64
		for it := Batch(b).Records(); it.Next(); {
			got = append(got, it.Record().Timestamp)
		}
		require.Equal(t, tss, got, "the records hold these timestamps")
		require.Equal(t, max(tss[0], tss[1], NoTimestamp), Batch(b).MaxTimestamp())
		_, err := l.Append(b)
		require.NoError(t, err, "records %v, max timestamp %d", tss, Batch(b).MaxTimestamp())
		require.NoError(t, l.Close())
	}
}
