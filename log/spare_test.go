package log

import (
	"slices"
	"testing"
	"time"

	"github.com/replog/replog/internal/vfs"
	"github.com/stretchr/testify/require"
)

// TestRollRenamesSpareFile: once the active segment is half full the
// flusher creates next-segment.log.tmp; the roll renames it to the new
// segment's name (so the roll creates no file); Close removes a spare
// left over, and Open removes one a crash left.
func TestRollRenamesSpareFile(t *testing.T) {
	requireNoGoroutineLeak(t)
	fs, opts := memLog()
	l := openLog(t, "/log", opts)
	spare := "/log/" + spareName
	exists := func(name string) bool {
		_, err := fs.Stat(name)
		return err == nil
	}
	for l.active().size.Load() < opts.SegmentBytes/2 {
		appendN(t, l, 1, 0)
	}
	require.Eventually(t, func() bool { return exists(spare) }, 10*time.Second, time.Millisecond,
		"the spare is made once the segment is half full")
	f := readySpare(l)
	before := len(l.segments())
	for len(l.segments()) == before {
		appendN(t, l, 1, 0)
	}
	act := l.active()
	require.Same(t, f, act.file, "the roll took the spare's file")
	require.True(t, exists(act.path(logSuffix)))
	names, err := fs.ReadDir("/log")
	require.NoError(t, err)
	if slices.Contains(names, spareName) {
		// Only a new spare may be there, not the renamed one.
		require.NotSame(t, f, readySpare(l))
	}

	// Fill the new segment to half, so that a spare is ready at Close.
	for l.active().size.Load() < opts.SegmentBytes/2 {
		appendN(t, l, 1, 0)
	}
	require.Eventually(t, func() bool { return exists(spare) }, 10*time.Second, time.Millisecond)
	img := crashCopy(t, fs)
	require.NoError(t, l.Close())
	require.False(t, exists(spare), "Close removes the spare")

	crashed := opts
	crashed.FS = img
	l2 := openLog(t, "/log", crashed)
	_, err = img.Stat(spare)
	require.Error(t, err, "Open removes a spare left by a crash")
	require.NoError(t, l2.Close())
}

// readySpare returns l's spare file, or nil.
func readySpare(l *Log) vfs.File {
	l.bg.spareMu.Lock()
	defer l.bg.spareMu.Unlock()
	return l.bg.spare
}

// TestFlushGroupServesUrgentFirst: when a turn frees up, a waiting urgent
// caller (a spare file) gets it before callers that waited longer.
func TestFlushGroupServesUrgentFirst(t *testing.T) {
	g := NewFlushGroup(1)
	release := g.acquire(false)
	order := make(chan string, 2)
	waiting := func(urgent bool) bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		if urgent {
			return g.waitingUrgent == 1
		}
		return g.waitingOther == 1
	}
	go func() {
		r := g.acquire(false)
		order <- "flush"
		r()
	}()
	// The flush waits first: a FIFO group would then serve it first.
	require.Eventually(t, func() bool { return waiting(false) }, 10*time.Second, time.Millisecond)
	go func() {
		r := g.acquire(true)
		order <- "spare"
		r()
	}()
	require.Eventually(t, func() bool { return waiting(true) }, 10*time.Second, time.Millisecond)
	release()
	require.Equal(t, "spare", <-order)
	require.Equal(t, "flush", <-order)

	var nilGroup *FlushGroup
	nilGroup.acquire(false)() // unbounded, never blocks
}
