package replication

import (
	"testing"

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
	_, _, _, err := f.node.appendAsLeader(ntp, testBatch(t, "second leader of epoch 5"), AcksLeader)
	require.ErrorIs(t, err, ErrNotLeader)
	require.Equal(t, int64(2), f.log.LogEndOffset())
}
