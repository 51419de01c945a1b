package replication

import (
	"bytes"
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// memPairFailingFirst sets up a leader Replicator (node 0) and a follower
// Replicator (node 1) over a MemNetwork, both hosting tps (the leader's
// ISR is itself alone), the follower's log of tps[0] on an ErrorFS whose
// writes, truncations, fsyncs and preallocations fail once armed.
func memPairFailingFirst(t *testing.T, followerCfg Config, tps ...TopicPartition) (leader, follower *Replicator, leaderLogs, followerLogs []*log.Log, arm *atomic.Bool) {
	t.Helper()
	net := NewMemNetwork(1)
	arm = &atomic.Bool{}
	var err error
	leader, err = New(Config{ReplicaID: 0, ClusterID: "c", FetchMaxWait: 50 * time.Millisecond, RelaxedDurability: true}, net.Transport(0))
	require.NoError(t, err)
	net.Register(0, leader)
	followerCfg.ReplicaID, followerCfg.ClusterID = 1, "c"
	if followerCfg.FetchMaxWait == 0 {
		followerCfg.FetchMaxWait = 50 * time.Millisecond
	}
	follower, err = New(followerCfg, net.Transport(1))
	require.NoError(t, err)
	net.Register(1, follower)
	t.Cleanup(func() {
		require.NoError(t, follower.Close())
		require.NoError(t, leader.Close())
		for _, l := range append(leaderLogs, followerLogs...) {
			l.Close()
		}
	})
	for i, tp := range tps {
		ll, err := log.Open("/p", log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		leaderLogs = append(leaderLogs, ll)
		var fs vfs.FS = vfs.NewMem()
		if i == 0 {
			fs = vfs.NewErrorFS(fs, vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
				if arm.Load() && op.Kind&(vfs.OpWrite|vfs.OpTruncate|vfs.OpSync|vfs.OpPreallocate) != 0 {
					return vfs.Fault{Err: syscall.EIO}
				}
				return vfs.Fault{}
			}))
		}
		fl, err := log.Open("/p", log.Options{FS: fs})
		require.NoError(t, err)
		followerLogs = append(followerLogs, fl)
		require.NoError(t, leader.AddPartition(tp, ll))
		require.NoError(t, follower.AddPartition(tp, fl))
		require.NoError(t, leader.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0}))
	}
	for _, tp := range tps { // in this order: tps[0] first in the fetcher
		require.NoError(t, follower.BecomeFollower(tp, 1, 0))
	}
	return leader, follower, leaderLogs, followerLogs, arm
}

// One partition whose log fails every append (a broken disk under it
// alone) no longer starves a healthy partition of the same leader. The
// broken one is first in the fair order with a batch larger than
// FetchMaxBytes pending, so a fetch that includes it spends the whole
// budget on it; the fetcher used to sleep FetchBackoff after any
// partition failed, by when the broken one's own backoff was over, so it
// was fetched first again, and the healthy one never got a byte. Only the
// failing partition backs off now.
func TestOnePartitionsFailingLogDoesNotStarveTheOthers(t *testing.T) {
	bad := TopicPartition{Topic: "t", Partition: 0}
	good := TopicPartition{Topic: "t", Partition: 1}
	leader, _, leaderLogs, followerLogs, arm := memPairFailingFirst(t,
		Config{FetchMaxBytes: 1024, FetchBackoff: 300 * time.Millisecond}, bad, good)
	arm.Store(true)
	ctx := context.Background()
	_, err := leader.Produce(ctx, bad, testBatch(t, string(bytes.Repeat([]byte("x"), 4096))), AcksLeader)
	require.NoError(t, err)
	// Let the fetcher settle into its cycle (the bad partition failed
	// once, its first backoff is over), then give the healthy one data.
	time.Sleep(time.Second)
	for i := 0; i < 20; i++ {
		_, err := leader.Produce(ctx, good, testBatch(t, "good"), AcksLeader)
		require.NoError(t, err)
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && followerLogs[1].LogEndOffset() < leaderLogs[1].LogEndOffset() {
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, leaderLogs[1].LogEndOffset(), followerLogs[1].LogEndOffset(),
		"healthy partition starved behind one whose appends fail (bad partition's follower log end %d)", followerLogs[0].LogEndOffset())
}
