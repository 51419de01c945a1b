package log

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/replog/replog/compression"
	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// Tests of what appends accept: leader rules (record count, compressed
// bodies), offsets that overflow int64, and errors that must not be lost.

// withCountAndDelta returns a copy of batch with its record count and last
// offset delta rewritten and its CRC fixed.
func withCountAndDelta(batch []byte, count, delta int32) []byte {
	b := Batch(bytes.Clone(batch))
	binary.BigEndian.PutUint32(b[offRecordsCount:], uint32(count))
	binary.BigEndian.PutUint32(b[offLastOffsetDelta:], uint32(delta))
	binary.BigEndian.PutUint32(b[offCRC:], b.ComputeCRC())
	return b
}

// mangleCompressor compresses with a real codec after mangle has changed
// the uncompressed records body, to make compressed batches whose stream
// is fine but whose records are not; with junk set it writes bytes that
// are no stream at all.
type mangleCompressor struct {
	local  *compression.Local
	codec  compression.Codec
	mangle func([]byte) []byte
	junk   bool
}

func (c mangleCompressor) CodecID() int8 { return int8(c.codec) }

func (c mangleCompressor) Compress(dst, src []byte) ([]byte, error) {
	if c.junk {
		return append(dst, "this is not a compressed stream"...), nil
	}
	if c.mangle != nil {
		src = c.mangle(bytes.Clone(src))
	}
	return c.local.Compress(dst, src, c.codec, compression.DefaultLevel)
}

// compressedBatch builds a batch of n records compressed by comp.
func compressedBatch(t *testing.T, comp Compressor, n int) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence, Compressor: comp})
	for i := range n {
		bb.Add(int64(1000+i), []byte("key"), bytes.Repeat([]byte("value"), 20))
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

var codecs = []compression.Codec{compression.Gzip, compression.Snappy, compression.LZ4, compression.Zstd}

// requireUnchanged checks that a failed append left the log as it was.
func requireUnchanged(t *testing.T, l *Log, before Stats, name string) {
	t.Helper()
	after := l.Stats()
	require.Equal(t, before.LogEndOffset, after.LogEndOffset, "%s: log end offset", name)
	require.Equal(t, before.Bytes, after.Bytes, "%s: bytes", name)
}

// TestAppendAsLeaderRejectsCountMismatch: as Kafka's LogValidator, a
// leader takes only batches with records whose last offset delta is
// count-1, compressed or not. A follower takes what its leader wrote,
// including batches that compaction left with fewer records than
// offsets, or none.
// A leader refuses a batch with a producer id but no sequence or epoch:
// two different such batches would otherwise look like one retried.
func TestAppendAsLeaderRejectsProducerWithoutSequence(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem()})
	for _, o := range []BatchOptions{
		{Idempotent: true, ProducerID: 7, ProducerEpoch: 0, BaseSequence: NoSequence},
		{Idempotent: true, ProducerID: 7, ProducerEpoch: 0, BaseSequence: -5},
		{Idempotent: true, ProducerID: 7, ProducerEpoch: NoProducerEpoch, BaseSequence: 0},
	} {
		bb := NewBatchBuilder()
		bb.Reset(o)
		bb.Add(1000, nil, []byte("v"))
		b, err := bb.Build(nil)
		require.NoError(t, err)
		_, err = l.Append(b)
		require.ErrorIs(t, err, ErrInvalidRecord, "%+v", o)
		binary.BigEndian.PutUint64(b, uint64(l.LogEndOffset())) // the base offset, outside the CRC
		_, err = l.AppendAsFollower(b)                          // a follower keeps what its leader took
		require.NoError(t, err, "%+v", o)
	}
	require.Equal(t, int64(3), l.LogEndOffset())
}

// withMaxTimestamp returns a copy of b with its max timestamp set to ts
// and its CRC fixed.
func withMaxTimestamp(b []byte, ts int64) []byte {
	b = append([]byte(nil), b...)
	binary.BigEndian.PutUint64(b[offMaxTimestamp:], uint64(ts))
	binary.BigEndian.PutUint32(b[offCRC:], Batch(b).ComputeCRC())
	return b
}

// A leader refuses a create-time batch whose max timestamp is not its
// records' largest, compressed or not; a follower keeps it.
func TestAppendAsLeaderChecksMaxTimestamp(t *testing.T) {
	gz, err := CompressWith(compression.NewLocal(compression.Options{}), compression.Gzip, 0)
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"plain":      buildBatch(t, 3, 10, 1000), // timestamps 1000..1002
		"compressed": compressedBatch(t, gz, 3),  // timestamps 1000..1002
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, int64(1002), Batch(b).MaxTimestamp())
			l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem()})
			for _, ts := range []int64{5000, 1001, NoTimestamp} {
				_, err := l.Append(withMaxTimestamp(b, ts))
				require.ErrorIs(t, err, ErrInvalidRecord, "max timestamp %d", ts)
			}
			_, err := l.Append(append([]byte(nil), b...))
			require.NoError(t, err)
			f := withMaxTimestamp(b, 5000)
			binary.BigEndian.PutUint64(f, uint64(l.LogEndOffset()))
			_, err = l.AppendAsFollower(f)
			require.NoError(t, err)
		})
	}
}

