package partitionstate

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The model-based tests drive a Map and a reference model with the same
// operations, decoded from bytes, and compare them after every operation.
// The reference keeps its entries in a slice in order and implements the
// documented iteration semantics directly: an iteration that started at
// time T yields, at each step, the first entry in the current order that
// was last placed at or before T and that it has not yielded yet.

// refEntry is one entry of the reference model.
type refEntry struct {
	key    partition
	value  int
	placed uint64 // time of the last insertion or move to the end
}

// refMap is the reference: a slice in order, and a clock that ticks on
// every placement at the end.
type refMap struct {
	entries []refEntry
	clock   uint64
}

func (r *refMap) find(k partition) int {
	for i, e := range r.entries {
		if e.key == k {
			return i
		}
	}
	return -1
}

func (r *refMap) placeAtEnd(k partition, v int) {
	if i := r.find(k); i >= 0 {
		r.entries = append(r.entries[:i], r.entries[i+1:]...)
	}
	r.clock++
	r.entries = append(r.entries, refEntry{key: k, value: v, placed: r.clock})
}

func (r *refMap) moveToEnd(k partition) bool {
	i := r.find(k)
	if i < 0 {
		return false
	}
	r.placeAtEnd(k, r.entries[i].value)
	return true
}

func (r *refMap) update(k partition, v int) {
	if i := r.find(k); i >= 0 {
		r.entries[i].value = v
		return
	}
	r.placeAtEnd(k, v)
}

func (r *refMap) remove(k partition) bool {
	i := r.find(k)
	if i < 0 {
		return false
	}
	r.entries = append(r.entries[:i], r.entries[i+1:]...)
	return true
}

// replace sets the content to pairs, a key taking the value and position
// of its last occurrence; every resulting entry counts as placed now.
func (r *refMap) replace(pairs []refEntry) {
	r.entries = r.entries[:0]
	for _, p := range pairs {
		r.remove(p.key)
		r.entries = append(r.entries, refEntry{key: p.key, value: p.value})
	}
	for i := range r.entries {
		r.clock++
		r.entries[i].placed = r.clock
	}
}

// refIteration is an iteration of the reference in progress.
type refIteration struct {
	r       *refMap
	start   uint64
	yielded map[partition]bool
}

func (r *refMap) iterate() *refIteration {
	return &refIteration{r: r, start: r.clock, yielded: map[partition]bool{}}
}

func (it *refIteration) next() (refEntry, bool) {
	for _, e := range it.r.entries {
		if e.placed <= it.start && !it.yielded[e.key] {
			it.yielded[e.key] = true
			return e, true
		}
	}
	return refEntry{}, false
}

// opReader hands out the bytes that drive a model run.
type opReader struct {
	data []byte
	pos  int
}

func (r *opReader) next() (byte, bool) {
	if r.pos >= len(r.data) {
		return 0, false
	}
	b := r.data[r.pos]
	r.pos++
	return b, true
}

// byteOr returns the next byte, or 0 when the input is used up.
func (r *opReader) byteOr() byte {
	b, _ := r.next()
	return b
}

// modelKeys are the 12 keys a run uses, so that operations often hit
// present keys.
var modelKeys = func() []partition {
	var keys []partition
	for _, topic := range []string{"orders", "payments", "audit"} {
		for p := range int32(4) {
			keys = append(keys, partition{Topic: topic, Partition: p})
		}
	}
	return keys
}()

func keyOf(b byte) partition { return modelKeys[int(b)%len(modelKeys)] }

// modelRun applies one operation sequence to a Map and a refMap.
type modelRun struct {
	t   testing.TB
	m   *Map[partition, int]
	ref *refMap
	in  *opReader
}

// The operations, chosen by an opcode byte modulo opCount.
const (
	opUpdateAndMoveToEnd = iota
	opMoveToEnd
	opUpdate
	opGet
	opContains
	opRemove
	opFirst
	opClear
	opReplace
	opReplaceFiltered
	opIterate
	opCount
)

// maxDepth bounds the nesting of iterations started from loop bodies.
const maxDepth = 3

func runModel(t testing.TB, data []byte) {
	run := &modelRun{t: t, m: New[partition, int](0), ref: &refMap{}, in: &opReader{data: data}}
	for run.step(0) {
	}
	requireNoIteration(t, run.m)
	run.requireSame()
}

