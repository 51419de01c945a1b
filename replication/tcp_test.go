package replication

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/replog/replog/internal/leakcheck"
	"github.com/replog/replog/log"
)

// checkGoroutines fails the test if goroutines of this module it started
// still run when it ends (leakcheck.Check). Call it first, so that its
// cleanup runs last.
func checkGoroutines(t *testing.T) {
	t.Helper()
	leakcheck.Check(t)
}

type handlerFunc func(ctx context.Context, req *FetchRequest) (*FetchResponse, error)

func (f handlerFunc) HandleFetch(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
	return f(ctx, req)
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func listen(t *testing.T) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return &countingListener{Listener: ln}
}

func startServer(t *testing.T, h FetchHandler, opts TCPOptions) (*TCPServer, *countingListener) {
	t.Helper()
	ln := listen(t)
	s, err := NewTCPServer(h, ln, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, ln
}

func newTransport(t *testing.T, addr string, opts TCPOptions) *TCPTransport {
	t.Helper()
	opts.Resolve = func(int32) (string, error) { return addr, nil }
	tr, err := NewTCPTransport(opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	return tr
}

// segmentFile writes data to a file and opens it, as a segment would be.
func segmentFile(t *testing.T, data []byte) *os.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "00000000000000000000.log")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// echoHandler answers each partition of a request with its position in
// the request, records from a file region for even partitions (large
// enough for sendfile) and from memory for odd ones.
func echoHandler(f *os.File, data []byte, seen chan<- *FetchRequest) handlerFunc {
	return func(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
		if seen != nil {
			seen <- req
		}
		resp := &FetchResponse{}
		for i, p := range req.Partitions {
			pr := FetchPartitionResponse{TopicPartition: p.TopicPartition, HighWatermark: p.FetchOffset, LogEndOffset: int64(i)}
			if i%2 == 0 {
				pr.Region = log.Region{File: f, Position: int64(i), Length: int64(len(data) - 2*i)}
			} else {
				pr.Records = data[i : 2*i+1]
			}
			resp.Partitions = append(resp.Partitions, pr)
		}
		return resp, nil
	}
}

func checkEcho(t *testing.T, data []byte, req *FetchRequest, resp *FetchResponse) {
	t.Helper()
	require.Len(t, resp.Partitions, len(req.Partitions))
	for i, p := range resp.Partitions {
		require.Equal(t, req.Partitions[i].TopicPartition, p.TopicPartition)
		require.Equal(t, req.Partitions[i].FetchOffset, p.HighWatermark)
		require.Equal(t, int64(i), p.LogEndOffset)
		require.Zero(t, p.Region.Length)
		if i%2 == 0 {
			require.Equal(t, data[i:len(data)-i], p.Records)
		} else {
			require.Equal(t, data[i:2*i+1], p.Records)
		}
	}
}

func testData(n int) []byte {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return data
}

func testRequest(parts int) *FetchRequest {
	req := &FetchRequest{ClusterID: "c", ReplicaID: 1, MaxBytes: 1 << 20}
	for i := 0; i < parts; i++ {
		req.Partitions = append(req.Partitions, FetchPartition{TopicPartition: TopicPartition{Topic: "t", Partition: int32(i)},
			CurrentLeaderEpoch: 1, FetchOffset: int64(100 + i), LastFetchedEpoch: 1, LogStartOffset: int64(i)})
	}
	return req
}

func TestTCPFetch(t *testing.T) {
	checkGoroutines(t)
	data := testData(256 << 10)
	f := segmentFile(t, data)
	seen := make(chan *FetchRequest, 100)
	_, ln := startServer(t, echoHandler(f, data, seen), TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	ctx := context.Background()

	// Sequential fetches share one connection.
	for n := 0; n < 5; n++ {
		req := testRequest(n)
		resp, err := tr.Fetch(ctx, 0, req)
		require.NoError(t, err)
		checkEcho(t, data, req, resp)
		got := <-seen
		if n == 0 {
			req.Partitions = nil
		}
		require.Equal(t, req, got)
	}
	require.Equal(t, int32(1), ln.accepted.Load())

	// Concurrent fetches use separate connections, then reuse them.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 5; n++ {
				req := testRequest(3)
				resp, err := tr.Fetch(ctx, 0, req)
				if err == nil && !bytes.Equal(resp.Partitions[2].Records, data[2:len(data)-2]) {
					err = errors.New("wrong records")
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, ln.accepted.Load(), int32(5))
}

// fetchInto reads a response into the buffer passed when it fits, and
// into a new one, returned, when it does not; Fetch never reuses one.
func TestTCPFetchIntoReusesTheBuffer(t *testing.T) {
	checkGoroutines(t)
	data := testData(256 << 10)
	f := segmentFile(t, data)
	_, ln := startServer(t, echoHandler(f, data, nil), TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})
	ctx := context.Background()

	// The body ends with the last partition's records.
	aliases := func(buf []byte, resp *FetchResponse) bool {
		rec := resp.Partitions[len(resp.Partitions)-1].Records
		return len(buf) > 0 && len(rec) > 0 && &buf[len(buf)-1] == &rec[len(rec)-1]
	}
	req := testRequest(3)
	resp, buf, err := tr.fetchInto(ctx, 0, req, nil)
	require.NoError(t, err)
	checkEcho(t, data, req, resp)
	require.True(t, aliases(buf, resp), "records alias the returned buffer")
	first := &buf[:1][0]

	resp, buf, err = tr.fetchInto(ctx, 0, req, buf)
	require.NoError(t, err)
	checkEcho(t, data, req, resp)
	require.Same(t, first, &buf[:1][0], "the buffer was reused")
	require.True(t, aliases(buf, resp))

	small := make([]byte, 0, 16)
	resp, buf, err = tr.fetchInto(ctx, 0, req, small)
	require.NoError(t, err)
	checkEcho(t, data, req, resp)
	require.Greater(t, cap(buf), cap(small), "a new buffer for a response that does not fit")

	// Fetch's responses own their buffers.
	r1, err := tr.Fetch(ctx, 0, req)
	require.NoError(t, err)
	r2, err := tr.Fetch(ctx, 0, req)
	require.NoError(t, err)
	require.NotSame(t, &r1.Partitions[0].Records[0], &r2.Partitions[0].Records[0])
	checkEcho(t, data, req, r1)

	// Errors hand the caller's buffer back.
	tr2 := newTransport(t, "127.0.0.1:1", TCPOptions{DialTimeout: time.Second})
	_, got, err := tr2.fetchInto(ctx, 0, req, buf)
	require.ErrorIs(t, err, ErrUnreachable)
	require.Same(t, &buf[:1][0], &got[:1][0])
}

// soloLeader starts node 0 of cluster "a" leading tp at epoch 1, with
// replicas and itself alone in the ISR, on a new log, for a TCPServer to
// serve (its in-memory transport is never used); the cleanup closes both.
func soloLeader(t *testing.T, tp TopicPartition, replicas []int32) (*Replicator, *log.Log) {
	t.Helper()
	l, err := log.Open(t.TempDir(), log.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	r, err := New(Config{ReplicaID: 0, ClusterID: "a", FetchMaxWait: 10 * time.Millisecond}, NewMemNetwork(1).Transport(0))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	require.NoError(t, r.AddPartition(tp, l))
	require.NoError(t, r.BecomeLeader(tp, 1, replicas, []int32{0}))
	return r, l
}

func TestTCPFetchFromReplicator(t *testing.T) {
	checkGoroutines(t)
	tp := TopicPartition{Topic: "t", Partition: 0}
	r, l := soloLeader(t, tp, []int32{0, 1})
	batch := batchOf(t, 10, "x")
	_, err := r.Produce(context.Background(), tp, batch, AcksLeader)
	require.NoError(t, err)
	_, ln := startServer(t, r, TCPOptions{})
	tr := newTransport(t, ln.Addr().String(), TCPOptions{})

	// Another cluster is refused with an error frame; the connection stays.
	req := &FetchRequest{ClusterID: "b", ReplicaID: 1, MaxBytes: 1 << 20,
		Partitions: []FetchPartition{{TopicPartition: tp, CurrentLeaderEpoch: 1, LastFetchedEpoch: log.NoLeaderEpoch}}}
	_, err = tr.Fetch(context.Background(), 0, req)
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorIs(t, err, ErrClusterMismatch)

	req.ClusterID = "a"
	resp, err := tr.Fetch(context.Background(), 0, req)
	require.NoError(t, err)
	require.Len(t, resp.Partitions, 1)
	require.Equal(t, CodeNone, resp.Partitions[0].Error)
	want, err := l.Read(nil, 0, log.ReadOptions{})
	require.NoError(t, err)
	require.Equal(t, want, resp.Partitions[0].Records)
	require.Equal(t, int64(10), resp.Partitions[0].LogEndOffset)

	req.Partitions[0].CurrentLeaderEpoch = 0
	resp, err = tr.Fetch(context.Background(), 0, req)
	require.NoError(t, err)
	require.Equal(t, CodeFencedLeaderEpoch, resp.Partitions[0].Error)
	require.Equal(t, int32(1), ln.accepted.Load())
}

// rawConn dials the server for hand-made frames.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second))) // a hang fails, not blocks
	return c
}

func readRaw(t *testing.T, c net.Conn) (frameHeader, []byte, error) {
	t.Helper()
	var hdr [frameHeaderSize]byte
	h, err := readFrameHeader(c, &hdr, DefaultMaxFrameBytes)
	if err != nil {
		return h, nil, err
	}
	body, err := readBody(c, h.bodyLen, nil, 0)
	return h, body, err
}

// expectError reads an error frame for corr and returns its error.
func expectError(t *testing.T, c net.Conn, corr uint64) error {
	t.Helper()
	h, body, err := readRaw(t, c)
	require.NoError(t, err)
	require.Equal(t, uint8(msgError), h.typ)
	require.Equal(t, corr, h.corr)
	return decodeError(body)
}

func TestTCPServerRejectsBadFrames(t *testing.T) {
	checkGoroutines(t)
	data := testData(1 << 10)
	f := segmentFile(t, data)
	_, ln := startServer(t, echoHandler(f, data, nil), TCPOptions{MaxFrameBytes: 64 << 10})
	addr := ln.Addr().String()
	valid, err := appendFetchRequestFrame(nil, 99, testRequest(1))
	require.NoError(t, err)

	answersValid := func(c net.Conn) {
		t.Helper()
		_, err := c.Write(valid)
		require.NoError(t, err)
		h, _, err := readRaw(t, c)
		require.NoError(t, err)
		require.Equal(t, uint8(msgFetchResponse), h.typ)
		require.Equal(t, uint64(99), h.corr)
	}

	t.Run("recoverable", func(t *testing.T) {
		c := rawConn(t, addr)
		for _, tc := range []struct {
			name  string
			frame []byte
		}{
			{"unknown type", append(header(frameLengthMin+3, frameMagic, 1, 7, 5), 1, 2, 3)},
			{"unknown version", append(header(frameLengthMin+3, frameMagic, 9, 1, 5), 1, 2, 3)},
			{"response sent to the server", frameOf(msgFetchResponse, []byte{0, 0, 0, 0})},
			{"bad body", frameOf(msgFetchRequest, []byte{0xff, 0xff})},
			{"huge count", frameOf(msgFetchRequest, append(make([]byte, 14), 0xff, 0xff, 0xff, 0xff))},
		} {
			binary.BigEndian.PutUint64(tc.frame[8:], 5)
			_, err := c.Write(tc.frame)
			require.NoError(t, err, tc.name)
			err = expectError(t, c, 5)
			require.ErrorIs(t, err, ErrRemote, tc.name)
			require.ErrorIs(t, err, ErrMalformedFrame, tc.name)
			answersValid(c) // the stream is still in sync
		}
	})
	t.Run("fatal", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			frame []byte
			want  error
		}{
			{"oversize", header(64<<10, frameMagic, 1, 1, 6), ErrFrameTooLarge},
			{"bad magic", header(100, 0x1234, 1, 1, 6), ErrMalformedFrame},
		} {
			c := rawConn(t, addr)
			_, err := c.Write(tc.frame)
			require.NoError(t, err, tc.name)
			err = expectError(t, c, 6)
			require.ErrorIs(t, err, ErrRemote, tc.name)
			require.ErrorIs(t, err, tc.want, tc.name)
			_, _, err = readRaw(t, c)
			require.Error(t, err, "%s: the server must close the connection", tc.name)
			require.NotErrorIs(t, err, os.ErrDeadlineExceeded, tc.name)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		c := rawConn(t, addr)
		_, err := c.Write(valid[:len(valid)-3])
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		_, _, err = readRaw(t, c)
		require.Error(t, err) // closed without an answer
	})
	// After all that, the server still serves.
	answersValid(rawConn(t, addr))
}

