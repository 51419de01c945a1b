package partitionstate

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestReplaceDropsNaNKey: Replace removes the old entries that seq did
// not place with delete(m.index, key), a no-op for a NaN key (NaN != NaN).
// The node was unlinked and recycled but its index entry stayed: Len
// counted an entry no iteration yields, and the index pointed at a node on
// the free list. The index is rebuilt when that happens.
func TestReplaceDropsNaNKey(t *testing.T) {
	m := New[float64, int](0)
	m.UpdateAndMoveToEnd(math.NaN(), 1)
	m.UpdateAndMoveToEnd(2, 2)
	m.Replace(func(yield func(float64, int) bool) { yield(2, 20) })

	n := 0
	for range m.All() {
		n++
	}
	assert.Equal(t, 1, n, "entries iterated after Replace")
	assert.Equal(t, n, m.Len(), "Len after Replace dropped the NaN key")
	requireInvariants(t, m)
}
