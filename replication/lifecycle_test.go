package replication

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/vfs"
	"github.com/replog/replog/log"
)

// TestMemNetworkDropLosesResponses: Faults.DropRate is documented as
// "the probability that a request or its response is lost". A lost
// response is the interesting case for replication (the leader handled
// the fetch, counted the follower's offset toward the ISR and the high
// watermark, and the follower never learned the answer); MemNetwork once
// dropped only requests.
func TestMemNetworkDropLosesResponses(t *testing.T) {
	net := NewMemNetwork(42)
	var handled atomic.Int64
	net.Register(0, handlerFunc(func(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
		handled.Add(1)
		return &FetchResponse{}, nil
	}))
	net.SetFaults(Faults{DropRate: 0.5})
	tr := net.Transport(1)
	var dropped, delivered int64
	for range 2000 {
		before := handled.Load()
		_, err := tr.Fetch(context.Background(), 0, &FetchRequest{ClusterID: "c", ReplicaID: 1})
		switch {
		case err == nil:
			delivered++
		case errors.Is(err, ErrUnreachable):
			if handled.Load() > before {
				dropped++ // handled by the leader, the answer lost
			}
		default:
			t.Fatal(err)
		}
	}
	t.Logf("delivered %d, handled %d, responses lost after handling %d", delivered, handled.Load(), dropped)
	require.Positive(t, dropped, "DropRate never loses a response: the leader never handles a dropped fetch")
}

// TestSubMillisecondFetchMaxWaitLongPolls: a FetchMaxWait below a
// millisecond is accepted by the config (explicitly, or derived as half of
// a ReplicaLagTime below 2 ms); the request carried it as 0 whole
// milliseconds, so the leader never held the fetch and an idle follower
// fetched in a hot loop (15,000 fetches in 200 ms). It is rounded up now.
func TestSubMillisecondFetchMaxWaitLongPolls(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"FetchMaxWait 900us", Config{FetchMaxWait: 900 * time.Microsecond}},
		{"ReplicaLagTime 1.5ms", Config{ReplicaLagTime: 1500 * time.Microsecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			netw := NewMemNetwork(1)
			var reps []*Replicator
			for id := int32(0); id < 2; id++ {
				l, err := log.Open(t.TempDir(), log.Options{})
				require.NoError(t, err)
				cfg := c.cfg
				cfg.ReplicaID, cfg.ClusterID = id, "c"
				r, err := New(cfg, netw.Transport(id))
				require.NoError(t, err)
				netw.Register(id, r)
				require.NoError(t, r.AddPartition(ntp, l))
				t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, l.Close()) })
				reps = append(reps, r)
			}
			both := []int32{0, 1}
			require.NoError(t, reps[0].BecomeLeader(ntp, 1, both, both))
			require.NoError(t, reps[1].BecomeFollower(ntp, 1, 0))
			const window = 200 * time.Millisecond
			time.Sleep(window)
			served := reps[0].Stats().FetchesServed
			t.Logf("fetches served on an idle partition in %v: %d", window, served)
			// Long polls of about 1 ms would be at most ~200 in 200 ms.
			require.LessOrEqual(t, served, int64(400), "the follower fetches in a hot loop: MaxWaitMs was rounded down to 0")
		})
	}
}

// TestStatsNodeTotalsIncludeThePartitions: Stats read the node's
// counters first and then each partition under its lock, and a fetch was
// counted on its partitions before the node's byte total. A fetch served
// while Stats waited for one partition's lock was then in the snapshot's
// partition figures but not in its totals: FetchesServed 0 and
// BytesServed 0 next to a partition that served a fetch and its bytes.
// Deterministic: the test holds partition a's lock while Stats waits for
// it, and a fetch of partition b is served meanwhile.
func TestStatsNodeTotalsIncludeThePartitions(t *testing.T) {
	n, err := NewNode(Config{ReplicaID: 0, ClusterID: "c"})
	require.NoError(t, err)
	a, b := TopicPartition{Topic: "a"}, TopicPartition{Topic: "b"}
	for _, tp := range []TopicPartition{a, b} {
		l, err := log.Open("/"+tp.String(), log.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		require.NoError(t, n.AddPartition(tp, l))
		require.NoError(t, n.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0}, ntime))
	}
	_, _, _, err = n.appendAsLeader(b, testBatch(t, "b0"), AcksLeader, ntime)
	require.NoError(t, err)

	pa := n.partition(a)
	pa.mu.Lock()
	done := make(chan Stats, 1)
	go func() { done <- n.Stats(ntime) }()
	awaitGoroutineIn(t, "replication.(*partition).stats(") // node counters read, waiting for a
	resp, err := n.HandleFetch(&FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20,
		Partitions: []FetchPartition{{TopicPartition: b, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}}, ntime)
	require.NoError(t, err)
	require.Positive(t, resp.Partitions[0].Region.Length)
	pa.mu.Unlock()
	st := <-done

	var fetches, bytes int64
	for _, ps := range st.Partitions {
		fetches += ps.Fetches
		bytes += ps.Bytes
	}
	t.Logf("snapshot: FetchesServed %d BytesServed %d; partitions: fetches %d bytes %d", st.FetchesServed, st.BytesServed, fetches, bytes)
	require.GreaterOrEqual(t, st.BytesServed, bytes, "the node's bytes served are below the sum of its partitions' in one snapshot")
	require.GreaterOrEqual(t, st.FetchesServed, min(fetches, 1), "a partition served a fetch the node's count lacks")
}

