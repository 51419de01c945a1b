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

// requireNoGoroutineLeak fails the test if, when it ends, a goroutine
// runs code of this module that did not run when requireNoGoroutineLeak
// was called. Goroutines are told apart by id, not counted, so one of an
// earlier test ending meanwhile cannot hide a leak. Call it first in a
// test (before any Log is opened), so that its cleanup runs last, after
// the cleanups that close Logs. Tests that use it must not run in
// parallel with other tests (no t.Parallel): it sees the whole process.
func requireNoGoroutineLeak(t *testing.T) {
	t.Helper()
	before := goroutineStacks()
	t.Cleanup(func() {
		if err := waitGoroutines(before, leakWait); err != nil {
			t.Error(err)
		}
	})
}

// waitGoroutines waits up to wait for every goroutine of this module not
// in before to end, and returns an error with their stacks if some do
// not.
func waitGoroutines(before map[string]string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		var leaked []string
		for id, stack := range goroutineStacks() {
			if _, ok := before[id]; !ok && strings.Contains(stack, "github.com/replog/replog/") {
				leaked = append(leaked, stack)
			}
		}
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goroutine leak: %d goroutines started since and still running:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// goroutineStacks returns the stack of every goroutine but the calling
// one, by goroutine id.
func goroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := map[string]string{}
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 {
			continue // the caller's own, always first
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		stacks[id] = g
	}
	return stacks
}

// TestWaitGoroutinesDetectsLeak checks that the leak check can fail: a
// goroutine started after the baseline is reported with its stack even
// when an older goroutine ends meanwhile, and once it ends the check
// passes.
func TestWaitGoroutinesDetectsLeak(t *testing.T) {
	older := make(chan struct{})
	go func() { <-older }()
	before := goroutineStacks()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		<-stop
	}()
	close(older) // ending: a count would now match the baseline
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
