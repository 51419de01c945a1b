package replication

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/replog/replog/send"
)

// Defaults of TCPOptions.
const (
	DefaultDialTimeout     = 10 * time.Second // DefaultDialTimeout: TCPOptions.DialTimeout
	DefaultRequestTimeout  = 30 * time.Second // DefaultRequestTimeout: TCPOptions.RequestTimeout
	DefaultIdleTimeout     = 5 * time.Minute  // DefaultIdleTimeout: TCPOptions.IdleTimeout
	DefaultMaxIdleConns    = 2                // DefaultMaxIdleConns: TCPOptions.MaxIdleConns
	DefaultMaxRequestBytes = 4 << 20          // DefaultMaxRequestBytes: TCPOptions.MaxRequestBytes
)

// TCPOptions configures NewTCPTransport and NewTCPServer; each uses the
// fields that concern it. Zero fields get defaults.
type TCPOptions struct {
	// Resolve returns the "host:port" address of a node (transport only,
	// required there). It is called for every Fetch, so addresses may
	// change; pooled connections to an old address are closed.
	Resolve func(node int32) (string, error)
	// TLSConfig, when set, secures the connections: the transport dials
	// with it (ServerName defaults to the host of the address) and the
	// server wraps its listener with it.
	TLSConfig *tls.Config
	// DialTimeout bounds connecting, TLS handshake included (default
	// DefaultDialTimeout).
	DialTimeout time.Duration
	// RequestTimeout bounds a request beyond its long-poll time: the
	// transport gives a fetch MaxWaitMs + RequestTimeout to be answered,
	// and the server gives a response (and a TLS handshake)
	// RequestTimeout to be written (default DefaultRequestTimeout).
	RequestTimeout time.Duration
	// MaxFrameBytes is the largest frame, its 16-byte header included,
	// that is read or written (default DefaultMaxFrameBytes; at least
	// 4 KiB). A larger announced length is refused with ErrFrameTooLarge
	// before anything is allocated for it. A transport asks for no more
	// records than a response of this size holds, and a server sends no
	// more (a request's MaxBytes is lowered to fit); a batch larger than
	// that alone is never sent.
	MaxFrameBytes int
	// MaxRequestBytes is the largest fetch request frame, its header
	// included, that a server reads and a transport sends (default
	// DefaultMaxRequestBytes, or MaxFrameBytes when that is smaller; at
	// least 4 KiB and at most MaxFrameBytes). A request takes 30 bytes
	// plus its topic name per partition: 4 MiB holds about 72,000
	// partitions of 28-byte topic names. A server refuses a larger request from its
	// header, before allocating anything for its body: it answers with an
	// error frame (ErrFrameTooLarge), reads and discards the body (at most
	// 16 MiB, within RequestTimeout) so that the peer gets that answer
	// rather than a reset connection, and closes the connection. A
	// transport refuses to send one with ErrFrameTooLarge.
	MaxRequestBytes int
	// IdleTimeout is how long a server waits for the next request on a
	// connection before it closes the connection (default
	// DefaultIdleTimeout; negative: no limit). Once a request's header
	// arrived, its body must arrive within RequestTimeout. The time a
	// request is handled (a fetch's long poll) does not count. A
	// transport replaces a pooled connection the server closed.
	IdleTimeout time.Duration
	// MaxIdleConns is how many idle connections the transport keeps per
	// node for reuse (default DefaultMaxIdleConns).
	MaxIdleConns int
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

func (o TCPOptions) withDefaults() (TCPOptions, error) {
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxFrameBytes == 0 {
		o.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = min(DefaultMaxRequestBytes, o.MaxFrameBytes)
	}
	if o.MaxIdleConns == 0 {
		o.MaxIdleConns = DefaultMaxIdleConns
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, o.validate()
}

// validate checks options that withDefaults completed.
func (o TCPOptions) validate() error {
	switch {
	case o.DialTimeout < 0, o.RequestTimeout < 0:
		return fmt.Errorf("replication: negative TCP timeout")
	case o.MaxFrameBytes < minFrameBytes || uint64(o.MaxFrameBytes) > 1<<32-1:
		return fmt.Errorf("replication: MaxFrameBytes %d outside [4 KiB, 4 GiB)", o.MaxFrameBytes)
	case o.MaxRequestBytes < minFrameBytes || o.MaxRequestBytes > o.MaxFrameBytes:
		return fmt.Errorf("replication: MaxRequestBytes %d outside [4 KiB, MaxFrameBytes %d]", o.MaxRequestBytes, o.MaxFrameBytes)
	case o.MaxIdleConns < 0:
		return fmt.Errorf("replication: negative MaxIdleConns")
	}
	return nil
}

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
// Fetch errors wrap ErrUnreachable (resolving or dialing failed),
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

// longAgo is a deadline in the past, which interrupts blocked I/O.
var longAgo = time.Unix(1, 0)

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
			clear(c.resp.Partitions) // they alias body
			return nil, body, true, false, err
		}
		resp, err := decodeFetchResponse(body)
		return resp, body, true, false, err
	case msgError:
		return nil, body, true, false, decodeError(body)
	}
	return nil, nil, false, false, fmt.Errorf("%w: unexpected message type %d", ErrMalformedFrame, h.typ)
}

