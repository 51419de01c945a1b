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
	DefaultDialTimeout    = 10 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	DefaultMaxIdleConns   = 2
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
	// before anything is allocated for it; a server trims the records of
	// a response that would exceed it.
	MaxFrameBytes int
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
	if o.MaxFrameBytes == 0 {
		o.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if o.MaxIdleConns == 0 {
		o.MaxIdleConns = DefaultMaxIdleConns
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.DialTimeout < 0, o.RequestTimeout < 0:
		return o, fmt.Errorf("replication: negative TCP timeout")
	case o.MaxFrameBytes < 4<<10 || uint64(o.MaxFrameBytes) > 1<<32-1:
		return o, fmt.Errorf("replication: MaxFrameBytes %d outside [4 KiB, 4 GiB)", o.MaxFrameBytes)
	case o.MaxIdleConns < 0:
		return o, fmt.Errorf("replication: negative MaxIdleConns")
	}
	return o, nil
}

// TCPTransport is the Transport of a follower over TCP (optionally TLS).
//
// A connection carries one request at a time: a request frame, then its
// response frame with the same correlation id (no pipelining; the fetcher
// of a Replicator has one fetch in flight per leader anyway). Concurrent
// Fetch calls to one node use separate connections; after a complete
// exchange a connection goes back to the node's idle pool (at most
// MaxIdleConns), and a pooled connection the peer has closed meanwhile is
// replaced transparently once. A canceled context or a timeout closes the
// connection, since its stream is mid-response.
//
// Fetch errors wrap ErrUnreachable (resolving or dialing failed),
// ErrClosed (the transport was closed), the context's error,
// os.ErrDeadlineExceeded (RequestTimeout), ErrFrameTooLarge or
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
}