// withLogAppendTime returns a copy of b with the LogAppendTime attribute
// and max timestamp ts, its CRC fixed.
func withLogAppendTime(b []byte, ts int64) []byte {
	b = withMaxTimestamp(b, ts)
	binary.BigEndian.PutUint16(b[offAttributes:], uint16(Batch(b).Attributes()|attrLogAppendTime))
	binary.BigEndian.PutUint32(b[offCRC:], Batch(b).ComputeCRC())
	return b
}

// TestAppendAsLeaderRefusesLogAppendTime: a producer's batch that claimed
// LogAppendTime skipped the max-timestamp check, so a max timestamp of
// MaxInt64 was kept as its segment's, and age retention deleted neither
// that segment nor any after it. A follower keeps such a batch: its
// leader wrote it.
func TestAppendAsLeaderRefusesLogAppendTime(t *testing.T) {
	gz, err := CompressWith(compression.NewLocal(compression.Options{}), compression.Gzip, 0)
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"plain":      buildBatch(t, 3, 10, 1000),
		"compressed": compressedBatch(t, gz, 3),
	} {
		t.Run(name, func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			appendN(t, l, 1, 0)
			before := l.Stats()
			for _, ts := range []int64{math.MaxInt64, 1002, NoTimestamp} {
				_, err := l.Append(withLogAppendTime(b, ts))
				require.ErrorIs(t, err, ErrInvalidRecord, "max timestamp %d", ts)
				requireUnchanged(t, l, before, name)
			}
			f := withLogAppendTime(b, 5000)
			Batch(f).setBaseOffset(l.LogEndOffset())
			_, err := l.AppendAsFollower(f)
			require.NoError(t, err)
		})
	}
}

// TestAppendZstdOfEmptyBlocksIsCorrupt: a 1.8 KB zstd body of empty
// compressed blocks, each counted as 128 KiB of possible output, made the
// leader allocate 64 MiB and report ErrBatchTooLarge ("message too
// large" to a Kafka client) for a corrupt stream.
func TestAppendZstdOfEmptyBlocksIsCorrupt(t *testing.T) {
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 10 << 3} // magic, 1 MiB window
	for range 600 {
		frame = append(frame, 2<<1, 0, 0) // an empty compressed block
	}
	frame = append(frame, 1<<3|1, 0, 0, 'x') // last: raw, one byte
	h := defaultRawHeader(1)
	h.attributes = int16(compression.Zstd)
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	appendN(t, l, 1, 0)
	before := l.Stats()
	_, err := l.Append(rawBatch(h, frame))
	require.ErrorIs(t, err, ErrCorrupt)
	require.NotErrorIs(t, err, ErrBatchTooLarge)
	requireUnchanged(t, l, before, "corrupt zstd")
}

func TestAppendAsLeaderRejectsCountMismatch(t *testing.T) {
	local := compression.NewLocal(compression.Options{})
	gz, err := CompressWith(local, compression.Gzip, 0)
	require.NoError(t, err)
	empty, err := NewBatchBuilder().Build(nil)
	require.NoError(t, err)
	plain := buildBatch(t, 3, 10, 0)
	comp := compressedBatch(t, gz, 3)
	tests := []struct {
		name  string
		batch []byte
		// span is the number of offsets the batch takes as a follower's.
		span int64
	}{
		{"no records", empty, 1},
		{"no records, delta 2^31-2", withCountAndDelta(empty, 0, math.MaxInt32-1), math.MaxInt32},
		{"compressed, no records", withCountAndDelta(comp, 0, 2), 3},
		{"compressed, delta above count-1", withCountAndDelta(comp, 3, 9), 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			appendN(t, l, 1, 0)
			before := l.Stats()
			_, err := l.Append(bytes.Clone(tt.batch))
			require.ErrorIs(t, err, ErrInvalidRecord)
			requireUnchanged(t, l, before, tt.name)
			// Nor as the second batch of an append.
			_, err = l.Append(concat(buildBatch(t, 1, 10, 0), tt.batch))
			require.ErrorIs(t, err, ErrInvalidRecord)
			requireUnchanged(t, l, before, tt.name)

			fb := bytes.Clone(tt.batch)
			Batch(fb).setBaseOffset(l.LogEndOffset())
			info, err := l.AppendAsFollower(fb)
			require.NoError(t, err, "a follower keeps what its leader wrote")
			require.Equal(t, before.LogEndOffset+tt.span, l.LogEndOffset())
			require.Equal(t, before.LogEndOffset+tt.span-1, info.LastOffset)
		})
	}
	// Well-formed batches still go through, compressed or not.
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	for _, b := range [][]byte{plain, comp} {
		_, err := l.Append(bytes.Clone(b))
		require.NoError(t, err)
	}
	require.Equal(t, int64(6), l.LogEndOffset())
}