// fakeLeader is a hand-written server whose answer depends on the
// request's MaxBytes, to feed the transport bad responses.
const (
	fakeOK = iota + 1
	fakeOversize
	fakeTruncated
	fakeWrongCorr
	fakeRecordsPastFrame
	fakeWrongType
	fakeAnswerThenClose
	fakeNever
	fakeStalledBody   // half the answer; the rest only after the next request
	fakeWrongTypeHead // a request's header announcing 512 KiB, and no body
)

func fakeLeader(t *testing.T) *countingListener {
	t.Helper()
	return serveRaw(t, func(c net.Conn) {
		var hdr [frameHeaderSize]byte
		for {
			h, err := readFrameHeader(c, &hdr, DefaultMaxFrameBytes)
			if err != nil {
				return
			}
			body, err := readBody(c, h.bodyLen, nil, 0)
			if err != nil {
				return
			}
			req, err := decodeFetchRequest(body)
			if err != nil {
				return
			}
			ok, _ := appendFetchResponseFrame(nil, h.corr, &FetchResponse{Partitions: []FetchPartitionResponse{{Records: []byte("fine")}}})
			var out []byte
			switch req.MaxBytes {
			case fakeOK, fakeAnswerThenClose:
				out = ok
			case fakeOversize:
				out = header(1<<30, frameMagic, 1, msgFetchResponse, h.corr)
			case fakeTruncated:
				out = ok[:len(ok)-2]
			case fakeWrongCorr:
				out, _ = appendFetchResponseFrame(nil, h.corr+1, &FetchResponse{})
			case fakeRecordsPastFrame:
				out = append([]byte(nil), ok...)
				binary.BigEndian.PutUint32(out[len(out)-8:], 5) // records length 5, 4 bytes follow
			case fakeWrongType:
				out, _ = appendFetchRequestFrame(nil, h.corr, req)
			case fakeNever:
				continue
			case fakeStalledBody:
				out = ok[:len(ok)/2]
			case fakeWrongTypeHead:
				out = header(12+512<<10, frameMagic, 1, msgFetchRequest, h.corr)
			}
			if _, err := c.Write(out); err != nil {
				return
			}
			if req.MaxBytes == fakeTruncated || req.MaxBytes == fakeAnswerThenClose {
				return
			}
		}
	})
}

