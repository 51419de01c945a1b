package replication

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// TCPTransport is the Transport of a follower over TCP (optionally TLS).
//
// A connection carries one request at a time: a request frame, then its
// response frame with the same correlation id (no pipelining; the fetcher
// of a Replicator has one fetch in flight per leader anyway). Concurrent
// Fetch calls to one node use separate connections; after a complete
// exchange a connection goes back to the node's idle pool (at most
// MaxIdleConns), and a pooled connection the peer has closed meanwhile
// (a server closes connections idle past its IdleTimeout) is replaced
// transparently: the fetch is sent again once, on a new connection. A
// canceled context or a timeout closes the connection, since its stream is
// mid-response.
//
// Fetch errors wrap ErrUnreachable (resolving or dialing failed, or the
// peer closed or reset the connection before its answer was complete),
// ErrClosed (the transport was closed), the context's error,
// os.ErrDeadlineExceeded (RequestTimeout), ErrFrameTooLarge (a request
// over MaxRequestBytes, not sent, or a response over MaxFrameBytes),
// ErrMalformedFrame (a bad response), or ErrRemote (an error frame, see
// ErrRemote). The Records of a returned response alias one buffer
// allocated for that response, which belongs to the caller.
//
// A Replicator's fetcher does not call Fetch: it has a response larger
// than 256 KiB applied while it arrives, read by a goroutine that ends
// before the fetch returns, into a buffer it keeps for the next fetch
// (see "Catching up" in the package documentation).
//
// A TCPTransport is safe for concurrent use. Fetch starts no goroutines;
// Close closes every connection, failing Fetch calls in flight.
type TCPTransport struct {
	opts TCPOptions
	corr atomic.Uint64

	mu     sync.Mutex
	idle   map[int32][]*tcpConn
	conns  map[*tcpConn]struct{} // every open connection, idle or in use
	closed bool

	// closing is canceled by Close: it ends the dials in flight, whose
	// connections are not in conns yet.
	closing context.Context
	cancel  context.CancelFunc
}

// tcpConn is one client connection; it is used by one Fetch at a time.
type tcpConn struct {
	node int32
	addr string
	nc   net.Conn
	br   *bufio.Reader
	wbuf []byte
	hdr  [frameHeaderSize]byte
	// A streamed fetch's response is decoded into resp, with its names
	// interned in names.
	resp  FetchResponse
	names nameTable
	// watched is the Done channel of the context whose end interrupts
	// the connection's I/O while a fetch of it is in progress (busy), and
	// unwatch stops that. It stays registered between fetches of the same
	// context (a Replicator's fetcher passes one for its life), so that a
	// fetch does not register one each. busyMu orders an interruption
	// against the start and end of fetches: one that comes while c is
	// idle, or busy with another context, does nothing.
	watched <-chan struct{}
	unwatch func() bool
	busyMu  sync.Mutex
	busy    <-chan struct{}
}

// watch makes the end of ctx interrupt c's fetches of ctx.
func (c *tcpConn) watch(ctx context.Context) {
	done := ctx.Done()
	if done == c.watched {
		return
	}
	if c.unwatch != nil {
		c.unwatch()
		c.watched, c.unwatch = nil, nil
	}
	if done != nil {
		c.watched = done
		c.unwatch = context.AfterFunc(ctx, func() { c.interrupt(done) })
	}
}

// interrupt ends the I/O of c's fetch in progress if it is one of the
// context whose Done channel is done.
func (c *tcpConn) interrupt(done <-chan struct{}) {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	if c.busy == done {
		_ = c.nc.SetDeadline(longAgo)
	}
}

// begin marks c busy with a fetch of ctx until deadline.
func (c *tcpConn) begin(ctx context.Context, deadline time.Time) error {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	c.busy = ctx.Done()
	return c.nc.SetDeadline(deadline)
}

// end marks c idle: the end of the last fetch's context no longer
// interrupts it.
func (c *tcpConn) end() {
	c.busyMu.Lock()
	c.busy = nil
	c.busyMu.Unlock()
}

// close closes c and stops watching its context. Only c's user, or the
// pool's owner while c is idle, may call it.
func (c *tcpConn) close() {
	if c.unwatch != nil {
		c.unwatch()
		c.watched, c.unwatch = nil, nil
	}
	_ = c.nc.Close()
}

