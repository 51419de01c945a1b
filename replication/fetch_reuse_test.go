package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
)

// TestReplicatedProduceAllocations checks that the fetches carrying an
// acks=all batch over TCP allocate nothing in steady state: the leader's
// server reuses each connection's request, response, timer and raw
// connection, and the follower's fetcher its request, applier and decoded
// response, and the waits reuse their wake channels: the held fetches
// their connection's, Produce one the Replicator lends.
func TestReplicatedProduceAllocations(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	reps := startTCPReplicas(t, 2, tp, Config{ClusterID: "a", MinInsyncReplicas: 2}, log.Options{})
	require.NoError(t, reps[0].rep.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0, 1}))
	require.NoError(t, reps[1].rep.BecomeFollower(tp, 1, 0))
	batch := batchOfSize(t, 1<<10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	produce := func() {
		_, err := reps[0].rep.Produce(ctx, tp, batch, AcksAll)
		require.NoError(t, err)
	}
	for range 100 { // connections, buffers, the ISR
		produce()
	}
	allocs := testing.AllocsPerRun(200, produce)
	t.Logf("%.0f allocations per acks=all produce", allocs)
	require.LessOrEqual(t, allocs, float64(producePathAllocs))
}

// producePathAllocs is what an acks=all Produce allocates in steady
// state: nothing (it was two channels before waitBroadcast lent reusable
// ones, made anew for each wait).
const producePathAllocs = 0

