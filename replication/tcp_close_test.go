package replication

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/replog/replog/internal/testlog"
	"github.com/stretchr/testify/require"
)

// TCPTransport.Close fails a Fetch still dialling: here its TLS
// handshake, which the peer never answers. The dial's context used to
// ignore Close, so the Fetch ran on until DialTimeout and reported
// ErrUnreachable.
func TestTCPTransportCloseEndsAHandshakeInFlight(t *testing.T) {
	checkGoroutines(t)
	_, clientCfg := selfSigned(t)
	ln := listen(t)
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c // held open, silent
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})
	tr, err := NewTCPTransport(TCPOptions{TLSConfig: clientCfg, DialTimeout: 4 * time.Second,
		Resolve: func(int32) (string, error) { return ln.Addr().String(), nil }})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := tr.Fetch(context.Background(), 0, testRequest(1))
		done <- err
	}()
	for ln.accepted.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the ClientHello is sent
	start := time.Now()
	require.NoError(t, tr.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(time.Second):
		err := <-done
		t.Fatalf("Fetch not failed by Close: returned after %v with %v", time.Since(start).Round(time.Millisecond), err)
	}
}

// A Fetch after TCPTransport.Close reports ErrClosed, before resolving
// the node: a Resolve error used to come back as ErrUnreachable.
func TestTCPTransportFetchAfterCloseIsClosed(t *testing.T) {
	tr, err := NewTCPTransport(TCPOptions{Resolve: func(int32) (string, error) { return "", errors.New("no such node") }})
	require.NoError(t, err)
	require.NoError(t, tr.Close())
	_, err = tr.Fetch(context.Background(), 0, testRequest(1))
	require.ErrorIs(t, err, ErrClosed)
}

// TestTCPServerTakesAResetForAPeerLeaving: a follower's transport that
// closes a connection with a response unread resets it, and the server,
// waiting for the next request, read ECONNRESET. It logged that as a bad
// frame, a warning, though the peer had only left (found by the cluster
// test's check of every warning).
func TestTCPServerTakesAResetForAPeerLeaving(t *testing.T) {
	checkGoroutines(t)
	var logged testlog.Buffer
	h := handlerFunc(func(context.Context, *FetchRequest) (*FetchResponse, error) { return &FetchResponse{}, nil })
	srv, ln := startServer(t, h, TCPOptions{Logger: testlog.New(&logged)})
	c := rawConn(t, ln.Addr().String())
	frame, err := appendFetchRequestFrame(nil, 1, testRequest(1))
	require.NoError(t, err)
	_, err = c.Write(frame)
	require.NoError(t, err)
	_, _, err = readRaw(t, c) // the server now waits for the next request
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).SetLinger(0)) // close with a reset
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { // the server's goroutine for it ended
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 0
	}, 5*time.Second, time.Millisecond)
	require.Empty(t, logged.String())
}
