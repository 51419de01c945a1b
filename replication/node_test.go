package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// Unit tests of the synchronous protocol core, after Kafka's
// AbstractFetcherThreadTest (testTruncation, testDivergingEpochs) and
// PartitionTest (testMaybeShrinkIsr,
// testHighWatermarkAdvanceShouldNotAdvanceWhenUnderMinISR).

var (
	ntp   = TopicPartition{Topic: "t", Partition: 0}
	ntime = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
)

var errTestRefused = errors.New("test: ISR change refused")

// testReplica is a Node hosting ntp on an in-memory log.
type testReplica struct {
	id         int32
	node       *Node
	log        *log.Log
	refuseISR  bool
	isrChanges [][]int32
}

func newTestReplica(t *testing.T, id int32, cfg Config) *testReplica {
	t.Helper()
	l, err := log.Open("/log", log.Options{FS: vfs.NewMem(), Now: func() time.Time { return ntime }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	r := &testReplica{id: id, log: l}
	cfg.ReplicaID, cfg.ClusterID = id, "c"
	cfg.OnISRChange = func(tp TopicPartition, epoch int32, isr []int32) error {
		if r.refuseISR {
			return errTestRefused
		}
		r.isrChanges = append(r.isrChanges, isr)
		return nil
	}
	r.node, err = NewNode(cfg)
	require.NoError(t, err)
	require.NoError(t, r.node.AddPartition(ntp, l))
	return r
}

func (r *testReplica) isr() []int32 {
	p := r.node.partition(ntp)
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.isr)
}

// testBatch is one batch of the given values with a fixed timestamp, so
// that equal values at equal offsets and epochs give equal bytes.
func testBatch(t *testing.T, values ...string) []byte {
	t.Helper()
	bb := log.NewBatchBuilder()
	for _, v := range values {
		bb.Add(ntime.UnixMilli(), nil, []byte(v))
	}
	b, err := bb.Build(nil)
	require.NoError(t, err)
	return b
}

// produce appends n one-record batches on the leader and does what
// Replicator.Produce does before waiting: fsync, then update the high
// watermark.
func (r *testReplica) produce(t *testing.T, n int, acks Acks) {
	t.Helper()
	r.produceAt(t, n, acks, ntime)
}

// produceAt is produce with the clock at now.
func (r *testReplica) produceAt(t *testing.T, n int, acks Acks, now time.Time) {
	t.Helper()
	for i := 0; i < n; i++ {
		_, p, _, err := r.node.appendAsLeader(ntp, testBatch(t, fmt.Sprintf("p%d-%d", r.log.LogEndOffset(), i)), acks, now)
		require.NoError(t, err)
		require.NoError(t, p.log.Sync())
		p.mu.Lock()
		r.node.maybeAdvanceHW(p, now)
		p.mu.Unlock()
	}
}

// epochRun is n one-record batches written at a leader epoch.
type epochRun struct {
	epoch int32
	n     int
}

// appendEpochs writes runs to l directly; the record at offset o of epoch
// e is "e<e>-o<o>" in every log.
func appendEpochs(t *testing.T, l *log.Log, runs ...epochRun) {
	t.Helper()
	for _, r := range runs {
		for i := 0; i < r.n; i++ {
			_, err := l.AppendAsLeader(testBatch(t, fmt.Sprintf("e%d-o%d", r.epoch, l.LogEndOffset())), r.epoch)
			require.NoError(t, err)
		}
	}
	require.NoError(t, l.Sync())
}

// fetchOnce sends f's next fetch to leader and applies the answer.
func fetchOnce(t *testing.T, f, leader *testReplica, now time.Time) (*FetchRequest, *FetchResponse) {
	t.Helper()
	req, resp := fetchFrom(t, f, leader, now)
	_, err := f.node.HandleFetchResponse(leader.id, req, resp, now)
	require.NoError(t, err)
	return req, resp
}

// fetchFrom builds f's fetch to leader and returns it with leader's
// response, records copied in, not yet applied by f.
func fetchFrom(t *testing.T, f, leader *testReplica, now time.Time) (*FetchRequest, *FetchResponse) {
	t.Helper()
	req := f.node.BuildFetch(leader.id, now)
	require.NotNil(t, req)
	resp, err := leader.node.HandleFetch(req, now)
	require.NoError(t, err)
	require.NoError(t, resp.Materialize())
	return req, resp
}

func requireSameLog(t *testing.T, want, got *log.Log) {
	t.Helper()
	a, err := readAll(want)
	require.NoError(t, err)
	b, err := readAll(got)
	require.NoError(t, err)
	require.Equal(t, want.LogEndOffset(), got.LogEndOffset())
	require.True(t, string(a) == string(b), "logs differ")
}

func cloneRequest(req *FetchRequest) *FetchRequest {
	c := *req
	c.Partitions = slices.Clone(req.Partitions)
	return &c
}

func TestNodeFencesStaleEpochs(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	replicas := []int32{0, 1}
	require.NoError(t, leader.node.BecomeLeader(ntp, 5, replicas, replicas, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 5, 0))

	require.ErrorIs(t, leader.node.BecomeLeader(ntp, 4, replicas, replicas, ntime), ErrStaleEpoch)
	require.ErrorIs(t, leader.node.BecomeFollower(ntp, 4, 1), ErrStaleEpoch)
	require.ErrorIs(t, leader.node.BecomeFollower(ntp, 5, 1), ErrStaleEpoch, "a follower of its own leadership epoch")
	require.ErrorIs(t, f.node.BecomeFollower(ntp, 4, 0), ErrStaleEpoch)
	require.ErrorIs(t, f.node.BecomeLeader(ntp, 4, replicas, replicas, ntime), ErrStaleEpoch)
	require.Equal(t, []int32{0}, f.node.Leaders(), "a refused BecomeLeader must leave the follower fetching")

	leader.produce(t, 3, AcksLeader)
	req := f.node.BuildFetch(0, ntime)
	require.NotNil(t, req)
	cases := []struct {
		name   string
		mutate func(*FetchRequest)
		code   ErrorCode
		err    error
	}{
		{"older epoch", func(r *FetchRequest) { r.Partitions[0].CurrentLeaderEpoch = 4 }, CodeFencedLeaderEpoch, ErrFencedLeaderEpoch},
		{"newer epoch", func(r *FetchRequest) { r.Partitions[0].CurrentLeaderEpoch = 6 }, CodeUnknownLeaderEpoch, ErrUnknownLeaderEpoch},
		{"not a replica", func(r *FetchRequest) { r.ReplicaID = 7 }, CodeNotReplica, ErrNotReplica},
		{"the leader itself", func(r *FetchRequest) { r.ReplicaID = 0 }, CodeNotReplica, ErrNotReplica},
		{"unknown partition", func(r *FetchRequest) { r.Partitions[0].Partition = 9 }, CodeUnknownPartition, ErrUnknownPartition},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := cloneRequest(req)
			tc.mutate(r)
			r.Partitions[0].FetchOffset = 3 // would move the high watermark if it counted
			resp, err := leader.node.HandleFetch(r, ntime)
			require.NoError(t, err)
			require.Len(t, resp.Partitions, 1)
			require.Equal(t, tc.code, resp.Partitions[0].Error)
			require.ErrorIs(t, resp.Partitions[0].Error.Err(), tc.err)
			require.Zero(t, resp.Partitions[0].Region.Length)
			require.Equal(t, int64(0), leader.log.HighWatermark(), "a refused fetch must not count")
		})
	}

	resp, err := f.node.HandleFetch(req, ntime)
	require.NoError(t, err)
	require.ErrorIs(t, resp.Partitions[0].Error.Err(), ErrNotLeader)
	other := cloneRequest(req)
	other.ClusterID = "other"
	_, err = leader.node.HandleFetch(other, ntime)
	require.ErrorIs(t, err, ErrClusterMismatch)

	fetchOnce(t, f, leader, ntime)
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, int64(3), f.log.LogEndOffset())
	require.Equal(t, int64(3), leader.log.HighWatermark())

	// A response to a fetch of the old epoch is not applied once the
	// follower moved to a newer one.
	leader.produce(t, 2, AcksLeader)
	old := f.node.BuildFetch(0, ntime)
	oldResp, err := leader.node.HandleFetch(old, ntime)
	require.NoError(t, err)
	require.NoError(t, oldResp.Materialize())
	require.NotEmpty(t, oldResp.Partitions[0].Records)
	require.NoError(t, f.node.BecomeFollower(ntp, 6, 0))
	n, err := f.node.HandleFetchResponse(0, old, oldResp, ntime)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, int64(3), f.log.LogEndOffset())
}

