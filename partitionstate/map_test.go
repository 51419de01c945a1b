package partitionstate

import (
	"iter"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kv is one entry as the tests compare them.
type kv struct {
	K string
	V int
}

// fill returns a map holding keys in order with values 1, 2, 3, ...
func fill(t *testing.T, keys ...string) *Map[string, int] {
	t.Helper()
	m := New[string, int](len(keys))
	for i, k := range keys {
		m.UpdateAndMoveToEnd(k, i+1)
	}
	requireInvariants(t, m)
	return m
}

// contents returns the entries of m in order, read through All, after
// checking the internal invariants.
func contents(t *testing.T, m *Map[string, int]) []kv {
	t.Helper()
	requireInvariants(t, m)
	out := []kv{}
	for k, v := range m.All() {
		out = append(out, kv{k, v})
	}
	requireNoIteration(t, m)
	require.Len(t, out, m.Len())
	return out
}

// keysOf returns the keys of m in order.
func keysOf(t *testing.T, m *Map[string, int]) []string {
	t.Helper()
	out := []string{}
	for _, e := range contents(t, m) {
		out = append(out, e.K)
	}
	return out
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name string
		ops  func(m *Map[string, int])
		want []kv
	}{
		{"empty", func(m *Map[string, int]) {}, []kv{}},
		{"insertion order", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("c", 1)
			m.UpdateAndMoveToEnd("a", 2)
			m.UpdateAndMoveToEnd("b", 3)
		}, []kv{{"c", 1}, {"a", 2}, {"b", 3}}},
		{"update and move to end of present key", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.UpdateAndMoveToEnd("b", 2)
			m.UpdateAndMoveToEnd("c", 3)
			m.UpdateAndMoveToEnd("a", 4)
		}, []kv{{"b", 2}, {"c", 3}, {"a", 4}}},
		{"move to end keeps value", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.UpdateAndMoveToEnd("b", 2)
			m.UpdateAndMoveToEnd("c", 3)
			m.MoveToEnd("b")
			m.MoveToEnd("a")
		}, []kv{{"c", 3}, {"b", 2}, {"a", 1}}},
		{"move last to end changes nothing", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.UpdateAndMoveToEnd("b", 2)
			m.MoveToEnd("b")
		}, []kv{{"a", 1}, {"b", 2}}},
		{"move only entry", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.MoveToEnd("a")
		}, []kv{{"a", 1}}},
		{"move absent key does nothing", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.MoveToEnd("z")
		}, []kv{{"a", 1}}},
		{"update keeps position", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.UpdateAndMoveToEnd("b", 2)
			m.UpdateAndMoveToEnd("c", 3)
			m.Update("a", 10)
			m.Update("b", 20)
		}, []kv{{"a", 10}, {"b", 20}, {"c", 3}}},
		{"update of absent key adds at end", func(m *Map[string, int]) {
			m.UpdateAndMoveToEnd("a", 1)
			m.Update("b", 2)
		}, []kv{{"a", 1}, {"b", 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New[string, int](0)
			tt.ops(m)
			assert.Equal(t, tt.want, contents(t, m))
		})
	}
}

func TestReturnValues(t *testing.T) {
	m := fill(t, "a", "b")
	assert.True(t, m.MoveToEnd("a"))
	assert.False(t, m.MoveToEnd("z"))
	assert.True(t, m.Remove("a"))
	assert.False(t, m.Remove("a"))
	assert.False(t, m.Contains("a"))
	assert.True(t, m.Contains("b"))
	v, ok := m.Get("b")
	assert.True(t, ok)
	assert.Equal(t, 2, v)
	v, ok = m.Get("a")
	assert.False(t, ok)
	assert.Zero(t, v)
	assert.Equal(t, 1, m.Len())
}

