package log

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An append makes a batch's bytes visible (the segment size) before its
// offsets (the log end). OffsetForTimestamp, bounded by the size alone,
// answered with the offset of a batch still being appended: at or past
// the log end, where a Read finds nothing or fails.
func TestOffsetForTimestampStaysBelowTheLogEndDuringAppends(t *testing.T) {
	_, opts := memLog()
	opts.SegmentBytes = 64 << 20
	l := openLog(t, "/log", opts)
	var stop atomic.Bool
	var latest atomic.Int64
	latest.Store(-1)
	done := make(chan error, 1)
	go func() {
		for i := int64(0); !stop.Load(); i++ {
			if _, err := l.Append(buildBatch(t, 1, 40, 1000+i)); err != nil {
				done <- err
				return
			}
			latest.Store(1000 + i)
		}
		done <- nil
	}()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		ts := latest.Load() + 1 // the batch being appended now
		off, ok, err := l.OffsetForTimestamp(ts)
		end := l.LogEndOffset()
		require.NoError(t, err)
		if ok {
			require.Less(t, off, end, "OffsetForTimestamp(%d) answered at or past the log end read after it", ts)
		}
	}
	stop.Store(true)
	require.NoError(t, <-done)
}