// KIP-101 (Kafka's testTruncation): a follower truncates to the end of the
// last epoch it shares with the leader, not to its high watermark (0 here).
func TestNodeTruncatesToTheLastCommonEpoch(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	appendEpochs(t, leader.log, epochRun{1, 5}, epochRun{3, 3})
	appendEpochs(t, f.log, epochRun{1, 5}, epochRun{2, 5}) // epoch 2 the leader never had
	require.Equal(t, int64(0), f.log.HighWatermark())
	require.NoError(t, leader.node.BecomeLeader(ntp, 4, []int32{0, 1}, []int32{0}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 4, 0))

	req, resp := fetchOnce(t, f, leader, ntime)
	require.Equal(t, int32(2), req.Partitions[0].LastFetchedEpoch)
	require.Equal(t, &EpochEndOffset{Epoch: 1, EndOffset: 5}, resp.Partitions[0].Diverging)
	require.Equal(t, int64(5), f.log.LogEndOffset())
	require.Equal(t, []log.EpochEntry{{Epoch: 1, StartOffset: 0}}, f.log.LeaderEpochs())

	fetchOnce(t, f, leader, ntime)
	requireSameLog(t, leader.log, f.log)
	require.Equal(t, leader.log.LeaderEpochs()[:2], f.log.LeaderEpochs())
}

// Kafka's testDivergingEpochs and its variants: the follower reaches the
// leader's log, truncating no lower than where the logs diverge.
// newCaughtUpPair returns a leader (node 0, epoch 1) and its follower
// (node 1), which has fetched the leader's first three batches.
func newCaughtUpPair(t *testing.T) (leader, follower *testReplica) {
	t.Helper()
	leader = newTestReplica(t, 0, Config{})
	follower = newTestReplica(t, 1, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}, ntime))
	require.NoError(t, follower.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 3, AcksLeader)
	fetchOnce(t, follower, leader, ntime)
	return leader, follower
}

// TestNodeTruncatesEpochsAboveTheLeaders: a follower whose log ends with
// a batch of an epoch above its leader's (damage: no leader wrote it),
// under a high watermark past it, gets an undefined diverging epoch from
// the leader; truncating to its high watermark alone would change nothing
// and it would ask again forever. It truncates below the batch and
// converges.
func TestNodeTruncatesEpochsAboveTheLeaders(t *testing.T) {
	leader, f := newCaughtUpPair(t)
	_, err := f.log.AppendAsLeader(testBatch(t, "not the leader's"), 9)
	require.NoError(t, err)
	f.log.SetHighWatermark(f.log.LogEndOffset())
	leader.produce(t, 2, AcksLeader)
	_, resp := fetchOnce(t, f, leader, ntime)
	require.Equal(t, &EpochEndOffset{Epoch: log.NoLeaderEpoch, EndOffset: -1}, resp.Partitions[0].Diverging)
	require.Equal(t, int64(3), f.log.LogEndOffset(), "truncated below the epoch-9 batch")
	fetchOnce(t, f, leader, ntime)
	requireSameLog(t, leader.log, f.log)
}

func TestNodeDivergingEpochs(t *testing.T) {
	cases := []struct {
		name             string
		leader, follower []epochRun
		epoch            int32
		diverging        *EpochEndOffset // in the first response
		truncatedTo      int64           // the follower's lowest log end
	}{
		{"follower longer in the same epoch", []epochRun{{1, 6}}, []epochRun{{1, 10}}, 2, &EpochEndOffset{1, 6}, 6},
		{"follower has an epoch the leader never had", []epochRun{{1, 5}, {4, 3}}, []epochRun{{1, 3}, {3, 5}}, 5, &EpochEndOffset{1, 5}, 3},
		// The follower does not know epoch 2: it truncates to the end of
		// its largest earlier epoch and asks again.
		{"follower lacks the leader's epoch", []epochRun{{1, 4}, {2, 3}, {4, 2}}, []epochRun{{1, 4}, {3, 5}}, 5, &EpochEndOffset{2, 7}, 4},
		{"empty follower", []epochRun{{1, 3}, {2, 2}}, nil, 3, nil, 0},
		{"follower behind in the leader's epoch", []epochRun{{1, 3}, {2, 4}}, []epochRun{{1, 3}, {2, 2}}, 3, nil, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leader := newTestReplica(t, 0, Config{})
			f := newTestReplica(t, 1, Config{})
			appendEpochs(t, leader.log, tc.leader...)
			appendEpochs(t, f.log, tc.follower...)
			require.NoError(t, leader.node.BecomeLeader(ntp, tc.epoch, []int32{0, 1}, []int32{0}, ntime))
			require.NoError(t, f.node.BecomeFollower(ntp, tc.epoch, 0))
			lowest := f.log.LogEndOffset()
			for i := 0; i < 6 && f.log.LogEndOffset() != leader.log.LogEndOffset() || i == 0; i++ {
				_, resp := fetchOnce(t, f, leader, ntime)
				if i == 0 {
					require.Equal(t, tc.diverging, resp.Partitions[0].Diverging)
				}
				lowest = min(lowest, f.log.LogEndOffset())
			}
			require.Equal(t, tc.truncatedTo, lowest)
			requireSameLog(t, leader.log, f.log)
			_, resp := fetchOnce(t, f, leader, ntime)
			require.Nil(t, resp.Partitions[0].Diverging, "converged logs must not diverge")
		})
	}
}

