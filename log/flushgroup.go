package log

// FlushGroup bounds how many Logs sharing it (Options.FlushGroup) run
// their background roll work at the same time. The application creates
// one per set of logs, typically one for the process; the zero value is
// not usable.
type FlushGroup struct {
	slots chan struct{}
}

// NewFlushGroup returns a group letting n logs (at least 1) flush at once.
func NewFlushGroup(n int) *FlushGroup {
	return &FlushGroup{slots: make(chan struct{}, max(n, 1))}
}

// acquire waits for a slot and returns its release; a nil group has
// unlimited slots.
func (g *FlushGroup) acquire() func() {
	if g == nil {
		return func() {}
	}
	g.slots <- struct{}{}
	return func() { <-g.slots }
}
