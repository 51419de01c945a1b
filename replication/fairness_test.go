package replication

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// TestFetchFairnessAcrossPartitions follows 1,000 partitions behind one
// leader that keeps appending: every round the leader appends one batch
// to each partition and the follower sends one fetch whose byte limit is
// 90% of what was appended that round, so every fetch leaves partitions
// without data. BuildFetch walks the partitions in their fair order and
// HandleFetchResponse moves those that got data to the end: the ones left
// out come first in the next fetch, and over the first fetches every
// partition receives within a factor of 2 of every other. (In a fixed
// order the last partitions would get nothing, ever.)
func TestFetchFairnessAcrossPartitions(t *testing.T) {
	const (
		parts  = 1000
		rounds = 8
	)
	leader, err := NewNode(Config{ReplicaID: 0, ClusterID: "c"})
	require.NoError(t, err)
	batch := testBatch(t, string(bytes.Repeat([]byte("v"), 64)))
	follower, err := NewNode(Config{ReplicaID: 1, ClusterID: "c", FetchMaxBytes: int32(parts * len(batch) * 9 / 10)})
	require.NoError(t, err)
	// One filesystem per log: a directory of 2,000 entries would make
	// every directory sync copy them all.
	opts := log.Options{SegmentBytes: 1 << 20, MaxIndexBytes: 1 << 10, Now: func() time.Time { return ntime }}
	logs := make([]*log.Log, 0, parts)
	t.Cleanup(func() {
		for _, l := range logs {
			require.NoError(t, l.Close())
		}
	})
	tps := make([]TopicPartition, parts)
	index := map[TopicPartition]int{}
	for i := range tps {
		tps[i] = TopicPartition{Topic: "fair", Partition: int32(i)}
		index[tps[i]] = i
		for _, node := range []*Node{leader, follower} {
			opts.FS = vfs.NewMem()
			l, err := log.Open("/p", opts)
			require.NoError(t, err)
			logs = append(logs, l)
			require.NoError(t, node.AddPartition(tps[i], l))
		}
		require.NoError(t, leader.BecomeLeader(tps[i], 1, []int32{0, 1}, []int32{0}, ntime))
		require.NoError(t, follower.BecomeFollower(tps[i], 1, 0))
	}

	received := make([]int64, parts)
	var total int64
	for round := 0; round < rounds; round++ {
		for _, tp := range tps {
			l, _ := leader.Log(tp)
			_, err := l.AppendAsLeader(bytes.Clone(batch), 1)
			require.NoError(t, err)
		}
		req := follower.BuildFetch(0, ntime)
		require.NotNil(t, req)
		require.Len(t, req.Partitions, parts)
		resp, err := leader.HandleFetch(req, ntime)
		require.NoError(t, err)
		require.NoError(t, resp.Materialize())
		starved := 0
		for _, pr := range resp.Partitions {
			received[index[pr.TopicPartition]] += int64(len(pr.Records))
			total += int64(len(pr.Records))
			if len(pr.Records) == 0 {
				starved++
			}
		}
		require.Positive(t, starved, "round %d: the byte limit must leave partitions out", round)
		_, err = follower.HandleFetchResponse(0, req, resp, ntime)
		require.NoError(t, err)
	}
	require.Less(t, total, int64(parts*rounds*len(batch)), "the follower must stay behind")
	lo, hi := received[0], received[0]
	for _, n := range received {
		lo, hi = min(lo, n), max(hi, n)
	}
	require.Positive(t, lo, "a partition received nothing")
	require.LessOrEqual(t, hi, 2*lo, "bytes per partition range from %d to %d", lo, hi)
}