func TestFirst(t *testing.T) {
	tests := []struct {
		name   string
		keys   []string
		ops    func(m *Map[string, int])
		wantK  string
		wantV  int
		wantOK bool
	}{
		{"empty", nil, func(m *Map[string, int]) {}, "", 0, false},
		{"one", []string{"a"}, func(m *Map[string, int]) {}, "a", 1, true},
		{"oldest", []string{"a", "b", "c"}, func(m *Map[string, int]) {}, "a", 1, true},
		{"after moving the first", []string{"a", "b", "c"}, func(m *Map[string, int]) { m.MoveToEnd("a") }, "b", 2, true},
		{"after updating the first in place", []string{"a", "b"}, func(m *Map[string, int]) { m.Update("a", 9) }, "a", 9, true},
		{"after removing the first", []string{"a", "b", "c"}, func(m *Map[string, int]) { m.Remove("a") }, "b", 2, true},
		{"after removing all", []string{"a", "b"}, func(m *Map[string, int]) { m.Remove("a"); m.Remove("b") }, "", 0, false},
		{"after clear", []string{"a", "b"}, func(m *Map[string, int]) { m.Clear() }, "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := fill(t, tt.keys...)
			tt.ops(m)
			requireInvariants(t, m)
			k, v, ok := m.First()
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.wantK, k)
			assert.Equal(t, tt.wantV, v)
		})
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		name   string
		keys   []string
		remove string
		want   []string
	}{
		{"first", []string{"a", "b", "c"}, "a", []string{"b", "c"}},
		{"middle", []string{"a", "b", "c"}, "b", []string{"a", "c"}},
		{"last", []string{"a", "b", "c"}, "c", []string{"a", "b"}},
		{"only", []string{"a"}, "a", []string{}},
		{"absent", []string{"a", "b"}, "z", []string{"a", "b"}},
		{"from empty", nil, "a", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := fill(t, tt.keys...)
			m.Remove(tt.remove)
			assert.Equal(t, tt.want, keysOf(t, m))
			assert.False(t, m.Contains(tt.remove))

			// Re-inserting the removed key puts it at the end with its new
			// value, by any of the inserting operations.
			for name, insert := range map[string]func(){
				"UpdateAndMoveToEnd": func() { m.UpdateAndMoveToEnd(tt.remove, 42) },
				"Update":             func() { m.Update(tt.remove, 42) },
			} {
				m.Remove(tt.remove)
				insert()
				want := append(append([]string{}, tt.want...), tt.remove)
				assert.Equal(t, want, keysOf(t, m), name)
				v, ok := m.Get(tt.remove)
				assert.True(t, ok, name)
				assert.Equal(t, 42, v, name)
			}
		})
	}
}

func TestRemoveClearsNode(t *testing.T) {
	type big struct{ p *[1 << 10]byte }
	m := New[string, big](0)
	for _, k := range []string{"a", "b", "c"} {
		m.UpdateAndMoveToEnd(k, big{new([1 << 10]byte)})
	}
	removed := m.index["b"]
	require.True(t, m.Remove("b"))
	assert.Nil(t, removed.prev, "removed node still points to its old neighbour")
	assert.Nil(t, removed.next, "removed node still points to its old neighbour")
	assert.Empty(t, removed.key)
	assert.Nil(t, removed.value.p, "removed node keeps its value alive")
	assert.Same(t, removed, m.free)

	m.UpdateAndMoveToEnd("d", big{})
	assert.Same(t, removed, m.index["d"], "a new entry reuses the recycled node")
	assert.Nil(t, m.free)
}

func TestZeroValue(t *testing.T) {
	var m Map[string, int]
	assert.Equal(t, 0, m.Len())
	_, ok := m.Get("a")
	assert.False(t, ok)
	assert.False(t, m.MoveToEnd("a"))
	assert.False(t, m.Remove("a"))
	_, _, ok = m.First()
	assert.False(t, ok)
	for range m.All() {
		t.Fatal("empty map yielded an entry")
	}
	m.Clear()
	m.Update("a", 1)
	m.UpdateAndMoveToEnd("b", 2)
	assert.Equal(t, []kv{{"a", 1}, {"b", 2}}, contents(t, &m))
}

