package send_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// connPair returns a connected client and server of network ("tcp" on
// 127.0.0.1 or "unix" in a temporary directory); both are closed at
// cleanup.
func connPair(tb testing.TB, network string) (client, server net.Conn) {
	tb.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(tb.TempDir(), "s.sock")
	}
	l, err := net.Listen(network, addr)
	require.NoError(tb, err)
	defer l.Close()
	type result struct {
		c   net.Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		accepted <- result{c, err}
	}()
	client, err = net.Dial(network, l.Addr().String())
	require.NoError(tb, err)
	r := <-accepted
	if r.err != nil {
		client.Close()
	}
	require.NoError(tb, r.err)
	tb.Cleanup(func() {
		client.Close()
		r.c.Close()
	})
	return client, r.c
}

// collector reads a connection to EOF in its own goroutine, keeping what it
// read; Wait returns the bytes.
type collector struct {
	wg   sync.WaitGroup
	buf  bytes.Buffer
	err  error
	slow bool
}

// collect starts reading c. With slow set it reads in 512-byte pieces and
// sleeps a millisecond every 64 KiB, so the writer's socket buffer fills up.
func collect(c net.Conn, slow bool) *collector {
	col := &collector{slow: slow}
	col.wg.Add(1)
	go func() {
		defer col.wg.Done()
		if !slow {
			_, col.err = io.Copy(&col.buf, c)
			return
		}
		p := make([]byte, 512)
		for i := 1; ; i++ {
			n, err := c.Read(p)
			col.buf.Write(p[:n])
			if i%128 == 0 {
				time.Sleep(time.Millisecond)
			}
			if err == io.EOF {
				return
			}
			if err != nil {
				col.err = err
				return
			}
		}
	}()
	return col
}

// Wait waits for EOF and returns what was read.
func (col *collector) Wait(tb testing.TB) []byte {
	tb.Helper()
	col.wg.Wait()
	require.NoError(tb, col.err)
	return col.buf.Bytes()
}

// closeWrite half-closes c so the peer reads EOF.
func closeWrite(tb testing.TB, c net.Conn) {
	tb.Helper()
	type halfCloser interface{ CloseWrite() error }
	require.NoError(tb, c.(halfCloser).CloseWrite())
}

// tempFile returns an open file of size random bytes (seeded) and its
// content; it is closed at cleanup.
func tempFile(tb testing.TB, size int, seed uint64) (*os.File, []byte) {
	tb.Helper()
	data := randomBytes(size, seed)
	path := filepath.Join(tb.TempDir(), "segment.log")
	require.NoError(tb, os.WriteFile(path, data, 0o600))
	f, err := os.Open(path)
	require.NoError(tb, err)
	tb.Cleanup(func() { f.Close() })
	return f, data
}

func randomBytes(n int, seed uint64) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(p) // never fails
	return p
}