// The high watermark is the smallest log end over the ISR, never
// decreases, and readers of either replica never see data above it.
func TestNodeHighWatermarkIsMinOverISR(t *testing.T) {
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2})
	f1 := newTestReplica(t, 1, Config{})
	f2 := newTestReplica(t, 2, Config{FetchMaxBytes: 1}) // one batch per fetch
	all := []int32{0, 1, 2}
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, all, all, ntime))
	require.NoError(t, f1.node.BecomeFollower(ntp, 1, 0))
	require.NoError(t, f2.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 6, AcksAll)
	require.Equal(t, int64(0), leader.log.HighWatermark(), "no follower has fetched")

	fetchOnce(t, f1, leader, ntime)
	fetchOnce(t, f1, leader, ntime)
	require.Equal(t, int64(6), f1.log.LogEndOffset())
	require.Equal(t, int64(0), leader.log.HighWatermark(), "f2 in the ISR has not fetched")

	var firstReq *FetchRequest
	for i := int64(0); i < 6; i++ {
		req, _ := fetchOnce(t, f2, leader, ntime)
		if firstReq == nil {
			firstReq = req
		}
		require.Equal(t, i, leader.log.HighWatermark(), "min(6, 6, %d)", i)
		require.Equal(t, i+1, f2.log.LogEndOffset())
		require.LessOrEqual(t, f2.log.HighWatermark(), f2.log.LogEndOffset())
	}
	fetchOnce(t, f2, leader, ntime)
	require.Equal(t, int64(6), leader.log.HighWatermark())

	// A delayed request with f2's first fetch offset does not lower it.
	resp, err := leader.node.HandleFetch(firstReq, ntime)
	require.NoError(t, err)
	require.Equal(t, CodeNone, resp.Partitions[0].Error)
	require.Equal(t, int64(6), leader.log.HighWatermark())
	require.Equal(t, int64(6), resp.Partitions[0].HighWatermark)

	// Readers up to the high watermark see nothing above it.
	leader.produce(t, 2, AcksAll)
	for _, r := range []*testReplica{leader, f1} {
		data, err := r.log.Read(nil, 0, log.ReadOptions{UpToHighWatermark: true})
		require.NoError(t, err)
		var next int64
		for rest := data; len(rest) > 0; {
			b, tail, err := log.SplitBatch(rest)
			require.NoError(t, err)
			next, rest = b.NextOffset(), tail
		}
		require.LessOrEqual(t, next, r.log.HighWatermark())
	}
	require.Equal(t, int64(6), leader.log.HighWatermark())
}

// PartitionTest.testHighWatermarkAdvanceShouldNotAdvanceWhenUnderMinISR.
func TestNodeHighWatermarkDoesNotAdvanceUnderMinISR(t *testing.T) {
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2, ReplicaLagTime: 10 * time.Second})
	f := newTestReplica(t, 1, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 3, AcksAll)
	fetchOnce(t, f, leader, ntime)
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, int64(3), leader.log.HighWatermark())

	// f stops fetching, falls behind and leaves the ISR; the leader alone
	// is below MinInsyncReplicas and its own durable end does not move the
	// HW.
	leader.produce(t, 4, AcksLeader)
	leader.node.Tick(ntime.Add(11 * time.Second))
	require.Equal(t, []int32{0}, leader.isr())
	require.Equal(t, int64(7), leader.log.DurableOffset())
	require.Equal(t, int64(3), leader.log.HighWatermark())
	leader.node.Tick(ntime.Add(12 * time.Second))
	require.Equal(t, int64(3), leader.log.HighWatermark())

	// f catches up and rejoins: the HW moves again.
	now := ntime.Add(13 * time.Second)
	fetchOnce(t, f, leader, now)
	require.Equal(t, []int32{0, 1}, leader.isr())
	fetchOnce(t, f, leader, now)
	require.Equal(t, int64(7), leader.log.HighWatermark())
}

// PartitionTest.testMaybeShrinkIsr, and expansion on catch-up.
func TestNodeISRShrinksAfterLagAndExpandsOnCatchUp(t *testing.T) {
	lag := 10 * time.Second
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 1, ReplicaLagTime: lag})
	f1 := newTestReplica(t, 1, Config{})
	f2 := newTestReplica(t, 2, Config{FetchMaxBytes: 1})
	all := []int32{0, 1, 2}
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, all, all, ntime))
	require.NoError(t, f1.node.BecomeFollower(ntp, 1, 0))
	require.NoError(t, f2.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 4, AcksLeader)

	fetchOnce(t, f1, leader, ntime.Add(time.Second))
	fetchOnce(t, f1, leader, ntime.Add(2*time.Second)) // caught up at 2 s
	// f2 fetches often but never reaches the leader's log end.
	fetchOnce(t, f2, leader, ntime.Add(time.Second))
	leader.produce(t, 4, AcksLeader)
	fetchOnce(t, f2, leader, ntime.Add(5*time.Second))
	leader.node.Tick(ntime.Add(lag))
	require.Equal(t, all, leader.isr(), "nobody lags by more than %v yet", lag)

	fetchOnce(t, f1, leader, ntime.Add(9*time.Second)) // caught up again
	fetchOnce(t, f1, leader, ntime.Add(9*time.Second))
	fetchOnce(t, f2, leader, ntime.Add(11*time.Second))
	leader.node.Tick(ntime.Add(lag + 2*time.Second))
	require.Equal(t, []int32{0, 1}, leader.isr())
	require.Equal(t, [][]int32{{0, 1}}, leader.isrChanges)
	hw := leader.log.HighWatermark()
	require.Equal(t, int64(8), hw, "the HW no longer waits for f2")

	// f2 rejoins once it reaches the high watermark.
	now := ntime.Add(13 * time.Second)
	for f2.log.LogEndOffset() < hw {
		require.Equal(t, []int32{0, 1}, leader.isr())
		fetchOnce(t, f2, leader, now)
	}
	fetchOnce(t, f2, leader, now)
	require.Equal(t, all, leader.isr())
	require.Equal(t, [][]int32{{0, 1}, {0, 1, 2}}, leader.isrChanges)
}

