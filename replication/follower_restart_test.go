package replication

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// TestFollowerAboveTheLeadersStartDoesNotRestartInsideABatch: only a
// follower's log that is empty, or ends at or below the leader's log start,
// restarts at the first batch of a response. Here the follower stored the
// leader's batch [1, 3] at base offset 2 (a base offset damaged in transit,
// kept as a gap), so its log end 5 lies inside the leader's batch [4, 6],
// above the leader's start 0. Restarting there would delete its records
// below 4, committed ones included, which the leader still has (and the
// follower, its log start above the leader's, could even rejoin the ISR and
// lead without them). The append is refused instead, and the follower keeps
// its records.
func TestFollowerAboveTheLeadersStartDoesNotRestartInsideABatch(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	for _, vs := range [][]string{{"a"}, {"b", "c", "d"}, {"e", "f", "g"}} {
		_, err := leader.log.AppendAsLeader(testBatch(t, vs...), 1)
		require.NoError(t, err)
	}
	require.NoError(t, leader.log.Sync())
	data, err := leader.log.Read(nil, 0, log.ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	b0, rest, err := log.SplitBatch(data)
	require.NoError(t, err)
	b1, _, err := log.SplitBatch(rest)
	require.NoError(t, err)
	_, err = f.log.AppendAsFollower(b0)
	require.NoError(t, err)
	damaged := bytes.Clone(b1)
	binary.BigEndian.PutUint64(damaged[0:8], 2) // base offset 1 -> 2, outside the CRC
	_, err = f.log.AppendAsFollower(damaged)
	require.NoError(t, err)
	require.NoError(t, f.log.Sync())
	f.log.SetHighWatermark(1) // offset 0 committed
	require.Equal(t, int64(5), f.log.LogEndOffset())

	require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
	req, resp := fetchFrom(t, f, leader, ntime)
	require.Nil(t, resp.Partitions[0].Diverging)
	_, _ = f.node.HandleFetchResponse(0, req, resp, ntime) // refused: the batch does not continue the log

	require.Equal(t, int64(0), f.log.LogStartOffset(), "the follower's records below 4 are kept")
	got, err := f.log.Read(nil, 0, log.ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	first, _, err := log.SplitBatch(got)
	require.NoError(t, err)
	require.Equal(t, []byte(b0), []byte(first))
	require.Equal(t, []int32{0}, leader.isr())
}