// badResponse is a way fakeLeader answers badly, and the error a fetch
// gets from it.
type badResponse struct {
	name string
	mode int32
	want error
}

var badResponses = []badResponse{
	{"oversize", fakeOversize, ErrFrameTooLarge},
	{"truncated", fakeTruncated, ErrMalformedFrame},
	{"wrong correlation id", fakeWrongCorr, ErrMalformedFrame},
	{"records past the frame", fakeRecordsPastFrame, ErrMalformedFrame},
	{"wrong type", fakeWrongType, ErrMalformedFrame},
	// Refused from its header: its body is not waited for.
	{"wrong type, no body", fakeWrongTypeHead, ErrMalformedFrame},
}

// TestTCPTransportStreamRejectsBadResponses is
// TestTCPTransportRejectsBadResponses through fetchStream, the fetcher's
// way, which decodes a small response where the read buffer holds it:
// a response cut by a timeout must not leave its connection pooled,
// where the next fetch would read the rest of it.
func TestTCPTransportStreamRejectsBadResponses(t *testing.T) {
	checkGoroutines(t)
	ln := fakeLeader(t)
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxFrameBytes: 1 << 20, RequestTimeout: 200 * time.Millisecond})
	fetch := func(mode int32) (*collectSink, error) {
		sink := &collectSink{}
		_, err := tr.fetchStream(context.Background(), 0, &FetchRequest{MaxBytes: mode}, nil, sink)
		return sink, err
	}
	sink, err := fetch(fakeOK)
	require.NoError(t, err)
	require.NoError(t, sink.err)
	require.Len(t, sink.resp.Partitions, 1)
	require.Equal(t, "fine", string(sink.resp.Partitions[0].Records))
	for _, tc := range append(badResponses, badResponse{"stalled body", fakeStalledBody, os.ErrDeadlineExceeded}) {
		_, err := fetch(tc.mode)
		require.ErrorIs(t, err, tc.want, tc.name)
		sink, err := fetch(fakeOK)
		require.NoError(t, err, tc.name)
		require.Equal(t, "fine", string(sink.resp.Partitions[0].Records), tc.name)
	}
}

