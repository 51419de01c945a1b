package log

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// Tests of the idempotent-producer state (issue 3), after Kafka's
// UnifiedLogTest and ProducerStateManagerTest scenarios. Helpers are
// prefixed with idem so that they do not collide with other test files of
// the package.

// idemDir is where the tests put their logs on in-memory filesystems.
var idemDir = filepath.Join(string(filepath.Separator), "idem")

// idemMem returns an empty crash-simulating filesystem whose MkdirAll is
// durable (the tests care about the files inside the log directory).
func idemMem() *vfs.MemFS {
	return vfs.NewMemWithOptions(vfs.MemOptions{MkdirAllDurable: true})
}

// idemOpen opens the log in idemDir on fs and closes it when the test
// ends (Close is idempotent, so tests may close it earlier).
func idemOpen(t testing.TB, fs vfs.FS, opts Options) *Log {
	t.Helper()
	opts.FS = fs
	if opts.ProducerIDExpiration == 0 {
		opts.ProducerIDExpiration = neverExpire
	}
	l, err := Open(idemDir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// idemBatch builds a batch of n records of producer pid at epoch with
// sequences seq, seq+1, ... (wrapping past MaxInt32 to 0) and timestamps
// ts, ts+1, ...
func idemBatch(t testing.TB, pid int64, epoch int16, seq int32, n int, ts int64) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: epoch, BaseSequence: seq})
	for i := range n {
		bb.Add(ts+int64(i), []byte(fmt.Sprintf("p%d-e%d-s%d", pid, epoch, int64(seq)+int64(i))), []byte("idempotent value"))
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

// idemConcat concatenates batches into one append's worth of bytes.
func idemConcat(batches ...[]byte) []byte {
	var out []byte
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

// idemAppend appends a copy of b as the leader and requires success.
func idemAppend(t testing.TB, l *Log, b []byte) AppendInfo {
	t.Helper()
	info, err := l.Append(append([]byte(nil), b...))
	require.NoError(t, err)
	return info
}

// idemEntry is a producer's state without the unused cache slots, so that
// two states can be compared.
type idemEntry struct {
	Epoch         int16
	LastTimestamp int64
	Batches       []batchMeta
}

// idemState returns a copy of l's producer state.
func idemState(l *Log) map[int64]idemEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return idemEntries(l.producers.asMap())
}

func idemEntries(m map[int64]*producerEntry) map[int64]idemEntry {
	out := make(map[int64]idemEntry, len(m))
	for pid, e := range m {
		out[pid] = idemEntry{Epoch: e.epoch, LastTimestamp: e.lastTimestamp, Batches: slices.Clone(e.batches[:e.n])}
	}
	return out
}

// idemBatches returns copies of every batch of l, in offset order.
func idemBatches(t testing.TB, l *Log) []Batch {
	t.Helper()
	var out []Batch
	var buf []byte
	for off := l.LogStartOffset(); off < l.LogEndOffset(); {
		var err error
		buf, err = l.Read(buf[:0], off, ReadOptions{MaxBytes: 64 << 10})
		require.NoError(t, err)
		require.NotEmpty(t, buf, "no batch at offset %d below the log end %d", off, l.LogEndOffset())
		for rest := buf; len(rest) > 0; {
			b, r, err := SplitBatch(rest)
			require.NoError(t, err)
			require.NoError(t, b.Validate())
			out = append(out, append(Batch(nil), b...))
			off = b.NextOffset()
			rest = r
		}
	}
	return out
}

// idemSeqKey names one record of an idempotent producer.
type idemSeqKey struct {
	pid   int64
	epoch int16
	seq   int32
}

// idemRequireUnique fails if any (producer id, epoch, sequence) occurs in
// more than one record of the batches (S16), and returns, per key, the
// offset of the record holding it.
func idemRequireUnique(t testing.TB, batches []Batch) map[idemSeqKey]int64 {
	t.Helper()
	seen := map[idemSeqKey]int64{}
	for _, b := range batches {
		if b.ProducerID() == NoProducerID {
			continue
		}
		for d := int64(0); d <= int64(b.LastOffsetDelta()); d++ {
			k := idemSeqKey{b.ProducerID(), b.ProducerEpoch(), int32((int64(b.BaseSequence()) + d) % (1 << 31))}
			prev, dup := seen[k]
			require.False(t, dup, "producer %d epoch %d sequence %d stored twice: offsets %d and %d",
				k.pid, k.epoch, k.seq, prev, b.BaseOffset()+d)
			seen[k] = b.BaseOffset() + d
		}
	}
	return seen
}

// idemSnapshotFiles returns the offsets of the snapshot files in the log
// directory, sorted.
func idemSnapshotFiles(t testing.TB, fs vfs.FS) []int64 {
	t.Helper()
	names, err := fs.ReadDir(idemDir)
	require.NoError(t, err)
	var offs []int64
	for _, n := range names {
		if off, ok := parseSegmentName(n, snapshotSuffix); ok {
			offs = append(offs, off)
		}
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	return offs
}

// idemNilIfEmpty returns s, or nil if it is empty, for comparisons with
// lists that are nil when empty.
func idemNilIfEmpty(s []int64) []int64 {
	if len(s) == 0 {
		return nil
	}
	return s
}

// idemSegmentBases returns the base offsets of l's segments.
func idemSegmentBases(l *Log) []int64 {
	var out []int64
	for _, s := range l.segments() {
		out = append(out, s.base)
	}
	return out
}

// TestProducerDuplicateAppends is Kafka's testDuplicateAppends: a retry of
// any of a producer's last 5 batches is answered with the original offsets
// and Duplicate set, and writes nothing; a retry of an older batch is out
// of order.
func TestProducerDuplicateAppends(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	const pid = 7
	var batches [][]byte
	var infos []AppendInfo
	for i := range 7 {
		b := idemBatch(t, pid, 0, int32(i*3), 3, int64(1000+i))
		info := idemAppend(t, l, b)
		require.False(t, info.Duplicate)
		require.Equal(t, int64(i*3), info.FirstOffset)
		batches = append(batches, b)
		infos = append(infos, info)
	}
	leo, appended := l.LogEndOffset(), l.Stats().AppendedBytes

	tests := []struct {
		name    string
		batch   []byte
		orig    int // index of the original batch when a duplicate
		wantErr error
	}{
		{name: "newest", batch: batches[6], orig: 6},
		{name: "second newest", batch: batches[5], orig: 5},
		{name: "middle of the cache", batch: batches[4], orig: 4},
		{name: "oldest cached", batch: batches[2], orig: 2},
		{name: "one older than the cache", batch: batches[1], wantErr: ErrOutOfOrderSequence},
		{name: "first batch", batch: batches[0], wantErr: ErrOutOfOrderSequence},
		{name: "same first sequence, shorter range", batch: idemBatch(t, pid, 0, 15, 2, 1005), wantErr: ErrOutOfOrderSequence},
		{name: "same first sequence, longer range", batch: idemBatch(t, pid, 0, 18, 4, 1006), wantErr: ErrOutOfOrderSequence},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			info, err := l.Append(append([]byte(nil), tc.batch...))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
				require.True(t, info.Duplicate)
				assert.Equal(t, infos[tc.orig].FirstOffset, info.FirstOffset)
				assert.Equal(t, infos[tc.orig].LastOffset, info.LastOffset)
				assert.Equal(t, 1, info.Batches)
				assert.Zero(t, info.Bytes)
			}
			require.Equal(t, leo, l.LogEndOffset(), "nothing may be written")
			require.Equal(t, appended, l.Stats().AppendedBytes)
		})
	}
	got := idemBatches(t, l)
	require.Len(t, got, 7)
	idemRequireUnique(t, got)
	// The next sequence is still accepted after all the rejected retries.
	info := idemAppend(t, l, idemBatch(t, pid, 0, 21, 1, 1007))
	require.False(t, info.Duplicate)
	require.Equal(t, leo, info.FirstOffset)
}

