package log

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetentionAgeOfASegmentWithoutTimestamps: a segment whose batches
// carry no timestamp (NoTimestamp, or times before 1970, which make a
// batch's max timestamp NoTimestamp) was never old enough for age
// retention, and, retention stopping at the first segment it keeps, held
// back every later one: the log grew without bound. Such a segment is now
// judged by its file's modification time, as Kafka does. (MemFS dates its
// changes from 2000-01-01 on, a second each.)
func TestRetentionAgeOfASegmentWithoutTimestamps(t *testing.T) {
	// RetentionAge 1h: the old segment and the two without timestamps
	// (files a day old) go; 48h: only the old one, as the first without
	// timestamps is kept, and so is everything after it.
	for _, c := range []struct {
		age  time.Duration
		want int
	}{{time.Hour, 3}, {48 * time.Hour, 1}} {
		clock := newTestClock()
		clock.ns.Store(time.Date(2000, 1, 2, 0, 0, 0, 0, time.UTC).UnixNano()) // a day after the files were written
		_, opts := memLog()
		opts.Now = clock.Now
		opts.RetentionAge = c.age
		l := openLog(t, "/log", opts)
		old := clock.Now().Add(-72 * time.Hour).UnixMilli()
		for _, ts := range []int64{old, -500, NoTimestamp, clock.Now().UnixMilli()} {
			_, err := l.Append(timestampedBatch(t, ts))
			require.NoError(t, err)
			l.mu.Lock()
			require.NoError(t, l.roll(l.LogEndOffset()))
			l.mu.Unlock()
		}
		n, err := l.ApplyRetention()
		require.NoError(t, err)
		require.Equal(t, c.want, n, "RetentionAge %v, segments left %v", c.age, segmentBases(l))
		require.NoError(t, l.Close())
	}
}