// tcpConn is one client connection; it is used by one Fetch at a time.
type tcpConn struct {
	node int32
	addr string
	nc   net.Conn
	br   *bufio.Reader
	wbuf []byte
	hdr  [frameHeaderSize]byte
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
	return &TCPTransport{opts: o, idle: map[int32][]*tcpConn{}, conns: map[*tcpConn]struct{}{}}, nil
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
	addr, err := t.opts.Resolve(leader)
	if err != nil {
		return nil, buf, fmt.Errorf("%w: node %d: %w", ErrUnreachable, leader, err)
	}
	for attempt := 0; ; attempt++ {
		c, reused, err := t.conn(ctx, leader, addr)
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

// conn returns an idle connection to node at addr, or dials one.
func (t *TCPTransport) conn(ctx context.Context, node int32, addr string) (*tcpConn, bool, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, false, fmt.Errorf("%w: transport", ErrClosed)
	}
	idle := t.idle[node]
	for len(idle) > 0 {
		c := idle[len(idle)-1]
		idle = idle[:len(idle)-1]
		if c.addr == addr {
			t.idle[node] = idle
			t.mu.Unlock()
			return c, true, nil
		}
		delete(t.conns, c)
		_ = c.nc.Close() // the node moved
	}
	delete(t.idle, node)
	t.mu.Unlock()

	dctx, cancel := context.WithTimeout(ctx, t.opts.DialTimeout)
	defer cancel()
	var nc net.Conn
	var err error
	if t.opts.TLSConfig != nil {
		nc, err = (&tls.Dialer{Config: t.opts.TLSConfig}).DialContext(dctx, "tcp", addr)
	} else {
		nc, err = (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, fmt.Errorf("replication: dial node %d at %s: %w", node, addr, ctx.Err())
		}
		return nil, false, fmt.Errorf("%w: node %d at %s: %w", ErrUnreachable, node, addr, err)
	}
	// 64 KiB: a response of a few small batches arrives with one read.
	c := &tcpConn{node: node, addr: addr, nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = nc.Close()
		return nil, false, fmt.Errorf("%w: transport", ErrClosed)
	}
	t.conns[c] = struct{}{}
	return c, false, nil
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
	_ = c.nc.Close()
}

// longAgo is a deadline in the past, which interrupts blocked I/O.
var longAgo = time.Unix(1, 0)

// roundTrip sends req on c and reads the answer, its body into buf when
// it fits (body is the buffer used). keep says the stream is still in sync
// (a whole response frame was read); stale says the peer had closed the
// connection before answering.
func (t *TCPTransport) roundTrip(ctx context.Context, c *tcpConn, req *FetchRequest, buf []byte, sink fetchSink) (resp *FetchResponse, body []byte, keep, stale bool, err error) {
	corr := t.corr.Add(1)
	c.wbuf, err = appendFetchRequestFrame(c.wbuf[:0], corr, req)
	if err != nil {
		return nil, nil, true, false, err
	}
	if len(c.wbuf) > t.opts.MaxFrameBytes {
		return nil, nil, true, false, fmt.Errorf("%w: request of %d bytes, limit %d", ErrFrameTooLarge, len(c.wbuf), t.opts.MaxFrameBytes)
	}
	deadline := time.Now().Add(time.Duration(max(req.MaxWaitMs, 0))*time.Millisecond + t.opts.RequestTimeout)
	ctxDeadline := false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxDeadline = d, true
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return nil, nil, false, false, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(longAgo) })
	resp, body, keep, stale, err = t.exchange(c, corr, req, buf, sink)
	if !stop() {
		// The context ended: its deadline change may land at any time,
		// so the connection cannot be reused.
		keep = false
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
		resp, err := decodeFetchResponse(body)
		if err == nil && sink != nil {
			sinkResponse(resp, sink)
		}
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
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for c := range t.conns {
		_ = c.nc.Close()
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
// frame over MaxFrameBytes or with a bad magic gets an error frame and the
// connection is closed, since the stream cannot be trusted any longer.
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

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
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
	s := &TCPServer{handler: handler, ln: ln, opts: o, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
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

// serve reads requests from nc and answers them, in order, until the
// peer leaves, a write fails, the stream is corrupt, or Close.
func (s *TCPServer) serve(nc net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
		_ = nc.Close()
	}()
	if tc, ok := nc.(*tls.Conn); ok {
		_ = tc.SetDeadline(time.Now().Add(s.opts.RequestTimeout))
		if err := tc.HandshakeContext(s.ctx); err != nil {
			s.opts.Logger.Warn("replication: TLS handshake failed", "remote", nc.RemoteAddr(), "err", err)
			return
		}
		_ = tc.SetDeadline(time.Time{})
	}
	var (
		br      = bufio.NewReaderSize(nc, 16<<10)
		hdr     [frameHeaderSize]byte
		body    []byte
		scratch []byte
		out     []byte
		b       send.Builder
	)
	for {
		h, err := readFrameHeader(br, &hdr, s.opts.MaxFrameBytes)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && s.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.opts.Logger.Warn("replication: bad frame; closing the connection", "remote", nc.RemoteAddr(), "err", err)
				if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrMalformedFrame) {
					s.writeError(nc, &out, h.corr, err)
				}
			}
			return
		}
		if body, err = readBody(br, h.bodyLen, body, 64<<10); err != nil {
			return
		}
		req, err := s.decodeRequest(h, body)
		if cap(body) > 1<<20 {
			body = nil // do not keep a huge request's buffer
		}
		if err != nil {
			if !s.writeError(nc, &out, h.corr, err) {
				return
			}
			continue
		}
		resp, err := s.handler.HandleFetch(s.ctx, req)
		if err != nil {
			if !s.writeError(nc, &out, h.corr, err) {
				return
			}
			continue
		}
		b.Reset()
		var dropped int
		scratch, dropped, err = buildFetchResponse(&b, scratch, h.corr, resp, s.opts.MaxFrameBytes)
		if err != nil {
			if !s.writeError(nc, &out, h.corr, err) {
				return
			}
			continue
		}
		if dropped > 0 {
			s.opts.Logger.Warn("replication: fetch response trimmed to MaxFrameBytes", "remote", nc.RemoteAddr(), "partitions", dropped)
		}
		_ = nc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
		_, err = b.WriteTo(nc)
		b.Reset() // forget the segment files
		if err != nil {
			if s.ctx.Err() == nil {
				s.opts.Logger.Warn("replication: writing a fetch response failed", "remote", nc.RemoteAddr(), "err", err)
			}
			return
		}
	}
}

func (s *TCPServer) decodeRequest(h frameHeader, body []byte) (*FetchRequest, error) {
	if err := h.checkVersion(); err != nil {
		return nil, err
	}
	if h.typ != msgFetchRequest {
		return nil, fmt.Errorf("%w: unexpected message type %d", ErrMalformedFrame, h.typ)
	}
	return decodeFetchRequest(body)
}

// writeError answers a request with an error frame; it reports whether
// the write succeeded.
func (s *TCPServer) writeError(nc net.Conn, out *[]byte, corr uint64, err error) bool {
	*out = appendErrorFrame((*out)[:0], corr, err.Error())
	_ = nc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
	_, werr := nc.Write(*out)
	return werr == nil
}

// Close stops accepting, closes the listener and every connection, ends
// the handlers' context, and waits for the server's goroutines. It is safe
// to call more than once.
func (s *TCPServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
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
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
