package log

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProducerStateMatchesMap applies random puts, expiries and head
// truncations to a producerState and to a plain map: the index must
// always find every entry, and nothing else.
func TestProducerStateMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ps := newProducerState()
	model := map[int64]producerEntry{}
	for step := range 20_000 {
		switch op := rng.IntN(10); {
		case op < 7:
			pid := rng.Int64N(200)
			e := producerEntry{epoch: int16(step), lastTimestamp: int64(step), n: 1}
			e.batches[0] = batchMeta{lastOffset: int64(step)}
			ps.put(pid, e)
			model[pid] = e
		case op < 9:
			cutoff := int64(step - rng.IntN(500))
			ps.expire(cutoff)
			for pid, e := range model {
				if e.lastTimestamp < cutoff {
					delete(model, pid)
				}
			}
		default:
			start := int64(step - rng.IntN(500))
			ps.truncateHead(start)
			for pid, e := range model {
				if e.batches[0].lastOffset < start {
					delete(model, pid)
				}
			}
		}
		require.Equal(t, len(model), ps.count())
		require.Len(t, ps.index, len(model))
		for pid, want := range model {
			got := ps.get(pid)
			require.NotNil(t, got, "step %d: producer %d lost", step, pid)
			require.Equal(t, want, *got)
		}
	}
}
