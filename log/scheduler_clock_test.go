package log

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// stepWall returns t with its wall clock reading moved by d and its
// monotonic reading kept: what time.Now returns after an NTP step of d.
// No API moves one reading without the other, so it edits time.Time's
// fields (wall = hasMonotonic:1 | seconds since 1885:33 | ns:30, ext =
// monotonic ns); ok is false when that layout does not hold.
func stepWall(t time.Time, d time.Duration) (time.Time, bool) {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	const hasMono = 1 << 63
	s := t
	p := (*layout)(unsafe.Pointer(&s))
	if p.wall&hasMono == 0 {
		return t, false
	}
	sec := int64(p.wall<<1>>31) + int64(d/time.Second)
	p.wall = hasMono | uint64(sec)<<30 | p.wall&(1<<30-1)
	return s, s.Sub(t) == 0 && s.Unix()-t.Unix() == int64(d/time.Second)
}

// TestManagerTimedWorkSurvivesAWallClockStep: the Manager's scheduler
// kept each log's next due time as wall-clock nanoseconds, so after the
// wall clock stepped back an hour (NTP), no log got its interval syncs,
// retention or late checkpoints for an hour. It now compares time.Time
// values, by their monotonic readings, as a standalone log's flusher does.
func TestManagerTimedWorkSurvivesAWallClockStep(t *testing.T) {
	if _, ok := stepWall(time.Now(), -time.Hour); !ok {
		t.Skip("time.Time's layout is not the one stepWall edits")
	}
	var step atomic.Int64 // the wall clock's offset, ns
	now := func() time.Time {
		s, _ := stepWall(time.Now(), time.Duration(step.Load()))
		return s
	}
	m, err := OpenManager(mgrCrashDir, ManagerOptions{Log: Options{FS: vfs.NewMem(), Now: now, SyncInterval: 20 * time.Millisecond}})
	require.NoError(t, err)
	defer m.Close()
	l, err := m.Create("a-0")
	require.NoError(t, err)
	waitDurable := func(what string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for l.DurableOffset() < l.LogEndOffset() {
			require.True(t, time.Now().Before(deadline),
				"%s: SyncInterval 20ms, yet nothing synced for 3 s (durable %d, log end %d)", what, l.DurableOffset(), l.LogEndOffset())
			time.Sleep(time.Millisecond)
		}
	}
	_, err = l.Append(buildBatch(t, 1, 10, 0))
	require.NoError(t, err)
	waitDurable("before the step")
	time.Sleep(50 * time.Millisecond) // the worker has stored its next due time
	step.Store(int64(-time.Hour))
	_, err = l.Append(buildBatch(t, 1, 10, 0))
	require.NoError(t, err)
	waitDurable("after the wall clock stepped back an hour")
}
