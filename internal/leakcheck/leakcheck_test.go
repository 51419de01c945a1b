package leakcheck

import (
	"strings"
	"testing"
	"time"
)

// TestWaitGoneDetectsLeak checks that the check can fail: a goroutine
// started after the snapshot is reported with its stack even when an
// older goroutine ends meanwhile, and once it ends the check passes.
func TestWaitGoneDetectsLeak(t *testing.T) {
	older := make(chan struct{})
	go func() { <-older }()
	before := Snapshot()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		<-stop
	}()
	close(older) // ending: a count would now match the snapshot
	err := WaitGone(before, 20*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "TestWaitGoneDetectsLeak") {
		t.Fatalf("leaked goroutine not reported with its stack: %v", err)
	}
	close(stop)
	<-done
	if err := WaitGone(before, Wait); err != nil {
		t.Fatal(err)
	}
}
