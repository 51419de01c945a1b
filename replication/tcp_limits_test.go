package replication

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/replog/replog/log"
	"github.com/replog/replog/send"
)

// requestOfSize returns a fetch request whose frame takes exactly size
// bytes, its cluster id padding it.
func requestOfSize(t *testing.T, parts, size int) *FetchRequest {
	t.Helper()
	req := testRequest(parts)
	frame, err := appendFetchRequestFrame(nil, 1, req)
	require.NoError(t, err)
	require.LessOrEqual(t, len(frame), size)
	req.ClusterID += strings.Repeat("c", size-len(frame))
	return req
}

func TestTCPOptionsLimits(t *testing.T) {
	o, err := TCPOptions{}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, DefaultMaxRequestBytes, o.MaxRequestBytes)
	require.Equal(t, DefaultIdleTimeout, o.IdleTimeout)
	o, err = TCPOptions{MaxFrameBytes: 8 << 10}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, 8<<10, o.MaxRequestBytes, "capped by MaxFrameBytes")
	o, err = TCPOptions{IdleTimeout: -1}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), o.IdleTimeout, "negative: no limit")
	for _, bad := range []TCPOptions{
		{MaxRequestBytes: 4<<10 - 1},
		{MaxRequestBytes: -1},
		{MaxFrameBytes: 64 << 10, MaxRequestBytes: 64<<10 + 1},
		{MaxConnections: -1},
	} {
		_, err := bad.withDefaults()
		require.Error(t, err, "%+v", bad)
	}
}

// A request frame over MaxRequestBytes is refused from its header: the
// server answers at once, without waiting for the body, and closes the
// connection. One of exactly MaxRequestBytes is served.
func TestTCPServerRefusesLargeRequests(t *testing.T) {
	checkGoroutines(t)
	const limit = 8 << 10
	data := testData(1 << 10)
	_, ln := startServer(t, echoHandler(segmentFile(t, data), data, nil), TCPOptions{MaxRequestBytes: limit})
	addr := ln.Addr().String()

	c := rawConn(t, addr)
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := c.Write(header(limit+1-4, frameMagic, frameVersion, msgFetchRequest, 7))
	require.NoError(t, err)
	err = expectError(t, c, 7)
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorIs(t, err, ErrFrameTooLarge)
	_, _, err = readRaw(t, c)
	require.ErrorIs(t, err, io.EOF, "the server must close the connection")

	req := requestOfSize(t, 100, limit)
	tr := newTransport(t, addr, TCPOptions{})
	resp, err := tr.Fetch(context.Background(), 0, req)
	require.NoError(t, err)
	checkEcho(t, data, req, resp)
}

// A transport does not send a request over its MaxRequestBytes, and the
// connection stays usable.
func TestTCPTransportRefusesLargeRequests(t *testing.T) {
	checkGoroutines(t)
	const limit = 8 << 10
	data := testData(1 << 10)
	seen := make(chan *FetchRequest, 10)
	_, ln := startServer(t, echoHandler(segmentFile(t, data), data, seen), TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxRequestBytes: limit})
	_, err := tr.Fetch(context.Background(), 0, requestOfSize(t, 100, limit+1))
	require.ErrorIs(t, err, ErrFrameTooLarge)
	require.Empty(t, seen, "nothing was sent")
	req := requestOfSize(t, 100, limit)
	resp, err := tr.Fetch(context.Background(), 0, req)
	require.NoError(t, err)
	checkEcho(t, data, req, resp)
	require.Equal(t, int32(1), ln.accepted.Load())
}

// Decoding the largest request a default server reads allocates its
// partitions once, and a topic name once per run of partitions.
func TestDecodeFetchRequestAllocates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		topic  func(i int) string
		allocs float64
	}{
		{"empty topics", func(int) string { return "" }, 2},
		{"one topic", func(int) string { return "orders" }, 3},
		{"runs of topics", func(i int) string { return []string{"orders", "payments"}[i/100%2] }, 3 + DefaultMaxRequestBytes/(100*36)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &FetchRequest{ClusterID: "c"}
			for size := 64; size < DefaultMaxRequestBytes-64; size += minRequestPartitionBytes + len(tc.topic(len(req.Partitions))) {
				req.Partitions = append(req.Partitions, FetchPartition{TopicPartition: TopicPartition{Topic: tc.topic(len(req.Partitions))}})
			}
			frame, err := appendFetchRequestFrame(nil, 1, req)
			require.NoError(t, err)
			require.LessOrEqual(t, len(frame), DefaultMaxRequestBytes)
			body := frame[frameHeaderSize:]
			var got *FetchRequest
			allocs := testing.AllocsPerRun(3, func() { got, err = decodeFetchRequest(body) })
			require.NoError(t, err)
			require.Equal(t, req, got)
			require.LessOrEqual(t, allocs, tc.allocs)
			n := allocated(func() { _, _ = decodeFetchRequest(body) })
			want := uint64(len(req.Partitions))*uint64(unsafe.Sizeof(FetchPartition{})) + uint64(allocs)*64 + 64<<10 // large allocations round to pages
			require.LessOrEqual(t, n, want, "%d bytes for a body of %d", n, len(body))
		})
	}
}