// step reads and applies one operation; it returns false when the input
// is used up.
func (x *modelRun) step(depth int) bool {
	t := x.t
	op, ok := x.in.next()
	if !ok {
		return false
	}
	switch int(op) % opCount {
	case opUpdateAndMoveToEnd:
		k, v := keyOf(x.in.byteOr()), int(x.in.byteOr())
		x.m.UpdateAndMoveToEnd(k, v)
		x.ref.placeAtEnd(k, v)
	case opMoveToEnd:
		k := keyOf(x.in.byteOr())
		require.Equal(t, x.ref.moveToEnd(k), x.m.MoveToEnd(k), "MoveToEnd(%v)", k)
	case opUpdate:
		k, v := keyOf(x.in.byteOr()), int(x.in.byteOr())
		x.m.Update(k, v)
		x.ref.update(k, v)
	case opGet:
		k := keyOf(x.in.byteOr())
		v, ok := x.m.Get(k)
		i := x.ref.find(k)
		require.Equal(t, i >= 0, ok, "Get(%v)", k)
		if ok {
			require.Equal(t, x.ref.entries[i].value, v, "Get(%v)", k)
		}
	case opContains:
		k := keyOf(x.in.byteOr())
		require.Equal(t, x.ref.find(k) >= 0, x.m.Contains(k), "Contains(%v)", k)
	case opRemove:
		k := keyOf(x.in.byteOr())
		require.Equal(t, x.ref.remove(k), x.m.Remove(k), "Remove(%v)", k)
	case opFirst:
		k, v, ok := x.m.First()
		require.Equal(t, len(x.ref.entries) > 0, ok, "First")
		if ok {
			require.Equal(t, x.ref.entries[0].key, k, "First")
			require.Equal(t, x.ref.entries[0].value, v, "First")
		}
	case opClear:
		// Rarer than the others: only when the next byte agrees.
		if x.in.byteOr()%4 == 0 {
			x.m.Clear()
			x.ref.entries = x.ref.entries[:0]
		}
	case opReplace:
		pairs := make([]refEntry, int(x.in.byteOr())%8)
		for i := range pairs {
			pairs[i] = refEntry{key: keyOf(x.in.byteOr()), value: int(x.in.byteOr())}
		}
		x.m.Replace(func(yield func(partition, int) bool) {
			for _, p := range pairs {
				if !yield(p.key, p.value) {
					return
				}
			}
		})
		x.ref.replace(pairs)
	case opReplaceFiltered:
		// Replace with a filtered, transformed view of the map's own
		// iterator: keep the entries whose key index has the chosen
		// parity, adding delta to their values.
		sel := x.in.byteOr()
		keep := func(k partition) bool { return (int(k.Partition)+len(k.Topic))%2 == int(sel%2) }
		delta := int(sel / 2)
		var pairs []refEntry
		for _, e := range x.ref.entries {
			if keep(e.key) {
				pairs = append(pairs, refEntry{key: e.key, value: e.value + delta})
			}
		}
		startLen := len(x.ref.entries)
		x.m.Replace(func(yield func(partition, int) bool) {
			steps := 0
			for k, v := range x.m.All() {
				steps++
				require.LessOrEqual(t, steps, startLen, "iteration longer than the map was")
				if keep(k) && !yield(k, v+delta) {
					return
				}
			}
		})
		x.ref.replace(pairs)
	case opIterate:
		x.iterate(depth)
	}
	requireInvariants(t, x.m)
	x.requireSame()
	return true
}

// iterate ranges over the map and the reference together; after each
// entry it reads one byte: 0 modulo 5 breaks, anything else applies the
// next operation from inside the loop body (nested iterations included,
// up to maxDepth).
func (x *modelRun) iterate(depth int) {
	t := x.t
	kind := x.in.byteOr() % 3
	it := x.ref.iterate()
	startLen := len(x.ref.entries)
	steps := 0
	body := func(k partition, v int, hasValue, hasKey bool) bool {
		steps++
		require.LessOrEqual(t, steps, startLen, "iteration longer than the map was")
		want, ok := it.next()
		require.True(t, ok, "iteration yielded %v, the reference expected the end", k)
		if hasKey {
			require.Equal(t, want.key, k, "key at step %d", steps)
		}
		if hasValue {
			require.Equal(t, want.value, v, "value at step %d", steps)
		}
		b, ok := x.in.next()
		if !ok || b%5 == 0 {
			return false
		}
		if depth+1 < maxDepth || x.in.pos >= len(x.in.data) || int(x.in.data[x.in.pos])%opCount != opIterate {
			x.step(depth + 1)
		}
		return true
	}
	finished := true
	switch kind {
	case 0:
		for k, v := range x.m.All() {
			if !body(k, v, true, true) {
				finished = false
				break
			}
		}
	case 1:
		for k := range x.m.Keys() {
			if !body(k, 0, false, true) {
				finished = false
				break
			}
		}
	case 2:
		for v := range x.m.Values() {
			if !body(partition{}, v, true, false) {
				finished = false
				break
			}
		}
	}
	if finished {
		_, more := it.next()
		require.False(t, more, "iteration ended early")
	}
}

