package log

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// markerBatch builds a transaction marker (control batch) of pid at epoch.
func markerBatch(t *testing.T, pid int64, epoch int16, ts int64) []byte {
	t.Helper()
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: pid, ProducerEpoch: epoch, BaseSequence: NoSequence, Attributes: attrControl | attrTransactional})
	bb.Add(ts, []byte("k"), []byte("marker"))
	m, err := bb.Build(nil)
	require.NoError(t, err)
	return m
}

// TestProducerMarkerOnlyKeptOnCleanReopen: a marker that bumps a
// producer's epoch leaves the producer with no cached batch; it must
// stay, with its epoch, across a clean Close and Open, so that a zombie
// of the old epoch is still fenced.
func TestProducerMarkerOnlyKeptOnCleanReopen(t *testing.T) {
	fs := idemMem()
	l := idemOpen(t, fs, Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000))
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))
	before := idemState(l)
	_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "zombie of epoch 0 is fenced before Close")

	require.NoError(t, l.Close())
	l = idemOpen(t, fs, Options{})
	require.Equal(t, before, idemState(l), "producer state must survive a clean Close/Open")
	_, err = l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "zombie of epoch 0 must still be fenced after reopen")
}

// TestProducerMarkerOnlyKeptOnDeleteRecords: the same across a
// DeleteRecordsBefore that does not reach the marker.
func TestProducerMarkerOnlyKeptOnDeleteRecords(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	idemAppend(t, l, idemBatch(t, 1, 0, 0, 1, 1000)) // offset 0, another producer
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000)) // offsets 1..3
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))     // offset 4
	require.NoError(t, l.DeleteRecordsBefore(1))     // only producer 1's batch goes
	_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "zombie of epoch 0 must stay fenced: the marker is still in the log")
}

// TestProducerMarkerOnlySameAfterCrashAndCleanReopen: the state replayed
// from the segments after a crash and the one loaded from the Close
// snapshot are the same.
func TestProducerMarkerOnlySameAfterCrashAndCleanReopen(t *testing.T) {
	mem := idemMem()
	l := idemOpen(t, mem, Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000))
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))
	require.NoError(t, l.Sync())
	crashed := mem.CrashClone(vfs.CrashOptions{})
	require.NoError(t, l.Close())

	clean := idemOpen(t, mem, Options{})
	afterCrash, err := Open(idemDir, Options{FS: crashed, ProducerIDExpiration: neverExpire})
	require.NoError(t, err)
	defer afterCrash.Close()
	require.Equal(t, idemState(afterCrash), idemState(clean), "crash recovery and clean reopen disagree on producer 9")
}

// A control batch with no record (compaction removed its marker) raised
// the producer's epoch and emptied its retry cache: a follower copying
// one then fenced the producer's live epoch as leader and forgot its
// retries. Kafka's ProducerAppendInfo skips such a batch, and so does
// the log now.
func TestEmptyControlBatchChangesNoProducer(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	b := idemBatch(t, 9, 0, 0, 2, 1000)
	Batch(b).setBaseOffset(0)
	_, err := l.AppendAsFollower(append([]byte(nil), b...))
	require.NoError(t, err)
	bb := NewBatchBuilder()
	bb.Reset(BatchOptions{Idempotent: true, ProducerID: 9, ProducerEpoch: 1, BaseSequence: NoSequence, Attributes: attrControl | attrTransactional})
	empty, err := bb.Build(nil)
	require.NoError(t, err)
	Batch(empty).setBaseOffset(2)
	_, err = l.AppendAsFollower(empty)
	require.NoError(t, err)
	require.Equal(t, int16(0), idemState(l)[9].Epoch)
	info, err := l.Append(append([]byte(nil), b...))
	require.NoError(t, err)
	require.True(t, info.Duplicate, "a retry of the epoch-0 batch is still recognised")
}
