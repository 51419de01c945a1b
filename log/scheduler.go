package log

import (
	"sync"
	"time"
)

// scheduler runs the background work of many logs on a fixed number of
// worker goroutines, so a Manager's goroutine count does not grow with its
// logs. Logs are queued when kicked (a roll to flush, a deletion) and,
// by a ticker, when their timed work is due.
type scheduler struct {
	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*flusher
	flushers map[*flusher]struct{}
	closed   bool
	tick     time.Duration
	now      func() time.Time

	stop chan struct{}
	wg   sync.WaitGroup
}

// newScheduler starts workers goroutines and a ticker checking due work
// every tick.
func newScheduler(workers int, tick time.Duration, now func() time.Time) *scheduler {
	s := &scheduler{flushers: map[*flusher]struct{}{}, tick: tick, now: now, stop: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	for i := 0; i < workers; i++ {
		s.wg.Add(1)
		go s.work()
	}
	s.wg.Add(1)
	go s.ticker()
	return s
}

func (s *scheduler) register(f *flusher) {
	s.mu.Lock()
	s.flushers[f] = struct{}{}
	s.mu.Unlock()
	s.kick(f)
}

func (s *scheduler) unregister(f *flusher) {
	s.mu.Lock()
	delete(s.flushers, f)
	s.mu.Unlock()
}

// kick queues f unless it is queued already. A log being stepped is not
// queued again (a second worker would step it concurrently, both taking
// turns on its locks while other logs wait): its worker steps it once
// more when done.
func (s *scheduler) kick(f *flusher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.enqueueLocked(f)
}

func (s *scheduler) enqueueLocked(f *flusher) {
	switch {
	case f.queued:
	case f.running:
		f.rerun = true
	default:
		f.queued = true
		s.queue = append(s.queue, f)
		s.cond.Signal()
	}
}

// queued returns how many logs wait for a worker.
func (s *scheduler) queueLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

func (s *scheduler) work() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		f := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		f.queued, f.running = false, true
		s.mu.Unlock()
		next := f.step()
		s.mu.Lock()
		f.due = next
		f.running = false
		if f.rerun {
			f.rerun = false
			s.enqueueLocked(f)
		}
		s.mu.Unlock()
	}
}

func (s *scheduler) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(s.tick)
	defer t.Stop()
	var due []*flusher
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		// time.Time comparisons: with the clock's monotonic readings (as
		// time.Now gives them), a step of the wall clock neither stalls
		// nor hastens the timed work, as in a standalone log's flusher.
		now := s.now()
		due = due[:0]
		s.mu.Lock()
		for f := range s.flushers {
			if !f.due.IsZero() && !now.Before(f.due) {
				due = append(due, f)
			}
		}
		s.mu.Unlock()
		for _, f := range due {
			s.kick(f)
		}
	}
}

// close stops the workers and the ticker and waits for them. Logs must
// have been closed first.
func (s *scheduler) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Broadcast()
	close(s.stop)
	s.wg.Wait()
}
