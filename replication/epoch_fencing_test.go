package replication

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFollowerRefusesLeadershipAtItsOwnEpoch: a node following at epoch e
// must refuse to lead at the same epoch e. Two leaders of one epoch would
// append different batches under the same epoch at the same offsets, which
// epoch-based divergence detection cannot tell apart (S15: at most one
// leader per epoch accepted).
func TestFollowerRefusesLeadershipAtItsOwnEpoch(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	both := []int32{0, 1}
	require.NoError(t, leader.node.BecomeLeader(ntp, 5, both, both, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 0))
	leader.produce(t, 2, AcksLeader)
	fetchOnce(t, f, leader, ntime)

	require.ErrorIs(t, f.node.BecomeLeader(ntp, 5, both, both, ntime), ErrStaleEpoch)
	require.Equal(t, []int32{0}, f.node.Leaders(), "a refused BecomeLeader leaves the follower fetching")
	_, _, _, err := f.node.appendAsLeader(ntp, testBatch(t, "second leader of epoch 5"), AcksLeader, ntime)
	require.ErrorIs(t, err, ErrNotLeader)
	require.Equal(t, int64(2), f.log.LogEndOffset())
}

// TestDeposedLeaderISRShrinkRefused is the scenario behind the contract's
// rule that the application refuses ISR changes of older epochs. Node 0
// leads epoch 1 with ISR {0,1,2} and MinInsyncReplicas 2; batch P is at
// offset 1, fetched by node 2 only. Node 1 is elected at epoch 2 without
// node 0 being told, and node 2 follows it and truncates P. Node 0's
// ticker then shrinks node 1 out of its ISR and keeps node 2, whose last
// reported log end is its own: accepted, that change would move node 0's
// high watermark past P, acknowledging a batch no replica of epoch 2
// holds. Refused, as the controller here does, the ISR and the high
// watermark stay.
func TestDeposedLeaderISRShrinkRefused(t *testing.T) {
	all := []int32{0, 1, 2}
	cfg := Config{MinInsyncReplicas: 2, ReplicaLagTime: time.Second, FetchMaxWait: 100 * time.Millisecond}
	a, b, f := newTestReplica(t, 0, cfg), newTestReplica(t, 1, cfg), newTestReplica(t, 2, cfg)
	now := ntime
	require.NoError(t, a.node.BecomeLeader(ntp, 1, all, all, now))
	require.NoError(t, b.node.BecomeFollower(ntp, 1, 0))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	a.produce(t, 1, AcksAll)
	for range 2 {
		fetchOnce(t, b, a, now)
		fetchOnce(t, f, a, now)
	}
	require.Equal(t, int64(1), a.log.HighWatermark())

	a.produce(t, 1, AcksAll) // P, at offset 1
	fetchOnce(t, f, a, now)
	fetchFrom(t, f, a, now) // node 2 reports offset 2
	require.Equal(t, int64(1), a.log.HighWatermark(), "node 1 has not fetched P")

	require.NoError(t, b.node.BecomeLeader(ntp, 2, all, all, now))
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 1))
	fetchOnce(t, f, b, now)
	require.Equal(t, int64(1), f.log.LogEndOffset(), "node 2 truncated P")

	a.refuseISR = true // the controller knows epoch 2: node 0's epoch-1 changes are refused
	a.node.Tick(now.Add(2 * time.Second))
	require.Equal(t, all, a.isr(), "a refused change is not applied")
	require.Equal(t, int64(1), a.log.HighWatermark(), "node 0 acknowledged P, which no replica of epoch 2 holds")
}

// TestFollowerRefusesASecondLeaderOfItsEpoch: a node following node 1 at
// epoch 5 must refuse to follow node 2 at epoch 5, also after
// StopPartition: were two nodes both made leader of epoch 5 (the
// application's mistake), the follower would mix their batches under one
// epoch, which no divergence check repairs. Following the same leader
// again at that epoch is allowed.
func TestFollowerRefusesASecondLeaderOfItsEpoch(t *testing.T) {
	f := newTestReplica(t, 0, Config{})
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 1))
	require.ErrorIs(t, f.node.BecomeFollower(ntp, 5, 2), ErrStaleEpoch)
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 1))
	f.node.StopPartition(ntp)
	require.ErrorIs(t, f.node.BecomeFollower(ntp, 5, 2), ErrStaleEpoch)
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 1))
	require.NoError(t, f.node.BecomeFollower(ntp, 6, 2), "a newer epoch may have another leader")
}
