package partitionstate

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// requireInvariants checks the internal structure of m: the list and the
// index agree, links are consistent in both directions, stamps increase
// along the list, and recycled nodes hold no links and no contents. It
// runs after every operation of the model tests, so it checks with plain
// comparisons and reports through require only on failure.
func requireInvariants[K comparable, V comparable](t testing.TB, m *Map[K, V]) {
	t.Helper()
	var zeroK K
	var zeroV V
	count := 0
	var prev *node[K, V]
	for n := m.head; n != nil; n = n.next {
		count++
		if count > len(m.index) {
			require.FailNow(t, "list longer than index (cycle?)", "index has %d keys", len(m.index))
		}
		if n.prev != prev {
			require.FailNow(t, "broken prev link", "entry %d (%v)", count-1, n.key)
		}
		if got, ok := m.index[n.key]; !ok || got != n {
			require.FailNow(t, "index does not point to the listed node", "key %v, present %v", n.key, ok)
		}
		if prev != nil && n.stamp <= prev.stamp {
			require.FailNow(t, "stamps must increase along the list", "entry %d: %d after %d", count-1, n.stamp, prev.stamp)
		}
		if n.stamp > m.clock {
			require.FailNow(t, "stamp from the future", "entry %d: %d > clock %d", count-1, n.stamp, m.clock)
		}
		prev = n
	}
	require.Same(t, prev, m.tail, "tail")
	require.Equal(t, len(m.index), count, "index has keys that are not listed")
	for n := m.free; n != nil; n = n.next {
		if n.prev != nil || n.key != zeroK || n.value != zeroV || n.stamp != 0 {
			require.FailNow(t, "recycled node keeps links or contents", "%+v", *n)
		}
		if m.index[n.key] == n {
			require.FailNow(t, "recycled node still indexed")
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