// TestProducerMultipleProducersInSingleAppend is Kafka's
// testMultipleProducersWithDuplicatesInSingleAppend: every batch of one
// append is checked against its own producer's state. An append whose
// batches are all retries is a duplicate; one mixing retries with new
// batches is rejected as out of order (a client retries whole appends),
// and a rejected append changes no producer's state.
func TestProducerMultipleProducersInSingleAppend(t *testing.T) {
	// Setup, in one append: producers 1, 2, 3 at epoch 1, sequences 0-1.
	setup := func(t *testing.T) (*Log, [][]byte, AppendInfo) {
		t.Helper()
		l := idemOpen(t, idemMem(), Options{})
		first := [][]byte{idemBatch(t, 1, 1, 0, 2, 100), idemBatch(t, 2, 1, 0, 2, 100), idemBatch(t, 3, 1, 0, 2, 100)}
		info := idemAppend(t, l, idemConcat(first...))
		require.Equal(t, AppendInfo{FirstOffset: 0, LastOffset: 5, MaxTimestamp: 101, Batches: 3, Records: 6, Bytes: info.Bytes}, info)
		return l, first, info
	}
	plain := buildBatch(t, 2, 10, 100)

	tests := []struct {
		name    string
		batches func(first [][]byte) []byte
		wantErr error
		wantDup bool
		// wantLast is, per producer, the last sequence after the append.
		wantLast map[int64]int32
	}{
		{
			name: "new batch of every producer",
			batches: func([][]byte) []byte {
				return idemConcat(idemBatch(t, 1, 1, 2, 2, 200), idemBatch(t, 2, 1, 2, 1, 200), idemBatch(t, 3, 1, 2, 3, 200))
			},
			wantLast: map[int64]int32{1: 3, 2: 2, 3: 4},
		},
		{
			name:     "retry of the whole append",
			batches:  func(first [][]byte) []byte { return idemConcat(first...) },
			wantDup:  true,
			wantLast: map[int64]int32{1: 1, 2: 1, 3: 1},
		},
		{
			name:     "retry of two producers' batches",
			batches:  func(first [][]byte) []byte { return idemConcat(first[1], first[2]) },
			wantDup:  true,
			wantLast: map[int64]int32{1: 1, 2: 1, 3: 1},
		},
		{
			name:    "retry mixed with a new batch of the same producer",
			batches: func(first [][]byte) []byte { return idemConcat(first[0], idemBatch(t, 1, 1, 2, 1, 200)) },
			wantErr: ErrOutOfOrderSequence,
		},
		{
			name:    "retry mixed with a new batch of another producer",
			batches: func(first [][]byte) []byte { return idemConcat(idemBatch(t, 1, 1, 2, 1, 200), first[1]) },
			wantErr: ErrOutOfOrderSequence,
		},
		{
			name:    "retry mixed with a batch without producer",
			batches: func(first [][]byte) []byte { return idemConcat(first[0], plain) },
			wantErr: ErrOutOfOrderSequence,
		},
		{
			name: "one producer in order, another with a gap",
			batches: func([][]byte) []byte {
				return idemConcat(idemBatch(t, 1, 1, 2, 1, 200), idemBatch(t, 2, 1, 5, 1, 200))
			},
			wantErr: ErrOutOfOrderSequence,
		},
		{
			name: "one producer in order, another fenced",
			batches: func([][]byte) []byte {
				return idemConcat(idemBatch(t, 1, 1, 2, 1, 200), idemBatch(t, 3, 0, 2, 1, 200))
			},
			wantErr: ErrProducerFenced,
		},
		{
			name: "two consecutive batches of one producer",
			batches: func([][]byte) []byte {
				return idemConcat(idemBatch(t, 1, 1, 2, 2, 200), idemBatch(t, 1, 1, 4, 2, 201))
			},
			wantLast: map[int64]int32{1: 5, 2: 1, 3: 1},
		},
		{
			name: "two batches of one producer with a gap between them",
			batches: func([][]byte) []byte {
				return idemConcat(idemBatch(t, 1, 1, 2, 2, 200), idemBatch(t, 1, 1, 6, 2, 201))
			},
			wantErr: ErrOutOfOrderSequence,
		},
		{
			name: "the same new batch twice in one append",
			batches: func([][]byte) []byte {
				b := idemBatch(t, 1, 1, 2, 2, 200)
				return idemConcat(b, b)
			},
			wantErr: ErrOutOfOrderSequence,
		},
		{
			name: "new batches and a batch without producer",
			batches: func([][]byte) []byte {
				return idemConcat(idemBatch(t, 2, 1, 2, 1, 200), plain, idemBatch(t, 3, 2, 0, 1, 200))
			},
			wantLast: map[int64]int32{1: 1, 2: 2, 3: 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, first, firstInfo := setup(t)
			before := idemState(l)
			leo := l.LogEndOffset()
			in := tc.batches(first)
			info, err := l.Append(in)
			switch {
			case tc.wantErr != nil:
				require.ErrorIs(t, err, tc.wantErr)
				require.Equal(t, leo, l.LogEndOffset())
				require.Equal(t, before, idemState(l), "a rejected append must not change any producer's state")
				// Each producer still accepts its next sequence.
				for pid := int64(1); pid <= 3; pid++ {
					idemAppend(t, l, idemBatch(t, pid, 1, 2, 1, 300))
				}
			case tc.wantDup:
				require.NoError(t, err)
				require.True(t, info.Duplicate)
				require.Equal(t, leo, l.LogEndOffset())
				require.Equal(t, before, idemState(l))
				n := len(in) / len(first[0])
				require.Equal(t, n, info.Batches)
				require.Equal(t, firstInfo.LastOffset, info.LastOffset)
				require.Equal(t, firstInfo.LastOffset+1-int64(2*n), info.FirstOffset)
			default:
				require.NoError(t, err)
				require.False(t, info.Duplicate)
				require.Equal(t, leo, info.FirstOffset)
				require.Equal(t, l.LogEndOffset(), info.LastOffset+1)
				st := idemState(l)
				for pid, last := range tc.wantLast {
					bs := st[pid].Batches
					require.NotEmpty(t, bs, "producer %d", pid)
					require.Equal(t, last, bs[len(bs)-1].lastSeq, "producer %d", pid)
				}
			}
			idemRequireUnique(t, idemBatches(t, l))
		})
	}
}

