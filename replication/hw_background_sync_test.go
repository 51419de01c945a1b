package replication

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// An acks=1 produce on a leader alone in its ISR: the high watermark
// passes it within a tick of its fsync. When the log's own background
// fsync (log.Options.SyncInterval) made the data durable first, the
// ticker found nothing to fsync and did not move the high watermark,
// which then stayed until some later append.
func TestHighWatermarkFollowsTheLogsOwnFsyncs(t *testing.T) {
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem(), SyncInterval: time.Millisecond})
	require.NoError(t, err)
	r, err := New(Config{ReplicaID: 0, ClusterID: "c", ReplicaLagTime: 400 * time.Millisecond}, idleTransport{}) // a tick every 100 ms
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, l.Close())
	})
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeLeader(ntp, 1, []int32{0}, []int32{0}))
	info, err := r.Produce(context.Background(), ntp, testBatch(t, "a", "b"), AcksLeader)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.DurableOffset() > info.LastOffset }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return l.HighWatermark() > info.LastOffset }, time.Second, time.Millisecond,
		"log durable to %d, high watermark %d", l.DurableOffset(), l.HighWatermark())
}
