package replication

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawChain is BenchmarkProduce's acks=all round trip with nothing of
// replog in it, as a baseline measured in the same run: the system calls
// and goroutine hand-offs any Go implementation of that design makes on
// this machine. A produce writes the batch to the leader's file and hands
// its position to two connection goroutines, each of which reads it back
// from the file and sends it over loopback TCP to a follower goroutine
// (an 8-byte sequence number, then the batch); the follower writes it to
// its own file and answers with a 100-byte "next fetch" carrying the
// sequence number; the produce returns once both connection goroutines
// read their answer. No framing, checks, indexes or offsets: what
// replog's acks=all costs above rawChain's is its own.
type rawChain struct {
	batch  []byte
	leader *os.File
	end    int64
	seq    uint64
	conns  []rawChainConn
	acks   chan error  // one per connection per produce
	files  []io.Closer // every file and connection made, for close
	wg     sync.WaitGroup
	once   sync.Once
}

// rawChainConn is the leader's side of one follower's connection.
type rawChainConn struct {
	nc     net.Conn
	notify chan int64 // the new batch's position in the leader's file
}

// rawAckBytes is the size of a follower's answer, about that of a
// replog fetch request for one partition.
const rawAckBytes = 100

// startRawChain starts a chain with two followers writing to files in
// dir; close, which tb's cleanup also runs (a failed start included),
// stops its goroutines and closes its files.
func startRawChain(tb testing.TB, dir string, batch []byte) *rawChain {
	tb.Helper()
	c := &rawChain{batch: batch, acks: make(chan error, 2)}
	tb.Cleanup(c.close)
	lf, err := os.Create(filepath.Join(dir, "raw-leader"))
	require.NoError(tb, err)
	c.leader = lf
	c.files = append(c.files, lf)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	defer ln.Close()
	for i := range 2 {
		ff, err := os.Create(filepath.Join(dir, "raw-follower"+string(rune('0'+i))))
		require.NoError(tb, err)
		c.files = append(c.files, ff)
		fc, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(tb, err)
		c.files = append(c.files, fc)
		lc, err := ln.Accept()
		require.NoError(tb, err)
		c.files = append(c.files, lc)
		rc := rawChainConn{nc: lc, notify: make(chan int64)}
		c.conns = append(c.conns, rc)
		c.wg.Add(2)
		go c.follow(fc, ff)
		go c.serve(rc)
	}
	return c
}

// follow is a follower: it appends each batch it receives to f and
// answers, until its connection is closed.
func (c *rawChain) follow(nc net.Conn, f *os.File) {
	defer c.wg.Done()
	defer f.Close()
	defer nc.Close()
	in := make([]byte, 8+len(c.batch))
	ack := make([]byte, rawAckBytes)
	var pos int64
	for {
		if _, err := io.ReadFull(nc, in); err != nil {
			return
		}
		if _, err := f.WriteAt(in[8:], pos); err != nil {
			return
		}
		pos += int64(len(c.batch))
		copy(ack, in[:8])
		if _, err := nc.Write(ack); err != nil {
			return
		}
	}
}

// serve is a connection goroutine of the leader: for each position it is
// given it sends that batch, read back from the leader's file, and
// reports the follower's answer on c.acks.
func (c *rawChain) serve(rc rawChainConn) {
	defer c.wg.Done()
	out := make([]byte, 8+len(c.batch))
	ack := make([]byte, rawAckBytes)
	for pos := range rc.notify {
		binary.BigEndian.PutUint64(out, uint64(pos))
		_, err := c.leader.ReadAt(out[8:], pos)
		if err == nil {
			_, err = rc.nc.Write(out)
		}
		if err == nil {
			_, err = io.ReadFull(rc.nc, ack)
		}
		if err == nil && binary.BigEndian.Uint64(ack) != uint64(pos) {
			err = io.ErrUnexpectedEOF
		}
		c.acks <- err
	}
}

// produce makes one round trip and returns its latency.
func (c *rawChain) produce(tb testing.TB) time.Duration {
	start := time.Now()
	_, err := c.leader.WriteAt(c.batch, c.end)
	require.NoError(tb, err)
	for _, rc := range c.conns {
		rc.notify <- c.end
	}
	c.end += int64(len(c.batch))
	for range c.conns {
		if err := <-c.acks; err != nil {
			tb.Fatal(err)
		}
	}
	return time.Since(start)
}

// close stops the chain's goroutines, waits for them and closes its
// files; it may be called more than once.
func (c *rawChain) close() {
	c.once.Do(func() {
		for _, rc := range c.conns {
			close(rc.notify)
		}
		for _, f := range c.files {
			_ = f.Close() // ends the followers' reads
		}
		c.wg.Wait()
	})
}

// TestRawChainDeliversEveryBatch checks the baseline itself: after a few
// produces both followers' files hold the leader's bytes, and close stops
// every goroutine.
func TestRawChainDeliversEveryBatch(t *testing.T) {
	checkGoroutines(t)
	dir := t.TempDir()
	batch := batchOfSize(t, 4<<10)
	c := startRawChain(t, dir, batch)
	for range 5 {
		require.Positive(t, c.produce(t))
	}
	c.close()
	want, err := os.ReadFile(filepath.Join(dir, "raw-leader"))
	require.NoError(t, err)
	require.Len(t, want, 5*len(batch))
	for _, name := range []string{"raw-follower0", "raw-follower1"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}
}

// TestRawChainFailedStartLeavesNothingRunning checks that a start which
// fails after its first follower began (the second's file name is taken
// by a directory here) stops what it started, through tb's cleanup.
func TestRawChainFailedStartLeavesNothingRunning(t *testing.T) {
	checkGoroutines(t)
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "raw-follower1"), 0o755))
	tb := &failureTB{TB: t}
	tb.run(func() { startRawChain(tb, dir, batchOfSize(t, 4<<10)) })
	require.True(t, tb.failed, "the start did not fail")
}

// failureTB runs a function that is expected to fail a test, records the
// failure instead, and runs the cleanups it registered when it returns.
type failureTB struct {
	testing.TB
	failed   bool
	cleanups []func()
}

func (f *failureTB) Helper()               {}
func (f *failureTB) Errorf(string, ...any) { f.failed = true }
func (f *failureTB) FailNow()              { f.failed = true; runtime.Goexit() }
func (f *failureTB) Fatal(...any)          { f.FailNow() }
func (f *failureTB) Fatalf(string, ...any) { f.FailNow() }
func (f *failureTB) Cleanup(fn func())     { f.cleanups = append(f.cleanups, fn) }
func (f *failureTB) run(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}
