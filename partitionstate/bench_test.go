package partitionstate_test

import (
	"container/list"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/replog/replog/partitionstate"
)

// fetchState is a Kafka-like per-partition fetch state.
type fetchState struct {
	FetchOffset int64
	LeaderEpoch int32
}

// naiveMap is the baseline: a Go map of keys to elements of a
// container/list, moving an entry by Remove + PushBack of a new element, as
// Kafka's remove + put on a LinkedHashMap did.
type naiveMap struct {
	index map[TopicPartition]*list.Element
	order *list.List
}

// naiveEntry is what a naiveMap's list elements hold.
type naiveEntry struct {
	key   TopicPartition
	state fetchState
}

func newNaiveMap(keys []TopicPartition) *naiveMap {
	m := &naiveMap{index: make(map[TopicPartition]*list.Element, len(keys)), order: list.New()}
	for _, k := range keys {
		m.updateAndMoveToEnd(k, fetchState{})
	}
	return m
}

func (m *naiveMap) moveToEnd(k TopicPartition) bool {
	e, ok := m.index[k]
	if !ok {
		return false
	}
	m.index[k] = m.order.PushBack(m.order.Remove(e))
	return true
}

func (m *naiveMap) updateAndMoveToEnd(k TopicPartition, s fetchState) {
	if e, ok := m.index[k]; ok {
		m.order.Remove(e)
	}
	m.index[k] = m.order.PushBack(naiveEntry{key: k, state: s})
}

func newPartitionState(keys []TopicPartition) *partitionstate.Map[TopicPartition, fetchState] {
	m := partitionstate.New[TopicPartition, fetchState](len(keys))
	for _, k := range keys {
		m.UpdateAndMoveToEnd(k, fetchState{})
	}
	return m
}

// benchSizes are the numbers of entries the benchmarks run with.
var benchSizes = []int{10, 1000, 100000}

// benchKeys returns n partitions spread over topics of 16 partitions each
// (the partitions of a topic share its name's bytes, as keys decoded from
// one metadata response would), and the order in which a benchmark moves
// them: a fixed pseudo-random permutation, gone through round after round.
// The first round moves entries from all over the list; it leaves the list
// in that order, so the later rounds move the current first entry each
// time, as a fetcher that walks its partitions and moves each one that
// returned data does.
func benchKeys(n int) (keys, moves []TopicPartition) {
	keys = make([]TopicPartition, n)
	topic := ""
	for i := range keys {
		if i%16 == 0 {
			topic = fmt.Sprintf("topic-%04d", i/16)
		}
		keys[i] = TopicPartition{Topic: topic, Partition: int32(i % 16)}
	}
	moves = append([]TopicPartition(nil), keys...)
	rng := rand.New(rand.NewPCG(uint64(n), 4))
	rng.Shuffle(len(moves), func(i, j int) { moves[i], moves[j] = moves[j], moves[i] })
	return keys, moves
}

// pair is what a benchmark compares: for each implementation, a setup that
// builds a map and returns a function performing count operations on it.
type pair struct {
	naive, partitionstate func() (run func(count int))
}

// runPair runs impl=naive and impl=partitionstate under b. The latter also
// reports naive/partitionstate, the ratio of the naive time per operation
// to its own. That ratio is measured after the timed loop, on fresh maps,
// in alternating rounds of b.N operations in all per side, so that a change
// in the machine's load hits both sides alike and the naive side's garbage
// collection is counted.
func runPair(b *testing.B, p pair) {
	b.Run("impl=naive", func(b *testing.B) {
		run := p.naive()
		b.ReportAllocs()
		b.ResetTimer()
		run(b.N)
	})
	b.Run("impl=partitionstate", func(b *testing.B) {
		run := p.partitionstate()
		b.ReportAllocs()
		b.ResetTimer()
		run(b.N)
		b.StopTimer()
		b.ReportMetric(interleavedRatio(p.naive(), p.partitionstate(), b.N), "naive/partitionstate")
	})
}

// interleavedRatio runs total operations of base and of subject in
// alternating rounds and returns base's total time over subject's.
func interleavedRatio(base, subject func(count int), total int) float64 {
	const rounds = 10
	block := max(total/rounds, 1)
	timeBlock := func(run func(int)) time.Duration {
		start := time.Now()
		run(block)
		return time.Since(start)
	}
	var tb, ts time.Duration
	for r := range rounds {
		if r%2 == 0 {
			tb += timeBlock(base)
			ts += timeBlock(subject)
		} else {
			ts += timeBlock(subject)
			tb += timeBlock(base)
		}
	}
	return float64(tb) / float64(max(ts, 1))
}

// BenchmarkMoveToEnd moves existing entries to the end, keeping their
// values.
func BenchmarkMoveToEnd(b *testing.B) {
	for _, n := range benchSizes {
		keys, moves := benchKeys(n)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			runPair(b, pair{
				naive: naiveMoves(b, keys, moves),
				partitionstate: func() func(int) {
					m := newPartitionState(keys)
					i := 0
					return func(count int) {
						for range count {
							if !m.MoveToEnd(moves[i]) {
								b.Fatal("key missing")
							}
							if i++; i == len(moves) {
								i = 0
							}
						}
					}
				},
			})
		})
	}
}

// naiveMoves makes runners that move the keys of moves in turn to the end
// of a naive map of keys (the baseline of BenchmarkMoveToEnd).
func naiveMoves(b *testing.B, keys, moves []TopicPartition) func() func(int) {
	return func() func(int) {
		m := newNaiveMap(keys)
		i := 0
		return func(count int) {
			for range count {
				if !m.moveToEnd(moves[i]) {
					b.Fatal("key missing")
				}
				if i++; i == len(moves) {
					i = 0
				}
			}
		}
	}
}

// naiveUpdates makes runners that give the keys of moves in turn a new
// value and move them to the end of a naive map of keys (the baseline of
// BenchmarkUpdateAndMoveToEnd).
func naiveUpdates(b *testing.B, keys, moves []TopicPartition) func() func(int) {
	return func() func(int) {
		m := newNaiveMap(keys)
		i, offset := 0, int64(0)
		return func(count int) {
			for range count {
				offset++
				m.updateAndMoveToEnd(moves[i], fetchState{FetchOffset: offset, LeaderEpoch: 1})
				if i++; i == len(moves) {
					i = 0
				}
			}
			if m.order.Len() != len(keys) {
				b.Fatalf("naive map has %d entries, want %d", m.order.Len(), len(keys))
			}
		}
	}
}

// BenchmarkUpdateAndMoveToEnd gives existing entries a new value and moves
// them to the end, as a fetcher does for a partition that returned data.
func BenchmarkUpdateAndMoveToEnd(b *testing.B) {
	for _, n := range benchSizes {
		keys, moves := benchKeys(n)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			runPair(b, pair{
				naive: naiveUpdates(b, keys, moves),
				partitionstate: func() func(int) {
					m := newPartitionState(keys)
					i, offset := 0, int64(0)
					return func(count int) {
						for range count {
							offset++
							m.UpdateAndMoveToEnd(moves[i], fetchState{FetchOffset: offset, LeaderEpoch: 1})
							if i++; i == len(moves) {
								i = 0
							}
						}
						if m.Len() != n {
							b.Fatalf("map has %d entries, want %d", m.Len(), n)
						}
					}
				},
			})
		})
	}
}
