//go:build linux

package send_test

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/replog/replog/send"
)

// sockBuffers are the send-buffer sizes the socket tests run under. What
// a socket gets is capped by net.core.wmem_max and rmem_max, which differ
// between machines (4 MiB on some, 212992 on a stock kernel), so no test
// may rely on a whole response fitting in the buffers: "max" asks for
// 4 MiB (and gets what the limits allow), "stock" for what a stock kernel
// allows, and "min" for 1 byte (the kernel's minimum, about 4.5 KiB, is
// granted), so that every response is written in many pieces whatever the
// limits are. (The peer's receive buffer is never made tiny: see
// setBuffers.)
type sockBuffers struct {
	name     string
	snd, rcv int // bytes asked for: client send, server receive (0: default)
}

var bufferSizes = []sockBuffers{
	{"sndbuf=max", 4 << 20, 4 << 20},
	// What a stock kernel grants at most (wmem_max = rmem_max = 212992).
	{"sndbuf=stock", 212992 / 2, 212992 / 2},
	{"sndbuf=min", 1, 0},
}

// drainedPair returns a connected client of network with the buffers
// asked for, whose peer is read to EOF concurrently; write sends a
// Builder's response to the client, and finish half-closes it and returns
// what the peer read. The buffer sizes granted are logged.
func drainedPair(tb testing.TB, network string, bufs sockBuffers) (write func(*send.Builder) (int64, error), finish func() []byte) {
	tb.Helper()
	client, server := connPair(tb, network)
	setBuffers(tb, client, server, bufs.snd, bufs.rcv)
	snd, _ := grantedBuffers(tb, client)
	_, rcv := grantedBuffers(tb, server)
	tb.Logf("granted SO_SNDBUF %d, peer SO_RCVBUF %d", snd, rcv)
	col := collect(server, false)
	write = func(b *send.Builder) (int64, error) { return b.WriteTo(client) }
	finish = func() []byte {
		closeWrite(tb, client)
		return col.Wait(tb)
	}
	return write, finish
}

// grantedBuffers returns c's SO_SNDBUF and SO_RCVBUF as the kernel reports
// them (Linux doubles the value set, for its bookkeeping, and caps it).
func grantedBuffers(tb testing.TB, c net.Conn) (snd, rcv int) {
	tb.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	require.NoError(tb, err)
	var serr, rerr error
	require.NoError(tb, rc.Control(func(fd uintptr) {
		snd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		rcv, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	}))
	require.NoError(tb, serr)
	require.NoError(tb, rerr)
	return snd, rcv
}

// assertCalls checks the write-side calls st counts for one successful
// WriteTo to a socket against the plan: writev batches and sendfile
// regions. How many calls each batch or region takes depends on the socket
// buffers and on how fast the peer reads: one that does not fit is resumed
// after a call that wrote part of it (Stats.Partial) or that found the
// socket full (Stats.EAGAIN). Every call beyond the first of a batch or
// region is one of those, so the calls less those resumptions are exactly
// the batches and regions, whatever the buffers; and each batch or region
// takes at least one call of its own kind.
func assertCalls(t *testing.T, st send.Stats, writev, sendfile int64) {
	t.Helper()
	retries := st.EAGAIN + st.Partial
	t.Logf("writev %d, sendfile %d, EAGAIN %d, partial %d", st.Writev, st.Sendfile, st.EAGAIN, st.Partial)
	assert.Equal(t, writev+sendfile, st.Writev+st.Sendfile-retries, "writev and sendfile calls, less the %d that resumed a batch or region", retries)
	if writev == 0 {
		assert.Zero(t, st.Writev, "writev calls")
	}
	assert.GreaterOrEqual(t, st.Writev, writev, "writev calls")
	if sendfile == 0 {
		assert.Zero(t, st.Sendfile, "sendfile calls")
	}
	assert.GreaterOrEqual(t, st.Sendfile, sendfile, "sendfile calls")
	assert.Zero(t, st.Write, "sockets never get plain writes")
}

