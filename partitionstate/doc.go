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
// # Contract
//
//  1. Order: entries are kept in the order in which they were added or last
//     moved to the end. UpdateAndMoveToEnd and MoveToEnd move an entry to the
//     end; Update changes a value in place; Remove deletes; Replace sets the
//     whole content in a given order.
//  2. Cost: every single-key operation is O(1). Moving an entry re-links its
//     node; a removed entry's node has its links and contents cleared and is
//     kept on a free list for the next insertion. Once a Map has held as many
//     entries as it holds now, no operation other than Replace with more new
//     keys than free nodes allocates, and the memory it keeps is bounded by
//     the largest number of entries it has held.
//  3. Concurrency: a Map is not safe for concurrent use. Its owner serializes
//     all calls, iterations included.
//  4. Iteration: All, Keys and Values iterate in order. An iteration that
//     starts when the map holds entries e1..en yields a subset of them, each
//     at most once and in that order, and always ends after at most n steps.
//     The body of the range loop may call any method of the map; the changes
//     take effect at once, with this effect on the iteration:
//     - an entry removed before the iteration reaches it is not yielded;
//     - an entry added, or moved to the end (by UpdateAndMoveToEnd,
//     MoveToEnd or Replace), after the iteration started is not yielded by
//     it; the next iteration sees it in its new place;
//     - an entry updated in place before the iteration reaches it is yielded
//     with its new value;
//     - Clear ends the iteration at its next step.
//
//     So a fetcher may walk its partitions and move each one that returned
//     data to the end from inside the loop: every partition is visited once
//     and the walk ends. An iteration is in progress until its range loop
//     ends; with iter.Pull, until stop is called. A map tracks each iteration
//     in progress, so call stop for every iter.Pull that is not run to its
//     end.
package partitionstate
