package partitionstate

import "iter"

// node holds one entry. Live nodes form a doubly linked list in order;
// recycled nodes form a singly linked free list through next.
type node[K comparable, V any] struct {
	prev, next *node[K, V]
	// stamp is the value of Map.clock when the node was last placed at the
	// end of the list (inserted or moved). Stamps strictly increase along
	// the list; iterators use them to tell which entries they may yield.
	stamp uint64
	key   K
	value V
}

// Map is an insertion-ordered map from K to V. Entries keep the order in
// which they were added or last moved to the end; Update changes a value in
// place without moving it.
//
// Every operation on a single key (UpdateAndMoveToEnd, MoveToEnd, Update,
// Get, Contains, Remove) is O(1). Moving an entry (MoveToEnd, and
// UpdateAndMoveToEnd of a key present) re-links its existing node and
// allocates nothing, nor do Update, Get and Contains. Once the map has
// held as many entries as it holds now, inserting reuses a removed
// entry's node; only the Go map that indexes the nodes may, as any Go
// map under churn of new keys, now and then rebuild its table (amortized
// O(1), a few allocations per million inserts). A Map
// therefore keeps the memory of the largest number of entries it has held
// (as a Go map keeps its buckets); let the Map go to release it.
//
// The zero value is an empty map ready to use. A Map must not be copied
// after first use.
//
// Keys must equal themselves, as for a Go map: a key holding a NaN is
// stored as a new entry each time and never found again (Get, Remove and
// MoveToEnd miss it); only Replace and Clear drop it.
//
// A Map is not safe for concurrent use: the owner serializes all calls
// (including iterations) with its own lock. Calls made from inside a range
// loop over the map's own iterators are allowed; see the package
// documentation for their effect on the iteration.
type Map[K comparable, V any] struct {
	_ noCopy

	index map[K]*node[K, V]
	head  *node[K, V] // first entry, nil when empty
	tail  *node[K, V] // last entry, nil when empty
	free  *node[K, V] // recycled nodes, linked through next
	clock uint64      // last stamp handed out

	// cursors holds, for every iteration in progress, the next node that
	// iteration will look at. Removing or moving a node advances every
	// cursor that points to it, so iterations survive modification.
	cursors []cursor[K, V]

	// place is the yield function Replace hands to its sequence.
	place func(K, V) bool
}

// cursor is the position of one iteration in progress.
type cursor[K comparable, V any] struct {
	next  *node[K, V]
	inUse bool
}

// noCopy lets go vet's copylocks check report copies of a Map.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// New returns an empty Map with room for sizeHint entries before its index
// grows. A sizeHint of zero or less gives the same map as the zero value.
func New[K comparable, V any](sizeHint int) *Map[K, V] {
	m := &Map[K, V]{}
	if sizeHint > 0 {
		m.index = make(map[K]*node[K, V], sizeHint)
	}
	return m
}

// Len returns the number of entries.
func (m *Map[K, V]) Len() int {
	return len(m.index)
}

// Get returns the value of k and whether k is present.
func (m *Map[K, V]) Get(k K) (V, bool) {
	if n, ok := m.index[k]; ok {
		return n.value, true
	}
	var zero V
	return zero, false
}

// Contains reports whether k is present.
func (m *Map[K, V]) Contains(k K) bool {
	_, ok := m.index[k]
	return ok
}

// First returns the first entry in order, or ok false when the map is
// empty.
func (m *Map[K, V]) First() (k K, v V, ok bool) {
	if m.head == nil {
		return k, v, false
	}
	return m.head.key, m.head.value, true
}

// UpdateAndMoveToEnd sets the value of k to v and makes k the last entry.
// If k is absent it is added at the end.
func (m *Map[K, V]) UpdateAndMoveToEnd(k K, v V) {
	if n, ok := m.findToMove(k); ok {
		n.value = v
		m.moveToEnd(n)
		return
	}
	m.insert(k, v)
}