// A follower whose log end is the leader's stays in the ISR however long
// ago it fetched, as in Kafka (Replica.isCaughtUp): on an idle partition
// the leader holds its fetches (regression: with ReplicaLagTime below
// FetchMaxWait, a live caught-up follower left the ISR and rejoined on
// every long poll). Once it is behind, the lag time counts again.
func TestNodeCaughtUpFollowerStaysInTheISR(t *testing.T) {
	lag := 10 * time.Second
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2, ReplicaLagTime: lag})
	f := newTestReplica(t, 1, Config{})
	both := []int32{0, 1}
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, both, both, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 2, AcksAll)
	fetchOnce(t, f, leader, ntime)
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, int64(2), leader.log.HighWatermark())

	leader.node.Tick(ntime.Add(time.Hour))
	require.Equal(t, both, leader.isr(), "f is at the leader's log end")
	require.Empty(t, leader.isrChanges)

	leader.produce(t, 1, AcksAll)
	leader.node.Tick(ntime.Add(time.Hour + time.Second))
	require.Equal(t, []int32{0}, leader.isr(), "f is behind, and last caught up an hour ago")
}

// FetchMaxWait must be shorter than ReplicaLagTime, as Kafka requires;
// its default is, whatever ReplicaLagTime.
func TestConfigFetchMaxWaitBelowReplicaLagTime(t *testing.T) {
	for _, c := range []struct {
		lag, wait time.Duration
		ok        bool
	}{
		{0, 0, true},
		{100 * time.Millisecond, 0, true}, // the default wait is below the lag
		{time.Second, 999 * time.Millisecond, true},
		{time.Second, time.Second, false},
		{100 * time.Millisecond, 400 * time.Millisecond, false},
		{0, time.Minute, false}, // the default lag is 30 s
	} {
		n, err := NewNode(Config{ReplicaLagTime: c.lag, FetchMaxWait: c.wait})
		if !c.ok {
			require.Error(t, err, "lag %v, wait %v", c.lag, c.wait)
			continue
		}
		require.NoError(t, err, "lag %v, wait %v", c.lag, c.wait)
		require.Less(t, n.cfg.FetchMaxWait, n.cfg.ReplicaLagTime)
	}
}

// TestConfigOutOfRangeNamesTheField: a Config out of range was refused
// as "replication: invalid config", naming nothing.
func TestConfigOutOfRangeNamesTheField(t *testing.T) {
	for field, c := range map[string]Config{
		"ReplicaID":         {ReplicaID: -1},
		"MinInsyncReplicas": {MinInsyncReplicas: -1},
		"ReplicaLagTime":    {ReplicaLagTime: -time.Second},
		"FetchMaxBytes":     {FetchMaxBytes: -1},
		"FetchMaxWait":      {FetchMaxWait: -time.Second},
		"FetchBackoff":      {FetchBackoff: -time.Second},
	} {
		_, err := NewNode(c)
		require.ErrorIs(t, err, ErrInvalidConfig, field)
		require.ErrorContains(t, err, "Config."+field+" ")
		_, err = New(c, idleTransport{})
		require.ErrorIs(t, err, ErrInvalidConfig, field)
	}
	_, err := NewNode(Config{ReplicaLagTime: time.Second, FetchMaxWait: time.Second})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// A follower rejoins only from the current leader epoch's start offset
// on, not merely from the high watermark.
func TestNodeISRExpansionWaitsForTheEpochStart(t *testing.T) {
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2}) // keeps the HW at 0
	f := newTestReplica(t, 1, Config{FetchMaxBytes: 1})
	appendEpochs(t, leader.log, epochRun{1, 4})
	require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0}, ntime))
	require.Equal(t, int64(0), leader.log.HighWatermark())
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
	for f.log.LogEndOffset() < 4 {
		fetchOnce(t, f, leader, ntime)
		require.Equal(t, []int32{0}, leader.isr(), "f at %d is below the epoch start 4", f.log.LogEndOffset())
	}
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, []int32{0, 1}, leader.isr())
}

func TestNodeISRChangeRefused(t *testing.T) {
	lag := 10 * time.Second
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 1, ReplicaLagTime: lag})
	f := newTestReplica(t, 1, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 2, AcksLeader)

	leader.refuseISR = true
	leader.node.Tick(ntime.Add(lag + time.Second))
	require.Equal(t, []int32{0, 1}, leader.isr(), "a refused shrink is not applied")
	require.Equal(t, int64(0), leader.log.HighWatermark(), "the HW still waits for f")

	leader.refuseISR = false
	leader.node.Tick(ntime.Add(lag + 2*time.Second))
	require.Equal(t, []int32{0}, leader.isr())
	require.Equal(t, int64(2), leader.log.HighWatermark())

	leader.refuseISR = true
	now := ntime.Add(lag + 3*time.Second)
	fetchOnce(t, f, leader, now)
	fetchOnce(t, f, leader, now)
	require.Equal(t, []int32{0}, leader.isr(), "a refused expansion is not applied")
	leader.refuseISR = false
	fetchOnce(t, f, leader, now)
	require.Equal(t, []int32{0, 1}, leader.isr())
	require.Equal(t, [][]int32{{0}, {0, 1}}, leader.isrChanges)
}