// A connection idle past IdleTimeout, or whose request body does not
// arrive within RequestTimeout, is closed.
func TestTCPServerClosesPinnedConnections(t *testing.T) {
	checkGoroutines(t)
	data := testData(1 << 10)
	h := echoHandler(segmentFile(t, data), data, nil)
	_, ln := startServer(t, h, TCPOptions{IdleTimeout: 100 * time.Millisecond, RequestTimeout: 10 * time.Second})
	valid, err := appendFetchRequestFrame(nil, 3, testRequest(2))
	require.NoError(t, err)

	// closedWithin checks that the server closes c at least min after
	// since, taken before whatever starts the server's timer: the bound
	// then holds however the two sides are scheduled.
	closedWithin := func(t *testing.T, c net.Conn, since time.Time, min, max time.Duration) {
		t.Helper()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(max)))
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "the server must close the connection")
		require.GreaterOrEqual(t, time.Since(since), min)
	}
	const limit = 100 * time.Millisecond
	t.Run("idle", func(t *testing.T) {
		start := time.Now()
		closedWithin(t, rawConn(t, ln.Addr().String()), start, limit, 5*time.Second)
	})
	t.Run("idle after a request", func(t *testing.T) {
		c := rawConn(t, ln.Addr().String())
		start := time.Now()
		_, err := c.Write(valid)
		require.NoError(t, err)
		hd, _, err := readRaw(t, c)
		require.NoError(t, err)
		require.Equal(t, uint8(msgFetchResponse), hd.typ)
		closedWithin(t, c, start, limit, 5*time.Second)
	})
	t.Run("trickled header", func(t *testing.T) {
		start := time.Now()
		c := rawConn(t, ln.Addr().String())
		_, err := c.Write(valid[:5])
		require.NoError(t, err)
		closedWithin(t, c, start, limit, 5*time.Second)
	})

	_, ln2 := startServer(t, h, TCPOptions{IdleTimeout: -1, RequestTimeout: limit})
	t.Run("trickled body", func(t *testing.T) {
		c := rawConn(t, ln2.Addr().String())
		start := time.Now()
		_, err := c.Write(valid[:frameHeaderSize+3])
		require.NoError(t, err)
		closedWithin(t, c, start, limit, 5*time.Second)
	})
	t.Run("no idle limit", func(t *testing.T) {
		c := rawConn(t, ln2.Addr().String())
		require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the connection stays open")
	})
}

// Long polls longer than IdleTimeout do not count as idle time: a busy
// follower keeps its connection.
func TestTCPServerKeepsLongPolls(t *testing.T) {
	checkGoroutines(t)
	poll := func(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
		select {
		case <-time.After(time.Duration(req.MaxWaitMs) * time.Millisecond):
		case <-ctx.Done():
		}
		return &FetchResponse{}, nil
	}
	// Polls of 500 ms against an IdleTimeout of 300: the gaps between them
	// (10 ms) leave a loaded machine 290 ms of slack.
	_, ln := startServer(t, handlerFunc(poll), TCPOptions{IdleTimeout: 300 * time.Millisecond})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	for i := 0; i < 3; i++ {
		_, err := tr.Fetch(context.Background(), 0, &FetchRequest{MaxWaitMs: 500})
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond) // a follower applying the response
	}
	require.Equal(t, int32(1), ln.accepted.Load())
}