// TestProducerSequenceAndEpochRules covers Kafka's testOldProducerEpoch,
// testProducerSequenceWrapAround and the rules for a new epoch and an
// unknown producer: setup batches are appended as the leader, then probe.
func TestProducerSequenceAndEpochRules(t *testing.T) {
	type pb struct {
		epoch int16
		seq   int32
		n     int
	}
	const maxSeq = math.MaxInt32
	tests := []struct {
		name    string
		setup   []pb
		probe   pb
		wantErr error
		wantDup bool
	}{
		{name: "unknown producer, sequence 0", probe: pb{0, 0, 1}},
		{name: "unknown producer, any first sequence", probe: pb{3, 42, 2}},
		{name: "unknown producer, MaxInt32", probe: pb{0, maxSeq, 1}},
		{name: "next sequence", setup: []pb{{0, 0, 3}}, probe: pb{0, 3, 2}},
		{name: "gap", setup: []pb{{0, 0, 3}}, probe: pb{0, 4, 1}, wantErr: ErrOutOfOrderSequence},
		{name: "overlap that is no exact retry", setup: []pb{{0, 0, 3}}, probe: pb{0, 1, 2}, wantErr: ErrOutOfOrderSequence},
		{name: "sequence going back", setup: []pb{{0, 10, 3}}, probe: pb{0, 5, 1}, wantErr: ErrOutOfOrderSequence},
		{name: "older epoch continuing the sequence", setup: []pb{{2, 0, 3}}, probe: pb{1, 3, 1}, wantErr: ErrProducerFenced},
		{name: "older epoch at sequence 0", setup: []pb{{2, 0, 3}}, probe: pb{1, 0, 1}, wantErr: ErrProducerFenced},
		{name: "retry from an older epoch", setup: []pb{{1, 0, 3}, {2, 0, 1}}, probe: pb{1, 0, 3}, wantErr: ErrProducerFenced},
		{name: "new epoch at sequence 0", setup: []pb{{1, 0, 3}}, probe: pb{2, 0, 1}},
		{name: "new epoch not at sequence 0", setup: []pb{{1, 0, 3}}, probe: pb{2, 3, 1}, wantErr: ErrOutOfOrderSequence},
		{name: "new epoch at sequence 0 after a wrap", setup: []pb{{1, maxSeq, 2}}, probe: pb{4, 0, 1}},
		{name: "wrap from MaxInt32 to 0", setup: []pb{{0, maxSeq - 1, 2}}, probe: pb{0, 0, 1}},
		{name: "wrap inside a batch", setup: []pb{{0, maxSeq - 1, 4}}, probe: pb{0, 2, 1}},
		{name: "after a wrap, 1 is a gap", setup: []pb{{0, maxSeq - 1, 2}}, probe: pb{0, 1, 1}, wantErr: ErrOutOfOrderSequence},
		{name: "MaxInt32 + 1 does not follow MaxInt32 - 1", setup: []pb{{0, maxSeq - 2, 2}}, probe: pb{0, 0, 1}, wantErr: ErrOutOfOrderSequence},
		{name: "retry of a wrapped batch", setup: []pb{{0, maxSeq - 1, 4}, {0, 2, 1}}, probe: pb{0, maxSeq - 1, 4}, wantDup: true},
		{name: "retry after an epoch bump is fenced", setup: []pb{{0, 0, 1}, {1, 0, 1}}, probe: pb{0, 0, 1}, wantErr: ErrProducerFenced},
		{name: "retry in the new epoch", setup: []pb{{0, 0, 1}, {1, 0, 1}}, probe: pb{1, 0, 1}, wantDup: true},
	}
	const pid = 99
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := idemOpen(t, idemMem(), Options{})
			for i, s := range tc.setup {
				info := idemAppend(t, l, idemBatch(t, pid, s.epoch, s.seq, s.n, int64(i)))
				require.False(t, info.Duplicate)
			}
			before, leo := idemState(l), l.LogEndOffset()
			probe := idemBatch(t, pid, tc.probe.epoch, tc.probe.seq, tc.probe.n, 50)
			info, err := l.Append(probe)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Equal(t, leo, l.LogEndOffset())
				require.Equal(t, before, idemState(l))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantDup, info.Duplicate)
			st := idemState(l)[pid]
			if tc.wantDup {
				require.Equal(t, leo, l.LogEndOffset())
				require.Equal(t, before[pid], st)
				return
			}
			require.Equal(t, tc.probe.epoch, st.Epoch)
			last := st.Batches[len(st.Batches)-1]
			require.Equal(t, batchMeta{
				firstSeq: tc.probe.seq, lastSeq: Batch(probe).LastSequence(), lastOffset: info.LastOffset,
				offsetDelta: int32(tc.probe.n - 1), timestamp: 50 + int64(tc.probe.n-1),
			}, last)
			if len(tc.setup) > 0 && tc.setup[len(tc.setup)-1].epoch != tc.probe.epoch {
				require.Len(t, st.Batches, 1, "an epoch change clears the cached batches")
			}
		})
	}
}

// TestProducerCacheKeepsLastFiveBatches checks the cache's length and
// order as batches are added, and that an epoch change empties it.
// A transaction marker that bumps a producer's epoch leaves the new epoch
// without batches: its first data batch must start at sequence 0, as in
// Kafka. The marker itself carries no sequence.
func TestProducerSequenceAfterAnEpochBumpingMarker(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000))
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: 9, ProducerEpoch: 1, BaseSequence: NoSequence, Attributes: attrControl | attrTransactional})
	bb.Add(1000, []byte("k"), []byte("marker"))
	marker, err := bb.Build(nil)
	require.NoError(t, err)
	idemAppend(t, l, marker)
	_, err = l.Append(idemBatch(t, 9, 1, 17, 1, 1000))
	require.ErrorIs(t, err, ErrOutOfOrderSequence)
	idemAppend(t, l, idemBatch(t, 9, 1, 0, 1, 1000))
	idemAppend(t, l, idemBatch(t, 9, 1, 1, 1, 1000))
}

