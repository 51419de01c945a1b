package replication

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// TestFetchMaxBytesZeroStillSendsTheFirstBatch: FetchRequest.MaxBytes
// promises at least one batch for the first partition with data, also
// when a peer sends 0 or less; else a Replicator holds the fetch for its
// whole wait (no news) and the peer never progresses.
func TestFetchMaxBytesZeroStillSendsTheFirstBatch(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}, ntime))
	leader.produce(t, 2, AcksLeader)
	for _, maxBytes := range []int32{0, -1} {
		req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: maxBytes, Partitions: []FetchPartition{{
			TopicPartition: ntp, CurrentLeaderEpoch: 1, FetchOffset: 0, LastFetchedEpoch: log.NoLeaderEpoch}}}
		resp, err := leader.node.HandleFetch(req, ntime)
		require.NoError(t, err)
		require.Positive(t, resp.Partitions[0].Region.Length, "MaxBytes %d: the first batch must still be returned", maxBytes)
	}
}

// TestFetchLaterPartitionsKeepToMaxBytes: only the first partition with
// data may go past MaxBytes (its first batch, whole); a later partition
// whose first batch does not fit in what is left gets no records.
func TestFetchLaterPartitionsKeepToMaxBytes(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	tp2 := TopicPartition{Topic: "t", Partition: 2}
	l2, err := log.Open("/log2", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l2.Close()) })
	require.NoError(t, leader.node.AddPartition(tp2, l2))
	both := []int32{0, 1}
	big := testBatch(t, strings.Repeat("x", 1000))
	for _, tp := range []TopicPartition{ntp, tp2} {
		require.NoError(t, leader.node.BecomeLeader(tp, 1, both, both, ntime))
		_, _, _, err := leader.node.appendAsLeader(tp, big, AcksLeader, ntime)
		require.NoError(t, err)
	}
	fetch := func(maxBytes int) *FetchResponse {
		req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: int32(maxBytes)}
		for _, tp := range []TopicPartition{ntp, tp2} {
			req.Partitions = append(req.Partitions, FetchPartition{TopicPartition: tp, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch})
		}
		resp, err := leader.node.HandleFetch(req, ntime)
		require.NoError(t, err)
		return resp
	}
	size := int64(len(big))
	for _, c := range []struct{ maxBytes, first, second int64 }{
		{1, size, 0}, {size, size, 0}, {size + size/2, size, 0}, {2 * size, size, size},
	} {
		resp := fetch(int(c.maxBytes))
		got := []int64{resp.Partitions[0].Region.Length, resp.Partitions[1].Region.Length}
		require.Equal(t, []int64{c.first, c.second}, got, "MaxBytes %d", c.maxBytes)
	}
}

// TestTCPTooLargeRequestErrorReportsItsSize: the error for a request over
// MaxRequestBytes names its size (it said 0 bytes).
func TestTCPTooLargeRequestErrorReportsItsSize(t *testing.T) {
	checkGoroutines(t)
	const limit = 8 << 10
	data := testData(1 << 10)
	_, ln := startServer(t, echoHandler(segmentFile(t, data), data, nil), TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxRequestBytes: limit})
	_, err := tr.Fetch(context.Background(), 0, requestOfSize(t, 100, limit+1))
	require.ErrorIs(t, err, ErrFrameTooLarge)
	require.Contains(t, err.Error(), fmt.Sprintf("request of %d bytes", limit+1))
}

// TestAcksAllNotAcknowledgedByRetention: retention on a leader keeps what
// is above the high watermark. It once raised the log start, and with it
// the high watermark, past every follower's log end, which acknowledged a
// waiting acks=all produce of a record no follower ever fetched.
func TestAcksAllNotAcknowledgedByRetention(t *testing.T) {
	checkGoroutines(t)
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem(), SegmentBytes: 1 << 10, RetentionBytes: 1 << 10})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	r, err := New(Config{ReplicaID: 0, ClusterID: "c", MinInsyncReplicas: 2}, idleTransport{})
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	require.NoError(t, r.AddPartition(ntp, l))
	both := []int32{0, 1}
	require.NoError(t, r.BecomeLeader(ntp, 1, both, both)) // follower 1 never fetches
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.Produce(ctx, ntp, testBatch(t, "acked?"), AcksAll)
		done <- err
	}()
	for l.LogEndOffset() == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := range 40 {
		_, err := r.Produce(ctx, ntp, testBatch(t, fmt.Sprintf("%0100d", i)), AcksLeader)
		require.NoError(t, err)
	}
	n, err := l.ApplyRetention() // what the log's flusher does every RetentionCheckInterval
	require.NoError(t, err)
	require.Zero(t, n, "nothing is committed: nothing may go")
	require.ErrorIs(t, l.DeleteRecordsBefore(1), log.ErrOffsetOutOfRange)
	require.Zero(t, l.HighWatermark())
	cancel()
	require.ErrorIs(t, <-done, context.Canceled, "the acks=all produce must not be acknowledged")
}
