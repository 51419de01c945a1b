package log

// Review probes (write path and durability). Each test prints what it
// observed with t.Logf and fails only on an unexpected setup error, so
// that the findings can be read from -v output.

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

func zzFixCRC(b []byte) {
	binary.BigEndian.PutUint32(b[offCRC:], Batch(b).ComputeCRC())
}

func zzBatch(t *testing.T, o BatchOptions, vals ...string) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	bb.Reset(o)
	for i, v := range vals {
		bb.Add(1000+int64(i), []byte("k"), []byte(v))
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

// 1. A producer-id batch without a sequence (-1): Kafka's leader rejects it
// (LogValidator: "Invalid sequence number -1 in record batch with
// producerId"); here a second, different batch is answered as a duplicate
// and silently dropped.
func TestZZProducerNoSequence(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem()})
	o := BatchOptions{ProducerID: 7, ProducerEpoch: 0, BaseSequence: NoSequence}
	i1, err1 := l.Append(zzBatch(t, o, "first"))
	i2, err2 := l.Append(zzBatch(t, o, "second, different data"))
	t.Logf("append 1: %+v err=%v", i1, err1)
	t.Logf("append 2: %+v err=%v", i2, err2)
	t.Logf("log end offset after both: %d", l.LogEndOffset())
	// Another negative sequence.
	o2 := BatchOptions{ProducerID: 8, ProducerEpoch: 0, BaseSequence: -5}
	i3, err3 := l.Append(zzBatch(t, o2, "a", "b", "c"))
	t.Logf("pid 8 seq -5: %+v err=%v", i3, err3)
}

// 2. A header max timestamp above every record's timestamp is accepted;
// OffsetForTimestamp then reports the healthy log as corrupt.
func TestZZMaxTimestampInflated(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem()})
	b := zzBatch(t, BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence}, "x", "y", "z")
	binary.BigEndian.PutUint64(b[offMaxTimestamp:], 5000)
	zzFixCRC(b)
	info, err := l.Append(b)
	t.Logf("append with maxTimestamp 5000, records at 1000..1002: %+v err=%v", info, err)
	off, ok, err := l.OffsetForTimestamp(2000)
	t.Logf("OffsetForTimestamp(2000) = %d %v err=%v", off, ok, err)
	// maxTimestamp below the records.
	b2 := zzBatch(t, BatchOptions{ProducerID: NoProducerID, ProducerEpoch: NoProducerEpoch, BaseSequence: NoSequence}, "x", "y", "z")
	binary.BigEndian.PutUint64(b2[offMaxTimestamp:], ^uint64(0))
	zzFixCRC(b2)
	info, err = l.Append(b2)
	t.Logf("append with maxTimestamp -1, records at 1000..1002: %+v err=%v", info, err)
}

// 3. SegmentJitter larger than SegmentAge: the effective age is <= 0 for
// most segments, so every append rolls.
func TestZZJitterAboveAge(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var tick atomic.Int64
	clock := func() time.Time { return now.Add(time.Duration(tick.Load()) * time.Millisecond) }
	l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem(), SegmentAge: time.Hour, SegmentJitter: 100 * time.Hour, Now: clock})
	for i := 0; i < 20; i++ {
		tick.Add(1)
		_, err := l.Append(buildBatch(t, 1, 10, 1000))
		require.NoError(t, err)
	}
	t.Logf("20 one-record appends 20 ms apart, SegmentAge 1h, SegmentJitter 100h: %d segments", len(l.segments()))
}

// 4. Negative producer expiry options are accepted.
func TestZZNegativeProducerExpiry(t *testing.T) {
	l, err := Open(t.TempDir(), Options{FS: vfs.NewMem(), ProducerIDExpiration: -time.Hour})
	t.Logf("Open with ProducerIDExpiration -1h: err=%v", err)
	if err == nil {
		b := idemBatch(t, 3, 0, 0, 2, time.Now().UnixMilli())
		_, err := l.Append(append([]byte(nil), b...))
		require.NoError(t, err)
		n := l.expireProducers()
		info, err := l.Append(append([]byte(nil), b...))
		t.Logf("fresh producer expired: %d; retry of its batch: dup=%v offsets [%d,%d] err=%v", n, info.Duplicate, info.FirstOffset, info.LastOffset, err)
		_ = l.Close()
	}
	l2, err := Open(t.TempDir(), Options{FS: vfs.NewMem(), ProducerExpiryCheckInterval: -time.Second})
	t.Logf("Open with ProducerExpiryCheckInterval -1s: err=%v", err)
	if err == nil {
		time.Sleep(200 * time.Millisecond)
		l2.bg.stepMu.Lock()
		next := l2.bg.nextExpiry
		l2.bg.stepMu.Unlock()
		t.Logf("nextExpiry is %v in the past: the flusher wakes every 1 ms", time.Since(next))
		_ = l2.Close()
	}
}

