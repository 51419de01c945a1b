package log

import "sync"

// FlushGroup bounds how many Logs sharing it (Options.FlushGroup) run
// their background roll work at the same time. Preparing the next
// segment's file goes before flushes waiting for a turn, so that after
// many logs rolled together every log's next file is ready long before
// the flushes of all of them are done. The application creates one per
// set of logs, typically one for the process; the zero value lets one
// log work at a time, as NewFlushGroup(1).
type FlushGroup struct {
	mu            sync.Mutex
	ready         bool // made by NewFlushGroup, or set up at first use
	free          int  // turns not taken
	waitingUrgent int
	waitingOther  int
	urgent, other sync.Cond
}

// NewFlushGroup returns a group letting n logs (at least 1) work at once.
func NewFlushGroup(n int) *FlushGroup {
	g := &FlushGroup{free: max(n, 1), ready: true}
	g.urgent.L, g.other.L = &g.mu, &g.mu
	return g
}

// setUpLocked makes a zero FlushGroup one of a single turn.
func (g *FlushGroup) setUpLocked() {
	if !g.ready {
		g.free, g.ready = 1, true
		g.urgent.L, g.other.L = &g.mu, &g.mu
	}
}

// acquire waits for a turn, before every waiting non-urgent caller if
// urgent is set, and returns its release. A nil group has unlimited turns.
func (g *FlushGroup) acquire(urgent bool) func() {
	if g == nil {
		return func() {}
	}
	g.mu.Lock()
	g.setUpLocked()
	if urgent {
		g.waitingUrgent++
		for g.free == 0 {
			g.urgent.Wait()
		}
		g.waitingUrgent--
	} else {
		g.waitingOther++
		for g.free == 0 || g.waitingUrgent > 0 {
			g.other.Wait()
		}
		g.waitingOther--
	}
	g.free--
	g.passOnLocked()
	g.mu.Unlock()
	return g.release
}

func (g *FlushGroup) release() {
	g.mu.Lock()
	g.releaseLocked()
	g.mu.Unlock()
}

func (g *FlushGroup) releaseLocked() {
	g.free++
	g.passOnLocked()
}

// passOnLocked wakes a waiter, urgent ones first, if a turn is free. A
// waiter that takes a turn calls it too: a second release before the
// first woken waiter ran signals it again (it still counts as waiting),
// and without this the turn it freed would wait for the next release.
func (g *FlushGroup) passOnLocked() {
	switch {
	case g.free == 0:
	case g.waitingUrgent > 0:
		g.urgent.Signal()
	case g.waitingOther > 0:
		g.other.Signal()
	}
}