func TestClearThenReuse(t *testing.T) {
	m := fill(t, "a", "b", "c", "d")
	m.Clear()
	assert.Equal(t, 0, m.Len())
	assert.Equal(t, []kv{}, contents(t, m))
	_, _, ok := m.First()
	assert.False(t, ok)
	assert.False(t, m.Contains("a"))
	assert.False(t, m.MoveToEnd("a"))
	assert.Equal(t, 4, freeCount(m), "cleared nodes are kept for reuse")

	m.UpdateAndMoveToEnd("x", 1)
	m.UpdateAndMoveToEnd("a", 2)
	m.Update("y", 3)
	m.MoveToEnd("x")
	assert.Equal(t, []kv{{"a", 2}, {"y", 3}, {"x", 1}}, contents(t, m))
	assert.Equal(t, 1, freeCount(m))

	m.Clear()
	m.Clear()
	assert.Equal(t, []kv{}, contents(t, m))
	assert.Equal(t, 4, freeCount(m), "the free list holds no more nodes than the map ever did")
}

func TestReplace(t *testing.T) {
	tests := []struct {
		name string
		keys []string
		seq  []kv
		want []kv
	}{
		{"into empty", nil, []kv{{"b", 1}, {"a", 2}}, []kv{{"b", 1}, {"a", 2}}},
		{"with nothing clears", []string{"a", "b"}, nil, []kv{}},
		{"disjoint", []string{"a", "b"}, []kv{{"c", 7}, {"d", 8}}, []kv{{"c", 7}, {"d", 8}}},
		{"overlapping in new order", []string{"a", "b", "c"}, []kv{{"c", 30}, {"x", 5}, {"a", 10}}, []kv{{"c", 30}, {"x", 5}, {"a", 10}}},
		{"same keys", []string{"a", "b"}, []kv{{"a", 1}, {"b", 2}}, []kv{{"a", 1}, {"b", 2}}},
		{"duplicate takes last value and position", []string{"a"}, []kv{{"a", 1}, {"b", 2}, {"a", 3}}, []kv{{"b", 2}, {"a", 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := fill(t, tt.keys...)
			kept := map[string]*node[string, int]{}
			for _, e := range tt.seq {
				if n, ok := m.index[e.K]; ok {
					kept[e.K] = n
				}
			}
			m.Replace(func(yield func(string, int) bool) {
				for _, e := range tt.seq {
					if !yield(e.K, e.V) {
						return
					}
				}
			})
			assert.Equal(t, tt.want, contents(t, m))
			for k, n := range kept {
				assert.Same(t, n, m.index[k], "the node of a kept key %q is moved, not replaced", k)
			}
		})
	}
}

// TestReplaceNilSeq: Replace(nil) panicked calling it; it empties the map.
func TestReplaceNilSeq(t *testing.T) {
	m := fill(t, "a", "b")
	m.Replace(nil)
	assert.Equal(t, []kv{}, contents(t, m))
}

func TestReplaceFromOwnIterator(t *testing.T) {
	m := fill(t, "a", "b", "c", "d", "e")
	// Keep every other entry, doubling its value: the iteration Replace
	// runs over m itself sees each old entry once.
	m.Replace(func(yield func(string, int) bool) {
		steps := 0
		for k, v := range m.All() {
			steps++
			require.LessOrEqual(t, steps, 5, "iteration yields more entries than the map had")
			if v%2 == 1 && !yield(k, 2*v) {
				return
			}
		}
	})
	assert.Equal(t, []kv{{"a", 2}, {"c", 6}, {"e", 10}}, contents(t, m))

	// Replacing m with its own content changes nothing.
	m.Replace(m.All())
	assert.Equal(t, []kv{{"a", 2}, {"c", 6}, {"e", 10}}, contents(t, m))
}

// TestModifyDuringIteration pins down the documented effect of each kind of
// change made from inside a range loop over All.
func TestModifyDuringIteration(t *testing.T) {
	tests := []struct {
		name string
		// body runs after the entry k has been yielded; it returns false
		// to break out of the loop.
		body      func(m *Map[string, int], k string) bool
		wantYield []kv
		wantAfter []kv
	}{
		{
			name:      "no change",
			body:      func(m *Map[string, int], k string) bool { return true },
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
		},
		{
			name:      "break",
			body:      func(m *Map[string, int], k string) bool { return k != "b" },
			wantYield: []kv{{"a", 1}, {"b", 2}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
		},
		{
			name: "remove current entry",
			body: func(m *Map[string, int], k string) bool {
				m.Remove(k)
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{},
		},
		{
			name: "remove next entry",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" {
					m.Remove("b")
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{{"a", 1}, {"c", 3}, {"d", 4}},
		},
		{
			name: "remove entries already yielded",
			body: func(m *Map[string, int], k string) bool {
				if k == "c" {
					m.Remove("a")
					m.Remove("b")
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{{"c", 3}, {"d", 4}},
		},
		{
			name: "remove last entry",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" {
					m.Remove("d")
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"c", 3}},
		},
		{
			name: "move every entry to end (fetcher pattern)",
			body: func(m *Map[string, int], k string) bool {
				v, _ := m.Get(k)
				m.UpdateAndMoveToEnd(k, v*10)
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{{"a", 10}, {"b", 20}, {"c", 30}, {"d", 40}},
		},
		{
			name: "move some entries to end",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" || k == "c" {
					m.MoveToEnd(k)
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{{"b", 2}, {"d", 4}, {"a", 1}, {"c", 3}},
		},
		{
			name: "move entry not yet reached",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" {
					m.MoveToEnd("b")
					m.MoveToEnd("d")
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"c", 3}},
			wantAfter: []kv{{"a", 1}, {"c", 3}, {"b", 2}, {"d", 4}},
		},
		{
			name: "insert new entries",
			body: func(m *Map[string, int], k string) bool {
				m.UpdateAndMoveToEnd(k+"'", 0)
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}, {"a'", 0}, {"b'", 0}, {"c'", 0}, {"d'", 0}},
		},
		{
			name: "update entry not yet reached",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" {
					m.Update("c", 33)
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"c", 33}, {"d", 4}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"c", 33}, {"d", 4}},
		},
		{
			name: "remove then re-insert entry not yet reached",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" {
					m.Remove("c")
					m.Update("c", 33)
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"d", 4}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"d", 4}, {"c", 33}},
		},
		{
			name: "clear",
			body: func(m *Map[string, int], k string) bool {
				m.Clear()
				m.UpdateAndMoveToEnd("x", 9)
				return true
			},
			wantYield: []kv{{"a", 1}},
			wantAfter: []kv{{"x", 9}},
		},
		{
			name: "replace",
			body: func(m *Map[string, int], k string) bool {
				if k == "b" {
					m.Replace(func(yield func(string, int) bool) {
						_ = yield("d", 40) && yield("a", 10) && yield("x", 0)
					})
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}},
			wantAfter: []kv{{"d", 40}, {"a", 10}, {"x", 0}},
		},
		{
			name: "nested iteration that moves entries",
			body: func(m *Map[string, int], k string) bool {
				if k == "a" {
					for k2 := range m.Keys() {
						if k2 == "c" {
							m.MoveToEnd("c")
						}
					}
				}
				return true
			},
			wantYield: []kv{{"a", 1}, {"b", 2}, {"d", 4}},
			wantAfter: []kv{{"a", 1}, {"b", 2}, {"d", 4}, {"c", 3}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := fill(t, "a", "b", "c", "d")
			got := []kv{}
			for k, v := range m.All() {
				got = append(got, kv{k, v})
				require.LessOrEqual(t, len(got), 4, "iteration yields more entries than the map had")
				if !tt.body(m, k) {
					break
				}
				requireInvariants(t, m)
			}
			assert.Equal(t, tt.wantYield, got, "yielded")
			assert.Equal(t, tt.wantAfter, contents(t, m), "content after the loop")
		})
	}
}

