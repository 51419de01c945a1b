package replication

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// registeredWaiters returns how many channels w holds and its count of
// them.
func registeredWaiters(w *waitBroadcast) (int, int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiters), w.n.Load()
}

// TestHeldFetchUnregistersItsChannel checks that a held fetch, however it
// ends (its hold over, answered at once, woken by a produce), leaves its
// connection's channel neither registered with newData nor holding a
// token: either would wake the connection's next fetch for nothing, and
// a registration left behind would grow the waiters until a wake.
func TestHeldFetchUnregistersItsChannel(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	r, logs := newHoldLeader(t, time.Second, []int32{0}, nil, tp)
	var s serveScratch
	fetch := func(offset int64, waitMs int32) *FetchResponse {
		req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: waitMs,
			Partitions: []FetchPartition{{TopicPartition: tp, CurrentLeaderEpoch: 1, FetchOffset: offset, LastFetchedEpoch: log.NoLeaderEpoch}}}
		resp, err := r.handleFetchScratch(context.Background(), req, &s)
		require.NoError(t, err)
		return resp
	}
	produce := func(v string) {
		_, err := r.Produce(context.Background(), tp, testBatch(t, v), AcksLeader)
		require.NoError(t, err)
	}
	check := func(when string) {
		n, count := registeredWaiters(&r.newData)
		require.Zero(t, n, "%s: the connection's channel is still registered", when)
		require.Zero(t, count, "%s: newData's count", when)
		require.Empty(t, s.wake, "%s: a token left for the connection's next fetch", when)
	}
	fetch(0, 20)
	check("after a hold that ran out")
	produce("a")
	fetch(0, 1000)
	produce("b")
	check("after a fetch answered at once and a produce")
	end := logs[tp].LogEndOffset()
	done := make(chan *FetchResponse)
	go func() { done <- fetch(end, 1000) }()
	time.Sleep(50 * time.Millisecond) // the fetch is held
	produce("c")
	require.Positive(t, (<-done).Partitions[0].Region.Length)
	check("after a fetch woken by a produce")
}

// TestProduceWaitUnregistersItsChannel checks that acks=all waits that
// end without a wake (their context's deadline here) unregister the
// channel they were lent before giving it back: a later advance of the
// high watermark would otherwise send a token into a channel another
// Produce holds.
func TestProduceWaitUnregistersItsChannel(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	r, _ := newHoldLeader(t, time.Second, []int32{0, 1}, nil, tp) // the high watermark needs follower 1
	p := r.node.partition(tp)
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := r.Produce(ctx, tp, testBatch(t, "x"), AcksAll)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	n, count := registeredWaiters(&p.hwAdvanced)
	require.Zero(t, n, "channels of ended waits still registered")
	require.Zero(t, count)
}

// wakeOnFirstErr is a leadership context whose first Err call runs wake
// and reports the leadership lost, and whose later calls report it held:
// it makes the high watermark advance exactly between
// awaitHighWatermark's check and its wait.
type wakeOnFirstErr struct {
	context.Context
	calls int
	wake  func()
}

func (c *wakeOnFirstErr) Done() <-chan struct{} { return nil }

func (c *wakeOnFirstErr) Err() error {
	c.calls++
	if c.calls == 1 {
		c.wake()
		return context.Canceled
	}
	return nil
}

// TestProduceWaitSeesAWakeBetweenItsCheckAndItsWait checks that
// awaitHighWatermark registers its channel before it checks the high
// watermark: a wake between the check and the wait must still end the
// wait, not leave it to its context's deadline.
func TestProduceWaitSeesAWakeBetweenItsCheckAndItsWait(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	r, logs := newHoldLeader(t, time.Second, []int32{0}, nil, tp)
	_, err := r.Produce(context.Background(), tp, testBatch(t, "x"), AcksAll)
	require.NoError(t, err)
	require.Equal(t, int64(1), logs[tp].HighWatermark())
	p := r.node.partition(tp)
	lead := &wakeOnFirstErr{Context: context.Background(), wake: p.hwAdvanced.wake}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	require.NoError(t, r.awaitHighWatermark(ctx, tp, p, lead, 0), "the wake between the check and the wait was lost")
	n, _ := registeredWaiters(&p.hwAdvanced)
	require.Zero(t, n)
}