// peerGone reports an error of a connection the peer closed.
func peerGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
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

// TCPServer serves fetches over TCP (optionally TLS) with a FetchHandler,
// usually a Replicator: one goroutine accepts connections and one per
// connection reads its requests in order, calls the handler and writes
// each response with a send.Builder (headers in one gathering write,
// records from the segment files, with sendfile for large regions on
// Linux).
//
// Bad input never crashes the server: a request that cannot be decoded, of
// an unknown version or type, or refused by the handler (for example with
// ErrClusterMismatch) gets an error frame carrying the error's message; a
// frame over MaxRequestBytes or with a bad magic gets an error frame and the
// connection is closed, since the stream cannot be trusted any longer.
// Neither can a peer that pins a connection: one idle past IdleTimeout
// between requests, or whose request body does not arrive within
// RequestTimeout of its header, is closed.
//
// The handler receives a context that ends when the server is closed, and
// must return soon after it does. A TCPServer is safe for concurrent use;
// Close stops the accept loop and every connection goroutine and waits for
// them.
type TCPServer struct {
	handler FetchHandler
	ln      net.Listener
	opts    TCPOptions
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	closed    bool
	closeDone chan struct{} // closed when the first Close is done
}

// NewTCPServer serves handler on ln (wrapped with opts.TLSConfig when set)
// until Close, which also closes ln.
func NewTCPServer(handler FetchHandler, ln net.Listener, opts TCPOptions) (*TCPServer, error) {
	if handler == nil || ln == nil {
		return nil, fmt.Errorf("replication: NewTCPServer needs a handler and a listener")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.TLSConfig != nil {
		ln = tls.NewListener(ln, o.TLSConfig)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &TCPServer{handler: handler, ln: ln, opts: o, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}, closeDone: make(chan struct{})}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server listens on.
func (s *TCPServer) Addr() net.Addr { return s.ln.Addr() }

func (s *TCPServer) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: retry with backoff.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.opts.Logger.Warn("replication: accept failed", "err", err, "retry", delay)
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-s.ctx.Done():
				timer.Stop()
				return
			}
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		s.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(nc)
	}
}

// keepResponsePartitions is the most partitions a response may have for
// a server connection to keep its buffers for the next one.
const keepResponsePartitions = 4096

// serverConn is a connection of a TCPServer with the buffers it reuses
// from request to request.
type serverConn struct {
	nc      net.Conn
	br      *bufio.Reader
	hdr     [frameHeaderSize]byte
	body    []byte
	scratch []byte // a response's headers
	out     []byte // an error frame
	b       send.Builder
	// With a Replicator for handler, requests are decoded into req, with
	// their names interned in names, and answered in serve.
	req   FetchRequest
	names nameTable
	serve serveScratch
}