// serveRaw accepts connections on a new loopback listener and runs serve
// on each in its own goroutine, which closes the connection when serve
// returns; the cleanup closes the listener and the connections and waits
// for the goroutines.
func serveRaw(t *testing.T, serve func(net.Conn)) *countingListener {
	t.Helper()
	ln := listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln
}

func TestTCPTransportRejectsBadResponses(t *testing.T) {
	checkGoroutines(t)
	ln := fakeLeader(t)
	tr := newTransport(t, ln.Addr().String(), TCPOptions{MaxFrameBytes: 1 << 20})
	fetch := func(mode int32) error {
		_, err := tr.Fetch(context.Background(), 0, &FetchRequest{MaxBytes: mode})
		return err
	}
	require.NoError(t, fetch(fakeOK))
	for _, tc := range badResponses {
		err := fetch(tc.mode)
		require.ErrorIs(t, err, tc.want, tc.name)
		// The connection was dropped or is still in sync: the next fetch works.
		require.NoError(t, fetch(fakeOK), tc.name)
	}

	// A pooled connection the peer closed is replaced once, transparently.
	accepted := ln.accepted.Load()
	require.NoError(t, fetch(fakeAnswerThenClose))
	require.NoError(t, fetch(fakeOK))
	require.Equal(t, accepted+1, ln.accepted.Load())
}

