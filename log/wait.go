package log

import (
	"context"
	"sync/atomic"
)

// waitList wakes every goroutine waiting for new data with one channel
// close: waiters share the current channel, and the appender that makes
// data available swaps it out and closes it. No goroutine is started per
// waiter and nothing polls.
type waitList struct {
	ch atomic.Pointer[chan struct{}]
}

// channel returns the channel the next wake will close.
func (w *waitList) channel() chan struct{} {
	for {
		if p := w.ch.Load(); p != nil {
			return *p
		}
		c := make(chan struct{})
		if w.ch.CompareAndSwap(nil, &c) {
			return c
		}
	}
}

// wake releases every current waiter. It costs one atomic load when no
// one waits.
func (w *waitList) wake() {
	if w.ch.Load() == nil {
		return
	}
	if p := w.ch.Swap(nil); p != nil {
		close(*p)
	}
}

// WaitForData blocks until a record at or after offset can be read: the
// log end offset (or, with upToHighWatermark, the high watermark) is past
// offset. It returns ctx.Err() if ctx ends first and ErrClosed if the Log
// is closed meanwhile.
func (l *Log) WaitForData(ctx context.Context, offset int64, upToHighWatermark bool) error {
	return l.waitForData(ctx, offset, upToHighWatermark, nil, 0)
}

// waitForData is WaitForData that, given a Reader's truncation generation
// gen and position next, also returns (nil) once a truncation made gen
// stale, or the log start passed next: the Reader must then look again,
// since it may now be past the log end, or below the log start (while it
// waits at a batch that straddles the high watermark, past next).
func (l *Log) waitForData(ctx context.Context, offset int64, upToHighWatermark bool, gen *uint64, next int64) error {
	for {
		ch := l.waiters.channel()
		if l.closed.Load() {
			return ErrClosed
		}
		end := l.leo.Load()
		if upToHighWatermark {
			end = l.HighWatermark()
		}
		if end > offset || gen != nil && (l.truncations.gen.Load() != *gen || l.logStart.Load() > next) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