func TestWritevCallCount(t *testing.T) {
	const iovMax = 1024
	for _, network := range networks {
		for _, bufs := range bufferSizes {
			for _, slices := range []int{1, 2, iovMax - 1, iovMax, iovMax + 1, 3000} {
				t.Run(network+"/"+bufs.name+"/slices="+itoa(slices), func(t *testing.T) {
					write, finish := drainedPair(t, network, bufs)
					// Slices of one array with gaps between them: never
					// adjacent, so each one is its own iovec.
					backing := randomBytes(slices*32, uint64(slices))
					b := send.NewBuilder(send.Options{CopyThreshold: -1})
					var want []byte
					for i := range slices {
						p := backing[i*32 : i*32+16]
						b.AddBytes(p)
						want = append(want, p...)
					}
					n, err := write(b)
					require.NoError(t, err)
					require.Equal(t, int64(len(want)), n)
					require.Equal(t, want, finish())

					st := b.Stats()
					// ceil(N/IOV_MAX) batches, each one writev (plus resumptions).
					assertCalls(t, st, int64((slices+iovMax-1)/iovMax), 0)
					assert.Zero(t, st.Pread)
					assert.Equal(t, n, st.Bytes)
				})
			}
		}
	}
}

func TestFileRegionStrategy(t *testing.T) {
	fx := newFetchFixture(t, 1000, 60, 1024)
	var want []byte
	for i := range fx.headers {
		want = append(append(want, fx.headers[i]...), fx.records[i]...)
	}
	tests := []struct {
		name     string
		opts     send.Options
		fromFile bool
		// Batches (writev), regions sent by sendfile, and ReadAt calls:
		// the plan, which does not depend on the socket.
		writev, sendfile, preads int64
	}{
		// 2,000 buffers: two writev batches; the 1 KiB regions lie back to
		// back in the file, so each batch reads them with one pread.
		{"memory", send.Options{}, false, 2, 0, 0},
		{"file/small-regions-read", send.Options{}, true, 2, 0, 2},
		// One sendfile per region, and each header alone in a writev.
		{"file/all-sendfile", send.Options{ReadThreshold: -1}, true, 1000, 1000, 0},
		// A read buffer of 64 KiB: 16 batches of (header, region) pairs.
		{"file/small-read-buffer", send.Options{MaxReadBuffer: 64 << 10}, true, 16, 0, 16},
	}
	for _, network := range networks {
		for _, bufs := range bufferSizes {
			for _, tt := range tests {
				t.Run(network+"/"+bufs.name+"/"+tt.name, func(t *testing.T) {
					write, finish := drainedPair(t, network, bufs)
					b := send.NewBuilder(tt.opts)
					fx.build(t, b, tt.fromFile)
					n, err := write(b)
					require.NoError(t, err)
					require.Equal(t, fx.size(), n)
					require.True(t, bytes.Equal(want, finish()))

					st := b.Stats()
					assertCalls(t, st, tt.writev, tt.sendfile)
					assert.Equal(t, tt.preads, st.Pread, "preads")
					assert.Equal(t, n, st.Bytes)
					if bufs.snd == 1 {
						// 1 MiB through a 4.5 KiB send buffer: the
						// resumptions were exercised, not assumed away.
						assert.Positive(t, st.EAGAIN+st.Partial, "resumed calls")
					}
				})
			}
		}
	}
}

func TestAdjacentRegionsMerge(t *testing.T) {
	f, data := tempFile(t, 1<<20, 17)
	for _, network := range networks {
		for _, bufs := range bufferSizes {
			t.Run(network+"/"+bufs.name, func(t *testing.T) {
				write, finish := drainedPair(t, network, bufs)
				var b send.Builder
				// Four adjacent 128 KiB regions: one sendfile region of 512 KiB.
				for i := range int64(4) {
					require.NoError(t, b.AddFile(f, 100+i*128<<10, 128<<10))
				}
				n, err := write(&b)
				require.NoError(t, err)
				require.Equal(t, int64(512<<10), n)
				require.True(t, bytes.Equal(data[100:100+512<<10], finish()))
				st := b.Stats()
				assertCalls(t, st, 0, 1)
				assert.Zero(t, st.Pread)
				if bufs.snd == 1 {
					assert.Positive(t, st.EAGAIN+st.Partial, "resumed calls")
				}
			})
		}
	}
}