// serve reads requests from nc and answers them, in order, until the
// peer leaves or stays idle too long, a write fails, the stream is
// corrupt, or Close.
func (s *TCPServer) serve(nc net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
		_ = nc.Close()
	}()
	if !s.handshake(nc) {
		return
	}
	c := &serverConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10)}
	for {
		corr, req, ok := s.readRequest(c)
		if ok && req != nil {
			ok = s.answer(c, corr, req)
		}
		c.forget()
		if !ok {
			return
		}
	}
}

// forget drops what c keeps of its last request, answered or not: its
// answer's segment files, and a decoded request or answer of more than
// keepResponsePartitions partitions, which a peer could otherwise pin for
// the connection's life with small requests.
func (c *serverConn) forget() {
	clear(c.serve.resp.Partitions)
	if cap(c.serve.resp.Partitions) > keepResponsePartitions {
		c.serve.resp = FetchResponse{}
	}
	if cap(c.req.Partitions) > keepResponsePartitions {
		c.req = FetchRequest{}
	}
}

// handshake completes a TLS connection's handshake within RequestTimeout;
// it reports whether the connection may be used.
func (s *TCPServer) handshake(nc net.Conn) bool {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return true
	}
	_ = tc.SetDeadline(time.Now().Add(s.opts.RequestTimeout))
	if err := tc.HandshakeContext(s.ctx); err != nil {
		s.opts.Logger.Warn("replication: TLS handshake failed", "remote", nc.RemoteAddr(), "err", err)
		return false
	}
	_ = tc.SetDeadline(time.Time{})
	return true
}

// readRequest reads and decodes the next request. ok false means the
// connection must be closed; a nil req with ok means the request was
// answered with an error frame.
func (s *TCPServer) readRequest(c *serverConn) (corr uint64, req *FetchRequest, ok bool) {
	h, err := s.readFrame(c)
	if err != nil {
		return h.corr, nil, false
	}
	req, err = s.decodeRequest(c, h)
	if cap(c.body) > 1<<20 {
		c.body = nil // do not keep a huge request's buffer
	}
	if err != nil {
		return h.corr, nil, s.writeError(c, h.corr, err)
	}
	return h.corr, req, true
}

// readFrame reads a frame of at most MaxRequestBytes: its header, which
// may take IdleTimeout to come, then its body into c.body within
// RequestTimeout. Errors are logged and, when the stream is bad, answered.
func (s *TCPServer) readFrame(c *serverConn) (frameHeader, error) {
	setReadTimeout(c.nc, s.opts.IdleTimeout)
	h, err := readFrameHeader(c.br, &c.hdr, s.opts.MaxRequestBytes)
	if err != nil {
		s.badHeader(c, h, err)
		return h, err
	}
	setReadTimeout(c.nc, s.opts.RequestTimeout)
	if c.body, err = readBody(c.br, h.bodyLen, c.body, 0); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.opts.Logger.Warn("replication: request body not received within RequestTimeout; closing the connection", "remote", c.nc.RemoteAddr(), "bytes", h.bodyLen)
		}
		return h, err
	}
	return h, nil
}

// setReadTimeout sets nc's read deadline d from now, or none when d < 0.
func setReadTimeout(nc net.Conn, d time.Duration) {
	var deadline time.Time
	if d >= 0 {
		deadline = time.Now().Add(d)
	}
	_ = nc.SetReadDeadline(deadline)
}

// badHeader logs why no request header could be read and, when the
// stream is bad, tells the peer before the connection is closed.
func (s *TCPServer) badHeader(c *serverConn, h frameHeader, err error) {
	switch {
	case peerGone(err), errors.Is(err, net.ErrClosed), s.ctx.Err() != nil:
		// The peer left (closing a connection with a response unread
		// resets it), or Close.
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.opts.Logger.Debug("replication: closing a connection idle past IdleTimeout", "remote", c.nc.RemoteAddr())
	default:
		s.opts.Logger.Warn("replication: bad frame; closing the connection", "remote", c.nc.RemoteAddr(), "err", err)
		if (errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrMalformedFrame)) && s.writeError(c, h.corr, err) && errors.Is(err, ErrFrameTooLarge) {
			s.drainRefused(c, h)
		}
	}
}

