package partitionstate

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// requireInvariants checks the internal structure of m: the list and the
// index agree, links are consistent in both directions, stamps increase
// along the list, and recycled nodes hold no links and no contents.
func requireInvariants[K comparable, V comparable](t testing.TB, m *Map[K, V]) {
	t.Helper()
	var zeroK K
	var zeroV V
	count := 0
	var prev *node[K, V]
	for n := m.head; n != nil; n = n.next {
		count++
		require.LessOrEqual(t, count, len(m.index), "list longer than index (cycle?)")
		require.Same(t, prev, n.prev, "prev link of entry %d", count-1)
		got, ok := m.index[n.key]
		require.True(t, ok, "listed key %v missing from index", n.key)
		require.Same(t, n, got, "index points elsewhere for %v", n.key)
		if prev != nil {
			require.Greater(t, n.stamp, prev.stamp, "stamps must increase along the list")
		}
		require.LessOrEqual(t, n.stamp, m.clock)
		prev = n
	}
	require.Same(t, prev, m.tail, "tail")
	require.Equal(t, len(m.index), count, "index has keys that are not listed")
	for n := m.free; n != nil; n = n.next {
		require.Nil(t, n.prev, "recycled node keeps a prev link")
		require.Equal(t, zeroK, n.key, "recycled node keeps its key")
		require.Equal(t, zeroV, n.value, "recycled node keeps its value")
		require.Zero(t, n.stamp)
		_, inIndex := m.index[n.key]
		if inIndex {
			require.NotSame(t, n, m.index[n.key], "recycled node still indexed")
		}
	}
}

// requireNoIteration checks that no iteration is registered as in progress.
func requireNoIteration[K comparable, V any](t testing.TB, m *Map[K, V]) {
	t.Helper()
	require.Empty(t, m.cursors, "an ended iteration left its cursor registered")
}

// freeCount returns the number of recycled nodes.
func freeCount[K comparable, V any](m *Map[K, V]) int {
	c := 0
	for n := m.free; n != nil; n = n.next {
		c++
	}
	return c
}
