package log

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitFlushGroupWaiters waits until g has the given numbers of waiters.
func waitFlushGroupWaiters(t *testing.T, g *FlushGroup, urgent, other int) {
	t.Helper()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waitingUrgent == urgent && g.waitingOther == other
	}, 5*time.Second, time.Millisecond)
}

// TestFlushGroupPassesOnEveryFreedTurn: two turns freed before the urgent
// waiter woken by the first had run signalled it twice, the second signal
// lost, and the other waiter sat with a free turn until the urgent one
// released its own: the group ran one flush where it allowed two.
func TestFlushGroupPassesOnEveryFreedTurn(t *testing.T) {
	requireNoGoroutineLeak(t)
	g := NewFlushGroup(2)
	g.acquire(false)
	g.acquire(false)
	got := make(chan string, 2)
	done := make(chan struct{})
	defer close(done)
	go func() { release := g.acquire(true); got <- "urgent"; <-done; release() }()
	waitFlushGroupWaiters(t, g, 1, 0)
	go func() { release := g.acquire(false); got <- "other"; release() }()
	waitFlushGroupWaiters(t, g, 1, 1)

	// Both turns come back before the urgent waiter can run (it needs
	// g.mu to return from its Wait).
	g.mu.Lock()
	g.releaseLocked()
	g.releaseLocked()
	g.mu.Unlock()
	for _, want := range []string{"urgent", "other"} {
		select {
		case who := <-got:
			require.Equal(t, want, who)
		case <-time.After(5 * time.Second):
			t.Fatalf("the %s waiter did not get one of the two free turns", want)
		}
	}
}

// TestFlushGroupUrgentGoesFirst: a turn freed while both kinds wait goes
// to the urgent waiter.
func TestFlushGroupUrgentGoesFirst(t *testing.T) {
	requireNoGoroutineLeak(t)
	g := NewFlushGroup(1)
	release := g.acquire(false)
	got := make(chan string, 2)
	go func() { r := g.acquire(false); got <- "other"; r() }()
	waitFlushGroupWaiters(t, g, 0, 1)
	go func() { r := g.acquire(true); got <- "urgent"; r() }()
	waitFlushGroupWaiters(t, g, 1, 1)
	release()
	require.Equal(t, "urgent", <-got)
	require.Equal(t, "other", <-got)
}

// TestZeroFlushGroupIsOneTurn: a zero FlushGroup, accepted by Open, made
// the log's background goroutine wait on a condition without a lock, a
// panic that took the process down once the log rolled. It now lets one
// log work at a time.
func TestZeroFlushGroupIsOneTurn(t *testing.T) {
	requireNoGoroutineLeak(t)
	var g FlushGroup
	release := g.acquire(false)
	got := make(chan struct{})
	go func() { r := g.acquire(true); close(got); r() }()
	waitFlushGroupWaiters(t, &g, 1, 0)
	select {
	case <-got:
		t.Fatal("a zero FlushGroup gave a second turn")
	case <-time.After(10 * time.Millisecond):
	}
	release()
	<-got

	var shared FlushGroup
	_, opts := memLog()
	opts.FlushGroup = &shared
	for _, dir := range []string{"/a", "/b"} {
		l := openLog(t, dir, opts)
		for range 3 {
			appendN(t, l, 40, 0) // rolls, whose work takes turns
		}
		require.NoError(t, l.Sync())
		require.Greater(t, len(l.segments()), 2)
		require.NoError(t, l.Close())
	}
}
