package log

import (
	"testing"

	"github.com/replog/replog/internal/leakcheck"
)

// requireNoGoroutineLeak fails the test if goroutines of this module it
// started still run when it ends (leakcheck.Check). Call it first in a
// test, before any Log is opened; no t.Parallel.
func requireNoGoroutineLeak(t *testing.T) {
	t.Helper()
	leakcheck.Check(t)
}