func TestTCPFetchCancelTimeoutClose(t *testing.T) {
	checkGoroutines(t)
	ln := fakeLeader(t) // fakeNever: the request is read, never answered
	addr := ln.Addr().String()
	never := &FetchRequest{MaxBytes: fakeNever, MaxWaitMs: 60_000}

	t.Run("cancel", func(t *testing.T) {
		tr := newTransport(t, addr, TCPOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := tr.Fetch(ctx, 0, never)
			done <- err
		}()
		waitAccepted(t, ln, 0, done) // the request is on its way
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		// The abandoned connection is not reused.
		require.NoError(t, fetchOK(tr))
	})
	t.Run("deadline", func(t *testing.T) {
		tr := newTransport(t, addr, TCPOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := tr.Fetch(ctx, 0, never)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("request timeout", func(t *testing.T) {
		tr := newTransport(t, addr, TCPOptions{RequestTimeout: 50 * time.Millisecond})
		_, err := tr.Fetch(context.Background(), 0, &FetchRequest{MaxBytes: fakeNever})
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.NoError(t, fetchOK(tr))
	})
	t.Run("close", func(t *testing.T) {
		tr, err := NewTCPTransport(TCPOptions{Resolve: func(int32) (string, error) { return addr, nil }})
		require.NoError(t, err)
		before := ln.accepted.Load()
		done := make(chan error, 1)
		go func() {
			_, err := tr.Fetch(context.Background(), 0, never)
			done <- err
		}()
		waitAccepted(t, ln, before, done)
		require.NoError(t, tr.Close())
		require.ErrorIs(t, <-done, ErrClosed)
		require.ErrorIs(t, fetchOK(tr), ErrClosed)
		require.NoError(t, tr.Close())
	})
}

// waitAccepted waits until ln accepted more than before connections,
// failing if the fetch meant to connect ends first.
func waitAccepted(t *testing.T, ln *countingListener, before int32, done chan error) {
	t.Helper()
	for ln.accepted.Load() == before {
		select {
		case err := <-done:
			t.Fatalf("the fetch ended before connecting: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

func fetchOK(tr *TCPTransport) error {
	_, err := tr.Fetch(context.Background(), 0, &FetchRequest{MaxBytes: fakeOK})
	return err
}

func TestTCPUnreachable(t *testing.T) {
	checkGoroutines(t)
	ln := listen(t)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	tr := newTransport(t, addr, TCPOptions{DialTimeout: 5 * time.Second})
	_, err := tr.Fetch(context.Background(), 3, testRequest(1))
	require.ErrorIs(t, err, ErrUnreachable)

	unknown := errors.New("no such node")
	tr2, err := NewTCPTransport(TCPOptions{Resolve: func(int32) (string, error) { return "", unknown }})
	require.NoError(t, err)
	defer tr2.Close()
	_, err = tr2.Fetch(context.Background(), 3, testRequest(1))
	require.ErrorIs(t, err, ErrUnreachable)
	require.ErrorIs(t, err, unknown)

	_, err = NewTCPTransport(TCPOptions{})
	require.Error(t, err, "Resolve is required")
	_, err = NewTCPTransport(TCPOptions{Resolve: tr2.opts.Resolve, MaxFrameBytes: 100})
	require.Error(t, err)
	_, err = NewTCPServer(nil, nil, TCPOptions{})
	require.Error(t, err)
}

// selfSigned returns a server config with a fresh self-signed ECDSA
// certificate for 127.0.0.1 and a client config that trusts it.
func selfSigned(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "replog test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}}, MinVersion: tls.VersionTLS13},
		&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
}

func TestTCPTLS(t *testing.T) {
	checkGoroutines(t)
	serverCfg, clientCfg := selfSigned(t)
	data := testData(200 << 10)
	f := segmentFile(t, data)
	_, ln := startServer(t, echoHandler(f, data, nil), TCPOptions{TLSConfig: serverCfg})
	addr := ln.Addr().String()

	tr := newTransport(t, addr, TCPOptions{TLSConfig: clientCfg})
	for i := 0; i < 3; i++ {
		req := testRequest(4)
		resp, err := tr.Fetch(context.Background(), 0, req)
		require.NoError(t, err)
		checkEcho(t, data, req, resp)
	}
	require.Equal(t, int32(1), ln.accepted.Load())

	// A client that does not trust the certificate cannot connect.
	_, otherCfg := selfSigned(t)
	untrusting := newTransport(t, addr, TCPOptions{TLSConfig: otherCfg})
	_, err := untrusting.Fetch(context.Background(), 0, testRequest(1))
	require.ErrorIs(t, err, ErrUnreachable)
	var verr *tls.CertificateVerificationError
	require.ErrorAs(t, err, &verr)

	// Nor can a plain TCP client: it gets no fetch response.
	plain := newTransport(t, addr, TCPOptions{RequestTimeout: 10 * time.Second})
	_, err = plain.Fetch(context.Background(), 0, testRequest(1))
	require.Error(t, err)

	// The server still serves TLS clients.
	_, err = tr.Fetch(context.Background(), 0, testRequest(2))
	require.NoError(t, err)
}

// tcpReplica is one node of a replicated partition over TCP loopback.
type tcpReplica struct {
	id     int32
	log    *log.Log
	rep    *Replicator
	tr     *TCPTransport
	srv    *TCPServer
	closed bool
}

func (r *tcpReplica) close(t testing.TB) {
	t.Helper()
	if r.closed {
		return
	}
	r.closed = true
	require.NoError(t, r.srv.Close())
	require.NoError(t, r.rep.Close())
	require.NoError(t, r.tr.Close())
	require.NoError(t, r.log.Close())
}

// startTCPReplicas starts n replicas of tp, each with its own log, TCP
// transport and server on 127.0.0.1; the cleanup closes them all.
func startTCPReplicas(t testing.TB, n int, tp TopicPartition, cfg Config, lopts log.Options) []*tcpReplica {
	t.Helper()
	return startTCPReplicasWith(t, n, tp, cfg, lopts, TCPOptions{}, TCPOptions{})
}

// startTCPReplicasWith is startTCPReplicas with the servers' and the
// transports' options (the transports' Resolve is set here).
func startTCPReplicasWith(t testing.TB, n int, tp TopicPartition, cfg Config, lopts log.Options, srvOpts, trOpts TCPOptions) []*tcpReplica {
	t.Helper()
	dirs := make([]string, n) // made first: removed after the replicas are closed
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	trOpts.Resolve = func(id int32) (string, error) {
		if id < 0 || int(id) >= len(addrs) {
			return "", fmt.Errorf("unknown node %d", id)
		}
		return addrs[id], nil
	}
	reps := make([]*tcpReplica, n)
	t.Cleanup(func() {
		for _, r := range reps {
			if r != nil {
				r.close(t)
			}
		}
	})
	for i := range reps {
		l, err := log.Open(dirs[i], lopts)
		require.NoError(t, err)
		tr, err := NewTCPTransport(trOpts)
		require.NoError(t, err)
		c := cfg
		c.ReplicaID = int32(i)
		rep, err := New(c, tr)
		require.NoError(t, err)
		require.NoError(t, rep.AddPartition(tp, l))
		srv, err := NewTCPServer(rep, lns[i], srvOpts)
		require.NoError(t, err)
		reps[i] = &tcpReplica{id: int32(i), log: l, rep: rep, tr: tr, srv: srv}
	}
	return reps
}

// makeBatch builds a batch of values without a testing.TB, for producer
// goroutines.
func makeBatch(values []string) ([]byte, error) {
	bb := log.NewBatchBuilder()
	for _, v := range values {
		bb.Add(time.Now().UnixMilli(), nil, []byte(v))
	}
	return bb.Build(nil)
}

// readAllBatches returns every batch of l, across all segments.
func readAllBatches(t *testing.T, l *log.Log) []byte {
	t.Helper()
	var all []byte
	for off := l.LogStartOffset(); off < l.LogEndOffset(); {
		chunk, err := l.Read(nil, off, log.ReadOptions{MaxBytes: 64 << 10})
		require.NoError(t, err)
		require.NotEmpty(t, chunk)
		for rest := chunk; len(rest) > 0; {
			b, r, err := log.SplitBatch(rest)
			require.NoError(t, err)
			off, rest = b.NextOffset(), r
		}
		all = append(all, chunk...)
	}
	return all
}

// recordValues maps each offset of l to its record's value.
func recordValues(t *testing.T, l *log.Log) map[int64]string {
	t.Helper()
	values := map[int64]string{}
	for rest := readAllBatches(t, l); len(rest) > 0; {
		b, r, err := log.SplitBatch(rest)
		require.NoError(t, err)
		it := b.Records()
		for it.Next() {
			values[it.Record().Offset] = string(it.Record().Value)
		}
		require.NoError(t, it.Err())
		rest = r
	}
	return values
}

type ackedBatch struct {
	first  int64
	values []string
}

// TestTCPFailoverAcksAll: three replicas over TCP loopback; a producer
// writes with acks=all (MinInsyncReplicas 2) while the leader is closed
// under it, another replica becomes leader at a higher epoch and the last
// one follows it. Every acknowledged record is on the new leader at its
// offset, and the survivors' logs converge batch for batch.
func TestTCPFailoverAcksAll(t *testing.T) {
	checkGoroutines(t)
	tp := TopicPartition{Topic: "t", Partition: 0}
	reps := startTCPReplicas(t, 3, tp,
		Config{ClusterID: "c", MinInsyncReplicas: 2, FetchMaxWait: 50 * time.Millisecond, FetchBackoff: 10 * time.Millisecond},
		log.Options{SegmentBytes: 16 << 10}) // several segments
	require.NoError(t, reps[0].rep.BecomeLeader(tp, 1, []int32{0, 1, 2}, []int32{0, 1, 2}))
	require.NoError(t, reps[1].rep.BecomeFollower(tp, 1, 0))
	require.NoError(t, reps[2].rep.BecomeFollower(tp, 1, 0))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu    sync.Mutex
		acked []ackedBatch
	)
	enough := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			values := []string{fmt.Sprintf("e1-%d-a", i), fmt.Sprintf("e1-%d-b", i), fmt.Sprintf("e1-%d-c", i)}
			batch, err := makeBatch(values)
			if err != nil {
				done <- err
				return
			}
			info, err := reps[0].rep.Produce(ctx, tp, batch, AcksAll)
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			acked = append(acked, ackedBatch{info.FirstOffset, values})
			if len(acked) == 40 {
				close(enough)
			}
			mu.Unlock()
		}
	}()
	select {
	case <-enough:
	case err := <-done:
		t.Fatalf("producer stopped early: %v", err)
	}
	// Close the leader under the producer: its server first, then the
	// Replicator, which releases the acks=all wait in flight.
	require.NoError(t, reps[0].srv.Close())
	require.NoError(t, reps[0].rep.Close())
	require.ErrorIs(t, <-done, ErrClosed)
	reps[0].close(t)

	require.NoError(t, reps[1].rep.BecomeLeader(tp, 2, []int32{0, 1, 2}, []int32{1, 2}))
	require.NoError(t, reps[2].rep.BecomeFollower(tp, 2, 1))
	for i := 0; i < 20; i++ {
		values := []string{fmt.Sprintf("e2-%d", i)}
		info, err := reps[1].rep.Produce(ctx, tp, batchOfValues(t, values), AcksAll)
		require.NoError(t, err)
		acked = append(acked, ackedBatch{info.FirstOffset, values})
	}

	leader, follower := reps[1].log, reps[2].log
	for follower.LogEndOffset() != leader.LogEndOffset() || follower.HighWatermark() != leader.HighWatermark() {
		require.NoError(t, ctx.Err(), "the follower did not catch up")
		time.Sleep(5 * time.Millisecond)
	}
	values := recordValues(t, leader)
	for _, a := range acked {
		for j, v := range a.values {
			require.Equal(t, v, values[a.first+int64(j)], "acknowledged record at offset %d", a.first+int64(j))
		}
	}
	want := readAllBatches(t, leader)
	require.Equal(t, want, readAllBatches(t, follower), "the survivors' logs differ")
	require.Greater(t, len(leader.LeaderEpochs()), 1)
	assert.Equal(t, leader.LeaderEpochs(), follower.LeaderEpochs())
}

func batchOfValues(t testing.TB, values []string) []byte {
	t.Helper()
	b, err := makeBatch(values)
	require.NoError(t, err)
	return b
}
