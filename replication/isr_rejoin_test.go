package replication

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFollowerRejoinsTheISRUnderSteadyProduce: with the ISR down to the
// leader (MinInsyncReplicas 1) and a producer appending between the
// follower's fetches, the follower is caught up at every fetch (it gets
// all the leader had at its previous one), yet its fetch offset stays one
// append below a high watermark that follows the leader alone. Kafka
// (Partition.maybeIncrementLeaderHW) holds the high watermark at a
// caught-up follower out of the ISR so that it can join again; without
// that it never does while producers write.
func TestFollowerRejoinsTheISRUnderSteadyProduce(t *testing.T) {
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 1, ReplicaLagTime: 10 * time.Second})
	f := newTestReplica(t, 1, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	now := ntime
	for range 5 {
		now = now.Add(100 * time.Millisecond)
		leader.produceAt(t, 1, AcksLeader, now)
		fetchOnce(t, f, leader, now)
	}
	require.Equal(t, []int32{0, 1}, leader.isr(), "a caught-up follower must join the ISR again")
}

// leaderWithFollowerOutOfTheISR returns node 0 leading at epoch 1 with
// MinInsyncReplicas 2 and ReplicaLagTime lag, replicas {0, 1, 2} and ISR
// {0, 1}, and its followers 1 and 2 (2 with f2cfg).
func leaderWithFollowerOutOfTheISR(t *testing.T, lag time.Duration, f2cfg Config) (leader, f1, f2 *testReplica) {
	t.Helper()
	leader = newTestReplica(t, 0, Config{MinInsyncReplicas: 2, ReplicaLagTime: lag})
	f1, f2 = newTestReplica(t, 1, Config{}), newTestReplica(t, 2, f2cfg)
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1, 2}, []int32{0, 1}, ntime))
	require.NoError(t, f1.node.BecomeFollower(ntp, 1, 0))
	require.NoError(t, f2.node.BecomeFollower(ntp, 1, 0))
	return leader, f1, f2
}

// TestFollowerOutOfTheISRHoldsTheHighWatermarkOnlyWhileCaughtUp: a
// follower that could join the ISR but is kept out of it (the
// application refuses the change here) holds the high watermark at its
// log end while it is caught up, and no longer once ReplicaLagTime passed
// without it fetching: a follower that stopped must not stall acks=all
// for good.
func TestFollowerOutOfTheISRHoldsTheHighWatermarkOnlyWhileCaughtUp(t *testing.T) {
	const lag = 10 * time.Second
	leader, f1, f2 := leaderWithFollowerOutOfTheISR(t, lag, Config{})
	leader.refuseISR = true
	now := ntime.Add(time.Second)
	leader.produceAt(t, 2, AcksLeader, now)
	for range 2 { // both get the batches, then report them: caught up
		fetchOnce(t, f1, leader, now)
		fetchOnce(t, f2, leader, now)
	}
	require.Equal(t, []int32{0, 1}, leader.isr())
	held := f2.log.LogEndOffset()
	require.Equal(t, held, leader.log.HighWatermark())

	leader.produceAt(t, 3, AcksLeader, now) // f2 fetches no more
	for range 2 {
		fetchOnce(t, f1, leader, now)
	}
	require.Equal(t, leader.log.LogEndOffset(), f1.log.LogEndOffset())
	require.Equal(t, held, leader.log.HighWatermark(), "the caught-up follower out of the ISR holds the high watermark")

	now = now.Add(lag + time.Second)
	leader.node.Tick(now)
	require.Equal(t, leader.log.LogEndOffset(), leader.log.HighWatermark(), "the follower stopped for longer than ReplicaLagTime still holds the high watermark")
}

// TestFollowerBehindOutOfTheISRDoesNotHoldTheHighWatermark: a follower
// out of the ISR that is not caught up (it fetches a batch at a time far
// behind the leader) does not hold the high watermark: the ISR's
// acks=all must not wait for a follower rebuilding its log.
func TestFollowerBehindOutOfTheISRDoesNotHoldTheHighWatermark(t *testing.T) {
	leader, f1, f2 := leaderWithFollowerOutOfTheISR(t, 10*time.Second, Config{FetchMaxBytes: 1})
	now := ntime.Add(time.Second)
	leader.produceAt(t, 20, AcksLeader, now)
	for range 2 {
		fetchOnce(t, f1, leader, now)
	}
	require.Equal(t, int64(20), leader.log.HighWatermark())
	for range 3 {
		fetchOnce(t, f2, leader, now) // a batch at a time
	}
	leader.produceAt(t, 5, AcksLeader, now)
	for range 2 {
		fetchOnce(t, f1, leader, now)
	}
	require.Equal(t, []int32{0, 1}, leader.isr())
	require.Less(t, f2.log.LogEndOffset(), int64(20))
	require.Equal(t, int64(25), leader.log.HighWatermark(), "a follower far behind, out of the ISR, holds the high watermark")
}