// MoveToEnd makes k the last entry, keeping its value, and reports whether
// k was present. It does nothing when k is absent.
func (m *Map[K, V]) MoveToEnd(k K) bool {
	n, ok := m.findToMove(k)
	if !ok {
		return false
	}
	m.moveToEnd(n)
	return true
}

// findToMove finds the node of a key about to move to the end. A fetcher
// walks its entries in order and moves each one that returned data, so
// that key is most often the first: comparing it with the head's key,
// which the previous move left in the CPU cache, saves hashing the key
// and probing the index, the costliest part of a move in a large map.
func (m *Map[K, V]) findToMove(k K) (*node[K, V], bool) {
	if h := m.head; h != nil && h.key == k {
		return h, true
	}
	n, ok := m.index[k]
	return n, ok
}

// Update sets the value of k to v. A present k keeps its position; an
// absent k is added at the end (as put on Kafka's LinkedHashMap does).
func (m *Map[K, V]) Update(k K, v V) {
	if n, ok := m.index[k]; ok {
		n.value = v
		return
	}
	m.insert(k, v)
}

// Remove deletes k and reports whether it was present. The entry's node is
// unlinked from its neighbours and kept for reuse by a later insertion.
func (m *Map[K, V]) Remove(k K) bool {
	n, ok := m.index[k]
	if !ok {
		return false
	}
	delete(m.index, k)
	m.unlink(n)
	m.recycle(n)
	return true
}

// Clear removes all entries. Their nodes and the index's memory are kept
// for reuse, so refilling the map up to its former size allocates nothing.
// Iterations in progress end at their next step.
func (m *Map[K, V]) Clear() {
	for n := m.head; n != nil; {
		next := n.next
		m.recycle(n)
		n = next
	}
	m.head, m.tail = nil, nil
	clear(m.index)
	for i := range m.cursors {
		m.cursors[i].next = nil
	}
}

// Replace makes the content of m exactly the pairs of seq, in seq's order,
// as Kafka's PartitionStates.set does when a fetcher's partitions change.
// A key that occurs more than once in seq ends with the value and the
// position of its last occurrence. Nodes of keys that stay are moved, not
// reallocated; nodes of keys that go are kept for reuse.
//
// While Replace runs, m holds the old entries not yet placed followed by
// the entries placed so far; the old entries not in seq are removed at the
// end. So seq may read m, for example m.All() through a filter: such an
// iteration yields each old entry once. It also means that replacing n
// entries by n new keys makes m hold up to 2n nodes for a moment, and keep
// them for reuse. A nil seq empties m.
func (m *Map[K, V]) Replace(seq iter.Seq2[K, V]) {
	// Everything placed by seq gets a stamp above start and lands at the
	// end; what keeps a stamp at or below start was not in seq and forms a
	// prefix of the list.
	start := m.clock
	if m.place == nil {
		// Made once per map: a yield function built here on each call
		// would escape into seq and allocate every time.
		m.place = func(k K, v V) bool {
			m.UpdateAndMoveToEnd(k, v)
			return true
		}
	}
	if seq != nil {
		seq(m.place)
	}
	lost := false // a dropped key that delete cannot find (NaN)
	for m.head != nil && m.head.stamp <= start {
		n := m.head
		lost = lost || n.key != n.key
		delete(m.index, n.key)
		m.unlink(n)
		m.recycle(n)
	}
	if lost { // rebuild the index from the list (NaN keys stay unfindable)
		clear(m.index)
		for n := m.head; n != nil; n = n.next {
			m.index[n.key] = n
		}
	}
}

// All returns an iterator over the entries in order. See the package
// documentation for what an iteration yields when the map changes during
// it.
func (m *Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		c, limit := m.startIteration()
		defer m.endIteration(c)
		for {
			n := m.step(c, limit)
			if n == nil || !yield(n.key, n.value) {
				return
			}
		}
	}
}

// Keys returns an iterator over the keys in order, with the semantics of
// All.
func (m *Map[K, V]) Keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		c, limit := m.startIteration()
		defer m.endIteration(c)
		for {
			n := m.step(c, limit)
			if n == nil || !yield(n.key) {
				return
			}
		}
	}
}

