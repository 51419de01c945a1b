package broker

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// emfileListener fails every Accept as a process out of file descriptors
// does.
type emfileListener struct {
	accepts atomic.Int64
}

func (l *emfileListener) Accept() (net.Conn, error) {
	l.accepts.Add(1)
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept", syscall.EMFILE)}
}
func (l *emfileListener) Close() error   { return nil }
func (l *emfileListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestAcceptBackoff checks that the accept loop backs off on persistent
// Accept errors instead of spinning, and that it stops when the broker
// closes while it waits.
func TestAcceptBackoff(t *testing.T) {
	ln := &emfileListener{}
	b := &Broker{ln: ln, log: slog.New(slog.DiscardHandler), conns: make(map[net.Conn]struct{})}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.wg.Add(1)
	go b.acceptLoop()
	time.Sleep(200 * time.Millisecond)
	// 5+10+20+40+80 ms of delays fit in 200 ms: about 6 attempts, never
	// more than that; a spinning loop makes millions.
	if n := ln.accepts.Load(); n < 2 || n > 10 {
		t.Errorf("%d Accept calls in 200ms, want 2 to 10", n)
	}
	b.cancel()
	stopped := make(chan struct{})
	go func() { b.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the accept loop did not stop after the broker closed")
	}
}