// A fetch served after Replicator.Close returns ErrClosed and changes
// nothing: it used to track the follower first, growing the ISR through
// OnISRChange (and moving the high watermark), and only then notice the
// close.
func TestHandleFetchAfterCloseChangesNothing(t *testing.T) {
	var closed atomic.Bool
	var afterClose atomic.Int32
	cfg := Config{ReplicaID: 0, ClusterID: "c", OnISRChange: func(TopicPartition, int32, []int32) error {
		if closed.Load() {
			afterClose.Add(1)
		}
		return nil
	}}
	r, err := New(cfg, idleTransport{})
	require.NoError(t, err)
	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0}))
	require.NoError(t, r.Close())
	closed.Store(true)

	_, err = r.HandleFetch(context.Background(), &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: 100,
		Partitions: []FetchPartition{{TopicPartition: ntp, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}})
	require.ErrorIs(t, err, ErrClosed)
	require.Zero(t, afterClose.Load(), "OnISRChange called after Close")
	require.Equal(t, []int32{0}, r.Stats().Partitions[0].ISR, "the ISR changed after Close")
}

// slowStopTransport is a Transport that honours ctx but needs a moment to
// wind down once it ends (as a real transport closing a connection does):
// it reports the cancellation on canceled, then returns on release.
type slowStopTransport struct {
	canceled chan struct{}
	release  chan struct{}
	returned atomic.Bool
}

func (s *slowStopTransport) Fetch(ctx context.Context, _ int32, _ *FetchRequest) (*FetchResponse, error) {
	<-ctx.Done()
	close(s.canceled)
	<-s.release
	s.returned.Store(true)
	return nil, ctx.Err()
}

// A second Replicator.Close, concurrent with the first, waits as the
// first does for the fetchers: it used to return at once, and a caller
// that then closed the logs (close the Replicator, then the logs, as the
// package documentation says) raced a fetcher still running.
func TestReplicatorConcurrentCloseWaits(t *testing.T) {
	tr := &slowStopTransport{canceled: make(chan struct{}), release: make(chan struct{})}
	r, err := New(Config{ReplicaID: 1, ClusterID: "c"}, tr)
	require.NoError(t, err)
	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeFollower(ntp, 1, 0))

	first := make(chan error, 1)
	go func() { first <- r.Close() }()
	<-tr.canceled // the first Close canceled the fetch and waits for the fetcher

	second := make(chan error, 1)
	go func() { second <- r.Close() }()
	select {
	case err := <-second:
		stillRunning := !tr.returned.Load()
		close(tr.release)
		<-first
		require.NoError(t, err)
		require.False(t, stillRunning, "a concurrent Replicator.Close returned while the fetcher it must wait for was still running")
	case <-time.After(300 * time.Millisecond):
		close(tr.release) // the second Close waited: fine
		require.NoError(t, <-first)
		require.NoError(t, <-second)
	}
}

