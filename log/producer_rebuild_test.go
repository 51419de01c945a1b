package log

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestProducerMarkerBelowLogStartSurvivesTruncateTo: a marker that bumped a
// producer's epoch keeps the producer (and its fenced epoch) live after
// DeleteRecordsBefore passes the marker; a TruncateTo above the log start
// rebuilt the state by replaying only from the log start (no snapshot
// exists in a log that never rolled), so the producer vanished and its
// fenced epoch could write again. The rebuild now replays from the first
// batch on disk.
func TestProducerMarkerBelowLogStartSurvivesTruncateTo(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000)) // 0..2
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))     // 3
	idemAppend(t, l, idemBatch(t, 1, 0, 0, 3, 1000)) // 4..6, another producer
	require.NoError(t, l.DeleteRecordsBefore(5))
	_, err := l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "live: epoch 0 is fenced after DeleteRecordsBefore")
	before := idemState(l)
	idemAppend(t, l, idemBatch(t, 1, 0, 3, 2, 1000)) // 7..8
	require.NoError(t, l.TruncateTo(7))
	require.Equal(t, before, idemState(l), "TruncateTo back to 7 must restore the state at 7")
	_, err = l.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "after TruncateTo: zombie of epoch 0 must stay fenced")
}

// TestProducerMarkerBelowLogStartSurvivesCrash: the same after a crash:
// recovery rebuilds the state the live log had (producer 9 fenced at
// epoch 1).
func TestProducerMarkerBelowLogStartSurvivesCrash(t *testing.T) {
	mem := idemMem()
	l := idemOpen(t, mem, Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 3, 1000)) // 0..2
	idemAppend(t, l, markerBatch(t, 9, 1, 1000))     // 3
	idemAppend(t, l, idemBatch(t, 1, 0, 0, 3, 1000)) // 4..6
	require.NoError(t, l.DeleteRecordsBefore(5))
	require.NoError(t, l.Sync())
	before := idemState(l)
	crashed := mem.CrashClone(vfs.CrashOptions{})
	l2, err := Open(idemDir, Options{FS: crashed, ProducerIDExpiration: neverExpire})
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, int64(7), l2.LogEndOffset())
	require.Equal(t, before, idemState(l2), "recovery must rebuild the state the log had")
	_, err = l2.Append(idemBatch(t, 9, 0, 3, 1, 1000))
	require.ErrorIs(t, err, ErrProducerFenced, "after a crash: zombie of epoch 0 must stay fenced")
}

// TestProducerLastTimestampBelowLogStartSurvivesTruncateTo: same root cause,
// second symptom. A producer's last timestamp is the largest of its
// batches' (producerEntry.add); live it keeps the one of a batch the
// log start has passed, but a rebuild (TruncateTo, or recovery after a
// crash) replayed from the log start only and forgot it, so the producer
// looked idle for longer and expired earlier than it would have.
func TestProducerLastTimestampBelowLogStartSurvivesTruncateTo(t *testing.T) {
	l := idemOpen(t, idemMem(), Options{})
	idemAppend(t, l, idemBatch(t, 9, 0, 0, 1, 5000)) // 0, newest timestamp
	idemAppend(t, l, idemBatch(t, 9, 0, 1, 1, 1000)) // 1, client clock went back
	idemAppend(t, l, idemBatch(t, 1, 0, 0, 3, 1000)) // 2..4
	require.NoError(t, l.DeleteRecordsBefore(1))
	before := idemState(l)
	require.Equal(t, int64(5000), before[9].LastTimestamp)
	idemAppend(t, l, idemBatch(t, 1, 0, 3, 1, 1000)) // 5
	require.NoError(t, l.TruncateTo(5))
	require.Equal(t, before, idemState(l), "TruncateTo back to 5 must restore the state at 5")
}