// 5. After a transaction marker bumps the epoch, Kafka requires the new
// epoch's first data batch to start at sequence 0; here any sequence is
// accepted.
func TestZZSequenceAfterMarker(t *testing.T) {
	l := openLog(t, t.TempDir(), Options{FS: vfs.NewMem()})
	_, err := l.Append(idemBatch(t, 9, 0, 0, 3, 1000))
	require.NoError(t, err)
	ctl := zzBatch(t, BatchOptions{ProducerID: 9, ProducerEpoch: 1, BaseSequence: NoSequence, Attributes: attrControl | attrTransactional}, "m")
	_, err = l.Append(ctl)
	t.Logf("marker at epoch 1: err=%v", err)
	info, err := l.Append(idemBatch(t, 9, 1, 17, 1, 1000))
	t.Logf("epoch 1 data batch at sequence 17 after the marker: %+v err=%v", info, err)
	info, err = l.Append(idemBatch(t, 10, 3, 0, 1, 1000))
	require.NoError(t, err)
	info, err = l.Append(idemBatch(t, 10, 3, 1, 1, 1000))
	require.NoError(t, err)
	// epoch -1 producer: sequence never checked
	_, err = l.Append(idemBatch(t, 11, -1, 0, 1, 1000))
	t.Logf("pid 11 epoch -1 seq 0: err=%v", err)
	_, err = l.Append(idemBatch(t, 11, -1, 500, 1, 1000))
	t.Logf("pid 11 epoch -1 seq 500 after 0: err=%v", err)
}

// crashAfter lets n operations (counted once armed) run, then fails every
// later one with ErrCrashed.
type zzCrashAfter struct {
	armed atomic.Bool
	n     int64
	count atomic.Int64
	hit   atomic.Bool
}

func (c *zzCrashAfter) Inject(op vfs.Op) vfs.Fault {
	if !c.armed.Load() {
		return vfs.Fault{}
	}
	if c.count.Add(1)-1 < c.n {
		return vfs.Fault{}
	}
	c.hit.Store(true)
	return vfs.Fault{Err: vfs.ErrCrashed}
}

// 6. A power loss inside TruncateTo, after the kept segment was cut and
// fsynced but before the directory fsync and the recovery point write:
// the later segments come back (their renames were not durable), the
// recovery point still lies in them, so recovery does not scan the cut
// segment, and the log has a hole.
func TestZZTruncateCrash(t *testing.T) {
	for k := int64(0); k < 60; k++ {
		mem := vfs.NewMem()
		inj := &zzCrashAfter{n: k}
		opts := testLogOptions(vfs.NewErrorFS(mem, inj))
		opts.CheckpointInterval = -1
		opts.FileDeleteDelay = time.Hour
		l, err := Open(crashDir, opts)
		require.NoError(t, err)
		for i := 0; i < 150; i++ {
			_, err := l.Append(buildBatch(t, 3, 60, int64(i)*10))
			require.NoError(t, err)
		}
		require.NoError(t, l.Sync())
		waitRecoveryPoint(t, l)
		segs := l.segments()
		target := segs[1].base + 5
		inj.armed.Store(true)
		terr := l.TruncateTo(target)
		_ = l.Close()
		if !inj.hit.Load() {
			t.Logf("k=%d: TruncateTo completed without reaching the crash (%v)", k, terr)
			break
		}
		img := mem.CrashClone(vfs.CrashOptions{})
		l2, err := Open(crashDir, testLogOptions(img))
		if err != nil {
			t.Logf("k=%d: reopen failed: %v", k, err)
			continue
		}
		st, err := tryReadState(l2)
		if err != nil {
			t.Logf("k=%d (truncate to %d, segments %v): after crash + reopen: [%d,%d) %v", k, target, segmentBases(l2), l2.LogStartOffset(), l2.LogEndOffset(), err)
		} else if k%10 == 0 {
			t.Logf("k=%d ok: [%d,%d) %d batches", k, st.start, st.end, len(st.batches))
		}
		_ = l2.Close()
	}
}

var _ = fmt.Sprint

// dirSyncFailOnce fails the first SyncDir of dir after it is armed, after
// a delay, so that a concurrent Sync waits behind it on dirSyncMu.
type zzDirSyncFailOnce struct {
	armed    atomic.Bool
	fired    atomic.Bool
	dir      string
	delay    time.Duration
	inFlight chan struct{}
}

func (f *zzDirSyncFailOnce) Inject(op vfs.Op) vfs.Fault {
	if !f.armed.Load() || op.Kind != vfs.OpSyncDir || op.Path != f.dir {
		return vfs.Fault{}
	}
	if !f.fired.CompareAndSwap(false, true) {
		return vfs.Fault{}
	}
	close(f.inFlight)
	time.Sleep(f.delay)
	return vfs.Fault{Err: fmt.Errorf("dir fsync: %w", errZZEIO)}
}

var errZZEIO = fmt.Errorf("EIO")

// 7. The flusher's directory fsync fails; a Sync waiting for it on
// dirSyncMu retries the directory fsync (after a failure), succeeds and
// acknowledges, although the log has failed.
func TestZZSyncAfterFailedDirSync(t *testing.T) {
	mem := vfs.NewMem()
	inj := &zzDirSyncFailOnce{dir: crashDir, delay: 200 * time.Millisecond, inFlight: make(chan struct{})}
	opts := testLogOptions(vfs.NewErrorFS(mem, inj))
	opts.CheckpointInterval = -1
	l, err := Open(crashDir, opts)
	require.NoError(t, err)
	defer l.Close()
	segs := len(l.segments())
	inj.armed.Store(true)
	for len(l.segments()) == segs {
		_, err := l.Append(buildBatch(t, 3, 60, 1000))
		require.NoError(t, err)
	}
	// one more append into the new segment
	_, err = l.Append(buildBatch(t, 3, 60, 1000))
	require.NoError(t, err)
	select {
	case <-inj.inFlight:
	case <-time.After(5 * time.Second):
		t.Fatalf("the flusher never fsynced the directory")
	}
	time.Sleep(20 * time.Millisecond)
	serr := l.Sync()
	t.Logf("Sync that waited behind the failed directory fsync: err=%v; log failed: %v", serr, l.Stats().Failed)
	t.Logf("a later Sync: %v", l.Sync())
}