// requireSame checks that the map holds the reference's entries in the
// reference's order.
func (x *modelRun) requireSame() {
	x.t.Helper()
	i := 0
	for n := x.m.head; n != nil; n = n.next {
		if i >= len(x.ref.entries) || n.key != x.ref.entries[i].key || n.value != x.ref.entries[i].value {
			x.fail()
		}
		i++
	}
	if i != len(x.ref.entries) || x.m.Len() != len(x.ref.entries) {
		x.fail()
	}
}

// fail reports the contents of the map and of the reference side by side.
func (x *modelRun) fail() {
	x.t.Helper()
	want := make([]refEntry, 0, len(x.ref.entries))
	for _, e := range x.ref.entries {
		want = append(want, refEntry{key: e.key, value: e.value})
	}
	got := make([]refEntry, 0, x.m.Len())
	for n := x.m.head; n != nil; n = n.next {
		got = append(got, refEntry{key: n.key, value: n.value})
	}
	require.Equal(x.t, want, got, "map and reference differ (Len %d)", x.m.Len())
	require.FailNow(x.t, "map and reference differ", "Len %d, reference %d", x.m.Len(), len(want))
}

// modelSeeds are byte sequences that reach each kind of operation, used
// as the fuzz corpus.
var modelSeeds = [][]byte{
	{},
	{opUpdateAndMoveToEnd, 0, 1, opUpdateAndMoveToEnd, 1, 2, opMoveToEnd, 0, opFirst},
	{opUpdate, 3, 4, opUpdate, 3, 5, opGet, 3, opContains, 4, opRemove, 3, opRemove, 3},
	{opUpdateAndMoveToEnd, 0, 1, opUpdateAndMoveToEnd, 1, 2, opClear, 0, opFirst, opUpdate, 0, 9},
	{opUpdateAndMoveToEnd, 0, 1, opReplace, 3, 2, 7, 0, 8, 2, 9, opReplaceFiltered, 3},
	{
		opUpdateAndMoveToEnd, 0, 1, opUpdateAndMoveToEnd, 1, 2, opUpdateAndMoveToEnd, 2, 3,
		opIterate, 0, 1, opMoveToEnd, 0, 1, opRemove, 2, 1, opUpdateAndMoveToEnd, 5, 5,
	},
	{
		opUpdateAndMoveToEnd, 0, 1, opUpdateAndMoveToEnd, 1, 2,
		opIterate, 1, 1, opIterate, 2, 1, opMoveToEnd, 1, 1, opClear, 4, 0, opFirst,
	},
}

func FuzzMap(f *testing.F) {
	for _, seed := range modelSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runModel(t, data)
	})
}

// TestMapMatchesModel runs the model test on the fuzz seeds and on long
// pseudo-random operation sequences from fixed seeds.
func TestMapMatchesModel(t *testing.T) {
	for i, seed := range modelSeeds {
		t.Run("corpus", func(t *testing.T) {
			t.Logf("corpus entry %d", i)
			runModel(t, seed)
		})
	}
	tests := []struct {
		name string
		seed uint64
		ops  int
		// heavy is given ten times the weight of each other operation.
		heavy []int
	}{
		{"mixed", 1, 2000, nil},
		{"mixed", 2, 2000, nil},
		{"mixed", 3, 2000, nil},
		{"inserts and removes", 4, 2000, []int{opUpdateAndMoveToEnd, opUpdate, opRemove}},
		{"moves", 5, 2000, []int{opUpdateAndMoveToEnd, opMoveToEnd}},
		{"iterations", 6, 2000, []int{opUpdateAndMoveToEnd, opIterate}},
		{"iterations", 7, 2000, []int{opUpdateAndMoveToEnd, opMoveToEnd, opRemove, opIterate}},
		{"replaces", 8, 2000, []int{opUpdateAndMoveToEnd, opReplace, opReplaceFiltered, opIterate}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Logf("seed %d", tt.seed)
			runModel(t, genOps(tt.seed, tt.ops, tt.heavy))
		})
	}
}

// genOps returns the bytes for about n operations chosen pseudo-randomly
// from seed, each followed by random operand bytes.
func genOps(seed uint64, n int, heavy []int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var weights [opCount]int
	for op := range weights {
		weights[op] = 1
	}
	for _, op := range heavy {
		weights[op] = 10
	}
	total := 0
	for _, w := range weights {
		total += w
	}
	operands := [opCount]int{
		opUpdateAndMoveToEnd: 2, opMoveToEnd: 1, opUpdate: 2, opGet: 1,
		opContains: 1, opRemove: 1, opClear: 1, opReplace: 9, opReplaceFiltered: 1,
		opIterate: 2,
	}
	var data []byte
	for range n {
		r := rng.IntN(total)
		op := 0
		for r >= weights[op] {
			r -= weights[op]
			op++
		}
		// Any byte equal to op modulo opCount selects op.
		data = append(data, byte(op+opCount*rng.IntN(256/opCount)))
		for range operands[op] {
			data = append(data, byte(rng.Uint32()))
		}
	}
	return data
}