// maxRefusedDrain bounds what drainRefused reads of a refused request.
const maxRefusedDrain = 16 << 20

// drainRefused ends the server's side of a connection whose request was
// refused as too large, once its error frame is written, then reads and
// discards that request's body (up to maxRefusedDrain bytes, within
// RequestTimeout). Closing a socket with unread data resets the
// connection, and a peer still writing that body would then see
// "connection reset" instead of the error frame.
func (s *TCPServer) drainRefused(c *serverConn, h frameHeader) {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite() // the peer reads the error, then EOF
	}
	setReadTimeout(c.nc, s.opts.RequestTimeout)
	_, _ = io.CopyN(io.Discard, c.br, int64(min(h.bodyLen, maxRefusedDrain)))
}

// decodeRequest decodes the request in c.body: into c.req when the handler
// is a Replicator, which keeps nothing of it, else into a new one.
func (s *TCPServer) decodeRequest(c *serverConn, h frameHeader) (*FetchRequest, error) {
	if err := h.checkVersion(); err != nil {
		return nil, err
	}
	if h.typ != msgFetchRequest {
		return nil, fmt.Errorf("%w: unexpected message type %d", ErrMalformedFrame, h.typ)
	}
	if _, ok := s.handler.(*Replicator); !ok {
		return decodeFetchRequest(c.body)
	}
	if err := decodeFetchRequestInto(c.body, &c.req, &c.names); err != nil {
		return nil, err
	}
	return &c.req, nil
}

// handle has the handler answer req, in c.serve when it is a Replicator.
// (Only then: a handler that embeds one, to wrap its HandleFetch, must
// have that HandleFetch called.)
func (s *TCPServer) handle(c *serverConn, req *FetchRequest) (*FetchResponse, error) {
	if r, ok := s.handler.(*Replicator); ok {
		return r.handleFetchScratch(s.ctx, req, &c.serve)
	}
	return s.handler.HandleFetch(s.ctx, req)
}

// answer has the handler serve req and writes its response, or an error
// frame; it reports whether the connection may go on.
func (s *TCPServer) answer(c *serverConn, corr uint64, req *FetchRequest) bool {
	req.MaxBytes = framedMaxBytes(req, s.opts.MaxFrameBytes)
	resp, err := s.handle(c, req)
	if err != nil {
		return s.writeError(c, corr, err)
	}
	c.b.Reset()
	var dropped int
	c.scratch, dropped, err = buildFetchResponse(&c.b, c.scratch, corr, resp, s.opts.MaxFrameBytes)
	if err != nil {
		return s.writeError(c, corr, err)
	}
	if dropped > 0 {
		s.opts.Logger.Warn("replication: fetch response trimmed to MaxFrameBytes", "remote", c.nc.RemoteAddr(), "partitions", dropped)
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
	_, err = c.b.WriteTo(c.nc)
	c.b.Reset() // forget the segment files
	if len(resp.Partitions) > keepResponsePartitions || cap(c.scratch) > 1<<20 {
		// Do not keep a huge response's buffers for the connection's
		// life: a peer could pin them with small requests.
		c.scratch, c.b = nil, send.Builder{}
	}
	if err != nil && s.ctx.Err() == nil {
		s.opts.Logger.Warn("replication: writing a fetch response failed", "remote", c.nc.RemoteAddr(), "err", err)
	}
	return err == nil
}

// writeError answers a request with an error frame; it reports whether
// the write succeeded.
func (s *TCPServer) writeError(c *serverConn, corr uint64, err error) bool {
	c.out = appendErrorFrame(c.out[:0], corr, err.Error())
	_ = c.nc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
	_, werr := c.nc.Write(c.out)
	return werr == nil
}

// Close stops accepting, closes the listener and every connection, ends
// the handlers' context, and waits for the server's goroutines. It is safe
// to call more than once.
func (s *TCPServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.closeDone // a concurrent Close waits as the first one does
		return nil
	}
	s.closed = true
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.cancel()
	err := s.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	s.wg.Wait()
	close(s.closeDone)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
