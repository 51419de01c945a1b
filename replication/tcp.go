package replication

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"time"
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
	// server wraps its listener with it. The server takes a request's
	// replica id on its word: a peer that can connect may fetch as any
	// replica, and the log end it reports as that replica's moves the ISR
	// and the high watermark. Keep the port on a private network, or set
	// ClientAuth to tls.RequireAndVerifyClientCert here so that only
	// holders of the cluster's certificates connect (a certificate is not
	// matched to a replica id).
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
	// more (a request's MaxBytes is lowered to fit). A batch larger than
	// that alone is never sent: its partition is answered with
	// CodeRecordTooLarge, and the follower backs off and reports
	// ErrRecordTooLarge. A response takes 20 bytes, plus 49 bytes and the
	// topic name for each partition of the fetch, before any record: keep
	// MaxFrameBytes above the logs' MaxBatchBytes by that much for the
	// largest fetch a follower makes (the defaults, 64 MiB frames and
	// 8 MiB batches, leave room for about 700,000 partitions). A fetch of
	// more partitions than the headers alone fit (about 54,000 of 28-byte
	// topic names in 4 MiB) is answered with ErrFrameTooLarge, whatever
	// MaxRequestBytes allows.
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
	// MaxConnections is how many connections a server serves at once
	// (server only; 0, the default: no limit). At the limit it accepts
	// no more until one closes, as Kafka's max.connections does: a new
	// peer waits in the listen backlog, and its fetch times out if no
	// connection closes within its RequestTimeout. Connections that stay
	// idle past IdleTimeout are closed, which frees their slots.
	MaxConnections int
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
	case o.MaxConnections < 0:
		return fmt.Errorf("replication: negative MaxConnections")
	}
	return nil
}

// longAgo is a deadline in the past, which interrupts blocked I/O.
var longAgo = time.Unix(1, 0)

// peerGone reports an error of a connection the peer closed.
func peerGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
