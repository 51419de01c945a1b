package replication

import (
	"context"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// partitionStats returns r's stats of ntp.
func (r *testReplica) partitionStats(t *testing.T, now time.Time) (Stats, PartitionStats) {
	t.Helper()
	st := r.node.Stats(now)
	require.Equal(t, now, st.At)
	require.Len(t, st.Partitions, 1)
	require.Equal(t, ntp, st.Partitions[0].TopicPartition)
	return st, st.Partitions[0]
}

// logBytes is the size of l's batches.
func logBytes(t *testing.T, l *log.Log) int64 {
	t.Helper()
	b, err := l.Read(nil, l.LogStartOffset(), log.ReadOptions{MaxBytes: 1 << 30})
	require.NoError(t, err)
	return int64(len(b))
}

// TestNodeStats follows a leader and two followers, one of them outside
// the ISR and fetching a batch at a time, through the figures each
// node's Stats reports: roles, offsets, what the leader knows of each
// follower, each follower's lag behind its leader, and the counters.
func TestNodeStats(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f1 := newTestReplica(t, 1, Config{})
	f2 := newTestReplica(t, 2, Config{FetchMaxBytes: 1}) // one batch per fetch
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1, 2}, []int32{0, 1}, ntime))
	require.NoError(t, f1.node.BecomeFollower(ntp, 1, 0))
	require.NoError(t, f2.node.BecomeFollower(ntp, 1, 0))

	_, ps := leader.partitionStats(t, ntime)
	require.Equal(t, RoleLeader, ps.Role)
	require.Equal(t, "leader", ps.Role.String())
	require.Equal(t, int32(1), ps.Epoch)
	require.Equal(t, int32(0), ps.Leader)
	require.Equal(t, []int32{0, 1, 2}, ps.Replicas)
	require.Equal(t, []int32{0, 1}, ps.ISR)
	require.Equal(t, []FollowerStats{
		{ReplicaID: 1, LogEndOffset: -1, Lag: -1, LastCaughtUp: ntime, InSync: true},
		{ReplicaID: 2, LogEndOffset: -1, Lag: -1}, // out of the ISR: never caught up yet
	}, ps.Followers)
	require.Equal(t, int64(-1), ps.Lag, "a leader has no lag of its own")
	_, ps = f1.partitionStats(t, ntime)
	require.Equal(t, PartitionStats{TopicPartition: ntp, Role: RoleFollower, Epoch: 1, Leader: 0,
		LeaderLogEndOffset: -1, Lag: -1}, ps, "nothing fetched yet")

	leader.produce(t, 4, AcksLeader)
	batchBytes := logBytes(t, leader.log)
	t1, t2 := ntime.Add(time.Second), ntime.Add(2*time.Second)
	fetchOnce(t, f1, leader, t1) // gets the 4 batches
	fetchOnce(t, f1, leader, t2) // reports them: caught up
	fetchOnce(t, f2, leader, t2) // gets 1 batch
	leader.produce(t, 3, AcksLeader)

	st, ps := leader.partitionStats(t, t2)
	require.Equal(t, int64(7), ps.LogEndOffset)
	require.Equal(t, int64(4), ps.HighWatermark, "min over the ISR {0, 1}")
	require.Equal(t, []FollowerStats{
		{ReplicaID: 1, LogEndOffset: 4, Lag: 3, LastFetch: t2, LastCaughtUp: t2, InSync: true},
		{ReplicaID: 2, LogEndOffset: 0, Lag: 7, LastFetch: t2},
	}, ps.Followers)
	require.Equal(t, int64(3), ps.Fetches)
	require.Equal(t, st.BytesServed, ps.Bytes)
	require.Greater(t, ps.Bytes, batchBytes, "4 batches to f1, 1 to f2")
	require.Equal(t, int64(3), st.FetchesServed)
	require.Zero(t, st.FetchesApplied)
	require.Zero(t, st.ISRChanges)

	st, ps = f1.partitionStats(t, t2)
	require.Equal(t, int64(4), ps.LogEndOffset)
	require.Equal(t, int64(4), ps.HighWatermark)
	require.Equal(t, int64(4), ps.LeaderLogEndOffset, "as of the last response")
	require.Zero(t, ps.Lag)
	require.Equal(t, int64(2), ps.Fetches)
	require.Equal(t, batchBytes, ps.Bytes)
	require.Equal(t, Stats{At: t2, FetchesApplied: 2, BytesFetched: batchBytes, Partitions: []PartitionStats{ps}}, st)

	_, ps = f2.partitionStats(t, t2)
	require.Equal(t, int64(1), ps.LogEndOffset)
	require.Equal(t, int64(4), ps.LeaderLogEndOffset)
	require.Equal(t, int64(3), ps.Lag)

	// f2 catches up batch by batch and joins the ISR.
	t3 := ntime.Add(3 * time.Second)
	for f2.log.LogEndOffset() < leader.log.LogEndOffset() {
		fetchOnce(t, f2, leader, t3)
		_, ps = f2.partitionStats(t, t3)
		require.Equal(t, int64(7), ps.LeaderLogEndOffset)
		require.Equal(t, 7-f2.log.LogEndOffset(), ps.Lag)
	}
	fetchOnce(t, f2, leader, t3)
	st, ps = leader.partitionStats(t, t3)
	require.Equal(t, []int32{0, 1, 2}, ps.ISR)
	require.Equal(t, FollowerStats{ReplicaID: 2, LogEndOffset: 7, Lag: 0, LastFetch: t3, LastCaughtUp: t3, InSync: true}, ps.Followers[1])
	require.Equal(t, int64(1), st.ISRChanges)
	require.Equal(t, int64(len(leader.isrChanges)), st.ISRChanges)
	require.Equal(t, logBytes(t, leader.log)+batchBytes, st.BytesServed, "every batch once to f2, the first 4 to f1")
	require.Zero(t, st.Truncations)

	// A role change: f1 becomes leader at epoch 2, the old leader
	// follows it and truncates nothing (same log prefix), and no longer
	// knows the old figures of its followers.
	require.NoError(t, leader.node.BecomeFollower(ntp, 2, 1))
	_, ps = leader.partitionStats(t, t3)
	require.Equal(t, RoleFollower, ps.Role)
	require.Equal(t, int32(1), ps.Leader)
	require.Nil(t, ps.Followers)
	require.Nil(t, ps.ISR)
	require.Equal(t, int64(-1), ps.LeaderLogEndOffset, "nothing heard from the new leader yet")
}