func TestProducerCacheKeepsLastFiveBatches(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	for i := range 8 {
		info := idemAppend(t, l, idemBatch(t, 5, 0, int32(i), 1, int64(i)))
		bs := idemState(l)[5].Batches
		require.Len(t, bs, min(i+1, producerBatchesKept))
		require.Equal(t, info.LastOffset, bs[len(bs)-1].lastOffset)
		require.Equal(t, int32(max(0, i+1-producerBatchesKept)), bs[0].firstSeq)
	}
	idemAppend(t, l, idemBatch(t, 5, 1, 0, 1, 100))
	st := idemState(l)[5]
	require.Len(t, st.Batches, 1)
	require.Equal(t, int16(1), st.Epoch)
	require.Equal(t, int64(100), st.LastTimestamp)
}

// TestProducerFollowerAppends is Kafka's
// testAcceptAppendWithSequenceGapsOnReplica, extended to a failover:
// follower appends are never rejected for their sequences or epochs and
// never deduplicated (the follower copies its leader), but they update
// the state, so that once the replica leads it recognises retries.
func TestProducerFollowerAppends(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	const pid = 11
	type fb struct {
		epoch int16
		seq   int32
		n     int
		off   int64
	}
	steps := []fb{
		{epoch: 3, seq: 7, n: 2, off: 0},   // unknown producer
		{epoch: 3, seq: 20, n: 2, off: 2},  // sequence gap
		{epoch: 3, seq: 20, n: 2, off: 10}, // same range again, offset gap
		{epoch: 1, seq: 5, n: 1, off: 12},  // older epoch
		{epoch: 4, seq: 9, n: 3, off: 13},  // new epoch not at 0
		{epoch: 4, seq: 12, n: 2, off: 16},
	}
	var last AppendInfo
	for i, s := range steps {
		b := idemBatch(t, pid, s.epoch, s.seq, s.n, int64(100+i))
		Batch(b).setBaseOffset(s.off)
		info, err := l.AppendAsFollower(b)
		require.NoError(t, err, "step %d", i)
		require.False(t, info.Duplicate)
		require.Equal(t, s.off, info.FirstOffset)
		last = info
		st := idemState(l)[pid]
		require.Equal(t, s.epoch, st.Epoch, "step %d", i)
		require.Equal(t, s.seq, st.Batches[len(st.Batches)-1].firstSeq)
	}
	require.Len(t, idemBatches(t, l), len(steps), "a follower writes every batch")
	require.Equal(t, int64(18), l.LogEndOffset())
	st := idemState(l)[pid]
	require.Len(t, st.Batches, 2, "the epoch change to 4 cleared the older batches")

	// The replica now leads.
	leo := l.LogEndOffset()
	info, err := l.Append(idemBatch(t, pid, 4, 12, 2, 105))
	require.NoError(t, err)
	require.True(t, info.Duplicate)
	require.Equal(t, last.FirstOffset, info.FirstOffset)
	require.Equal(t, last.LastOffset, info.LastOffset)
	_, err = l.Append(idemBatch(t, pid, 4, 15, 1, 106))
	require.ErrorIs(t, err, ErrOutOfOrderSequence)
	_, err = l.Append(idemBatch(t, pid, 3, 22, 1, 106))
	require.ErrorIs(t, err, ErrProducerFenced)
	require.Equal(t, leo, l.LogEndOffset())
	info = idemAppend(t, l, idemBatch(t, pid, 4, 14, 1, 106))
	require.Equal(t, leo, info.FirstOffset)
}

// idemWorkload is a deterministic sequence of producer batches: several
// producers round-robin, each continuing its own sequence, with an epoch
// bump of one producer halfway.
type idemWorkload struct {
	batches [][]byte
	pids    []int64
}

func newIdemWorkload(t testing.TB, n, producers, records int) *idemWorkload {
	t.Helper()
	w := &idemWorkload{}
	seqs := map[int64]int32{}
	epochs := map[int64]int16{}
	for i := range n {
		pid := int64(1000 + i%producers)
		if i == n/2 && producers > 1 {
			pid = 1000 + 1
			epochs[pid]++
			seqs[pid] = 0
		}
		w.batches = append(w.batches, idemBatch(t, pid, epochs[pid], seqs[pid], records, int64(10_000+i)))
		w.pids = append(w.pids, pid)
		seqs[pid] += int32(records)
	}
	return w
}

// idemAppendAll appends the batches as the leader and returns the infos.
func idemAppendAll(t testing.TB, l *Log, batches [][]byte) []AppendInfo {
	t.Helper()
	infos := make([]AppendInfo, len(batches))
	for i, b := range batches {
		infos[i] = idemAppend(t, l, b)
		require.False(t, infos[i].Duplicate, "batch %d", i)
	}
	return infos
}

// idemSmallSegments are options under which a few idemBatch batches fill a
// segment, so workloads roll often.
var idemSmallSegments = Options{SegmentBytes: 1 << 10, IndexIntervalBytes: 256}

// TestProducerLoadFromDamagedSnapshot is Kafka's
// testLoadFromCorruptSnapshotFile and testLoadFromTruncatedSnapshotFile: a
// damaged snapshot is deleted at Open and the next older one used, with
// the segments after it replayed, so the state and deduplication are the
// same as before Close.
func TestProducerLoadFromDamagedSnapshot(t *testing.T) {
	base := idemMem()
	l := idemOpen(t, base, idemSmallSegments)
	w := newIdemWorkload(t, 40, 4, 2)
	infos := idemAppendAll(t, l, w.batches)
	require.NoError(t, l.bg.flushRolled())
	want := idemState(l)
	require.NoError(t, l.Close())
	snaps := idemSnapshotFiles(t, base)
	require.GreaterOrEqual(t, len(snaps), 4, "rolls and Close write snapshots")
	newest := snaps[len(snaps)-1]
	require.Equal(t, infos[len(infos)-1].LastOffset+1, newest, "Close writes a snapshot at the log end")

	type damage func(t *testing.T, data []byte) []byte
	flip := func(i int) damage {
		return func(t *testing.T, d []byte) []byte {
			require.Less(t, i, len(d))
			d[i] ^= 0x40
			return d
		}
	}
	cut := func(n int) damage { // n < 0: half the file
		return func(t *testing.T, d []byte) []byte {
			if n < 0 {
				return d[:len(d)/2]
			}
			return d[:n]
		}
	}
	tests := []struct {
		name    string
		damaged int // how many of the newest snapshots are damaged
		how     damage
	}{
		{name: "flipped body byte", damaged: 1, how: flip(snapshotHeaderSize + 5)},
		{name: "flipped crc", damaged: 1, how: flip(3)},
		{name: "flipped count", damaged: 1, how: flip(8)},
		{name: "unknown version", damaged: 1, how: flip(1)},
		{name: "truncated to half", damaged: 1, how: cut(-1)},
		{name: "truncated inside the header", damaged: 1, how: cut(snapshotHeaderSize - 1)},
		{name: "empty file", damaged: 1, how: cut(0)},
		{name: "trailing byte", damaged: 1, how: func(_ *testing.T, d []byte) []byte { return append(d, 0) }},
		{name: "two newest damaged", damaged: 2, how: flip(snapshotHeaderSize + 5)},
		{name: "every snapshot damaged", damaged: len(snaps), how: cut(-1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := base.CrashClone(vfs.CrashOptions{}) // everything was synced at Close
			for _, off := range snaps[len(snaps)-tc.damaged:] {
				p := filepath.Join(idemDir, segmentName(off)+snapshotSuffix)
				data, err := readWholeFile(fs, p)
				require.NoError(t, err)
				data = tc.how(t, data)
				_, err = DecodeSnapshot(data)
				require.ErrorIs(t, err, ErrCorrupt, "the damage must make the snapshot invalid")
				f, err := fs.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
				require.NoError(t, err)
				_, err = f.WriteAt(data, 0)
				require.NoError(t, err)
				require.NoError(t, f.Close())
			}
			l := idemOpen(t, fs, idemSmallSegments)
			require.Equal(t, want, idemState(l))
			kept := snaps[:len(snaps)-tc.damaged]
			require.Equal(t, idemNilIfEmpty(kept), idemSnapshotFiles(t, fs), "damaged snapshots are deleted, older ones kept")
			require.Equal(t, len(kept), l.Stats().Snapshots)
			idemRequireRetriesDeduplicated(t, l, w.batches, infos)
		})
	}
}

