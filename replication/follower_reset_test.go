package replication

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// TestFollowerRestartsAtALeaderEndBelowItsStart: a follower whose log
// starts (empty, after a deletion) above its new leader's log end gets
// an out-of-range answer. It must restart its log at the leader's end,
// as Kafka's truncateFullyAndStartAt does, and fetch from there: keeping
// its start, it would take the leader's records at that offset on trust
// once the leader's log grew past it, and join the ISR without the ones
// below.
func TestFollowerRestartsAtALeaderEndBelowItsStart(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	appendEpochs(t, leader.log, epochRun{1, 2}) // the leader ends at 2
	appendEpochs(t, f.log, epochRun{1, 5})
	f.log.SetHighWatermark(5)
	require.NoError(t, f.log.DeleteRecordsBefore(5)) // the follower: empty at 5
	both := []int32{0, 1}
	require.NoError(t, leader.node.BecomeLeader(ntp, 2, both, []int32{0}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))

	_, resp := fetchOnce(t, f, leader, ntime)
	require.Equal(t, CodeOffsetOutOfRange, resp.Partitions[0].Error)
	require.Equal(t, [2]int64{2, 2}, [2]int64{f.log.LogStartOffset(), f.log.LogEndOffset()}, "restarted at the leader's end")
	leader.produce(t, 3, AcksLeader) // offsets 2, 3, 4
	for f.log.LogEndOffset() < leader.log.LogEndOffset() {
		fetchOnce(t, f, leader, ntime.Add(time.Second))
	}
	fetchOnce(t, f, leader, ntime.Add(time.Second)) // reports its end: joins the ISR
	require.Equal(t, []int32{0, 1}, leader.isr())
	want, err := leader.log.Read(nil, 2, log.ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	got, err := f.log.Read(nil, 2, log.ReadOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, want, got, "the follower holds the leader's records from its start")
}

// TestFollowerOutOfRangeDoesNotSpin is the same follower run by
// Replicators: its out-of-range reset once changed nothing and was asked
// again at once, keeping both nodes busy (hundreds of thousands of
// fetches in 300 ms). It now restarts at the leader's end and then long
// polls (FetchMaxWait: about 15 fetches in 300 ms; the bound allows a
// loaded machine ten times that, far below a busy loop).
func TestFollowerOutOfRangeDoesNotSpin(t *testing.T) {
	checkGoroutines(t)
	netw := NewMemNetwork(1)
	mk := func(id int32) (*Replicator, *log.Log) {
		l, err := log.Open(t.TempDir(), log.Options{})
		require.NoError(t, err)
		r, err := New(Config{ReplicaID: id, ClusterID: "c", FetchMaxWait: 20 * time.Millisecond,
			FetchBackoff: 100 * time.Millisecond}, netw.Transport(id))
		require.NoError(t, err)
		netw.Register(id, r)
		require.NoError(t, r.AddPartition(ntp, l))
		t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, l.Close()) })
		return r, l
	}
	lr, ll := mk(0)
	fr, fl := mk(1)
	appendEpochs(t, ll, epochRun{1, 2}) // the leader ends at 2
	appendEpochs(t, fl, epochRun{1, 5})
	fl.SetHighWatermark(5)
	require.NoError(t, fl.DeleteRecordsBefore(5)) // the follower is empty at 5
	require.Equal(t, fl.LogStartOffset(), fl.LogEndOffset())
	both := []int32{0, 1}
	require.NoError(t, lr.BecomeLeader(ntp, 2, both, []int32{0}))
	require.NoError(t, fr.BecomeFollower(ntp, 2, 0))
	time.Sleep(300 * time.Millisecond)
	served := lr.Stats().FetchesServed
	t.Logf("fetches served in 300ms: %d", served)
	require.LessOrEqual(t, served, int64(200), "the follower fetches in a busy loop")
	require.Equal(t, int64(2), fl.LogStartOffset(), "restarted at the leader's end")
	require.Equal(t, int64(2), fl.LogEndOffset())
}

// TestFollowerBacksOffWhenAResetChangesNothing: an out-of-range answer
// whose offsets leave nothing to reset (the fetch offset lies within the
// leader's log as the answer reports it: the leader's log changed in
// between) is not fetched again at once but after FetchBackoff.
func TestFollowerBacksOffWhenAResetChangesNothing(t *testing.T) {
	const backoff = 100 * time.Millisecond
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{FetchBackoff: backoff})
	appendEpochs(t, f.log, epochRun{1, 3})
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	req := f.node.BuildFetch(0, ntime)
	require.NotNil(t, req)
	resp := &FetchResponse{Partitions: []FetchPartitionResponse{{TopicPartition: ntp, Error: CodeOffsetOutOfRange,
		HighWatermark: 3, LogStartOffset: 0, LogEndOffset: 5}}}
	_, err := f.node.HandleFetchResponse(leader.id, req, resp, ntime)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 3}, [2]int64{f.log.LogStartOffset(), f.log.LogEndOffset()}, "nothing to reset")
	require.Nil(t, f.node.BuildFetch(0, ntime.Add(backoff-time.Millisecond)), "fetched again before FetchBackoff")
	require.NotNil(t, f.node.BuildFetch(0, ntime.Add(backoff)))
}

// A follower whose fetch offset is below the leader's log start, and
// restarts there (its records gone), counts a truncation in Stats, as one
// past the leader's end does: it used to count only the latter.
func TestTruncationsCountAFetchBelowTheLeadersStart(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	appendEpochs(t, leader.log, epochRun{1, 6})
	leader.log.SetHighWatermark(6)
	require.NoError(t, leader.log.DeleteRecordsBefore(4))
	appendEpochs(t, f.log, epochRun{1, 2}) // the leader's first two records
	require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
	_, resp := fetchOnce(t, f, leader, ntime)
	require.ErrorIs(t, resp.Partitions[0].Error.Err(), ErrOffsetOutOfRange)
	require.Equal(t, int64(4), f.log.LogStartOffset(), "the follower's records 0-1 are gone")
	require.Equal(t, int64(1), f.node.Stats(ntime).Truncations)
}