func TestKeysAndValues(t *testing.T) {
	m := fill(t, "a", "b", "c")
	m.MoveToEnd("a")
	var keys []string
	for k := range m.Keys() {
		keys = append(keys, k)
		require.LessOrEqual(t, len(keys), 3, "iteration yields more entries than the map had")
		m.Remove("c")
	}
	assert.Equal(t, []string{"b", "a"}, keys)
	var values []int
	for v := range m.Values() {
		values = append(values, v)
		require.LessOrEqual(t, len(values), 2, "iteration yields more entries than the map had")
		m.MoveToEnd("b")
	}
	assert.Equal(t, []int{2, 1}, values)
	assert.Equal(t, []kv{{"a", 1}, {"b", 2}}, contents(t, m))
	for range m.Values() {
		break
	}
	requireNoIteration(t, m)
}

// TestIterationsEndInAnyOrder checks that iterations started with iter.Pull
// and stopped out of order release their cursors and keep working.
func TestIterationsEndInAnyOrder(t *testing.T) {
	m := fill(t, "a", "b", "c", "d")
	next1, stop1 := iter.Pull2(m.All())
	next2, stop2 := iter.Pull2(m.All())
	next3, stop3 := iter.Pull2(m.All())

	k, _, ok := next1()
	require.True(t, ok)
	assert.Equal(t, "a", k)
	k, _, ok = next2()
	require.True(t, ok)
	assert.Equal(t, "a", k)

	m.Remove("b")
	stop1()
	k, _, ok = next2()
	require.True(t, ok)
	assert.Equal(t, "c", k)
	k, _, ok = next3()
	require.True(t, ok)
	assert.Equal(t, "a", k)
	m.MoveToEnd("c")
	stop2()

	// A new iteration takes a free slot while 3 is still running.
	assert.Equal(t, []kv{{"a", 1}, {"d", 4}, {"c", 3}}, collect(m.All()))
	k, _, ok = next3()
	require.True(t, ok)
	assert.Equal(t, "d", k)
	_, _, ok = next3()
	assert.False(t, ok)
	stop3()
	requireNoIteration(t, m)
}