// TestAppendAsLeaderValidatesCompressedRecords: the leader decompresses
// compressed batches and checks their records; a batch every consumer
// would fail on is refused with a typed error, and nothing is appended.
// A follower does not decompress (its leader did).
func TestAppendAsLeaderValidatesCompressedRecords(t *testing.T) {
	local := compression.NewLocal(compression.Options{})
	for _, codec := range codecs {
		mk := func(junk bool, mangle func([]byte) []byte) []byte {
			return compressedBatch(t, mangleCompressor{local: local, codec: codec, junk: junk, mangle: mangle}, 3)
		}
		tests := []struct {
			name    string
			batch   []byte
			want    error
			wantLib error // the compression sentinel, if it found the fault
		}{
			{"junk stream", mk(true, nil), ErrCorrupt, compression.ErrCorrupt},
			{"byte after the last record", mk(false, func(b []byte) []byte { return append(b, 0) }), ErrCorrupt, nil},
			{"records truncated", mk(false, func(b []byte) []byte { return b[:len(b)-3] }), ErrCorrupt, nil},
			{"second record's offset delta", mk(false, func(b []byte) []byte {
				// Record 1 follows record 0; its offset delta comes
				// after its length, attributes and timestamp delta (1),
				// these two one byte each.
				l, k, err := readVarint(b, 5)
				require.NoError(t, err)
				n := k + int(l)
				_, k, err = readVarint(b[n:], 5)
				require.NoError(t, err)
				require.Equal(t, byte(2), b[n+k+2], "record 1 has offset delta 1")
				b[n+k+2] = 4
				return b
			}), ErrCorrupt, nil},
			{"record count above the records", withCountAndDelta(mk(false, nil), 4, 3), ErrCorrupt, nil},
		}
		for _, tt := range tests {
			t.Run(codec.String()+"/"+tt.name, func(t *testing.T) {
				_, opts := memLog()
				l := openLog(t, "/log", opts)
				appendN(t, l, 1, 0)
				before := l.Stats()
				_, err := l.Append(bytes.Clone(tt.batch))
				require.ErrorIs(t, err, tt.want)
				if tt.wantLib != nil {
					require.ErrorIs(t, err, tt.wantLib)
				}
				requireUnchanged(t, l, before, tt.name)
				_, err = l.Append(concat(compressedBatch(t, mangleCompressor{local: local, codec: codec}, 2), tt.batch))
				require.ErrorIs(t, err, tt.want, "as the second batch")
				requireUnchanged(t, l, before, tt.name)

				fb := bytes.Clone(tt.batch)
				Batch(fb).setBaseOffset(l.LogEndOffset())
				_, err = l.AppendAsFollower(fb)
				require.NoError(t, err, "a follower does not decompress")
			})
		}
		t.Run(codec.String()+"/valid", func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			info, err := l.Append(mk(false, nil))
			require.NoError(t, err)
			require.Equal(t, int64(2), info.LastOffset)
		})
	}
}

// TestLeaderScratchSteadyStateDoesNotAllocate: checking a compressed batch
// with a warmed-up scratch allocates nothing. Under -race zstd is left
// out: its decoder tables come from a package-level sync.Pool in
// klauspost/compress, which the race detector drains at random (see
// compression's TestSteadyStateAllocs).
func TestLeaderScratchSteadyStateDoesNotAllocate(t *testing.T) {
	local := compression.NewLocal(compression.Options{})
	for _, codec := range codecs {
		if codec == compression.Zstd && raceEnabled() {
			continue
		}
		comp, err := CompressWith(local, codec, 0)
		require.NoError(t, err)
		b := Batch(compressedBatch(t, comp, 50))
		s := new(leaderScratch)
		_, err = s.checkCompressed(b)
		require.NoError(t, err)
		allocs := testing.AllocsPerRun(20, func() {
			if _, err := s.checkCompressed(b); err != nil {
				t.Fatal(err)
			}
		})
		require.Zero(t, allocs, "codec %s", codec)
	}
}