// When the server closed every pooled connection (IdleTimeout), the next
// fetch redials instead of failing, even with several of them pooled.
func TestTCPTransportRedialsAfterIdleClose(t *testing.T) {
	checkGoroutines(t)
	var calls atomic.Int32
	var first sync.WaitGroup
	first.Add(2)
	both := func(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
		if calls.Add(1) <= 2 { // hold the first two so they use two connections
			first.Done()
			first.Wait()
		}
		return &FetchResponse{}, nil
	}
	s, ln := startServer(t, handlerFunc(both), TCPOptions{IdleTimeout: 100 * time.Millisecond})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxIdleConns: 2})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := tr.Fetch(context.Background(), 0, &FetchRequest{})
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	tr.mu.Lock()
	require.Len(t, tr.idle[0], 2)
	tr.mu.Unlock()

	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 0
	}, 5*time.Second, 5*time.Millisecond, "the server closes idle connections")
	for i := 0; i < 3; i++ {
		_, err := tr.Fetch(context.Background(), 0, &FetchRequest{})
		require.NoError(t, err, "fetch %d", i)
	}
	require.Equal(t, int32(3), ln.accepted.Load())
}

// A transport whose MaxRequestBytes is larger than the server's sends a
// large request in full; the server's ErrFrameTooLarge error frame still
// reaches the caller, each time.
func TestTCPServerRefusalReachesALargerClient(t *testing.T) {
	checkGoroutines(t)
	data := testData(1 << 10)
	_, ln := startServer(t, echoHandler(segmentFile(t, data), data, nil), TCPOptions{MaxRequestBytes: 8 << 10})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxRequestBytes: 8 << 20})
	req := testRequest(150_000) // about 4.3 MiB
	for range 3 {
		_, err := tr.Fetch(context.Background(), 0, req)
		require.ErrorIs(t, err, ErrRemote)
		require.ErrorIs(t, err, ErrFrameTooLarge)
	}
}

// An error frame fits the smallest MaxFrameBytes, so that a peer at that
// limit gets the error rather than a dropped connection, however long
// the message (ErrClusterMismatch quotes the request's cluster id).
func TestTCPErrorFrameFitsTheSmallestLimit(t *testing.T) {
	checkGoroutines(t)
	long := errors.New(ErrClusterMismatch.Error() + ": " + strings.Repeat("x", 5000))
	h := handlerFunc(func(context.Context, *FetchRequest) (*FetchResponse, error) { return nil, long })
	_, ln := startServer(t, h, TCPOptions{MaxFrameBytes: 4 << 10})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxFrameBytes: 4 << 10})
	_, err := tr.Fetch(context.Background(), 0, testRequest(1))
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorIs(t, err, ErrClusterMismatch)
}

