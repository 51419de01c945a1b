// Package leakcheck finds goroutines a test leaves running. Goroutines
// are told apart by id, not counted, so that one of an earlier test
// ending meanwhile cannot hide a leak; only goroutines running this
// module's code (github.com/replog/replog/) count, so that the runtime's
// and the testing package's own goroutines do not.
package leakcheck

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Wait is how long Check waits for goroutines that are still winding
// down (a flusher finishing its last loop, a test's helpers returning)
// before it reports a leak.
const Wait = 5 * time.Second

// module marks the stack frames of this module's code.
const module = "github.com/replog/replog/"

// Check fails the test if, when it ends, a goroutine runs this module's
// code that did not run when Check was called. Call it first in a test,
// before anything starts goroutines, so that its cleanup runs last, after
// the cleanups that close what the test opened. Tests that use it must
// not run in parallel with others (no t.Parallel): it sees the whole
// process.
func Check(t testing.TB) {
	t.Helper()
	before := Snapshot()
	t.Cleanup(func() {
		if err := WaitGone(before, Wait); err != nil {
			t.Error(err)
		}
	})
}

// Snapshot returns the stack of every goroutine but the calling one, by
// goroutine id.
func Snapshot() map[string]string {
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

// WaitGone waits up to wait for every goroutine running this module's
// code that is not in before to end, and returns an error with the
// stacks of those that do not.
func WaitGone(before map[string]string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		var leaked []string
		for id, stack := range Snapshot() {
			if _, ok := before[id]; !ok && strings.Contains(stack, module) {
				leaked = append(leaked, stack)
			}
		}
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goroutine leak: %d goroutines started since and still running:\n%s",
				len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
