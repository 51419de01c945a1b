package partitionstate_test

import (
	"fmt"
	"testing"
)

// BenchmarkLookupFloor measures the floor under the naive/partitionstate
// ratio of BenchmarkMoveToEnd and BenchmarkUpdateAndMoveToEnd: it pairs the
// same naive baseline, on the same keys in the same order, with nothing but
// a lookup of each key in a partitionstate.Map (Contains, one access to the
// Go map every implementation found through a Go map makes), and reports
// naive/lookup. No implementation that also re-links a node can beat that
// ratio. At n=100000 the index is a few MiB of randomly accessed memory, so
// the lookup is memory-bound and costs a large share of naive's whole
// operation: where naive/lookup is near 2, a 2x goal for naive/partitionstate
// is out of reach for any map-indexed linked list.
func BenchmarkLookupFloor(b *testing.B) {
	const n = 100000
	keys, moves := benchKeys(n)
	naive := map[string]func() func(int){
		"MoveToEnd":          naiveMoves(b, keys, moves),
		"UpdateAndMoveToEnd": naiveUpdates(b, keys, moves),
	}
	lookup := func() func(int) {
		m := newPartitionState(keys)
		i := 0
		return func(count int) {
			for range count {
				if !m.Contains(moves[i]) {
					b.Fatal("key missing")
				}
				if i++; i == len(moves) {
					i = 0
				}
			}
		}
	}
	for _, op := range []string{"MoveToEnd", "UpdateAndMoveToEnd"} {
		b.Run(fmt.Sprintf("op=%s/n=%d/impl=lookup", op, n), func(b *testing.B) {
			run := lookup()
			b.ReportAllocs()
			b.ResetTimer()
			run(b.N)
			b.StopTimer()
			b.ReportMetric(interleavedRatio(naive[op](), lookup(), b.N), "naive/lookup")
		})
	}
}