// idemRequireRetriesDeduplicated retries each producer's last 5 batches
// and requires each to be answered as a duplicate with its original
// offsets, writing nothing.
func idemRequireRetriesDeduplicated(t testing.TB, l *Log, batches [][]byte, infos []AppendInfo) {
	t.Helper()
	perPID := map[int64]int{}
	leo := l.LogEndOffset()
	for i := len(batches) - 1; i >= 0; i-- {
		b := Batch(batches[i])
		pid, epoch := b.ProducerID(), b.ProducerEpoch()
		if perPID[pid] == producerBatchesKept {
			continue
		}
		if later := slices.IndexFunc(batches[i+1:], func(x []byte) bool {
			return Batch(x).ProducerID() == pid && Batch(x).ProducerEpoch() != epoch
		}); later >= 0 {
			continue // an epoch bump dropped it
		}
		perPID[pid]++
		info, err := l.Append(append([]byte(nil), batches[i]...))
		require.NoError(t, err, "retry of batch %d", i)
		require.True(t, info.Duplicate, "retry of batch %d", i)
		require.Equal(t, infos[i].FirstOffset, info.FirstOffset, "retry of batch %d", i)
		require.Equal(t, infos[i].LastOffset, info.LastOffset, "retry of batch %d", i)
	}
	require.Equal(t, leo, l.LogEndOffset())
	require.NotEmpty(t, perPID)
}

// idemRequireNotStoredAgain checks the result of retrying a batch that is
// in the log: a duplicate, or rejected because it is older than the cached
// batches (out of order) or than its producer's epoch (fenced).
func idemRequireNotStoredAgain(t testing.TB, info AppendInfo, err error) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrProducerFenced) {
			require.ErrorIs(t, err, ErrOutOfOrderSequence)
		}
		return
	}
	require.True(t, info.Duplicate, "a retry was stored again at offset %d", info.FirstOffset)
}

// TestProducerTruncateTo is Kafka's testProducerIdMapTruncateTo and
// testTruncateAndReloadRemovesOutOfRangeSnapshots: after TruncateTo the
// producer state equals that of a log that only ever had the remaining
// batches, no snapshot lies past the new end, retries of remaining
// batches are duplicates, and retries of truncated ones are stored once.
func TestProducerTruncateTo(t *testing.T) {
	w := newIdemWorkload(t, 30, 3, 2)
	// Reference logs and where each batch starts.
	ref := idemOpen(t, idemMem(), idemSmallSegments)
	refInfos := idemAppendAll(t, ref, w.batches)
	require.NoError(t, ref.Close())

	tests := []struct {
		name string
		keep int   // batches kept
		at   int64 // offset added to the first removed batch's base offset
	}{
		{name: "everything", keep: 0},
		{name: "after the first batch", keep: 1},
		{name: "inside a batch", keep: 7, at: 1},
		{name: "before the epoch bump", keep: 15},
		{name: "after the epoch bump", keep: 16},
		{name: "near the end", keep: 27},
		{name: "last batch", keep: 29},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := idemMem()
			l := idemOpen(t, fs, idemSmallSegments)
			// Half before a Close, so a snapshot lies inside a segment too.
			infos := idemAppendAll(t, l, w.batches[:12])
			require.NoError(t, l.Close())
			l = idemOpen(t, fs, idemSmallSegments)
			infos = append(infos, idemAppendAll(t, l, w.batches[12:])...)
			require.NoError(t, l.bg.flushRolled())
			require.Equal(t, refInfos, infos)
			require.NotEmpty(t, l.snapshots.list())

			newLEO := infos[tc.keep].FirstOffset
			require.NoError(t, l.TruncateTo(newLEO+tc.at))
			require.Equal(t, newLEO, l.LogEndOffset())

			// A log that only ever had the kept batches.
			short := idemOpen(t, idemMem(), idemSmallSegments)
			idemAppendAll(t, short, w.batches[:tc.keep])
			want := idemState(short)
			require.Equal(t, want, idemState(l))

			for _, off := range l.snapshots.list() {
				require.LessOrEqual(t, off, newLEO)
			}
			require.Equal(t, l.snapshots.list(), idemSnapshotFiles(t, fs))

			if tc.keep > 0 {
				idemRequireRetriesDeduplicated(t, l, w.batches[:tc.keep], infos[:tc.keep])
			}
			// Retrying every batch again, in order: the kept ones are
			// duplicates or too old, the truncated ones are stored anew.
			for i, b := range w.batches {
				info, err := l.Append(append([]byte(nil), b...))
				if i >= tc.keep {
					require.NoError(t, err, "batch %d", i)
					require.False(t, info.Duplicate)
					require.Equal(t, infos[i].FirstOffset, info.FirstOffset, "batch %d", i)
					continue
				}
				idemRequireNotStoredAgain(t, info, err)
			}
			require.Equal(t, refInfos[len(refInfos)-1].LastOffset+1, l.LogEndOffset())
			idemRequireUnique(t, idemBatches(t, l))

			// And the rebuilt state survives Close/Open.
			st := idemState(l)
			require.NoError(t, l.Close())
			l = idemOpen(t, fs, idemSmallSegments)
			require.Equal(t, st, idemState(l))
		})
	}
}

