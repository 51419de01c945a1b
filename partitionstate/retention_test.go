package partitionstate

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// fetchState is a Kafka-like per-partition fetch state.
type fetchState struct {
	FetchOffset int64
	LeaderEpoch int32
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestRetention is the Go analogue of KAFKA-21316: moving two partitions
// alternately to the end retentionMoves times must not keep anything
// reachable beyond the two entries. Kafka's remove + put kept 2,000,002
// entries chained after as many moves.
func TestRetention(t *testing.T) {
	a := partition{Topic: "orders", Partition: 0}
	b := partition{Topic: "orders", Partition: 1}
	m := New[partition, fetchState](2)
	m.UpdateAndMoveToEnd(a, fetchState{})
	m.UpdateAndMoveToEnd(b, fetchState{})

	before := liveHeap(t)
	for i := range retentionMoves {
		k := a
		if i%2 == 1 {
			k = b
		}
		m.UpdateAndMoveToEnd(k, fetchState{FetchOffset: int64(i), LeaderEpoch: 1})
	}
	growth := liveHeap(t) - before

	require.Equal(t, 2, m.Len())
	first, state, _ := m.First()
	require.Equal(t, a, first)
	require.Equal(t, int64(retentionMoves-2), state.FetchOffset)
	require.Equal(t, 0, freeCount(m))
	t.Logf("%d moves, live heap grew by %d bytes", retentionMoves, growth)
	require.Less(t, growth, int64(1<<20), "live heap grew by %d bytes", growth)
	runtime.KeepAlive(m)
}
