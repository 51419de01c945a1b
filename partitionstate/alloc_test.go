package partitionstate

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// partition is a Kafka-like key: a topic name and a partition number.
type partition struct {
	Topic     string
	Partition int32
}

// partitions returns n distinct keys spread over a few topics.
func partitions(n int) []partition {
	keys := make([]partition, n)
	for i := range keys {
		keys[i] = partition{Topic: fmt.Sprintf("topic-%d", i%7), Partition: int32(i / 7)}
	}
	return keys
}

// TestSteadyStateAllocatesNothing checks that once a map has reached its
// size, moving, updating, looking up, iterating and churning entries
// allocate nothing.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	const n = 1000
	keys := partitions(2 * n)
	tests := []struct {
		name string
		op   func(m *Map[partition, int64], i int)
		// heavy marks operations that touch every entry, warmed up with
		// fewer runs.
		heavy bool
	}{
		{"MoveToEnd", func(m *Map[partition, int64], i int) { m.MoveToEnd(keys[(i*7)%n]) }, false},
		{"UpdateAndMoveToEnd", func(m *Map[partition, int64], i int) { m.UpdateAndMoveToEnd(keys[(i*7)%n], int64(i)) }, false},
		{"Update", func(m *Map[partition, int64], i int) { m.Update(keys[(i*7)%n], int64(i)) }, false},
		{"Get", func(m *Map[partition, int64], i int) { m.Get(keys[(i*7)%n]) }, false},
		{"First", func(m *Map[partition, int64], i int) { m.First() }, false},
		{"Remove and insert the same key", func(m *Map[partition, int64], i int) {
			k := keys[(i*7)%n]
			m.Remove(k)
			m.UpdateAndMoveToEnd(k, int64(i))
		}, false},
		{"Remove oldest and insert another key", func(m *Map[partition, int64], i int) {
			k, _, _ := m.First()
			m.Remove(k)
			// Cycle through 2n keys, so inserted keys are often new to the
			// index.
			for j := 0; ; j++ {
				c := keys[(i+j)%len(keys)]
				if !m.Contains(c) {
					m.Update(c, int64(i))
					return
				}
			}
		}, false},
		{"All with moves inside", func(m *Map[partition, int64], i int) {
			for k, v := range m.All() {
				if v%3 == 0 {
					m.UpdateAndMoveToEnd(k, v+1)
				}
			}
		}, true},
		{"Keys and Values", func(m *Map[partition, int64], i int) {
			for range m.Keys() {
			}
			for range m.Values() {
				break
			}
		}, true},
		{"Clear and refill", func(m *Map[partition, int64], i int) {
			m.Clear()
			for _, k := range keys[i%n : i%n+n] {
				m.Update(k, 1)
			}
		}, true},
		{"Replace with the same keys", func(m *Map[partition, int64], i int) {
			m.Replace(m.All())
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New[partition, int64](n)
			for i, k := range keys[:n] {
				m.UpdateAndMoveToEnd(k, int64(i))
			}
			i := 0
			op := func() {
				tt.op(m, i)
				i++
			}
			// Warm up: the first iteration registers its cursor slot and
			// churn reaches its steady state.
			warmup, runs := 3*n, 100
			if tt.heavy {
				warmup, runs = 3, 10
			}
			for range warmup {
				op()
			}
			assert.Zero(t, testing.AllocsPerRun(runs, op))
			assert.Equal(t, n, m.Len())
			requireInvariants(t, m)
		})
	}
}
