package log

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// leakWait is how long requireNoGoroutineLeak waits for goroutines that
// are still winding down (a flusher finishing its last loop, a test's own
// helpers returning) before it reports a leak.
const leakWait = 5 * time.Second

// requireNoGoroutineLeak fails the test if, when it ends, more goroutines
// run than when requireNoGoroutineLeak was called. Call it first in a test
// (before any Log is opened), so that its cleanup runs last, after the
// cleanups that close Logs. Tests that use it must not run in parallel
// with other tests (no t.Parallel): the count is process-wide.
func requireNoGoroutineLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		if err := waitGoroutines(before, leakWait); err != nil {
			t.Error(err)
		}
	})
}

// waitGoroutines waits up to wait for the number of goroutines to drop to
// at most want, and returns an error with every goroutine's stack if it
// does not.
func waitGoroutines(want int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		n := runtime.NumGoroutine()
		if n <= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goroutine leak: %d goroutines at start, %d at end:\n%s", want, n, goroutineDump())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// goroutineDump returns the stacks of all goroutines except the one
// calling it.
func goroutineDump() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var keep []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "goroutineDump") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// TestWaitGoroutinesDetectsLeak checks that the leak check can fail: a
// goroutine started after the baseline is reported with its stack, and
// once it ends the check passes.
func TestWaitGoroutinesDetectsLeak(t *testing.T) {
	// The baseline once earlier tests' goroutines have wound down: one of
	// them ending during the check would hide the leak (seen under -race
	// in CI).
	before := runtime.NumGoroutine()
	for deadline := time.Now().Add(leakWait); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == before {
			break
		}
		before = n
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		<-stop
	}()
	err := waitGoroutines(before, 20*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "TestWaitGoroutinesDetectsLeak") {
		t.Fatalf("leaked goroutine not reported with its stack: %v", err)
	}
	close(stop)
	<-done
	if err := waitGoroutines(before, leakWait); err != nil {
		t.Fatal(err)
	}
}
