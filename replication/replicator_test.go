package replication

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

func batchOf(t testing.TB, n int, tag string) []byte {
	t.Helper()
	bb := log.NewBatchBuilder()
	for i := 0; i < n; i++ {
		bb.Add(time.Now().UnixMilli(), nil, []byte(fmt.Sprintf("%s-%d", tag, i)))
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

func TestThreeReplicasAcksAllInMemory(t *testing.T) {
	net := NewMemNetwork(1)
	tp := TopicPartition{Topic: "t", Partition: 0}
	var reps []*Replicator
	var logs []*log.Log
	for id := int32(0); id < 3; id++ {
		l, err := log.Open(t.TempDir(), log.Options{SegmentBytes: 64 << 10})
		require.NoError(t, err)
		logs = append(logs, l)
		r, err := New(Config{ReplicaID: id, ClusterID: "c", MinInsyncReplicas: 2, FetchMaxWait: 50 * time.Millisecond}, net.Transport(id))
		require.NoError(t, err)
		net.Register(id, r)
		require.NoError(t, r.AddPartition(tp, l))
		reps = append(reps, r)
	}
	defer func() {
		for i := range reps {
			require.NoError(t, reps[i].Close())
			require.NoError(t, logs[i].Close())
		}
	}()
	require.NoError(t, reps[0].BecomeLeader(tp, 1, []int32{0, 1, 2}, []int32{0, 1, 2}))
	require.NoError(t, reps[1].BecomeFollower(tp, 1, 0))
	require.NoError(t, reps[2].BecomeFollower(tp, 1, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 50; i++ {
		info, err := reps[0].Produce(ctx, tp, batchOf(t, 5, fmt.Sprint(i)), AcksAll)
		require.NoError(t, err)
		require.Equal(t, int64(i*5), info.FirstOffset)
		require.Greater(t, logs[0].HighWatermark(), info.LastOffset)
	}
	// Fail over to replica 1 at epoch 2.
	require.NoError(t, reps[1].BecomeLeader(tp, 2, []int32{0, 1, 2}, []int32{1, 2}))
	require.NoError(t, reps[2].BecomeFollower(tp, 2, 1))
	require.NoError(t, reps[0].BecomeFollower(tp, 2, 1))
	for i := 50; i < 80; i++ {
		_, err := reps[1].Produce(ctx, tp, batchOf(t, 5, fmt.Sprint(i)), AcksAll)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return logs[0].LogEndOffset() == 400 && logs[2].LogEndOffset() == 400
	}, 10*time.Second, 10*time.Millisecond)
	// Stats: the new leader hears both followers reach its log end.
	require.Eventually(t, func() bool {
		fs := reps[1].Stats().Partitions[0].Followers
		return len(fs) == 2 && fs[0].LogEndOffset == 400 && fs[1].LogEndOffset == 400
	}, 10*time.Second, 10*time.Millisecond)
	lead, old := reps[1].Stats(), reps[0].Stats()
	require.Equal(t, RoleLeader, lead.Partitions[0].Role)
	require.Equal(t, []int32{0, 1, 2}, lead.Partitions[0].ISR)
	require.Positive(t, lead.FetchesServed)
	require.Positive(t, lead.BytesServed)
	require.Equal(t, RoleFollower, old.Partitions[0].Role)
	require.Equal(t, int32(1), old.Partitions[0].Leader)
	require.Positive(t, old.BytesFetched, "replica 0 fetched epoch 2's records")
	require.Positive(t, old.FetchesServed, "and served fetches while it led")
	for _, l := range logs[1:] {
		a, err := logs[0].Read(nil, 0, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		b, err := l.Read(nil, 0, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		require.Equal(t, a, b)
	}
}

// With only acks=1 producers nothing on the produce path fsyncs the
// leader; the follower fetches must still move the high watermark.
func TestHighWatermarkAdvancesWithAcksLeaderOnly(t *testing.T) {
	net := NewMemNetwork(2)
	tp := TopicPartition{Topic: "t", Partition: 0}
	var reps []*Replicator
	var logs []*log.Log
	for id := int32(0); id < 2; id++ {
		l, err := log.Open(t.TempDir(), log.Options{})
		require.NoError(t, err)
		r, err := New(Config{ReplicaID: id, ClusterID: "c", MinInsyncReplicas: 2, FetchMaxWait: 20 * time.Millisecond}, net.Transport(id))
		require.NoError(t, err)
		net.Register(id, r)
		require.NoError(t, r.AddPartition(tp, l))
		reps, logs = append(reps, r), append(logs, l)
	}
	defer func() {
		for i := range reps {
			require.NoError(t, reps[i].Close())
			require.NoError(t, logs[i].Close())
		}
	}()
	require.NoError(t, reps[0].BecomeLeader(tp, 1, []int32{0, 1}, []int32{0, 1}))
	require.NoError(t, reps[1].BecomeFollower(tp, 1, 0))
	for i := 0; i < 20; i++ {
		_, err := reps[0].Produce(context.Background(), tp, batchOf(t, 3, fmt.Sprint(i)), AcksLeader)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return logs[0].HighWatermark() == 60 }, 10*time.Second, 5*time.Millisecond,
		"high watermark stuck at %d", logs[0].HighWatermark())
	require.Equal(t, int64(60), logs[0].DurableOffset())
}

// With acks=1 producers and no follower fetching (the leader is the only
// replica, or its follower died and left the ISR), the Replicator's
// ticker fsyncs the leader's log, so the high watermark reaches the log
// end within a tick (regression: nothing fsynced the leader, and the
// high watermark, its durable end, never moved).
func TestHighWatermarkAdvancesWithoutFetches(t *testing.T) {
	for _, c := range []struct {
		name          string
		replicas, isr []int32
	}{
		{"only replica", []int32{0}, []int32{0}},
		{"follower left the ISR", []int32{0, 1}, []int32{0, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := log.Open(t.TempDir(), log.Options{})
			require.NoError(t, err)
			defer func() { require.NoError(t, l.Close()) }()
			// A 10 ms tick; node 1 never fetches.
			r, err := New(Config{ReplicaID: 0, ClusterID: "c", ReplicaLagTime: 40 * time.Millisecond}, idleTransport{})
			require.NoError(t, err)
			defer func() { require.NoError(t, r.Close()) }()
			require.NoError(t, r.AddPartition(ntp, l))
			require.NoError(t, r.BecomeLeader(ntp, 1, c.replicas, c.isr))
			require.Eventually(t, func() bool { return slices.Equal(r.Stats().Partitions[0].ISR, []int32{0}) },
				10*time.Second, 5*time.Millisecond)
			for i := 0; i < 10; i++ {
				_, err := r.Produce(context.Background(), ntp, batchOf(t, 3, fmt.Sprint(i)), AcksLeader)
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { return l.HighWatermark() == 30 }, 10*time.Second, 5*time.Millisecond,
				"high watermark stuck at %d, durable end %d", l.HighWatermark(), l.DurableOffset())
		})
	}
}