// TestTCPTransportContextWatchAcrossFetches checks the context watch a
// pooled connection keeps between fetches: a second fetch with the same
// context is still interrupted when it ends, a connection whose earlier
// context ended serves a fetch with another one, and no watch outlives
// its connection.
func TestTCPTransportContextWatchAcrossFetches(t *testing.T) {
	checkGoroutines(t)
	ln := fakeLeader(t)
	addr := ln.Addr().String()
	never := &FetchRequest{MaxBytes: fakeNever, MaxWaitMs: 60_000}
	okReq := &FetchRequest{MaxBytes: fakeOK}

	t.Run("same context", func(t *testing.T) {
		tr := newTransport(t, addr, TCPOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, err := tr.Fetch(ctx, 0, okReq)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := tr.Fetch(ctx, 0, never)
			done <- err
		}()
		time.Sleep(20 * time.Millisecond) // the request is on its way
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(10 * time.Second):
			t.Fatal("the held fetch did not end with its context")
		}
	})
	t.Run("ended context", func(t *testing.T) {
		tr := newTransport(t, addr, TCPOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		_, err := tr.Fetch(ctx, 0, okReq)
		require.NoError(t, err)
		cancel() // while the connection is idle
		time.Sleep(10 * time.Millisecond)
		for range 3 {
			_, err = tr.Fetch(context.Background(), 0, okReq)
			require.NoError(t, err)
		}
	})
	t.Run("watches end with their connections", func(t *testing.T) {
		tr := newTransport(t, addr, TCPOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, err := tr.Fetch(ctx, 0, &FetchRequest{MaxBytes: fakeAnswerThenClose})
		require.NoError(t, err)
		tr.mu.Lock()
		first := tr.idle[0][0]
		tr.mu.Unlock()
		_, err = tr.Fetch(ctx, 0, okReq) // the peer closed first: redialed
		require.NoError(t, err)
		tr.mu.Lock()
		second := tr.idle[0][0]
		tr.mu.Unlock()
		require.NotSame(t, first, second)
		require.Nil(t, first.unwatch, "the closed connection still watches its context")
		require.NotNil(t, second.unwatch)
		require.NoError(t, tr.Close())
		require.Nil(t, second.unwatch, "Close left an idle connection watching its context")
	})
}

// TestTCPServerRequestsOfAHandlerThatKeepsThem checks that a handler other
// than a Replicator may keep the requests it gets: the server decodes each
// into a new one.
func TestTCPServerRequestsOfAHandlerThatKeepsThem(t *testing.T) {
	checkGoroutines(t)
	var mu sync.Mutex
	var kept []*FetchRequest
	h := handlerFunc(func(_ context.Context, req *FetchRequest) (*FetchResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		kept = append(kept, req)
		return &FetchResponse{}, nil
	})
	_, ln := startServer(t, h, TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	for parts := 1; parts <= 3; parts++ {
		_, err := tr.Fetch(context.Background(), 0, testRequest(parts))
		require.NoError(t, err)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, kept, 3)
	for i, req := range kept {
		require.Equal(t, testRequest(i+1).Partitions, req.Partitions)
	}
}

// TestTCPServerReusesARequestAcrossShapes fetches from a Replicator, over
// one connection, requests of changing partitions: each answer is the
// one its request asks for, with nothing left from the one before.
func TestTCPServerReusesARequestAcrossShapes(t *testing.T) {
	checkGoroutines(t)
	l := make([]*log.Log, 3)
	r, err := New(Config{ReplicaID: 0, ClusterID: "a", FetchMaxWait: time.Millisecond}, NewMemNetwork(1).Transport(0))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	tps := make([]TopicPartition, len(l))
	for i := range l {
		l[i], err = log.Open(t.TempDir(), log.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l[i].Close()) })
		tps[i] = TopicPartition{Topic: fmt.Sprintf("topic-%d", i), Partition: int32(i)}
		require.NoError(t, r.AddPartition(tps[i], l[i]))
		require.NoError(t, r.BecomeLeader(tps[i], 1, []int32{0, 1}, []int32{0}))
		for range i + 1 {
			_, err = r.Produce(context.Background(), tps[i], batchOf(t, 2, tps[i].Topic), AcksLeader)
			require.NoError(t, err)
		}
	}
	_, ln := startServer(t, r, TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	for _, order := range [][]int{{0, 1, 2}, {1}, {2, 0}, {}, {2, 1, 0}, {0}} {
		req := &FetchRequest{ClusterID: "a", ReplicaID: 1, MaxBytes: 1 << 20}
		for _, i := range order {
			req.Partitions = append(req.Partitions, FetchPartition{TopicPartition: tps[i], CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch})
		}
		resp, err := tr.Fetch(context.Background(), 0, req)
		require.NoError(t, err)
		require.Len(t, resp.Partitions, len(order))
		for k, i := range order {
			p := resp.Partitions[k]
			require.Equal(t, tps[i], p.TopicPartition)
			require.Equal(t, CodeNone, p.Error)
			require.Nil(t, p.Diverging)
			require.Equal(t, int64(2*(i+1)), p.LogEndOffset)
			want, err := l[i].Read(nil, 0, log.ReadOptions{})
			require.NoError(t, err)
			require.Equal(t, want, p.Records, "partition %s in order %v", tps[i], order)
		}
	}
	require.Equal(t, int32(1), ln.accepted.Load())
}

// TestDecodeIntoReusedMessages decodes frames of changing shapes into one
// request and one response: each decodes as into a new one, nothing of
// the one before left (a diverging epoch, records, partitions).
func TestDecodeIntoReusedMessages(t *testing.T) {
	var names nameTable
	var req FetchRequest
	var resp FetchResponse
	plain := &FetchResponse{Partitions: []FetchPartitionResponse{
		{TopicPartition: TopicPartition{Topic: "x", Partition: 7}, HighWatermark: 5, LogEndOffset: 9}}}
	responses := []*FetchResponse{sampleResponse(), plain, {}, sampleResponse()}
	for i, want := range responses {
		frame, err := appendFetchResponseFrame(nil, 1, want)
		require.NoError(t, err)
		body := frame[frameHeaderSize:]
		fresh, err := decodeFetchResponse(body)
		require.NoError(t, err)
		require.NoError(t, decodeFetchResponseInto(body, &resp, &names))
		require.Equal(t, len(fresh.Partitions), len(resp.Partitions), "response %d", i)
		for k := range fresh.Partitions {
			require.Equal(t, fresh.Partitions[k], resp.Partitions[k], "response %d", i)
		}

		r := testRequest(len(want.Partitions))
		r.ClusterID = fmt.Sprintf("cluster-%d", i)
		frame, err = appendFetchRequestFrame(nil, 1, r)
		require.NoError(t, err)
		require.NoError(t, decodeFetchRequestInto(frame[frameHeaderSize:], &req, &names))
		freshReq, err := decodeFetchRequest(frame[frameHeaderSize:])
		require.NoError(t, err)
		require.Equal(t, freshReq.ClusterID, req.ClusterID)
		require.Equal(t, len(freshReq.Partitions), len(req.Partitions), "request %d", i)
		for k := range freshReq.Partitions {
			require.Equal(t, freshReq.Partitions[k], req.Partitions[k], "request %d", i)
		}
	}
}

// TestNameTableBounds checks that interned names stay what was read while
// the table starts over past its limits, and that long names are not kept.
func TestNameTableBounds(t *testing.T) {
	var names nameTable
	for i := range 3 * maxInternedNames {
		b := []byte(fmt.Sprintf("topic-%d", i%(maxInternedNames+10)))
		require.Equal(t, string(b), names.get(b))
		require.LessOrEqual(t, len(names.m), maxInternedNames)
	}
	long := bytes.Repeat([]byte("n"), maxInternedNameBytes+1)
	require.Equal(t, string(long), names.get(long))
	_, kept := names.m[string(long)]
	require.False(t, kept)
	var none *nameTable
	require.Equal(t, "t", none.get([]byte("t")))
}

// guardedReplicator is a user FetchHandler that wraps a Replicator by
// embedding it and overrides HandleFetch (to count, authorize, log, ...).
type guardedReplicator struct {
	*Replicator
	calls   atomic.Int32
	allowed int32
}

func (g *guardedReplicator) HandleFetch(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
	g.calls.Add(1)
	if req.ReplicaID != g.allowed {
		return nil, errors.New("replica not allowed")
	}
	return g.Replicator.HandleFetch(ctx, req)
}

// TestTCPServerCallsTheHandlerOfAWrappedReplicator: a handler embedding
// *Replicator got the promoted (unexported) handleFetchScratch, so
// TCPServer took it for the Replicator itself and never called the
// handler's own HandleFetch. Only a *Replicator is now served directly.
func TestTCPServerCallsTheHandlerOfAWrappedReplicator(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	r, _ := soloLeader(t, tp, []int32{0, 1, 2})
	h := &guardedReplicator{Replicator: r, allowed: 1}
	_, ln := startServer(t, h, TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	req := &FetchRequest{ClusterID: "a", ReplicaID: 2, MaxBytes: 1 << 20,
		Partitions: []FetchPartition{{TopicPartition: tp, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}}
	_, err := tr.Fetch(context.Background(), 0, req)
	require.Equal(t, int32(1), h.calls.Load(), "the handler's HandleFetch was not called")
	require.ErrorIs(t, err, ErrRemote, "replica 2 must be refused by the handler")
}

// TestTCPTransportPoolsAcrossPerCallContexts: with one context per Fetch
// (WithTimeout, canceled after it), every fetch redialed, since the end of
// the context a pooled connection still watched made it unusable. The end
// of a context now interrupts only a fetch of it in progress.
func TestTCPTransportPoolsAcrossPerCallContexts(t *testing.T) {
	ln := fakeLeader(t)
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := tr.Fetch(ctx, 0, &FetchRequest{MaxBytes: fakeOK})
		cancel()
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond) // let the AfterFunc of the ended context run
	}
	require.Equal(t, int32(1), ln.accepted.Load(), "sequential fetches should share one connection")
}

// TestTCPServerDropsARefusedHugeRequest: a peer sent one request of
// MaxRequestBytes that the Replicator refused (another cluster); the
// server connection kept the decoded request's partitions (about 6.5 MB)
// for the connection's life, while the body buffer itself was dropped.
func TestTCPServerDropsARefusedHugeRequest(t *testing.T) {
	r, err := New(Config{ReplicaID: 0, ClusterID: "a", FetchMaxWait: 10 * time.Millisecond}, NewMemNetwork(1).Transport(0))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	_, ln := startServer(t, r, TCPOptions{})

	n := (DefaultMaxRequestBytes - 1024) / 30 // empty topic: 30 bytes a partition
	req := &FetchRequest{ClusterID: "other", ReplicaID: 1, MaxBytes: 1 << 20, Partitions: make([]FetchPartition, n)}
	frame, err := appendFetchRequestFrame(nil, 7, req)
	require.NoError(t, err)
	require.LessOrEqual(t, len(frame), DefaultMaxRequestBytes)
	req = nil

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const conns = 4
	var cs []net.Conn
	for range conns {
		c := rawConn(t, ln.Addr().String())
		_, err := c.Write(frame)
		require.NoError(t, err)
		require.ErrorIs(t, expectError(t, c, 7), ErrClusterMismatch)
		cs = append(cs, c) // the connections stay open (and idle)
	}
	frame = nil
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %.1f MB with %d idle connections", float64(grown)/(1<<20), conns)
	require.Less(t, grown, int64(8<<20), "refused requests stay pinned by their connections")
	runtime.KeepAlive(cs)
}

// TestEmptyFetchAnswerHasPartitions: Node.HandleFetch answers a fetch of
// no partitions with an empty, non-nil Partitions slice, as it did before
// answers were computed into reused responses.
func TestEmptyFetchAnswerHasPartitions(t *testing.T) {
	n, err := NewNode(Config{ReplicaID: 0, ClusterID: "a"})
	require.NoError(t, err)
	resp, err := n.HandleFetch(&FetchRequest{ClusterID: "a", ReplicaID: 1}, time.Now())
	require.NoError(t, err)
	require.NotNil(t, resp.Partitions)
}

// TestTCPTransportContextWatchStress runs concurrent fetches with shared,
// per-call and timed-out contexts, canceled mid-fetch, then Close: under
// -race it checks the watch bookkeeping of pooled connections.
func TestTCPTransportContextWatchStress(t *testing.T) {
	ln := fakeLeader(t)
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxIdleConns: 3})
	shared, cancelShared := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var unexpected []string
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				var ctx context.Context
				var cancel context.CancelFunc
				switch rng.IntN(3) {
				case 0:
					ctx, cancel = shared, func() {}
				case 1:
					ctx, cancel = context.WithCancel(context.Background())
				default:
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
				}
				mb := int32(fakeOK)
				if rng.IntN(4) == 0 {
					mb = fakeNever
					d := time.Duration(rng.IntN(1000)) * time.Microsecond
					go func() { time.Sleep(d); cancel() }()
				}
				_, err := tr.Fetch(ctx, 0, &FetchRequest{MaxBytes: mb, MaxWaitMs: 1000})
				// A fetch answered at once fails only with its own
				// context's error (a deadline may strike on the connection
				// just before the context sees it) or the transport's
				// Close, never because another context ended; one never
				// answered always ends.
				if mb == fakeOK && err != nil && !errors.Is(err, context.Canceled) &&
					!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrClosed) ||
					mb == fakeNever && err == nil {
					mu.Lock()
					unexpected = append(unexpected, fmt.Sprintf("fetch %d: %v", mb, err))
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	cancelShared()
	time.Sleep(100 * time.Millisecond)
	_ = tr.Close()
	wg.Wait()
	require.Empty(t, unexpected)
}