func TestNodeOffsetOutOfRange(t *testing.T) {
	t.Run("fetch offset above the leader's end", func(t *testing.T) {
		leader := newTestReplica(t, 0, Config{})
		f := newTestReplica(t, 1, Config{})
		appendEpochs(t, leader.log, epochRun{log.NoLeaderEpoch, 5})
		appendEpochs(t, f.log, epochRun{log.NoLeaderEpoch, 8}) // no epochs: no divergence check
		require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0}, ntime))
		require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
		_, resp := fetchOnce(t, f, leader, ntime)
		require.ErrorIs(t, resp.Partitions[0].Error.Err(), ErrOffsetOutOfRange)
		require.Equal(t, int64(5), f.log.LogEndOffset())
		fetchOnce(t, f, leader, ntime)
		require.Equal(t, []int32{0, 1}, leader.isr())
	})
	t.Run("fetch offset below the leader's start", func(t *testing.T) {
		leader := newTestReplica(t, 0, Config{})
		f := newTestReplica(t, 1, Config{})
		appendEpochs(t, leader.log, epochRun{1, 6})
		leader.log.SetHighWatermark(6) // committed under epoch 1
		require.NoError(t, leader.log.DeleteRecordsBefore(4))
		require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0}, ntime))
		require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
		_, resp := fetchOnce(t, f, leader, ntime)
		require.ErrorIs(t, resp.Partitions[0].Error.Err(), ErrOffsetOutOfRange)
		require.Equal(t, int64(4), f.log.LogStartOffset())
		require.Equal(t, int64(4), f.log.LogEndOffset())
		fetchOnce(t, f, leader, ntime)
		require.Equal(t, int64(6), f.log.LogEndOffset())
		a, err := leader.log.Read(nil, 4, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		b, err := f.log.Read(nil, 4, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		require.Equal(t, a, b)
	})
	t.Run("leader's start inside a batch", func(t *testing.T) {
		// Kafka's follower restarts its empty log at the batch holding
		// the leader's start, then moves its start up to the leader's
		// (at once here: the leader's high watermark is its end).
		leader := newTestReplica(t, 0, Config{})
		f := newTestReplica(t, 1, Config{})
		for range 3 {
			_, err := leader.log.AppendAsLeader(testBatch(t, "a", "b", "c"), 1)
			require.NoError(t, err)
		}
		leader.log.SetHighWatermark(9)                        // committed under epoch 1
		require.NoError(t, leader.log.DeleteRecordsBefore(4)) // inside [3, 5]
		require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0}, ntime))
		require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
		_, resp := fetchOnce(t, f, leader, ntime)
		require.ErrorIs(t, resp.Partitions[0].Error.Err(), ErrOffsetOutOfRange)
		require.Equal(t, int64(4), f.log.LogEndOffset())
		fetchOnce(t, f, leader, ntime) // [3, 5] and [6, 8]
		require.Equal(t, int64(4), f.log.LogStartOffset())
		require.Equal(t, int64(9), f.log.LogEndOffset())
		a, err := leader.log.Read(nil, 4, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		b, err := f.log.Read(nil, 4, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		require.Equal(t, a, b)
	})
	t.Run("follower's records below the leader's start are not the leader's", func(t *testing.T) {
		// The leader deleted its epoch 2 batch [0, 1] from offset 1 on, so
		// it cannot tell that the follower's epoch 1 batch [0, 0] is not
		// its own: the fetch at 1 is answered with [0, 1], and the
		// follower, whose records all lie below the leader's start,
		// restarts at that batch.
		leader := newTestReplica(t, 0, Config{})
		f := newTestReplica(t, 1, Config{})
		_, err := leader.log.AppendAsLeader(testBatch(t, "a", "b"), 2)
		require.NoError(t, err)
		_, err = leader.log.AppendAsLeader(testBatch(t, "c"), 2)
		require.NoError(t, err)
		leader.log.SetHighWatermark(3) // committed under epoch 2
		require.NoError(t, leader.log.DeleteRecordsBefore(1))
		_, err = f.log.AppendAsLeader(testBatch(t, "x"), 1)
		require.NoError(t, err)
		require.NoError(t, leader.node.BecomeLeader(ntp, 3, []int32{0, 1}, []int32{0}, ntime))
		require.NoError(t, f.node.BecomeFollower(ntp, 3, 0))
		fetchOnce(t, f, leader, ntime)
		require.Equal(t, int64(1), f.log.LogStartOffset())
		require.Equal(t, int64(3), f.log.LogEndOffset())
		a, err := leader.log.Read(nil, 1, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		b, err := f.log.Read(nil, 1, log.ReadOptions{MaxBytes: 1 << 20})
		require.NoError(t, err)
		require.Equal(t, a, b)
	})
}

// TestNodeFollowerFollowsTheLeadersLogStart: records the leader deleted
// are deleted on its follower too (as Kafka's follower does), so that
// they do not come back when the follower leads.
func TestNodeFollowerFollowsTheLeadersLogStart(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	leader.produce(t, 6, AcksAll)
	fetchOnce(t, f, leader, ntime) // the records
	fetchOnce(t, f, leader, ntime) // their offsets: the high watermark passes them
	require.Equal(t, int64(0), f.log.LogStartOffset())
	require.NoError(t, leader.log.DeleteRecordsBefore(2))
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, int64(2), f.log.LogStartOffset())
	require.Equal(t, int64(6), f.log.LogEndOffset())

	// The follower got the records up to 8, the high watermark passed
	// them, and the leader then deleted those below 7.
	leader.produce(t, 2, AcksAll)
	fetchOnce(t, f, leader, ntime)
	fetchOnce(t, f, leader, ntime)
	require.NoError(t, leader.log.DeleteRecordsBefore(7))
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, int64(7), f.log.LogStartOffset())
	require.Equal(t, int64(8), f.log.LogEndOffset())

	// The follower now leads: the deleted records stay deleted.
	require.NoError(t, f.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{1}, ntime))
	_, err := f.log.Read(nil, 6, log.ReadOptions{MaxBytes: 1 << 20})
	require.ErrorIs(t, err, log.ErrOffsetOutOfRange)
}

func TestNodeAcksAllNotEnoughReplicas(t *testing.T) {
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0}, ntime))
	_, _, _, err := leader.node.appendAsLeader(ntp, testBatch(t, "a"), AcksAll, ntime)
	require.ErrorIs(t, err, ErrNotEnoughReplicas)
	require.Equal(t, int64(0), leader.log.LogEndOffset(), "a refused acks=all append writes nothing")
	info, _, _, err := leader.node.appendAsLeader(ntp, testBatch(t, "b"), AcksLeader, ntime)
	require.NoError(t, err)
	require.Equal(t, int64(0), info.FirstOffset)

	f := newTestReplica(t, 1, Config{})
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))
	_, _, _, err = f.node.appendAsLeader(ntp, testBatch(t, "c"), AcksAll, ntime)
	require.ErrorIs(t, err, ErrNotLeader)
}

