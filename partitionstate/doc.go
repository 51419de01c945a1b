// Package partitionstate provides Map, a generic insertion-ordered map whose
// move-to-end allocates nothing.
//
// A replica fetcher walks its partitions in order and moves each partition
// that returned data to the end, so that all partitions share a response's
// byte limit fairly. Kafka kept that order in a LinkedHashMap and moved an
// entry by remove + put, which allocated a new entry on every move and left
// removed entries chained to each other (KAFKA-21316). Map keeps its entries
// in a doubly linked list of nodes found through a Go map, and moves the
// existing node instead.
//
// # Order
//
// Entries are kept in the order in which they were added or last moved to
// the end. UpdateAndMoveToEnd and MoveToEnd move an entry to the end (the
// former adds it there when absent); Update changes a value in place (and
// adds an absent key at the end); Remove deletes; Replace sets the whole
// content in a given order.
//
// # Cost and memory
//
// Every single-key operation is O(1). Moving an entry re-links its node.
// Moving the first entry, which is what a fetcher walking its partitions in
// order does, skips the Go map altogether: the key is compared with the
// first node's, which the previous move left in the CPU cache. In a large
// map that saves the costliest part of a move, the index's random memory
// accesses; moving any other entry goes through the index.
// Removing an entry clears its node's links, key and value, so the node keeps
// nothing alive, and keeps the node on a free list for the next insertion.
// Moves, updates, lookups, removals and range loops over All, Keys or Values
// allocate nothing; an insertion allocates a node only when the free list is
// empty, that is while the map grows past the largest number of entries it
// has held (the Go map indexing the nodes may still, under churn of new
// keys, rebuild its table now and then, as any Go map does). The memory a
// Map keeps is therefore bounded by that largest size;
// let the Map go to release it. A map's first iteration and first Replace
// each make one small allocation that the map keeps.
//
// # Concurrency
//
// A Map is not safe for concurrent use. Its owner serializes all calls,
// iterations included.
//
// # Modification during iteration
//
// All, Keys and Values iterate in order. The body of a range loop over them
// may call any method of the same map; changes take effect at once. An
// iteration that starts when the map holds the entries e1..en yields some of
// them, each at most once and in that order, and ends after at most n steps:
//
//   - an entry removed before the iteration reaches it is not yielded;
//   - an entry added, or moved to the end (by UpdateAndMoveToEnd, MoveToEnd
//     or Replace), after the iteration started is not yielded by it; the next
//     iteration sees it in its new place;
//   - an entry updated in place before the iteration reaches it is yielded
//     with its new value;
//   - after Clear, the iteration ends at its next step.
//
// So a fetcher may walk its partitions and move each one that returned data
// to the end from inside the loop: each partition is visited once and the
// walk ends. An iteration is in progress until its range loop ends, or, when
// it is driven by iter.Pull, until stop is called; the map tracks every
// iteration in progress, so call stop for each iter.Pull not run to its end.
package partitionstate
