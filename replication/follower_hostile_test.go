package replication

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// caughtUpPair returns a leader (id 1, epoch 5) and a follower (id 2)
// whose logs hold the same 10 one-record batches, high watermark 10 on
// both.
func caughtUpPair(t *testing.T) (leader, f *testReplica) {
	t.Helper()
	both := []int32{1, 2}
	leader, f = newTestReplica(t, 1, Config{}), newTestReplica(t, 2, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 5, both, both, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 1))
	leader.produce(t, 10, AcksLeader)
	for range 3 {
		fetchOnce(t, f, leader, ntime)
	}
	require.Equal(t, int64(10), f.log.LogEndOffset())
	require.Equal(t, int64(10), f.log.HighWatermark())
	return leader, f
}

// batchAt is a batch of n records with its base offset and leader epoch
// set to base and epoch (both lie outside the CRC, as on the wire).
func batchAt(t *testing.T, base int64, epoch int32, n int) []byte {
	t.Helper()
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprintf("hostile-%d-%d", base, i)
	}
	b := testBatch(t, vals...)
	binary.BigEndian.PutUint64(b[0:8], uint64(base))
	binary.BigEndian.PutUint32(b[12:16], uint32(epoch))
	_, _, err := log.SplitBatch(b)
	require.NoError(t, err)
	return b
}

// followerLogState is what a test compares of a follower's log before
// and after a response.
type followerLogState struct {
	start, end int64
	epochs     []log.EpochEntry
	data       []byte
}

func followerState(t *testing.T, l *log.Log) followerLogState {
	return followerLogState{l.LogStartOffset(), l.LogEndOffset(), l.LeaderEpochs(), readAllBatches(t, l)}
}

// answer applies a response of parts to the follower's next fetch from
// its leader (id 1) and returns the error and whether the follower would
// fetch again at once.
func answer(t *testing.T, f *testReplica, parts ...FetchPartitionResponse) (err error, refetchAtOnce bool) {
	t.Helper()
	req := f.node.BuildFetch(1, ntime)
	require.NotNil(t, req)
	_, err = f.node.HandleFetchResponse(1, req, &FetchResponse{Partitions: parts}, ntime)
	return err, f.node.BuildFetch(1, ntime) != nil
}

// A response whose log start lies above the fetch offset cannot carry
// records (a leader answers such a fetch with OffsetOutOfRange). With a
// batch straddling the follower's log end (its base offset damaged), the
// follower took it for a restart at the leader's start and deleted its
// log, committed records included.
func TestFollowerKeepsItsLogWhenTheLeadersStartIsAboveTheFetch(t *testing.T) {
	_, f := caughtUpPair(t)
	before := followerState(t, f.log)
	err, refetch := answer(t, f, FetchPartitionResponse{TopicPartition: ntp,
		HighWatermark: 10, LogStartOffset: 1000, LogEndOffset: 12, Records: batchAt(t, 8, 5, 4)})
	require.Error(t, err)
	require.False(t, refetch, "backs off")
	require.Equal(t, before, followerState(t, f.log))
}

// A batch of a leader epoch above the leader's (the epoch is outside the
// CRC) was appended: the log then held epoch 99, and this node could lead
// no epoch up to it after a failover. Batches before it are appended.
func TestFollowerRefusesABatchOfAnEpochAboveTheLeaders(t *testing.T) {
	_, f := caughtUpPair(t)
	before := followerState(t, f.log)
	err, refetch := answer(t, f, FetchPartitionResponse{TopicPartition: ntp,
		HighWatermark: 10, LogStartOffset: 0, LogEndOffset: 11, Records: batchAt(t, 10, 99, 1)})
	require.ErrorIs(t, err, ErrMalformedFrame)
	require.False(t, refetch, "backs off")
	require.Equal(t, before, followerState(t, f.log))
	require.NoError(t, f.node.BecomeLeader(ntp, 6, []int32{1, 2}, []int32{1, 2}, ntime))
	_, _, _, err = f.node.appendAsLeader(ntp, testBatch(t, "after failover"), AcksLeader, ntime)
	require.NoError(t, err, "a new leader at epoch 6 takes produces")

	_, f = caughtUpPair(t)
	good := batchAt(t, 10, 5, 2)
	err, _ = answer(t, f, FetchPartitionResponse{TopicPartition: ntp,
		HighWatermark: 10, LogStartOffset: 0, LogEndOffset: 13, Records: append(bytes.Clone(good), batchAt(t, 12, 6, 1)...)})
	require.ErrorIs(t, err, ErrMalformedFrame)
	require.Equal(t, int64(12), f.log.LogEndOffset(), "the batch of the leader's epoch before it is appended")
	require.Equal(t, int32(5), f.log.LatestEpoch())
}

// A divergence at or past the follower's log end cuts nothing; the
// follower fetched again at once, and a leader answering the same kept
// both busy.
func TestFollowerBacksOffADivergenceThatCutsNothing(t *testing.T) {
	for _, d := range []EpochEndOffset{{Epoch: 5, EndOffset: 1 << 40}, {Epoch: 7, EndOffset: 10}} {
		_, f := caughtUpPair(t)
		_, refetch := answer(t, f, FetchPartitionResponse{TopicPartition: ntp,
			HighWatermark: 10, LogStartOffset: 0, LogEndOffset: 10, Diverging: &d})
		require.Equal(t, int64(10), f.log.LogEndOffset())
		require.False(t, refetch, "divergence %+v: backs off", d)
	}
}

// A response that does not answer the request as a leader does (every
// partition asked for, in order, and records from the batch holding the
// fetch offset) was ignored: no error, no backoff, and the fetcher asked
// again at once, forever.
func TestFollowerRefusesAResponseThatDoesNotAnswerItsFetch(t *testing.T) {
	other := TopicPartition{Topic: "not-asked", Partition: 3}
	ours := FetchPartitionResponse{TopicPartition: ntp, HighWatermark: 10, LogEndOffset: 10}
	cases := map[string][]FetchPartitionResponse{
		"not asked":          {{TopicPartition: other, HighWatermark: 5, LogEndOffset: 5}},
		"twice":              {ours, ours},
		"none":               {},
		"another, then ours": {{TopicPartition: other}, ours},
		"records below the fetch offset": {{TopicPartition: ntp, HighWatermark: 10, LogEndOffset: 11,
			Records: batchAt(t, 4, 5, 1)}},
	}
	for name, parts := range cases {
		t.Run(name, func(t *testing.T) {
			_, f := caughtUpPair(t)
			before := followerState(t, f.log)
			err, _ := answer(t, f, parts...)
			require.ErrorIs(t, err, ErrMalformedFrame)
			require.Equal(t, before, followerState(t, f.log))
		})
	}
}