// TestNodeStatsSortsPartitions: every hosted partition is reported, by
// topic then partition, with no role until one is given.
func TestNodeStatsSortsPartitions(t *testing.T) {
	n, err := NewNode(Config{ReplicaID: 5, ClusterID: "c"})
	require.NoError(t, err)
	tps := []TopicPartition{{"b", 0}, {"a", 10}, {"a", 2}}
	for _, tp := range tps {
		l, err := log.Open("/"+tp.String(), log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		require.NoError(t, n.AddPartition(tp, l))
	}
	st := n.Stats(ntime)
	var got []TopicPartition
	for _, ps := range st.Partitions {
		got = append(got, ps.TopicPartition)
		require.Equal(t, RoleNone, ps.Role)
		require.Equal(t, "none", ps.Role.String())
		require.Equal(t, int32(-1), ps.Leader)
	}
	require.Equal(t, []TopicPartition{{"a", 2}, {"a", 10}, {"b", 0}}, got)
	require.Equal(t, "follower", RoleFollower.String())
	require.Equal(t, "Role(9)", Role(9).String())
}

// TestReplicatorStatsCountAHeldFetchOnce: a long-polled fetch is
// answered anew each time data arrives on the node, here first for a
// partition it does not ask for; Stats counts the answer sent, once.
func TestReplicatorStatsCountAHeldFetchOnce(t *testing.T) {
	r, err := New(Config{ReplicaID: 0, ClusterID: "c", FetchMaxWait: time.Minute, ReplicaLagTime: time.Hour}, idleTransport{})
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	a, b := TopicPartition{Topic: "a"}, TopicPartition{Topic: "b"}
	for _, tp := range []TopicPartition{a, b} {
		l, err := log.Open("/"+tp.String(), log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		require.NoError(t, r.AddPartition(tp, l))
		require.NoError(t, r.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0}))
	}
	ctx := context.Background()
	done := make(chan *FetchResponse, 1)
	go func() {
		resp, err := r.HandleFetch(ctx, &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: 60_000,
			Partitions: []FetchPartition{{TopicPartition: a, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}})
		assert.NoError(t, err)
		done <- resp
	}()
	// Wait until the fetch is held: the leader has seen follower 1.
	require.Eventually(t, func() bool {
		return r.Stats().Partitions[0].Followers[0].LogEndOffset == 0
	}, 10*time.Second, time.Millisecond)
	_, err = r.Produce(ctx, b, testBatch(t, "b0"), AcksLeader)
	require.NoError(t, err)
	_, err = r.Produce(ctx, a, testBatch(t, "a0"), AcksLeader)
	require.NoError(t, err)
	resp := <-done
	require.Len(t, resp.Partitions, 1)
	require.Positive(t, resp.Partitions[0].Region.Length)

	st := r.Stats()
	require.Equal(t, int64(1), st.FetchesServed)
	require.Equal(t, resp.Partitions[0].Region.Length, st.BytesServed)
	require.Equal(t, []TopicPartition{a, b}, []TopicPartition{st.Partitions[0].TopicPartition, st.Partitions[1].TopicPartition})
	require.Equal(t, int64(1), st.Partitions[0].Fetches)
	require.Equal(t, st.BytesServed, st.Partitions[0].Bytes)
	require.Zero(t, st.Partitions[1].Fetches)
}