// NewTCPTransport returns a transport that reaches nodes at the addresses
// opts.Resolve gives.
func NewTCPTransport(opts TCPOptions) (*TCPTransport, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Resolve == nil {
		return nil, fmt.Errorf("replication: TCPOptions.Resolve is required by NewTCPTransport")
	}
	closing, cancel := context.WithCancel(context.Background())
	return &TCPTransport{opts: o, idle: map[int32][]*tcpConn{}, conns: map[*tcpConn]struct{}{}, closing: closing, cancel: cancel}, nil
}

// Fetch sends req to node leader and waits for its answer (see
// Transport and TCPTransport).
func (t *TCPTransport) Fetch(ctx context.Context, leader int32, req *FetchRequest) (*FetchResponse, error) {
	resp, _, err := t.fetchInto(ctx, leader, req, nil)
	return resp, err
}

// fetchInto is Fetch reading the response's body into buf when it fits,
// else into a new buffer. It returns that buffer, which the response's
// Records alias: once done with the response, the caller may pass it to
// the next fetchInto (the Replicator's fetcher does, so that catching up
// does not allocate, fault in and collect a FetchMaxBytes buffer per
// fetch). On error it returns buf.
func (t *TCPTransport) fetchInto(ctx context.Context, leader int32, req *FetchRequest, buf []byte) (*FetchResponse, []byte, error) {
	return t.fetch(ctx, leader, req, buf, nil)
}

// fetchStream is fetchInto handing the response to sink (streamingFetcher)
// instead of returning it: as its bytes arrive when the response is
// larger than a stream piece and fits buf or the size req asks for, else
// once it was read whole. An error may come after part of the response
// went to sink.
func (t *TCPTransport) fetchStream(ctx context.Context, leader int32, req *FetchRequest, buf []byte, sink fetchSink) ([]byte, error) {
	_, buf, err := t.fetch(ctx, leader, req, buf, sink)
	return buf, err
}

// fetch is fetchInto, or fetchStream when sink is set.
func (t *TCPTransport) fetch(ctx context.Context, leader int32, req *FetchRequest, buf []byte, sink fetchSink) (*FetchResponse, []byte, error) {
	if req == nil {
		return nil, buf, fmt.Errorf("%w: no fetch request", ErrMalformedFrame)
	}
	if err := ctx.Err(); err != nil {
		return nil, buf, err
	}
	if t.closing.Err() != nil {
		return nil, buf, fmt.Errorf("%w: transport", ErrClosed)
	}
	addr, err := t.opts.Resolve(leader)
	if err != nil {
		return nil, buf, fmt.Errorf("%w: node %d: %w", ErrUnreachable, leader, err)
	}
	for attempt := 0; ; attempt++ {
		// A retry dials: the other pooled connections are likely dead too.
		c, reused, err := t.conn(ctx, leader, addr, attempt == 0)
		if err != nil {
			return nil, buf, err
		}
		resp, body, keep, stale, err := t.roundTrip(ctx, c, req, buf, sink)
		t.release(c, keep)
		if err != nil && reused && stale && attempt == 0 && ctx.Err() == nil {
			// The peer closed the idle connection (before answering, so
			// sink got nothing): try a new one.
			continue
		}
		if err != nil {
			return nil, buf, t.fetchErr(ctx, leader, addr, err)
		}
		return resp, body, nil
	}
}

// fetchErr gives err the context a caller matches on.
func (t *TCPTransport) fetchErr(ctx context.Context, leader int32, addr string, err error) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("%w: transport: %w", ErrClosed, err)
	case ctx.Err() != nil:
		return fmt.Errorf("replication: fetch from node %d at %s: %w", leader, addr, ctx.Err())
	case peerGone(err):
		return fmt.Errorf("%w: node %d at %s closed the connection: %w", ErrUnreachable, leader, addr, err)
	}
	return fmt.Errorf("replication: fetch from node %d at %s: %w", leader, addr, err)
}

// conn returns an idle connection to node at addr when pooled allows it
// (reused), or dials one.
func (t *TCPTransport) conn(ctx context.Context, node int32, addr string, pooled bool) (c *tcpConn, reused bool, err error) {
	if pooled {
		if c, err = t.idleConn(node, addr); c != nil || err != nil {
			return c, c != nil, err
		}
	}
	c, err = t.dial(ctx, node, addr)
	return c, false, err
}