// TestProducerTruncateFullyClearsState checks that
// TruncateFullyAndStartAt drops the producer state and every snapshot.
func TestProducerTruncateFullyClearsState(t *testing.T) {
	fs := idemMem()
	l := idemOpen(t, fs, idemSmallSegments)
	w := newIdemWorkload(t, 12, 3, 2)
	idemAppendAll(t, l, w.batches)
	require.NoError(t, l.bg.flushRolled())
	require.NotEmpty(t, idemSnapshotFiles(t, fs))
	require.NoError(t, l.TruncateFullyAndStartAt(500))
	require.Empty(t, idemState(l))
	require.Empty(t, l.snapshots.list())
	require.Empty(t, idemSnapshotFiles(t, fs))
	require.Zero(t, l.Stats().Producers)
	// Unknown again: any sequence is accepted.
	info := idemAppend(t, l, idemBatch(t, 1000, 0, 77, 1, 1))
	require.Equal(t, int64(500), info.FirstOffset)
	require.NoError(t, l.Close())
	l = idemOpen(t, fs, idemSmallSegments)
	require.Equal(t, map[int64]idemEntry{1000: {Epoch: 0, LastTimestamp: 1,
		Batches: []batchMeta{{firstSeq: 77, lastSeq: 77, lastOffset: 500, timestamp: 1}}}}, idemState(l))
}

// idemClock is an adjustable clock for Options.Now.
type idemClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *idemClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *idemClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestProducerExpiry is Kafka's testPidExpirationTimeout: producers whose
// newest batch timestamp is older than ProducerIDExpiration are dropped;
// their retries are then no longer recognised.
func TestProducerExpiry(t *testing.T) {
	clock := &idemClock{now: time.UnixMilli(10_000_000)}
	// The background check never runs during the test: it would race
	// with the direct calls.
	l := idemOpen(t, idemMem(), Options{ProducerIDExpiration: time.Hour, ProducerExpiryCheckInterval: 1000 * time.Hour, Now: clock.Now})
	nowMS := clock.Now().UnixMilli()
	hour := time.Hour.Milliseconds()
	old := idemBatch(t, 1, 0, 0, 1, nowMS-2*hour)
	idemAppend(t, l, old)
	idemAppend(t, l, idemBatch(t, 2, 0, 0, 1, nowMS-hour))   // exactly at the cutoff: kept
	idemAppend(t, l, idemBatch(t, 3, 0, 0, 1, nowMS-hour+1)) // newer
	// Producer 4's old batch is followed by a recent one.
	idemAppend(t, l, idemBatch(t, 4, 0, 0, 1, nowMS-3*hour))
	idemAppend(t, l, idemBatch(t, 4, 0, 1, 1, nowMS))

	steps := []struct {
		advance time.Duration
		removed int
		left    []int64
	}{
		{advance: 0, removed: 1, left: []int64{2, 3, 4}},
		{advance: 0, removed: 0, left: []int64{2, 3, 4}},
		{advance: time.Millisecond, removed: 1, left: []int64{3, 4}},
		{advance: time.Millisecond, removed: 1, left: []int64{4}},
		{advance: time.Hour - 2*time.Millisecond, removed: 0, left: []int64{4}},
		{advance: time.Millisecond, removed: 1, left: []int64{}},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		require.Equal(t, s.removed, l.expireProducers(), "step %d", i)
		st := idemState(l)
		left := make([]int64, 0, len(st))
		for pid := range st {
			left = append(left, pid)
		}
		slices.Sort(left)
		require.Equal(t, s.left, left, "step %d", i)
		require.Equal(t, len(s.left), l.Stats().Producers)
	}
	// Producer 1 is unknown now: its retry is not recognised and its
	// sequence is not checked.
	info, err := l.Append(old)
	require.NoError(t, err)
	require.False(t, info.Duplicate)
	_, err = l.Append(idemBatch(t, 2, 0, 9, 1, nowMS))
	require.NoError(t, err)
}

// TestProducerExpiredNotBroughtBackByReopen: a producer that expired
// while the log was closed (or before the background check ran) is not
// loaded again, from the Close snapshot nor from a replay after a crash;
// Kafka's loadFromSnapshot skips expired producers the same way.
func TestProducerExpiredNotBroughtBackByReopen(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) {
			clock := &idemClock{now: time.UnixMilli(10_000_000)}
			opts := Options{ProducerIDExpiration: time.Hour, ProducerExpiryCheckInterval: 1000 * time.Hour, Now: clock.Now}
			mem := idemMem()
			l := idemOpen(t, mem, opts)
			nowMS := clock.Now().UnixMilli()
			idemAppend(t, l, idemBatch(t, 1, 0, 0, 1, nowMS-30*time.Minute.Milliseconds()))
			idemAppend(t, l, idemBatch(t, 2, 0, 0, 1, nowMS))
			fs := vfs.FS(mem)
			if crash {
				require.NoError(t, l.Sync())
				fs = mem.CrashClone(vfs.CrashOptions{})
			}
			require.NoError(t, l.Close())
			clock.Advance(45 * time.Minute) // producer 1 is idle 75 minutes now
			l = idemOpen(t, fs, opts)
			require.Equal(t, []int64{2}, slices.Sorted(maps.Keys(idemState(l))))
			require.Equal(t, 1, l.Stats().Producers)
		})
	}
}

// TestProducerSnapshotOnRollAndDeletion is Kafka's
// testTakeSnapshotOnRollAndDeleteSnapshotOnRecoveryPointCheckpoint: each
// roll leads to a snapshot named by the new segment's base offset holding
// the state as of that offset, written by the background flush before the
// recovery point moves; snapshots are deleted with their segments by
// DeleteRecordsBefore and retention.
func TestProducerSnapshotOnRollAndDeletion(t *testing.T) {
	fs := idemMem()
	opts := idemSmallSegments
	opts.RetentionBytes = 4 << 10
	l := idemOpen(t, fs, opts)
	w := newIdemWorkload(t, 60, 4, 2)
	stateAt := map[int64]map[int64]idemEntry{} // state before each append, by its first offset
	for _, b := range w.batches {
		stateAt[l.LogEndOffset()] = idemState(l)
		idemAppend(t, l, b)
	}
	require.NoError(t, l.bg.flushRolled())
	bases := idemSegmentBases(l)
	require.GreaterOrEqual(t, len(bases), 6)
	require.Equal(t, bases[len(bases)-1], l.RecoveryPoint())
	st := l.Stats()
	require.Equal(t, int64(len(bases)-1), st.Rolls)
	require.Equal(t, bases[1:], idemSnapshotFiles(t, fs), "one snapshot per roll, named by the new segment")
	require.Equal(t, len(bases)-1, st.Snapshots)
	require.Equal(t, int64(len(bases)-1), st.SnapshotsWritten)
	require.Positive(t, st.SnapshotWriteTime)
	require.Equal(t, 4, st.Producers)
	for _, base := range bases[1:] {
		data, err := readWholeFile(fs, filepath.Join(idemDir, segmentName(base)+snapshotSuffix))
		require.NoError(t, err)
		got, err := decodeSnapshot(data)
		require.NoError(t, err)
		require.Equal(t, stateAt[base], idemEntries(got), "snapshot %d", base)
	}

	// DeleteRecordsBefore the third segment deletes the first two and the
	// second's snapshot.
	require.NoError(t, l.DeleteRecordsBefore(bases[2]))
	require.Equal(t, bases[2:], idemSegmentBases(l))
	require.Equal(t, bases[2:], idemSnapshotFiles(t, fs))
	// Inside a segment: nothing is deleted.
	require.NoError(t, l.DeleteRecordsBefore(bases[3]-1))
	require.Equal(t, bases[2:], idemSnapshotFiles(t, fs))
	// Retention deletes more, with their snapshots.
	n, err := l.ApplyRetention()
	require.NoError(t, err)
	require.Positive(t, n)
	left := idemSegmentBases(l)
	require.Equal(t, bases[len(bases)-len(left):], left)
	require.Equal(t, left, idemSnapshotFiles(t, fs))
	require.Equal(t, len(left), l.Stats().Snapshots)
}