// TestAppendRejectsOffsetOverflow: a batch whose offsets run past
// MaxInt64 is refused (a follower's by Validate, a leader's when its
// offsets are assigned), and nothing changes. The last offset may be
// MaxInt64-1 at most, so that the log end offset stays positive.
func TestAppendRejectsOffsetOverflow(t *testing.T) {
	tests := []struct {
		name string
		base int64
		n    int
		want error // nil: accepted
	}{
		{"base MaxInt64-1, 5 records", math.MaxInt64 - 1, 5, ErrCorrupt},
		{"last offset MaxInt64", math.MaxInt64 - 4, 5, ErrCorrupt},
		{"base MaxInt64", math.MaxInt64, 1, ErrCorrupt},
		{"last offset MaxInt64-1", math.MaxInt64 - 5, 5, nil},
		{"negative base", -5, 2, ErrInvalidRecord},
		{"base MinInt64", math.MinInt64, 1, ErrInvalidRecord},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, opts := memLog()
			l := openLog(t, "/log", opts)
			appendN(t, l, 2, 0)
			before := l.Stats()
			b := followerBatch(t, tt.base, tt.n, 0)
			if tt.want == ErrCorrupt {
				require.ErrorIs(t, Batch(b).Validate(), ErrCorrupt)
			}
			info, err := l.AppendAsFollower(b)
			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				requireUnchanged(t, l, before, tt.name)
				return
			}
			require.NoError(t, err)
			require.Equal(t, int64(math.MaxInt64-1), info.LastOffset)
			require.Equal(t, int64(math.MaxInt64), l.LogEndOffset())
		})
	}

	// A leader appending after a follower's high offsets.
	_, opts := memLog()
	l := openLog(t, "/log", opts)
	_, err := l.AppendAsFollower(followerBatch(t, math.MaxInt64-10, 2, 0))
	require.NoError(t, err)
	before := l.Stats()
	_, err = l.Append(buildBatch(t, 9, 10, 0))
	require.ErrorIs(t, err, ErrInvalidRecord)
	requireUnchanged(t, l, before, "leader overflow")
	info, err := l.Append(buildBatch(t, 8, 10, 0))
	require.NoError(t, err, "the last offset MaxInt64-1 still fits")
	require.Equal(t, int64(math.MaxInt64-1), info.LastOffset)
}

// TestRollReplacingEmptySegmentReportsDeleteError: when a roll replaces
// an empty active segment and its files cannot be renamed away, the
// append fails and the log refuses writes until reopened, instead of the
// error being dropped.
func TestRollReplacingEmptySegmentReportsDeleteError(t *testing.T) {
	mem := vfs.NewMem()
	inj := vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpRename && strings.HasSuffix(op.Path, segmentName(0)+logSuffix) {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	})
	opts := testLogOptions(vfs.NewErrorFS(mem, inj))
	l := openLog(t, "/log", opts)
	// Offsets too far from the empty segment's base for its index make
	// the append replace it.
	_, err := l.AppendAsFollower(followerBatch(t, 1<<32, 2, 0))
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorIs(t, err, ErrSyncFailed)
	_, err = l.AppendAsFollower(followerBatch(t, 1<<32, 2, 0))
	require.ErrorIs(t, err, ErrSyncFailed, "the log refuses writes until reopened")
}

// TestSyncEveryAppendFailureAfterWrite pins down AppendAsLeader's
// documented exception: a failed SyncEveryAppend fsync runs after the
// write, so the batch is in the log and visible, the AppendInfo describes
// it, the error wraps ErrSyncFailed and the log refuses further appends.
func TestSyncEveryAppendFailureAfterWrite(t *testing.T) {
	var failing atomic.Bool
	inj := vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if failing.Load() && op.Kind&vfs.OpSyncs != 0 {
			return vfs.Fault{Err: syscall.EIO}
		}
		return vfs.Fault{}
	})
	opts := testLogOptions(vfs.NewErrorFS(vfs.NewMem(), inj))
	opts.SyncEveryAppend = true
	l := openLog(t, "/log", opts)
	appendN(t, l, 1, 0)
	failing.Store(true)
	info, err := l.Append(buildBatch(t, 2, 10, 0))
	require.ErrorIs(t, err, ErrSyncFailed)
	require.Equal(t, AppendInfo{FirstOffset: 3, LastOffset: 4, MaxTimestamp: 1, Batches: 1, Records: 2, Bytes: info.Bytes}, info)
	require.Equal(t, int64(5), l.LogEndOffset(), "the batch is in the log")
	require.Less(t, l.DurableOffset(), int64(5), "but not durable")
	_, err = l.Append(buildBatch(t, 1, 10, 0))
	require.ErrorIs(t, err, ErrSyncFailed)
}