// A second TCPServer.Close, concurrent with the first, waits for the
// server's goroutines too: it used to return while a connection goroutine
// was still in the handler.
func TestTCPServerConcurrentCloseWaits(t *testing.T) {
	entered, canceled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	h := handlerFunc(func(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
		close(entered)
		<-ctx.Done()
		close(canceled)
		<-release // a handler finishing its work after the server's context ended
		returned.Store(true)
		return nil, ErrClosed
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s, err := NewTCPServer(h, ln, TCPOptions{})
	require.NoError(t, err)
	tr, err := NewTCPTransport(TCPOptions{Resolve: func(int32) (string, error) { return ln.Addr().String(), nil }})
	require.NoError(t, err)
	defer tr.Close()
	go func() {
		_, _ = tr.Fetch(context.Background(), 0, &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: 10,
			Partitions: []FetchPartition{{TopicPartition: ntp, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}})
	}()
	// Wait until the handler runs, then close.
	first := make(chan error, 1)
	<-entered
	go func() { first <- s.Close() }()
	<-canceled

	second := make(chan error, 1)
	go func() { second <- s.Close() }()
	select {
	case err := <-second:
		stillRunning := !returned.Load()
		close(release)
		<-first
		require.NoError(t, err)
		require.False(t, stillRunning, "a concurrent TCPServer.Close returned while a connection goroutine was still in the handler")
	case <-time.After(300 * time.Millisecond):
		close(release)
		require.NoError(t, <-first)
		require.NoError(t, <-second)
	}
}

// A Produce whose context already ended appends nothing and returns the
// context's error: an acks=all one used to append (and fsync) the batch,
// then report the error, so that a retry stored the records twice.
func TestProduceWithAnEndedContextAppendsNothing(t *testing.T) {
	checkGoroutines(t)
	r, err := New(Config{ReplicaID: 0, ClusterID: "c"}, idleTransport{})
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	both := []int32{0, 1}
	require.NoError(t, r.BecomeLeader(ntp, 1, both, both))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, acks := range []Acks{AcksNone, AcksLeader, AcksAll} {
		_, err = r.Produce(ctx, ntp, testBatch(t, "dead ctx"), acks)
		require.ErrorIs(t, err, context.Canceled, "acks %d", acks)
		require.Zero(t, l.LogEndOffset(), "acks %d: Produce returned %v yet appended its batch", acks, err)
	}
}

// A HandleFetch in progress when Close begins (here in the leader's
// fsync of unsynced acks=1 data) tracks no follower and reports no ISR
// change: it used to check for Close only before that fsync, and grow the
// ISR through OnISRChange after Close had returned.
func TestHandleFetchInProgressDuringCloseChangesNothing(t *testing.T) {
	checkGoroutines(t)
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	fsys := vfs.NewErrorFS(vfs.NewMem(), vfs.InjectorFunc(func(op vfs.Op) vfs.Fault {
		if op.Kind == vfs.OpSync && strings.HasSuffix(op.Path, ".log") && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return vfs.Fault{}
	}))
	var isrChanges atomic.Int32
	cfg := Config{ReplicaID: 0, ClusterID: "c", OnISRChange: func(TopicPartition, int32, []int32) error {
		isrChanges.Add(1)
		return nil
	}}
	r, err := New(cfg, idleTransport{})
	require.NoError(t, err)
	l, err := log.Open("/leader", log.Options{FS: fsys})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, r.AddPartition(ntp, l))
	require.NoError(t, r.BecomeLeader(ntp, 1, []int32{0, 1}, []int32{0}))
	_, err = r.Produce(context.Background(), ntp, testBatch(t, "unsynced"), AcksLeader)
	require.NoError(t, err)

	armed.Store(true)
	var released atomic.Bool
	unblock := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	defer unblock() // before l.Close, also when the test fails
	fetched := make(chan error, 1)
	go func() {
		// Follower 1 has caught up: the leader would add it to the ISR.
		_, err := r.HandleFetch(context.Background(), &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20, MaxWaitMs: 100,
			Partitions: []FetchPartition{{TopicPartition: ntp, CurrentLeaderEpoch: 1, FetchOffset: l.LogEndOffset(), LastFetchedEpoch: 1}}})
		fetched <- err
	}()
	<-entered // the fetch is in the leader's fsync
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	require.Eventually(t, func() bool { return r.ctx.Err() != nil }, 5*time.Second, time.Millisecond)
	select {
	case <-closed:
		t.Fatal("Close returned while a HandleFetch was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	unblock()
	require.NoError(t, <-closed)
	require.ErrorIs(t, <-fetched, ErrClosed)
	require.Zero(t, isrChanges.Load(), "OnISRChange called for a fetch that Close ended")
	require.Equal(t, []int32{0}, r.Stats().Partitions[0].ISR, "the ISR changed")
}

// AddPartition after Close returns ErrClosed (it used to host the
// partition, and mark its log to retain what is above the high
// watermark, on a Replicator that would never replicate it).
func TestAddPartitionAfterCloseIsClosed(t *testing.T) {
	r, err := New(Config{ReplicaID: 0, ClusterID: "c"}, idleTransport{})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	defer l.Close()
	require.ErrorIs(t, r.AddPartition(ntp, l), ErrClosed)
	_, ok := r.Node().Log(ntp)
	require.False(t, ok, "the partition was added")
}
