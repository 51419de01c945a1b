package replication

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// newHoldLeader returns a Replicator (node 0) leading partitions tps at
// epoch 1 with replicas {0, 1} and ISR isr, on in-memory logs, holding
// fetches up to hold. onISR, if set, is called from OnISRChange.
func newHoldLeader(t *testing.T, hold time.Duration, isr []int32, onISR func(TopicPartition), tps ...TopicPartition) (*Replicator, map[TopicPartition]*log.Log) {
	t.Helper()
	cfg := Config{ReplicaID: 0, ClusterID: "c", FetchMaxWait: hold, ReplicaLagTime: 30 * time.Second}
	cfg.OnISRChange = func(tp TopicPartition, _ int32, _ []int32) error {
		if onISR != nil {
			onISR(tp)
		}
		return nil
	}
	r, err := New(cfg, NewMemNetwork(1).Transport(0))
	require.NoError(t, err)
	logs := map[TopicPartition]*log.Log{}
	for _, tp := range tps {
		l, err := log.Open("/log", log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		require.NoError(t, r.AddPartition(tp, l))
		require.NoError(t, r.BecomeLeader(tp, 1, []int32{0, 1}, isr))
		logs[tp] = l
	}
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		for _, l := range logs {
			require.NoError(t, l.Close())
		}
	})
	return r, logs
}

// TestHeldFetchSeesDataProducedWhileItWasComputed: the wake-up channel must
// be taken before the answer is computed, else data produced while the
// answer is being computed (after that partition was looked at) is not seen
// until the hold ends: a lost wake-up that delays replication, and acks=all
// produces, by up to FetchMaxWait.
//
// Here the fetch asks for partitions b then a; a's ISR expands during the
// fetch, and the OnISRChange callback waits while another goroutine
// produces to b, which the answer has already found empty. The held fetch
// must be woken by that produce and answer with b's records at once.
func TestHeldFetchSeesDataProducedWhileItWasComputed(t *testing.T) {
	a, b := TopicPartition{Topic: "t", Partition: 0}, TopicPartition{Topic: "t", Partition: 1}
	const hold = 2 * time.Second
	var r *Replicator
	produced := make(chan error, 1)
	once := false
	onISR := func(tp TopicPartition) {
		if tp != a || once {
			return
		}
		once = true
		go func() {
			_, err := r.Produce(context.Background(), b, testBatch(t, "produced while the fetch was computed"), AcksLeader)
			produced <- err
		}()
		require.NoError(t, <-produced) // b's lock is free: the fetch holds a's
	}
	r, _ = newHoldLeader(t, hold, []int32{0}, onISR, a, b)

	req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: int32(hold / time.Millisecond),
		Partitions: []FetchPartition{
			{TopicPartition: b, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch},
			{TopicPartition: a, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch},
		}}
	start := time.Now()
	resp, err := r.HandleFetch(context.Background(), req)
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.True(t, once, "a's ISR expanded during the fetch")
	require.Len(t, resp.Partitions, 2)
	require.Positive(t, resp.Partitions[0].Region.Length, "b's records produced during the fetch")
	require.Less(t, elapsed, hold/2, "the produce must wake the held fetch")
}

// TestDivergingFetchIsNotHeld: a fetch whose answer is a diverging epoch is
// news, answered at once, not held until FetchMaxWait (each round of a
// follower's truncation would otherwise cost a whole hold).
func TestDivergingFetchIsNotHeld(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	const hold = 2 * time.Second
	r, logs := newHoldLeader(t, hold, []int32{0}, nil, tp)
	_, err := r.Produce(context.Background(), tp, testBatch(t, "x"), AcksLeader)
	require.NoError(t, err)
	require.Equal(t, int64(1), logs[tp].LogEndOffset())

	// The follower claims 5 records of epoch 1; the leader has 1.
	req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: int32(hold / time.Millisecond),
		Partitions: []FetchPartition{{TopicPartition: tp, CurrentLeaderEpoch: 1, FetchOffset: 5, LastFetchedEpoch: 1}}}
	start := time.Now()
	resp, err := r.HandleFetch(context.Background(), req)
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, &EpochEndOffset{Epoch: 1, EndOffset: 1}, resp.Partitions[0].Diverging)
	require.Less(t, elapsed, hold/2, "a divergence must be answered at once")
}

// TestHeldFetchAnsweredWhenLeadershipEnds: a follower's fetch held by an
// idle leader is answered at once, with the partition's error, when this
// node stops leading it. Only BecomeLeader at a newer epoch woke held
// fetches: after BecomeFollower, StopPartition or RemovePartition the
// fetch waited out its hold and was then answered with the answer
// computed while this node still led, no error and no data.
func TestHeldFetchAnsweredWhenLeadershipEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(r *Replicator)
	}{
		{"BecomeLeader", func(r *Replicator) { require.NoError(t, r.BecomeLeader(ntp, 2, []int32{0, 1}, []int32{0, 1})) }},
		{"BecomeFollower", func(r *Replicator) { require.NoError(t, r.BecomeFollower(ntp, 2, 2)) }},
		{"StopPartition", func(r *Replicator) { r.StopPartition(ntp) }},
		{"RemovePartition", func(r *Replicator) { r.RemovePartition(ntp) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			const hold = 10 * time.Second
			r, _ := newHoldLeader(t, hold, []int32{0, 1}, nil, ntp)
			_, err := r.Produce(context.Background(), ntp, testBatch(t, "a"), AcksLeader)
			require.NoError(t, err)
			req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: int32(hold / time.Millisecond),
				Partitions: []FetchPartition{{TopicPartition: ntp, CurrentLeaderEpoch: 1, FetchOffset: 1, LastFetchedEpoch: 1}}}
			type answer struct {
				resp *FetchResponse
				err  error
			}
			done := make(chan answer, 1)
			go func() {
				resp, err := r.HandleFetch(context.Background(), req)
				done <- answer{resp, err}
			}()
			awaitGoroutineIn(t, "replication.(*Replicator).holdFetch")
			tc.end(r)
			select {
			case got := <-done:
				require.NoError(t, got.err)
				require.NotEqual(t, CodeNone, got.resp.Partitions[0].Error, "answered as if this node still led the partition")
			case <-time.After(hold / 2):
				t.Fatalf("the held fetch was not answered within %v of %s", hold/2, tc.name)
			}
		})
	}
}