// Acks other than AcksNone, AcksLeader and AcksAll are refused, and
// append nothing (regression: they were taken as AcksLeader).
func TestNodeInvalidAcksRefused(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0}, []int32{0}, ntime))
	for _, acks := range []Acks{-2, 2, 127} {
		_, _, _, err := leader.node.appendAsLeader(ntp, testBatch(t, "a"), acks, ntime)
		require.ErrorIs(t, err, ErrInvalidAcks, "acks %d", acks)
	}
	require.Zero(t, leader.log.LogEndOffset())
}

// A node that led an epoch without appending follows the next leader,
// whose log holds older epochs' batches, to the same log and epoch cache,
// and can lead again (regression: it used to send its empty epoch as its
// last fetched epoch and never caught up, then kept an epoch cache that
// contradicted its batches).
func TestNodeLeaderWithoutAppendsFollowsOlderEpochs(t *testing.T) {
	a := newTestReplica(t, 0, Config{})
	b := newTestReplica(t, 1, Config{})
	appendEpochs(t, a.log, epochRun{1, 2})
	appendEpochs(t, b.log, epochRun{1, 4})
	both := []int32{0, 1}
	require.NoError(t, a.node.BecomeLeader(ntp, 2, both, both, ntime)) // and loses it at once
	require.NoError(t, b.node.BecomeLeader(ntp, 3, both, both, ntime))
	require.NoError(t, a.node.BecomeFollower(ntp, 3, 1))
	for i := 0; i < 3 && a.log.LogEndOffset() < b.log.LogEndOffset(); i++ {
		fetchOnce(t, a, b, ntime)
	}
	requireSameLog(t, b.log, a.log)
	require.Equal(t, []log.EpochEntry{{Epoch: 1, StartOffset: 0}}, a.log.LeaderEpochs())

	require.NoError(t, a.node.BecomeLeader(ntp, 4, both, both, ntime))
	require.NoError(t, b.node.BecomeFollower(ntp, 4, 0))
	a.produce(t, 1, AcksLeader)
	_, resp := fetchOnce(t, b, a, ntime)
	require.Nil(t, resp.Partitions[0].Diverging)
	requireSameLog(t, a.log, b.log)
}

// A delayed response to a fetch made before a truncation is not applied
// after the follower refetched back to the same log end (regression: it
// truncated the follower again, below what the leader had counted).
func TestNodeStaleResponseAfterTruncationIgnored(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	appendEpochs(t, leader.log, epochRun{1, 2}, epochRun{2, 3})
	appendEpochs(t, f.log, epochRun{1, 5})
	require.NoError(t, leader.node.BecomeLeader(ntp, 3, []int32{0, 1}, []int32{0, 1}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 3, 0))
	old, oldResp := fetchOnce(t, f, leader, ntime)
	require.NotNil(t, oldResp.Partitions[0].Diverging)
	require.Equal(t, int64(2), f.log.LogEndOffset())
	fetchOnce(t, f, leader, ntime)
	require.Equal(t, old.Partitions[0].FetchOffset, f.log.LogEndOffset(), "back at the old fetch offset")
	n, err := f.node.HandleFetchResponse(0, old, oldResp, ntime)
	require.NoError(t, err)
	require.Zero(t, n)
	requireSameLog(t, leader.log, f.log)
}

// A leader that loses its leadership before its produce fsynced reports
// only durable offsets as a follower (regression: its unsynced end
// counted toward the new leader's high watermark).
func TestNodeFormerLeaderFetchesFromItsDurableEnd(t *testing.T) {
	a := newTestReplica(t, 0, Config{MinInsyncReplicas: 2})
	b := newTestReplica(t, 1, Config{})
	both := []int32{0, 1}
	require.NoError(t, a.node.BecomeLeader(ntp, 1, both, both, ntime))
	require.NoError(t, b.node.BecomeFollower(ntp, 1, 0))
	_, _, _, err := a.node.appendAsLeader(ntp, testBatch(t, "x"), AcksAll, ntime) // its fsync has not run yet
	require.NoError(t, err)
	fetchOnce(t, b, a, ntime)
	require.Equal(t, int64(1), b.log.LogEndOffset())
	require.Equal(t, int64(0), a.log.DurableOffset())

	require.NoError(t, b.node.BecomeLeader(ntp, 2, both, both, ntime))
	require.NoError(t, a.node.BecomeFollower(ntp, 2, 1))
	req, _ := fetchOnce(t, a, b, ntime)
	require.Equal(t, int64(1), req.Partitions[0].FetchOffset)
	require.Equal(t, int64(1), a.log.DurableOffset(), "a fetch offset that counts must be durable")
	require.Equal(t, int64(1), b.log.HighWatermark())
}

// syncGate blocks the first fsync of a segment file once armed, until
// released.
type syncGate struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *syncGate) Inject(op vfs.Op) vfs.Fault {
	if op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, ".log") && g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
	return vfs.Fault{}
}

// newGatedLeader returns a Replicator leading ntp at epoch 1 with ISR
// {0, 1} on a log whose fsyncs gate can hold, and release, which lets a
// held fsync go (once; the test's cleanup calls it too, before Close
// waits for the fsync).
func newGatedLeader(t *testing.T) (*Replicator, *log.Log, *syncGate, func()) {
	t.Helper()
	gate := &syncGate{entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gate.release) }) }
	l, err := log.Open("/log", log.Options{FS: vfs.NewErrorFS(vfs.NewMem(), gate)})
	require.NoError(t, err)
	r, err := New(Config{ReplicaID: 0, ClusterID: "c", MinInsyncReplicas: 2}, idleTransport{})
	require.NoError(t, err)
	t.Cleanup(func() {
		release()
		require.NoError(t, r.Close())
		require.NoError(t, l.Close())
	})
	require.NoError(t, r.AddPartition(ntp, l))
	both := []int32{0, 1}
	require.NoError(t, r.BecomeLeader(ntp, 1, both, both))
	return r, l, gate, release
}

// awaitGoroutineIn waits until a goroutine's stack holds fn.
func awaitGoroutineIn(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); runtime.Gosched() {
		if bytes.Contains(buf[:runtime.Stack(buf, true)], []byte(fn)) {
			return
		}
	}
	t.Fatalf("no goroutine ever ran %s", fn)
}

type idleTransport struct{}