// A server connection drops the buffers of a response of many partitions
// once it is sent: a peer must not pin them by sending small requests
// after it.
func TestTCPServerDropsLargeResponseBuffers(t *testing.T) {
	checkGoroutines(t)
	h := handlerFunc(func(_ context.Context, req *FetchRequest) (*FetchResponse, error) {
		resp := &FetchResponse{Partitions: make([]FetchPartitionResponse, len(req.Partitions))}
		for i, p := range req.Partitions {
			resp.Partitions[i] = FetchPartitionResponse{TopicPartition: p.TopicPartition, Error: CodeUnknownPartition}
		}
		return resp, nil
	})
	_, ln := startServer(t, h, TCPOptions{})
	c := rawConn(t, ln.Addr().String())
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	exchange := func(corr uint64, parts int) {
		frame, err := appendFetchRequestFrame(nil, corr, testRequest(parts))
		require.NoError(t, err)
		_, err = c.Write(frame)
		require.NoError(t, err)
		hd, _, err := readRaw(t, c)
		require.NoError(t, err)
		require.Equal(t, uint8(msgFetchResponse), hd.typ)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	exchange(1, 130_000) // its headers take about 14 MiB of buffers
	exchange(2, 1)
	runtime.GC()
	runtime.ReadMemStats(&after)
	kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	require.Less(t, kept, int64(2<<20), "heap still grown by %d KiB with the connection idle", kept>>10)
}

// followerCatchesUpWithin waits up to d for the follower's log to end
// where the leader's does.
func followerCatchesUpWithin(t *testing.T, leader, follower *log.Log, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for follower.LogEndOffset() != leader.LogEndOffset() {
		if time.Now().After(deadline) {
			t.Fatalf("follower stuck at log end %d, leader's is %d", follower.LogEndOffset(), leader.LogEndOffset())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A follower whose FetchMaxBytes is above what a frame of the server's
// (or its own transport's) MaxFrameBytes holds still catches up, a
// frame's worth at a time. The server used to drop the records that did
// not fit (nothing was ever sent, and the follower asked again at once),
// and the transport to refuse the response it had asked for.
func TestFetchMaxBytesAboveTheFrameLimitStillCatchesUp(t *testing.T) {
	for _, tc := range []struct {
		name            string
		server, fetcher TCPOptions
	}{
		{"server limit", TCPOptions{MaxFrameBytes: 64 << 10}, TCPOptions{}},
		{"transport limit", TCPOptions{}, TCPOptions{MaxFrameBytes: 64 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			tp := TopicPartition{Topic: "t", Partition: 0}
			cfg := Config{ClusterID: "c", FetchMaxWait: 50 * time.Millisecond, FetchBackoff: 10 * time.Millisecond}
			reps := startTCPReplicasWith(t, 2, tp, cfg, log.Options{}, tc.server, tc.fetcher)
			require.NoError(t, reps[0].rep.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0}))
			batch := batchOfSize(t, 4<<10)
			for range 40 { // 160 KiB of 4 KiB batches, each fitting a frame
				_, err := reps[0].rep.Produce(context.Background(), tp, slices.Clone(batch), AcksLeader)
				require.NoError(t, err)
			}
			require.NoError(t, reps[1].rep.BecomeFollower(tp, 1, 0))
			followerCatchesUpWithin(t, reps[0].log, reps[1].log, 3*time.Second)
		})
	}
}

// A batch the leader's log took but that does not fit MaxFrameBytes was
// dropped from every response: the follower got an empty answer without
// an error and fetched again at once, and both spun for good. The leader
// now answers CodeRecordTooLarge, which backs the follower off.
func TestTCPBatchLargerThanAFrameBacksTheFollowerOff(t *testing.T) {
	tp := TopicPartition{Topic: "t", Partition: 0}
	opts := TCPOptions{MaxFrameBytes: 64 << 10, MaxRequestBytes: 64 << 10}
	reps := startTCPReplicasWith(t, 2, tp, Config{ClusterID: "a", FetchMaxWait: 200 * time.Millisecond}, log.Options{}, opts, opts)
	require.NoError(t, reps[0].rep.BecomeLeader(tp, 1, []int32{0, 1}, []int32{0}))
	require.NoError(t, reps[1].rep.BecomeFollower(tp, 1, 0))
	_, err := reps[0].rep.Produce(context.Background(), tp, batchOfSize(t, 100<<10), AcksLeader)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	s0 := reps[0].rep.Stats().FetchesServed
	time.Sleep(500 * time.Millisecond)
	served := reps[0].rep.Stats().FetchesServed - s0
	require.Zero(t, reps[1].log.LogEndOffset())
	require.LessOrEqual(t, served, int64(10), "fetches in 500 ms with a 100 ms backoff")

	// The code, as the follower's Node sees it.
	resp := &FetchResponse{Partitions: []FetchPartitionResponse{{TopicPartition: tp, HighWatermark: 1, LogEndOffset: 1, Records: batchOfSize(t, 100<<10)}}}
	var b send.Builder
	_, dropped, err := buildFetchResponse(&b, nil, 1, resp, 64<<10)
	require.NoError(t, err)
	require.Equal(t, 1, dropped)
	require.Equal(t, CodeRecordTooLarge, resp.Partitions[0].Error)
	require.ErrorIs(t, CodeRecordTooLarge.Err(), ErrRecordTooLarge)
}

// A handler answering neither a response nor an error (a wrapper with a
// bug) crashed the process from the server's connection goroutine; the
// peer now gets an error frame.
func TestTCPServerAnswersANilResponseWithAnError(t *testing.T) {
	h := handlerFunc(func(ctx context.Context, req *FetchRequest) (*FetchResponse, error) { return nil, nil })
	_, ln := startServer(t, h, TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	_, err := tr.Fetch(context.Background(), 0, &FetchRequest{ClusterID: "a"})
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorContains(t, err, "neither a response nor an error")

	mem := NewMemNetwork(1)
	mem.Register(0, h)
	_, err = mem.Transport(1).Fetch(context.Background(), 0, &FetchRequest{ClusterID: "a"})
	require.ErrorIs(t, err, ErrMalformedFrame)
}

// A peer that closes a fresh connection after reading the request (a
// server shutting down) gave a bare io.EOF, none of the errors Fetch
// documents; it is ErrUnreachable.
func TestTCPTransportPeerClosingIsUnreachable(t *testing.T) {
	ln := serveRaw(t, func(c net.Conn) {
		var hdr [frameHeaderSize]byte
		if h, err := readFrameHeader(c, &hdr, DefaultMaxFrameBytes); err == nil {
			_, _ = readBody(c, h.bodyLen, nil, 0)
		}
		c.Close()
	})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	_, err := tr.Fetch(context.Background(), 0, &FetchRequest{ClusterID: "a"})
	require.ErrorIs(t, err, ErrUnreachable)
	require.ErrorIs(t, err, io.EOF)
}
