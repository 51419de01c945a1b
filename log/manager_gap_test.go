package log

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestManagerFollowerGapIsDurable: a follower append that leaves a gap
// between segments writes the recovery point past the gap before it
// returns (makeGapDurable), or recovery would take the gap for a lost
// tail and drop every segment after it. Under a Manager a roll flush
// stores the recovery point in memory only, so the check must go by what
// the checkpoint file holds: synced data after the gap survives a power
// loss and a killed process.
func TestManagerFollowerGapIsDurable(t *testing.T) {
	for _, c := range []struct {
		name  string
		crash vfs.CrashOptions
	}{{"power loss", vfs.CrashOptions{}}, {"process killed", vfs.CrashOptions{Kill: true}}} {
		t.Run(c.name, func(t *testing.T) { managerFollowerGap(t, c.crash) })
	}
}

// gapBatches returns a follower's batches at offsets 0-11, and one at
// 1000-1002: a gap after them.
func gapBatches(t *testing.T) (before [][]byte, after []byte) {
	for base := int64(0); base < 12; base += 3 {
		before = append(before, followerBatch(t, base, 3, 1))
	}
	return before, followerBatch(t, 1000, 3, 1)
}

// appendAcrossGap appends before then after as a follower, each synced:
// after, past the gap, rolls to segment 1000 (with SegmentBytes the size
// of before).
func appendAcrossGap(t *testing.T, l *Log, before [][]byte, after []byte) {
	t.Helper()
	_, err := l.AppendAsFollower(concat(before...))
	require.NoError(t, err)
	require.NoError(t, l.Sync())
	_, err = l.AppendAsFollower(after)
	require.NoError(t, err)
	require.Equal(t, 2, l.Stats().Segments)
	require.NoError(t, l.Sync()) // everything is acknowledged durable
}

func managerFollowerGap(t *testing.T, crash vfs.CrashOptions) {
	requireNoGoroutineLeak(t)
	before, after := gapBatches(t)
	mem := vfs.NewMem()
	mo := ManagerOptions{
		Log:                Options{FS: mem, SegmentBytes: int64(len(concat(before...)))},
		CheckpointInterval: time.Hour, // the timed checkpoint never runs in the test
	}
	m, err := OpenManager("/data", mo)
	require.NoError(t, err)
	l, err := m.Create("p-0")
	require.NoError(t, err)
	appendAcrossGap(t, l, before, after)

	img := mem.CrashClone(crash)
	require.NoError(t, m.Close())

	mo.Log.FS = img
	m2, err := OpenManager("/data", mo)
	require.NoError(t, err)
	defer m2.Close()
	l2, ok := m2.Get("p-0")
	require.True(t, ok)
	require.Equal(t, int64(1003), l2.LogEndOffset(), "A1: the synced batch after the follower's gap was dropped by recovery")
	require.Equal(t, append(before, after), readAllBatches(t, l2))
}

// TestStandaloneFollowerGapIsDurable is the same workload on a
// standalone Log.
func TestStandaloneFollowerGapIsDurable(t *testing.T) {
	requireNoGoroutineLeak(t)
	before, after := gapBatches(t)
	mem := vfs.NewMem()
	opts := Options{FS: mem, SegmentBytes: int64(len(concat(before...))), CheckpointInterval: time.Hour}
	l, err := Open("/log", opts)
	require.NoError(t, err)
	appendAcrossGap(t, l, before, after)
	img := mem.CrashClone(vfs.CrashOptions{})
	require.NoError(t, l.Close())
	opts.FS = img
	l2, err := Open("/log", opts)
	require.NoError(t, err)
	defer l2.Close()
	require.Equal(t, int64(1003), l2.LogEndOffset())
	require.Equal(t, append(before, after), readAllBatches(t, l2))
}
