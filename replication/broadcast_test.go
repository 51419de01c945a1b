package replication

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitBroadcastWakesEveryRegisteredWaiter checks a wake's tokens: one
// for each channel added since the last wake, none for one removed, and
// a channel removed after its token came is left empty for its next wait.
func TestWaitBroadcastWakesEveryRegisteredWaiter(t *testing.T) {
	var w waitBroadcast
	w.wake() // no one waits
	a, b, c := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)
	w.add(a)
	w.wake() // one waits
	require.Len(t, a, 1)
	<-a
	w.add(a)
	w.add(b)
	w.add(c)
	w.remove(b)
	w.wake()
	require.Len(t, a, 1)
	require.Len(t, b, 0, "a removed channel got a token")
	require.Len(t, c, 1)
	w.wake() // the first wake unregistered them all
	require.Len(t, a, 1)
	w.remove(a) // after its token came: drained
	require.Len(t, a, 0)
	require.Zero(t, w.n.Load())
	w.add(a)
	w.add(c) // c still holds its token: the next wake must not block
	w.wake()
	require.Len(t, a, 1)
}

// TestWaitBroadcastMissesNoWake has waiters check a counter between
// adding their channel and waiting, as holdFetch and awaitHighWatermark
// do, while a waker raises it and wakes: every waiter must see the last
// value, whichever way the two interleave, and give up on a timeout
// without leaving a token behind. Half the waiters have no timeout: a
// missed wake leaves one stuck.
func TestWaitBroadcastMissesNoWake(t *testing.T) {
	var (
		w       waitBroadcast
		pool    wakeChans
		counter atomic.Int64
		wg      sync.WaitGroup
	)
	const target, waiters = 2000, 8
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch := pool.get()
			defer func() {
				w.remove(ch)
				require.Len(t, ch, 0, "a token was left in a channel given back")
				pool.put(ch)
			}()
			seen := int64(-1)
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			for seen < target {
				w.add(ch)
				if v := counter.Load(); v != seen {
					seen = v
					w.remove(ch) // as a fetch with news returns
					continue
				}
				var timeout <-chan time.Time // half the waiters wait for wakes only
				if i%2 == 1 {
					timer.Reset(time.Duration(i) * 10 * time.Microsecond)
					timeout = timer.C
				}
				select {
				case <-ch:
				case <-timeout:
					w.remove(ch) // gave up waiting: may race a wake
				case <-ctx.Done():
					t.Errorf("waiter stuck at %d of %d", seen, target)
					return
				}
			}
		}()
	}
	for range target {
		counter.Add(1)
		w.wake()
	}
	wg.Wait()
	require.Zero(t, w.n.Load(), "waiters left registered")
}

// TestWaitBroadcastForgetsWhatItWoke checks that a wake resets the count
// (else every later wake takes the lock for no one) and that neither a
// wake nor a remove leaves a channel in the slice's spare capacity, where
// it would stay reachable.
func TestWaitBroadcastForgetsWhatItWoke(t *testing.T) {
	var w waitBroadcast
	a, b := make(chan struct{}, 1), make(chan struct{}, 1)
	w.add(a)
	w.add(b)
	w.wake()
	require.Zero(t, w.n.Load(), "count after a wake")
	for i, ch := range w.waiters[:cap(w.waiters)] {
		require.Nil(t, ch, "slot %d keeps a woken channel", i)
	}
	<-a
	<-b
	w.add(a)
	w.add(b)
	w.remove(b)
	w.remove(a)
	for i, ch := range w.waiters[:cap(w.waiters)] {
		require.Nil(t, ch, "slot %d keeps a removed channel", i)
	}
}