// TestProducerCloseSnapshotDeletedWithItsSegment checks that the snapshot
// Close writes inside a segment (at the log end) goes when that segment is
// deleted, so restarts do not accumulate snapshot files.
func TestProducerCloseSnapshotDeletedWithItsSegment(t *testing.T) {
	fs := idemMem()
	l := idemOpen(t, fs, idemSmallSegments)
	w := newIdemWorkload(t, 40, 4, 2)
	var closedAt []int64
	for i := 0; i < len(w.batches); i += 5 {
		idemAppendAll(t, l, w.batches[i:i+5])
		closedAt = append(closedAt, l.LogEndOffset())
		require.NoError(t, l.Close())
		l = idemOpen(t, fs, idemSmallSegments)
	}
	require.NoError(t, l.bg.flushRolled())
	bases := idemSegmentBases(l)
	require.Subset(t, idemSnapshotFiles(t, fs), closedAt)
	keep := bases[len(bases)-2]
	require.NoError(t, l.DeleteRecordsBefore(keep))
	for _, off := range idemSnapshotFiles(t, fs) {
		require.GreaterOrEqual(t, off, keep, "snapshot %d of a deleted segment is left behind", off)
	}
	require.Equal(t, idemSnapshotFiles(t, fs), l.snapshots.list())
}

// idemBlockSnapshots returns a filesystem over mem on which the opening
// of a snapshot's temporary file blocks until release is closed.
func idemBlockSnapshots(mem vfs.FS, release <-chan struct{}) *vfs.ErrorFS {
	return vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, snapshotSuffix+tmpSuffix) {
			<-release
		}
		return vfs.Fault{}
	}))
}

// TestProducerSnapshotWrittenOffAppendPath checks that rolls do not wait
// for the snapshot file: with its write blocked, appends that roll still
// return, and the recovery point moves only once the snapshot is written.
func TestProducerSnapshotWrittenOffAppendPath(t *testing.T) {
	requireNoGoroutineLeak(t)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	l := idemOpen(t, idemBlockSnapshots(idemMem(), release), idemSmallSegments)
	t.Cleanup(unblock) // runs before the Close registered by idemOpen
	w := newIdemWorkload(t, 30, 3, 2)
	idemAppendAll(t, l, w.batches)
	require.GreaterOrEqual(t, l.Stats().Rolls, int64(4))
	require.Zero(t, l.RecoveryPoint(), "no snapshot written yet")
	require.Zero(t, l.Stats().SnapshotsWritten)
	unblock()
	require.NoError(t, l.bg.flushRolled())
	bases := idemSegmentBases(l)
	require.Equal(t, bases[len(bases)-1], l.RecoveryPoint())
	require.Equal(t, int64(len(bases)-1), l.Stats().SnapshotsWritten)
}

// TestProducerSnapshotFlushFailure is Kafka's
// testRecoveryPointNotIncrementedOnProducerStateSnapshotFlushFailure: when
// writing the snapshot fails at any step, the recovery point stays, the
// failure is sticky, and a reopen recovers the data and the state.
func TestProducerSnapshotFlushFailure(t *testing.T) {
	requireNoGoroutineLeak(t)
	for _, kind := range []vfs.OpKind{vfs.OpOpen, vfs.OpWrite, vfs.OpSync, vfs.OpClose, vfs.OpRename} {
		t.Run(kind.String(), func(t *testing.T) {
			mem := idemMem()
			efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				if op.Kind == kind && strings.HasSuffix(op.Path, snapshotSuffix+tmpSuffix) {
					return vfs.Fault{Err: errIdemEIO}
				}
				return vfs.Fault{}
			}))
			l := idemOpen(t, efs, idemSmallSegments)
			w := newIdemWorkload(t, 16, 2, 2)
			var infos []AppendInfo
			for _, b := range w.batches {
				info, err := l.Append(append([]byte(nil), b...))
				if err != nil {
					// The background flush of an earlier roll already
					// failed: the failure is sticky.
					require.ErrorIs(t, err, ErrSyncFailed)
					break
				}
				infos = append(infos, info)
			}
			require.GreaterOrEqual(t, l.Stats().Rolls, int64(1))
			err := l.bg.flushRolled()
			require.ErrorIs(t, err, ErrSyncFailed)
			require.ErrorIs(t, err, errIdemEIO)
			require.ErrorIs(t, err, vfs.ErrInjected)
			require.Zero(t, l.RecoveryPoint())
			require.True(t, l.Stats().Failed)
			require.Zero(t, l.Stats().SnapshotsWritten)
			require.Empty(t, idemSnapshotFiles(t, mem))
			// Sticky.
			require.ErrorIs(t, l.bg.flushRolled(), ErrSyncFailed)
			_, err = l.Append(idemBatch(t, 1, 0, 100, 1, 1))
			require.ErrorIs(t, err, ErrSyncFailed)
			require.ErrorIs(t, l.Sync(), ErrSyncFailed)
			require.Zero(t, l.RecoveryPoint())
			require.ErrorIs(t, l.Close(), ErrSyncFailed)

			// A reopen on the healthy disk recovers (nothing was synced,
			// so only what the page cache holds is checked: the same
			// process restarting).
			l = idemOpen(t, mem, idemSmallSegments)
			require.Equal(t, infos[len(infos)-1].LastOffset+1, l.LogEndOffset())
			idemRequireRetriesDeduplicated(t, l, w.batches[:len(infos)], infos)
		})
	}
}

// errIdemEIO is the injected cause of TestProducerSnapshotFlushFailure.
var errIdemEIO = fmt.Errorf("idem: injected EIO")

