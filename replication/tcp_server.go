package replication

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/replog/replog/send"
)

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
// Each connection keeps its last request's buffer (up to 1 MiB; larger
// ones are dropped) and its response's headers until its next request,
// idle ones too, for up to IdleTimeout. The server serves at most
// MaxConnections at once when that is set; where peers may open many
// connections, set it.
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

	// slots holds a token for each connection served, when
	// MaxConnections limits them; nil otherwise.
	slots chan struct{}

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
	if o.MaxConnections > 0 {
		s.slots = make(chan struct{}, o.MaxConnections)
	}
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
		if !s.takeSlot() {
			return
		}
		nc, err := s.ln.Accept()
		if err != nil {
			s.releaseSlot()
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
			s.releaseSlot()
			_ = nc.Close()
			return
		}
		s.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(nc)
	}
}

// takeSlot waits for a connection slot when MaxConnections limits them;
// it reports false if the server closed first.
func (s *TCPServer) takeSlot() bool {
	if s.slots == nil {
		return true
	}
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	s.opts.Logger.Warn("replication: connection limit reached, accepting none until one closes", "max_connections", cap(s.slots))
	select {
	case s.slots <- struct{}{}:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// releaseSlot frees the slot of a connection that closed or was never
// accepted.
func (s *TCPServer) releaseSlot() {
	if s.slots != nil {
		<-s.slots
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
		s.releaseSlot()
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
	resp, err := s.handler.HandleFetch(s.ctx, req)
	if err == nil && resp == nil {
		return nil, errNoResponse(s.handler)
	}
	return resp, err
}

// errNoResponse is the error of a FetchHandler that answered neither a
// response nor an error: the peer gets it as an error frame.
func errNoResponse(h FetchHandler) error {
	return fmt.Errorf("%w: fetch handler %T answered neither a response nor an error", ErrMalformedFrame, h)
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
		c.b.Reset() // forget the segment files added before the error
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