func (idleTransport) Fetch(ctx context.Context, _ int32, _ *FetchRequest) (*FetchResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// An acks=all Produce whose leader becomes a follower before the high
// watermark passed its batch must fail even if, as a follower, the log's
// high watermark then passes that offset: the new leader's records lie
// there. Deterministic: the Produce's fsync is held while the node
// becomes a follower and its truncation starts; the truncation's cut
// waits for that fsync (the log serializes a segment's fsyncs), which is
// then released; the follower refetches the new leader's record at the
// Produce's offset.
func TestProduceFailsWhenLeadershipIsLostBeforeTheHighWatermark(t *testing.T) {
	r, l, gate, release := newGatedLeader(t)
	both := []int32{0, 1}

	type result struct {
		info log.AppendInfo
		err  error
	}
	done := make(chan result, 1)
	gate.armed.Store(true)
	go func() {
		info, err := r.Produce(context.Background(), ntp, testBatch(t, "R"), AcksAll)
		done <- result{info, err}
	}()
	<-gate.entered // R is at offset 0, its fsync held

	b := newTestReplica(t, 1, Config{MinInsyncReplicas: 1})
	require.NoError(t, b.node.BecomeLeader(ntp, 2, both, []int32{1}, ntime))
	_, p, _, err := b.node.appendAsLeader(ntp, testBatch(t, "R2"), AcksLeader, ntime)
	require.NoError(t, err)
	require.NoError(t, b.log.Sync())
	p.mu.Lock()
	b.node.maybeAdvanceHW(p, ntime)
	p.mu.Unlock()
	require.Equal(t, int64(1), b.log.HighWatermark())

	node := r.Node()
	require.NoError(t, node.BecomeFollower(ntp, 2, 1))
	apply := func(fetchOffset int64, lastEpoch int32) error {
		req := &FetchRequest{ClusterID: "c", ReplicaID: 0, MaxBytes: 1 << 20, Partitions: []FetchPartition{{
			TopicPartition: ntp, CurrentLeaderEpoch: 2, FetchOffset: fetchOffset, LastFetchedEpoch: lastEpoch}}}
		resp, err := b.node.HandleFetch(req, ntime)
		if err == nil {
			err = resp.Materialize()
		}
		if err == nil {
			_, err = node.HandleFetchResponse(1, req, resp, ntime)
		}
		return err
	}
	truncated := make(chan error, 1)
	go func() { truncated <- apply(1, 1) }()          // diverging: truncate R away
	awaitGoroutineIn(t, "log.(*Log).syncCutSegment(") // the cut waits for R's fsync
	release()
	require.NoError(t, <-truncated)
	require.Equal(t, int64(0), l.LogEndOffset())
	require.NoError(t, apply(0, log.NoLeaderEpoch)) // appends R2
	res := <-done
	require.Equal(t, int64(0), res.info.LastOffset)
	require.Equal(t, int64(1), l.HighWatermark(), "the follower's high watermark passed offset 0")
	require.ErrorIs(t, res.err, ErrNotLeader, "offset 0 holds the new leader's record, not the produced one")
	data, err := l.Read(nil, 0, log.ReadOptions{})
	require.NoError(t, err)
	b0, _, err := log.SplitBatch(data)
	require.NoError(t, err)
	it := b0.Records()
	require.True(t, it.Next())
	require.Equal(t, "R2", string(it.Record().Value))
}

// A repeated BecomeLeader of the current epoch (a controller's retry, or
// a delayed copy) keeps the ISR persisted since through OnISRChange
// (regression: it reinstated the ISR it carried, including a follower
// that had left it and lacked the data below the high watermark).
func TestNodeRepeatedBecomeLeaderKeepsTheISR(t *testing.T) {
	lag := 10 * time.Second
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 2, ReplicaLagTime: lag})
	f1 := newTestReplica(t, 1, Config{})
	all := []int32{0, 1, 2}
	require.NoError(t, leader.node.BecomeLeader(ntp, 3, all, all, ntime))
	require.NoError(t, f1.node.BecomeFollower(ntp, 3, 0))
	leader.produce(t, 2, AcksAll)
	now := ntime.Add(lag + time.Second)
	fetchOnce(t, f1, leader, now)
	fetchOnce(t, f1, leader, now)
	require.Equal(t, int64(0), leader.log.HighWatermark(), "node 2 never fetched")
	leader.node.Tick(now)
	require.Equal(t, []int32{0, 1}, leader.isr())
	require.Equal(t, int64(2), leader.log.HighWatermark())

	require.NoError(t, leader.node.BecomeLeader(ntp, 3, all, all, now))
	require.Equal(t, []int32{0, 1}, leader.isr())
	leader.produce(t, 1, AcksAll)
	fetchOnce(t, f1, leader, now)
	fetchOnce(t, f1, leader, now)
	require.Equal(t, int64(3), leader.log.HighWatermark(), "the leader kept its followers' state")
}

func TestNextAppendChunk(t *testing.T) {
	a, b, c := testBatch(t, "a"), testBatch(t, "bb"), testBatch(t, "ccc")
	all := slices.Concat(a, b, c)
	chunk, rest := nextAppendChunk(all, len(a)+len(b))
	require.Equal(t, slices.Concat(a, b), chunk)
	require.Equal(t, c, rest)
	chunk, rest = nextAppendChunk(all, 1) // at least one batch
	require.Equal(t, a, chunk)
	require.Equal(t, slices.Concat(b, c), rest)
	chunk, rest = nextAppendChunk(all, len(all))
	require.Equal(t, all, chunk)
	require.Empty(t, rest)
	// Bytes that do not frame end the chunk before them, then make one
	// of their own for the log to refuse.
	bad := slices.Concat(a, []byte{1, 2, 3})
	chunk, rest = nextAppendChunk(bad, len(bad))
	require.Equal(t, a, chunk)
	chunk, rest = nextAppendChunk(rest, len(bad))
	require.Equal(t, []byte{1, 2, 3}, chunk)
	require.Empty(t, rest)
	// A batch more than 2^31 offsets past the chunk's first starts the
	// next chunk: the log holds one call's batches in one segment.
	near, far := slices.Clone(b), slices.Clone(c)
	binary.BigEndian.PutUint64(near, 1) // the base offset, first in a batch
	binary.BigEndian.PutUint64(far, 1+math.MaxInt32)
	chunk, rest = nextAppendChunk(slices.Concat(a, near, far), len(all))
	require.Equal(t, slices.Concat(a, near), chunk)
	require.Equal(t, far, rest)
}

func TestSkipBelow(t *testing.T) {
	at := func(base int64) []byte { // a one-record batch at base
		b := testBatch(t, "v")
		binary.BigEndian.PutUint64(b, uint64(base))
		return b
	}
	b3, b4, b5, b9 := at(3), at(4), at(5), at(9)
	require.Equal(t, slices.Concat(b4, b5), skipBelow(slices.Concat(b3, b4, b5), 4), "the batch below the offset goes")
	require.Empty(t, skipBelow(slices.Concat(b3, b4), 5), "all below")
	require.Equal(t, slices.Concat(b3, b9), skipBelow(slices.Concat(b3, b9), 4),
		"kept when what follows leaves a gap at the offset: the log refuses it")
	require.Equal(t, b9, skipBelow(b9, 4), "a gap without anything below is a compacted leader's")
}