// idleConn takes an idle connection to node at addr from the pool, if
// there is one, and closes those to another address.
func (t *TCPTransport) idleConn(node int32, addr string) (*tcpConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("%w: transport", ErrClosed)
	}
	idle := t.idle[node]
	for len(idle) > 0 {
		c := idle[len(idle)-1]
		idle = idle[:len(idle)-1]
		if c.addr == addr {
			t.idle[node] = idle
			return c, nil
		}
		delete(t.conns, c)
		c.close() // the node moved
	}
	delete(t.idle, node)
	return nil, nil
}

// dial opens a new connection to node at addr; Close ends it.
func (t *TCPTransport) dial(ctx context.Context, node int32, addr string) (*tcpConn, error) {
	dctx, cancel := context.WithTimeout(ctx, t.opts.DialTimeout)
	defer cancel()
	defer context.AfterFunc(t.closing, cancel)()
	var nc net.Conn
	var err error
	if t.opts.TLSConfig != nil {
		nc, err = (&tls.Dialer{Config: t.opts.TLSConfig}).DialContext(dctx, "tcp", addr)
	} else {
		nc, err = (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	}
	if err != nil {
		if t.closing.Err() != nil {
			return nil, fmt.Errorf("%w: transport: dial node %d at %s: %w", ErrClosed, node, addr, err)
		}
		if cerr := ctxEnded(ctx); cerr != nil {
			return nil, fmt.Errorf("replication: dial node %d at %s: %w", node, addr, cerr)
		}
		return nil, fmt.Errorf("%w: node %d at %s: %w", ErrUnreachable, node, addr, err)
	}
	// 64 KiB: a response of a few small batches arrives with one read.
	c := &tcpConn{node: node, addr: addr, nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: transport", ErrClosed)
	}
	t.conns[c] = struct{}{}
	return c, nil
}

// ctxEnded is ctx.Err(), or context.DeadlineExceeded once ctx's deadline
// passed: a dial's timer, set from that deadline, may strike just before
// the context's own.
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// release pools c after a complete exchange (keep), else closes it.
func (t *TCPTransport) release(c *tcpConn, keep bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if keep && !t.closed && len(t.idle[c.node]) < t.opts.MaxIdleConns {
		t.idle[c.node] = append(t.idle[c.node], c)
		return
	}
	delete(t.conns, c)
	c.close()
}

// roundTrip sends req on c and reads the answer, its body into buf when
// it fits (body is the buffer used). keep says the stream is still in sync
// (a whole response frame was read); stale says the peer had closed the
// connection before answering.
func (t *TCPTransport) roundTrip(ctx context.Context, c *tcpConn, req *FetchRequest, buf []byte, sink fetchSink) (resp *FetchResponse, body []byte, keep, stale bool, err error) {
	corr := t.corr.Add(1)
	if m := framedMaxBytes(req, t.opts.MaxFrameBytes); m != req.MaxBytes {
		fitted := *req
		fitted.MaxBytes = m
		req = &fitted
	}
	c.wbuf, err = appendFetchRequestFrame(c.wbuf[:0], corr, req)
	if err != nil {
		return nil, nil, true, false, err
	}
	if size := len(c.wbuf); size > t.opts.MaxRequestBytes {
		c.wbuf = nil // the connection stays pooled; not this buffer
		return nil, nil, true, false, fmt.Errorf("%w: request of %d bytes, MaxRequestBytes %d", ErrFrameTooLarge, size, t.opts.MaxRequestBytes)
	}
	deadline := time.Now().Add(time.Duration(max(req.MaxWaitMs, 0))*time.Millisecond + t.opts.RequestTimeout)
	ctxDeadline := false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxDeadline = d, true
	}
	c.watch(ctx)
	err = c.begin(ctx, deadline)
	defer c.end()
	if err != nil {
		return nil, nil, false, false, err
	}
	if err := ctx.Err(); err != nil {
		// It ended before c was busy: its end interrupts nothing.
		return nil, nil, false, false, err
	}
	resp, body, keep, stale, err = t.exchange(c, corr, req, buf, sink)
	if ctx.Err() != nil {
		keep = false // its interruption may have cut the stream
	}
	if ctxDeadline && errors.Is(err, os.ErrDeadlineExceeded) {
		// The connection's timer may fire just before the context's.
		err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return resp, body, keep, stale, err
}

func (t *TCPTransport) exchange(c *tcpConn, corr uint64, req *FetchRequest, buf []byte, sink fetchSink) (*FetchResponse, []byte, bool, bool, error) {
	if _, err := c.nc.Write(c.wbuf); err != nil {
		return nil, nil, false, peerGone(err), err
	}
	if cap(c.wbuf) > 1<<20 {
		c.wbuf = nil // do not keep a huge request's buffer
	}
	h, err := readFrameHeader(c.br, &c.hdr, t.opts.MaxFrameBytes)
	if err != nil {
		return nil, nil, false, peerGone(err), err
	}
	if err := h.checkVersion(); err != nil {
		return nil, nil, false, false, err
	}
	if h.corr != corr {
		return nil, nil, false, false, fmt.Errorf("%w: correlation id %d, expected %d", ErrMalformedFrame, h.corr, corr)
	}
	if h.typ != msgFetchResponse && h.typ != msgError {
		// Refused before its body is read: the connection is dropped.
		return nil, nil, false, false, fmt.Errorf("%w: unexpected message type %d", ErrMalformedFrame, h.typ)
	}
	// The response should be about what was asked for: allocate that much
	// at once, and grow beyond it only as bytes arrive.
	expect := int(max(req.MaxBytes, 0)) + 64<<10
	for i := range req.Partitions {
		expect += minResponsePartitionBytes + len(req.Partitions[i].Topic)
	}
	// A response of one stream piece or less is read at once: a
	// receiver goroutine would only add a hand-off to its latency.
	if sink != nil && h.typ == msgFetchResponse && h.bodyLen > streamPieceBytes && h.bodyLen <= max(cap(buf), expect) {
		body := buf[:0]
		if h.bodyLen > cap(body) {
			body = make([]byte, h.bodyLen)
		}
		s := startBodyStream(c.br, body[:h.bodyLen])
		err := streamFetchResponse(s, sink)
		if err != nil {
			_ = c.nc.SetDeadline(longAgo) // stop the receiver
		}
		<-s.done
		if err != nil {
			return nil, body, false, false, err
		}
		return nil, body, true, false, nil
	}
	if sink != nil && h.typ == msgFetchResponse && h.bodyLen <= c.br.Size() {
		keep, err := c.sinkBuffered(h.bodyLen, len(req.Partitions), sink)
		return nil, buf, keep, false, err
	}
	body, err := readBody(c.br, h.bodyLen, buf[:0], expect)
	if err != nil {
		return nil, nil, false, false, err
	}
	switch h.typ {
	case msgFetchResponse:
		if sink != nil {
			err := decodeFetchResponseInto(body, &c.resp, &c.names)
			if err == nil {
				sinkResponse(&c.resp, sink)
			}
			c.forgetResp(len(req.Partitions)) // they alias body
			return nil, body, true, false, err
		}
		resp, err := decodeFetchResponse(body)
		return resp, body, true, false, err
	default: // msgError
		return nil, body, true, false, decodeError(body)
	}
}

// sinkBuffered hands sink a fetch response body of n bytes, at most the
// connection's read buffer, decoded where the buffer holds it: a
// follower's steady fetches (a batch or a few) then copy nothing out of
// the buffer. keep says the stream is still in step: false when the
// body did not arrive whole; a body that does not decode is consumed.
func (c *tcpConn) sinkBuffered(n, asked int, sink fetchSink) (keep bool, err error) {
	body, err := c.br.Peek(n)
	if err != nil {
		return false, bodyErr(err, n)
	}
	err = decodeFetchResponseInto(body, &c.resp, &c.names)
	if err == nil {
		sinkResponse(&c.resp, sink)
	}
	c.forgetResp(asked) // they alias the read buffer
	_, _ = c.br.Discard(n)
	return true, err
}

// forgetResp drops c.resp's references to the body just handed on, and
// its array when a response of more partitions than the asked ones (and
// than keepResponsePartitions) grew it: a leader could otherwise pin an
// array of MaxFrameBytes/49 partitions, about 2.8 times the frame, for
// the connection's life.
func (c *tcpConn) forgetResp(asked int) {
	if len(c.resp.Partitions) > max(asked, keepResponsePartitions) {
		c.resp = FetchResponse{}
		return
	}
	clear(c.resp.Partitions)
}

// Close closes every connection; Fetch calls in flight fail and later
// ones return ErrClosed. It is safe to call more than once.
func (t *TCPTransport) Close() error {
	t.cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, idle := range t.idle {
		for _, c := range idle {
			c.close()
		}
	}
	for c := range t.conns {
		_ = c.nc.Close() // its user's release stops its watch
	}
	clear(t.conns)
	clear(t.idle)
	return nil
}
