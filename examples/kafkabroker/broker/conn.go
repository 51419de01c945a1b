package broker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"slices"
	"time"

	"github.com/replog/replog/send"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// conn is one client connection. Requests are read and answered one at a
// time, in order, by the connection's goroutine, as Kafka does: responses
// then go out in request order without further bookkeeping.
type conn struct {
	b       *Broker
	c       net.Conn
	r       *bufio.Reader
	req     []byte        // the current request, reused
	resp    []byte        // the current encoded response, reused
	builder *send.Builder // fetch responses
	// clientID of the last request, for logs.
	clientID string
}

// header is a request header (v1: no tagged fields, as every version this
// broker accepts is below the flexible ones).
type header struct {
	key, version int16
	correlation  int32
}

// errFrame reports a request whose framing is unusable: the connection is
// closed.
var errFrame = errors.New("broker: malformed request")

// keepBuffer is the largest request or response buffer a connection keeps
// between requests; larger ones are dropped so that an idle connection
// holds little memory.
const keepBuffer = 1 << 20

// firstRead is the most readRequest allocates for a request before any of
// its bytes arrived; the buffer then doubles as they do.
const firstRead = 64 << 10

func (b *Broker) serveConn(c net.Conn) {
	// A small read buffer: request bodies larger than it are read
	// straight into cc.req.
	cc := &conn{b: b, c: c, r: bufio.NewReaderSize(c, 4<<10), builder: send.NewBuilder(send.Options{})}
	defer c.Close()
	defer func() {
		// Handlers are written not to panic on any input; this keeps a bug
		// in one from taking the whole broker down.
		if v := recover(); v != nil {
			b.panics.Add(1)
			b.log.Error("panic serving connection", "remote", c.RemoteAddr(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	for {
		h, body, err := cc.readRequest()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				b.log.Debug("closing connection", "remote", c.RemoteAddr(), "err", err)
			}
			return
		}
		if err := cc.handle(h, body); err != nil {
			b.log.Debug("closing connection", "remote", c.RemoteAddr(), "client", cc.clientID,
				"key", h.key, "version", h.version, "err", err)
			return
		}
		if cap(cc.req) > keepBuffer {
			cc.req = nil
		}
		if cap(cc.resp) > keepBuffer {
			// A fetch's headers were also copied into the builder.
			cc.resp, cc.builder = nil, send.NewBuilder(send.Options{})
		}
	}
}

// readRequest reads one size-prefixed request and parses its header. The
// size is checked against MaxRequestBytes before anything is allocated, and
// the buffer then grows with the bytes actually received (from firstRead,
// doubling), so a client announcing a large request and sending nothing
// costs little memory. A connection idle for IdleTimeout is closed.
func (cc *conn) readRequest() (header, []byte, error) {
	var sz [4]byte
	_ = cc.c.SetReadDeadline(time.Now().Add(cc.b.cfg.IdleTimeout))
	if _, err := io.ReadFull(cc.r, sz[:]); err != nil {
		return header{}, nil, err
	}
	size := int32(binary.BigEndian.Uint32(sz[:]))
	if size < 10 || int64(size) > int64(cc.b.cfg.MaxRequestBytes) {
		return header{}, nil, fmt.Errorf("%w: request size %d", errFrame, size)
	}
	buf := cc.req[:0]
	for len(buf) < int(size) {
		chunk := min(int(size)-len(buf), max(len(buf), firstRead))
		buf = slices.Grow(buf, chunk)
		n, err := io.ReadFull(cc.r, buf[len(buf):len(buf)+chunk])
		buf = buf[:len(buf)+n]
		if err != nil {
			cc.req = buf
			return header{}, nil, err
		}
	}
	cc.req = buf
	h := header{
		key:         int16(binary.BigEndian.Uint16(buf[0:])),
		version:     int16(binary.BigEndian.Uint16(buf[2:])),
		correlation: int32(binary.BigEndian.Uint32(buf[4:])),
	}
	// Client id: nullable string with an int16 length.
	n := int(int16(binary.BigEndian.Uint16(buf[8:])))
	body := buf[10:]
	if n > 0 {
		if n > len(body) {
			return h, nil, fmt.Errorf("%w: client id length %d", errFrame, n)
		}
		if string(body[:n]) != cc.clientID {
			cc.clientID = string(body[:n])
		}
		body = body[n:]
	}
	return h, body, nil
}

// handle answers one request. An error closes the connection: Kafka does
// the same for requests it cannot parse or whose version it does not support.
func (cc *conn) handle(h header, body []byte) error {
	if h.key == apiVersionsKey && h.version > apiVersionsMax {
		// The body may be in a newer format: answer at version 0,
		// which every client can read, and let it retry lower.
		return cc.writeResponse(h, unsupportedApiVersionsResponse())
	}
	if !supported(h.key, h.version) {
		return fmt.Errorf("%w: unsupported api key %d version %d", errFrame, h.key, h.version)
	}
	req := kmsg.RequestForKey(h.key)
	req.SetVersion(h.version)
	if err := req.ReadFrom(body); err != nil {
		return fmt.Errorf("%w: %v", errFrame, err)
	}
	b := cc.b
	var resp kmsg.Response
	switch req := req.(type) {
	case *kmsg.ApiVersionsRequest:
		resp = apiVersionsResponse(req)
	case *kmsg.MetadataRequest:
		resp = b.handleMetadata(req)
	case *kmsg.CreateTopicsRequest:
		resp = b.handleCreateTopics(req)
	case *kmsg.ProduceRequest:
		resp = b.handleProduce(req)
		if req.Acks == 0 {
			// No response at all; an error closes the connection so that
			// the client notices, as Kafka does.
			if produceFailed(resp.(*kmsg.ProduceResponse)) {
				return errors.New("broker: acks=0 produce failed")
			}
			return nil
		}
	case *kmsg.FetchRequest:
		return cc.handleFetch(h, req)
	case *kmsg.ListOffsetsRequest:
		resp = b.handleListOffsets(req)
	case *kmsg.InitProducerIDRequest:
		resp = b.handleInitProducerID(req)
	case *kmsg.FindCoordinatorRequest:
		resp = b.handleFindCoordinator(req)
	case *kmsg.JoinGroupRequest:
		resp = b.coord.join(b.ctx, req, cc.clientID, cc.c.RemoteAddr().String())
	case *kmsg.SyncGroupRequest:
		resp = b.coord.sync(b.ctx, req)
	case *kmsg.HeartbeatRequest:
		resp = b.coord.heartbeat(req)
	case *kmsg.LeaveGroupRequest:
		resp = b.coord.leave(req)
	case *kmsg.OffsetCommitRequest:
		resp = b.coord.commit(req)
	case *kmsg.OffsetFetchRequest:
		resp = b.coord.fetchOffsets(req)
	default:
		return fmt.Errorf("%w: no handler for api key %d", errFrame, h.key)
	}
	if resp == nil { // the broker is closing
		return net.ErrClosed
	}
	return cc.writeResponse(h, resp)
}

// writeResponse encodes resp after the response header and writes it in one
// call.
func (cc *conn) writeResponse(h header, resp kmsg.Response) error {
	buf := append(cc.resp[:0], 0, 0, 0, 0)
	buf = binary.BigEndian.AppendUint32(buf, uint32(h.correlation))
	buf = resp.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	cc.resp = buf
	_ = cc.c.SetWriteDeadline(time.Now().Add(cc.b.cfg.IdleTimeout))
	_, err := cc.c.Write(buf)
	return err
}