// A response larger than followerAppendChunkBytes is appended in pieces
// of whole batches: the follower ends equal to the leader, and a corrupt
// batch late in a response keeps the pieces before it, which the next
// fetch continues after.
func TestNodeAppendsLargeResponsesInChunks(t *testing.T) {
	leader := newTestReplica(t, 0, Config{})
	f := newTestReplica(t, 1, Config{})
	value := strings.Repeat("v", 16<<10)
	const batches = 3 * followerAppendChunkBytes / (16 << 10)
	for i := range batches {
		_, err := leader.log.AppendAsLeader(testBatch(t, fmt.Sprintf("%d-%s", i, value)), 1)
		require.NoError(t, err)
	}
	require.NoError(t, leader.log.Sync())
	require.NoError(t, leader.node.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0, 1}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 1, 0))

	req, resp := fetchFrom(t, f, leader, ntime)
	records := resp.Partitions[0].Records
	require.Greater(t, len(records), 2*followerAppendChunkBytes)
	// Corrupt a record byte of the last batch (covered by its CRC).
	records[len(records)-1] ^= 0xff
	n, err := f.node.HandleFetchResponse(0, req, resp, ntime)
	require.ErrorIs(t, err, log.ErrCorrupt)
	require.Positive(t, n)
	require.Less(t, f.log.LogEndOffset(), leader.log.LogEndOffset())
	got, err := readAll(f.log)
	require.NoError(t, err)
	require.Len(t, got, int(n))
	require.Equal(t, records[:n], got, "whole leading batches of the response")

	// The next fetch reports the end of what was appended.
	p := f.node.partition(ntp)
	p.mu.Lock()
	p.backoffUntil = time.Time{}
	p.mu.Unlock()
	end := f.log.LogEndOffset()
	for f.log.LogEndOffset() < leader.log.LogEndOffset() {
		req, _ := fetchOnce(t, f, leader, ntime)
		require.Equal(t, end, req.Partitions[0].FetchOffset)
		end = f.log.LogEndOffset()
	}
	requireSameLog(t, leader.log, f.log)
}

// A response applied in pieces stops at a role change or a log change
// between pieces: later pieces and the high watermark are not applied.
func TestNodeResponseApplierStopsWhenTheLogChangesMidResponse(t *testing.T) {
	for _, change := range []string{"role", "truncate"} {
		t.Run(change, func(t *testing.T) {
			leader := newTestReplica(t, 0, Config{})
			f := newTestReplica(t, 1, Config{})
			appendEpochs(t, leader.log, epochRun{1, 6})
			require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0, 1}, ntime))
			require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
			req, resp := fetchFrom(t, f, leader, ntime)
			pr := &resp.Partitions[0]
			pr.HighWatermark = 6
			half := 0
			for range 3 {
				b, _, err := log.SplitBatch(pr.Records[half:])
				require.NoError(t, err)
				half += len(b)
			}

			a := f.node.newResponseApplier(0, req, func() time.Time { return ntime })
			a.beginPartition(0, pr)
			a.records(pr.Records[:half])
			require.Equal(t, int64(3), f.log.LogEndOffset())
			switch change {
			case "role":
				require.NoError(t, f.node.BecomeFollower(ntp, 3, 0))
			case "truncate":
				require.NoError(t, f.log.TruncateTo(1))
			}
			leo := f.log.LogEndOffset()
			a.records(pr.Records[half:])
			a.endPartition()
			n, err := a.finish(true)
			require.NoError(t, err)
			require.Equal(t, int64(half), n, "only the first piece")
			require.Equal(t, leo, f.log.LogEndOffset())
			require.Less(t, f.log.HighWatermark(), int64(6))
		})
	}
}

// A response to a fetch the follower has since sent again (the first
// timed out) is not applied: the leader may have answered the newer
// request from a newer state and counted its offset. Here the leader
// answers the first with a divergence, then deletes the records that
// showed it; the second, identical request then finds none. The follower
// does not join the ISR yet: its log starts below the leader's, on a
// record the leader never had. Once it applied the second answer (and the
// leader's log start), the next fetch makes it a member. Truncating by the
// late first answer would have moved it below the high watermark, with
// records the leader no longer has to send back.
func TestNodeOnlyTheNewestFetchsResponseApplies(t *testing.T) {
	leader := newTestReplica(t, 0, Config{MinInsyncReplicas: 1})
	f := newTestReplica(t, 1, Config{})
	appendEpochs(t, f.log, epochRun{epoch: 1, n: 1}) // never the leader's
	require.NoError(t, leader.node.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0}, ntime))
	require.NoError(t, f.node.BecomeFollower(ntp, 2, 0))
	leader.produce(t, 1, AcksLeader)
	require.Equal(t, int64(1), leader.log.HighWatermark())

	first := f.node.BuildFetch(0, ntime)
	firstResp, err := leader.node.HandleFetch(first, ntime)
	require.NoError(t, err)
	require.NotNil(t, firstResp.Partitions[0].Diverging)
	require.NoError(t, leader.log.DeleteRecordsBefore(1))
	second := f.node.BuildFetch(0, ntime)
	require.Equal(t, first.Partitions, second.Partitions, "the same request, sent again")
	secondResp, err := leader.node.HandleFetch(second, ntime)
	require.NoError(t, err)
	require.Nil(t, secondResp.Partitions[0].Diverging, "the epochs that showed it are deleted")
	require.Equal(t, []int32{0}, leader.isr(), "a follower whose log starts below the leader's does not join")

	_, err = f.node.HandleFetchResponse(0, first, firstResp, ntime)
	require.NoError(t, err)
	require.Equal(t, int64(1), f.log.LogEndOffset(), "the late divergence is not applied")
	_, err = f.node.HandleFetchResponse(0, second, secondResp, ntime)
	require.NoError(t, err)
	require.Equal(t, int64(1), f.log.LogStartOffset(), "the follower follows the leader's log start")
	require.Equal(t, int64(1), f.log.HighWatermark())
	_, err = leader.node.HandleFetch(f.node.BuildFetch(0, ntime), ntime)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, leader.isr(), "joins once its log starts at the leader's")
}