func itoa(n int) string {
	return string(appendInt(nil, n))
}

func appendInt(p []byte, n int) []byte {
	if n >= 10 {
		p = appendInt(p, n/10)
	}
	return append(p, byte('0'+n%10))
}

func TestWriteToFile(t *testing.T) {
	f, data := tempFile(t, 1<<20, 18)
	tests := []struct {
		name     string
		flag     int
		sendfile int64 // sendfile calls
		preads   int64
	}{
		// sendfile to a regular file works.
		{"regular", os.O_WRONLY | os.O_CREATE | os.O_TRUNC, 1, 0},
		// The kernel refuses sendfile to an O_APPEND file (EINVAL): the
		// region is read and written with writev instead.
		{"append-refuses-sendfile", os.O_WRONLY | os.O_CREATE | os.O_APPEND, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out")
			out, err := os.OpenFile(path, tt.flag, 0o600)
			require.NoError(t, err)
			defer out.Close()
			var b send.Builder
			b.AddBytes([]byte("head"))
			require.NoError(t, b.AddFile(f, 1000, 512<<10))
			b.AddBytes([]byte("tail"))
			n, err := b.WriteTo(out)
			require.NoError(t, err)
			want := concat([]byte("head"), data[1000:1000+512<<10], []byte("tail"))
			assert.Equal(t, int64(len(want)), n)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got))
			assert.Equal(t, tt.sendfile, b.Stats().Sendfile)
			assert.Equal(t, tt.preads, b.Stats().Pread)
		})
	}
}

// TestReusedBuilderOnSocketAllocatesNothing checks the socket path's
// steady state with a fetch response's shape: headers between file
// regions that lie back to back in one file, read into memory (below the
// threshold). Matching a region's file with the one before it once
// allocated on every region. Regions sent with sendfile take their file's
// raw connection once per WriteTo: one allocation.
func TestReusedBuilderOnSocketAllocatesNothing(t *testing.T) {
	f, _ := tempFile(t, 1<<20, 5)
	client, server := connPair(t, "tcp")
	drained := make(chan int64)
	go func() { // a drain that allocates nothing, unlike collect
		buf := make([]byte, 64<<10)
		var total int64
		for {
			n, err := server.Read(buf)
			total += int64(n)
			if err != nil {
				drained <- total
				return
			}
		}
	}()
	var b send.Builder
	var sent int64
	header := []byte("partition header")
	write := func(large bool) {
		b.Reset()
		for i := range int64(16) {
			b.AddBytes(header)
			require.NoError(t, b.AddFile(f, i<<10, 1<<10))
		}
		if large { // two sendfiles from f
			require.NoError(t, b.AddFile(f, 256<<10, 256<<10))
			b.AddBytes(header)
			require.NoError(t, b.AddFile(f, 768<<10, 256<<10))
		}
		n, err := b.WriteTo(client)
		sent += n
		if err != nil {
			t.Fatal(err)
		}
	}
	write(true)
	small := testing.AllocsPerRun(20, func() { write(false) })
	before := b.Stats().Sendfile
	large := testing.AllocsPerRun(20, func() { write(true) })
	closeWrite(t, client)
	assert.Equal(t, sent, <-drained)
	assert.Zero(t, small, "a reused Builder allocates nothing on the socket path")
	assert.LessOrEqual(t, large, 1.0, "sendfiles from one file take its raw connection once")
	assert.Positive(t, b.Stats().Sendfile-before)
}
