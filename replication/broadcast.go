package replication

import (
	"sync"
	"sync/atomic"
)

// waitBroadcast wakes every waiter at once. Each waiter registers a
// channel of capacity 1 that it owns and reuses from one wait to the
// next, and a wake sends a token to each: waiting allocates nothing,
// where a channel closed to wake them all would be made anew for every
// wait (an acks=all Produce and each held fetch wait once per batch).
//
// A waiter adds its channel before it checks what it waits for, so that
// no wake between the check and the wait is missed, and removes it when
// it stops waiting without a token; the channel is then empty, ready for
// its next wait.
type waitBroadcast struct {
	mu      sync.Mutex
	waiters []chan struct{} // each of capacity 1, empty when added
	n       atomic.Int32    // len(waiters), so that wake skips mu when none wait
}

// add registers ch, empty and of capacity 1, for the next wake, which
// sends it a token and unregisters it.
func (w *waitBroadcast) add(ch chan struct{}) {
	w.mu.Lock()
	w.waiters = append(w.waiters, ch)
	w.n.Store(int32(len(w.waiters)))
	w.mu.Unlock()
}

// remove unregisters ch if no wake did, and drains the token of a wake
// that did, so that ch is empty for its next add.
func (w *waitBroadcast) remove(ch chan struct{}) {
	w.mu.Lock()
	// From the end: the waiter that stops is most often the one that
	// added last.
	for i := len(w.waiters) - 1; i >= 0; i-- {
		if w.waiters[i] == ch {
			last := len(w.waiters) - 1
			w.waiters[i] = w.waiters[last]
			w.waiters[last] = nil
			w.waiters = w.waiters[:last]
			break
		}
	}
	w.n.Store(int32(len(w.waiters)))
	w.mu.Unlock()
	select {
	case <-ch:
	default:
	}
}

// wake sends every registered waiter a token and unregisters them all. It
// costs one atomic load when no one waits.
func (w *waitBroadcast) wake() {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	for _, ch := range w.waiters {
		select {
		case ch <- struct{}{}:
		default: // cannot happen: a registered channel is empty
		}
	}
	clear(w.waiters)
	w.waiters = w.waiters[:0]
	w.n.Store(0)
	w.mu.Unlock()
}

// wakeChans lends waiters their channels: an acks=all Produce takes one
// for its wait and gives it back, empty and unregistered.
type wakeChans struct{ pool sync.Pool }

func (c *wakeChans) get() chan struct{} {
	if ch, ok := c.pool.Get().(chan struct{}); ok {
		return ch
	}
	return make(chan struct{}, 1)
}

func (c *wakeChans) put(ch chan struct{}) { c.pool.Put(ch) }