// TestPanicInLoopEndsIteration checks that a panic in a loop body releases
// the iteration's cursor.
func TestPanicInLoopEndsIteration(t *testing.T) {
	m := fill(t, "a", "b")
	func() {
		defer func() { assert.Equal(t, "boom", recover()) }()
		for range m.All() {
			panic("boom")
		}
	}()
	requireNoIteration(t, m)
	assert.Equal(t, []kv{{"a", 1}, {"b", 2}}, contents(t, m))
}

func collect(seq iter.Seq2[string, int]) []kv {
	out := []kv{}
	for k, v := range seq {
		out = append(out, kv{k, v})
	}
	return out
}

// TestMoveFirstEntry covers moves of the first entry, which skip the
// index: alone, in turn (a fetcher's walk), and from inside a range loop.
func TestMoveFirstEntry(t *testing.T) {
	m := fill(t, "a", "b", "c", "d")
	require.True(t, m.MoveToEnd("a"))
	m.UpdateAndMoveToEnd("b", 20)
	assert.Equal(t, []kv{{"c", 3}, {"d", 4}, {"a", 1}, {"b", 20}}, contents(t, m))

	visited := []string{}
	for k, v := range m.All() {
		visited = append(visited, k)
		m.UpdateAndMoveToEnd(k, v+100)
	}
	assert.Equal(t, []string{"c", "d", "a", "b"}, visited)
	assert.Equal(t, []kv{{"c", 103}, {"d", 104}, {"a", 101}, {"b", 120}}, contents(t, m))

	one := fill(t, "x")
	require.True(t, one.MoveToEnd("x"))
	one.UpdateAndMoveToEnd("x", 9)
	assert.Equal(t, []kv{{"x", 9}}, contents(t, one))
	require.True(t, one.Remove("x"))
	require.False(t, one.MoveToEnd("x"))
	assert.Empty(t, contents(t, one))
}