// TestProducerCleanReopen checks S16 across Close/Open: after a clean
// shutdown the state comes from the snapshot written by Close, without
// replaying segments, and retries are stored once. The sanity case (a
// crash instead of Close) shows that the read check does see replays.
func TestProducerCleanReopen(t *testing.T) {
	tests := []struct {
		name       string
		clean      bool
		wantReplay bool
	}{
		{name: "clean close", clean: true},
		{name: "crash after sync", clean: false, wantReplay: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := idemMem()
			l := idemOpen(t, mem, idemSmallSegments)
			w := newIdemWorkload(t, 30, 3, 2)
			infos := idemAppendAll(t, l, w.batches)
			require.NoError(t, l.Sync())
			want := idemState(l)
			fs := mem
			if tc.clean {
				require.NoError(t, l.Close())
			} else {
				fs = mem.CrashClone(vfs.CrashOptions{})
				require.NoError(t, l.Close())
			}
			var mu sync.Mutex
			var bodyReads []string
			rec := vfs.NewErrorFS(fs, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				if op.Kind == vfs.OpRead && strings.HasSuffix(op.Path, logSuffix) && op.Len > BatchHeaderSize {
					mu.Lock()
					bodyReads = append(bodyReads, fmt.Sprintf("%s@%d+%d", filepath.Base(op.Path), op.Off, op.Len))
					mu.Unlock()
				}
				return vfs.Fault{}
			}))
			l = idemOpen(t, rec, idemSmallSegments)
			mu.Lock()
			reads := slices.Clone(bodyReads)
			mu.Unlock()
			if tc.wantReplay {
				require.NotEmpty(t, reads)
			} else {
				require.Empty(t, reads, "Open after a clean Close read segment data")
			}
			require.Equal(t, want, idemState(l))
			idemRequireRetriesDeduplicated(t, l, w.batches, infos)
			// Retry every batch: none is stored twice.
			for _, b := range w.batches {
				info, err := l.Append(append([]byte(nil), b...))
				idemRequireNotStoredAgain(t, info, err)
			}
			got := idemBatches(t, l)
			require.Len(t, got, len(w.batches))
			idemRequireUnique(t, got)
		})
	}
}

// TestProducerRetryCacheFollowsTheLogStart: the retry cache only holds
// batches still in the log. Moving the log start past a producer's older
// batches drops them from its cache (Kafka drops only whole producers
// whose last batch is gone): a retry of one of them is no duplicate with
// offsets the log no longer holds, which on a follower may be records its
// leader never committed, but an out-of-order sequence; the batches still
// in the log are found, also after a reopen, whose snapshot predates the
// move.
func TestProducerRetryCacheFollowsTheLogStart(t *testing.T) {
	fs := idemMem()
	l := idemOpen(t, fs, Options{})
	var batches [][]byte
	for seq := range int32(4) {
		b := idemBatch(t, 7, 0, seq, 1, 1000+int64(seq))
		batches = append(batches, b)
		require.Equal(t, int64(seq), idemAppend(t, l, b).FirstOffset)
	}
	require.NoError(t, l.Close()) // a snapshot at 4 holds all four batches
	l = idemOpen(t, fs, Options{})
	require.NoError(t, l.DeleteRecordsBefore(2))
	check := func(l *Log) {
		t.Helper()
		require.Equal(t, []batchMeta{
			{firstSeq: 2, lastSeq: 2, lastOffset: 2, timestamp: 1002},
			{firstSeq: 3, lastSeq: 3, lastOffset: 3, timestamp: 1003},
		}, idemState(l)[7].Batches)
		info := idemAppend(t, l, batches[2])
		require.True(t, info.Duplicate)
		require.Equal(t, int64(2), info.FirstOffset)
		_, err := l.Append(append([]byte(nil), batches[1]...))
		require.ErrorIs(t, err, ErrOutOfOrderSequence)
		require.Equal(t, int64(4), l.LogEndOffset(), "nothing written")
	}
	check(l)
	require.NoError(t, l.Close())
	check(idemOpen(t, fs, Options{}))
}

// TestProducerRetryWaitsForTheOriginalsFsync: with SyncEveryAppend an
// Append returns once its batches are fsynced, and so does a retry
// answered as a duplicate while the original's fsync still runs; when
// that fsync fails, the retry fails too instead of acknowledging records
// that were never durable.
func TestProducerRetryWaitsForTheOriginalsFsync(t *testing.T) {
	var blockSync atomic.Bool
	entered := make(chan struct{})
	release := make(chan struct{})
	efs := vfs.NewErrorFS(idemMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, logSuffix) && blockSync.CompareAndSwap(true, false) {
			close(entered)
			<-release
			return vfs.Fault{Err: errIdemEIO}
		}
		return vfs.Fault{}
	}))
	l := idemOpen(t, efs, Options{SyncEveryAppend: true})
	idemAppend(t, l, idemBatch(t, 3, 0, 0, 1, 1000)) // offset 0, synced

	orig := idemBatch(t, 3, 0, 1, 2, 1000)
	blockSync.Store(true)
	origErr, retryErr := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := l.Append(append([]byte(nil), orig...))
		origErr <- err
	}()
	<-entered // the original is written, its fsync running
	go func() {
		info, err := l.Append(append([]byte(nil), orig...)) // the producer's retry
		if err == nil && !info.Duplicate {
			err = errors.New("the retry was written again")
		}
		retryErr <- err
	}()
	select {
	case err := <-retryErr:
		t.Fatalf("the retry returned (%v) while the original's fsync was running", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.ErrorIs(t, <-origErr, ErrSyncFailed)
	require.ErrorIs(t, <-retryErr, ErrSyncFailed, "the retry acknowledged records whose fsync failed")
}

// Close snapshots are kept: one may be the only exact record of the live
// state at its offset. Here producer 9 was dropped live when the log
// start passed its batch, and a marker then fenced its epoch again; a
// rebuild from the log alone drops it once more, after its replay. A
// version of Open that deleted Close snapshots but the newest let the
// zombie epoch write after a TruncateTo to the first Close's offset.
func TestCloseSnapshotKeepsAFenceForTruncateTo(t *testing.T) {
	fs := idemMem()
	l := idemOpen(t, fs, Options{})
	idemAppend(t, l, idemBatch(t, 9, 3, 0, 1, 1000)) // offset 0: producer 9, epoch 3
	idemAppend(t, l, idemBatch(t, 1, 0, 0, 1, 1000)) // offset 1: another producer
	require.NoError(t, l.DeleteRecordsBefore(1))     // producer 9 dropped live
	idemAppend(t, l, markerBatch(t, 9, 3, 1000))     // offset 2: its marker fences epoch 2 again
	_, err := l.Append(idemBatch(t, 9, 2, 0, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "live")
	require.NoError(t, l.Close()) // snapshot at 3

	l = idemOpen(t, fs, Options{})
	idemAppend(t, l, idemBatch(t, 1, 0, 1, 1, 1000)) // offset 3
	require.NoError(t, l.Close())                    // snapshot at 4

	l = idemOpen(t, fs, Options{})
	require.Equal(t, []int64{3, 4}, idemSnapshotFiles(t, fs))
	require.NoError(t, l.TruncateTo(3))
	_, err = l.Append(idemBatch(t, 9, 2, 0, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "after TruncateTo(3)")
	require.NoError(t, l.Close())
}