// TestFollowerStartingBelowTheLeaderDoesNotHoldTheHighWatermark: a
// caught-up follower out of the ISR whose log starts below the leader's
// cannot join the ISR (its records below the leader's start cannot be
// checked), so it does not hold the high watermark either.
func TestFollowerStartingBelowTheLeaderDoesNotHoldTheHighWatermark(t *testing.T) {
	leader, f1, f2 := leaderWithFollowerOutOfTheISR(t, 10*time.Second, Config{})
	now := ntime.Add(time.Second)
	leader.produceAt(t, 4, AcksLeader, now)
	for range 2 {
		fetchOnce(t, f1, leader, now)
	}
	require.NoError(t, leader.log.DeleteRecordsBefore(2))
	// f2 reports a log start of 0, below the leader's 2.
	fetchLowStart := func() {
		req := f2.node.BuildFetch(leader.id, now)
		req.Partitions[0].LogStartOffset = 0
		resp, err := leader.node.HandleFetch(req, now)
		require.NoError(t, err)
		require.NoError(t, resp.Materialize())
		_, err = f2.node.HandleFetchResponse(leader.id, req, resp, now)
		require.NoError(t, err)
	}
	for range 3 { // out of range (restarts at 2), the batches, their report
		fetchLowStart()
	}
	require.Equal(t, []int32{0, 1}, leader.isr())
	leader.produceAt(t, 1, AcksLeader, now)
	for range 2 {
		fetchOnce(t, f1, leader, now)
	}
	require.Equal(t, int64(4), f2.log.LogEndOffset())
	require.Equal(t, int64(5), leader.log.HighWatermark(), "a follower that cannot join the ISR holds the high watermark")
}

// TestFollowerJoiningOnItsFirstFetchStaysInTheISR: a follower out of the
// ISR at the role change has never caught up; when it joins on its first
// fetch (at the high watermark and the epoch start, below the log end) it
// must have the grace of an ISR member, not be dropped at the next Tick
// as never caught up, which would also refuse acks=all again.
func TestFollowerJoiningOnItsFirstFetchStaysInTheISR(t *testing.T) {
	const lag = 10 * time.Second
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2, ReplicaLagTime: lag})
	f := newTestReplica(t, 1, Config{})
	both := []int32{0, 1}
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, both, both, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 2, AcksLeader)
	for range 2 {
		fetchOnce(t, f, leader, ntime)
	}
	require.Equal(t, int64(2), leader.log.HighWatermark())

	t1 := ntime.Add(time.Minute)
	require.NoError(t, leader.node.BecomeLeader(ntp, 2, both, []int32{0}, t1))
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
	leader.produceAt(t, 1, AcksLeader, t1) // log end 3, high watermark 2 (ISR below the minimum)
	fetchOnce(t, f, leader, t1.Add(10*time.Millisecond))
	require.Equal(t, both, leader.isr(), "joins on its first fetch: at the high watermark and the epoch start")
	leader.node.Tick(t1.Add(20 * time.Millisecond)) // before its next fetch
	require.Equal(t, both, leader.isr(), "dropped at the next Tick")
}

// A follower that reports a log start past its own log end (its fetch
// offset), which no log has, cannot join the ISR by it: the log start
// is what tells the leader that the follower's records below its own
// start need no check.
func TestFollowerReportingALogStartPastItsEndDoesNotJoin(t *testing.T) {
	leader, f1, f2 := leaderWithFollowerOutOfTheISR(t, 10*time.Second, Config{})
	now := ntime.Add(time.Second)
	leader.produceAt(t, 4, AcksLeader, now)
	for range 2 {
		fetchOnce(t, f1, leader, now)
	}
	req := f2.node.BuildFetch(leader.id, now)
	fp := &req.Partitions[0]
	fp.FetchOffset, fp.LastFetchedEpoch, fp.LogStartOffset = leader.log.LogEndOffset(), 1, leader.log.LogEndOffset()+100
	_, err := leader.node.HandleFetch(req, now)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, leader.isr())

	fp.LogStartOffset = fp.FetchOffset // an empty log's start is its end
	_, err = leader.node.HandleFetch(req, now)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1, 2}, leader.isr())
}
