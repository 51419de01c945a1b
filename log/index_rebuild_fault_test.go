package log

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
)

// TestFailedIndexRebuildIsRetried: a sealed segment of a Manager's log
// whose time index file is missing is rebuilt at its first use. When that
// rebuild's read failed (EMFILE as the file cache reopened the evicted
// segment file), the indexes stayed reset, empty and taken as loaded: the
// segment looked as if its records had no timestamps, and age retention,
// judging it by its mtime, deleted records well within the retention age.
// A failed rebuild is now retried at the next use.
func TestFailedIndexRebuildIsRetried(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("emfile=%v", fault), func(t *testing.T) {
			now := time.Date(2020, 6, 1, 0, 0, 0, 0, time.UTC)
			mem := vfs.NewMem()
			var failOpen atomic.Bool
			efs := vfs.NewErrorFS(mem, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				if op.Kind == vfs.OpOpen && strings.HasSuffix(op.Path, "/a/"+segmentName(0)+logSuffix) && failOpen.CompareAndSwap(true, false) {
					return vfs.Fault{Err: syscall.EMFILE}
				}
				return vfs.Fault{}
			}))
			opts := ManagerOptions{
				Log:     Options{FS: efs, SegmentBytes: 1 << 10, Now: func() time.Time { return now }, RetentionAge: 30 * 24 * time.Hour},
				Workers: 2, MaxOpenFiles: 4, CheckpointInterval: time.Hour,
			}
			m, err := OpenManager("/data", opts)
			require.NoError(t, err)
			l, err := m.Create("a")
			require.NoError(t, err)
			for range 12 {
				_, err := l.Append(buildBatch(t, 1, 200, now.UnixMilli())) // records of now
				require.NoError(t, err)
			}
			require.NoError(t, l.Sync())
			require.NoError(t, m.Close())
			require.NoError(t, mem.Remove("/data/a/"+segmentName(0)+timeIndexSuffix)) // rebuilt when used

			m, err = OpenManager("/data", opts)
			require.NoError(t, err)
			defer m.Close()
			l, _ = m.Get("a")
			require.Greater(t, len(l.segments()), 1)
			if fault {
				failOpen.Store(true)
				_, err = l.Read(nil, 0, ReadOptions{})
				require.True(t, errors.Is(err, syscall.EMFILE), "the read whose reopen fails: %v", err)
			}
			_, err = l.Read(nil, 0, ReadOptions{})
			require.NoError(t, err)
			n, err := l.ApplyRetention()
			require.NoError(t, err)
			require.Zero(t, n, "age retention deleted %d segment(s) of records of now (log start now %d)", n, l.LogStartOffset())
		})
	}
}