// failingStream is a streaming Transport whose leader is unreachable.
type failingStream struct{ calls atomic.Int64 }

func (f *failingStream) Fetch(context.Context, int32, *FetchRequest) (*FetchResponse, error) {
	return nil, ErrUnreachable
}

func (f *failingStream) fetchStream(_ context.Context, _ int32, _ *FetchRequest, buf []byte, _ fetchSink) ([]byte, error) {
	f.calls.Add(1)
	return buf, ErrUnreachable
}

// A streamed fetch that failed is not a response applied (regression:
// over TCP, Stats.FetchesApplied counted every fetch sent).
func TestReplicatorStatsCountOnlyAppliedStreamedFetches(t *testing.T) {
	tr := &failingStream{}
	r, err := New(Config{ReplicaID: 0, ClusterID: "c", FetchBackoff: time.Millisecond}, tr)
	require.NoError(t, err)
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeFollower(ntp, 1, 1))
	require.Eventually(t, func() bool { return tr.calls.Load() >= 3 }, 10*time.Second, time.Millisecond)
	require.NoError(t, r.Close())
	st := r.Stats()
	require.Zero(t, st.FetchesApplied)
	require.Zero(t, st.Partitions[0].Fetches)
}

// A streamed response cut inside a partition's records leaves the whole
// batches that arrived appended, and they count in the node's
// BytesFetched as in the partition's Bytes: the node total used to be
// added up only when a partition's records ended.
func TestStatsCountTheBytesOfAStreamCutMidPartition(t *testing.T) {
	checkGoroutines(t)
	tp := TopicPartition{Topic: "t", Partition: 0}
	src, err := log.Open(t.TempDir(), log.Options{}) // the leader's log: 40 batches of 16 KiB
	require.NoError(t, err)
	defer src.Close()
	batch := batchOfSize(t, 16<<10)
	for range 40 {
		_, err := src.AppendAsLeader(slices.Clone(batch), 1)
		require.NoError(t, err)
	}
	records, err := src.Read(nil, 0, log.ReadOptions{MaxBytes: 1 << 30})
	require.NoError(t, err)
	// The first request gets the records with their last 8 KiB cut (the
	// connection then closes); later ones are never answered.
	var served atomic.Bool
	ln := serveRaw(t, func(c net.Conn) {
		var hdr [frameHeaderSize]byte
		for {
			h, err := readFrameHeader(c, &hdr, DefaultMaxFrameBytes)
			if err != nil {
				return
			}
			if _, err := readBody(c, h.bodyLen, nil, 0); err != nil || served.Swap(true) {
				continue
			}
			frame, err := appendFetchResponseFrame(nil, h.corr, &FetchResponse{Partitions: []FetchPartitionResponse{{
				TopicPartition: tp, LogEndOffset: src.LogEndOffset(), Records: records}}})
			if err == nil {
				_, _ = c.Write(frame[:len(frame)-8<<10])
			}
			return
		}
	})

	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	defer l.Close()
	tr, err := NewTCPTransport(TCPOptions{Resolve: func(int32) (string, error) { return ln.Addr().String(), nil }})
	require.NoError(t, err)
	defer tr.Close()
	r, err := New(Config{ReplicaID: 1, ClusterID: "c", FetchMaxWait: 50 * time.Millisecond, FetchBackoff: 10 * time.Millisecond}, tr)
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.AddPartition(tp, l))
	require.NoError(t, r.BecomeFollower(tp, 1, 0))
	require.Eventually(t, func() bool { return l.LogEndOffset() == 39*16 }, 5*time.Second, time.Millisecond,
		"the 39 whole batches that arrived are appended")
	time.Sleep(100 * time.Millisecond) // the fetcher has moved on
	st := r.Stats()
	require.Equal(t, logBytes(t, l), st.Partitions[0].Bytes, "partition Bytes")
	require.Equal(t, logBytes(t, l), st.BytesFetched, "node BytesFetched")
}