// Values returns an iterator over the values in order, with the semantics
// of All.
func (m *Map[K, V]) Values() iter.Seq[V] {
	return func(yield func(V) bool) {
		c, limit := m.startIteration()
		defer m.endIteration(c)
		for {
			n := m.step(c, limit)
			if n == nil || !yield(n.value) {
				return
			}
		}
	}
}

// startIteration registers a cursor at the head and returns its slot and
// the largest stamp the iteration may yield.
func (m *Map[K, V]) startIteration() (slot int, limit uint64) {
	slot = -1
	for i := range m.cursors {
		if !m.cursors[i].inUse {
			slot = i
			break
		}
	}
	if slot < 0 {
		m.cursors = append(m.cursors, cursor[K, V]{})
		slot = len(m.cursors) - 1
	}
	m.cursors[slot] = cursor[K, V]{next: m.head, inUse: true}
	return slot, m.clock
}

// endIteration releases a cursor slot. Iterations may end in any order
// (iter.Pull), so only trailing free slots are trimmed.
func (m *Map[K, V]) endIteration(slot int) {
	m.cursors[slot] = cursor[K, V]{}
	for len(m.cursors) > 0 && !m.cursors[len(m.cursors)-1].inUse {
		m.cursors = m.cursors[:len(m.cursors)-1]
	}
}

// step returns the next node of the iteration in slot and advances its
// cursor, or nil when the iteration is over: the list ended, or the next
// node was placed at the end after the iteration started.
func (m *Map[K, V]) step(slot int, limit uint64) *node[K, V] {
	n := m.cursors[slot].next
	if n == nil || n.stamp > limit {
		m.cursors[slot].next = nil
		return nil
	}
	m.cursors[slot].next = n.next
	return n
}

// insert adds a new entry at the end, reusing a recycled node if any.
func (m *Map[K, V]) insert(k K, v V) {
	n := m.free
	if n != nil {
		m.free = n.next
		n.next = nil
	} else {
		n = new(node[K, V])
	}
	n.key, n.value = k, v
	m.clock++
	n.stamp = m.clock
	if m.index == nil {
		m.index = make(map[K]*node[K, V])
	}
	m.index[k] = n
	n.prev = m.tail
	if m.tail == nil {
		m.head = n
	} else {
		m.tail.next = n
	}
	m.tail = n
}

// moveToEnd re-links n after the current tail.
func (m *Map[K, V]) moveToEnd(n *node[K, V]) {
	m.clock++
	n.stamp = m.clock
	if len(m.cursors) > 0 {
		m.skip(n)
	}
	if n == m.tail {
		return
	}
	// n is not the tail, so n.next is not nil.
	if n.prev == nil {
		m.head = n.next
	} else {
		n.prev.next = n.next
	}
	n.next.prev = n.prev
	n.prev, n.next = m.tail, nil
	m.tail.next = n
	m.tail = n
}

// unlink takes n out of the list and clears its links.
func (m *Map[K, V]) unlink(n *node[K, V]) {
	if len(m.cursors) > 0 {
		m.skip(n)
	}
	if n.prev == nil {
		m.head = n.next
	} else {
		n.prev.next = n.next
	}
	if n.next == nil {
		m.tail = n.prev
	} else {
		n.next.prev = n.prev
	}
	n.prev, n.next = nil, nil
}

// skip advances every cursor that is about to look at n past it, before n
// leaves its place.
func (m *Map[K, V]) skip(n *node[K, V]) {
	for i := range m.cursors {
		if m.cursors[i].next == n {
			m.cursors[i].next = n.next
		}
	}
}

// recycle clears an unlinked node, so that it keeps neither neighbours nor
// the key's and value's referents alive, and puts it on the free list.
func (m *Map[K, V]) recycle(n *node[K, V]) {
	*n = node[K, V]{next: m.free}
	m.free = n
}
